"""Every notebook and its solution twin runs top to bottom in the simulator.

A failed verification raises VerificationError in its cell and fails the notebook;
solutions assert their exercise checks; student notebooks must show their unsolved
exercises failing the checker cleanly (printed, not raised).
"""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from nf4lab.__main__ import ROOT, notebook_paths

NOTEBOOKS = notebook_paths(solutions=True)


def test_notebooks_are_built_from_their_sources():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "build_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def build(tmp_path, source: str) -> subprocess.CompletedProcess:
    """tools/build_notebooks.py through its command line, on a tree of its own: a copy of the tool (its root is
    its folder's parent), the package linked in (the tool reads nf4lab's notebook cleaner from there), one source."""
    import shutil

    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "build_notebooks.py", tmp_path / "tools")
    (tmp_path / "nf4lab").symlink_to(ROOT / "nf4lab")
    (tmp_path / "notebooks" / "src").mkdir(parents=True)
    (tmp_path / "notebooks" / "src" / "01_demo.py").write_text(source)
    return subprocess.run([sys.executable, str(tmp_path / "tools" / "build_notebooks.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_builder_writes_cells_tags_and_solution_regions(tmp_path):
    src = ('# header comment, not a cell\n\n# %% [markdown]\n# ## Title\n#\n# prose\n\n'
           '# %% tags=["kernel"]\nx = 1\n### BEGIN SOLUTION\ny = 2\n### STUDENT\ny = None  # TODO\n### END SOLUTION\n')
    p = build(tmp_path, src)
    assert p.returncode == 0, p.stdout + p.stderr
    for path, body, tags in ((tmp_path / "notebooks" / "01_demo.ipynb", "x = 1\ny = None  # TODO", ["kernel", "exercise"]),
                             (tmp_path / "notebooks" / "solutions" / "01_demo_SOLUTION.ipynb", "x = 1\ny = 2", ["kernel"])):
        nb = nbformat.read(path, as_version=4)
        assert nb.cells[1].metadata["tags"] == ["setup"]           # after the Colab badge: the hosted setup
        cells = nb.cells[2:]
        assert [(c.cell_type, c.metadata.get("tags", [])) for c in cells] == [("markdown", []), ("code", tags)]
        assert cells[0].source == "## Title\n\nprose"
        assert cells[1].source == body


def test_a_lessons_exercise_cell_is_committed_without_outputs():
    """What a starting point prints (NOT PASSED and why) answers the prediction its exercise asks for."""
    from nf4lab.measure import nbclean

    nb = nbformat.v4.new_notebook()
    for tags in (["exercise"], []):
        c = nbformat.v4.new_code_cell("print(1)", metadata={"tags": tags, "execution": {"iopub.status.idle": "2026-11-28T08:53:16Z"}})
        c.outputs, c.execution_count = [nbformat.v4.new_output("stream", text="NOT PASSED\n")], 3
        nb.cells.append(c)
    nbclean.clean(nb)
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None and "execution" not in nb.cells[0].metadata
    assert nb.cells[1].outputs[0]["text"] == "NOT PASSED\n"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if "solutions" not in p.parts], ids=lambda p: p.stem)
def test_committed_lessons_show_no_exercise_output(path):
    from nf4lab.measure.nbclean import EXERCISE_TAG

    nb = nbformat.read(path, as_version=4)
    todo = [c for c in nb.cells if c.cell_type == "code" and "TODO" in c.source]   # a lesson keeps only the stubs
    tagged = [c for c in nb.cells if EXERCISE_TAG in c.metadata.get("tags", [])]
    assert tagged, "no exercise cell is tagged: every lesson has an exercise"
    assert all(not c.outputs for c in tagged), [c.source[:60] for c in tagged if c.outputs]
    assert all(EXERCISE_TAG in c.metadata.get("tags", []) for c in todo), [c.source[:60] for c in todo]


def test_builder_refuses_a_markdown_heading_in_code(tmp_path):
    p = build(tmp_path, "# %%\nx = 1\n# ## A heading left in code\n")
    assert p.returncode != 0 and "markdown heading" in p.stderr


def test_every_step_has_a_solution_twin():
    students = {p.stem for p in NOTEBOOKS if "solutions" not in p.parts}
    solutions = {p.stem.removesuffix("_SOLUTION") for p in NOTEBOOKS if "solutions" in p.parts}
    assert students and students == solutions


# 08 runs in tests/test_profiling.py and 09 in tests/test_gemv.py, with assertions of their own.
STEMS = sorted({p.stem.removesuffix("_SOLUTION") for p in NOTEBOOKS} - {"08_profiling", "09_fused_gemv"})


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_notebook_runs_in_the_simulator(stem, notebook_twins):
    """The solution runs top to bottom, then the student's own cells (its exercise stubs) in the same kernel:
    one run covers both twins' code. A kernel that is not bit-exact raises VerificationError in its cell, which
    fails the run; "NOT bit-exact" may still appear in the text where a notebook shows a planted bug."""
    solution, student = notebook_twins(stem)
    sources = "\n".join(c.source for p in NOTEBOOKS if p.stem.removesuffix("_SOLUTION") == stem
                        for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code")
    if "nf4lab.check" in sources or "check(" in sources:
        assert "NOT PASSED" not in solution, "a solution fails its own checker"
        assert "NOT PASSED" in student, "an unsolved exercise should fail its checker (cleanly)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_relative_link_opens_a_file(path):
    """In Jupyter a markdown link is relative to the notebook's folder: a solution's "Next" link to a lesson
    must go up from solutions/ (the site is built from the same files)."""
    import re

    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type != "markdown":
            continue
        text = re.sub(r"`[^`\n]*`", "", c.source)    # code spans: `kernel[blocks, threads](...)` is not a link
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (path.parent / target).exists(), f"{path.name}: link to {target} opens nothing"
