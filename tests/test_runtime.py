"""The GPU-or-simulator decision, made once at import, in fresh processes."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("NF4LAB_MODE", "NUMBA_ENABLE_CUDASIM")}
    e.update(env)
    e["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_import_without_gpu_is_silent_and_describe_says_simulator():
    p = run("import nf4lab, nf4lab.harness.cases; import nf4lab; from numba import config, cuda;"
            "print(nf4lab.MODE, config.ENABLE_CUDASIM, type(cuda).__name__)")
    assert p.returncode == 0, p.stderr
    skip_on_gpu(p)
    assert p.stdout.split()[:2] == ["sim", "1"]
    assert p.stderr == "", p.stderr   # importing prints nothing: describe() and `python -m nf4lab info` say it
    d = run("import nf4lab; print(nf4lab.describe())")
    assert "simulator" in d.stdout and "no usable CUDA GPU" in d.stdout, d.stdout


def test_help_prints_no_banner():
    p = subprocess.run([sys.executable, "-m", "nf4lab", "--help"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0 and p.stderr == "" and p.stdout.startswith("usage: python -m nf4lab"), p.stderr


def skip_on_gpu(p):
    """The subprocess chose a GPU (nf4lab's default where one works): the simulator's behaviour is not shown."""
    if p.stdout.startswith("gpu"):
        pytest.skip("a usable GPU is here: nf4lab chose it over the simulator")


def test_simulator_switch_happens_even_if_numba_was_imported_first():
    p = run("import numba; import nf4lab; from numba import cuda; print(nf4lab.MODE, numba.config.ENABLE_CUDASIM)")
    assert p.returncode == 0, p.stderr
    skip_on_gpu(p)
    assert p.stdout.split() == ["sim", "1"]


def test_too_late_import_warns():
    p = run("from numba import cuda; import nf4lab; print(nf4lab.MODE)")
    assert p.returncode == 0, p.stderr
    skip_on_gpu(p)
    assert "import nf4lab first" in p.stderr


def test_bad_mode_is_one_line_where_it_is_used_not_a_traceback_at_import():
    p = run("import nf4lab; print('imported')", NF4LAB_MODE="quantum")
    assert p.returncode == 0 and p.stdout.strip() == "imported" and p.stderr == "", p.stderr
    p = run("import nf4lab\ntry:\n    nf4lab.describe()\nexcept ValueError as e:\n    print(e)", NF4LAB_MODE="quantum")
    assert p.returncode == 0 and "NF4LAB_MODE must be one of" in p.stdout and "quantum" in p.stdout, p.stderr
    e = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    cli = subprocess.run([sys.executable, "-m", "nf4lab", "info"], capture_output=True, text=True, timeout=300,
                         env=dict(e, NF4LAB_MODE="quantum", PYTHONPATH=ROOT))
    lines = cli.stderr.strip().splitlines()
    assert cli.returncode == 2 and len(lines) == 1 and "NF4LAB_MODE" in lines[0], cli.stderr


def test_compile_mode_has_real_numba_cuda():
    p = run("import nf4lab; from numba import cuda; print(nf4lab.MODE, hasattr(cuda, 'compile_ptx'), "
            "type(cuda.jit).__module__)", NF4LAB_MODE="compile")
    assert p.returncode == 0, p.stderr
    mode, has, mod = p.stdout.split()
    assert mode == "compile" and has == "True" and "simulator" not in mod


def test_device_info_and_default_shape():
    import nf4lab

    info = nf4lab.device_info()
    for key in ("mode", "numba", "numba_cuda", "bitsandbytes", "torch", "gpu"):
        assert key in info
    assert nf4lab.default_shape() == ((16384, 16384) if nf4lab.ON_GPU else (130, 129))
    assert nf4lab.runtime.spec_peak_gbps("NVIDIA H100 80GB HBM3") == 3352


def test_simulator_jit_accepts_gpu_only_options():
    import nf4lab
    from numba import cuda

    if not nf4lab.SIMULATOR:
        pytest.skip("the options are the real numba-cuda's own on a GPU")

    @cuda.jit(lineinfo=True, forceinline=False)
    def k(a):
        a[0] = 1

    assert k._nf4lab_jit_kwargs == {"lineinfo": True, "forceinline": False}


def test_device_attributes_exist_in_the_driver_api():
    """A misspelt attribute silently reads as None on a GPU (it did: 02 then sized its grid for the simulator)."""
    from cuda.bindings import driver

    import nf4lab

    for name in nf4lab.runtime.DEVICE_ATTRIBUTES:
        assert hasattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"), name


def test_fp32_rate_from_a_records_gpu_and_clock():
    """00 prints the float32 rate its prediction rests on: SMs x the guide's FMA lanes per SM x 2 x the recorded clock;
    nothing where the GPU's lanes or the clock are not known."""
    from nf4lab import runtime

    meta = {"gpu": "NVIDIA H200", "sms": 132, "clocks": {"sm_mhz": 1980}}
    assert runtime.fp32_flops(meta) == 132 * 128 * 2 * 1980e6
    assert runtime.fp32_flops({**meta, "gpu": "Tesla T4", "sms": 40}) == 40 * 64 * 2 * 1980e6
    assert runtime.fp32_flops({**meta, "gpu": "Some Other GPU"}) is None
    assert runtime.fp32_flops({"gpu": "NVIDIA H200", "sms": 132}) is None
    assert runtime.spec_peak_gbps("Some Other GPU") is None
    assert runtime.spec_peak_source("Some Other GPU") == "the product's datasheet or specification page"
