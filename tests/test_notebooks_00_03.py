"""Notebooks 00-03: their kernel cells stand alone and stay bit-exact; the sources build.

The generic test executes every notebook headless; these are the cheap checks that
point at the broken piece directly: the ``kernel``-tagged cells of 01-03 (what
nf4lab.harness.versions and the summary load) define VERSIONS with step-numbered names, and
every version is bit-exact on tiny odd and even shapes, including the odd tail.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import nf4lab
from nf4lab.harness import versions

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("01_naive", "02_grid_stride", "03_packed_u32")
SHAPES = ((1, 1), (3, 5), (1, 64))


@pytest.mark.parametrize("stem", STEPS)
def test_kernel_cells_define_step_versions(stem):
    found = versions.load(stem)
    assert found, f"{stem}: the kernel-tagged cells define no VERSIONS"
    for name in found:
        assert name.startswith(stem[:2] + " "), f"{stem}: version {name!r} does not start with its step number"


@pytest.mark.parametrize("stem", STEPS)
@pytest.mark.parametrize("shape", SHAPES)
def test_versions_bit_exact_on_tiny_shapes(stem, shape):
    case = nf4lab.make_case(shape)
    for name, launch in versions.load(stem).items():
        nf4lab.run_and_verify(launch, case, name=f"{name} {shape}")   # raises VerificationError


@pytest.mark.parametrize("stem", ("00_ceiling",) + STEPS)
def test_student_notebook_has_no_solution_asserts(stem):
    import nbformat

    student = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "notebooks" / "solutions" / f"{stem}_SOLUTION.ipynb", as_version=4)
    text = "\n".join(c.source for c in student.cells)
    assert "### BEGIN SOLUTION" not in text and "assert result" not in text
    if stem != "00_ceiling":
        assert "TODO" in text, "exercise stubs are marked TODO"
        assert "assert result" in "\n".join(c.source for c in solution.cells)


# Where a notebook writes a helper that later notebooks import from nf4lab.lesson, the two
# must be the same code (docstrings aside): the student reads one, the series runs the other.
LESSON_HELPERS = {"01_naive": ("block_scale",), "02_grid_stride": ("sm_count", "blocks_per_sm", "grid_for")}


def _functions(source: str) -> dict:
    import ast

    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]   # the docstring
            out[node.name] = ast.dump(ast.Module(body=body, type_ignores=[])) + ast.dump(node.args)
    return out


@pytest.mark.parametrize("stem", sorted(LESSON_HELPERS))
def test_notebook_helpers_match_nf4lab_lesson(stem):
    import inspect

    from nf4lab import lesson

    # nf4lab.device_info is runtime.device_info: a notebook reaches it through the public name
    src = "\n".join(versions.kernel_cells(ROOT / "notebooks" / f"{stem}.ipynb"))
    cells = _functions(src.replace("nf4lab.device_info(", "runtime.device_info("))
    canonical = _functions(inspect.getsource(lesson))
    for name in LESSON_HELPERS[stem]:
        assert name in cells, f"{stem} no longer defines {name} in a kernel cell"
        assert cells[name] == canonical[name], f"{stem}'s {name} differs from nf4lab.lesson.{name}"
