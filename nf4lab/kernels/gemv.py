"""The fused NF4 GEMV of notebook 09: ``y = x @ W.T`` for 1 to 8 rows of x, W (N, K) in bitsandbytes' NF4.

The shipped design (the one notebook 09 teaches, cell by cell) and what it needs:

- ``launch(g, design=None)``: the stable entry point. ``g`` is a :class:`GemvBuffers` (batch ``g.M`` <= 8),
  the launch runs on ``g.stream``; ``design`` None is ``auto_design(N, M)``. ``validate(g)`` runs first.
- ``Design`` / ``make_gemv(is_bf16, d)`` / ``kernel(d, dtype)`` / ``auto_design`` / ``grid_size``.
- ``make_gemv_case``, ``tolerance``, ``compare``/``check``, ``bnb_output``: data and the float64 reference
  (a fused kernel sums in its own order: it is checked against a bound, not bits).
- ``make_gemv_buffers`` / ``buffers_from_torch`` / ``validate``; ``weight_bytes`` / ``unfused_bytes``.
- GPU only: ``benchmark(...)`` times it beside bitsandbytes' ``matmul_4bit`` (``gemv_4bit`` at M=1,
  ``gemm_4bit`` for M>1) on the same data; ``summary`` and ``plot`` show a run.
- Device ops with plain-Python twins: ``f32_from_bits``, ``f16_to_f32``, ``lds_pair`` (ld.shared.v2.f32 at
  a byte offset), ``load_stream_u32x4`` (ld.global.nc.L1::no_allocate.v4.u32), ``bar_sync`` (a named
  barrier), ``shfl_down_sync``.

The design family the lab measured (variants, profiles, SASS reports) lives in ``lab/``.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from ..lesson import reference
from . import ops
from numba import cuda, float32, uint32, uint64  # noqa: E402  (a module global: the simulator swaps it in kernels)

LLM_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))  # (N, K) = W.shape
EPS32 = float(np.finfo(np.float32).eps)        # 2^-23
UNIT_OUT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}  # unit roundoff of the output
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
NAME = "09_fused_gemv"
MAX_M = 8  # batch rows of x the kernel takes (each weight byte is still read once)


# ---------------------------------------------------------------- device ops with twins
def _py_f32_from_bits(u):
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def _py_f16_to_f32(u):
    return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))


def _shared_ptr(context, builder, sig, args, elem):
    """Pointer to ``elem`` at byte offset args[1] (uint32) of the shared array args[0]: the data pointer cast
    back to the shared window, plus the offset (no index scaling, no 64-bit index math)."""
    from llvmlite import ir
    from numba import types

    ary = context.make_array(sig.args[0])(context, builder, args[0])
    base = builder.addrspacecast(builder.bitcast(ary.data, ir.IntType(8).as_pointer()), ir.PointerType(ir.IntType(8), 3))
    o = context.cast(builder, args[1], sig.args[1], types.uint32)
    return builder.bitcast(builder.gep(base, [builder.zext(o, ir.IntType(64))]), ir.PointerType(elem, 3))


def _build_device_ops():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f32_from_bits(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.uint32), ir.FloatType())

        return sig, codegen

    @intrinsic
    def f16_to_f32(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            h = builder.trunc(context.cast(builder, args[0], sig.args[0], types.uint32), ir.IntType(16))
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(16)]), "cvt.f32.f16 $0, $1;", "=f,h")
            return builder.call(asm, [h])

        return sig, codegen

    @intrinsic
    def lds_pair(typingctx, tab, off):
        """Two float32 at byte offset ``off`` (uint32, a multiple of 8) of a shared array: one ld.shared.v2.f32."""
        if not (isinstance(tab, types.Array) and tab.ndim == 1):
            return None
        sig = types.UniTuple(types.float32, 2)(tab, types.uint32)

        def codegen(context, builder, sig, args):
            v = builder.load(_shared_ptr(context, builder, sig, args, ir.VectorType(ir.FloatType(), 2)), align=8)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_element(v, ir.Constant(ir.IntType(32), i)) for i in (0, 1)])

        return sig, codegen

    @intrinsic
    def load_stream_u32x4(typingctx, arr, i):
        """128 bits at uint32 element ``i`` (a multiple of 4) of a 16-byte aligned array, read-only and not kept
        in L1 (``ld.global.nc.L1::no_allocate.v4.u32``): weights are read once, L1 keeps x and the scales."""
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.ndim == 1):
            return None
        sig = types.UniTuple(types.uint32, 4)(arr, i)

        def codegen(context, builder, sig, args):
            from numba.cuda import cgutils

            ary = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]], wraparound=False)
            i32 = ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * 4), [ir.IntType(64)]),
                               "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
            v = builder.call(asm, [builder.ptrtoint(ptr, ir.IntType(64))])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, k) for k in range(4)])

        return sig, codegen

    @intrinsic
    def bar_sync(typingctx, barrier, nthreads):
        """``bar.sync barrier, nthreads``: wait until ``nthreads`` threads (whole warps) reached barrier
        ``barrier`` (1..15; 0 is __syncthreads). Orders shared-memory accesses like __syncthreads."""
        sig = types.void(types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            a, b = (context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.IntType(32)]),
                               "bar.sync $0, $1;", "r,r,~{memory}", side_effect=True)
            builder.call(asm, [a, b])
            return context.get_dummy_value()

        return sig, codegen

    return f32_from_bits, f16_to_f32, lds_pair, load_stream_u32x4, bar_sync


def _py_lds_pair(tab, off):
    t = np.asarray(tab)
    p = int(t.view(np.uint64)[int(off) >> 3]) if t.dtype.itemsize != 8 else int(t[int(off) >> 3])
    return _py_f32_from_bits(p & 0xFFFFFFFF), _py_f32_from_bits(p >> 32)



class _Warp:
    def __init__(self, n):
        import threading

        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.vals = [None] * n


_WARPS: dict = {}


def _py_warp_exchange(value, source, name):
    """The simulator has no warp shuffles: exchange through a per-warp barrier. Every lane posts ``value``
    and gets the value of lane ``source(lane)``, or its own where that lane is past the warp's end.

    Every lane of the warp must call it (as on the GPU with a full mask); a lane that
    returned early makes the others wait, and after 60 s the barrier raises.
    """
    import threading

    t = threading.current_thread()
    bd = t._manager._block_dim
    nthreads = int(np.prod(bd))
    lane, w = t.thread_id % 32, t.thread_id // 32
    n = min(32, nthreads - 32 * w)
    key = (id(t._manager), tuple(t.blockIdx), w, n)
    warp = _WARPS.get(key)
    if warp is None:
        warp = _WARPS.setdefault(key, _Warp(n))
    warp.vals[lane] = value
    try:
        warp.barrier.wait()
        src = source(lane)
        out = warp.vals[src] if src < n else value
        warp.barrier.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"{name}: not every lane of the warp reached the shuffle (a lane returned early or "
                           "took another branch); on a GPU that is undefined behaviour") from None
    return type(value)(out) if isinstance(value, np.generic) else out


def _py_shfl_down_sync(mask, value, delta):
    return _py_warp_exchange(value, lambda lane: lane + int(delta), "shfl_down_sync")



_BARRIERS: dict = {}


def _py_bar_sync(barrier, nthreads):
    """The simulator has no named barriers: a threading.Barrier per (block, barrier id)."""
    import threading

    t = threading.current_thread()
    key = (id(t._manager), tuple(t.blockIdx), int(barrier))
    b = _BARRIERS.get(key)
    if b is None:
        b = _BARRIERS.setdefault(key, threading.Barrier(int(nthreads), timeout=60))
    if b.parties != int(nthreads):
        raise RuntimeError(f"bar_sync({barrier}, {nthreads}): the barrier was used with {b.parties} threads")
    try:
        b.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"bar_sync({barrier}, {nthreads}): not every thread arrived (on a GPU: a hang "
                           "or undefined behaviour)") from None


def _py_load_stream_u32x4(arr, i):
    from . import ops

    return ops._py_load_u32x4(arr, i)



# nf4lab.measure.ptx pickles these by name, so that the PTX subprocess (compile mode) gets the device versions.
DEVICE_OPS = ("f32_from_bits", "f16_to_f32", "lds_pair", "shfl_down_sync", "load_stream_u32x4", "bar_sync")

if runtime.SIMULATOR:
    f32_from_bits, f16_to_f32, lds_pair = _py_f32_from_bits, _py_f16_to_f32, _py_lds_pair
    load_stream_u32x4, bar_sync, shfl_down_sync = _py_load_stream_u32x4, _py_bar_sync, _py_shfl_down_sync
else:
    f32_from_bits, f16_to_f32, lds_pair, load_stream_u32x4, bar_sync = _build_device_ops()
    from numba import cuda as _cuda

    shfl_down_sync = _cuda.shfl_down_sync


# ---------------------------------------------------------------- the kernel (notebook 09 builds the same, cell by cell)
@dataclasses.dataclass(frozen=True)
class Design:
    """What one warp does per loop trip (an "item": R rows x 32 lanes x 32 columns) and how warps share work."""
    rows: int = 4        # R: rows of W per item; each activation, converted once, feeds R rows
    split: int = 1       # S: warps sharing a group of rows, each taking every S-th item of K (split-K)
    m: int = 1           # batch: rows of x, each weight read once for all of them
    min_blocks: int = 2  # launch bounds: 256-thread blocks per SM ptxas must fit (caps the registers)

    @property
    def name(self):  # the lab's variant names: 32 columns per lane, 8 warps per block
        return f"R{self.rows} S{self.split} C32 W8 B{self.min_blocks}" + (f" M{self.m}" if self.m > 1 else "")


def make_gemv(is_bf16, d=Design(), reduce=None):
    """The fused kernel for one activation dtype and one Design (all compile-time constants).
    ``reduce``: the warp reduction (default: warp_sum; the notebook's exercise passes its own)."""
    @cuda.jit(device=True, inline="always")
    def x_pair(u):
        if is_bf16:  # two activations of one x word (column 2i low, 2i+1 high) as float32
            return f32_from_bits(u << uint32(16)), f32_from_bits(u & uint32(0xFFFF0000))
        return f16_to_f32(u), f16_to_f32(u >> uint32(16))

    @cuda.jit(device=True, inline="always")
    def load_x8(x_u32, i):
        a = ops.load_u32x4(x_u32, i)
        return x_pair(a[0]) + x_pair(a[1]) + x_pair(a[2]) + x_pair(a[3])

    @cuda.jit(device=True, inline="always")
    def lut8(tab, lane8, w, L, o):  # byte j's (lut[hi], lut[lo]) at byte offset (byte << 7) | lane8
        L[o], L[o + 1] = lds_pair(tab, ((w << uint32(7)) & uint32(0x7F80)) | lane8)
        L[o + 2], L[o + 3] = lds_pair(tab, ((w >> uint32(1)) & uint32(0x7F80)) | lane8)
        L[o + 4], L[o + 5] = lds_pair(tab, ((w >> uint32(9)) & uint32(0x7F80)) | lane8)
        L[o + 6], L[o + 7] = lds_pair(tab, ((w >> uint32(17)) & uint32(0x7F80)) | lane8)

    @cuda.jit(device=True, inline="always")
    def dot8(L, o, x, a):
        return (a + L[o] * x[0] + L[o + 1] * x[1] + L[o + 2] * x[2] + L[o + 3] * x[3]
                + L[o + 4] * x[4] + L[o + 5] * x[5] + L[o + 6] * x[6] + L[o + 7] * x[7])

    @cuda.jit(device=True, inline="always")
    def warp_sum(v):
        v += shfl_down_sync(0xFFFFFFFF, v, 16)
        v += shfl_down_sync(0xFFFFFFFF, v, 8)
        v += shfl_down_sync(0xFFFFFFFF, v, 4)
        v += shfl_down_sync(0xFFFFFFFF, v, 2)
        v += shfl_down_sync(0xFFFFFFFF, v, 1)
        return v

    @cuda.jit(device=True, inline="always")
    def store(y, i, v):
        if is_bf16:
            y[i] = ops.to_bf16_bits(v)
        else:
            y[i] = ops.to_f16_bits(v)

    reduce = reduce or warp_sum
    R, S, M = d.rows, d.split, d.m
    W, THREADS, STEP, SSH = 8, 256, 1024, 10   # 8 warps; a warp covers 32 lanes x 32 columns per item
    TEAMS, RM, NC, NL = W // S, R * M, 4 * R, 8 * R
    NRED = 2 * W * RM                           # split-K partial sums, double-buffered
    TAB = 256 * 16                              # byte-pair table: 256 bytes x 16 copies, 8 bytes each
    assert S in (1, 2, 4, 8) and 1 <= M <= MAX_M

    @cuda.jit(device=True, inline="always")
    def row_offsets(ro, g, n, kw):  # rows past N repeat the last row: loaded, never stored
        for r in range(R):
            ro[r] = uint32(min(uint32(g * uint32(R) + uint32(r)), uint32(n - uint32(1))) * kw)

    @cuda.jit(device=True, inline="always")
    def fetch(packed_u32, absmax_q, absmax2, nc, nq, na, ro, wofs, ash):  # one item's loads
        for r in range(R):
            wi = uint32(ro[r] + wofs)
            c0, c1, c2, c3 = load_stream_u32x4(packed_u32, uint64(wi) + uint64(0))
            nc[4 * r] = c0
            nc[4 * r + 1] = c1
            nc[4 * r + 2] = c2
            nc[4 * r + 3] = c3
            blk = uint32(wi >> ash)
            nq[r] = uint32(absmax_q[blk])
            na[r] = absmax2[blk >> uint32(8)]

    @cuda.jit(launch_bounds=(THREADS, d.min_blocks))
    def gemv_kernel(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        warp = tid >> uint32(5)
        part = warp & uint32(S - 1)            # which items of a row group this warp takes: part, part + S, ...
        team = warp // uint32(S)
        n = uint32(N)
        k = uint32(K)
        kw = k >> uint32(3)                    # code words per row
        kx = k >> uint32(1)                    # x words per row of x
        steps = uint32((k + uint32(STEP - 1)) >> uint32(SSH))   # items per row
        groups = uint32((n + uint32(R - 1)) // uint32(R))
        nteams = uint32(uint32(cuda.gridDim.x) * uint32(TEAMS))
        g = uint32(uint32(cuda.blockIdx.x) * uint32(TEAMS) + team)   # this team's first row group
        lw = uint32(lane * uint32(4))          # the lane's first code word within an item
        lwmax = uint32(kw - uint32(4))         # lanes past K re-read the row's last words (never used)
        ash = uint32(uint32(bs_shift) - uint32(3))   # code word -> absmax block: >> (log2(blocksize) - 3)
        nc, nq, na = cuda.local.array(NC, uint32), cuda.local.array(R, uint32), cuda.local.array(R, float32)
        cc, cq, ca = cuda.local.array(NC, uint32), cuda.local.array(R, uint32), cuda.local.array(R, float32)
        ro, rn, rs = cuda.local.array(R, uint32), cuda.local.array(R, uint32), cuda.local.array(R, uint32)
        L, p, acc = cuda.local.array(NL, float32), cuda.local.array(RM, float32), cuda.local.array(RM, float32)
        row_offsets(ro, min(g, uint32(groups - uint32(1))), n, kw)
        fetch(packed_u32, absmax_q, absmax2, nc, nq, na, ro, min(uint32(uint32(part << uint32(SSH - 3)) + lw), lwmax), ash)
        code2_s = cuda.shared.array(256, float32)
        red = cuda.shared.array(NRED, float32)
        if tid < uint32(256):
            code2_s[tid] = code2[tid]
        tab = cuda.shared.array(TAB, uint64)
        for j in range(TAB // THREADS):
            i = uint32(tid + uint32(j * THREADS))
            tab[i] = (uint64(ops.float_bits(lut[i >> uint32(8)]))
                      | (uint64(ops.float_bits(lut[(i >> uint32(4)) & uint32(15)])) << uint64(32)))
        lane8 = (tid & uint32(15)) << uint32(3)
        cuda.syncthreads()
        parity = uint32(0)
        while g < groups:
            gn = uint32(g + nteams)
            row_offsets(rn, min(gn, uint32(groups - uint32(1))), n, kw)
            for i in range(RM):
                acc[i] = float32(0.0)
            s = part
            while s < steps:
                for i in range(NC):
                    cc[i] = nc[i]
                for r in range(R):
                    cq[r], ca[r] = nq[r], na[r]
                s1 = uint32(s + uint32(S))
                last = s1 >= steps
                for r in range(R):
                    rs[r] = rn[r] if last else ro[r]
                nxt = uint32((part if last else s1) << uint32(SSH - 3))
                fetch(packed_u32, absmax_q, absmax2, nc, nq, na, rs, min(uint32(nxt + lw), lwmax), ash)
                col = uint32(uint32(s << uint32(SSH)) + lane * uint32(32))
                if col < k:
                    for i in range(RM):
                        p[i] = float32(0.0)
                    xi = uint64(col >> uint32(1))
                    for w in range(4):
                        for r in range(R):
                            lut8(tab, lane8, cc[4 * r + w], L, 8 * r)
                        for mm in range(M):
                            xv = load_x8(x_u32, xi + uint64(uint32(mm) * kx) + uint64(4 * w))
                            for r in range(R):
                                p[r * M + mm] = dot8(L, 8 * r, xv, p[r * M + mm])
                    for r in range(R):
                        sc = ops.fadd_rn(ops.fmul_rn(code2_s[cq[r]], ca[r]), offset)
                        for mm in range(M):
                            acc[r * M + mm] += sc * p[r * M + mm]
                s = s1
            if S == 1:
                for r in range(R):
                    row = uint32(g * uint32(R) + uint32(r))
                    for mm in range(M):
                        v = reduce(acc[r * M + mm])
                        if lane == uint32(0) and row < n:
                            store(y, uint32(uint32(mm) * n + row), v)
            else:
                base = uint32((parity * uint32(W) + warp) * uint32(RM))
                for i in range(RM):
                    v = reduce(acc[i])
                    if lane == uint32(0):
                        red[base + uint32(i)] = v
                bar_sync(uint32(1) + team, uint32(32 * S))
                if part == uint32(0) and lane < uint32(RM):
                    first = uint32((parity * uint32(W) + warp) * uint32(RM) + lane)
                    v = red[first]
                    for j in range(1, S):
                        v += red[first + uint32(j * RM)]
                    row = uint32(g * uint32(R) + lane // uint32(M))
                    if row < n:
                        store(y, uint32(uint32(lane % uint32(M)) * n + row), v)
                parity ^= uint32(1)
            for r in range(R):
                ro[r] = rn[r]
            g = gn

    return gemv_kernel


_KERNELS = {}  # (Design, dtype) -> kernel, made on first use (a GPU compiles it at its first launch)


def kernel(d, dtype):
    if (d, dtype) not in _KERNELS:
        _KERNELS[(d, dtype)] = make_gemv(dtype == "bf16", d)
    return _KERNELS[(d, dtype)]


def sms():
    return runtime.device_info().get("sms") or 132  # the simulator has none: plan for an H100


def auto_design(N, M=1):
    """The default Design, chosen by measurement (lab/bench_gemv.py, H100): more rows per item won on every
    shape; which R and whether K is split depends on how many warps the row groups give the GPU."""
    if M == 1 and -(-N // 4) < 0.5 * 24 * sms():      # N/4 groups fill under half the warp slots (N = 4096)
        return Design(rows=4, split=2, min_blocks=3)
    if M == 1 and 2 * -(-N // 8) <= 16 * sms():       # R8 teams of 2 warps fit at 16 warps per SM (N = 8192)
        return Design(rows=8, split=2, min_blocks=2)
    return Design(rows=4, min_blocks=2, m=M)         # otherwise, and every batch (128 registers; M >= 4 spills)


def grid_size(d, N):
    """Blocks to launch: the fewest rounds the resident teams need (d.min_blocks blocks per SM, as the
    launch bounds make ptxas fit), and just enough teams that each does that many row groups."""
    teams_per_block = 8 // d.split
    groups = -(-N // d.rows)
    capacity = d.min_blocks * sms() * teams_per_block
    rounds = -(-groups // capacity)
    return min(-(-groups // teams_per_block), -(-groups // (rounds * teams_per_block)))


def launch(g, design=None, kern=None):
    """Run the fused GEMV on a :class:`GemvBuffers` (batch g.M <= 8) on g.stream: the stable entry point.
    ``design``: a Design (its m is set to g.M) or None for auto_design(N, M); ``kern``: a kernel from
    make_gemv for that design instead of the cached one; ``g.grid`` (if set) replaces grid_size."""
    validate(g)  # dtypes, sizes, alignment, M: raises before anything is launched
    d = design or auto_design(g.N, g.M)
    if d.m != g.M:
        d = dataclasses.replace(d, m=g.M)
    kern = kern or kernel(d, g.dtype)
    grid = g.grid or grid_size(d, g.N)
    kern[grid, 256, g.stream](g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y,
                              g.N, g.K, g.bs_shift)


def signature():
    """The kernel's argument types, for PTX and SASS."""
    from numba import types as T

    return (T.uint32[::1], T.uint8[::1], T.float32[::1], T.float32[::1], T.float32[::1], T.float32,
            T.uint32[::1], T.uint16[::1], T.int64, T.int64, T.int64)


def kernel_ptx(kern, sig=None) -> str:
    """PTX of a kernel with the launch bounds it was jitted with (.maxntid/.minnctapersm), which
    nf4lab.compile_ptx alone would drop; works in the simulator and without a GPU."""
    from ..measure import ptx as _ptx

    opts = getattr(kern, "_nf4lab_jit_kwargs", None)
    bounds = (opts if opts is not None else getattr(kern, "targetoptions", None) or {}).get("launch_bounds")
    return _ptx.compile_ptx(kern, sig or signature(), **({"launch_bounds": bounds} if bounds else {}))


# ---------------------------------------------------------------- data and the float64 reference
@dataclasses.dataclass
class GemvCase:
    N: int
    K: int
    M: int
    dtype: str
    blocksize: int
    packed: np.ndarray      # uint8, N*K/2, high nibble first, flat index row*K + col
    absmax_q: np.ndarray    # uint8 per block
    absmax2: np.ndarray     # float32 per 256 blocks
    code2: np.ndarray       # float32[256]
    offset: np.float32
    lut: np.ndarray         # float32[16]
    x_bits: np.ndarray      # uint16 (M, K): the activations as bf16/fp16 bits
    x: np.ndarray           # float32 (M, K): the same values
    w: np.ndarray           # float32 (N, K): what bitsandbytes dequantizes to before the output cast
    y64: np.ndarray         # float64 (M, N): x @ w.T in float64
    tol: np.ndarray         # float64 (M, N): allowed |y - y64|
    case: object = None     # the nf4lab.lesson.cases.Case it was made from

    @property
    def shape(self):
        return (self.N, self.K)

    def __repr__(self):
        return (f"GemvCase(W {self.N}x{self.K} NF4 ({self.packed.size:,} packed bytes, {self.absmax_q.size} blocks, "
                f"{self.absmax2.size} groups), x {self.M}x{self.K} {self.dtype})")

    def bnb_tensors(self, device="cpu"):
        """(W_packed, quant_state, x) as bitsandbytes takes them."""
        import torch

        packed, qs = self.case.quant_state(device)
        x = torch.from_numpy(self.x_bits.view(np.int16).copy()).view(getattr(torch, TORCH_DTYPE[self.dtype]))
        return packed, qs, x.to(device)


def make_x(M, K, dtype, seed=0, dist="randn") -> tuple[np.ndarray, np.ndarray]:
    """Activations rounded to the dtype: standard normal, or "heavy" (Student t with 2 degrees of freedom
    plus a few outlier columns 100x larger, as LLM activations have). Returns (bits uint16, float32 values)."""
    rng = np.random.default_rng(1000 + seed)
    if dist == "randn":
        xf = rng.standard_normal((M, K)).astype(np.float32)
    elif dist == "heavy":
        xf = rng.standard_t(2.0, (M, K))
        xf[:, rng.choice(K, size=max(1, K // 64), replace=False)] *= 100.0
        xf = np.clip(xf, -3e4, 3e4).astype(np.float32)  # inside the fp16 range
    else:
        raise ValueError(f"x_dist must be 'randn' or 'heavy', got {dist!r}")
    bits = reference.f32_to_bits(xf, dtype).reshape(M, K)
    return bits, reference.bits_to_f32(bits, dtype).reshape(M, K)


def reference_y64(x, w) -> np.ndarray:
    """y = x @ w.T in float64: the value every float32 summation order approximates."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def tolerance(x, w, dtype, c: float = 1.0) -> np.ndarray:
    """Allowed |y - y64| for a float32 dot product of length K rounded to ``dtype``.

    Any float32 summation of K products (any order, FMA or not) is within
    gamma_K * sum|x_k w_k| of the exact value, gamma_K ~= K * u32 (u32 = 2^-24, Higham's bound).
    We allow c * K * eps32 (eps32 = 2 u32) to cover the extra rounding of multiplying a
    partial sum by the block scale. Rounding the result to bf16/fp16 adds u_out * |y|.
    """
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    K = x.shape[-1]
    s = np.abs(x) @ np.abs(w).T
    acc = c * K * EPS32 * s
    u = UNIT_OUT[dtype]
    return (1 + u) * acc + u * np.abs(reference_y64(x, w)) + np.finfo(np.float32).tiny


def make_gemv_case(N, K, dtype="bf16", M=1, dist="randn", seed=0, blocksize=64, x_dist="randn") -> GemvCase:
    """W (N, K) quantized by bitsandbytes (through nf4lab.lesson.cases, cached; ``dist`` as there: "heavy" is
    Student t weights), x (M, K) (``x_dist``: see :func:`make_x`), reference and tolerance."""
    from ..lesson.cases import make_case

    if dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be bf16 or fp16, got {dtype!r}")
    case = make_case((N, K), dtype=dtype, dist=dist, seed=seed, blocksize=blocksize)
    absmax = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
    w = reference.dequantize_f32(case.packed, absmax, case.n, blocksize).reshape(N, K)
    x_bits, x = make_x(M, K, dtype, seed, x_dist)
    return GemvCase(N=N, K=K, M=M, dtype=dtype, blocksize=blocksize, packed=case.packed,
                    absmax_q=case.absmax_q, absmax2=case.absmax2, code2=case.code2,
                    offset=np.float32(case.offset), lut=case.lut.copy(), x_bits=x_bits, x=x, w=w,
                    y64=reference_y64(x, w), tol=tolerance(x, w, dtype), case=case)


def to_f32(y, dtype) -> np.ndarray:
    """Output (numpy bits / floats, numba device array or torch tensor) as float32 values."""
    if hasattr(y, "copy_to_host"):
        y = y.copy_to_host()
    if type(y).__module__.startswith("torch"):
        y = y.detach().float().cpu().numpy()
    y = np.asarray(y)
    if y.dtype.kind in "ui":
        return reference.bits_to_f32(y.astype(np.uint16), dtype).reshape(y.shape)
    return y.astype(np.float32)


@dataclasses.dataclass
class GemvReport:
    name: str
    ok: bool
    max_err: float
    worst_ratio: float       # max |y - y64| / tol (<= 1 passes)
    n_bad: int
    n: int
    first_bad: list

    def __bool__(self):
        return self.ok

    def __str__(self):
        head = (f"{self.name}: {'within' if self.ok else 'OUTSIDE'} the float32 tolerance "
                f"({self.n:,} outputs, max |y - y64| = {self.max_err:.3g}, worst error/tolerance = "
                f"{self.worst_ratio:.3g})")
        if self.ok:
            return head
        lines = [head, f"  {self.n_bad:,} outputs outside; first ones (m, n, y, y64, tol):"]
        lines += [f"    {m:>3} {n:>6} {y:>12.6g} {r:>12.6g} {t:>10.3g}" for m, n, y, r, t in self.first_bad]
        return "\n".join(lines)


class GemvError(AssertionError):
    pass


def compare(y, gc: GemvCase, name="kernel", M=None) -> GemvReport:
    M = gc.M if M is None else M
    yv = to_f32(y, gc.dtype).reshape(-1)[: M * gc.N].reshape(M, gc.N).astype(np.float64)
    ref, tol = gc.y64[:M], gc.tol[:M]
    err = np.abs(yv - ref)
    bad = ~(err <= tol)  # NaN counts as bad
    idx = np.argwhere(bad)[:8]
    first = [(int(m), int(n), float(yv[m, n]), float(ref[m, n]), float(tol[m, n])) for m, n in idx]
    ratio = float(np.nanmax(np.where(np.isfinite(err), err / tol, np.inf))) if err.size else 0.0
    return GemvReport(name, not bad.any(), float(np.nanmax(err)) if err.size else 0.0, ratio,
                      int(bad.sum()), yv.size, first)


def check(y, gc: GemvCase, name="kernel", raise_on_error=True, M=None) -> GemvReport:
    """Compare an output with the float64 reference; raise :class:`GemvError` if outside the tolerance."""
    rep = compare(y, gc, name, M)
    if not rep.ok and raise_on_error:
        raise GemvError(str(rep))
    return rep


def bnb_output(gc: GemvCase, device="cpu"):
    """bitsandbytes.matmul_4bit(x, W.t(), quant_state) on the case (CPU in the simulator)."""
    import bitsandbytes as bnb
    import torch

    packed, qs, x = gc.bnb_tensors(device)
    with torch.no_grad():
        return bnb.matmul_4bit(x, packed.t(), quant_state=qs)


# ---------------------------------------------------------------- device buffers
@dataclasses.dataclass
class GemvBuffers:
    packed_u32: object      # uint32 view of the packed codes (16-byte aligned)
    absmax_q: object
    absmax2: object
    code2: object
    lut: object
    offset: np.float32
    x_u32: object           # uint32 view of x bits (M, K) flattened: x[m, 2j] low half of word m*K/2 + j
    y: object               # uint16 (M * N) output bits
    N: int
    K: int
    M: int
    bs_shift: int           # log2(blocksize)
    dtype: str
    stream: object = 0
    grid: int | None = None  # a launch may honour it instead of its own grid (tests: the grid-stride loop)

    def result(self):
        from numba import cuda

        cuda.synchronize()
        return self.y.copy_to_host()


def _check_layout(N, K, blocksize):
    if K % 64:
        raise ValueError(f"K={K}: the fused kernel needs K a multiple of 64 (each lane takes 64 consecutive "
                         "columns, one absmax block, of a row; bitsandbytes itself falls back to "
                         "dequantize+matmul unless K is a multiple of the blocksize)")
    if blocksize < 64 or blocksize & (blocksize - 1):
        raise ValueError(f"blocksize {blocksize}: a power of two >= 64 is needed (64 columns share one scale)")




def _address(arr) -> int:
    """Device address of a numba device array (or of the host array behind a simulator array)."""
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    from . import ops

    return int(ops._host_array(arr).__array_interface__["data"][0])


def _ceil_div(a, b):
    return -(-a // b)


# (parameter, dtype, elements needed as a function of N, K, M and the blocksize, read with 128-bit loads)
_PARAMS = (
    ("packed_u32", np.uint32, lambda N, K, M, bs: _ceil_div(N * K, 8), True),
    ("absmax_q", np.uint8, lambda N, K, M, bs: _ceil_div(N * K, bs), False),
    ("absmax2", np.float32, lambda N, K, M, bs: _ceil_div(_ceil_div(N * K, bs), reference.NESTED_BLOCKSIZE), False),
    ("code2", np.float32, lambda N, K, M, bs: 256, False),
    ("lut", np.float32, lambda N, K, M, bs: 16, False),
    ("x_u32", np.uint32, lambda N, K, M, bs: M * K // 2, True),
    ("y", np.uint16, lambda N, K, M, bs: M * N, False),
)


def validate(g, max_m: int = MAX_M) -> None:
    """Everything a launch checks before it launches, so that bad input raises here, naming the parameter,
    instead of reading out of bounds or faulting on a misaligned 128-bit load (a sticky error that kills the
    CUDA context). TypeError for a wrong dtype, ValueError for a wrong size, batch or alignment."""
    if g.dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be 'bf16' or 'fp16', got {g.dtype!r}")
    for name in ("N", "K", "M", "bs_shift"):
        v = getattr(g, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 1 <= g.M <= max_m:
        raise ValueError(f"M={g.M}: this kernel takes 1 to {max_m} rows of x (batch), got {g.M}")
    if g.N < 1:
        raise ValueError(f"N={g.N}: W needs at least one row")
    if not 6 <= g.bs_shift <= 12:
        raise ValueError(f"bs_shift={g.bs_shift}: the blocksize 2**bs_shift must be 64..4096")
    _check_layout(g.N, g.K, 1 << g.bs_shift)
    if g.N * g.K // 8 >= 1 << 32:
        raise ValueError(f"N*K={g.N * g.K}: word indices must fit in 32 bits (N*K < 2**35)")
    if not isinstance(g.offset, (float, np.floating)):
        raise TypeError(f"offset must be a float32 scalar, got {type(g.offset).__name__}")
    for name, dt, need, aligned in _PARAMS:
        arr = getattr(g, name)
        if arr is None or not hasattr(arr, "dtype") or not hasattr(arr, "shape"):
            raise TypeError(f"{name} must be a device array, got {type(arr).__name__}")
        if np.dtype(arr.dtype) != np.dtype(dt):
            raise TypeError(f"{name} must have dtype {np.dtype(dt).name}, got {np.dtype(arr.dtype).name}")
        if len(arr.shape) != 1:
            raise ValueError(f"{name} must be 1-D (flattened), got shape {tuple(arr.shape)}")
        n = need(g.N, g.K, g.M, 1 << g.bs_shift)
        if arr.shape[0] < n:
            raise ValueError(f"{name} has {arr.shape[0]} elements; N={g.N}, K={g.K}, M={g.M} need {n}")
        if aligned and _address(arr) % 16:
            raise ValueError(f"{name} is not 16-byte aligned (address {_address(arr):#x}): the kernel reads it "
                             "with 128-bit loads, and a misaligned one kills the CUDA context")


def make_gemv_buffers(gc: GemvCase) -> GemvBuffers:
    from numba import cuda

    _check_layout(gc.N, gc.K, gc.blocksize)
    packed = np.zeros(-(-gc.packed.size // 16) * 16, np.uint8)
    packed[: gc.packed.size] = gc.packed
    xb = np.ascontiguousarray(gc.x_bits.reshape(-1)).view(np.uint32)
    y = np.full(gc.M * gc.N, 0x7FBF, np.uint16)  # poison: a NaN no kernel writes
    return GemvBuffers(
        packed_u32=cuda.to_device(packed).view(np.uint32), absmax_q=cuda.to_device(gc.absmax_q),
        absmax2=cuda.to_device(gc.absmax2), code2=cuda.to_device(gc.code2), lut=cuda.to_device(gc.lut),
        offset=np.float32(gc.offset), x_u32=cuda.to_device(xb), y=cuda.to_device(y),
        N=gc.N, K=gc.K, M=gc.M, bs_shift=int(gc.blocksize).bit_length() - 1, dtype=gc.dtype)


def buffers_from_torch(packed, qs, x, y) -> GemvBuffers:
    """Zero-copy GemvBuffers over torch CUDA tensors (bitsandbytes' own QuantState), for timing."""
    import torch
    from numba import cuda

    N, K = qs.shape
    _check_layout(N, K, qs.blocksize)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]
    assert packed.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0
    arr = lambda t: cuda.as_cuda_array(t.reshape(-1))  # noqa: E731
    return GemvBuffers(
        packed_u32=arr(packed.reshape(-1).view(torch.int32)).view(np.uint32), absmax_q=arr(qs.absmax),
        absmax2=arr(qs.state2.absmax.float()), code2=arr(qs.state2.code.float()), lut=arr(qs.code.float()),
        offset=np.float32(qs.offset.item()), x_u32=arr(x.reshape(-1).view(torch.int32)).view(np.uint32),
        y=arr(y.reshape(-1).view(torch.int16)).view(np.uint16), N=N, K=K, M=x.numel() // K,
        bs_shift=int(qs.blocksize).bit_length() - 1, dtype=dtype)




_LUT = {}


def launch_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, out):
    """y = x @ W.T into ``out`` (M, N) on torch's current stream, W (N, K) = ``shape`` in NF4 with nested
    statistics; all CUDA tensors, x/out bf16 or fp16, x and packed 16-byte aligned (validate checks)."""
    import torch

    N, K = shape
    dev = x.device.index or 0
    if dev not in _LUT:
        _LUT[dev] = cuda.to_device(reference.NF4_LUT.astype(np.float32))
    arr = lambda t: cuda.as_cuda_array(t.reshape(-1))  # noqa: E731
    g = GemvBuffers(packed_u32=arr(packed.reshape(-1).view(torch.int32)).view(np.uint32), absmax_q=arr(absmax_q),
                    absmax2=arr(absmax2), code2=arr(code2), lut=_LUT[dev], offset=np.float32(offset),
                    x_u32=arr(x.reshape(-1).view(torch.int32)).view(np.uint32),
                    y=arr(out.reshape(-1).view(torch.int16)).view(np.uint16), N=int(N), K=int(K),
                    M=x.numel() // K, bs_shift=int(blocksize).bit_length() - 1,
                    dtype={torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype],
                    stream=cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream))
    launch(g)


# ---------------------------------------------------------------- the byte model and the benchmark (GPU)
def weight_bytes(N, K, blocksize=64) -> int:
    """Bytes a GEMV must read for the weight: packed codes + absmax_q + absmax2 + code2 (x, y not counted)."""
    n = N * K
    nblocks = -(-n // blocksize)
    return -(-n // 2) + nblocks + 4 * -(-nblocks // reference.NESTED_BLOCKSIZE) + 1024


def unfused_bytes(N, K, itemsize=2, blocksize=64) -> int:
    """Dequantize then multiply: read the packed weight, write W in 16 bits, read it again."""
    return weight_bytes(N, K, blocksize) + 2 * itemsize * N * K


FUSED = "fused NF4 gemv (numba)"  # every record of our kernels: f"{FUSED} [{variant}]" (kernel_name)
BNB_GEMV = "bitsandbytes matmul_4bit gemv (M=1)"        # matmul_4bit runs its fused gemv_4bit kernel
BNB_GEMM = "bitsandbytes matmul_4bit gemm_4bit (M>1)"   # ... and its fused gemm_4bit kernel for M > 1
BNB_DQ_MM = "bitsandbytes dequantize_4bit + torch.matmul gemv"
NAME_BATCH = NAME + "_batch"
COPY_BYTES = 1 << 30  # the copy ceiling: a 1 GiB copy (512 MiB read + 512 MiB written), far beyond L2
from ..measure.bench import COPY  # noqa: E402  (the copy ceiling's record name: one spelling, nf4lab.measure.bench's)


def kernel_name(variant: str) -> str:
    return f"{FUSED} [{variant}]"


def bnb_name(M: int) -> str:
    return BNB_GEMV if M == 1 else BNB_GEMM


def default_kernel(run) -> str:
    """Name of the kernel record a run shows: the first variant timed."""
    return run.meta.get("default_kernel") or kernel_name("auto")


def _quantize_gpu(N, K, dtype, seed=0, M=1):
    import bitsandbytes.functional as F
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = getattr(torch, TORCH_DTYPE[dtype])
    w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    x = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    return packed, qs, x


def _gpu_reference(packed, qs, x):
    """(y64, tol) on the GPU: bitsandbytes' float32 weights, float64 products and sums."""
    import bitsandbytes.functional as F
    import torch

    qs32 = qs.__class__(absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize,
                        quant_type=qs.quant_type, dtype=torch.float32, offset=qs.offset, state2=qs.state2)
    w = F.dequantize_4bit(packed, qs32).double()
    xd = x.double()
    y64 = xd @ w.T
    K = x.shape[-1]
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]
    u = UNIT_OUT[dtype]
    acc = K * EPS32 * (xd.abs() @ w.abs().T)
    tol = (1 + u) * acc + u * y64.abs() + np.finfo(np.float32).tiny
    del w
    return y64, tol


def _gpu_check(y, y64, tol, name):
    err = (y.double().reshape(y64.shape) - y64).abs()
    bad = ~(err <= tol)
    ratio = float((err / tol).max())
    return {"name": name, "ok": not bool(bad.any()), "worst_ratio": ratio, "max_err": float(err.max())}


def benchmark(launch, shapes=LLM_SHAPES, dtypes=("bf16", "fp16"), ms=(1,), *, variant_dtypes=None,
              deadline=None, progress=print):
    """Fused kernel(s) vs bitsandbytes on the same data, in one run (GPU only).

    ``launch``: a launch function (``launch(g)``, ``g`` a :class:`GemvBuffers`, on ``g.stream``) or a dict
    {variant: launch} timed side by side, each recorded as ``kernel_name(variant)``; the first is the
    default (``run.meta["default_kernel"]``). ``ms``: batch sizes (rows of x); bitsandbytes' ``matmul_4bit``
    without grad is its fused ``gemv_4bit`` at M = 1 and ``gemm_4bit`` for M > 1 (:data:`BNB_GEMV`, :data:`BNB_GEMM`). ``variant_dtypes``: dtypes on which
    the variants after the first are timed (default: all). ``deadline``: a ``time.time()`` after which no
    new (shape, dtype, M) is started (``meta["incomplete"]`` says so), to keep a GPU session in budget.
    To keep repeated launches from reading the weights out of L2 (50 MB on an H100), every timed function
    cycles through enough copies of the weight to exceed 4x the L2 size, as a decoding step does (each
    layer's weights are read once per token). Every output is checked against a float64 reference first.
    Returns a :class:`nf4lab.measure.bench.Run` (records: ceilings, baselines, kernels, each with its "M").
    """
    import time

    from ..measure import bench
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    bench._require_gpu()
    launches = dict(launch) if isinstance(launch, dict) else {"default": launch}
    first = next(iter(launches))
    names = {key: kernel_name(key) for key in launches}
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2 so each "
                    "launch reads them from DRAM; effective bandwidth = weight bytes (packed + absmax_q + "
                    "absmax2 + code2) / time")
    l2 = runtime.device_info().get("l2_bytes") or (50 << 20)
    t0 = time.time()
    ceil = bench.ceilings(COPY_BYTES)
    run.meta.update(copy_ceiling_bytes=COPY_BYTES, checks=[], default_kernel=names[first], variants=list(launches),
                    batch_sizes=list(ms), incomplete=False)
    for N, K in shapes:
        for dtype in dtypes:
            for M in ms:
                if deadline is not None and time.time() > deadline:
                    run.meta["incomplete"] = True
                    if progress:
                        progress(f"deadline reached: {N}x{K} {dtype} M={M} and later skipped")
                    continue
                keys = [k for k in launches if k == first or variant_dtypes is None or dtype in variant_dtypes]
                _bench_one(run, launches, keys, names, N, K, dtype, M, l2, ceil, bnb, F, torch, bench, progress)
    run.meta["seconds"] = round(time.time() - t0, 1)
    run.finalize()
    for r in run.records:  # speedup relative to bitsandbytes' matmul_4bit at the same shape, dtype and M
        if r["kind"] == "ceiling" or not r.get("ms"):
            continue
        b = next((q for q in run.records if q["name"] == bnb_name(r.get("M", 1)) and q["shape"] == r["shape"]
                  and q["dtype"] == r["dtype"] and q.get("M", 1) == r.get("M", 1)), None)
        r["speedup_vs_bnb"] = b["ms"] / r["ms"] if b and b.get("ms") else None
    return run


def _bench_one(run, launches, keys, names, N, K, dtype, M, l2, ceil, bnb, F, torch, bench, progress):
    import time

    t_start = time.time()
    nb = weight_bytes(N, K)
    copies = max(2, math.ceil(4 * l2 / nb))
    data = [_quantize_gpu(N, K, dtype, seed=i, M=M) for i in range(copies)]
    x = data[0][2]
    data = [(p, q, x) for p, q, _ in data]
    y = torch.empty(M, N, dtype=x.dtype, device="cuda")
    bufs = [buffers_from_torch(p, q, x, y) for p, q, _ in data]
    # correctness on copy 0, against float64, for ours and bitsandbytes
    y64, tol = _gpu_reference(*data[0])
    bufs[0].stream = 0
    yb = bnb.matmul_4bit(x, data[0][0].t(), quant_state=data[0][1])
    chk_b = _gpu_check(yb, y64, tol, bnb_name(M))
    checks = {}
    for key in keys:
        fn = launches[key]
        fn(bufs[0])  # the first launch compiles (a launch may size its grid from the compiled kernel)
        y.fill_(float("nan"))
        fn(bufs[0])
        torch.cuda.synchronize()
        checks[key] = _gpu_check(y, y64, tol, names[key])
        diff = float((y.float() - yb.float().reshape(y.shape)).abs().max())
        checks[key].update(shape=[N, K], dtype=dtype, M=M, max_abs_diff_vs_bnb=diff)
        run.meta["checks"].append(checks[key])
    chk = checks[keys[0]]
    chk_b.update(shape=[N, K], dtype=dtype, M=M, max_abs_diff_vs_bnb=chk["max_abs_diff_vs_bnb"])
    run.meta["checks"].append(chk_b)
    del y64, tol
    state = {"i": 0}

    def nxt():
        i = state["i"]
        state["i"] = (i + 1) % copies
        return i

    def make_ours(fn):
        def ours(stream):
            g = bufs[nxt()]
            g.stream = stream
            fn(g)

        return ours

    def bnb_mm(stream):
        p, q, xx = data[nxt()]
        bnb.matmul_4bit(xx, p.t(), quant_state=q)

    def bnb_dq_mm(stream):
        p, q, xx = data[nxt()]
        torch.matmul(xx, F.dequantize_4bit(p, q).t())

    for kind, name, fn, ok in (("baseline", bnb_name(M), bnb_mm, chk_b["ok"]),
                               ("baseline", BNB_DQ_MM, bnb_dq_mm, None),
                               *(("kernel", names[key], make_ours(launches[key]), checks[key]["ok"])
                                 for key in keys)):
        state["i"] = 0
        t = bench.gpu_time_ms(fn, launches=max(bench.LAUNCHES, copies))
        rec = bench._record(kind, name, (N, K), dtype, t, nb, bit_exact=None, within_tol=ok,
                            copies=copies, fits_l2=False, M=M)
        run.add(rec)
    if not any(r["kind"] == "ceiling" and r["shape"] == [N, K] and r["dtype"] == dtype for r in run.records):
        for c in ceil:
            run.add(dict(c, shape=[N, K], dtype=dtype))
    if progress:
        progress(f"{N}x{K} {dtype} M={M}: {time.time() - t_start:.0f} s ({copies} weight copies); "
                 f"{names[keys[0]]} within tolerance: {chk['ok']} (worst {chk['worst_ratio']:.2g}), "
                 f"bnb: {chk_b['ok']} (worst {chk_b['worst_ratio']:.2g}), "
                 f"max |ours - bnb| = {chk['max_abs_diff_vs_bnb']:.3g}; "
                 + ", ".join(f"{k} {'ok' if checks[k]['ok'] else 'OUTSIDE TOLERANCE'}" for k in keys[1:]))
    data.clear()  # the closures above keep the lists, not the tensors
    bufs.clear()
    torch.cuda.empty_cache()



# ---------------------------------------------------------------- showing a run
def find_record(run, name, shape, dtype, M=1):
    return next((r for r in run.records if r["name"] == name and list(r["shape"]) == list(shape)
                 and r["dtype"] == dtype and r.get("M", 1) == M), None)


def summary(run, bound=None) -> str:
    """Per shape, dtype and M: the default kernel against bitsandbytes' matmul_4bit, in us and x bitsandbytes,
    as % of the copy ceiling, and against ``bound`` (lab/gemv_read_bound.py's run: a kernel that only reads
    the weight bytes) as % of its speed; the tolerance verdicts of both, from the run's checks."""
    ours, copy = default_kernel(run), next((r for r in run.records if r["name"] == COPY), None)
    ok = {(c["name"], tuple(c["shape"]), c["dtype"], c.get("M", 1)): c["ok"] for c in run.meta.get("checks", [])}
    lines = [f"{'W (N x K)':>11} {'dtype':>5} {'M':>2} {'ours us':>8} {'bnb us':>7} {'x bnb':>6} {'% copy':>7} "
             f"{'% of read':>9}  within tolerance (ours, bnb)"]
    for r in run.records:
        if r["name"] != ours:
            continue
        M, key = r.get("M", 1), (tuple(r["shape"]), r["dtype"], r.get("M", 1))
        b = find_record(run, bnb_name(M), r["shape"], r["dtype"], M)
        rb = bound and next((q for q in bound.records if q["kind"] == "bound" and q["shape"] == r["shape"]), None)
        lines.append(f"{'x'.join(map(str, r['shape'])):>11} {r['dtype']:>5} {M:>2} {r['ms'] * 1e3:8.1f} "
                     f"{b['ms'] * 1e3 if b else float('nan'):7.1f} {b['ms'] / r['ms'] if b else float('nan'):6.2f} "
                     + (f"{100 * r['gbps'] / copy['gbps']:6.0f}% " if copy else f"{'-':>7} ")
                     + (f"{100 * rb['ms'] / r['ms']:8.0f}%  " if rb else f"{'-':>9}  ")
                     + f"{ok.get((ours, *key))}, {ok.get((bnb_name(M), *key))}")
    return "\n".join(lines)


def check_exercise(launch_fn, name="exercise: warp reduction") -> bool:
    """Grade a GEMV launch function on a small case against the float64 reference; prints the verdict."""
    gc = make_gemv_case(16, 128, "bf16", seed=3)
    g = make_gemv_buffers(gc)
    try:
        launch_fn(g)
        rep = compare(g.result(), gc, name=name)
    except Exception as exc:  # a broken kernel must not stop the notebook
        print(f"NOT PASSED: the kernel raised {type(exc).__name__}: {exc}")
        return False
    print(("PASSED: " if rep.ok else "NOT PASSED (not solved yet): ") + str(rep))
    return rep.ok


def plot(run, batch=False):
    """Effective weight bandwidth (weight bytes / time): per shape and dtype as bars (batch 1: ours,
    bitsandbytes' gemv_4bit, dequantize + matmul), or against M as lines (``batch``: ours solid,
    bitsandbytes' matmul_4bit dashed); the copy ceiling dashed red. Draws only what the run measured."""
    import matplotlib.pyplot as plt

    from ..measure import results

    ours = default_kernel(run)
    recs = [r for r in run.records if r["kind"] in ("kernel", "baseline")]
    keys = list(dict.fromkeys((tuple(r["shape"]), r["dtype"]) for r in recs))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    if batch:
        for i, (shape, dtype) in enumerate(keys):
            for names, style, who in (((ours,), "-o", "ours"), ((BNB_GEMV, BNB_GEMM), "--s", "bitsandbytes matmul_4bit")):
                pts = sorted((r.get("M", 1), r["gbps"]) for r in recs
                             if tuple(r["shape"]) == shape and r["dtype"] == dtype and r["name"] in names)
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{i % 10}", label=f"{shape[0]}x{shape[1]} {dtype}: {who}")
        ms = sorted({r.get("M", 1) for r in recs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.set_xlabel("batch M (rows of x)")
    else:
        names = [BNB_DQ_MM, BNB_GEMV, ours]
        for j, name in enumerate(names):
            pts = [(i + (j - 1) * 0.27, r["gbps"]) for i, k in enumerate(keys) if (r := find_record(run, name, *k))]
            if pts:
                ax.bar(*zip(*pts), 0.27, label=name + (" (default)" if name == ours else ""))
        ax.set_xticks(range(len(keys)), [f"{s[0]}x{s[1]}\n{d}" for s, d in keys], fontsize=8)
        ax.set_xlabel("W shape (N out x K in), activation dtype; batch 1")
    copy = next((r for r in run.records if r["name"] == COPY), None)
    if copy:
        ax.axhline(copy["gbps"], color="tab:red", ls="--", lw=1, label=f"copy ceiling {copy['gbps']:.0f} GB/s")
    ax.set_ylabel("effective weight bandwidth, GB/s")
    ax.set_title("Fused NF4 GEMV: weight bytes read per second")
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.text(0.01, 0.005, "measured on " + results.label(run.meta), fontsize=7, color="0.35", va="bottom")
    return ax
