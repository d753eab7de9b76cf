"""Comparable or refused: a printed comparison of two records gives a ratio only when they can be
compared, and otherwise says what differs."""
from pathlib import Path

from nf4lab.measure import provenance

META = {"run": "r1", "gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "numba_cuda": "0.30.4", "torch": "2.11.0",
        "bitsandbytes": "0.50.2", "code_path": "native", "date": "2026-11-27 14:53 UTC"}
FAST = {"name": "06 kernel", "ms": 0.2, "source_sha256": "aaaa"}
SLOW = {"name": "bitsandbytes", "ms": 0.3, "source_sha256": None}


def test_one_run_gives_a_ratio():
    ratio, text = provenance.compare(META, FAST, META, SLOW)
    assert abs(ratio - 1.5) < 1e-12 and text == "1.50x"


def test_two_runs_are_refused_with_the_date():
    other = dict(META, run="r2", date="2026-11-23 10:00 UTC")
    ratio, text = provenance.compare(META, FAST, other, SLOW)
    assert ratio is None and "2026-11-23 10:00 UTC" in text and "not compared" in text


def test_a_record_without_its_run_is_refused():
    old = {k: v for k, v in META.items() if k != "run"}
    ratio, text = provenance.compare(old, FAST, META, SLOW)
    assert ratio is None and "before records named their run" in text


def test_a_comparison_about_the_code_path_holds_the_kernel_equal():
    sm75 = dict(META, code_path="sm_75")
    same_kernel = dict(FAST, ms=0.25)
    assert provenance.compare(META, FAST, sm75, same_kernel, about="code_path")[1] == "1.25x"
    earlier_kernel = dict(FAST, ms=0.27, source_sha256="bbbb")      # the incomparable pair of notebook 06
    ratio, text = provenance.compare(META, FAST, sm75, earlier_kernel, about="code_path")
    assert ratio is None and "kernel source" in text
    other_gpu = dict(sm75, gpu="NVIDIA H200")
    ratio, text = provenance.compare(META, FAST, other_gpu, same_kernel, about="code_path")
    assert ratio is None and "gpu" in text


def test_source_hash_follows_the_kernel_a_launch_calls():
    class Dispatcher:                       # what numba's cuda.jit returns: py_func is the kernel's source
        def __init__(self, f):
            self.py_func = f

    def k1(x):
        return x + 1

    def k2(x):
        return x + 2

    g = {"kernel": Dispatcher(k1)}
    launch = eval(compile("lambda b: kernel(b)", "<cell>", "eval"), g)
    h1 = provenance.source_hash(launch)
    g["kernel"] = Dispatcher(k2)
    assert provenance.source_hash(launch) != h1


def test_results_meta_names_the_run_and_the_code_path(monkeypatch):
    from nf4lab.measure import results

    m = results.meta("test")
    assert m["run"] == provenance.RUN_ID and m["code_path"] == provenance.code_path()


def test_module_hash_is_the_shipped_source():
    from nf4lab.kernels import dequant, fastkernel

    assert provenance.module_hash(dequant, fastkernel) == provenance.module_hash(dequant, fastkernel)
    assert provenance.module_hash(dequant) != provenance.module_hash(fastkernel)


def test_a_solution_notebooks_run_is_saved_apart_from_the_lessons(monkeypatch, tmp_path):
    """The book runs a notebook's solution, then its lesson: both save the same record name. The lesson's record is
    the one other notebooks quote; the solution's goes to solutions/, so the file its output names stays its own."""
    from nf4lab.__main__ import notebook_kind
    from nf4lab.measure import results

    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "ROOT", tmp_path)
    assert notebook_kind(Path("notebooks/solutions/02_grid_stride_SOLUTION.ipynb")) == results.SOLUTION_KIND
    assert notebook_kind(Path("notebooks/02_grid_stride.ipynb")) != results.SOLUTION_KIND
    monkeypatch.setenv("NF4LAB_NOTEBOOK_KIND", results.SOLUTION_KIND)
    sol = results.save({"meta": {"gpu": "NVIDIA Fake 1", "date": "d0"}, "records": []}, "02_grid_stride")
    monkeypatch.setenv("NF4LAB_NOTEBOOK_KIND", "lesson")
    les = results.save({"meta": {"gpu": "NVIDIA Fake 1", "date": "d1"}, "records": []}, "02_grid_stride")
    assert sol == tmp_path / "NVIDIA_Fake_1" / "solutions" / "02_grid_stride.json" and sol.exists()
    assert les == tmp_path / "NVIDIA_Fake_1" / "02_grid_stride.json"
    assert results.load("02_grid_stride", "NVIDIA Fake 1")["meta"]["date"] == "d1"
    monkeypatch.setenv("NF4LAB_NOTEBOOK_KIND", results.SOLUTION_KIND)   # a solution reads its own chain, else the lessons'
    assert results.load("02_grid_stride", "NVIDIA Fake 1")["meta"]["date"] == "d0"
    results.save({"meta": {"gpu": "NVIDIA Fake 1", "date": "d2"}, "records": []}, "00_ceiling", gpu="NVIDIA Fake 1")
    monkeypatch.delenv("NF4LAB_NOTEBOOK_KIND")
    results.save({"meta": {"gpu": "NVIDIA Fake 1", "date": "d3"}, "records": []}, "01_naive", gpu="NVIDIA Fake 1")
    assert results.load("00_ceiling", "NVIDIA Fake 1") is None
    monkeypatch.setenv("NF4LAB_NOTEBOOK_KIND", results.SOLUTION_KIND)
    assert results.load("01_naive", "NVIDIA Fake 1")["meta"]["date"] == "d3"
    assert results.gpus() == ["NVIDIA_Fake_1"]
