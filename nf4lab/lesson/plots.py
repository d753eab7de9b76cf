"""Plots of measured GB/s: bars per version with the ceilings drawn, and size sweeps.

Every plot is made from records (measured now or loaded from data/results/) and says
where they were measured in its caption.
"""
from __future__ import annotations

import re

from .. import config
from ..measure import bench, results
from ..measure.figures import finish

CEILING_STYLE = {bench.COPY: ("tab:red", "--"), bench.FILL: ("tab:purple", ":"),
                 bench.BOUND: ("tab:green", "-"),
                 bench.SPEC_PEAK: ("black", "-.")}


def bars(run, *, title=None, highlight=(), shape=None, dtype=None, ax=None):
    """GB/s of every kernel and baseline in ``run`` for one shape/dtype, ceilings as lines."""
    import matplotlib.pyplot as plt

    recs = [r for r in run.records if r["kind"] in ("kernel", "baseline")
            and (shape is None or r["shape"] == list(shape)) and (dtype is None or r["dtype"] == dtype)]
    if not recs:
        raise ValueError("no kernel or baseline records to plot")
    shape = shape or recs[0]["shape"]
    dtype = dtype or recs[0]["dtype"]
    recs = [r for r in recs if r["shape"] == list(shape) and r["dtype"] == dtype]
    ceil = [r for r in run.records if r["kind"] in ("ceiling", "bound") and r["shape"] == list(shape)
            and r["dtype"] == dtype and r.get("gbps")]
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(recs) + 2.2))
    names = [r["name"] for r in recs]
    colors = ["tab:gray" if r["kind"] == "baseline" else
              ("tab:orange" if r["name"] in highlight else "tab:blue") for r in recs]
    y = range(len(recs))
    drawn = ax.barh(list(y), [r["gbps"] for r in recs], color=colors)
    # a bar carried from another run (progress) is context beside this run's bars, not compared with them
    carried = [bar for bar, r in zip(drawn, recs) if r.get("carried")]
    for bar in carried:
        bar.set_hatch("//")
        bar.set_alpha(0.55)
    from matplotlib.patches import Rectangle

    if highlight and any(c == "tab:blue" and not r.get("carried") for c, r in zip(colors, recs)):
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor="tab:blue", label="solid blue: an earlier step, timed in this run"))
    if carried:
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor="tab:blue", alpha=0.55, hatch="//",
                               label="hatched: another step's run (context)"))
    for i, r in enumerate(recs):
        txt = f"{r['gbps']:.0f} GB/s  ({r['ms'] * 1e3:.0f} us"
        txt += f", {r['speedup_vs_bnb']:.2f}x bnb)" if r.get("speedup_vs_bnb") and r["kind"] == "kernel" else ")"
        # on a white ground: a ceiling line may run through the label
        ax.text(r["gbps"], i, " " + txt, va="center", fontsize=8, zorder=3,
                bbox=dict(facecolor="white", edgecolor="none", pad=0.3))
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    for c in ceil:
        color, ls = CEILING_STYLE.get(c["name"], ("k", "-"))
        ax.axvline(c["gbps"], color=color, ls=ls, lw=1.2, label=f"{c['name']}: {c['gbps']:.0f} GB/s")
    top = max([r["gbps"] for r in recs] + [c["gbps"] for c in ceil])
    ax.set_xlim(0, top * 1.35)  # room on the right for the bars' labels
    wall = any(r.get("timing") == bench.WALL_CLOCK for r in recs)   # end to end: host time per call
    ax.set_xlabel("effective bandwidth, GB/s (bytes of the NF4 byte model / GPU time"
                  + (";\nend to end: / host time per call)" if wall else ")"))
    l2 = " (fits in L2)" if recs[0].get("fits_l2") else ""
    gpu = f"\non the {run.meta['gpu']}" if run.meta.get("gpu") else ""
    ax.set_title(title or f"NF4 dequantization, {'x'.join(map(str, shape))} -> {dtype}{l2}{gpu}")
    if fig is not None:
        finish(fig, run.meta, legend_from=ax)
    return ax


def _step_number(name: str) -> int:
    m = re.match(r"(\d\d)_", name)
    return int(m.group(1)) if m else 99


def progress(notebook: str, gpu: str | None = None, *, shape=None, dtype="bf16"):
    """Bars of every step's kernels up to ``notebook``, from the recorded results files.

    The ceilings and bitsandbytes come from ``notebook``'s own run (same process, same data).
    """
    import matplotlib.pyplot as plt

    here = bench.Run.load(notebook, gpu)
    if here is None:
        print(f"no results recorded for {notebook}: nothing to plot")
        return None
    gpu = gpu or results.gpu_slug(here.meta["gpu"])
    shape = shape or next((r["shape"] for r in here.kernels() if r["dtype"] == dtype), None)
    n_here = _step_number(notebook)
    merged = bench.Run(meta=here.meta)
    earlier = sorted(p.stem for p in (results.RESULTS_DIR / gpu).glob("[0-9][0-9]_*.json")
                     if _step_number(p.stem) < n_here)
    # Steps re-measure their baselines (earlier steps' kernels) in their own runs: each kernel gets
    # one bar, from the latest run that measured it (this step's run for the kernels it timed), in the
    # order the steps introduced them; only the step's own kernels are highlighted.
    mine = {r["name"] for r in here.kernels()}
    # A bar from another run is not this run's measurement: its label names the step whose run it
    # comes from and that run's date, e.g. "(02's run of 11-28 17:47)", and its ratios (% of copy,
    # x bitsandbytes) stay those its own run's save computed, never this run's ceilings over another run's time:
    # every record here is loaded, so none is finalized again.
    latest: dict = {}
    for name in earlier:
        prev = bench.Run.load(name, gpu)
        same = prev.meta.get("run") and prev.meta.get("run") == here.meta.get("run")
        # a solution notebook reading a lesson's record (no solutions/ copy of it yet) says so
        whose = "'s" if config.notebook_kind() != results.SOLUTION_KIND or "/solutions/" in (prev.path or "") \
            else " lesson's"
        when = f" ({name[:2]}{whose} run of {prev.meta.get('date', '?')[5:16]})"
        for r in prev.kernels():
            if r["shape"] == shape and r["dtype"] == dtype:   # a re-measurement keeps the first one's place
                latest[r["name"]] = r if same else dict(r, name=r["name"] + when, carried=True)
    seen = set(latest)
    ours = [r for r in here.records if r["shape"] == shape and r["dtype"] == dtype]
    own = {r["name"]: r for r in ours if r["kind"] == "kernel"}
    # Kernels in the order the steps introduced them: the earlier steps' first, then this step's new ones.
    order = list(latest) + [n for n in own if n not in latest]
    merged.add([r for r in ours if r["kind"] != "kernel"])        # ceilings, bound and baselines
    merged.add([own.get(n) or latest[n] for n in order])
    highlight = mine - seen
    # Wider for long labels (a bar from another run names it), so that the bars keep room for their values.
    longest = max([len(r["name"]) for r in merged.records if r["kind"] in ("kernel", "baseline")] + [0])
    fig, ax = plt.subplots(figsize=(9 + 0.08 * max(0, longest - 60), 0.45 * len(merged.records) + 2.2))
    bars(merged, highlight=highlight, shape=shape, dtype=dtype, ax=ax,
         title=f"Step by step on the {here.meta.get('gpu', 'GPU not recorded')}\n"
               f"{'x'.join(map(str, shape))} -> {dtype} (this step in orange)")
    finish(fig, here.meta, legend_from=ax)
    return merged


def sweep(run, *, dtype="bf16", names=None, ax=None):
    """GB/s against bytes moved for each version: the L2 regime on the left, DRAM on the right."""
    import matplotlib.pyplot as plt

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 5))
    recs = [r for r in run.records if r["dtype"] == dtype and r.get("bytes")]
    by_name: dict = {}
    for r in recs:
        by_name.setdefault(r["name"], []).append(r)
    for name, rs in by_name.items():
        if names and name not in names:
            continue
        rs.sort(key=lambda r: r["bytes"])
        style = "--" if name in (bench.COPY, bench.FILL) else ("-." if name.startswith("bitsandbytes") else "-")
        ax.plot([r["bytes"] / 1e6 for r in rs], [r["gbps"] for r in rs], style, marker="o", ms=3, label=name)
    l2 = run.meta.get("l2_bytes")
    if l2:
        ax.axvline(l2 / 1e6, color="0.5", lw=1, label=f"L2 size ({l2 / 2**20:.0f} MiB)")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call, MB (log scale)")
    ax.set_ylabel("effective bandwidth, GB/s")
    ax.set_title(f"NF4 dequantization across sizes ({dtype} output)")
    ax.grid(alpha=0.3)
    if fig is not None:
        finish(fig, run.meta, legend_from=ax)
    return ax
