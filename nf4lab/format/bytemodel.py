"""The one place that says how many bytes NF4 dequantization moves.

Every GB/s figure in the project divides these bytes by a time. The count is the
fewest bytes any kernel must move: each input read once, each output written once.

    packed codes   ceil(n / 2)          (4 bits per weight)
    absmax_q       nblocks              (uint8 per block of 64, nested statistics)
    absmax2        4 * ngroups          (float32 per 256 blocks)
    code2          256 * 4              (float32 table of the nested quantization)
    output         n * itemsize         (2 for bf16/fp16, 4 for fp32)

Without nested statistics (compress_statistics=False), absmax is float32 per block.
"""
from __future__ import annotations

from .reference import ITEMSIZE, NESTED_BLOCKSIZE


def bytes_moved(n: int, dtype: str = "bf16", blocksize: int = 64, nested: bool = True) -> int:
    nblocks = -(-n // blocksize)
    packed = -(-n // 2)
    out = n * ITEMSIZE[dtype]
    if nested:
        ngroups = -(-nblocks // NESTED_BLOCKSIZE)
        stats = nblocks + 4 * ngroups + 256 * 4
    else:
        stats = 4 * nblocks
    return packed + stats + out


def breakdown(n: int, dtype: str = "bf16", blocksize: int = 64) -> dict:
    nblocks = -(-n // blocksize)
    ngroups = -(-nblocks // NESTED_BLOCKSIZE)
    return {"packed": -(-n // 2), "absmax_q": nblocks, "absmax2": 4 * ngroups, "code2": 1024,
            "output": n * ITEMSIZE[dtype]}


def gbps(nbytes: int, ms: float) -> float:
    """Bytes over milliseconds, in GB/s (10^9 bytes per second)."""
    return nbytes / (ms * 1e-3) / 1e9
