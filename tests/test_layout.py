"""The package's modules are where docs/DEVELOPING.md says, and the names notebooks import are there."""
import subprocess
import sys
from pathlib import Path

import nf4lab


def test_notebook_imports_resolve():
    from nf4lab.format.reference import NF4_LUT, lut_for  # noqa: F401
    from nf4lab.harness.buffers import quiet_small_grids  # noqa: F401
    from nf4lab.harness.gemv_check import check, check_exercise, compare, make_gemv_case  # noqa: F401
    from nf4lab.kernels.gemv import MAX_M, mma_bf16, prmt, spare  # noqa: F401
    from nf4lab.lesson import BLOCK_SHIFT, block_scale  # noqa: F401
    from nf4lab.measure.gemv_bench import COPY, benchmark, summary, weight_bytes  # noqa: F401


def test_python_m_runs_a_measure_module():
    out = subprocess.run([sys.executable, "-m", "nf4lab.measure.profiling", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "drive" in out.stdout, out.stderr


def test_the_gemv_stays_small():
    """The GEMV's code in nf4lab (kernel, float64 check, benchmark; its device ops apart) stays at most 750 lines:
    what only the lab uses belongs in lab/, so that a reader of the shipped GEMV reads only what ships."""
    root = Path(nf4lab.__file__).parent
    files = ("kernels/gemv.py", "harness/gemv_check.py", "measure/gemv_bench.py")
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
