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
    compare itself with an H100). Without a GPU: the recorded GPU with the most results files
    (ties by name, so the choice is stable). ``NF4LAB_RESULTS_GPU`` overrides both.
    """
    env = config.results_gpu()
    if env:
        return gpu_slug(env)
    here = current_gpu()
    if here is not None:
        return here
    found = gpus()
    return found[0] if found else None


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
    return data


def label(meta: dict, path=None) -> str:
    """One line saying where and when numbers were measured: the GPU, the date, the versions, the run id
    (records of one run are comparable), and ``path`` when given: which file was read, e.g. the lesson's
    record where a solution notebook found no solutions/ copy of its own."""
    run = f", run {meta['run']}" if meta.get("run") else ""
    where = f" [{path}]" if path else ""
    return (f"{meta.get('gpu')}, {meta.get('date')}, driver {meta.get('driver')}; numba-cuda "
            f"{meta.get('numba_cuda')}, bitsandbytes {meta.get('bitsandbytes')}, torch {meta.get('torch')}{run}{where}")
