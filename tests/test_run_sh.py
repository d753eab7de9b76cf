"""What `./run.sh` promises a new user: each notebook's kernel is shut down when its notebook is done.

A kernel left running outlives its notebook until `python -m nf4lab notebooks` exits; then every one
of them notices that its parent is gone and prints "[IPKernelApp] WARNING | Parent appears to have
exited" into the user's terminal (one line per notebook), after holding its memory the whole run.
"""
from __future__ import annotations

import os
import time

import nbformat
import pytest

from nf4lab.__main__ import execute_notebook


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_execute_notebook_shuts_its_kernel_down(tmp_path):
    src = tmp_path / "pid.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os; print(os.getpid())")]), src)
    out = tmp_path / "out" / "pid.ipynb"
    execute_notebook(src, out, timeout=120)
    pid = int(nbformat.read(out, as_version=4).cells[0].outputs[0]["text"])
    deadline = time.monotonic() + 10       # a graceful shutdown is over within jupyter_client's 5 s wait
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, 9)
        pytest.fail(f"the kernel (pid {pid}) of an executed notebook was still running after execute_notebook returned")
