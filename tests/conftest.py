import os

# Tests run where there is no GPU (CI): make that explicit and deterministic.
os.environ.setdefault("NF4LAB_MODE", "sim")

import nf4lab  # noqa: E402,F401  (switches numba to the simulator before anything imports numba.cuda)

import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _text(cells) -> str:
    """What the cells printed and displayed (streams and text/plain results)."""
    out = []
    for c in cells:
        for o in c.get("outputs", []):
            if isinstance(o.get("text"), str):
                out.append(o["text"])
            if "data" in o:
                out.append(str(o["data"].get("text/plain", "")))
    return "\n".join(out)


def run_twins(stem: str, timeout: int = 600, student: bool = True) -> tuple[str, str]:
    """Execute notebook ``stem``'s solution and then, in the same kernel, its student version's code cells from
    the first one that differs to the end, so that every cell the twins share runs once.

    The twins are built from one source and differ only in their solution regions, which every notebook keeps
    to its closing exercises; the student's cells run after the solution's, in a state that the solved
    exercises have touched, which a stub must not rely on anyway. Returns the text of the solution's outputs
    and of the student's own cells' outputs ("" where the twins' code is the same, or with ``student=False``).
    A cell that raises (a failed verification included) fails the caller with nbclient's CellExecutionError."""
    import copy
    import shutil
    from pathlib import Path

    import nbformat

    from nf4lab.__main__ import notebook_client

    nbs = Path(ROOT) / "notebooks"
    sol = nbformat.read(nbs / "solutions" / f"{stem}_SOLUTION.ipynb", as_version=4)
    stu = nbformat.read(nbs / f"{stem}.ipynb", as_version=4)
    code_sol = [c for c in sol.cells if c.cell_type == "code"]
    code_stu = [c for c in stu.cells if c.cell_type == "code"]
    assert len(code_sol) == len(code_stu), f"{stem}: the twins have different code cells"
    first = next((i for i, (a, b) in enumerate(zip(code_sol, code_stu)) if a.source != b.source), len(code_stu))
    tail = [copy.deepcopy(c) for c in code_stu[first:]] if student else []
    for i, c in enumerate(tail):
        c.id = f"student-{i}"
    nb = copy.deepcopy(sol)
    nb.cells = code_sol + tail
    client = notebook_client(nb, nbs, timeout)
    try:
        # nbclient keeps alive a kernel whose manager it was handed: shut it down with the run
        client.execute(cleanup_kc=True)
    finally:
        shutil.rmtree(client.sockets, ignore_errors=True)
    return _text(nb.cells[: len(code_sol)]), _text(nb.cells[len(code_sol):])


@pytest.fixture
def notebook_twins():
    """:func:`run_twins`, for the tests that execute whole notebooks."""
    return run_twins
