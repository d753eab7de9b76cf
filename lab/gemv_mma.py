"""A tensor-core NF4 GEMV: the table lookups feed mma.sync, so the SM's pipes stop being the limit.

Notebook 09's design spends ~4.4 SASS instructions per weight (a shared-memory pair lookup and an FFMA per
weight, address math). Here one 16-byte load per lane and row gives 32 codes; each code byte is one PRMT
(its table address) and one 32-bit shared-memory load that returns the two codes' values as a bf16x2 (or
f16x2) pair: exactly an mma.sync A-fragment register. The tensor core multiplies by x and accumulates in
float32, so the products cost nothing on the FMA pipe. Per warp step (16 rows x 128 columns):

- lane (g, q) = (lane >> 2, lane & 3) reads 16 bytes of rows 16t+g and 16t+g+8, columns 128c + 32q .. +32;
- mma i (i = 0..7) takes bytes 2i, 2i+1 of those: logical k = 2q, 2q+1 <-> columns 32q + 4i, +1 and
  k = 2q+8, 2q+9 <-> 32q + 4i + 2, +3 (a sum does not care about the order of k, only B must follow it);
- the chunk holds two scale blocks of 64 (lanes q = 0, 1 and q = 2, 3). B column n = 2m + b holds batch
  row m's x where the k belongs to block b, else 0, so C[row, 2m + b] is block b's partial sum: each is
  multiplied by its block's scale in float32 after the 8 mmas, as one FFMA.

Warps split K (warp w takes chunks w, w + 8, ...); their sums meet in shared memory once per 16 rows.
The table: 256 bytes x one copy per lane (no bank conflicts), 256-byte rows, so that the address of
byte p of word w is one PRMT: (w.byte p) << 8 | lane << 2. 64 KB of dynamic shared memory.
"""
from __future__ import annotations

import functools

import numpy as np

import nf4lab  # noqa: F401  (first: decides GPU or simulator)
from nf4lab import runtime
from nf4lab.kernels import gemv, ops
from numba import cuda, float32, uint32, uint64  # noqa: E402

from lab.gemv_variants import prmt, with_dynamic_shared

THREADS = 256
W = THREADS // 32
TAB_WORDS = 256 * 64          # 64 KB: entry e, lane l at word (e << 6) | l; words 32..63 of a row unused
DYN_BYTES = lambda m: 4 * (TAB_WORDS + 16 + 256 + 2 * W * 16 * m)  # noqa: E731  table, lut, code2, partial sums


def _build_mma():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def make(ptype):
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, sig, args):
                vals = [context.cast(builder, v, t, s) for v, t, s in zip(args, sig.args, sig.args)]
                i32, f32 = ir.IntType(32), ir.FloatType()
                asm = ir.InlineAsm(
                    ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4),
                    f"mma.sync.aligned.m16n8k16.row.col.f32.{ptype}.{ptype}.f32 "
                    "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                    "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
                v = builder.call(asm, vals)
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, i) for i in range(4)])

            return sig, codegen

        return mma

    @intrinsic
    def lds_dyn(typingctx, off):
        """The uint32 at byte offset ``off`` of the block's dynamic shared memory, addressed in 32 bits from the
        extern symbol itself (a 64-bit generic pointer would cost an add per load)."""
        sig = types.uint32(types.uint32)

        def codegen(context, builder, sig, args):
            mod = builder.module
            gv = mod.globals.get("nf4lab_dyn_smem")
            if gv is None:
                gv = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(8), 0), "nf4lab_dyn_smem", addrspace=3)
                gv.linkage = "external"
                gv.align = 16
            o = context.cast(builder, args[0], sig.args[0], types.uint32)
            i32 = ir.IntType(32)
            base = builder.trunc(builder.ptrtoint(gv, ir.IntType(64)), i32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32]), "ld.shared.u32 $0, [$1];", "=r,r")
            return builder.call(asm, [builder.add(base, o)])

        return sig, codegen

    @intrinsic
    def dyn_base(typingctx):
        """The shared-window address where the block's dynamic shared memory starts."""
        sig = types.uint32()

        def codegen(context, builder, sig, args):
            mod = builder.module
            gv = mod.globals.get("nf4lab_dyn_smem")
            if gv is None:
                gv = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(8), 0), "nf4lab_dyn_smem", addrspace=3)
                gv.linkage = "external"
                gv.align = 16
            return builder.trunc(builder.ptrtoint(gv, ir.IntType(64)), ir.IntType(32))

        return sig, codegen

    return make("bf16"), make("f16"), lds_dyn, dyn_base


@functools.cache
def lds_at(base):
    """``ld.shared.u32 d, [off + base]``: a table at a known shared address costs no add per lookup (the
    base rides in the load's immediate)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def lds(typingctx, off):
        sig = types.uint32(types.uint32)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            o = context.cast(builder, args[0], sig.args[0], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32]), f"ld.shared.u32 $0, [$1+{int(base)}];", "=r,r")
            return builder.call(asm, [o])

        return sig, codegen

    return lds


@functools.cache
def probe_base():
    """Where dynamic shared memory starts on the current GPU (a kernel that only reads the address)."""
    @cuda.jit
    def probe(out):
        out[0] = dyn_base()

    out = cuda.device_array(1, np.uint32)
    probe[1, 1](out)
    return int(out.copy_to_host()[0])


if runtime.SIMULATOR:
    mma_bf16 = mma_f16 = lds_dyn = dyn_base = None
else:
    mma_bf16, mma_f16, lds_dyn, dyn_base = _build_mma()


@functools.cache
def make_kernel(is_bf16, M, D=1, min_blocks=2, base=None, xearly=False):
    """D: chunks whose loads (weights and scale statistics) are in flight ahead of the one computed;
    base: where dynamic shared memory starts (probe_base()), or None for an add per table lookup."""
    look = lds_dyn if base is None else lds_at(base)
    NT = (M + 1) // 2                 # n-tiles of 8 columns: 2 batch rows x 4 lanes' blocks each
    NACC, NCF = 2 * NT, 4 * NT
    XE = NT == 1 and xearly
    XB = 16 if XE else 0         # where a half's x fragments start (one batch tile: both halves loaded first)
    FB = 24                           # per chunk: 16 code words (2 rows x 32 bytes), 4 absmax codes, 4 absmax2
    NB = FB * (D + 1)
    mma = mma_bf16 if is_bf16 else mma_f16

    @cuda.jit(device=True, inline="always")
    def half_bits(v):
        if is_bf16:
            return uint32(ops.to_bf16_bits(v))
        return uint32(ops.to_f16_bits(v))

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_q, absmax2, t, c, g, q, n, kw, tiles, chunks, ash):
        """Chunk c (256 columns) of row tile t into buf[o:o+24]: lane q's 32 bytes of rows g and g + 8 and the
        statistics of the blocks it scales (2 (q & 1), +1). Clamped: past the end it re-reads valid bytes."""
        tt = min(t, uint32(tiles - uint32(1)))
        cc = min(c, uint32(chunks - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
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
                buf[o + 16 + i] = uint32(absmax_q[blk])
                buf[o + 20 + i] = ops.float_bits(absmax2[blk >> uint32(8)])

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_mma(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
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
        chunks = (k + uint32(255)) >> uint32(8)
        tiles = (n + uint32(15)) >> uint32(4)
        ash = uint32(uint32(bs_shift) - uint32(3))
        grid = uint32(cuda.gridDim.x)
        LUT0 = uint32(TAB_WORDS)
        C20 = uint32(TAB_WORDS + 16)
        RED0 = uint32(TAB_WORDS + 16 + 256)
        buf = cuda.local.array(NB, uint32)
        # the first D chunks' loads go out before the table is built
        t = uint32(cuda.blockIdx.x)
        c = warp
        tp, cp = t, c
        for d in range(D):
            fetch(buf, FB * (d + 1), packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, chunks, ash)
            cp = uint32(cp + uint32(W))
            if cp >= chunks:
                cp = warp
                tp = uint32(tp + grid)
        if tid < uint32(16):
            sm[LUT0 + tid] = half_bits(lut[tid])
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
                fetch(buf, FB * D, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, chunks, ash)
                cp = uint32(cp + uint32(W))
                if cp >= chunks:
                    cp = warp
                    tp = uint32(tp + grid)
                cn = uint32(c + uint32(W))
                tn = t
                if cn >= chunks:
                    cn = warp
                    tn = uint32(t + grid)
                if c < chunks:
                    for i in range(NCF):
                        cf[i] = float32(0.0)
                    xcol = uint32(c * uint32(256) + uint32(64) * q)   # lane q's 64 columns: block q of the chunk
                    if XE:   # x of both halves first: its loads overlap the table lookups
                        m = g >> uint32(2)
                        if q == (g & uint32(3)) and m < uint32(M) and xcol < k:
                            xi = uint64(m * kx + (xcol >> uint32(1)))
                            for j in range(8):
                                xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = ops.load_u32x4(x_u32, xi + uint64(4 * j))
                        else:
                            for j in range(32):
                                xr[j] = uint32(0)
                    for h in range(2):                 # the lane's two 16-byte halves, 8 mmas each
                        for i in range(8):
                            wa = buf[4 * h + (i >> 1)]
                            wb = buf[8 + 4 * h + (i >> 1)]
                            sel0 = uint32(0x5504 | ((2 * (i & 1)) << 4))
                            sel1 = uint32(0x5504 | ((2 * (i & 1) + 1) << 4))
                            A[4 * i] = look(prmt(wa, lane4, sel0))
                            A[4 * i + 1] = look(prmt(wb, lane4, sel0))
                            A[4 * i + 2] = look(prmt(wa, lane4, sel1))
                            A[4 * i + 3] = look(prmt(wb, lane4, sel1))
                        for nt in range(NT):
                            # B: lane (g, q) holds column g = 4 mm + b: x of batch row 2 nt + mm where b == q
                            if not XE:
                                m = uint32(2 * nt) + (g >> uint32(2))
                                if q == (g & uint32(3)) and m < uint32(M) and xcol < k:
                                    xi = uint64(m * kx + (xcol >> uint32(1)) + uint32(16 * h))
                                    for j in range(4):
                                        xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = \
                                            ops.load_u32x4(x_u32, xi + uint64(4 * j))
                                else:
                                    for j in range(16):
                                        xr[j] = uint32(0)
                            for i in range(8):
                                cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3] = mma(
                                    A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3], xr[XB * h + 2 * i], xr[XB * h + 2 * i + 1],
                                    cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3])
                    # lane q holds columns 2q, 2q+1: batch row 2 nt + q // 2, blocks 2 (q & 1), +1; rows g, g + 8
                    if (q >> uint32(1)) < uint32(M):
                        for i in range(4):
                            s[i] = ops.fadd_rn(ops.fmul_rn(gemv.f32_from_bits(sm[C20 + buf[16 + i]]),
                                                           gemv.f32_from_bits(buf[20 + i])), offset)
                        for nt in range(NT):
                            acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                            acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
                c = cn
                if tn != t:
                    break
            # the warps' partial sums of this tile meet in shared memory (lanes q, q ^ 1 hold the same batch row)
            base = uint32(RED0 + parity * uint32(W * 16 * M) + warp * uint32(16 * M))
            for nt in range(NT):
                a0 = acc[2 * nt] + cuda.shfl_xor_sync(0xFFFFFFFF, acc[2 * nt], 1)
                a1 = acc[2 * nt + 1] + cuda.shfl_xor_sync(0xFFFFFFFF, acc[2 * nt + 1], 1)
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

    return gemv_mma


def _max_carveout(kern):
    """Ask for the largest shared-memory carveout: the driver's default left room for 2 blocks of 68 KB."""
    if getattr(kern, "_nf4lab_carveout", False):
        return
    from numba.cuda.cudadrv.driver import binding, driver

    f = next(iter(kern.overloads.values()))._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    driver.cuKernelSetAttribute(attr, 100, f.handle, f.device.id)
    kern._nf4lab_carveout = True


def grid_size(N, blocks_per_sm=2):
    return min(-(-N // 16), blocks_per_sm * gemv.sms())


def launch(g, kern=None, blocks_per_sm=2, D=1, imm=True, xearly=False, carveout=False):
    gemv.validate(g)
    kern = kern or make_kernel(g.dtype == "bf16", g.M, D, max(blocks_per_sm, 1), probe_base() if imm else None, xearly)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    nbytes = DYN_BYTES(g.M)
    kern = with_dynamic_shared(kern, args, nbytes)
    if carveout:
        _max_carveout(kern)
    kern[g.grid or grid_size(g.N, blocks_per_sm), THREADS, g.stream, nbytes](*args)
