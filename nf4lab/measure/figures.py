"""Figure layout shared by every plot of the series: the legend where it covers nothing, and a
caption that says on which GPU, when, with which versions and how the numbers were measured."""
from __future__ import annotations

from . import results


# The method names a spread (p10-p90 of the replays) that no plot of the series draws: at the bars' shape it
# is too small to read as an error bar (at most 1.6% of the time in the records of 00-06 under data/results/
# as of 2026-11-29, H100 and H200), so the caption says where to find it rather than draw it.
SPREAD_NOTE = "(each record's spread_ms in the results file; not drawn)"


def _caption_text(meta) -> str:
    """Where and when the numbers were measured, and how: wrapped, never cut."""
    import textwrap

    here = results.current_gpu()
    where = ("measured on " if here and results.gpu_slug(meta.get("gpu") or "") == here
             else "no GPU here: recorded on " if here is None else "recorded on another GPU, ")
    method = meta.get("method", "")
    if "spread = p10-p90" in method:
        method += " " + SPREAD_NOTE
    lines = textwrap.wrap(where + results.label(meta), 150) + textwrap.wrap(method, 150)
    return "\n".join(lines)


def finish(fig, meta, legend_from=None, ncol=2):
    """Lay out a figure for reading: the axes' legend (if any) below the plot, where it covers no bar or
    label, then the caption (GPU, date, versions, method), and the axes shrunk to leave room for both."""
    pad = 6  # pixels between the blocks
    cap = fig.text(0.01, 0, _caption_text(meta or {}), fontsize=7, color="0.35", va="bottom", ha="left",
                   transform=None)
    cap.set_position((0.01 * fig.bbox.width, pad))
    leg = None
    if legend_from is not None:
        handles, labels = legend_from.get_legend_handles_labels()
        old = legend_from.get_legend()
        if old is not None:
            old.remove()
        if handles:
            leg = fig.legend(handles, labels, loc="lower center", ncol=min(ncol, len(handles)), fontsize=8,
                             frameon=False)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    cap_h = cap.get_window_extent(r).height + 2 * pad
    leg_h = leg.get_window_extent(r).height + pad if leg is not None else 0
    if leg is not None:
        leg.set_bbox_to_anchor((0.5, cap_h / fig.bbox.height), transform=fig.transFigure)
    # pad: font metrics do not scale exactly with the resolution a notebook or a PNG renders at
    fig.tight_layout(pad=1.6, rect=(0, (cap_h + leg_h) / fig.bbox.height, 1, 1))
