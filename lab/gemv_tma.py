"""The shipped M = 1 GEMV with its weights moved by TMA ("TC tma S"), timed beside it (sm_90 only).

The shipped kernel loads each step's weights with four 16-byte loads a lane, one step ahead, into a ring of
registers: the load/store unit issues them, and the registers cap how many steps can be in flight. Here each warp
has S stages of 2 KB in shared memory beyond the 64 KB table; its lane 0 asks the Tensor Memory Accelerator for
a whole step (16 rows x 128 bytes, one ``cp.async.bulk.tensor.2d`` through a tensor map of W's packed bytes, 128-byte
swizzle so that the lanes' 16-byte reads hit distinct banks) S - 1 steps ahead, counted by the stage's mbarrier;
the lanes wait on it and read their 64 bytes with four ``ld.shared.v4``. The statistics word and x come S - 1 steps
ahead in registers as before. The same values reach the same mmas in the same order: the shipped kernel's bits.

Shared memory: 64 KB table + 8 warps x S x 2 KB (S = 3: 112 KB a block, two blocks on a Hopper SM).

    NF4LAB_MODE=compile python -m lab.gemv_tma --sass     # offline: registers, spills, SASS a step (ptxas sm_90)
    python -m lab.gemv_tma --bench                        # GPU: A B A B at 5 shapes -> 09_gemv_tma.json
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import sys
import time

import numpy as np
from numba import cuda, float32, types, uint32, uint64

import nf4lab
from nf4lab.device import ops
from nf4lab.device.warp_ops import (
    f32_from_bits,
    load_u32_of_bytes,
    mma_bf16,
    mma_f16,
    prmt,
    shfl_idx,
    shfl_xor_sync,
    syncwarp,
    table_vec4,
    x_slot_ops,
)
from nf4lab.kernels import gemv

NAME = "09_gemv_tma"
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (12672, 4096)]
STAGE = 2048                     # one step of a 16-row tile: 16 rows x 128 bytes
RING = gemv.SMEM                 # the stages start after the table (1024-byte aligned there: the swizzle needs it)


def smem_bytes(S):
    return gemv.SMEM + gemv.W * S * STAGE


@functools.cache
def _tma_ops():
    """mbarrier and TMA instructions through inline PTX (numba-cuda has neither)."""
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def call(builder, text, cons, ret, args, tys):
        return builder.call(ir.InlineAsm(ir.FunctionType(ret, tys), text, cons, side_effect=True), args)

    def u32s(context, builder, sig, args):
        return [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]

    @intrinsic
    def mbar_init(typingctx, addr, count):
        def codegen(context, builder, sig, args):
            call(builder, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", ir.VoidType(),
                 u32s(context, builder, sig, args), [i32, i32])
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint32), codegen

    @intrinsic
    def fence_init(typingctx):
        def codegen(context, builder, sig, args):
            call(builder, "fence.mbarrier_init.release.cluster; fence.proxy.async.shared::cta;", "~{memory}",
                 ir.VoidType(), [], [])
            return context.get_dummy_value()
        return types.void(), codegen

    @intrinsic
    def expect_tx(typingctx, addr, nbytes):
        def codegen(context, builder, sig, args):
            call(builder, "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}", ir.VoidType(),
                 u32s(context, builder, sig, args), [i32, i32])
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint32), codegen

    @intrinsic
    def tma2d(typingctx, dst, tmap, c0, c1, bar):
        if not (isinstance(tmap, types.Array) and tmap.dtype == types.uint64):
            return None

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[1])(context, builder, args[1])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[1], ary, [context.get_constant(types.intp, 0)],
                                           wraparound=False)
            d, a, b, m = (context.cast(builder, args[i], sig.args[i], types.uint32) for i in (0, 2, 3, 4))
            call(builder, "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                          " [$0], [$1, {$2, $3}], [$4];", "r,l,r,r,r,~{memory}", ir.VoidType(),
                 [d, builder.ptrtoint(ptr, i64), a, b, m], [i32, i64, i32, i32, i32])
            return context.get_dummy_value()
        return types.void(types.uint32, tmap, types.uint32, types.uint32, types.uint32), codegen

    @intrinsic
    def try_wait(typingctx, addr, parity):
        def codegen(context, builder, sig, args):
            return call(builder, "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                                 "selp.u32 $0, 1, 0, p; }", "=r,r,r,~{memory}", i32, u32s(context, builder, sig, args),
                        [i32, i32])
        return types.uint32(types.uint32, types.uint32), codegen

    @intrinsic
    def trap(typingctx):
        def codegen(context, builder, sig, args):
            call(builder, "trap;", "~{memory}", ir.VoidType(), [], [])
            return context.get_dummy_value()
        return types.void(), codegen

    return mbar_init, fence_init, expect_tx, tma2d, try_wait, trap


@functools.cache
def make_tma_kernel(is_bf16, base, S=3, min_blocks=gemv.BLOCKS_PER_SM, carveout=None):
    """(``carveout`` only keys the cache: a function's carveout is an attribute of the compiled kernel.) M = 1, nested statistics as one word (``gemv.words_apply``), K % 256 == 0 and K >= 2048 (every warp has a
    step in every tile); ``base`` as in ``gemv.make_kernel``; S stages a warp, S - 1 steps in flight."""
    if (base + RING) % 1024:
        raise ValueError(f"the stages must start 1024-byte aligned in the shared window (base {base:#x})")
    D, W, THREADS, LUT = S - 1, gemv.W, gemv.THREADS, gemv.LUT
    NST, NXQ, NXM = S, 4 * (S - 1), 4 * (S - 1) - 4    # ring sizes as plain constants (numba's arrays need them)
    mma = mma_bf16 if is_bf16 else mma_f16
    look, half_bits, _ = gemv.step_ops(is_bf16, 1, base, True, True)
    slot_at, _, x_put, x_get = x_slot_ops(base)
    load4, _ = table_vec4(base)
    mbar_init, fence_init, expect_tx, tma2d, try_wait, trap = _tma_ops()
    code2_word, spare = gemv.code2_word, gemv.spare

    @cuda.jit(device=True, inline="always")
    def mbar(warp, s):  # the stage's mbarrier: 8 bytes in the spare words of table rows 9, 10
        i = uint32(warp * uint32(S) + s)
        return uint32(uint32(base) + ((uint32(9) + (i >> uint32(4))) << uint32(8)) + uint32(128)
                      + ((i & uint32(15)) << uint32(3)))

    @cuda.jit(device=True, inline="always")
    def wait(addr, ph):
        spins = uint32(0)
        while try_wait(addr, ph) == uint32(0):
            spins += uint32(1)
            if spins > uint32(1 << 22):   # a lost stage would hang the GPU: fail loudly instead
                trap()

    @cuda.jit(device=True, inline="always")
    def stat_base(tp, lane, n, kw, tiles):  # the statistics word's row base (row lane & 15 of tile tp), clamped
        tt = min(tp, uint32(tiles - uint32(1)))
        return uint32(min(uint32(tt * uint32(16) + (lane & uint32(15))), uint32(n - uint32(1))) * (kw >> uint32(3)))

    @cuda.jit(device=True, inline="always")
    def produce(st, xq, d, dx, tmap, absmax_q, absmax2, x_u32, sb, tp, cp, lane, warp, sp, tiles):
        """Step cp of tile tp: its weights into stage sp by TMA (lane 0), its statistics word into st[d] and the
        lane's 16 bytes of its x into xq[4 dx:4 dx + 4]."""
        if lane == uint32(0) and tp < tiles:
            a = mbar(warp, sp)
            expect_tx(a, uint32(STAGE))
            tma2d(uint32(uint32(base + RING) + (warp * uint32(S) + sp) * uint32(STAGE)), tmap, uint32(cp * uint32(128)),
                  uint32(tp * uint32(16)), a)
        blk = uint32(sb + cp * uint32(4))
        st[d] = load_u32_of_bytes(absmax_q, blk) if lane < uint32(16) else ops.float_bits(absmax2[blk >> uint32(8)])
        xq[4 * dx], xq[4 * dx + 1], xq[4 * dx + 2], xq[4 * dx + 3] = ops.load_u32x4(x_u32, uint64(cp * uint32(128) + uint32(4) * lane))

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_tma(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift, tmap):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw = k >> uint32(3)
        steps, tiles = k >> uint32(8), (n + uint32(15)) >> uint32(4)
        grid = uint32(cuda.gridDim.x)
        st, xq = cuda.local.array(NST, uint32), cuda.local.array(NXQ, uint32)
        buf = cuda.local.array(16, uint32)
        t, c = uint32(cuda.blockIdx.x), warp
        tp, cp = t, c                  # the step whose loads go out next
        xs, xa = slot_at(warp, lane)
        # the lane's four 16-byte pieces in a stage: rows g, g + 8, chunks 2q, 2q + 1, swizzled (chunk ^ row % 8)
        o0 = uint32(g * uint32(128) + (((uint32(2) * q) ^ g) << uint32(4)))
        o1 = uint32(g * uint32(128) + (((uint32(2) * q + uint32(1)) ^ g) << uint32(4)))
        if lane < uint32(S):
            mbar_init(mbar(warp, lane), uint32(1))
        fence_init()
        syncwarp()
        sb = stat_base(tp, lane, n, kw, tiles)
        for d in range(D):
            produce(st, xq, d, d, tmap, absmax_q, absmax2, x_u32, sb, tp, cp, lane, warp, uint32(d), tiles)
            cp = uint32(cp + uint32(W))
            if cp >= steps:
                cp, tp = warp, uint32(tp + grid)
                sb = stat_base(tp, lane, n, kw, tiles)
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):    # the used half of each 256-byte row
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
        lane4, parity = lane << uint32(2), uint32(0)
        acc, cf, s = cuda.local.array(2, float32), cuda.local.array(4, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        for j in range(16):
            xr[j] = uint32(0)
        x_put(sm, xs, xq)             # step 0's x into the slot; xq moves up
        for j in range(NXM):
            xq[j] = xq[j + 4]
        syncwarp()
        # rings at a step's start: st[0:D] the statistics of this step and the next D - 1, xq[0:4 D - 4] x of the
        # next D - 1 steps (this step's is in the slot); the step's produce adds step + D at st[D], xq[4 D - 4:]
        sc, ph, sp = uint32(0), uint32(0), uint32(D)   # stage consumed next, its phase; stage filled next
        while t < tiles:
            acc[0], acc[1] = float32(0.0), float32(0.0)
            while True:
                produce(st, xq, D, D - 1, tmap, absmax_q, absmax2, x_u32, sb, tp, cp, lane, warp, sp, tiles)
                cn, tn = uint32(c + uint32(W)), t
                if cn >= steps:
                    cn, tn = warp, uint32(t + grid)
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp, tp = warp, uint32(tp + grid)
                    sb = stat_base(tp, lane, n, kw, tiles)
                wait(mbar(warp, sc), ph)
                so = uint32(uint32(RING) + (warp * uint32(S) + sc) * uint32(STAGE))
                buf[0], buf[1], buf[2], buf[3] = load4(sm, so + o0)
                buf[4], buf[5], buf[6], buf[7] = load4(sm, so + o1)
                buf[8], buf[9], buf[10], buf[11] = load4(sm, so + o0 + uint32(1024))
                buf[12], buf[13], buf[14], buf[15] = load4(sm, so + o1 + uint32(1024))
                for i in range(4):
                    cf[i] = float32(0.0)
                for h in range(2):                 # the lane's two 16-byte pieces, 8 mmas each
                    for i in range(8):
                        wa, wb = buf[4 * h + (i >> 1)], buf[8 + 4 * h + (i >> 1)]
                        sel0, sel1 = uint32(0x5504 | (2 * (i & 1)) << 4), uint32(0x5504 | (2 * (i & 1) + 1) << 4)
                        A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                        A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                        A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                        A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                    if g == q:
                        x_get(xr, sm, xa, h)
                    for i in range(8):
                        cf[0], cf[1], cf[2], cf[3] = mma(A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3],
                                                         xr[2 * i], xr[2 * i + 1], cf[0], cf[1], cf[2], cf[3])
                raw = st[0]
                wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
                ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
                sh = uint32(16) * (q & uint32(1))
                if q < uint32(2):
                    for i in range(4):
                        code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                        a2 = ag if i < 2 else ag8
                        s[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]), f32_from_bits(a2)), offset)
                    acc[0] += cf[0] * s[0] + cf[1] * s[1]
                    acc[1] += cf[2] * s[2] + cf[3] * s[3]
                syncwarp()                     # the next step's x into the slot, once every lane has read this step's
                x_put(sm, xs, xq)
                syncwarp()
                for j in range(NXM):
                    xq[j] = xq[j + 4]
                for j in range(D):
                    st[j] = st[j + 1]
                sc, sp = uint32(sc + uint32(1)), uint32(sp + uint32(1))
                if sc == uint32(S):
                    sc, ph = uint32(0), ph ^ uint32(1)
                if sp == uint32(S):
                    sp = uint32(0)
                c = cn
                if tn != t:
                    break
            base_ = uint32(parity * uint32(W * 16) + warp * uint32(16))
            a0 = acc[0] + shfl_xor_sync(0xFFFFFFFF, acc[0], 1)
            a1 = acc[1] + shfl_xor_sync(0xFFFFFFFF, acc[1], 1)
            if q == uint32(0):
                sm[spare(base_ + g)] = ops.float_bits(a0)
                sm[spare(base_ + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16):
                first, v = uint32(parity * uint32(W * 16) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16))])
                row = uint32(t * uint32(16) + tid)
                if row < n:
                    y[row] = half_bits(v)
            parity, t = parity ^ uint32(1), tn

    return gemv_tma


_TMAPS: dict = {}


def tensor_map(g):
    """A device copy of the 128-byte tensor map of W's packed bytes (K/2 columns x N rows of uint8, 128 x 16 boxes,
    128-byte swizzle), made once per weight buffer."""
    addr = gemv.address(g.packed_u32)
    key = (addr, g.N, g.K, cuda.get_current_device().id)
    if key not in _TMAPS:
        from numba.cuda.cudadrv.driver import binding as drv

        u64, u32 = drv.cuuint64_t, drv.cuuint32_t
        err, tm = drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, addr, [u64(g.K // 2), u64(g.N)],
            [u64(g.K // 2)], [u32(128), u32(16)], [u32(1), u32(1)],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled: {err}")
        words = np.array([int(v) for v in tm.opaque], dtype=np.uint64)
        if words.size != 16:
            raise RuntimeError(f"a tensor map is 128 bytes; got {words.size} words")
        _TMAPS[key] = cuda.to_device(words)
    return _TMAPS[key]


def prepare(kern, args, nbytes, carveout=None):
    """Dynamic shared memory past 48 KB; ``carveout``: the percentage of the SM's 256 KB asked for shared memory
    (the largest, 100, shrinks L1 to 28 KB, where the statistics live: +6 us once, lab/README)."""
    from numba.cuda.cudadrv.driver import binding, driver

    argtypes = tuple(kern.typeof_pyval(a) for a in args)
    done = kern.__dict__.setdefault("_smem_ready", set())
    if (argtypes, nbytes) not in done:
        f = kern.compile(argtypes)._codelibrary.get_cufunc()
        A = binding.CUfunction_attribute
        driver.cuKernelSetAttribute(A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes), f.handle, f.device.id)
        if carveout is not None:   # else the driver's choice, which leaves L1 as large as the blocks allow
            driver.cuKernelSetAttribute(A.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carveout, f.handle,
                                        f.device.id)
        done.add((argtypes, nbytes))
    return kern


def applies(g) -> bool:
    return (g.M == 1 and g.K % 256 == 0 and g.K >= 2048
            and gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)))


def launcher(S, min_blocks=gemv.BLOCKS_PER_SM, carveout=None):
    def launch(g):
        gemv.validate(g)
        if not applies(g):
            raise ValueError("lab gemv_tma: M = 1, K % 256 == 0, K >= 2048, the statistics word")
        args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift,
                tensor_map(g))
        kern = prepare(make_tma_kernel(g.dtype == "bf16", gemv.probe_base(), S, min_blocks, carveout), args, smem_bytes(S), carveout)
        kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, smem_bytes(S)](*args)

    return launch


# name -> (stages a warp, blocks per SM, carveout); 3 stages need the largest carveout for 2 blocks an SM
VARIANTS = {"TC tma2": (2, 2, None), "TC tma2 carve": (2, 2, 100), "TC tma3 carve": (3, 2, 100)}


def sass() -> int:
    """Offline (NF4LAB_MODE=compile): ptxas -v and the SASS instructions a step of each variant, sm_90."""
    import collections
    import re
    import tempfile
    from pathlib import Path

    from lab.gemv_reports import _instructions, opcode, sass_of

    def step_loop(sa):   # the loop with the most HMMA: from a backward branch's target to the branch
        ins, best = _instructions(sa), []
        for i, (a, t) in enumerate(ins):
            m = re.search(r"BRA (0x[0-9a-f]+)", t)
            if m and int(m.group(1), 16) <= a:
                j = next(j for j, (b, _) in enumerate(ins) if b >= int(m.group(1), 16))
                body = [x for _, x in ins[j:i + 1]]
                if sum("HMMA" in x for x in body) > sum("HMMA" in x for x in best):
                    best = body
        return best
    from nf4lab.measure import ptx as mptx

    sig = (*gemv.signature(), types.uint64[::1])
    work = Path(tempfile.mkdtemp())
    for name, (S, B, _) in {"TC": (None, 2, None), **VARIANTS}.items():
        for dt in ("bf16",):
            if S is None:
                k, sg = gemv.make_kernel(dt == "bf16", 1, 0x400, True), gemv.signature()
            else:
                k, sg = make_tma_kernel(dt == "bf16", 0x400, S, B), sig
            text = mptx.compile_ptx(k, sg, cc=(9, 0))
            info, sa = sass_of(text, work, name.replace(" ", "_"))
            print(f"{name} {dt}: {' '.join(l.strip() for l in info.splitlines() if 'registers' in l or 'spill' in l)}")
            step = step_loop(sa)
            ops_ = collections.Counter(opcode(t).split(".")[0] for t in step)
            print(f"    step loop: {len(step)} SASS, " + ", ".join(f"{k} {v}" for k, v in ops_.most_common(12)))
    return 0


def smoke(say) -> int:
    """GPU: each variant against the shipped kernel's bits on small cases that wrap the rings across tiles (partial
    last tile, 17 steps a tile so warp 0 takes 3 and the others 2, few blocks with several tiles each)."""
    from nf4lab.harness import gemv_check

    bad = 0
    for N, K, dtype, G in ((37, 2048, "bf16", 1), (300, 4352, "fp16", 3), (1000, 4096, "bf16", 7), (64, 8192, "bf16", 2)):
        gc = gemv_check.make_gemv_case(N, K, dtype, seed=11)
        g = dataclasses.replace(gemv.make_gemv_buffers(gc), grid=G)
        gemv.launch(g)
        ref = g.result().copy()
        for name, v in VARIANTS.items():
            g.y.copy_to_device(np.full(N, 0x7FBF, np.uint16))
            launcher(*v)(g)
            same = np.array_equal(g.result(), ref)
            say(f"smoke {N}x{K} {dtype} grid {G} {name}: shipped bits {same}")
            bad += not same
    return bad


def bench() -> int:
    """GPU: the shipped kernel and the TMA variants at SHAPES, M = 1, CUDA-graph GPU time over weight copies
    totalling > 4x L2, timed twice in turn (A B A B) in one process, the read bound in the same process; each output
    checked against float64 and bit-compared with the shipped kernel (bf16 and fp16)."""
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure")
        return 2
    import bitsandbytes.functional as F
    import torch

    import lab.gemv_read_bound as rb
    from lab.gemv_peers import READ_CONFIGS, copies_for, cycled, read_bound
    from nf4lab.measure import bench as nbench
    from nf4lab.measure import gemv_bench

    t0, log, bad = time.time(), [], 0

    def say(s):
        log.append(s := f"[{time.time() - t0:5.1f} s] {s}")
        print(s, flush=True)

    say(nf4lab.describe())
    bad = smoke(say)
    run = nbench.Run(method=nbench.METHOD + "; weights cycled over copies totalling > 4x L2; all kernels in one process")
    run.meta.update(checks=[], smoke_failures=bad, default_kernel=gemv_bench.kernel_name("TC"), variants={k: {"stages": v[0],
                    "blocks_per_sm": v[1], "carveout": v[2], "smem_bytes": smem_bytes(v[0])} for k, v in VARIANTS.items()})
    readers = {u: rb.make_reader(u) for u in sorted({u for u, _ in READ_CONFIGS})}
    sms, l2 = gemv.sms(), nf4lab.device_info().get("l2_bytes") or (50 << 20)
    fns = {"TC": gemv.launch, **{name: launcher(*v) for name, v in VARIANTS.items()}}
    for N, K in SHAPES:
        bound = read_bound(N, K, sms, l2, readers, say)
        run.records.append(bound)
        nb, grid = gemv_bench.weight_bytes(N, K), gemv.grid_size(N)
        copies = copies_for(nb, l2)
        for dtype in ("bf16", "fp16"):
            data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]
            q0, x = data[0][1], data[0][2]
            q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
            w64 = F.dequantize_4bit(data[0][0], q32).double()
            y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
            outs, calls, times, checks = {}, {}, {}, {}
            for name, fn in fns.items():
                y = torch.empty(1, N, dtype=x.dtype, device="cuda")
                bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code,
                                                q.offset.item(), q.blocksize, y) for p, q, _ in data]
                try:
                    for b in bufs:      # compiles, and makes every tensor map before the graph capture
                        fn(b)
                    y.fill_(float("nan"))
                    fn(bufs[0])
                    torch.cuda.synchronize()
                except Exception as e:
                    say(f"{N}x{K} {dtype} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                    bad += 1
                    if "CUDA_ERROR" in str(e) or "trap" in str(e).lower():
                        raise
                    continue
                outs[name] = y.clone()
                checks[name] = dict(gemv_bench._gpu_check(y, y64, tol, gemv_bench.kernel_name(name)), shape=[N, K],
                                    dtype=dtype, M=1)
                run.meta["checks"].append(checks[name])
                calls[name] = (lambda i, s, fn=fn, bufs=bufs: fn(dataclasses.replace(bufs[i], stream=s)))
            if dtype == "bf16":
                for name in [*calls, *calls]:
                    times.setdefault(name, []).append(cycled(calls[name], copies))
            line = f"{N}x{K} {dtype} grid {grid} (read bound {bound['ms'] * 1e3:.2f} us):"
            for name in calls:
                chk = checks[name]
                extra = {} if name == "TC" else {
                    "bits_equal_shipped": bool(torch.equal(outs[name].view(torch.int16), outs["TC"].view(torch.int16)))}
                bad += (not chk["ok"]) + (extra.get("bits_equal_shipped") is False)
                if name in times:
                    ts = times[name]
                    run.add(nbench._record("kernel", chk["name"], (N, K), dtype, ts[0], nb, within_tol=chk["ok"],
                                           copies=copies, fits_l2=False, M=1, grid=grid, ms_again=ts[1]["ms"],
                                           pct_bound=100 * bound["ms"] / ts[0]["ms"], **extra))
                    line += f" {name} {ts[0]['ms'] * 1e3:.2f} / {ts[1]['ms'] * 1e3:.2f} us"
                    line += f" ({100 * bound['ms'] / ts[0]['ms']:.0f}% of bound)"
                else:
                    line += f" {name}"
                line += f" [ok {chk['ok']}" + "".join(f", {k} {v}" for k, v in extra.items()) + "];"
            say(line)
            del data, w64, y64, tol
            torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    path = run.save(NAME)
    say(f"saved {path}; outside tolerance, failed or bits unlike the shipped kernel's: {bad}")
    path.with_suffix(".log").write_text("\n".join(log) + "\n")
    if os.environ.get("OUT"):   # the device tool brings back files <= 2 folders down
        os.makedirs(dst := os.path.join(os.environ["OUT"], path.parent.name), exist_ok=True)
        for p in (path, path.with_suffix(".log")):
            shutil.copy(p, dst)
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    for m in ("sass", "bench"):
        mode.add_argument(f"--{m}", action="store_true")
    args = ap.parse_args()
    sys.exit(sass() if args.sass else bench())
