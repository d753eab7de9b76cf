"""sm_75 code paths: chosen when NVVM compiles, forced by NF4LAB_ARCH, refused on older GPUs."""
import os
import subprocess
import sys

import pytest

import nf4lab
from nf4lab import arch
from nf4lab.device import ops
from nf4lab.measure import ptx
from numba import cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@cuda.jit
def convert(out, x):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = ops.pack_bf16x2(x[i], x[i]) ^ ops.pack_f16x2(x[i], x[i]) ^ ops.to_bf16_bits(x[i])


SIG = "(uint32[::1], float32[::1])"
SM80 = [r"^cvt\.rn\.bf16\.f32", r"^cvt\.rn\.bf16x2\.f32", r"^cvt\.rn\.f16x2\.f32"]


def test_each_target_gets_its_own_path():
    old = nf4lab.compile_ptx(convert, SIG, cc=(7, 5))
    new = nf4lab.compile_ptx(convert, SIG, cc=(8, 0))
    assert ptx.target(old) == (7, 5) and ptx.target(new) == (8, 0)
    for p in SM80:
        assert not ptx.grep(old, p), p
        assert ptx.grep(new, p), p
    assert ptx.grep(old, r"^setp\.nan\.f32") and ptx.grep(old, r"^cvt\.rn\.f16\.f32")


def test_ptx_check_names_the_sm75_stand_ins(capsys):
    old = nf4lab.compile_ptx(convert, SIG, cc=(7, 5))
    ptx.check(old, present=[r"^cvt\.rn\.bf16x2\.f32", r"^cvt\.rn\.f16x2\.f32"])
    assert "exists from sm_80" in capsys.readouterr().out
    with pytest.raises(AssertionError):
        ptx.check(old, present=[r"^st\.global\.v4"])   # a pattern without a stand-in still fails


def run(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("NF4LAB_ARCH",)}
    e.update(env, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_forced_sm75_compiles_the_old_path_for_any_target():
    """NF4LAB_ARCH=sm_75 read at import (a fresh process) gives the sm_75 paths in PTX for sm_90. The process
    defines ``convert`` from this file's source, so that nothing imports a test module."""
    import inspect

    kernel = getattr(convert, "py_func", None) or convert.fn          # a GPU's dispatcher or the simulator's kernel
    code = "\n".join([
        "import nf4lab", "from numba import cuda", f"import {ops.__name__} as ops", f"import {ptx.__name__} as ptx",
        inspect.getsource(kernel),
        f"p = nf4lab.compile_ptx(convert, {SIG!r}, cc=(9, 0))",
        "print('RESULT', *ptx.target(p), len(ptx.grep(p, r'^cvt\\.rn\\.bf16')), len(ptx.grep(p, r'^setp\\.nan')))"])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=dict(os.environ, NF4LAB_ARCH="sm_75", PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr
    target_major, target_minor, bf16_cvts, nan_tests = map(int, p.stdout.split("RESULT")[1].split())
    assert (target_major, target_minor) == (9, 0) and bf16_cvts == 0 and nan_tests >= 1, p.stdout


@pytest.mark.parametrize("value", ["sm_70", "sm75", "hopper", "sm_100"])
def test_unknown_arch_is_a_value_error_naming_the_variable_and_values(value, monkeypatch):
    monkeypatch.setenv("NF4LAB_ARCH", value)
    with pytest.raises(ValueError, match="NF4LAB_ARCH.*sm_75, sm_80, sm_86, sm_89, sm_90"):
        arch.forced()
    with pytest.raises(ValueError, match="NF4LAB_ARCH"):
        nf4lab.compile_ptx(convert, SIG)   # before anything compiles


def test_the_command_line_says_a_bad_arch_in_one_line():
    p = subprocess.run([sys.executable, "-m", "nf4lab", "info"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=dict(os.environ, NF4LAB_ARCH="sm_99", PYTHONPATH=ROOT))
    assert p.returncode == 2 and p.stdout == "", p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "NF4LAB_ARCH='sm_99'" in lines[0] and "sm_75, sm_80, sm_86, sm_89, sm_90" in lines[0], p.stderr


def test_a_gpu_older_than_sm75_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r"Tesla V100.*sm_70|sm_70.*Tesla V100"):
        arch.check_device("Tesla V100-SXM2-16GB", (7, 0))
    arch.check_device("Tesla T4", (7, 5))   # the minimum passes


def test_forcing_paths_newer_than_the_gpu_is_refused(monkeypatch):
    monkeypatch.setenv("NF4LAB_ARCH", "sm_90")
    with pytest.raises(ValueError, match="NF4LAB_ARCH=sm_90.*Tesla T4"):
        arch.check_device("Tesla T4", (7, 5))
    monkeypatch.setenv("NF4LAB_ARCH", "sm_75")
    assert not arch.has_cvt_bf16((9, 0)) and arch.level() == 750
