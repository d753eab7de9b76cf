"""Every plot of the series can be read: no legend over a bar or a label, nothing cut at the
figure's edge, and the GPU and the date on the figure.

Each plot is rendered (Agg) from the committed results records, as the notebooks and
``python -m nf4lab plot`` draw them, and matplotlib reports the boxes of what it drew.
"""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from nf4lab.measure import bench, gemv_bench, results  # noqa: E402
from nf4lab.lesson import plots  # noqa: E402

GPU = "NVIDIA_H100_80GB_HBM3"


def _drawn_texts(fig):
    """The texts a reader sees: the figure's, each axes' own, titles, axis labels and the tick labels
    of the ticks in view (an axis keeps Tick objects for ticks outside its limits, not drawn)."""
    out = list(fig.texts)
    for ax in fig.axes:
        out += list(ax.texts) + [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():
                out += [lab for lab in (tick.label1, tick.label2) if lab.get_visible()]
    return out


def readability_problems(fig) -> list[str]:
    """What a reader could not read: a legend over a text or a bar, a text cut at the figure's edge; at a
    notebook's screen resolution and at the resolution of the saved PNGs (font metrics do not scale exactly)."""
    problems = []
    for dpi in (72, 80, 100, 120):
        fig.set_dpi(dpi)
        problems += [f"{p} (at {dpi} dpi)" for p in _problems_at(fig)]
    return sorted(set(problems))


def _problems_at(fig) -> list[str]:
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    fb = fig.bbox
    texts = [t for t in _drawn_texts(fig) if t.get_visible() and t.get_text().strip()]
    legends = [leg for leg in fig.findobj(Legend) if leg.get_visible()]
    bars = [p for ax in fig.axes for p in ax.patches if isinstance(p, Rectangle) and p.get_visible()
            and p.get_width() and p.get_height()]
    problems = []
    for t in texts:
        bb = t.get_window_extent(r)
        if bb.x0 < fb.x0 - 1 or bb.y0 < fb.y0 - 1 or bb.x1 > fb.x1 + 1 or bb.y1 > fb.y1 + 1:
            problems.append(f"cut at the figure's edge: {t.get_text()[:60]!r}")
    for leg in legends:
        lb = leg.get_window_extent(r)
        if lb.x0 < fb.x0 - 1 or lb.y0 < fb.y0 - 1 or lb.x1 > fb.x1 + 1 or lb.y1 > fb.y1 + 1:
            problems.append("legend cut at the figure's edge")
        for t in texts:
            if lb.overlaps(t.get_window_extent(r)):
                problems.append(f"legend over the text {t.get_text()[:60]!r}")
        for p in bars:
            if lb.overlaps(p.get_window_extent(r)):
                problems.append("legend over a bar")
                break
    return problems


def caption_problems(fig, meta) -> list[str]:
    """The GPU, the date and the whole method (not a cut prefix) are on the figure."""
    text = " ".join(" ".join(t.get_text().split()) for t in fig.findobj(Text))
    want = (("GPU", meta.get("gpu")), ("date", meta.get("date")), ("method", " ".join(meta.get("method", "").split())))
    return [f"{what} not on the figure" for what, v in want if not v or str(v) not in text]


def _check(fig, meta):
    problems = readability_problems(fig) + caption_problems(fig, meta)
    plt.close(fig)
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_legend_over_a_bar_and_a_cut_label():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.barh([0, 1], [10, 9], label="x")
    ax.axvline(5, label="a line")
    ax.legend(loc="center")
    fig.text(0.9, 0.5, "a footer that runs off the figure")
    problems = readability_problems(fig)
    plt.close(fig)
    assert any("legend over a bar" in p for p in problems)
    assert any("cut at the figure's edge" in p for p in problems)


@pytest.mark.parametrize("name", ["00_ceiling", "07_summary"])
def test_bars(name):
    run = bench.Run.load(name, GPU)
    ax = plots.bars(run, dtype="bf16", shape=[r for r in run.records if r["kind"] == "baseline"][0]["shape"])
    _check(ax.figure, run.meta)
    # bitsandbytes end to end is host time per call, not GPU time: the axis says so where that bar is drawn
    wall = any(r.get("timing") == bench.WALL_CLOCK and r["dtype"] == "bf16" for r in run.records)
    assert ("host time per call" in ax.get_xlabel()) == wall, ax.get_xlabel()


@pytest.mark.parametrize("notebook", ["01_naive", "02_grid_stride", "03_packed_u32", "04_vector_loads",
                                      "05_shared_lut", "06_output_dtypes"])
def test_progress(notebook):
    plots.progress(notebook, GPU)
    fig = plt.gcf()
    _check(fig, bench.Run.load(notebook, GPU).meta)


def test_sweep():
    run = bench.Run.load("07_sweep", GPU)
    ax = plots.sweep(run, dtype="bf16")
    _check(ax.figure, run.meta)


@pytest.mark.parametrize("batch", [False, True])
def test_gemv_plot(batch):
    run = bench.Run.load("09_fused_gemv_batch" if batch else "09_fused_gemv", GPU)
    ax = gemv_bench.plot(run, batch=batch)
    _check(ax.figure, run.meta)


def test_every_recorded_gpu_has_its_name_on_the_plot():
    assert GPU in results.gpus()


@pytest.mark.parametrize("gpu", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"])
def test_progress_keeps_a_carried_bars_ratios_from_its_own_run(gpu):
    """A bar carried from an earlier step's run shows that run's x bitsandbytes and % of copy (this
    run's bitsandbytes over another run's time is a ratio of records that are not comparable), and is
    hatched, so that it does not read as this run's measurement."""
    here = bench.Run.load("03_packed_u32", gpu)
    shape = next(r["shape"] for r in here.kernels() if r["dtype"] == "bf16")
    merged = plots.progress("03_packed_u32", gpu)
    hatched = [p for p in plt.gca().patches if p.get_hatch() == "//" and p.get_width() > 0]
    plt.close("all")
    carried = [r for r in merged.kernels() if "'s run of" in r["name"]]
    assert carried, "03's plot carries no bar from another run: the test needs one"
    assert len(hatched) == len(carried), "a bar from another run is drawn as this run's"
    for r in carried:
        step = r["name"].split("(")[-1][:2]
        source = next(p.stem for p in (results.RESULTS_DIR / gpu).glob(f"{step}_*.json"))
        own = bench.Run.load(source, gpu).get(r["name"].rsplit(" (", 1)[0], shape, "bf16")
        assert r["speedup_vs_bnb"] == own["speedup_vs_bnb"] and r["pct_copy"] == own["pct_copy"], r["name"]


def test_the_caption_says_the_spread_is_not_drawn():
    """The method names a p10-p90 spread; no bar draws one, so the caption says where it is."""
    from nf4lab.measure import figures

    run = bench.Run.load("04_vector_loads", GPU)
    plots.progress("04_vector_loads", GPU)
    text = " ".join(" ".join(t.get_text().split()) for t in plt.gcf().findobj(Text))
    plt.close("all")
    assert "spread = p10-p90" in run.meta["method"] and figures.SPREAD_NOTE in text


def test_progress_legend_names_every_kind_of_bar():
    """06's progress plot draws 05's kernel, timed in 06's run, as a solid blue bar beside 06's orange one:
    the legend says what solid blue is, as it says what hatched is."""
    plots.progress("06_output_dtypes", GPU)
    fig = plt.gcf()
    texts = [t.get_text() for lg in fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
             for t in lg.get_texts()]
    plt.close("all")
    assert any(t.startswith("solid blue") for t in texts), texts
