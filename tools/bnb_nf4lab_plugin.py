"""pytest plugin: run bitsandbytes' own tests with nf4lab installed (``-p bnb_nf4lab_plugin``).

Loaded by tools/gpu_bnb_tests.sh before bitsandbytes' tests are collected. It calls
``nf4lab.install()`` (and fails the session if that did not install on a GPU, so that a green run
means nf4lab was in), then, at the end, writes data/results/<gpu>/<NF4LAB_BNB_TAG>.json (and a copy
under $OUT): pass/fail/skip counts, the failed test ids, and how many calls of each bitsandbytes op
nf4lab's kernels took and how many they handed back to bitsandbytes. ``NF4LAB_INSTALL=0`` runs the
same selection without install(), as the baseline.
"""
from __future__ import annotations

import os

import nf4lab  # first: decides GPU or simulator

_outcomes: dict = {}


def pytest_configure(config):
    if os.environ.get("NF4LAB_INSTALL", "1") == "1":
        import torch

        ok = nf4lab.install()
        if torch.cuda.is_available() and not ok:
            raise RuntimeError("nf4lab.install() did not install on this GPU machine")


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _outcomes[report.nodeid] = "xfailed" if hasattr(report, "wasxfail") else report.outcome


def pytest_terminal_summary(terminalreporter):
    from nf4lab.integrations import bnb_backend
    from nf4lab.measure import results

    counts: dict = {}
    for o in _outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    calls = [{"op": op, "served_by": who, "calls": n} for (op, who), n in sorted(bnb_backend.calls.items())]
    tag = os.environ.get("NF4LAB_BNB_TAG", "bnb_tests")
    m = results.meta("bitsandbytes' own tests (tag 0.50.1 = the library files of 0.50.2), run with pytest "
                     + ("after nf4lab.install()" if os.environ.get("NF4LAB_INSTALL", "1") == "1" else
                        "WITHOUT nf4lab.install() (baseline)"))
    m["selection"] = os.environ.get("NF4LAB_BNB_SELECTION", "")
    m["installed"] = nf4lab.installed()
    data = {"meta": m, "counts": counts, "failed": sorted(k for k, v in _outcomes.items() if v == "failed"),
            "op_calls": calls, "records": []}
    import torch

    if torch.cuda.is_available():  # a results file is a GPU measurement; elsewhere only the summary line
        path = results.save(data, tag)
        terminalreporter.write_line(f"nf4lab: wrote {path}")
        out = os.environ.get("OUT")
        if out:
            import shutil

            shutil.copy(path, os.path.join(out, path.name))
    terminalreporter.write_line(f"nf4lab: outcomes {counts}; op calls {calls}")
