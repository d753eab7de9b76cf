"""Committed notebooks show results, not the noise of their run."""
import nbformat
import pytest

from nf4lab.measure import nbclean
from nf4lab.__main__ import ROOT, notebook_paths


EXECUTED = sorted(ROOT.glob("data/executed/*/*.ipynb"))   # the same notebooks, executed on other GPUs


@pytest.mark.parametrize("path", notebook_paths(solutions=True) + EXECUTED,
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_outputs_are_clean(path):
    problems = nbclean.problems(nbformat.read(path, as_version=4))
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("path", notebook_paths(solutions=True) + EXECUTED,
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_outputs_come_from_the_code_they_sit_under(path):
    why = nbclean.stale(nbformat.read(path, as_version=4))
    assert why is None, f"{path.name}: {why}"


def test_a_changed_code_cell_makes_outputs_stale():
    nb = _nb("result 3\n")
    assert nbclean.stale(nb) is not None                      # outputs, no record
    nb.metadata["nf4lab"] = {"code_sha256": nbclean.code_hash(nb)}
    assert nbclean.stale(nb) is None
    nb.cells.append(nbformat.v4.new_code_cell("y = 1", metadata={"tags": ["setup"]}))
    assert nbclean.stale(nb) is None                          # the setup cell does not count
    nb.cells[0].source = "x + 1"
    assert "changed" in nbclean.stale(nb)
    for c in nb.cells:
        c.outputs = []
    assert nbclean.stale(nb) is None                          # no outputs, nothing to be stale


def _nb(*texts, name="stdout"):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name=name, text=t) for t in texts]
    nb.cells.append(cell)
    return nb


def test_clean_removes_ansi_frames_bars_and_warnings_and_reports_them():
    nb = _nb("verifying:   0%|          | 0/14 [00:00<?, ?it/s]\rverifying: 100%|##########| 14/14 [00:01<00:00, 9.1it/s]\n",
             "\x1b[1mbold\x1b[0m result 3\n",
             "/x/dispatcher.py:748: NumbaPerformanceWarning: Grid size 65 will likely result in GPU under-utilization\n"
             "  warn(NumbaPerformanceWarning(msg))\nkept line\n", name="stderr")
    assert len(nbclean.problems(nb)) >= 3
    removed = nbclean.clean(nb)
    assert removed and "NumbaPerformanceWarning" in removed[0]
    texts = [o["text"] for o in nb.cells[0].outputs]
    assert texts == ["bold result 3\n", "kept line\n"]
    assert nbclean.problems(nb) == []


def test_a_table_printed_twice_is_found():
    table = "a  b\n1  2\n3  4\n"
    assert any("same 3-line output" in p for p in nbclean.problems(_nb(table, table)))
    assert nbclean.problems(_nb(table, "a  b\n1  2\n3  5\n")) == []
