"""The fused NF4 GEMV of notebook 09: ``y = x @ W.T`` for 1 to 8 rows of x, W (N, K) in bitsandbytes' NF4.

The shipped design (the one notebook 09 teaches, cell by cell) and what launching it needs:

- ``launch(g, design=None)``: the stable entry point. ``g`` is a :class:`GemvBuffers` (batch ``g.M`` <= 8),
  the launch runs on ``g.stream``; ``design`` None is ``default_design(N, M)``: the tensor-core kernel
  (:mod:`nf4lab.kernels.gemv_tc`) on sm_80+, else ``auto_design(N, M)``, notebook 09's FFMA design.
  ``validate(g)`` runs first.
- ``Design`` / ``make_gemv(is_bf16, d)`` / ``kernel(d, dtype)`` / ``auto_design`` / ``grid_size``.
- ``make_gemv_buffers`` / ``buffers_from_torch`` / ``validate``; ``launch_torch`` for the torch ops.
- Device ops with plain-Python twins: ``f32_from_bits``, ``f16_to_f32``, ``lds_pair`` (ld.shared.v2.f32 at
  a byte offset), ``load_stream_u32x4`` (ld.global.nc.L1::no_allocate.v4.u32), ``bar_sync`` (a named
  barrier), ``shfl_down_sync``.

Its float64 reference and checks (``make_gemv_case``, ``tolerance``, ``compare``/``check``, ``bnb_output``)
are in :mod:`nf4lab.lesson.gemv_check`; its benchmark beside bitsandbytes (``benchmark``, ``summary``,
``plot``, ``weight_bytes``) in :mod:`nf4lab.measure.gemv_bench`. Both stay reachable here
(``gemv.check``, ``gemv.benchmark``), as notebook 09 calls them. The design family the lab measured
(variants, profiles, SASS reports) lives in ``lab/``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from ..lesson import reference
from . import arch, ops
from numba import cuda, float32, uint32, uint64  # noqa: E402  (a module global: the simulator swaps it in kernels)

LLM_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))  # (N, K) = W.shape
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
    and gets the value of lane ``source(lane)``, or its own where that lane is past the warp's end
    (``source`` None: the list of every lane's value).

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
        if source is None:  # every lane's value, in lane order (the mma twin needs the whole warp)
            out = list(warp.vals[:n])
            warp.barrier.wait()
            return out
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
    """What one warp does per loop trip (an "item": R rows x 32 lanes x 32 columns) and how warps share work;
    ``tc``: the tensor-core kernel instead (:mod:`nf4lab.kernels.gemv_tc`, sm_80+), which has no R or S."""
    rows: int = 4        # R: rows of W per item; each activation, converted once, feeds R rows
    split: int = 1       # S: warps sharing a group of rows, each taking every S-th item of K (split-K)
    m: int = 1           # batch: rows of x, each weight read once for all of them
    min_blocks: int = 2  # launch bounds: 256-thread blocks per SM ptxas must fit (caps the registers)
    tc: bool = False
    nested: bool = True  # nested statistics (bitsandbytes' default); plain ones only with tc

    @property
    def name(self):  # the lab's variant names: 32 columns per lane, 8 warps per block
        if self.tc:
            return "TC" + (f" M{self.m}" if self.m > 1 else "") + ("" if self.nested else " plain")
        return f"R{self.rows} S{self.split} C32 W8 B{self.min_blocks}" + (f" M{self.m}" if self.m > 1 else "")


THREADS = 256  # 8 warps per block: the kernel's launch bounds and every launch


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
    W, STEP, SSH = 8, 1024, 10   # THREADS = 8 warps; a warp covers 32 lanes x 32 columns per item
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
        if d.tc:
            from . import gemv_tc

            base = gemv_tc.probe_base() if runtime.ON_GPU else gemv_tc.default_base(arch.target_cc())
            _KERNELS[(d, dtype)] = gemv_tc.make_kernel(dtype == "bf16", d.m, base, d.nested)
        else:
            _KERNELS[(d, dtype)] = make_gemv(dtype == "bf16", d)
    return _KERNELS[(d, dtype)]


def dynamic_smem(d) -> int:
    """Bytes of dynamic shared memory a launch of design d asks for (the FFMA designs use static memory)."""
    if not d.tc:
        return 0
    from . import gemv_tc

    return gemv_tc.dynamic_smem(d.m)


_SMS: dict = {}


def sms():
    """The current GPU's SM count (the simulator has none: plan for an H100). Cached per device:
    device_info asks the driver for much more, which would cost each launch tens of microseconds."""
    dev = cuda.get_current_device().id if runtime.ON_GPU else None
    if dev not in _SMS:
        _SMS[dev] = runtime.device_info().get("sms") or 132
    return _SMS[dev]


def default_design(N, M=1):
    """What :func:`launch` and the torch ops run: the tensor-core kernel where the GPU has bf16 mma (sm_80+, not
    under NF4LAB_ARCH=sm_75), measured faster at every LLM shape and batch; else ``auto_design(N, M)``."""
    from . import gemv_tc

    if gemv_tc.available():
        return Design(tc=True, m=M, min_blocks=gemv_tc.BLOCKS_PER_SM)
    return auto_design(N, M)


def auto_design(N, M=1):
    """The FFMA kernel's Design (notebook 09's), chosen by measurement (lab/bench_gemv.py, H100): more rows per
    item won on every shape; which R and whether K is split depends on how many warps the row groups give the GPU."""
    if M == 1 and -(-N // 4) < 0.5 * 24 * sms():      # N/4 groups fill under half the warp slots (N = 4096)
        return Design(rows=4, split=2, min_blocks=3)
    if M == 1 and 2 * -(-N // 8) <= 16 * sms():       # R8 teams of 2 warps fit at 16 warps per SM (N = 8192)
        return Design(rows=8, split=2, min_blocks=2)
    return Design(rows=4, min_blocks=2, m=M)         # otherwise, and every batch (128 registers; M >= 4 spills)


def grid_size(d, N):
    """Blocks to launch: the fewest rounds the resident teams need (d.min_blocks blocks per SM, as the
    launch bounds make ptxas fit), and just enough teams that each does that many row groups."""
    if d.tc:
        from . import gemv_tc

        return gemv_tc.grid_size(N)
    teams_per_block = 8 // d.split
    groups = -(-N // d.rows)
    capacity = d.min_blocks * sms() * teams_per_block
    rounds = -(-groups // capacity)
    return min(-(-groups // teams_per_block), -(-groups // (rounds * teams_per_block)))


def launch(g, design=None, kern=None):
    """Run the fused GEMV on a :class:`GemvBuffers` (batch g.M <= 8) on g.stream: the stable entry point.
    ``design``: a Design (its m is set to g.M) or None for default_design(N, M); ``kern``: a kernel from
    make_gemv for that design instead of the cached one; ``g.grid`` (if set) replaces grid_size."""
    validate(g)  # dtypes, sizes, alignment, M: raises before anything is launched
    d = design or default_design(g.N, g.M)
    if d.m != g.M or d.nested != g.nested:
        d = dataclasses.replace(d, m=g.M, nested=g.nested)
    if not d.nested and not d.tc:
        raise ValueError("plain statistics: only the tensor-core design reads them (Design(tc=True), sm_80+ or "
                         "the simulator); the FFMA designs take nested statistics")
    kern = kern or kernel(d, g.dtype)
    grid = g.grid or grid_size(d, g.N)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    smem = dynamic_smem(d)
    if smem:
        from . import gemv_tc

        kern = gemv_tc.prepare(kern, args, smem)
    kern[grid, THREADS, g.stream, smem](*args)


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
    nested: bool = True      # False: absmax2 holds one float32 absmax per block; absmax_q, code2, offset unused

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
    ("packed_u32", np.uint32, lambda N, K, M, bs, nested: _ceil_div(N * K, 8), True),
    ("absmax_q", np.uint8, lambda N, K, M, bs, nested: _ceil_div(N * K, bs) if nested else 0, False),
    ("absmax2", np.float32, lambda N, K, M, bs, nested: _ceil_div(_ceil_div(N * K, bs), reference.NESTED_BLOCKSIZE)
     if nested else _ceil_div(N * K, bs), False),
    ("code2", np.float32, lambda N, K, M, bs, nested: 256 if nested else 0, False),
    ("lut", np.float32, lambda N, K, M, bs, nested: 16, False),
    ("x_u32", np.uint32, lambda N, K, M, bs, nested: M * K // 2, True),
    ("y", np.uint16, lambda N, K, M, bs, nested: M * N, False),
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
        n = need(g.N, g.K, g.M, 1 << g.bs_shift, g.nested)
        if arr.shape[0] < n:
            raise ValueError(f"{name} has {arr.shape[0]} elements; N={g.N}, K={g.K}, M={g.M} need {n}")
        if aligned and _address(arr) % 16:
            raise ValueError(f"{name} is not 16-byte aligned (address {_address(arr):#x}): the kernel reads it "
                             "with 128-bit loads, and a misaligned one kills the CUDA context")


def make_gemv_buffers(gc) -> GemvBuffers:
    """Device buffers of a :class:`nf4lab.lesson.gemv_check.GemvCase` (the output poisoned with NaN)."""
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
        N=gc.N, K=gc.K, M=gc.M, bs_shift=int(gc.blocksize).bit_length() - 1, dtype=gc.dtype, nested=gc.nested)


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


# Notebook 09 reaches the GEMV's reference and benchmark through this module (gemv.check,
# gemv.benchmark, ...): those names load from where they live on first use.
_ELSEWHERE = dict.fromkeys(("GemvCase", "GemvReport", "GemvError", "make_x", "reference_y64", "tolerance",
                            "make_gemv_case", "to_f32", "compare", "check", "bnb_output", "check_exercise",
                            "EPS32", "UNIT_OUT"), "..lesson.gemv_check")
_ELSEWHERE.update(dict.fromkeys(("weight_bytes", "unfused_bytes", "FUSED", "BNB_GEMV", "BNB_GEMM", "BNB_DQ_MM",
                                 "NAME_BATCH", "COPY_BYTES", "COPY", "kernel_name", "bnb_name", "default_kernel",
                                 "benchmark", "find_record", "summary", "plot"), "..measure.gemv_bench"))


def __getattr__(name):
    if name not in _ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_ELSEWHERE[name], __package__), name)
