"""The shipped tensor-core GEMV (nf4lab.kernels.gemv, M = 1) with its work shared out evenly: a stream-K split.

The shipped kernel hands each persistent block whole 16-row tiles, so at 14336x4096 (896 tiles on 264 blocks) the
last round of tiles runs on 104 blocks and the time follows the largest tile count per block (lab/README: "Three
leads timed on the H200"). Here block b takes the steps [b T / G, (b + 1) T / G) of all T = tiles x steps steps in
tile order, and its warps take every 8th of them. A tile that lies in one block is reduced and written as before.
A tile split between blocks: each block's 16 row sums go to a slot of a global workspace (slot 0: the block's first
tile, slot 1: its last), then each row's thread counts its part in with an atomic; the thread that counts last
sums the parts in block order (deterministic whatever the arrival order) and writes y, and puts the counter back
to zero for the next launch. Timing and the tolerance check only (bench_gemv.py "TC stream-K"); M = 1, nested
statistics read as words (gemv.words_apply), one step of loads in flight, x through the slot.
"""
from __future__ import annotations

import functools

import numpy as np

import nf4lab  # noqa: F401  (first: decides GPU or simulator)
from nf4lab.kernels import gemv
from nf4lab.kernels.gemv import LUT, code2_word, spare, step_ops
from nf4lab.device import ops
from nf4lab.device.warp_ops import f32_from_bits, mma_bf16, mma_f16, prmt, shfl_idx, shfl_xor_sync, syncwarp, x_slot_ops
from numba import cuda, float32, uint32, uint64

W, THREADS = gemv.W, gemv.THREADS


@functools.cache
def make_streamk(is_bf16, base):
    SW = gemv.FBW
    NB = 2 * SW
    mma = mma_bf16 if is_bf16 else mma_f16
    look, half_bits, fetch = step_ops(is_bf16, 1, base, True, True)
    x_quad, x_stash, x_read = x_slot_ops(base)

    @cuda.jit(device=True, inline="always")
    def next_step(t, c, steps):  # the warp's next step: W further in tile order
        c = uint32(c + uint32(W))
        while c >= steps:
            c, t = uint32(c - steps), uint32(t + uint32(1))
        return t, c

    @cuda.jit(launch_bounds=(THREADS, gemv.BLOCKS_PER_SM))
    def gemv_sk(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift, ws, cnt):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw = k >> uint32(3)
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        ash, grid, b = uint32(uint32(bs_shift) - uint32(3)), uint64(cuda.gridDim.x), uint64(cuda.blockIdx.x)
        total = uint64(tiles) * uint64(steps)
        lo, hi = uint32(b * total // grid), uint32((b + uint64(1)) * total // grid)
        if hi <= lo:
            return
        t_first, t_last = lo // steps, (hi - uint32(1)) // steps
        s = uint32(lo + warp)                       # the warp's step, in tile order
        ts, c = s // steps, s - (s // steps) * steps
        tp, cp = ts, c                              # the step whose loads go out next
        buf = cuda.local.array(NB, uint32)
        xq = cuda.local.array(4, uint32)
        xok = x_quad(xq, x_u32, min(cp, uint32(steps - uint32(1))), lane, k)
        fetch(buf, SW, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
        tp, cp = next_step(tp, cp, steps)
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
        lane4, parity = lane << uint32(2), uint32(0)
        cf, s4 = cuda.local.array(4, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        for j in range(16):
            xr[j] = uint32(0)
        x_stash(sm, xq, xok, warp, lane)
        syncwarp()
        t = t_first
        while t <= t_last:
            acc0, acc1 = float32(0.0), float32(0.0)
            while ts == t and s < hi:
                for i in range(SW):
                    buf[i] = buf[i + SW]
                fetch(buf, SW, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                xok = x_quad(xq, x_u32, min(cp, uint32(steps - uint32(1))), lane, k)
                tp, cp = next_step(tp, cp, steps)
                for i in range(4):
                    cf[i] = float32(0.0)
                for h in range(2):
                    for i in range(8):
                        wa, wb = buf[4 * h + (i >> 1)], buf[8 + 4 * h + (i >> 1)]
                        sel0, sel1 = uint32(0x5504 | (2 * (i & 1)) << 4), uint32(0x5504 | (2 * (i & 1) + 1) << 4)
                        A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                        A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                        A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                        A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                    if g == q:
                        x_read(xr, sm, warp, q, h)
                    for i in range(8):
                        cf[0], cf[1], cf[2], cf[3] = mma(A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3],
                                                         xr[2 * i], xr[2 * i + 1], cf[0], cf[1], cf[2], cf[3])
                raw = buf[16]
                wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
                ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
                sh = uint32(16) * (q & uint32(1))
                if q < uint32(2):
                    for i in range(4):
                        code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                        a2 = ag if i < 2 else ag8
                        s4[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]), f32_from_bits(a2)), offset)
                    acc0 += cf[0] * s4[0] + cf[1] * s4[1]
                    acc1 += cf[2] * s4[2] + cf[3] * s4[3]
                syncwarp()
                x_stash(sm, xq, xok, warp, lane)
                syncwarp()
                s = uint32(s + uint32(W))
                ts, c = next_step(ts, c, steps)
            bs = uint32(parity * uint32(W * 16) + warp * uint32(16))
            a0 = acc0 + shfl_xor_sync(0xFFFFFFFF, acc0, 1)
            a1 = acc1 + shfl_xor_sync(0xFFFFFFFF, acc1, 1)
            if q == uint32(0):
                sm[spare(bs + g)] = ops.float_bits(a0)
                sm[spare(bs + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16):
                first, v = uint32(parity * uint32(W * 16) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16))])
                row = uint32(t * uint32(16) + tid)
                s0, s1 = uint64(t) * uint64(steps), uint64(t + uint32(1)) * uint64(steps)
                fb, lb = ((s0 + uint64(1)) * grid - uint64(1)) // total, (s1 * grid - uint64(1)) // total
                if fb == lb:
                    if row < n:
                        y[row] = half_bits(v)
                else:
                    slot = uint32(0) if t == t_first else uint32(1)
                    ws[uint32(b) * uint32(32) + slot * uint32(16) + tid] = v
                    cuda.threadfence()
                    if cuda.atomic.add(cnt, row, uint32(1)) == uint32(lb - fb):
                        cuda.threadfence()
                        v = float32(0.0)
                        for bb in range(fb, lb + uint64(1)):
                            sl = uint32(0) if uint64(t) == (uint64(bb) * total // grid) // uint64(steps) else uint32(1)
                            v += cuda.atomic.add(ws, uint32(bb) * uint32(32) + sl * uint32(16) + tid, float32(0.0))
                        if row < n:
                            y[row] = half_bits(v)
                        cnt[row] = uint32(0)
            parity = parity ^ uint32(1)
            t = uint32(t + uint32(1))

    return gemv_sk


_WORK = {}   # per device and size: the workspace and the counters (zero between launches)


def launch(g):
    """bench_gemv's "TC stream-K": M = 1 and the statistics as words only."""
    gemv.validate(g)
    if g.M != 1 or not gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)):
        raise ValueError("lab stream-K: M = 1, nested statistics with blocksize 64 and K % 256 == 0 only")
    tiles, steps = -(-g.N // 16), -(-g.K // 256)
    grid = g.grid or min(tiles * steps, gemv.BLOCKS_PER_SM * gemv.sms())
    key = (cuda.get_current_device().id if nf4lab.ON_GPU else None, grid, tiles)
    if key not in _WORK:
        _WORK[key] = (cuda.to_device(np.zeros(32 * grid, np.float32)), cuda.to_device(np.zeros(16 * tiles, np.uint32)))
    ws, cnt = _WORK[key]
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift, ws, cnt)
    base = gemv.probe_base()
    kern = gemv.prepare(make_streamk(g.dtype == "bf16", base), args)
    kern[grid, THREADS, g.stream, gemv.SMEM](*args)
