"""The shipped tensor-core GEMV with its table lookups moved off the load/store pipe: a register-resident table.

``nf4lab.kernels.gemv`` turns each code byte into an mma A-fragment register (the byte's two NF4 values as a
bf16x2/f16x2 pair) with one PRMT (the address) and one 32-bit shared load from a 64 KB per-lane table. Here the 16
values' low and high bytes sit in 8 registers (entries 0-7 and 8-15 of each byte plane) and a code word (8 codes)
becomes its 4 pair registers with PRMTs and LOP3s only, no shared memory:

- selectors: ``s = w & 0x77777777`` (a PRMT selector's bit 3 would replicate a sign, so the code's own bit 3 is
  masked off; the upper 4 codes are ``s >> 16``);
- which half of the table: a byte mask per code, 0xFF where the code's bit 3 is set, from PRMT's sign-replicate
  mode on the code word itself (odd nibbles' bit 3 is a byte's bit 7; even nibbles' after ``w << 4``);
- each byte plane: two PRMTs (entries 0-7, 8-15) and one LOP3 select; then two PRMTs interleave low and high bytes
  into the two pairs of a 16-bit group, in the shipped table's order (low half: the byte's high nibble).

21 integer instructions per 8 codes against the shipped kernel's 4 PRMT + 4 LDS; the pairs, the mma, the scales,
the x slot and the reduction are the shipped kernel's, so the output is bit for bit the shipped kernel's (the same
values reach the same mma in the same order). Without the 64 KB table a block needs 16 KB (M = 1) to 45 KB (M = 8)
of shared memory, so more blocks fit an SM: ``min_blocks`` is the knob (registers then decide).

    python lab/gemv_next.py            # offline: bits against the shipped kernel in the simulator, PTX + ptxas
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)
from nf4lab import runtime  # noqa: E402
from nf4lab.kernels import gemv  # noqa: E402
ops = gemv.ops  # noqa: E402  (through gemv: wherever the package keeps its device ops)
from nf4lab.kernels.gemv import (FB, FBW, THREADS, W, code2_word, f32_from_bits, mma_bf16, mma_f16,  # noqa: E402
                                 shfl_idx, shfl_xor_sync, step_ops, syncwarp, x_slot_ops)
from numba import cuda, float32, uint32  # noqa: E402


def _py_prmt_full(a, b, sel):
    """PRMT with its sign-replicate mode (selector bit 3: the picked byte's bit 7 in all 8 bits), for the simulator."""
    pool = (int(a) & 0xFFFFFFFF) | ((int(b) & 0xFFFFFFFF) << 32)
    out = 0
    for k in range(4):
        s = (int(sel) >> (4 * k)) & 15
        v = (pool >> (8 * (s & 7))) & 0xFF
        if s & 8:
            v = 0xFF if v & 0x80 else 0
        out |= v << (8 * k)
    return np.uint32(out)


prmt = _py_prmt_full if runtime.SIMULATOR else gemv.prmt


def table_words(half_values):
    """The 8 table registers of 16 half-precision bit patterns: low bytes of entries 0-3, 4-7, 8-11, 12-15, then high
    bytes likewise (host side, for tests)."""
    v = [int(h) & 0xFFFF for h in half_values]
    lo = [sum((v[4 * j + b] & 0xFF) << (8 * b) for b in range(4)) for j in range(4)]
    hi = [sum((v[4 * j + b] >> 8) << (8 * b) for b in range(4)) for j in range(4)]
    return lo + hi


@cuda.jit(device=True, inline="always")
def _plane(t0, t1, t2, t3, s, m):
    """One byte plane of 4 codes: entries 0-7 from (t0, t1), 8-15 from (t2, t3), chosen per byte by mask m."""
    a = prmt(t0, t1, s)
    b = prmt(t2, t3, s)
    return (b & m) | (a & ~m)


@cuda.jit(device=True, inline="always")
def decode_word(w, l0, l1, l2, l3, h0, h1, h2, h3):
    """Code word w (bytes 0-3, two codes each) -> the 4 pair registers the shipped table gives for its bytes."""
    s = w & uint32(0x77777777)
    sh = s >> uint32(16)
    w4 = w << uint32(4)
    mlo = prmt(w4, w, uint32(0xD9C8))   # byte i: 0xFF where nibble i (0..3) has bit 3 set
    mhi = prmt(w4, w, uint32(0xFBEA))   # nibbles 4..7
    lo = _plane(l0, l1, l2, l3, s, mlo)
    hi = _plane(h0, h1, h2, h3, s, mlo)
    p0 = prmt(lo, hi, uint32(0x4051))   # byte 0: (value of its high nibble, value of its low nibble)
    p1 = prmt(lo, hi, uint32(0x6273))   # byte 1
    lo = _plane(l0, l1, l2, l3, sh, mhi)
    hi = _plane(h0, h1, h2, h3, sh, mhi)
    p2 = prmt(lo, hi, uint32(0x4051))
    p3 = prmt(lo, hi, uint32(0x6273))
    return p0, p1, p2, p3


@cuda.jit(device=True, inline="always")
def spare(i):  # partial sum i (2 tiles x W warps x 16 rows x M): words 32..47 of rows 48.. (rows 0-47: code2, x slot)
    return ((uint32(48) + (i >> uint32(4))) << uint32(6)) | uint32(32) | (i & uint32(15))


def smem_bytes(M):
    return (48 + 2 * W * M) * 256


@functools.cache
def make_kernel(is_bf16, M, base, min_blocks=2, words=True):
    """The shipped kernel (gemv.make_kernel, nested statistics, one step in flight, x slot at M = 1) with the
    register table; ``min_blocks``: blocks per SM asked of ptxas (the register cap)."""
    nested, D = True, 1
    NT, WIDE, WORDS = (M + 1) // 2, M > 1, words
    SW = FBW if WORDS else FB
    NACC, NCF, NB = 2 * NT, 4 * NT, SW * (D + 1)
    mma = mma_bf16 if is_bf16 else mma_f16
    _look, half_bits, fetch = step_ops(is_bf16, M, base, nested, WORDS)
    XS = M == 1
    x_quad, x_stash, x_read = x_slot_ops(base)

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_next(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw = k >> uint32(3)
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        ash, grid = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x)
        buf = cuda.local.array(NB, uint32)
        t, c = uint32(cuda.blockIdx.x), warp
        tp, cp = t, c
        xq, xok = cuda.local.array(4, uint32), True
        if XS:
            xok = x_quad(xq, x_u32, cp, lane, k)
        for d in range(D):
            fetch(buf, SW * (d + 1), packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            cp = uint32(cp + uint32(W))
            if cp >= steps:
                cp, tp = warp, uint32(tp + grid)
        # the table registers: byte j of l<i> is the low byte of value 4 i + j, of h<i> its high byte
        tl = cuda.local.array(4, uint32)
        th = cuda.local.array(4, uint32)
        for i in range(4):
            lw, hw = uint32(0), uint32(0)
            for j in range(4):
                v = half_bits(lut[4 * i + j])
                lw |= (v & uint32(0xFF)) << uint32(8 * j)
                hw |= ((v >> uint32(8)) & uint32(0xFF)) << uint32(8 * j)
            tl[i], th[i] = lw, hw
        sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        parity = uint32(0)
        acc, cf, s = cuda.local.array(NACC, float32), cuda.local.array(NCF, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        if XS:
            for j in range(16):
                xr[j] = uint32(0)
            x_stash(sm, xq, xok, warp, lane)
            syncwarp()
        while t < tiles:
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:
                for i in range(SW * D):
                    buf[i] = buf[i + SW]
                fetch(buf, SW * D, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                if XS:
                    xok = x_quad(xq, x_u32, min(cp, uint32(steps - uint32(1))), lane, k)
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp, tp = warp, uint32(tp + grid)
                cn = uint32(c + uint32(W))
                tn = t
                if cn >= steps:
                    cn, tn = warp, uint32(t + grid)
                if c < steps:
                    for i in range(NCF):
                        cf[i] = float32(0.0)
                    xcol = uint32(c * uint32(256) + uint32(64) * q)
                    for h in range(2):
                        if WIDE:
                            xcol = uint32(c * uint32(256) + uint32(128 * h) + uint32(32) * q)
                            blk = uint32(2 * h) + (q >> uint32(1))
                        else:
                            blk = q
                        for jw in range(4):   # words 4h + jw of rows g and g + 8: mma steps 2 jw, 2 jw + 1
                            a0, a1, a2, a3 = decode_word(buf[4 * h + jw], tl[0], tl[1], tl[2], tl[3],
                                                         th[0], th[1], th[2], th[3])
                            b0, b1, b2, b3 = decode_word(buf[8 + 4 * h + jw], tl[0], tl[1], tl[2], tl[3],
                                                         th[0], th[1], th[2], th[3])
                            A[8 * jw], A[8 * jw + 1], A[8 * jw + 2], A[8 * jw + 3] = a0, b0, a1, b1
                            A[8 * jw + 4], A[8 * jw + 5], A[8 * jw + 6], A[8 * jw + 7] = a2, b2, a3, b3
                        for nt in range(NT):
                            m = uint32(2 * nt) + (g >> uint32(2))
                            if XS:
                                if g == q:
                                    x_read(xr, sm, warp, q, h)
                            elif (blk if WIDE else q) == (g & uint32(3)) and m < uint32(M) and xcol < k:
                                xi = m * (k >> uint32(1)) + (xcol >> uint32(1)) + uint32(0 if WIDE else 16 * h)
                                for j in range(4):
                                    xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = \
                                        ops.load_u32x4(x_u32, xi + uint32(4 * j))
                            else:
                                for j in range(16):
                                    xr[j] = uint32(0)
                            for i in range(8):
                                cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3] = mma(
                                    A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3], xr[2 * i], xr[2 * i + 1],
                                    cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3])
                    if WORDS:
                        raw = buf[16]
                        wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
                        ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
                        sh = uint32(16) * (q & uint32(1))
                    if (q >> uint32(1)) < uint32(M):
                        for i in range(4):
                            if WORDS:
                                code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                                a2_ = ag if i < 2 else ag8
                            else:
                                code, a2_ = buf[16 + i], buf[20 + i]
                            s[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]), f32_from_bits(a2_)),
                                               offset)
                        for nt in range(NT):
                            acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                            acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
                if XS:
                    syncwarp()
                    x_stash(sm, xq, xok, warp, lane)
                    syncwarp()
                c = cn
                if tn != t:
                    break
            base_ = uint32(parity * uint32(W * 16 * M) + warp * uint32(16 * M))
            for nt in range(NT):
                a0_ = acc[2 * nt] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt], 1)
                a1_ = acc[2 * nt + 1] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt + 1], 1)
                m = uint32(2 * nt) + (q >> uint32(1))
                if m < uint32(M) and (q & uint32(1)) == uint32(0):
                    sm[spare(base_ + m * uint32(16) + g)] = ops.float_bits(a0_)
                    sm[spare(base_ + m * uint32(16) + g + uint32(8))] = ops.float_bits(a1_)
            cuda.syncthreads()
            if tid < uint32(16 * M):
                first, v = uint32(parity * uint32(W * 16 * M) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16 * M))])
                row = uint32(t * uint32(16) + (tid & uint32(15)))
                if row < n:
                    y[uint32((tid >> uint32(4)) * n + row)] = half_bits(v)
            parity, t = parity ^ uint32(1), tn

    return gemv_next


def launch(g, min_blocks=2, blocks_per_sm=None):
    """Like gemv.launch (GemvBuffers; nested statistics where gemv.words_apply holds): ``min_blocks`` the register cap,
    ``blocks_per_sm`` the persistent grid (default: min_blocks)."""
    from nf4lab.kernels.fastkernel import address

    gemv.validate(g)
    if not g.nested:
        raise ValueError("nested=False: this lab kernel takes nested statistics only")
    words = gemv.words_apply(g.nested, g.bs_shift, g.K, address(g.absmax_q))
    base = gemv.probe_base() if runtime.ON_GPU else gemv.default_base((9, 0))
    kern = make_kernel(g.dtype == "bf16", g.M, base, min_blocks, words)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    nb = smem_bytes(g.M)
    grid = g.grid or min(-(-g.N // 16), (blocks_per_sm or min_blocks) * gemv.sms())
    gemv.prepare(kern, args, nb)[grid, THREADS, g.stream, nb](*args)


def _check_decode():
    """decode_word against the shipped table's pairs, every byte value, both dtypes (plain Python)."""
    from nf4lab.format import reference

    lut = reference.NF4_LUT.astype(np.float32)
    for dt in ("bf16", "fp16"):
        hv = [int(ops._py_to_bf16_bits(v)) if dt == "bf16" else int(np.float16(v).view(np.uint16)) for v in lut] \
            if hasattr(ops, "_py_to_bf16_bits") else None
        if hv is None:
            import torch
            hv = [int(x) & 0xFFFF for x in torch.tensor(lut).to(torch.bfloat16 if dt == "bf16" else torch.float16)
                  .view(torch.int16).tolist()]
        tw = table_words(hv)
        rng = np.random.default_rng(0)
        words = [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98] + [int(x) for x in rng.integers(0, 2**32, 2000)]
        for w in words:
            got = [int(x) for x in decode_word.py_func(np.uint32(w), *[np.uint32(x) for x in tw])] \
                if hasattr(decode_word, "py_func") else [int(x) for x in decode_word(np.uint32(w), *[np.uint32(x) for x in tw])]
            for b in range(4):
                e = (w >> (8 * b)) & 0xFF
                want = hv[e >> 4] | (hv[e & 15] << 16)
                assert got[b] == want, (dt, hex(w), b, hex(got[b]), hex(want))
    print("decode_word: every pair equals the shipped table's (bf16, fp16; 2004 words)")


if __name__ == "__main__":
    _check_decode()
