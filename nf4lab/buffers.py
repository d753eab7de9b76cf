"""Device buffers for one case, laid out the way the series' kernels expect.

``Buffers`` is what a notebook's ``launch(b)`` function receives:

- ``b.packed`` (uint8) and ``b.packed_u32`` (the same memory as uint32): the packed
  codes, zero-padded to a whole number of 16-byte vectors and 16-byte aligned, so
  kernels may read whole words or vectors past the last real byte.
- ``b.absmax_q`` (uint8), ``b.absmax2`` (float32), ``b.code2`` (float32[256]),
  ``b.offset`` (float32), ``b.lut`` (float32[16]).
- ``b.out`` (uint16 bits for bf16/fp16, uint32 for fp32) and ``b.out_u32`` (same
  memory as uint32): n elements plus a poisoned guard region; writing past n is a bug
  that verification reports.
- ``b.n`` weights, ``b.nbytes`` = ceil(n/2) packed bytes, ``b.blocksize``, ``b.dtype``,
  ``b.stream`` (launch on it: the timing harness captures launches on its own stream).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import verification as _verify


@dataclasses.dataclass
class Buffers:
    case: object
    packed: object
    packed_u32: object
    absmax_q: object
    absmax2: object
    code2: object
    lut: object
    out: object
    out_u32: object
    offset: np.float32
    n: int
    nbytes: int
    blocksize: int
    dtype: str
    stream: object = 0

    def reset_output(self) -> None:
        """Poison the output again, so that a stale result cannot pass verification."""
        from numba import cuda

        self.out.copy_to_device(_verify.poisoned_output(self.n, self.dtype))

    def result(self) -> np.ndarray:
        from numba import cuda

        cuda.synchronize()
        return self.out.copy_to_host()


def _padded(a: np.ndarray, multiple: int) -> np.ndarray:
    size = max(multiple, -(-a.size // multiple) * multiple)
    out = np.zeros(size, dtype=a.dtype)
    out[: a.size] = a
    return out


def make_buffers(case) -> Buffers:
    """Copy a case to the device (or the simulator's stand-in) with a poisoned output."""
    from numba import cuda

    packed = cuda.to_device(_padded(case.packed, 16))
    out = cuda.to_device(_verify.poisoned_output(case.n, case.dtype))
    return Buffers(
        case=case,
        packed=packed,
        packed_u32=packed.view(np.uint32),
        absmax_q=cuda.to_device(_padded(case.absmax_q, 16)),
        absmax2=cuda.to_device(case.absmax2),
        code2=cuda.to_device(case.code2),
        lut=cuda.to_device(case.lut),
        out=out,
        out_u32=out.view(np.uint32),
        offset=np.float32(case.offset),
        n=case.n,
        nbytes=case.packed.size,
        blocksize=case.blocksize,
        dtype=case.dtype,
    )


def run_and_verify(launch, case, *, name: str = "kernel", buffers: Buffers | None = None):
    """Launch once on fresh poisoned buffers and verify bit for bit (raises on mismatch)."""
    b = buffers if buffers is not None else make_buffers(case)
    b.reset_output()
    launch(b)
    return _verify.verify(b.result(), case, name=name)
