"""Device code of the fused GEMV's step loads (nf4lab.kernels.gemv): a lane's 16-byte pieces of codes and its
statistics for one step of 256 columns, from global memory into registers."""
import functools

from .. import runtime  # noqa: F401  (first: it may switch numba to the simulator)
from . import ops
from .warp_ops import load_stream_u32x4, load_u32_of_bytes, table_lookup
from numba import cuda, uint32, uint64  # noqa: E402  (module globals: the simulator swaps them in kernels)


def _put_op():
    """``put(buf, i, packed_u32, w)``: 16 bytes of codes at word w into buf[i:i+4]. Made anew by each factory, so that
    it reads this module's ``load_stream_u32x4`` when the factory runs (lab/gemv_ablate.py swaps it)."""
    @cuda.jit(device=True, inline="always")
    def put(buf, i, packed_u32, w):
        buf[i], buf[i + 1], buf[i + 2], buf[i + 3] = load_stream_u32x4(packed_u32, uint64(w))

    return put


@functools.cache
def step_ops(is_bf16, M, base, nested=True, words=False):
    """(look, half_bits, fetch): the table lookup, the output conversion, a step's loads."""
    WIDE = M > 1                      # where a lane's two 16-byte pieces lie (see fetch)
    look, put = table_lookup(base), _put_op()

    @cuda.jit(device=True, inline="always")
    def half_bits(v):
        return uint32(ops.to_bf16_bits(v)) if is_bf16 else uint32(ops.to_f16_bits(v))

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_q, absmax2, t, c, g, q, n, kw, tiles, steps, ash):
        """Step c of row tile t into buf[o:o+24]: lane q's pieces of rows g, g + 8 (M = 1: columns 64q..; a batch:
        32q.. and 128 + 32q.., whole 32-byte sectors per row) and the statistics of its C columns (clamped)."""
        tt, cc = min(t, uint32(tiles - uint32(1))), min(c, uint32(steps - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
        if WIDE:
            wq0 = min(uint32(cc * uint32(32) + uint32(4) * q), uint32(kw - uint32(4)))
            wq1 = min(uint32(cc * uint32(32) + uint32(16) + uint32(4) * q), uint32(kw - uint32(4)))
            put(buf, o, packed_u32, r0 * kw + wq0)
            put(buf, o + 4, packed_u32, r0 * kw + wq1)
            put(buf, o + 8, packed_u32, r1 * kw + wq0)
            put(buf, o + 12, packed_u32, r1 * kw + wq1)
        else:
            wq = min(uint32(cc * uint32(32) + uint32(8) * q), uint32(kw - uint32(8)))   # lane q's first word
            w0, w1 = uint32(r0 * kw + wq), uint32(r1 * kw + wq)
            put(buf, o, packed_u32, w0)
            put(buf, o + 4, packed_u32, w0 + uint32(4))
            put(buf, o + 8, packed_u32, w1)
            put(buf, o + 12, packed_u32, w1 + uint32(4))
        if words:   # lanes 0-15: the step's 4 absmax codes of row `lane` in one load; lanes 16-31: its absmax2
            lane = g * uint32(4) + q
            r = min(uint32(tt * uint32(16) + (lane & uint32(15))), uint32(n - uint32(1)))
            blk = r * (kw >> uint32(3)) + cc * uint32(4)
            if lane < uint32(16):
                buf[o + 16] = load_u32_of_bytes(absmax_q, blk)
            else:
                buf[o + 16] = ops.float_bits(absmax2[blk >> uint32(8)])
        elif (q >> uint32(1)) < uint32(M):
            wb = cc * uint32(32) + uint32(16) * (q & uint32(1))
            for i in range(4):
                r = r0 if i < 2 else r1
                blk = uint32(r * kw + min(uint32(wb + uint32(8 * (i % 2))), uint32(kw - uint32(8)))) >> ash
                if nested:
                    buf[o + 16 + i] = uint32(absmax_q[blk])
                buf[o + 20 + i] = ops.float_bits(absmax2[blk >> uint32(8)] if nested else absmax2[blk])

    return look, half_bits, fetch


@functools.cache
def step1_ops():
    """(rows, fetch1): ``fetch`` for M = 1 with the statistics word (K % 256 == 0), less work a step (timed against ``fetch`` in
    lab/README "A shorter step loop", ``09_gemv_lean.json``): ``rows(rb, tp, g, q, lane, n, kw, tiles)`` (the kernel calls it every step) puts tile tp's word
    bases in rb (rows g, g + 8 at lane q's first word; statistics row ``lane & 15``; clamped as ``fetch`` clamps);
    ``fetch1(buf, o, xq, packed_u32, absmax_q, absmax2, x_u32, rb, cp, lane, steps)`` loads step cp, and its x for
    the slot into xq (:func:`warp_ops.x_slot_ops`). No clamps of the word column and no past-K test for x: with
    K % 256 == 0 lane q's last word of a step is at most kw - 1 and every step's x lies inside K."""
    put = _put_op()

    @cuda.jit(device=True, inline="always")
    def rows(rb, tp, g, q, lane, n, kw, tiles):
        tt = min(tp, uint32(tiles - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
        rs = min(uint32(tt * uint32(16) + (lane & uint32(15))), uint32(n - uint32(1)))
        rb[0], rb[1], rb[2] = uint32(r0 * kw + uint32(8) * q), uint32(r1 * kw + uint32(8) * q), uint32(rs * (kw >> uint32(3)))

    @cuda.jit(device=True, inline="always")
    def fetch1(buf, o, xq, packed_u32, absmax_q, absmax2, x_u32, rb, cp, lane, steps):
        cc = min(cp, uint32(steps - uint32(1)))
        w0, w1 = uint32(rb[0] + cc * uint32(32)), uint32(rb[1] + cc * uint32(32))
        put(buf, o, packed_u32, w0)
        put(buf, o + 4, packed_u32, w0 + uint32(4))
        put(buf, o + 8, packed_u32, w1)
        put(buf, o + 12, packed_u32, w1 + uint32(4))
        blk = uint32(rb[2] + cc * uint32(4))
        buf[o + 16] = load_u32_of_bytes(absmax_q, blk) if lane < uint32(16) else ops.float_bits(absmax2[blk >> uint32(8)])
        xq[0], xq[1], xq[2], xq[3] = ops.load_u32x4(x_u32, uint64(cc * uint32(128) + uint32(4) * lane))

    return rows, fetch1
