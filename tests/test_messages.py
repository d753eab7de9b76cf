"""Bad input gets one clear line that names what is wrong, before anything runs."""
import json
import subprocess
import sys

import pytest

import nf4lab
from nf4lab.measure import results


def _cli(*args, env=None):
    import os

    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "nf4lab", *args], capture_output=True, text=True, env=e, timeout=300)


def test_results_gpu_without_results_names_the_recorded_gpus():
    p = _cli("plot", env={"NF4LAB_RESULTS_GPU": "bogus"})
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "NF4LAB_RESULTS_GPU='bogus'" in lines[0]
    for gpu in results.gpus():
        assert gpu in lines[0]


def test_bad_arch_is_one_line():
    p = _cli("info", env={"NF4LAB_ARCH": "sm_99"})
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "NF4LAB_ARCH" in p.stderr


def test_help_prints_no_gpu_banner():
    p = _cli("--help")
    assert p.returncode == 0 and "simulator" not in p.stdout + p.stderr and "GPU(s)" not in p.stderr


@pytest.mark.parametrize("args", [("notebooks", "--only", "42", "--no-plot"), ("ptx", "--all", "--only", "99")])
def test_only_matching_nothing_names_what_there_is(args):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    bad = args[args.index("--only") + 1]
    assert len(lines) == 1 and "--only" in lines[0] and bad in lines[0] and "00" in lines[0] and "09" in lines[0], lines


def test_gpu_mode_without_a_gpu_is_one_line():
    p = _cli("info", env={"NF4LAB_MODE": "gpu", "CUDA_VISIBLE_DEVICES": ""})
    if p.returncode == 0:
        pytest.skip("a GPU is here")
    assert len(p.stderr.strip().splitlines()) == 1 and "NF4LAB_MODE" in p.stderr, p.stderr


def test_verify_says_what_it_expected():
    case = nf4lab.make_case((3, 5))
    with pytest.raises(TypeError, match="actual must be the kernel's output array.*got NoneType"):
        nf4lab.verify(None, case)
    with pytest.raises(TypeError, match="case must be a Case"):
        nf4lab.verify(case.expected, None)


def test_without_a_gpu_notebooks_read_the_gpu_the_book_last_ran_on(tmp_path, monkeypatch):
    """A student without a GPU must see the records the committed outputs show: the GPU whose notebooks ran
    last, not the folder that happens to hold more files (an older GPU can hold more, of earlier kernels)."""
    from nf4lab.measure import results

    def folder(name, files, date):
        d = tmp_path / name
        d.mkdir()
        for i in range(files):
            (d / f"r{i}.json").write_text("{}")
        if date:
            (d / "notebook_times.json").write_text(json.dumps({"meta": {"date": date}, "records": []}))

    folder("OLD_GPU", 9, "2026-11-28 08:53 UTC")
    folder("NEW_GPU", 2, "2026-11-30 05:33 UTC")
    folder("NO_BOOK", 20, None)
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "current_gpu", lambda: None)
    monkeypatch.delenv("NF4LAB_RESULTS_GPU", raising=False)
    assert results.default_gpu() == "NEW_GPU"
    (tmp_path / "NEW_GPU" / "notebook_times.json").unlink()
    (tmp_path / "OLD_GPU" / "notebook_times.json").unlink()
    assert results.default_gpu() == "NO_BOOK"   # no book run anywhere: the folder with the most files
