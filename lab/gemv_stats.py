"""The shipped GEMV with half the statistics loads at M = 1 (a real variant: same bits; GPU for its times).

lab/gemv_ablate.py found the statistics the largest remaining part at 14336x4096 once x moved to its shared slot
(``-stats`` 15.7 against 17.5 us, H100). At M = 1 the lanes q = 0, 1 load per step the absmax codes of blocks
2q, 2q + 1 of rows g and g + 8 (4 byte loads) and their absmax2 (4 float loads). With blocksize 64 and K a
multiple of 256, a row's two blocks are adjacent bytes at an even index, so one 16-bit load brings both codes,
and an even block and the next share one absmax2 (a group is 256 blocks): 4 loads instead of 8, the same values
in the same registers, so the kernel's arithmetic and its bits do not change. Other shapes or blocksizes run the
shipped kernel.

    python -m lab.bench_gemv --shapes 4096x14336 14336x4096 8192x28672 --dtypes bf16 --ms 1 \\
        --variants TC 'TC stats2' --no-save
"""
from __future__ import annotations

import contextlib
import sys

import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)
import numpy as np  # noqa: E402
from numba import cuda, uint32  # noqa: E402  (module globals: the simulator swaps them in kernels)

from nf4lab.kernels import gemv, ops  # noqa: E402


_PLAIN = gemv.step_ops.__wrapped__  # the shipped step_ops, uncached


def _step_ops_pairs(is_bf16, M, base, nested=True, words=False):
    """gemv.step_ops with a fetch whose statistics loads come in pairs (M = 1, nested, blocksize 64)."""
    look, half_bits, _ = _PLAIN(is_bf16, M, base, nested)
    weights = _PLAIN(is_bf16, 0, base, nested)[2]   # M = 0: the shipped M = 1 weight loads, no statistics loads

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_q2, absmax2, t, c, g, q, n, kw, tiles, steps, ash):
        """As gemv.step_ops' fetch at M = 1; ``absmax_q2``: the absmax codes as uint16 pairs."""
        weights(buf, o, packed_u32, absmax_q2, absmax2, t, c, g, q, n, kw, tiles, steps, ash)
        if q < uint32(2):
            tt, cc = min(t, uint32(tiles - uint32(1))), min(c, uint32(steps - uint32(1)))
            wb = cc * uint32(32) + uint32(16) * q
            for i in range(2):
                r = min(uint32(tt * uint32(16) + g + uint32(8 * i)), uint32(n - uint32(1)))   # rows g, g + 8
                blk = uint32(r * kw + wb) >> ash            # even: K / 64 and 2 q are
                pair = uint32(absmax_q2[blk >> uint32(1)])   # codes of blocks blk (low byte) and blk + 1
                buf[o + 16 + 2 * i] = pair & uint32(0xFF)
                buf[o + 16 + 2 * i + 1] = pair >> uint32(8)
                f = ops.float_bits(absmax2[blk >> uint32(8)])
                buf[o + 20 + 2 * i] = f
                buf[o + 20 + 2 * i + 1] = f

    return look, half_bits, fetch


@contextlib.contextmanager
def _paired():
    saved = gemv.step_ops
    try:
        gemv.step_ops = _step_ops_pairs
        yield
    finally:
        gemv.step_ops = saved


def takes(g) -> bool:
    """Where the paired loads give the shipped kernel's values: M = 1, nested statistics, blocksize 64, K a
    multiple of 256 (every step whole), an even number of absmax codes."""
    return g.M == 1 and g.nested and g.bs_shift == 6 and g.K % 256 == 0 and g.absmax_q.shape[0] % 2 == 0


_KERNELS: dict = {}


def launch(g):
    """Run the variant on GemvBuffers ``g`` (the shipped kernel where :func:`takes` is False)."""
    if not takes(g):
        return gemv.launch(g)
    gemv.validate(g)
    pairs = g.absmax_q.view(np.uint16)
    args = (g.packed_u32, pairs, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    kern = _KERNELS.get(g.dtype)
    if kern is None:
        base = gemv.probe_base() if nf4lab.ON_GPU else 0
        with _paired():
            kern = gemv.make_kernel.__wrapped__(g.dtype == "bf16", 1, base, True, words=False)
            gemv.prepare(kern, args)  # compiles now, while fetch is the paired one
        _KERNELS[g.dtype] = kern
    kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, gemv.SMEM](*args)


def main() -> int:
    """In the simulator (or on a GPU): the variant's output bits against the shipped kernel's on small cases."""
    ok = True
    for N, K, dtype, grid, opts in [(33, 512, "fp16", 1, {"dist": "codes"}), (20, 1024, "bf16", None, {}),
                                    (9, 256, "bf16", None, {"dist": "heavy", "x_dist": "heavy"})]:
        gc = gemv.make_gemv_case(N, K, dtype, seed=5, **opts)
        g = gemv.make_gemv_buffers(gc)
        g.grid = grid
        gemv.launch(g)
        shipped = g.result().copy()
        g.y.copy_to_device(np.full(N, 0x7FBF, np.uint16))
        launch(g)
        same = bool(np.array_equal(g.result(), shipped))
        ok &= same
        print(f"{N}x{K} {dtype} grid {grid} {opts}: takes {takes(g)}, same bits as the shipped kernel: {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
