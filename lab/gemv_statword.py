"""The shipped GEMV with each step's statistics in one load per lane (a real variant: same bits; GPU for its times).

Why: at 14336x4096 the statistics are the largest part left (lab/gemv_ablate.py, ``-stats`` 15.7 against 17.5 us
on the H100), and loading them in pairs ("TC stats2", lab/gemv_stats.py) did not help: it halved the load
instructions but not the cache lines they touch. At M = 1 the lanes q = 0, 1 each load, per step, the absmax codes
of 2 blocks of rows g and g + 8 and their absmax2: 8 loads whose 16 lanes touch 8 rows' lines each, about 64 L1
wavefronts a step against the weights' 16. Here each lane loads one 32-bit word a step: lanes 0-15 the 4 absmax
codes of row (lane) in this step (blocksize 64, K a multiple of 256: a step is 4 whole blocks of a row, at a word
boundary), lanes 16-31 that row's absmax2 (the 4 blocks share one group of 256). One load per lane, 16 rows' lines
plus one or two. A step later, when the word has long arrived, 4 shuffles give lane (g, q) its rows' words, and it
picks its 2 codes out: the registers the shipped kernel's arithmetic reads, with the same values, so the same bits.
The ring also carries 1 statistics word a step instead of 8. Other shapes, blocksizes or batches run the shipped
kernel.

    python lab/gemv_statword.py      # bits against the shipped kernel (simulator or GPU)
    python lab/bench_gemv.py --shapes 4096x14336 14336x4096 8192x28672 --dtypes bf16 --ms 1 \\
        --variants TC 'TC statword' --no-save
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)
import numpy as np  # noqa: E402
from numba import cuda, int32, uint32  # noqa: E402  (module globals: the simulator swaps them in kernels)

from nf4lab import runtime  # noqa: E402
from nf4lab.kernels import gemv, ops  # noqa: E402
from nf4lab.kernels.warp_ops import _py_warp_exchange  # noqa: E402

_PLAIN = gemv.step_ops.__wrapped__  # the shipped step_ops, uncached
FB = gemv.FB

if runtime.SIMULATOR:
    def shfl(value, src):
        return _py_warp_exchange(value, lambda lane: int(src), "shfl_sync")
else:
    @cuda.jit(device=True, inline="always")
    def shfl(value, src):
        return uint32(cuda.shfl_sync(0xFFFFFFFF, int32(value), src))   # (numba shuffles signed ints)


def _step_ops_words(is_bf16, M, base, nested=True):
    """gemv.step_ops with a fetch whose statistics come as one word per lane (M = 1, nested, blocksize 64)."""
    look, half_bits, _ = _PLAIN(is_bf16, M, base, nested)
    weights = _PLAIN(is_bf16, 0, base, nested)[2]   # M = 0: the shipped M = 1 weight loads, no statistics loads

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_w, absmax2, t, c, g, q, n, kw, tiles, steps, ash):
        """As gemv.step_ops' fetch at M = 1 (all 32 lanes call it); ``absmax_w``: the absmax codes as uint32 words.
        First the step in slot 0 (its word loaded a step ago) becomes buf[16:24] as the shipped fetch writes them,
        then this step's loads go out into buf[o:], its statistics word into buf[o + 16]."""
        raw = buf[16]
        w0, w1 = shfl(raw, g), shfl(raw, g + uint32(8))                     # rows g, g + 8: their 4 codes
        f0, f1 = shfl(raw, g + uint32(16)), shfl(raw, g + uint32(24))       # and their absmax2 bits
        sh = uint32(16) * (q & uint32(1))                                   # lane q: blocks 2 (q & 1), + 1
        buf[16] = (w0 >> sh) & uint32(0xFF)
        buf[17] = (w0 >> (sh + uint32(8))) & uint32(0xFF)
        buf[18] = (w1 >> sh) & uint32(0xFF)
        buf[19] = (w1 >> (sh + uint32(8))) & uint32(0xFF)
        buf[20], buf[21], buf[22], buf[23] = f0, f0, f1, f1
        weights(buf, o, packed_u32, absmax_w, absmax2, t, c, g, q, n, kw, tiles, steps, ash)
        tt, cc = min(t, uint32(tiles - uint32(1))), min(c, uint32(steps - uint32(1)))
        lane = g * uint32(4) + q
        r = min(uint32(tt * uint32(16) + (lane & uint32(15))), uint32(n - uint32(1)))
        blk = r * (kw >> uint32(3)) + cc * uint32(4)                        # the step's first block of row r
        if lane < uint32(16):
            buf[o + 16] = uint32(absmax_w[blk >> uint32(2)])
        else:
            buf[o + 16] = ops.float_bits(absmax2[blk >> uint32(8)])

    return look, half_bits, fetch


@contextlib.contextmanager
def _words():
    saved = gemv.step_ops
    try:
        gemv.step_ops = _step_ops_words
        yield
    finally:
        gemv.step_ops = saved


def takes(g) -> bool:
    """Where one word per lane gives the shipped kernel's values: M = 1, nested statistics, blocksize 64, K a
    multiple of 256 (every step 4 whole blocks at a word boundary), whole words of absmax codes."""
    return g.M == 1 and g.nested and g.bs_shift == 6 and g.K % 256 == 0 and g.absmax_q.shape[0] % 4 == 0


_KERNELS: dict = {}


def launch(g):
    """Run the variant on GemvBuffers ``g`` (the shipped kernel where :func:`takes` is False)."""
    if not takes(g):
        return gemv.launch(g)
    gemv.validate(g)
    words = g.absmax_q.view(np.uint32)
    args = (g.packed_u32, words, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    kern = _KERNELS.get(g.dtype)
    if kern is None:
        base = gemv.probe_base() if nf4lab.ON_GPU else 0
        with _words():
            kern = gemv.make_kernel.__wrapped__(g.dtype == "bf16", 1, base, True)
            gemv.prepare(kern, args)  # compiles now, while fetch is this one
        _KERNELS[g.dtype] = kern
    kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, gemv.SMEM](*args)


def main() -> int:
    """In the simulator (or on a GPU): the variant's output bits against the shipped kernel's on small cases."""
    ok = True
    for N, K, dtype, grid, opts in [(33, 512, "fp16", 1, {"dist": "codes"}), (20, 1024, "bf16", None, {}),
                                    (9, 256, "bf16", None, {"dist": "heavy", "x_dist": "heavy"}),
                                    (40, 16384 + 256, "bf16", 2, {})]:   # groups of 256 blocks end inside rows
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
