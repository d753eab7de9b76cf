"""Bad input gets one clear line that names what is wrong, before anything runs."""
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


def test_verify_says_what_it_expected():
    case = nf4lab.make_case((3, 5))
    with pytest.raises(TypeError, match="actual must be the kernel's output array.*got NoneType"):
        nf4lab.verify(None, case)
    with pytest.raises(TypeError, match="case must be a Case"):
        nf4lab.verify(case.expected, None)
