"""Every environment variable nf4lab reads, in one place, with what it means and its default.

The rest of the package asks this module instead of ``os.environ``, so that a reader finds every
knob here (and in the table of docs/DEVELOPING.md, which lists the same rows) and a test can change
one with ``monkeypatch.setenv`` before the call that reads it. Each getter reads the environment
when it is called; the modules that must decide once (the run mode, the architecture cap) call
it once, at their import. This module imports nothing of nf4lab.
"""
from __future__ import annotations

import os
from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    meaning: str
    default: str


VARIABLES = (
    Variable("NF4LAB_MODE", "where kernels run: gpu, sim (numba's CUDA simulator) or compile (real numba.cuda "
             "without a GPU: PTX only; the PTX subprocesses use it)", "probe the CUDA driver: gpu if it sees a device, else sim"),
    Variable("NF4LAB_ARCH", "cap the code paths and the default PTX target at an older GPU: sm_75, sm_80, sm_86, "
             "sm_89 or sm_90 (sm_75 on an H100 compiles exactly what a T4 runs)", "unset: the GPU in hand, else sm_90"),
    Variable("NF4LAB_CACHE", "folder for generated bitsandbytes cases", "data/cache/"),
    Variable("NF4LAB_RESULTS_GPU", "which GPU's folder under data/results/ notebooks read in the simulator",
             "the GPU in hand, else the recorded GPU whose notebooks ran last"),
    Variable("NF4LAB_PTXAS", "the ptxas that `python -m nf4lab ptx --all` assembles with",
             "the one of the nvidia-cuda-nvcc wheel beside numba-cuda's NVVM"),
    Variable("NF4LAB_RUN_ID", "one run id for the results records of several processes (an orchestrating script "
             "sets it), so that their numbers may be compared", "a fresh id per process"),
    Variable("NF4LAB_LINEINFO", "0: profile without line info (set by the profiler for a kernel NVVM cannot "
             "compile with it)", "1"),
    Variable("NF4LAB_NOTEBOOK_KIND", "solution: the notebook's results records are saved to, and read first from, "
             "data/results/<gpu>/solutions/ (set by the notebook runner for a solution's kernel)", "unset: data/results/<gpu>/"),
)


def _get(name: str) -> str:
    return os.environ.get(name, "").strip()


def mode() -> str:
    """NF4LAB_MODE, lower case, or '' when unset (the caller validates it)."""
    return _get("NF4LAB_MODE").lower()


def arch() -> str:
    """NF4LAB_ARCH as given, or '' when unset (nf4lab.arch parses it)."""
    return _get("NF4LAB_ARCH")


def cache_dir(default):
    """NF4LAB_CACHE, or ``default``."""
    return _get("NF4LAB_CACHE") or default


def results_gpu() -> str | None:
    """NF4LAB_RESULTS_GPU, or None."""
    return _get("NF4LAB_RESULTS_GPU") or None


def ptxas() -> str:
    """NF4LAB_PTXAS, or '' to search beside NVVM."""
    return _get("NF4LAB_PTXAS")


def run_id() -> str:
    """NF4LAB_RUN_ID, or '' for a fresh id per process."""
    return _get("NF4LAB_RUN_ID")


def notebook_kind() -> str:
    """NF4LAB_NOTEBOOK_KIND: 'solution' in a solution notebook's kernel, else ''."""
    return _get("NF4LAB_NOTEBOOK_KIND")


def lineinfo() -> bool:
    """Whether the profiler compiles kernels with line info (NF4LAB_LINEINFO != '0')."""
    return _get("NF4LAB_LINEINFO") != "0"


def set_variables() -> dict:
    """The NF4LAB_* variables set in this environment (for ``python -m nf4lab info``)."""
    return {v.name: os.environ[v.name] for v in VARIABLES if v.name in os.environ}


def markdown_table() -> str:
    """The table docs/DEVELOPING.md carries (a test keeps the two the same)."""
    rows = ["| variable | meaning | default |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | {v.meaning} | {v.default} |" for v in VARIABLES]
    return "\n".join(rows)
