"""Tuning experiment for the series' best kernel (run on a GPU; the record of how it was chosen).

Variants of the bf16 kernel at 16384x16384, all verified bit for bit, timed with the
harness in one run beside the copy/fill ceilings and bitsandbytes:

  w{K}x{T}  : each thread converts K u32 words (8 weights each) at stride T inside its
              block's tile, all K loads issued before the first store; one 16-byte
              store per word; each warp's stores cover 512 contiguous bytes.
  v16x{T}   : one 16-byte load per thread (4 words), exchanged through shared memory so
              lane t stores words t, t+32, t+64, t+96 of its warp's tile (coalesced).
  v16s      : one 16-byte load and four contiguous 16-byte stores per thread (scattered).

    python tools/tune_best_kernel.py     # writes data/results/<gpu>/tuning.json
"""
from __future__ import annotations

import os
import sys

import numpy as np

import nf4lab
from nf4lab import bench, ops
from numba import cuda, float32, uint32, uint64


def make_words(K, T, store=ops.store_u32x4, persistent=0):
    """persistent > 0: a grid of persistent * SMs blocks that strides over the tiles."""
    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords):
        lut = cuda.shared.array(16, float32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        cuda.syncthreads()
        tile = uint64(cuda.blockIdx.x)
        while tile * uint64(T * K) < nwords:
            base = tile * uint64(T * K) + uint64(tid)
            words = cuda.local.array(K, uint32)
            for j in range(K):
                w = base + uint64(j * T)
                if w < nwords:
                    words[j] = packed_u32[w]
            for j in range(K):
                w = base + uint64(j * T)
                if w < nwords:
                    blk = w >> uint64(3)
                    s = ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)
                    x = words[j]
                    o0 = ops.pack_bf16x2(lut[(x >> 4) & 15] * s, lut[x & 15] * s)
                    o1 = ops.pack_bf16x2(lut[(x >> 12) & 15] * s, lut[(x >> 8) & 15] * s)
                    o2 = ops.pack_bf16x2(lut[(x >> 20) & 15] * s, lut[(x >> 16) & 15] * s)
                    o3 = ops.pack_bf16x2(lut[(x >> 28) & 15] * s, lut[(x >> 24) & 15] * s)
                    store(out_u32, w * uint64(4), o0, o1, o2, o3)
            tile += uint64(cuda.gridDim.x)

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        grid = (nwords + T * K - 1) // (T * K)
        if persistent:
            grid = min(grid, persistent * (nf4lab.device_info()["sms"] or 1))
        kern[grid, T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut, b.out_u32,
                                uint64(nwords))
    return launch


def make_v16_exchange(T, store=ops.store_u32x4):
    WARPS = T // 32
    STAGE = 4 * T  # 128 words per warp

    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords):
        lut = cuda.shared.array(16, float32)
        stage = cuda.shared.array(STAGE, uint32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        cuda.syncthreads()
        warp = tid >> 5
        lane = tid & 31
        tile = (uint64(cuda.blockIdx.x) * uint64(WARPS) + uint64(warp)) * uint64(128)
        if tile + uint64(4 * lane) < nwords:
            a, bb, c, d = ops.load_u32x4(packed_u32, tile + uint64(4 * lane))
            stage[warp * 128 + 4 * lane] = a
            stage[warp * 128 + 4 * lane + 1] = bb
            stage[warp * 128 + 4 * lane + 2] = c
            stage[warp * 128 + 4 * lane + 3] = d
        cuda.syncthreads()  # a warp-level barrier would do; syncthreads also runs in the simulator
        for j in range(4):
            w = tile + uint64(32 * j + lane)
            if w < nwords:
                x = stage[warp * 128 + 32 * j + lane]
                blk = w >> uint64(3)
                s = ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)
                o0 = ops.pack_bf16x2(lut[(x >> 4) & 15] * s, lut[x & 15] * s)
                o1 = ops.pack_bf16x2(lut[(x >> 12) & 15] * s, lut[(x >> 8) & 15] * s)
                o2 = ops.pack_bf16x2(lut[(x >> 20) & 15] * s, lut[(x >> 16) & 15] * s)
                o3 = ops.pack_bf16x2(lut[(x >> 28) & 15] * s, lut[(x >> 24) & 15] * s)
                store(out_u32, w * uint64(4), o0, o1, o2, o3)

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16" and nwords % 4 == 0
        grid = (nwords + 128 * WARPS - 1) // (128 * WARPS)
        kern[grid, T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut, b.out_u32,
                                uint64(nwords))
    return launch


def make_v16_scattered(T):
    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nvec):
        lut = cuda.shared.array(16, float32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        cuda.syncthreads()
        v = uint64(cuda.blockIdx.x) * uint64(T) + uint64(tid)
        if v < nvec:
            ws = ops.load_u32x4(packed_u32, v * uint64(4))
            blk = v >> uint64(1)
            s = ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)
            for j in range(4):
                x = ws[j]
                o0 = ops.pack_bf16x2(lut[(x >> 4) & 15] * s, lut[x & 15] * s)
                o1 = ops.pack_bf16x2(lut[(x >> 12) & 15] * s, lut[(x >> 8) & 15] * s)
                o2 = ops.pack_bf16x2(lut[(x >> 20) & 15] * s, lut[(x >> 16) & 15] * s)
                o3 = ops.pack_bf16x2(lut[(x >> 28) & 15] * s, lut[(x >> 24) & 15] * s)
                ops.store_u32x4(out_u32, (v * uint64(4) + uint64(j)) * uint64(4), o0, o1, o2, o3)

    def launch(b):
        nvec = b.n // 32
        assert b.n % 32 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        kern[(nvec + T - 1) // T, T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut,
                                               b.out_u32, uint64(nvec))
    return launch


def make_expand_bound(K, T, store=ops.store_u32x4):
    """Same traffic as the w-variants with no arithmetic: the bound of this access pattern."""
    @cuda.jit
    def kern(packed_u32, out_u32, nwords):
        base = uint64(cuda.blockIdx.x) * uint64(T * K) + uint64(cuda.threadIdx.x)
        words = cuda.local.array(K, uint32)
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                words[j] = packed_u32[w]
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                x = words[j]
                store(out_u32, w * uint64(4), x, x ^ uint32(1), x ^ uint32(2), x ^ uint32(3))

    def launch(b):
        nwords = b.n // 8
        kern[(nwords + T * K - 1) // (T * K), T, b.stream](b.packed_u32, b.out_u32, uint64(nwords))
    launch.no_verify = True
    return launch


def make_smem_scales(K, T, store=ops.store_u32x4):
    """Scales of the block's 64-weight blocks computed once into shared memory."""
    NB = T * K // 8  # 64-blocks per tile (8 words each)

    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords):
        lut = cuda.shared.array(16, float32)
        scales = cuda.shared.array(NB, float32)
        tid = cuda.threadIdx.x
        tile0 = uint64(cuda.blockIdx.x) * uint64(T * K)
        base = tile0 + uint64(tid)
        words = cuda.local.array(K, uint32)
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                words[j] = packed_u32[w]
        if tid < 16:
            lut[tid] = lut_g[tid]
        if tid < NB:
            blk = (tile0 >> uint64(3)) + uint64(tid)
            if blk * uint64(8) < nwords:
                scales[tid] = ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)
        cuda.syncthreads()
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                s = scales[(tid + j * T) >> 3]
                x = words[j]
                o0 = ops.pack_bf16x2(lut[(x >> 4) & 15] * s, lut[x & 15] * s)
                o1 = ops.pack_bf16x2(lut[(x >> 12) & 15] * s, lut[(x >> 8) & 15] * s)
                o2 = ops.pack_bf16x2(lut[(x >> 20) & 15] * s, lut[(x >> 16) & 15] * s)
                o3 = ops.pack_bf16x2(lut[(x >> 28) & 15] * s, lut[(x >> 24) & 15] * s)
                store(out_u32, w * uint64(4), o0, o1, o2, o3)

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        kern[(nwords + T * K - 1) // (T * K), T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                           b.lut, b.out_u32, uint64(nwords))
    return launch


def variants():
    cs = ops.store_u32x4_cs
    return {
        "w2x512 cs": make_words(2, 512, cs),
        "bound: expand u32 -> 16 B, no arithmetic, w2x512 cs": make_expand_bound(2, 512, cs),
        "bound: expand w1x256 cs": make_expand_bound(1, 256, cs),
        "bound: expand w4x256": make_expand_bound(4, 256),
        "smem scales w2x512 cs": make_smem_scales(2, 512, cs),
        "smem scales w4x256 cs": make_smem_scales(4, 256, cs),
        "smem scales w8x128 cs": make_smem_scales(8, 128, cs),
        "smem scales w2x256": make_smem_scales(2, 256),
    }


def main():
    shape = tuple(int(s) for s in sys.argv[1:3]) if len(sys.argv) > 2 else None
    print(nf4lab.describe(), flush=True)
    case = nf4lab.make_case(shape, "bf16", "randn", 0)
    print(case, flush=True)
    if not nf4lab.ON_GPU:
        for name, launch in variants().items():
            if getattr(launch, "no_verify", False):
                b = nf4lab.make_buffers(case)
                launch(b)
                continue
            print(nf4lab.run_and_verify(launch, case, name=name))
        return
    run = bench.run_versions(variants(), case)
    path = run.save(os.environ.get("TUNE_NAME", "tuning"))
    print(run.table())
    print("saved", path)


if __name__ == "__main__":
    main()
