"""The helpers a student has already written in an earlier notebook, in one place.

Notebook 01 writes ``block_scale`` and notebook 02 the grid sizing; later notebooks import
them from here instead of retyping them (a retyped copy can drift from the one that was
explained and tested). A notebook that *changes* a helper defines its own version.

``ASSUMED_DRAM_LATENCY_NS`` is the one latency figure the series uses for Little's law
(bytes in flight = bandwidth x latency). It is an assumption, not a measurement: loaded
DRAM latency on a typical HBM GPU is several hundred nanoseconds; the estimates built on
it are orders of magnitude, not predictions to the percent.
"""
from __future__ import annotations

from numba import cuda, uint64

from .. import runtime
from ..device import ops

BLOCK_SHIFT = 5     # 64 weights per block = 32 packed bytes: block = byte index >> 5
GROUP_SHIFT = 8     # 256 blocks per absmax2 group
ASSUMED_DRAM_LATENCY_NS = 700

# The simulator has no SMs: a small fixed grid, so that a grid-stride loop really loops.
SIM_SMS, SIM_BLOCKS_PER_SM = 2, 2


@cuda.jit(device=True, inline="always")
def block_scale(absmax_q, absmax2, code2, offset, blk):
    """code2[absmax_q[blk]] * absmax2[group] + offset, both operations rounded (never an FMA). (01)"""
    return ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(GROUP_SHIFT)]), offset)


def sm_count():
    """SMs of the GPU in hand (02)."""
    return runtime.device_info()["sms"] or SIM_SMS


def blocks_per_sm(threads):
    """Resident blocks per SM when threads are the limit (registers and shared memory are not, in 02-03)."""
    per_sm = runtime.device_info().get("max_threads_per_sm")
    return per_sm // threads if per_sm else SIM_BLOCKS_PER_SM


def grid_for(nbytes, threads, per_sm):
    """SMs x resident blocks, never more blocks than the data needs (02)."""
    needed = (nbytes + threads - 1) // threads
    return max(1, min(sm_count() * per_sm, needed))


def check_vector_buffers(b):
    """128-bit accesses need 16-byte alignment: a misaligned one kills the CUDA context, so a launch refuses the
    buffer before anything reaches the GPU (04)."""
    from ..kernels.fastkernel import address   # the package's one way to read a buffer's data address

    if b.dtype != "bf16":
        raise ValueError(f"this kernel writes bf16, the case wants {b.dtype} (step 06 adds the others)")
    for name in ("packed_u32", "out_u32"):
        if address(getattr(b, name)) % 16:
            raise ValueError(f"b.{name} is not 16-byte aligned: no vector access allowed")
