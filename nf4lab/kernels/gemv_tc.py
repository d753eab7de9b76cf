"""The tensor-core NF4 GEMV (sm_80+): table lookups feed ``mma.sync``, so the products cost no FMA-pipe slots.

The FFMA design (:func:`nf4lab.kernels.gemv.make_gemv`) spends ~4.4 SASS instructions per weight: per code
byte a shared-memory pair lookup, two FFMAs and the address math. Here a code byte costs one PRMT (its table
address) and one 32-bit shared load whose result, a bf16x2 (or f16x2) pair of the two codes' values, is
already an mma A-fragment register: ~2.7 instructions per weight. The tensor core multiplies by x and sums
in float32 (each product exact), more accurate than bitsandbytes' gemv_4bit, which rounds weights and
products to bf16/fp16; the one extra rounding is the table's: each NF4 value in bf16/fp16.

One warp step is 16 rows x 256 columns. Lane (g, q) = (lane >> 2, lane & 3) reads two 16-byte pieces (32
codes each) of rows 16t + g and 16t + g + 8 (where: see ``fetch``). Piece h feeds 8 mmas; mma i takes its
bytes 2i, 2i + 1: logical k = 2q, 2q + 1 <-> columns 4i, 4i + 1 of the piece and k = 2q + 8, 2q + 9 <->
4i + 2, 4i + 3 (a sum does not care about the order of k; B follows the same order). B column n = 4 mm + b
holds batch row mm's x where the column lies in the step's 64-column scale block b, else 0, so C[row, 4 mm + b]
is block b's sum, scaled once per step in float32. Warps split K (warp w takes steps w, w + 8, ...) and meet
in shared memory once per 16 rows.

The table holds one copy per lane (no bank conflicts) in 256-byte rows, so the address of byte p of a code
word w is one PRMT, ``(w.byte p) << 8 | lane << 2``; the shared window's base rides in the load's immediate
(:func:`probe_base`), so a lookup has no add. 64 KB of dynamic shared memory per block.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from . import arch, gemv, ops
from numba import cuda, float32, uint32, uint64  # noqa: E402  (module globals: the simulator swaps them in kernels)

THREADS = 256
W = THREADS // 32
TAB_WORDS = 256 * 64            # entry e, lane l at word (e << 6) | l; words 32..63 of each row unused
MMA_CC = (8, 0)                 # mma.sync m16n8k16 with bf16 needs sm_80
BLOCKS_PER_SM = 2               # 116 registers, 68 KB of shared memory: measured best (lab/gemv_mma.py)


def dynamic_smem(M) -> int:
    """Bytes of dynamic shared memory a launch asks for: table, 16 values, code2, partial sums."""
    return 4 * (TAB_WORDS + 16 + 256 + 2 * W * 16 * M)


def available(cc=None) -> bool:
    """Whether the tensor-core kernel serves on this GPU (and under NF4LAB_ARCH), else the FFMA design."""
    if runtime.SIMULATOR:
        return False
    cc = tuple(cc) if cc is not None else arch.target_cc()
    if arch.FORCED is not None:
        cc = min(cc, arch.FORCED)
    return cc >= MMA_CC


# ---------------------------------------------------------------- device ops and their plain-Python twins
def _py_prmt(a, b, sel):
    pool = (int(a) & 0xFFFFFFFF) | ((int(b) & 0xFFFFFFFF) << 32)
    out = 0
    for k in range(4):
        out |= ((pool >> (8 * ((int(sel) >> (4 * k)) & 7))) & 0xFF) << (8 * k)
    return np.uint32(out)


def _py_lookup(tab, off):
    return np.uint32(np.asarray(tab).view(np.uint32)[int(off) >> 2])


def _halves(u, is_bf16):
    u = int(u)
    if is_bf16:
        return [float(np.uint32((u & 0xFFFF) << 16).view(np.float32)), float(np.uint32(u & 0xFFFF0000).view(np.float32))]
    return [float(np.uint16(u & 0xFFFF).view(np.float16)), float(np.uint16(u >> 16).view(np.float16))]


def _py_mma(is_bf16, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """mma.sync.m16n8k16.row.col with float32 accumulation, from the whole warp's fragments (PTX ISA layout)."""
    import threading

    lanes = gemv._py_warp_exchange((a0, a1, a2, a3, b0, b1), None, "mma")
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for ln, (r0, r1, r2, r3, s0, s1) in enumerate(lanes):
        g, q = ln >> 2, ln & 3
        A[g, 2 * q:2 * q + 2], A[g + 8, 2 * q:2 * q + 2] = _halves(r0, is_bf16), _halves(r1, is_bf16)
        A[g, 2 * q + 8:2 * q + 10], A[g + 8, 2 * q + 8:2 * q + 10] = _halves(r2, is_bf16), _halves(r3, is_bf16)
        B[2 * q:2 * q + 2, g], B[2 * q + 8:2 * q + 10, g] = _halves(s0, is_bf16), _halves(s1, is_bf16)
    D = A @ B
    lane = threading.current_thread().thread_id % 32
    g, q = lane >> 2, lane & 3
    return (np.float32(c0 + D[g, 2 * q]), np.float32(c1 + D[g, 2 * q + 1]),
            np.float32(c2 + D[g + 8, 2 * q]), np.float32(c3 + D[g + 8, 2 * q + 1]))


def _py_mma_bf16(*args):
    return _py_mma(True, *args)


def _py_mma_f16(*args):
    return _py_mma(False, *args)


def _dyn_symbol(builder):
    from llvmlite import ir

    mod = builder.module
    gv = mod.globals.get("nf4lab_dyn_smem")
    if gv is None:  # every extern shared array starts where the block's dynamic shared memory does
        gv = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(8), 0), "nf4lab_dyn_smem", addrspace=3)
        gv.linkage = "external"
        gv.align = 16
    return gv


def _build_device_ops():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, f32 = ir.IntType(32), ir.FloatType()

    def make_mma(ptype):
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, sig, args):
                vals = [context.cast(builder, v, t, t) for v, t in zip(args, sig.args)]
                fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
                asm = ir.InlineAsm(fty, f"mma.sync.aligned.m16n8k16.row.col.f32.{ptype}.{ptype}.f32 "
                                        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                                   "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
                # Below sm_80 (a T4) there is no such mma: that code traps, and gemv never dispatches it there
                # (available()); it exists so that the kernel assembles for every architecture. NF4LAB_ARCH
                # does not cap this choice: under it the kernel is never dispatched either, and PTX compiled
                # for sm_80+ (notebook 09's evidence) still shows the mma.
                old = ir.InlineAsm(fty, "trap;", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=True)
                v = ops.by_arch(builder, 800, lambda: builder.call(asm, vals), lambda: builder.call(old, vals),
                                capped=False)
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, i) for i in range(4)])

            return sig, codegen

        return mma

    @intrinsic
    def prmt(typingctx, a, b, sel):
        """``prmt.b32 d, a, b, sel``: byte k of d is byte (sel >> 4k) & 7 of the 8 bytes b:a (a = bytes 0-3)."""
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return builder.call(ir.InlineAsm(ir.FunctionType(i32, [i32] * 3), "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r"), vals)

        return sig, codegen

    @intrinsic
    def dyn_base(typingctx):
        """The shared-window address where the block's dynamic shared memory starts."""
        def codegen(context, builder, sig, args):
            return builder.trunc(builder.ptrtoint(_dyn_symbol(builder), ir.IntType(64)), i32)

        return types.uint32(), codegen

    return make_mma("bf16"), make_mma("f16"), prmt, dyn_base


@functools.cache
def _lookup_at(base):
    """``ld.shared.u32 d, [off + base]``: the table's base in the load's immediate, no add per lookup."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def lookup(typingctx, off):
        sig = types.uint32(types.uint32)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            o = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.call(ir.InlineAsm(ir.FunctionType(i32, [i32]), f"ld.shared.u32 $0, [$1+{int(base)}];",
                                             "=r,r"), [o])

        return sig, codegen

    return lookup


def _py_shfl_xor_sync(mask, value, delta):
    return gemv._py_warp_exchange(value, lambda lane: lane ^ int(delta), "shfl_xor_sync")


# nf4lab.measure.ptx pickles these by name, so that a PTX subprocess (compile mode) gets the device versions.
DEVICE_OPS = ("mma_bf16", "mma_f16", "prmt", "lookup", "shfl_xor_sync")
if runtime.SIMULATOR:
    mma_bf16, mma_f16, prmt, dyn_base = _py_mma_bf16, _py_mma_f16, _py_prmt, None
    lookup, shfl_xor_sync = _py_lookup, _py_shfl_xor_sync
else:
    mma_bf16, mma_f16, prmt, dyn_base = _build_device_ops()
    _lds_stand_in = _lookup_at(0x400)

    @cuda.jit(device=True, inline="always")
    def lookup(tab, off):  # the PTX tool's stand-in for the simulator's twin (any base assembles)
        return _lds_stand_in(off)

    shfl_xor_sync = cuda.shfl_xor_sync


@functools.cache
def probe_base() -> int:
    """Where dynamic shared memory starts in a block's shared window on this GPU (0x400 on an H100: the
    first KB is reserved); 0 in the simulator, whose lookups index the array itself."""
    if runtime.SIMULATOR:
        return 0

    @cuda.jit
    def probe(out):
        out[0] = dyn_base()

    out = cuda.device_array(1, np.uint32)
    probe[1, 1](out)
    return int(out.copy_to_host()[0])


def default_base(cc) -> int:
    """The base compiled in where no GPU can be probed (PTX for an architecture): sm_90 reserves 1 KB."""
    return 0x400 if tuple(cc) >= (9, 0) else 0


# ---------------------------------------------------------------- the kernel
@functools.cache
def make_kernel(is_bf16, M, base, nested=True, D=1, min_blocks=BLOCKS_PER_SM):
    """The kernel for one activation dtype, batch M (1..8) and table base (``probe_base()``). ``nested``: the
    scales are bitsandbytes' nested statistics (code2[absmax_q[b]] * absmax2[b // 256] + offset); else
    ``absmax2`` holds one float32 absmax per block and ``absmax_q``, ``code2`` and ``offset`` are unused.
    ``D`` (steps whose loads are in flight ahead of the one computed) and ``min_blocks`` (the launch bounds'
    blocks per SM) are the lab's knobs (lab/gemv_mma.py); the defaults are what measured fastest."""
    NESTED = nested
    NT = (M + 1) // 2                 # n-tiles of 8 columns: 2 batch rows x 4 blocks each
    NACC, NCF = 2 * NT, 4 * NT
    WIDE = M > 1                      # where a lane's two 16-byte pieces lie (see fetch)
    FB = 24                           # per step: 16 code words (2 rows x 32 bytes), 4 absmax codes, 4 absmax2
    NB = FB * (D + 1)
    mma = mma_bf16 if is_bf16 else mma_f16
    if runtime.SIMULATOR:
        look = lookup
    else:
        lds = _lookup_at(base)

        @cuda.jit(device=True, inline="always")
        def look(tab, off):  # the table argument is for the simulator's twin
            return lds(off)

    @cuda.jit(device=True, inline="always")
    def half_bits(v):
        if is_bf16:
            return uint32(ops.to_bf16_bits(v))
        return uint32(ops.to_f16_bits(v))

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_q, absmax2, t, c, g, q, n, kw, tiles, steps, ash):
        """Step c (256 columns) of row tile t into buf[o:o+24]: lane q's two 16-byte pieces of rows g and g + 8
        and the statistics of the blocks its C columns hold (2 (q & 1), +1). Clamped: past the end it re-reads
        valid bytes, never used. One row of x: the pieces are adjacent, columns 64q.. of the step (block q). A
        batch: columns 32q.. and 128 + 32q.. (blocks q // 2 and 2 + q // 2), so that the 4 lanes of a row read 64
        contiguous bytes per load, whole 32-byte sectors (M = 8: 2-5 us less; M = 1: 1 us more, H100)."""
        tt = min(t, uint32(tiles - uint32(1)))
        cc = min(c, uint32(steps - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
        if WIDE:
            wq0 = min(uint32(cc * uint32(32) + uint32(4) * q), uint32(kw - uint32(4)))
            wq1 = min(uint32(cc * uint32(32) + uint32(16) + uint32(4) * q), uint32(kw - uint32(4)))
            buf[o], buf[o + 1], buf[o + 2], buf[o + 3] = gemv.load_stream_u32x4(packed_u32, uint64(r0 * kw + wq0))
            buf[o + 4], buf[o + 5], buf[o + 6], buf[o + 7] = gemv.load_stream_u32x4(packed_u32, uint64(r0 * kw + wq1))
            buf[o + 8], buf[o + 9], buf[o + 10], buf[o + 11] = gemv.load_stream_u32x4(packed_u32, uint64(r1 * kw + wq0))
            buf[o + 12], buf[o + 13], buf[o + 14], buf[o + 15] = gemv.load_stream_u32x4(packed_u32, uint64(r1 * kw + wq1))
        else:
            wq = min(uint32(cc * uint32(32) + uint32(8) * q), uint32(kw - uint32(8)))   # lane q's first word
            w0 = uint32(r0 * kw + wq)
            w1 = uint32(r1 * kw + wq)
            buf[o], buf[o + 1], buf[o + 2], buf[o + 3] = gemv.load_stream_u32x4(packed_u32, uint64(w0))
            buf[o + 4], buf[o + 5], buf[o + 6], buf[o + 7] = gemv.load_stream_u32x4(packed_u32, uint64(w0 + uint32(4)))
            buf[o + 8], buf[o + 9], buf[o + 10], buf[o + 11] = gemv.load_stream_u32x4(packed_u32, uint64(w1))
            buf[o + 12], buf[o + 13], buf[o + 14], buf[o + 15] = gemv.load_stream_u32x4(packed_u32, uint64(w1 + uint32(4)))
        if (q >> uint32(1)) < uint32(M):
            wb = cc * uint32(32) + uint32(16) * (q & uint32(1))
            for i in range(4):
                r = r0 if i < 2 else r1
                blk = uint32(r * kw + min(uint32(wb + uint32(8 * (i % 2))), uint32(kw - uint32(8)))) >> ash
                if NESTED:
                    buf[o + 16 + i] = uint32(absmax_q[blk])
                    buf[o + 20 + i] = ops.float_bits(absmax2[blk >> uint32(8)])
                else:
                    buf[o + 20 + i] = ops.float_bits(absmax2[blk])

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_tc(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        warp = tid >> uint32(5)
        g = lane >> uint32(2)
        q = lane & uint32(3)
        n = uint32(N)
        k = uint32(K)
        kw = k >> uint32(3)
        kx = k >> uint32(1)
        steps = (k + uint32(255)) >> uint32(8)
        tiles = (n + uint32(15)) >> uint32(4)
        ash = uint32(uint32(bs_shift) - uint32(3))
        grid = uint32(cuda.gridDim.x)
        LUT0 = uint32(TAB_WORDS)
        C20 = uint32(TAB_WORDS + 16)
        RED0 = uint32(TAB_WORDS + 16 + 256)
        buf = cuda.local.array(NB, uint32)
        # the first D steps' loads go out before the table is built
        t = uint32(cuda.blockIdx.x)
        c = warp
        tp, cp = t, c
        for d in range(D):
            fetch(buf, FB * (d + 1), packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            cp = uint32(cp + uint32(W))
            if cp >= steps:
                cp = warp
                tp = uint32(tp + grid)
        if tid < uint32(16):
            sm[LUT0 + tid] = half_bits(lut[tid])
        if NESTED:
            sm[C20 + tid] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):    # only the used half of each 256-byte row
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[LUT0 + (e >> uint32(4))] | (sm[LUT0 + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
        lane4 = lane << uint32(2)
        acc = cuda.local.array(NACC, float32)
        cf = cuda.local.array(NCF, float32)
        s = cuda.local.array(4, float32)
        A = cuda.local.array(32, uint32)
        xr = cuda.local.array(32, uint32)
        parity = uint32(0)
        while t < tiles:
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:
                for i in range(FB * D):
                    buf[i] = buf[i + FB]
                fetch(buf, FB * D, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp = warp
                    tp = uint32(tp + grid)
                cn = uint32(c + uint32(W))
                tn = t
                if cn >= steps:
                    cn = warp
                    tn = uint32(t + grid)
                if c < steps:
                    for i in range(NCF):
                        cf[i] = float32(0.0)
                    xcol = uint32(c * uint32(256) + uint32(64) * q)   # lane q's 64 columns: block q of the step
                    for h in range(2):                 # the lane's two 16-byte pieces, 8 mmas each
                        if WIDE:                       # piece h: 32 columns at 128 h + 32 q, block 2 h + q // 2
                            xcol = uint32(c * uint32(256) + uint32(128 * h) + uint32(32) * q)
                            blk = uint32(2 * h) + (q >> uint32(1))
                        else:
                            blk = q
                        for i in range(8):
                            wa = buf[4 * h + (i >> 1)]
                            wb = buf[8 + 4 * h + (i >> 1)]
                            sel0 = uint32(0x5504 | ((2 * (i & 1)) << 4))
                            sel1 = uint32(0x5504 | ((2 * (i & 1) + 1) << 4))
                            A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                            A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                            A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                            A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                        for nt in range(NT):
                            # B: lane (g, q) holds column g = 4 mm + b: x of batch row 2 nt + mm where b is its block
                            m = uint32(2 * nt) + (g >> uint32(2))
                            if (blk if WIDE else q) == (g & uint32(3)) and m < uint32(M) and xcol < k:
                                xi = uint64(m * kx + (xcol >> uint32(1)) + uint32(0 if WIDE else 16 * h))
                                for j in range(4):
                                    xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = \
                                        ops.load_u32x4(x_u32, xi + uint64(4 * j))
                            else:
                                for j in range(16):
                                    xr[j] = uint32(0)
                            for i in range(8):
                                cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3] = mma(
                                    A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3], xr[2 * i], xr[2 * i + 1],
                                    cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3])
                    # lane q holds columns 2q, 2q+1: batch row 2 nt + q // 2, blocks 2 (q & 1), +1; rows g, g + 8
                    if (q >> uint32(1)) < uint32(M):
                        for i in range(4):
                            if NESTED:
                                s[i] = ops.fadd_rn(ops.fmul_rn(gemv.f32_from_bits(sm[C20 + buf[16 + i]]),
                                                               gemv.f32_from_bits(buf[20 + i])), offset)
                            else:
                                s[i] = gemv.f32_from_bits(buf[20 + i])
                        for nt in range(NT):
                            acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                            acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
                c = cn
                if tn != t:
                    break
            # the warps' partial sums of this tile meet in shared memory (lanes q, q ^ 1 hold the same batch row)
            base = uint32(RED0 + parity * uint32(W * 16 * M) + warp * uint32(16 * M))
            for nt in range(NT):
                a0 = acc[2 * nt] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt], 1)
                a1 = acc[2 * nt + 1] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt + 1], 1)
                m = uint32(2 * nt) + (q >> uint32(1))
                if m < uint32(M) and (q & uint32(1)) == uint32(0):
                    sm[base + m * uint32(16) + g] = ops.float_bits(a0)
                    sm[base + m * uint32(16) + g + uint32(8)] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16 * M):
                first = uint32(RED0 + parity * uint32(W * 16 * M) + tid)
                v = float32(0.0)
                for w in range(W):
                    v += gemv.f32_from_bits(sm[first + uint32(w * 16 * M)])
                row = uint32(t * uint32(16) + (tid & uint32(15)))
                if row < n:
                    y[uint32((tid >> uint32(4)) * n + row)] = half_bits(v)
            parity ^= uint32(1)
            t = tn

    return gemv_tc


def grid_size(N) -> int:
    """Persistent blocks: every 16-row tile gets one, up to BLOCKS_PER_SM per SM."""
    return min(-(-N // 16), BLOCKS_PER_SM * gemv.sms())


def prepare(kern, args, nbytes):
    """Allow ``kern`` (for ``args``) ``nbytes`` of dynamic shared memory: past 48 KB a function attribute
    must be raised before the launch, which numba does not do. Compiles into the dispatcher's own overloads
    (the torch ops' lean launcher takes the function from there). The simulator needs nothing."""
    if runtime.SIMULATOR:
        return kern
    argtypes = tuple(kern.typeof_pyval(a) for a in args)
    done = kern.__dict__.setdefault("_nf4lab_dynamic_smem", {})
    if done.get(argtypes, 0) < nbytes:
        from numba.cuda.cudadrv.driver import binding, driver

        f = kern.compile(argtypes)._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), f.handle, f.device.id)
        done[argtypes] = nbytes
    return kern
