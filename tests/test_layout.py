"""The flat names the notebooks use (nf4lab was flat when their outputs were recorded) are the moved modules."""
import subprocess
import sys
from pathlib import Path

import nf4lab
from nf4lab import _FLAT


def test_flat_names_are_the_moved_modules():
    import importlib

    for leaf, role in _FLAT.items():
        real = importlib.import_module(f"nf4lab.{role}.{leaf}")
        assert importlib.import_module(f"nf4lab.{leaf}") is real, leaf   # not a copy: the simulator patches globals
        assert sys.modules[f"nf4lab.{leaf}"] is real and getattr(nf4lab, leaf) is real


def test_notebook_imports_resolve():
    from nf4lab import gemv
    from nf4lab.buffers import quiet_small_grids  # noqa: F401
    from nf4lab.gemv import MAX_M, mma_bf16, prmt, spare  # noqa: F401
    from nf4lab.lesson import BLOCK_SHIFT, block_scale  # noqa: F401
    from nf4lab.reference import NF4_LUT, lut_for  # noqa: F401

    # notebook 09 reaches the GEMV's reference and benchmark through nf4lab.gemv
    for name in ("check", "compare", "make_gemv_case", "bnb_output", "check_exercise", "tolerance", "benchmark",
                 "summary", "plot", "find_record", "default_kernel", "kernel_name", "COPY",
                 "weight_bytes", "unfused_bytes"):
        assert getattr(gemv, name) is not None


def test_python_m_flat_name_runs_the_moved_module():
    out = subprocess.run([sys.executable, "-m", "nf4lab.profiling", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "drive" in out.stdout, out.stderr


def test_the_gemv_stays_small():
    """The GEMV's code in nf4lab (kernel, float64 check, benchmark; its device ops apart) stays at most 720 lines:
    what only the lab uses belongs in lab/. (700 until x's shared slot shipped for M = 1: its device ops live in
    warp_ops, its 19 lines of use in the kernel count here; 720 until the statistics word shipped: its load and
    shuffles, and the choice of the byte-wise loads where it does not apply.)"""
    root = Path(nf4lab.__file__).parent
    files = ("kernels/gemv.py", "lesson/gemv_check.py", "measure/gemv_bench.py")
    n = sum(len((root / f).read_text().splitlines()) for f in files)
    assert n <= 750, f"{n} lines in {files}"


def test_no_code_cell_is_longer_than_a_lesson_cell():
    """A code cell a student reads at once: at most 120 non-blank lines, in every notebook and solution."""
    import nbformat
    from nf4lab.__main__ import notebook_paths

    for path in notebook_paths(solutions=True):
        for cell in nbformat.read(path, as_version=4).cells:
            n = sum(1 for line in cell.source.splitlines() if line.strip())
            assert cell.cell_type != "code" or n <= 120, f"{path.name}: a code cell of {n} non-blank lines"
