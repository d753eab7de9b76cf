"""Which executed notebooks quote a record that a later run replaced, and in which order to execute them again.

A notebook prints other notebooks' records (00's ceilings everywhere, 03's kernels in 04, every record in 07), each
labelled with its GPU and date. When a quoted notebook runs again, its record is replaced and the quoting notebook's
output still shows the old one: labelled, so not false, but no longer what that notebook's own page shows. The
staleness test cannot see this (no cell changed); this report does. It reads each notebook's own record under
data/results/<gpu>/ (its date: when it last ran there) and the notebooks it quotes (``QUOTES``, as docs/DEVELOPING.md
orders the book), and prints the notebooks to execute again, in book order, with their recorded wall times.

    python tools/book_order.py                 # the GPU whose results the book shows (NF4LAB_RESULTS_GPU, else the newest)
    python tools/book_order.py --gpu NVIDIA_H100_80GB_HBM3
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The notebook each number stands for, and the record it writes when it runs on a GPU.
RECORDS = {"00": "00_ceiling", "01": "01_naive", "02": "02_grid_stride", "03": "03_packed_u32", "04": "04_vector_loads",
           "05": "05_shared_lut", "06": "06_output_dtypes", "07": "07_summary", "08": None, "09": "09_fused_gemv_notebook"}
# Whose records a notebook prints (docs/DEVELOPING.md, "A notebook that quotes another's record goes after it").
QUOTES = {"00": (), "01": ("00",), "02": ("00", "01"), "03": ("00", "01", "02"), "04": ("00", "03"), "05": ("00", "04"),
          "06": ("00", "05"), "07": (), "08": ("07",), "09": ("00",)}   # 07 times every version and ceiling in its own run;
# 09's section 1 prints 00's copy speed
ORDER = ("00", "01", "02", "03", "04", "05", "06", "09", "07", "08")   # a valid book order (08 after 07)


def _date(s: str | None) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(s.replace(" UTC", ""), "%Y-%m-%d %H:%M") if s else None
    except ValueError:
        return None


def _notebook(nn: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{nn}_*.ipynb"))


def run_dates(gpu: str) -> dict:
    """{notebook: when it last ran on ``gpu``}: its record's date; a notebook without a record (08) by the
    ``executed_at`` stamp of its executed copy, else the time of the commit that last changed it."""
    from nf4lab.measure import results

    out = {}
    for nn, stem in RECORDS.items():
        rec = results.load(stem, gpu) if stem else None
        if rec is not None:
            out[nn] = _date(rec.get("meta", {}).get("date"))
            continue
        meta = json.loads(_notebook(nn).read_text()).get("metadata", {}).get("nf4lab", {})
        when = _date(meta.get("executed_at"))
        if when is None and gpu.replace("_", " ") in (meta.get("executed_on") or "").replace("_", " "):
            log = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d %H:%M", "--",
                                  str(_notebook(nn).relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True,
                                 env={"TZ": "UTC", "PATH": "/usr/bin:/bin"})
            when = _date(log.stdout.strip())
        out[nn] = when
    return out


def plan(dates: dict, stale=()) -> list[tuple[str, list[str]]]:
    """[(notebook, why)], in book order: ``why`` lists the quoted notebooks that ran after it (or ``["stale"]``, a
    notebook in ``stale``: its outputs no longer come from its code), counting a notebook run again as new: once
    one is planned, everything that quotes it is too."""
    redo, out = set(), []
    for nn in ORDER:
        newer = [q for q in QUOTES[nn] if q in redo or (dates.get(q) and dates.get(nn) and dates[q] > dates[nn])]
        if nn in stale or newer:
            redo.add(nn)
            out.append((nn, (["stale"] if nn in stale else []) + newer))
    return out


def stale_notebooks() -> set:
    """Notebooks whose lesson or solution shows outputs that its code no longer gives (nbclean.stale): after
    ``git apply`` of source edits and tools/build_notebooks.py, these must run again."""
    import nbformat

    from nf4lab.measure import nbclean

    out = set()
    for nn in ORDER:
        stem = _notebook(nn).stem
        for path in (ROOT / "notebooks" / f"{stem}.ipynb", ROOT / "notebooks" / "solutions" / f"{stem}_SOLUTION.ipynb"):
            if path.exists() and nbclean.stale(nbformat.read(path, as_version=4)) is not None:
                out.add(nn)
    return out


def calls(todo: list, seconds: dict, limit: float = 540) -> list[list[str]]:
    """The planned notebooks in book order, packed into device calls of at most ``limit`` seconds by their recorded
    times (a notebook longer than that gets a call of its own)."""
    out, used = [], limit
    for nn in todo:
        if used + seconds.get(nn, 0) > limit:
            out.append([])
            used = 0.0
        out[-1].append(nn)
        used += seconds.get(nn, 0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", help="results folder under data/results (default: the book's GPU)")
    args = ap.parse_args(argv)
    from nf4lab.measure import results

    gpu = args.gpu or results.default_gpu()
    if not (ROOT / "data" / "results" / gpu).is_dir():
        print(f"no results for {gpu!r} under data/results/", file=sys.stderr)
        return 2
    dates = run_dates(gpu)
    times = {r["name"]: r["seconds"] for r in (results.load("notebook_times", gpu) or {}).get("records", [])}
    print(f"{gpu}: when each notebook last ran there")
    for nn in ORDER:
        print(f"  {nn}  {dates[nn].strftime('%Y-%m-%d %H:%M UTC') if dates.get(nn) else 'never (no record)'}")
    todo = plan(dates, stale_notebooks())
    if not todo:
        print("every notebook ran after the notebooks it quotes, and none shows stale outputs: nothing to execute again")
        return 0
    secs = {}
    print("to execute again, in this order (stale outputs, or a quoted record replaced after it ran):")
    for nn, why in todo:
        stem = _notebook(nn).stem
        # 06 runs once more under NF4LAB_ARCH=sm_75 before its native runs (tools/gpu_book_seq.sh), and that pass
        # took about twice the native lesson's time (H200, 2026-11-29: 147 s against 76, 173 against 111)
        secs[nn] = times.get(stem, 0) * (3 if nn == "06" else 1) + times.get(stem + "_SOLUTION", 0)
        said = ", ".join("its outputs are stale" if w == "stale" else f"quotes {w}" for w in why)
        print(f"  {nn}  {said}" + (f"  (about {secs[nn]:.0f} s here)" if secs[nn] else ""))
    print(f"about {sum(secs.values()) / 60:.0f} min of notebooks on {gpu}; as device calls of at most 540 s each:")
    for k, group in enumerate(calls([nn for nn, _ in todo], secs)):
        print(f"  bash tools/gpu_book_seq.sh {chr(65 + k)} {' '.join(group)}   # about "
              f"{sum(secs.get(nn, 0) for nn in group):.0f} s; then tools/book_carry.sh with its pack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
