"""Decide once, at import, whether kernels run on a GPU or in numba's CUDA simulator.

The decision has to happen before ``numba.cuda`` is imported: numba reads
``NUMBA_ENABLE_CUDASIM`` when the package is first imported and never again.
We probe the driver through ctypes (cuInit + cuDeviceGetCount) so that the probe
itself imports nothing from numba.

``NF4LAB_MODE`` (see :mod:`nf4lab.config`) overrides the probe:
  gpu      -- use the GPU (fail loudly later if there is none)
  sim      -- force the simulator, even on a GPU machine
  compile  -- real numba.cuda without a GPU: compile_ptx works, launches do not.
              Used by the PTX subprocess of simulator-mode sessions.

Importing decides silently (a library that prints when imported is noise in every tool and
test that imports it): :func:`describe` says where kernels run and why, and
``python -m nf4lab info`` and the first cell of every notebook print it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import warnings

from . import arch, config

MODES = ("gpu", "sim", "compile")


def _libcuda():
    """The CUDA driver library, or None."""
    for name in filter(None, ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")]):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _probe_driver() -> tuple[bool, str]:
    """Return (usable, reason). Never raises."""
    lib = _libcuda()
    if lib is None:
        return False, "no CUDA driver (libcuda) found"
    try:
        rc = lib.cuInit(0)
        if rc != 0:
            return False, f"cuInit failed with CUDA error {rc}"
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
        if rc != 0 or count.value == 0:
            return False, "the CUDA driver sees no device"
    except Exception as exc:  # pragma: no cover - exotic driver failures
        return False, f"CUDA driver probe failed: {exc}"
    return True, f"{count.value} CUDA device(s)"


def _probe_device() -> tuple[str, tuple[int, int]] | None:
    """Name and compute capability of device 0 through the driver API (after _probe_driver's cuInit),
    or None. Never raises."""
    try:
        lib = _libcuda()
        dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), 0) or lib.cuDeviceGetName(buf, 256, dev):
            return None
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
        if lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev):
            return None
        return buf.value.decode(errors="replace"), (major.value, minor.value)
    except Exception:
        return None


def _numpy_shim() -> None:
    """numba-cuda 0.30 registers ``np.row_stack``, which numpy 2.5 removed (it was an alias of
    ``np.vstack``): give it back before numba.cuda is imported, as a function of its own, so that
    numba's registration does not land a second time on ``np.vstack``."""
    import numpy as np

    if not hasattr(np, "row_stack"):
        def row_stack(tup, **kwargs):
            return np.vstack(tup, **kwargs)

        np.row_stack = row_stack


def _decide(forced: str) -> tuple[str, str]:
    if forced == "gpu":
        ok, reason = _probe_driver()
        if not ok:   # decided as the simulator; MODE_PROBLEM says it where it matters
            return "sim", f"NF4LAB_MODE=gpu, but {reason}"
    if forced in MODES:
        return forced, "forced by NF4LAB_MODE"
    if "numba.cuda" in sys.modules:
        # Too late to choose: follow whatever numba already is.
        from numba import config as numba_config

        if numba_config.ENABLE_CUDASIM:
            return "sim", "numba.cuda was imported with the simulator already on"
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "sim", "NUMBA_ENABLE_CUDASIM is set"
    ok, reason = _probe_driver()
    return ("gpu" if ok else "sim"), reason


_numpy_shim()
_FORCED = config.mode()
MODE, REASON = _decide(_FORCED)
# A bad NF4LAB_MODE is decided as if unset, and raised where it matters (check_arch: the command line, a
# compile, describe()), as one line: an exception here would be a traceback at `import nf4lab`.
MODE_PROBLEM = (f"NF4LAB_MODE must be one of {MODES}, got {_FORCED!r}" if _FORCED not in MODES + ("",) else
                f"{REASON}: no GPU to run kernels on here (unset NF4LAB_MODE to use the simulator)"
                if _FORCED == "gpu" and MODE != "gpu" else None)
SIMULATOR = MODE == "sim"
ON_GPU = MODE == "gpu"
# (name, compute capability) of device 0 where kernels run on a GPU, else None.
DEVICE = _probe_device() if ON_GPU else None
if DEVICE is not None and tuple(DEVICE[1]) < arch.MIN_CC:
    arch.check_device(*DEVICE)   # a GPU older than sm_75: nothing of the series can run, say so now

if SIMULATOR:
    if "numba.cuda" in sys.modules and not sys.modules["numba"].config.ENABLE_CUDASIM:
        warnings.warn(
            "nf4lab: no GPU, but numba.cuda was imported before nf4lab, so the simulator "
            "could not be switched on. Restart the kernel and import nf4lab first.",
            stacklevel=2,
        )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if "numba" in sys.modules:  # numba read the variable already; tell its config too
        sys.modules["numba"].config.ENABLE_CUDASIM = 1
elif MODE == "compile":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    if "numba" in sys.modules:
        sys.modules["numba"].config.ENABLE_CUDASIM = 0

# The shape notebooks use by default: big enough to saturate an H100, or small
# enough for the simulator (about 0.3 s per 4096 threads) while still spanning two
# absmax2 groups (2 x 16384 weights) and ending in a partial block.
GPU_SHAPE = (16384, 16384)
SIM_SHAPE = (130, 129)


def default_shape() -> tuple[int, int]:
    return GPU_SHAPE if ON_GPU else SIM_SHAPE


def check_arch() -> None:
    """NF4LAB_ARCH against the GPU in hand: a ValueError naming it for a bad value or one newer than the GPU;
    likewise for a bad NF4LAB_MODE."""
    if MODE_PROBLEM:
        raise ValueError(MODE_PROBLEM)
    if DEVICE is not None:
        arch.check_device(*DEVICE)
    else:
        arch.forced()


def target_cc() -> tuple[int, int]:
    """The architecture PTX is compiled for by default: NF4LAB_ARCH, else the GPU in hand, else sm_90."""
    check_arch()
    return arch.target_cc(DEVICE[1] if DEVICE is not None else None)


def _patch_simulator_jit() -> None:
    """Let notebook code written for the GPU also decorate in the simulator.

    The simulator's ``cuda.jit`` rejects options such as ``lineinfo`` or
    ``forceinline``; we drop them there and remember every option on the fake
    kernel so that ``nf4lab.measure.ptx`` can compile the same function for real.
    """
    from numba import cuda

    if getattr(cuda.jit, "_nf4lab_patched", False):
        return
    sim_jit = cuda.jit
    accepted = {"device", "debug", "argtypes", "inline", "restype", "fastmath", "opt", "cache"}

    def jit(func_or_sig=None, **kwargs):
        sim_kwargs = {k: v for k, v in kwargs.items() if k in accepted}

        def tag(obj):
            obj._nf4lab_jit_kwargs = dict(kwargs)
            return obj

        if callable(func_or_sig) and not isinstance(func_or_sig, (str, list, tuple)):
            return tag(sim_jit(func_or_sig, **sim_kwargs))
        inner = sim_jit(func_or_sig, **sim_kwargs)
        return lambda fn: tag(inner(fn))

    jit._nf4lab_patched = True
    cuda.jit = jit


if SIMULATOR:
    _patch_simulator_jit()


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    import platform

    return {
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
        "numba_cuda": _version("numba-cuda"),
        "bitsandbytes": _version("bitsandbytes"),
        "torch": _version("torch"),
    }


# Datasheet peak memory bandwidth in GB/s, matched on the start of the device name.
# A ceiling to draw, never a measurement. Sources: NVIDIA's product datasheets.
#   H200 SXM: "GPU Memory Bandwidth 4.8TB/s" (NVIDIA H200 Tensor Core GPU datasheet,
#     https://www.nvidia.com/en-us/data-center/h200/).
#   H100 SXM (the "H100 80GB HBM3"): 3.35 TB/s, H100 NVL 3.9 TB/s, H100 PCIe 2 TB/s (NVIDIA H100 Tensor
#     Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/); the rows give these rounded
#     figures to the GB/s of their memory clocks (SXM: 2619 MHz x 2 x 5120 bits / 8 = 3352).
#   A100: 2,039 GB/s (80GB SXM), 1,935 GB/s (80GB PCIe), 1,555 GB/s (40GB) (NVIDIA A100 datasheet);
#   L4 300 GB/s, A10G 600 GB/s, T4 320 GB/s, RTX 4090 1,008 GB/s, RTX 3090 936 GB/s: each product's
#   datasheet or specification page.
SPEC_PEAK_GBPS = {
    "NVIDIA H100 80GB HBM3": 3352,
    "NVIDIA H100 PCIe": 2039,
    "NVIDIA H100 NVL": 3938,
    "NVIDIA H200": 4800,
    "NVIDIA A100-SXM4-80GB": 2039,
    "NVIDIA A100-SXM4-40GB": 1555,
    "NVIDIA A100 80GB PCIe": 1935,
    "NVIDIA A100-PCIE-40GB": 1555,
    "NVIDIA L4": 300,
    "NVIDIA A10G": 600,
    "NVIDIA GeForce RTX 4090": 1008,
    "NVIDIA GeForce RTX 3090": 936,
    "Tesla T4": 320,
}


# Where each datasheet figure is printed, for the notebooks to cite beside the number (pages read 2026-11-22).
SPEC_PEAK_SOURCES = {
    "NVIDIA H100": "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/",
    "NVIDIA H200": "NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/",
    "NVIDIA A100": "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/",
}


# float32 FMA results per clock per SM (CUDA C++ Programming Guide, "Arithmetic Instructions", throughput of
# 32-bit floating-point add, multiply, multiply-add): 64 on compute capability 7.5 and 8.0, 128 on 8.6, 8.9, 9.0.
FP32_LANES_PER_SM = {"NVIDIA H100": 128, "NVIDIA H200": 128, "NVIDIA A100": 64, "NVIDIA L4": 128, "NVIDIA A10G": 128,
                     "NVIDIA GeForce RTX 4090": 128, "NVIDIA GeForce RTX 3090": 128, "Tesla T4": 64}
FP32_LANES_SOURCE = "CUDA C++ Programming Guide, arithmetic instruction throughput by compute capability"


def fp32_flops(meta: dict) -> float | None:
    """A record's GPU's float32 rate (an FMA counted as 2 operations): SMs x lanes per SM x 2 x the SM clock the
    record names; None where the GPU or its clock is unknown."""
    lanes = _by_prefix(FP32_LANES_PER_SM, str(meta.get("gpu", "")))
    mhz = (meta.get("clocks") or {}).get("sm_mhz")
    return None if not (lanes and mhz and meta.get("sms")) else float(meta["sms"] * lanes * 2 * mhz * 1e6)


def _by_prefix(table: dict, name: str, default=None):
    """The value of the first key of ``table`` that a device name starts with (the tables above), else ``default``."""
    return next((v for k, v in table.items() if name.startswith(k)), default)


def spec_peak_source(name: str) -> str:
    """The datasheet a SPEC_PEAK_GBPS row comes from, for a device name."""
    return _by_prefix(SPEC_PEAK_SOURCES, name, "the product's datasheet or specification page")


def spec_peak_gbps(name: str) -> float | None:
    gbps = _by_prefix(SPEC_PEAK_GBPS, name)
    return None if gbps is None else float(gbps)


# CUdevice_attribute names (without the CU_DEVICE_ATTRIBUTE_ prefix) read by device_info.
DEVICE_ATTRIBUTES = ("MULTIPROCESSOR_COUNT", "L2_CACHE_SIZE", "CLOCK_RATE", "MEMORY_CLOCK_RATE",
                     "GLOBAL_MEMORY_BUS_WIDTH", "MAX_THREADS_PER_MULTIPROCESSOR",
                     "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR")


@functools.lru_cache(maxsize=None)
def device_info() -> dict:
    """Facts about where kernels run, for notebooks and results files."""
    info = {"mode": MODE, "reason": REASON, **versions()}
    if not ON_GPU:
        info.update(gpu="simulator" if SIMULATOR else "none", sms=None, l2_bytes=None)
        return info
    from numba import cuda

    dev = cuda.get_current_device()
    ctx = cuda.current_context()
    free, total = ctx.get_memory_info()
    attrs = {}
    for name in DEVICE_ATTRIBUTES:
        try:
            attrs[name] = getattr(dev, name)
        except Exception:
            attrs[name] = None
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    try:
        from numba.cuda.cudadrv.driver import driver

        drv = driver.get_version()
        driver_version = f"{drv[0]}.{drv[1]}"
    except Exception:
        driver_version = None
    info.update(
        gpu=name,
        cc=list(dev.compute_capability),
        sms=attrs["MULTIPROCESSOR_COUNT"],
        l2_bytes=attrs["L2_CACHE_SIZE"],
        memory_bytes=int(total),
        sm_clock_mhz=attrs["CLOCK_RATE"] // 1000 if attrs["CLOCK_RATE"] else None,
        mem_clock_mhz=attrs["MEMORY_CLOCK_RATE"] // 1000 if attrs["MEMORY_CLOCK_RATE"] else None,
        bus_width_bits=attrs["GLOBAL_MEMORY_BUS_WIDTH"],
        max_threads_per_sm=attrs["MAX_THREADS_PER_MULTIPROCESSOR"],
        smem_per_sm=attrs["MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"],
        cuda_driver=driver_version,
        driver=_nvidia_smi_driver(),
        spec_peak_gbps=spec_peak_gbps(name),
    )
    return info


def _nvidia_smi_driver() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except Exception:
        return None


def describe() -> str:
    check_arch()
    i = device_info()
    if SIMULATOR:
        return (f"no usable CUDA GPU ({i['reason']}): kernels run in numba's CUDA simulator (pure Python: slow, "
                f"so cases are small); PTX is still compiled by NVVM. numba {i['numba']}, numba-cuda {i['numba_cuda']}")
    if not ON_GPU:
        return f"mode={i['mode']} ({i['reason']}); numba {i['numba']}, numba-cuda {i['numba_cuda']}"
    return (f"{i['gpu']} (cc {i['cc'][0]}.{i['cc'][1]}, {i['sms']} SMs, L2 {i['l2_bytes'] / 2**20:.0f} MiB, "
            f"{i['memory_bytes'] / 2**30:.0f} GiB), driver {i['driver']}; numba {i['numba']}, "
            f"numba-cuda {i['numba_cuda']}, bitsandbytes {i['bitsandbytes']}, torch {i['torch']}")
