"""The design space around notebook 06's dequantization kernel (GPU; the record of how its shape was chosen).

Variants of the bf16 kernel, each verified bit for bit (bounds excepted), timed with the harness in one run
beside the copy/fill ceilings and bitsandbytes. Names in the records:

  w{K}x{T}      each thread converts K u32 words (8 weights each) at stride T inside its block's tile, all K
                loads issued before the first store; one 16-byte store per word (each warp's stores cover
                512 contiguous bytes); "cs": streaming stores (st.global.cs)
  bound: ...    the variants' codes in and output out with no arithmetic and no absmax_q (output garbage,
                not verified; its record carries the full byte model, 07 recounts it)

One experiment per command, each writing data/results/<gpu>/<record>.json. Notebooks 06 and 07 read the
tuning_round* records, so an experiment keeps its first run's record name only while its variants are the same:

    python -m lab.tune_best_kernel load-store-hints        # tuning_round4.json
    python -m lab.tune_best_kernel scale-loads             # tuning_scale_loads.json (tuning_round5's lab kernels)
    python -m lab.tune_best_kernel traffic-bounds          # tuning_round6.json
    python -m lab.tune_best_kernel block-shape             # tuning_round7_<shape>.json, three LLM shapes
    python -m lab.tune_best_kernel block-shape 4096 14336  # one shape

Notebook 06's kernel comes from the notebook's kernel cells through nf4lab's loader, its launch shape set as
module attributes (lab.wall_small_shapes.nb06). The records' "06 ..." variants of tuning_round5*.json (06 with
textual edits, at commit 8a3ce2b, and the fp32 block shapes) and the variants of rounds 1-3 are in git only:
see lab/README.md.
"""
from __future__ import annotations

import sys

import numpy as np

import nf4lab  # first: decides GPU or simulator
from llvmlite import ir as _ir
from nf4lab.device import ops
from nf4lab.measure import bench
from numba import cuda, float32, uint32, uint64
from numba import types as _types
from numba.cuda.extending import intrinsic as _intrinsic


@cuda.jit(device=True, inline="always")
def scale(code2, absmax_q, absmax2, blk, offset):
    """Block blk's scale, rounded as bitsandbytes rounds it (two separately rounded float32 operations)."""
    return ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)


@cuda.jit(device=True, inline="always")
def bf16_word(lut, x, s):
    """One u32 word's 8 codes (high nibble first) as 4 bf16x2 words: 16 output bytes."""
    return (ops.pack_bf16x2(lut[(x >> 4) & 15] * s, lut[x & 15] * s),
            ops.pack_bf16x2(lut[(x >> 12) & 15] * s, lut[(x >> 8) & 15] * s),
            ops.pack_bf16x2(lut[(x >> 20) & 15] * s, lut[(x >> 16) & 15] * s),
            ops.pack_bf16x2(lut[(x >> 28) & 15] * s, lut[(x >> 24) & 15] * s))


def make_words(K, T, store=ops.store_u32x4):
    """w{K}x{T}: K words a thread at stride T, all loads before the first store (a grid-stride loop over tiles)."""
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
                    s = scale(code2, absmax_q, absmax2, blk, offset)
                    x = words[j]
                    o0, o1, o2, o3 = bf16_word(lut, x, s)
                    store(out_u32, w * uint64(4), o0, o1, o2, o3)
            tile += uint64(cuda.gridDim.x)

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        grid = (nwords + T * K - 1) // (T * K)
        kern[grid, T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut, b.out_u32,
                                uint64(nwords))
    return launch


def make_expand_bound(K, T, store=ops.store_u32x4):
    """The w-variants' codes and output with no arithmetic, the bound of this access pattern; it reads no
    ``absmax_q``, so its record (credited the full byte model) runs high by absmax_q's share (07 recounts it)."""
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


# ---- L2 prefetch hints on the loads, and bulk (TMA) stores from shared memory -------------------
if nf4lab.SIMULATOR:
    def ld_u32_l2_256(arr, i):
        return arr[i]

    def smem_fence_async():
        pass

    def bulk_store(out_u32, word, stage, off, nwords):
        for k in range(nwords):
            out_u32[word + k] = stage[off + k]

    def bulk_commit_wait():
        pass

    def st_shared_v4(arr, i, a, b, c, d):
        arr[i], arr[i + 1], arr[i + 2], arr[i + 3] = a, b, c, d

    def smem_align_offset(arr):
        return 0
else:
    def _ptr(context, builder, aryty, val, idx=None):
        from numba.cuda import cgutils
        ary = context.make_array(aryty)(context, builder, val)
        if idx is None:
            return ary.data
        return cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)

    @_intrinsic
    def ld_u32_l2_256(typingctx, arr, i):
        sig = _types.uint32(arr, i)

        def codegen(context, builder, sig, args):
            addr = builder.ptrtoint(_ptr(context, builder, sig.args[0], args[0], args[1]), _ir.IntType(64))
            asm = _ir.InlineAsm(_ir.FunctionType(_ir.IntType(32), [_ir.IntType(64)]),
                                "ld.global.nc.L2::256B.u32 $0, [$1];", "=r,l")
            return builder.call(asm, [addr])
        return sig, codegen

    def _void_asm(text):
        @_intrinsic
        def f(typingctx):
            sig = _types.void()

            def codegen(context, builder, sig, args):
                asm = _ir.InlineAsm(_ir.FunctionType(_ir.VoidType(), []), text, "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()
            return sig, codegen
        return f

    smem_fence_async = _void_asm("fence.proxy.async.shared::cta;")
    bulk_commit_wait = _void_asm("cp.async.bulk.commit_group; cp.async.bulk.wait_group.read 0;")

    @_intrinsic
    def smem_align_offset(typingctx, arr):
        """Words to skip so that the shared array's data is 16-byte aligned."""
        sig = _types.uint32(arr)

        def codegen(context, builder, sig, args):
            addr = builder.ptrtoint(_ptr(context, builder, sig.args[0], args[0]), _ir.IntType(64))
            mis = builder.and_(addr, _ir.Constant(_ir.IntType(64), 15))
            off = builder.and_(builder.sub(_ir.Constant(_ir.IntType(64), 16), mis), _ir.Constant(_ir.IntType(64), 15))
            return builder.trunc(builder.lshr(off, _ir.Constant(_ir.IntType(64), 2)), _ir.IntType(32))
        return sig, codegen

    @_intrinsic
    def st_shared_v4(typingctx, arr, i, a, b, c, d):
        sig = _types.void(arr, i, _types.uint32, _types.uint32, _types.uint32, _types.uint32)

        def codegen(context, builder, sig, args):
            v4 = _ir.VectorType(_ir.IntType(32), 4)
            p = builder.bitcast(_ptr(context, builder, sig.args[0], args[0], args[1]), _ir.PointerType(v4))
            vec = _ir.Constant(v4, None)
            for k, v in enumerate(args[2:]):
                vec = builder.insert_element(vec, v, _ir.Constant(_ir.IntType(32), k))
            builder.store(vec, p, align=16)
            return context.get_dummy_value()
        return sig, codegen

    @_intrinsic
    def bulk_store(typingctx, out, word, stage, off, nwords):
        sig = _types.void(out, word, stage, off, nwords)

        def codegen(context, builder, sig, args):
            i64 = _ir.IntType(64)
            g = builder.ptrtoint(_ptr(context, builder, sig.args[0], args[0], args[1]), i64)
            sh = builder.ptrtoint(_ptr(context, builder, sig.args[2], args[2], args[3]), i64)
            nb = builder.trunc(builder.mul(context.cast(builder, args[4], sig.args[4], _types.uint64),
                                           _ir.Constant(i64, 4)), _ir.IntType(32))
            asm = _ir.InlineAsm(_ir.FunctionType(_ir.VoidType(), [i64, i64, _ir.IntType(32)]),
                                "{ .reg .u64 ga, sa; cvta.to.global.u64 ga, $0; cvta.to.shared.u64 sa, $1; "
                                "cp.async.bulk.global.shared::cta.bulk_group [ga], [sa], $2; }",
                                "l,l,r,~{memory}", side_effect=True)
            builder.call(asm, [g, sh, nb])
            return context.get_dummy_value()
        return sig, codegen


def make_words_l2(K, T, store=ops.store_u32x4_cs, bound=False):
    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords):
        lut = cuda.shared.array(16, float32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        cuda.syncthreads()
        base = uint64(cuda.blockIdx.x) * uint64(T * K) + uint64(tid)
        words = cuda.local.array(K, uint32)
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                words[j] = ld_u32_l2_256(packed_u32, w)
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                x = words[j]
                if bound:
                    store(out_u32, w * uint64(4), x, x ^ uint32(1), x ^ uint32(2), x ^ uint32(3))
                else:
                    blk = w >> uint64(3)
                    s = scale(code2, absmax_q, absmax2, blk, offset)
                    o0, o1, o2, o3 = bf16_word(lut, x, s)
                    store(out_u32, w * uint64(4), o0, o1, o2, o3)

    def launch(b):
        nwords = b.n // 8
        kern[(nwords + T * K - 1) // (T * K), T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                           b.lut, b.out_u32, uint64(nwords))
    launch.no_verify = bound
    return launch


def make_bulk(K, T, prefetch=False):
    """Each block stages its T*K*16 output bytes in shared memory; one thread bulk-copies them (TMA)."""
    STAGE = T * K * 4 + 4

    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords):
        lut = cuda.shared.array(16, float32)
        stage = cuda.shared.array(STAGE, uint32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        off = smem_align_offset(stage)
        tile0 = uint64(cuda.blockIdx.x) * uint64(T * K)
        base = tile0 + uint64(tid)
        words = cuda.local.array(K, uint32)
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                words[j] = ld_u32_l2_256(packed_u32, w) if prefetch else packed_u32[w]
        cuda.syncthreads()
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                blk = w >> uint64(3)
                s = scale(code2, absmax_q, absmax2, blk, offset)
                x = words[j]
                o0, o1, o2, o3 = bf16_word(lut, x, s)
                st_shared_v4(stage, off + uint32(4 * (j * T + tid)), o0, o1, o2, o3)
        smem_fence_async()
        cuda.syncthreads()
        if tid == 0:
            valid = nwords - tile0
            if valid > uint64(T * K):
                valid = uint64(T * K)
            bulk_store(out_u32, tile0 * uint64(4), stage, off, valid * uint64(4))
            bulk_commit_wait()

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        kern[(nwords + T * K - 1) // (T * K), T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                           b.lut, b.out_u32, uint64(nwords))
    return launch


# ---- what holds notebook 06's kernel below the bounds: scale loads, contiguous chunks per block ------------
def fastkernel_launch(dtype):
    """nf4lab.dequantize's kernel (nested statistics, vector path) on the harness' buffers."""
    from numba import cuda as _cuda
    from nf4lab.kernels import fastkernel

    state = {}

    def launch(b):
        if "offset" not in state:
            state["offset"] = _cuda.to_device(np.array([b.offset], np.float32))
        fastkernel.launch_arrays(b.packed, b.absmax_q, b.absmax2, b.code2, state["offset"], b.lut, b.out, n=b.n,
                                 blocksize=b.blocksize, nested=True, dtype=dtype, stream=b.stream, path="vector")
    return launch


def make_words_chunked(K, T, per_sm, scales_first=False):
    """Persistent blocks, each owning one contiguous run of tiles (not a grid stride):
    per_sm blocks per SM, so DRAM sees per_sm * SMs sequential streams.
    scales_first: the absmax bytes and absmax2 of all K words are loaded with the words."""
    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords, tiles_per_block):
        lut = cuda.shared.array(16, float32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        cuda.syncthreads()
        tile = uint64(cuda.blockIdx.x) * tiles_per_block
        stop = tile + tiles_per_block
        while tile < stop and tile * uint64(T * K) < nwords:
            base = tile * uint64(T * K) + uint64(tid)
            words = cuda.local.array(K, uint32)
            qs = cuda.local.array(K, uint32)
            a2 = cuda.local.array(K, float32)
            for j in range(K):
                w = base + uint64(j * T)
                if w < nwords:
                    words[j] = packed_u32[w]
                    if scales_first:
                        qs[j] = absmax_q[w >> uint64(3)]
                        a2[j] = absmax2[w >> uint64(11)]
            for j in range(K):
                w = base + uint64(j * T)
                if w < nwords:
                    blk = w >> uint64(3)
                    if scales_first:
                        s = ops.fadd_rn(ops.fmul_rn(code2[qs[j]], a2[j]), offset)
                    else:
                        s = scale(code2, absmax_q, absmax2, blk, offset)
                    x = words[j]
                    o0, o1, o2, o3 = bf16_word(lut, x, s)
                    ops.store_u32x4(out_u32, w * uint64(4), o0, o1, o2, o3)
            tile += uint64(1)

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        tiles = (nwords + T * K - 1) // (T * K)
        grid = min(tiles, per_sm * (nf4lab.device_info()["sms"] or 1))
        kern[grid, T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut, b.out_u32,
                                uint64(nwords), uint64((tiles + grid - 1) // grid))
    return launch


def make_words_scales_first(K, T):
    """make_words, with each thread's absmax bytes and absmax2 loaded together with its words."""
    @cuda.jit
    def kern(packed_u32, absmax_q, absmax2, code2, offset, lut_g, out_u32, nwords):
        lut = cuda.shared.array(16, float32)
        tid = cuda.threadIdx.x
        if tid < 16:
            lut[tid] = lut_g[tid]
        cuda.syncthreads()
        base = uint64(cuda.blockIdx.x) * uint64(T * K) + uint64(tid)
        words = cuda.local.array(K, uint32)
        qs = cuda.local.array(K, uint32)
        a2 = cuda.local.array(K, float32)
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                words[j] = packed_u32[w]
                qs[j] = absmax_q[w >> uint64(3)]
                a2[j] = absmax2[w >> uint64(11)]
        for j in range(K):
            w = base + uint64(j * T)
            if w < nwords:
                s = ops.fadd_rn(ops.fmul_rn(code2[qs[j]], a2[j]), offset)
                x = words[j]
                o0, o1, o2, o3 = bf16_word(lut, x, s)
                ops.store_u32x4(out_u32, w * uint64(4), o0, o1, o2, o3)

    def launch(b):
        nwords = b.n // 8
        assert b.n % 8 == 0 and b.blocksize == 64 and b.dtype == "bf16"
        kern[(nwords + T * K - 1) // (T * K), T, b.stream](b.packed_u32, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                           b.lut, b.out_u32, uint64(nwords))
    return launch


def make_mix_bound(T, stores=4):
    """A bound with the copy's own access style: each thread one 16-byte load and `stores` 16-byte
    stores (each warp store 512 contiguous bytes), no arithmetic. stores=4 moves NF4's packed codes and
    output (n/2 in, 2n out, no absmax_q) as 16-byte reads; stores=1 is the device copy itself, for calibration."""
    @cuda.jit
    def kern(packed_u32, out_u32, nvec):
        v = uint64(cuda.blockIdx.x) * uint64(T) + uint64(cuda.threadIdx.x)
        if v < nvec:
            a, b, c, d = ops.load_u32x4(packed_u32, v * uint64(4))
            tile = uint64(cuda.blockIdx.x) * uint64(T * stores)
            for j in range(stores):
                ops.store_u32x4(out_u32, (tile + uint64(j * T) + uint64(cuda.threadIdx.x)) * uint64(4),
                                a, b ^ uint32(j), c, d)

    def launch(b):
        nvec = (b.n // 2) // 16 * 4 // stores   # 16-byte outputs = 2n / 16 / stores loads
        kern[(nvec + T - 1) // T, T, b.stream](b.packed_u32, b.out_u32, uint64(nvec))
    launch.no_verify = True
    return launch


def nb06(units=None, threads=None):
    """Notebook 06's kernel (all dtypes), at its own launch shape or at ``units`` x ``threads``."""
    if units is None:
        from nf4lab.harness import versions

        return versions.load_module("06_output_dtypes").launch
    from lab.wall_small_shapes import nb06 as at_shape

    return at_shape(threads, units)


def variants_load_store_hints():
    """L2::256B prefetch hints on the word loads, streaming stores, and bulk (TMA) stores from shared memory."""
    cs = ops.store_u32x4_cs
    return {
        "w2x512 cs": make_words(2, 512, cs),
        "w1x256 cs": make_words(1, 256, cs),
        "L2::256B loads w1x256 cs": make_words_l2(1, 256),
        "L2::256B loads w2x512 cs": make_words_l2(2, 512),
        "L2::256B loads w4x256 cs": make_words_l2(4, 256),
        "bound: L2::256B loads, expand w1x256 cs": make_words_l2(1, 256, bound=True),
        "bound: L2::256B loads, expand w2x512 cs": make_words_l2(2, 512, bound=True),
        "bulk (TMA) store w2x256": make_bulk(2, 256),
        "bulk (TMA) store w4x256": make_bulk(4, 256),
        "bulk (TMA) store w2x512 + L2::256B": make_bulk(2, 512, prefetch=True),
        "bulk (TMA) store w8x128 + L2::256B": make_bulk(8, 128, prefetch=True),
    }


def variants_scale_loads():
    """The scale's loads issued with the words ("scales first"), persistent blocks that each own one contiguous
    run of tiles ("chunked"), beside nf4lab.dequantize's kernel."""
    return {
        "nf4lab.dequantize kernel": fastkernel_launch("bf16"),
        "w2x512": make_words(2, 512),
        "w2x512 scales first": make_words_scales_first(2, 512),
        "w4x256 scales first": make_words_scales_first(4, 256),
        "chunked w2x512, 4/SM": make_words_chunked(2, 512, 4),
        "chunked w2x512, 4/SM, scales first": make_words_chunked(2, 512, 4, scales_first=True),
        "chunked w2x256, 8/SM": make_words_chunked(2, 256, 8),
        "chunked w4x128, 16/SM, scales first": make_words_chunked(4, 128, 16, scales_first=True),
    }


def variants_traffic_bounds():
    """Bounds of notebook 06's traffic in two access styles (no arithmetic), beside 06's kernel."""
    return {
        "bound: 16B load + 4 coalesced 16B stores x256": make_mix_bound(256),
        "bound: 16B load + 4 coalesced 16B stores x512": make_mix_bound(512),
        "bound: expand u32 -> 16 B, w2x512": make_expand_bound(2, 512),
        "bound: expand u32 -> 16 B, w1x256": make_expand_bound(1, 256),
        "06 best kernel": nb06(),
    }


def variants_block_shape():
    """Block shape (units x threads) of notebook 06's kernel at the LLM weight shapes, where the last partial
    wave of blocks is a larger share of the time than at 16384x16384."""
    out = {f"06 {units}x{threads}": nb06(units, threads)
           for units, threads in ((2, 512), (1, 512), (2, 256), (1, 256), (4, 128), (2, 128), (1, 1024))}
    out["nf4lab.dequantize kernel"] = fastkernel_launch("bf16")
    return out


# experiment: (variants, record name, shapes: None = the case's default 16384x16384)
EXPERIMENTS = {
    "load-store-hints": (variants_load_store_hints, "tuning_round4", None),
    "scale-loads": (variants_scale_loads, "tuning_scale_loads", None),
    "traffic-bounds": (variants_traffic_bounds, "tuning_round6", None),
    "block-shape": (variants_block_shape, "tuning_round7", [(4096, 14336), (8192, 28672), (16384, 16384)]),
}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", choices=list(EXPERIMENTS))
    ap.add_argument("shape", nargs="*", type=int, help="ROWS COLS (default: the experiment's shapes)")
    ap.add_argument("--name", help="record name (default: the experiment's)")
    a = ap.parse_args(argv)
    make, record, shapes = EXPERIMENTS[a.experiment]
    if a.shape and len(a.shape) != 2:
        ap.error("shape: ROWS COLS")
    shapes = [tuple(a.shape)] if a.shape else (shapes or [None])
    if not nf4lab.ON_GPU and not a.shape:
        shapes = [(64, 1024)]   # the simulator: whole words and 16384-weight groups, as the w-kernels assume
    print(nf4lab.describe(), flush=True)
    for shape in shapes:
        case = nf4lab.make_case(shape, "bf16", "randn", 0)
        print(case, flush=True)
        if not nf4lab.ON_GPU:  # the simulator checks the variants' bits; bounds only time (whole tiles of 16384^2)
            for name, launch in make().items():
                if not getattr(launch, "no_verify", False):
                    print(nf4lab.run_and_verify(launch, case, name=name))
            continue
        run = bench.run_versions(make(), case)
        suffix = f"_{shape[0]}x{shape[1]}" if len(shapes) > 1 else ""
        path = run.save((a.name or record) + suffix)
        print(run.table())
        print("saved", path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
