"""Results files: data/results/<gpu>/<name>.json, one run per file.

    {"meta": {"gpu", "driver", "clocks", "date", "numba", "numba_cuda", "bitsandbytes",
              "torch", "method", ...},
     "records": [{"kind": "kernel" | "ceiling" | "baseline", "name", "shape": [rows, cols],
                  "dtype", "ms", "gbps", "pct_copy", "pct_fill", "pct_bound",
                  "speedup_vs_bnb", "bit_exact", ...}]}

Besides the three kinds above, ``bound`` marks a timing of the same memory traffic without
the arithmetic (nf4lab.measure.bench.bound, lab/tune_best_kernel.py), ``exactness`` a bit-exactness
check with no timing (tools/bench_dequantize.py, tools/gpu_exactness.py) and ``time`` a
notebook's execution time (python -m nf4lab notebooks). Notebooks and plots read these files; nothing is typed
in by hand.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from pathlib import Path

from .. import config
from . import provenance

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "data" / "results"


def gpu_slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "unknown"


def meta(method: str) -> dict:
    from .. import runtime

    info = runtime.device_info()
    return {
        "gpu": info.get("gpu"),
        "driver": info.get("driver"),
        "cuda_driver": info.get("cuda_driver"),
        "clocks": {"sm_mhz": info.get("sm_clock_mhz"), "mem_mhz": info.get("mem_clock_mhz")},
        "sms": info.get("sms"),
        "l2_bytes": info.get("l2_bytes"),
        # notebook 02 sizes its grid from it; recorded so that the simulator can show the recorded GPU's
        "max_threads_per_sm": info.get("max_threads_per_sm"),
        "spec_peak_gbps": info.get("spec_peak_gbps"),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "numba": info.get("numba"),
        "numba_cuda": info.get("numba_cuda"),
        "bitsandbytes": info.get("bitsandbytes"),
        "torch": info.get("torch"),
        "numpy": info.get("numpy"),
        "method": method,
        "run": provenance.RUN_ID,             # a timing ratio compares records of one run
        "code_path": provenance.code_path(),  # native, or the architecture NF4LAB_ARCH caps it at
    }


SOLUTION_KIND = "solution"   # NF4LAB_NOTEBOOK_KIND of a solution notebook's kernel (nf4lab.__main__.execute_notebook)


def _path(folder: str, name: str, solution: bool) -> Path:
    """Where record ``name`` of a GPU's folder lies: a solution notebook's in the folder's solutions/."""
    return RESULTS_DIR.joinpath(folder, *(("solutions",) if solution else ()), f"{name}.json")


def save(data: dict, name: str, gpu: str | None = None) -> Path:
    """Write one run atomically. A solution notebook's run goes to the GPU's ``solutions/`` folder: the record other
    notebooks quote is the lesson's, and a solution executed first must not have its saved file replaced under it."""
    gpu = gpu or data["meta"]["gpu"]
    path = _path(gpu_slug(gpu), name, config.notebook_kind() == SOLUTION_KIND)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "meta" in data and "record" in data["meta"]:   # load()'s in-memory name: the file's name says it
        data = {**data, "meta": {k: v for k, v in data["meta"].items() if k != "record"}}
    text = json.dumps(data, indent=1, default=_jsonable) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def _jsonable(x):
    import numpy as np

    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"not JSON serialisable: {type(x)}")


def gpus() -> list[str]:
    """GPU folders that hold results, most files first."""
    if not RESULTS_DIR.exists():
        return []
    dirs = [d for d in RESULTS_DIR.iterdir() if d.is_dir() and any(d.glob("*.json"))]
    return [d.name for d in sorted(dirs, key=lambda d: (-len(list(d.glob("*.json"))), d.name))]


def check_results_gpu() -> None:
    """ValueError naming the recorded GPUs when NF4LAB_RESULTS_GPU names a folder without results (the CLI
    says so in one line; notebooks and the profiler fall back to what is recorded)."""
    env = config.results_gpu()
    if env and gpu_slug(env) not in gpus():
        raise ValueError(f"NF4LAB_RESULTS_GPU={env!r} has no results under data/results/; recorded GPUs: "
                         f"{', '.join(gpus()) or 'none'}")


def current_gpu() -> str | None:
    """The results folder of the GPU in hand, or None without a GPU."""
    from .. import runtime

    return gpu_slug(runtime.device_info()["gpu"]) if runtime.ON_GPU else None


def default_gpu() -> str | None:
    """Whose results notebooks read, compare and plot.

    On a GPU: that GPU's own, even before anything is recorded for it (a T4's first run must not
    compare itself with an H100). Without a GPU: the recorded GPU whose notebooks ran last (the newest
    ``notebook_times.json``), so a simulator run shows the records the committed outputs show; where no
    book run is recorded, the GPU with the most results files (ties by name, so the choice is stable).
    ``NF4LAB_RESULTS_GPU`` overrides both.
    """
    env = config.results_gpu()
    if env:
        return gpu_slug(env)
    here = current_gpu()
    if here is not None:
        return here
    found = gpus()
    book = {g: _book_date(g) for g in found}
    ran = sorted(g for g in found if book[g])
    if ran:
        return max(ran, key=book.get)   # the first of equal dates: by name
    return found[0] if found else None


def _book_date(gpu: str) -> str:
    """When the book last ran on this GPU ('' when never): notebook_times.json's date, which sorts as text."""
    path = RESULTS_DIR / gpu / "notebook_times.json"
    try:
        return str(json.loads(path.read_text()).get("meta", {}).get("date", ""))
    except (OSError, ValueError):
        return ""


def source_note(gpu: str | None = None) -> str:
    """Says whose results are shown: this run's GPU, or a recorded one when there is no GPU here."""
    gpu = gpu or default_gpu()
    if gpu is None:
        return "no results recorded for any GPU yet"
    here = current_gpu()
    if gpu == here:
        return f"results of this GPU ({gpu})"
    if here is None:
        return f"recorded on {gpu} (no GPU here: these are not this machine's measurements)"
    return f"recorded on {gpu}, not on this GPU ({here})"


# The kernels that ship, and the date of the first recorded GPU run of each as it ships. A record older
# than that measured a kernel that has since been replaced, so its numbers say nothing about the shipped
# one. The runs came before the commits that shipped the code they measured (the commit messages cite
# them): `git show COMMIT` tells what changed. When a shipped kernel changes, add its new first run here.
SHIPPED = {
    "dequant": ("notebook 06's kernel, which nf4lab.dequantize ships", "864c0e9", "2026-11-26 13:53 UTC"),
    # Groups of warps a tile (gemv.warps_a_tile) were first timed as bench_gemv's "TC G2" / "TC G4" at 08:05
    # (09_gemv_groups_*.log, no record file); notebook 09 first ran them as shipped at 08:43. At shapes where the rule
    # keeps 8 warps a tile the kernel is the one of d6aa959 (its table built by 16-byte stores), first recorded 03:57.
    "gemv": ("the tensor-core GEMV with groups of warps a tile where tiles outnumber blocks (nf4lab.kernels.gemv)",
             "ece45b4", "2026-11-29 08:05 UTC"),
    # Host time (end to end, launch costs, models) also times the checks and the launch around the kernels; the
    # last change to them, one validation per weight (4c074d1 and its follow-ups), had no end-to-end run of its own.
    "dequant_host": ("nf4lab.dequantize's and install()'s host path (argument checks, launch), in host-timed records",
                     "47752b7", "2026-11-28 11:40 UTC"),
}


def kernels_measured(name: str) -> tuple:
    """Which shipped kernels a results file (by its name) measured."""
    if name.startswith(("09_read_bound", "gemv_paths")):
        return ()               # a bound that reads bytes, or the sm_75 paths' check: no shipped timing
    if name.startswith("09_"):
        return ("gemv",)
    if name.startswith("dequantize"):
        return ("dequant", "dequant_host")   # end to end: host time
    if name.startswith(("06_", "07_", "exactness", "sm_75_06")):
        return ("dequant",)
    if name.startswith(("models", "launch_cost")):
        return ("dequant", "gemv", "dequant_host")   # install() serves both, timed on the host
    if name.startswith(("bnb_tests", "notebook_times")):
        return ("dequant", "gemv")   # install() serves both, and the notebooks run both
    return ()


def earlier(name: str | None, meta: dict) -> str:
    """'recorded <date> with an earlier kernel' when the record predates a kernel it measured ('... host path' when
    only the host path it timed changed since), else '' (and for a
    record of no known name)."""
    date = meta.get("date") or ""
    old = [k for k in kernels_measured(name) if date < SHIPPED[k][2]] if name else []
    if old:
        return f"recorded {date} with an earlier {'host path' if old == ['dequant_host'] else 'kernel'}"
    return ""


def load(name: str, gpu: str | None = None) -> dict | None:
    """A GPU's record ``name``; in a solution notebook's kernel the solutions' own where one exists (see save), so a
    solution's plots and quotes read the chain of solutions it was executed in, and a lesson's the lessons'."""
    gpu = gpu_slug(gpu) if gpu else default_gpu()
    if gpu is None:
        return None
    path = _path(gpu, name, False)
    if config.notebook_kind() == SOLUTION_KIND and (own := _path(gpu, name, True)).exists():
        path = own
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data["path"] = str(path.relative_to(ROOT))
    data["meta"].setdefault("record", name)   # in memory: label() tells a record of a replaced kernel by its name
    return data


def label(meta: dict, path=None) -> str:
    """One line saying where and when numbers were measured: the GPU, the date, the versions, the run id
    (records of one run are comparable), and ``path`` when given: which file was read, e.g. the lesson's
    record where a solution notebook found no solutions/ copy of its own."""
    run = f", run {meta['run']}" if meta.get("run") else ""
    where = f" [{path}]" if path else ""
    old = earlier(meta.get("record"), meta)
    return (f"{meta.get('gpu')}, {meta.get('date')}, driver {meta.get('driver')}; numba-cuda "
            f"{meta.get('numba_cuda')}, bitsandbytes {meta.get('bitsandbytes')}, torch {meta.get('torch')}{run}{where}"
            + (f" ({old}, not the shipped one)" if old else ""))
