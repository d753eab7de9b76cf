"""Which GPU architectures nf4lab supports, and which code paths a kernel compiles.

A few PTX instructions the series uses exist only on newer GPUs: ``cvt.rn.bf16.f32`` and
``cvt.rn.bf16x2.f32`` (bf16 rounding) and ``cvt.rn.f16x2.f32`` (two fp16 at once) need sm_80.
A T4 (sm_75) rejects them. The device ops in :mod:`nf4lab.device.ops` therefore carry two paths
and let NVVM pick one *when the kernel compiles*, from the architecture it compiles for
(``__nvvm_reflect("__CUDA_ARCH")``, the mechanism libdevice uses): the sm_75 path never
reaches an sm_80 GPU's code and the sm_80 path never reaches a T4's. Both give the same bits.

``NF4LAB_ARCH`` (see :mod:`nf4lab.config`) caps the paths at an older architecture on any GPU:
``NF4LAB_ARCH=sm_75`` on an H100 compiles exactly the code a T4 runs, so the old paths are tested
bit for bit on the GPUs we have. It also sets the architecture :func:`nf4lab.compile_ptx` compiles
for by default. It is parsed when first needed (a kernel compiles, a command starts), so that a bad
value is one ValueError there, which ``python -m nf4lab`` prints as one line.

This module knows nothing of the GPU in hand: :mod:`nf4lab.runtime` passes the device's compute
capability in (``check_device``, ``target_cc``), so the two never import each other.
"""
from __future__ import annotations

import functools

from . import config

ENV = "NF4LAB_ARCH"
# The architectures the series is built and checked for (python -m nf4lab ptx --all).
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
MIN_CC = (7, 5)
# The architecture PTX is compiled for when there is no GPU and no NF4LAB_ARCH: the H100.
DEFAULT_CC = (9, 0)
# Where a code path changes: below this, bf16 and packed fp16 rounding are done by hand.
CVT_BF16_CC = (8, 0)


def parse(value: str) -> tuple[int, int]:
    """'sm_75' -> (7, 5). ValueError, naming NF4LAB_ARCH and the allowed values, otherwise."""
    v = value.strip().lower()
    if v not in ARCHS:
        raise ValueError(f"{ENV}={value!r} is not a supported architecture; use one of "
                         f"{', '.join(ARCHS)} (or leave {ENV} unset to compile for the GPU in hand)")
    return int(v[3]), int(v[4])


def name(cc) -> str:
    return f"sm_{cc[0]}{cc[1]}"


@functools.lru_cache(maxsize=None)
def _parse_setting(value: str) -> tuple[int, int] | None:
    return parse(value) if value else None


def forced() -> tuple[int, int] | None:
    """The cap NF4LAB_ARCH sets, or None; a ValueError (naming it and the allowed values) for a bad value."""
    return _parse_setting(config.arch())


def check_device(gpu: str, cc) -> None:
    """Fail clearly on a GPU nf4lab cannot run on, or one older than NF4LAB_ARCH asks for."""
    cc = tuple(cc)
    if cc < MIN_CC:
        raise RuntimeError(
            f"nf4lab needs a GPU of compute capability {MIN_CC[0]}.{MIN_CC[1]} ({name(MIN_CC)}, e.g. a T4) "
            f"or newer; this one is {gpu} ({name(cc)}). Set NF4LAB_MODE=sim to run the series in "
            "numba's CUDA simulator instead.")
    cap = forced()
    if cap is not None and cap > cc:
        raise ValueError(f"{ENV}={name(cap)} asks for code paths newer than this GPU, {gpu} ({name(cc)}); "
                         f"use {ENV}={name(cc)} or older, or leave it unset")


def level() -> int:
    """The cap on code paths as NVVM's __CUDA_ARCH number (750 for sm_75), or 0 for none."""
    cap = forced()
    return cap[0] * 100 + cap[1] * 10 if cap is not None else 0


def target_cc(device_cc=None) -> tuple[int, int]:
    """The architecture PTX is compiled for by default: NF4LAB_ARCH, else ``device_cc`` (the GPU in hand,
    which :func:`nf4lab.runtime.target_cc` passes), else sm_90."""
    cap = forced()
    if cap is not None:
        return cap
    return tuple(device_cc) if device_cc else DEFAULT_CC


def has_cvt_bf16(cc) -> bool:
    """Whether code compiled for ``cc`` (under NF4LAB_ARCH) uses the sm_80 conversions."""
    cc, cap = tuple(cc), forced()
    if cap is not None:
        cc = min(cc, cap)
    return cc >= CVT_BF16_CC
