"""Warp-level device operations of the tensor-core GEMV, each with a plain-Python twin for the simulator.

As in :mod:`nf4lab.device.ops`: on a GPU (or when compiling PTX) these are small ``@intrinsic`` functions that
emit one chosen instruction; in numba's simulator, where intrinsics do not run, the same names are Python
functions with the same results, so a kernel reads the same in both modes.

- ``mma_bf16`` / ``mma_f16``: ``mma.sync.m16n8k16`` with float32 accumulation. Below sm_80 (a T4) fp16 runs
  as two m16n8k8 and bf16 on the FP32 units from the warp's fragments (``_soft_mma``, about 3x the
  instructions); the simulator twin gathers the whole warp's fragments (``_py_warp_exchange``).
- ``prmt``: the byte permute. ``lookup`` / ``table_lookup(base)``: a 32-bit shared load with the table's base
  in the load's immediate; ``table_vec4(base)``: 128-bit shared loads and stores addressed the same way. ``shfl_xor_sync``, ``syncwarp``, ``f32_from_bits``.
- ``load_stream_u32x4``: a read-only 128-bit load that does not allocate in L1. ``load_u32_of_bytes``: 4 bytes of a
  uint8 array in one 32-bit load. ``shfl_idx``: another lane's 32 bits.
- ``probe_base()``: where dynamic shared memory starts in a block's shared window on this GPU.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from . import ops
from numba import cuda, int32, uint32  # noqa: E402  (module globals: the simulator swaps them in kernels)

def _py_f32_from_bits(u):
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def _py_prmt(a, b, sel):
    pool = (int(a) & 0xFFFFFFFF) | ((int(b) & 0xFFFFFFFF) << 32)
    return np.uint32(sum(((pool >> (8 * ((int(sel) >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4)))


def _py_lookup(tab, off):
    return np.uint32(np.asarray(tab).view(np.uint32)[int(off) >> 2])


def _py_load_stream_u32x4(arr, i):
    return ops._py_load_u32x4(arr, i)


def _py_load4(tab, off):
    w = np.asarray(tab).view(np.uint32)
    return tuple(np.uint32(v) for v in w[int(off) >> 2:(int(off) >> 2) + 4])


def _py_store4(tab, off, a, b, c, d):
    np.asarray(tab).view(np.uint32)[int(off) >> 2:(int(off) >> 2) + 4] = (a, b, c, d)


_WARPS: dict = {}


def _py_warp_exchange(value, source, name):
    """The simulator has no warp shuffles: exchange through a per-warp barrier. Every lane posts ``value``
    and gets the value of lane ``source(lane)``, or its own where that lane is past the warp's end
    (``source`` None: the list of every lane's value). Every lane must call it, as on a GPU with a full
    mask; a lane that returned early makes the others wait, and after 60 s the barrier raises."""
    import threading

    t = threading.current_thread()
    nthreads = int(np.prod(t._manager._block_dim))
    lane, w = t.thread_id % 32, t.thread_id // 32
    n = min(32, nthreads - 32 * w)
    warp = _WARPS.setdefault((id(t._manager), tuple(t.blockIdx), w, n), [threading.Barrier(n, timeout=60), [None] * n])
    warp[1][lane] = value
    try:
        warp[0].wait()
        out = list(warp[1][:n]) if source is None else (warp[1][source(lane)] if source(lane) < n else value)
        warp[0].wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"{name}: not every lane of the warp reached the shuffle (a lane returned early or "
                           "took another branch); on a GPU that is undefined behaviour") from None
    return type(value)(out) if isinstance(value, np.generic) else out


def _py_shfl_xor_sync(mask, value, delta):
    return _py_warp_exchange(value, lambda lane: lane ^ int(delta), "shfl_xor_sync")


def _py_syncwarp():
    _py_warp_exchange(0, None, "syncwarp")


def _py_bar_sync(bid, n):
    """``bar.sync bid, n`` in the simulator: n threads of the block meet at barrier ``bid`` (reused, as on a GPU)."""
    import threading

    t = threading.current_thread()
    bar = _WARPS.setdefault((id(t._manager), tuple(t.blockIdx), "bar", int(bid)), threading.Barrier(int(n), timeout=60))
    try:
        bar.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"bar_sync({int(bid)}, {int(n)}): not every thread of the group reached it") from None


def _py_shfl_idx(value, src):
    return _py_warp_exchange(value, lambda lane: int(src), "shfl_idx")


def _py_load_u32_of_bytes(arr, i):
    b = np.asarray(arr)[int(i):int(i) + 4].astype(np.uint32)
    return np.uint32(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24)


def _halves(u, is_bf16):
    u = int(u)
    if is_bf16:
        return [float(np.uint32((u & 0xFFFF) << 16).view(np.float32)), float(np.uint32(u & 0xFFFF0000).view(np.float32))]
    return [float(np.uint16(u & 0xFFFF).view(np.float16)), float(np.uint16(u >> 16).view(np.float16))]


def _py_mma(is_bf16, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """mma.sync.m16n8k16.row.col with float32 accumulation, from the whole warp's fragments (PTX ISA layout)."""
    import threading

    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for ln, (r0, r1, r2, r3, s0, s1) in enumerate(_py_warp_exchange((a0, a1, a2, a3, b0, b1), None, "mma")):
        g, q = ln >> 2, ln & 3
        A[g, 2 * q:2 * q + 2], A[g + 8, 2 * q:2 * q + 2] = _halves(r0, is_bf16), _halves(r1, is_bf16)
        A[g, 2 * q + 8:2 * q + 10], A[g + 8, 2 * q + 8:2 * q + 10] = _halves(r2, is_bf16), _halves(r3, is_bf16)
        B[2 * q:2 * q + 2, g], B[2 * q + 8:2 * q + 10, g] = _halves(s0, is_bf16), _halves(s1, is_bf16)
    D = A @ B
    g, q = (threading.current_thread().thread_id % 32) >> 2, threading.current_thread().thread_id & 3
    return (np.float32(c0 + D[g, 2 * q]), np.float32(c1 + D[g, 2 * q + 1]),
            np.float32(c2 + D[g + 8, 2 * q]), np.float32(c3 + D[g + 8, 2 * q + 1]))


def _soft_mma():
    """PTX for m16n8k16 bf16 -> f32 on the FP32 units (below sm_80): lane (g, q) fetches rows g, g + 8 of A from
    lanes (g, 0..3) and columns 2q, 2q + 1 of B from lanes (2q, 0..3), (2q + 1, 0..3) by shfl.sync, and sums
    its four outputs with 64 FMAs. Operands as the mma's: $0-3 D, $4-7 A, $8-9 B, $10-13 C."""
    L = ["{", ".reg .b32 %nl, %na, %nb, %nc, %ns<8>;", ".reg .f32 %nd<4>, %nf<8>;", "mov.u32 %nl, %laneid;",
         "and.b32 %na, %nl, 28;", "and.b32 %nb, %nl, 3;", "shl.b32 %nb, %nb, 3;", "or.b32 %nc, %nb, 4;"]
    L += [f"mov.f32 %nd{i}, ${10 + i};" for i in range(4)]
    for qq in range(4):
        L += [f"or.b32 %nl, %na, {qq};"] + [f"shfl.sync.idx.b32 %ns{i}, ${4 + i}, %nl, 31, -1;" for i in range(4)]
        for j, src in ((4, "%nb"), (6, "%nc")):
            L += [f"or.b32 %nl, {src}, {qq};", f"shfl.sync.idx.b32 %ns{j}, $8, %nl, 31, -1;",
                  f"shfl.sync.idx.b32 %ns{j + 1}, $9, %nl, 31, -1;"]
        for p in range(2):   # k = 2qq + p (A regs 0, 1; B regs 4, 6) and 2qq + 8 + p (A regs 2, 3; B regs 5, 7)
            op = "shl.b32 %nl, {}, 16;" if p == 0 else "and.b32 %nl, {}, -65536;"
            for i in range(8):
                L += [op.format(f"%ns{i}"), f"mov.b32 %nf{i}, %nl;"]
            for d, (ra, rb) in enumerate(((0, 4), (0, 6), (1, 4), (1, 6))):
                L += [f"fma.rn.f32 %nd{d}, %nf{ra}, %nf{rb}, %nd{d};", f"fma.rn.f32 %nd{d}, %nf{ra + 2}, %nf{rb + 1}, %nd{d};"]
    return "\n".join(L + [f"mov.f32 ${i}, %nd{i};" for i in range(4)] + ["}"])


# The device versions, built only where numba.cuda is real (a GPU, or compile mode); the twins are below.
if not runtime.SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, f32 = ir.IntType(32), ir.FloatType()
    fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
    cons = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"
    mma16 = "mma.sync.aligned.m16n8k16.row.col.f32.{0}.{0}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, {{$10, $11, $12, $13}};"
    k8 = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {}, {}, {}, {};"
    f16_two_k8 = "\n".join(["{", ".reg .f32 %nd<4>;", k8.format("{%nd0, %nd1, %nd2, %nd3}", "{$4, $5}", "{$8}", "{$10, $11, $12, $13}"),
                            k8.format("{$0, $1, $2, $3}", "{$6, $7}", "{$9}", "{%nd0, %nd1, %nd2, %nd3}"), "}"])

    def make_mma(new, old):
        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, sig, args):
                vals = [context.cast(builder, v, t, t) for v, t in zip(args, sig.args)]
                v = ops.by_arch(builder, 800, lambda: builder.call(ir.InlineAsm(fty, new, cons), vals),
                                lambda: builder.call(ir.InlineAsm(fty, old, cons), vals))
                return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, i) for i in range(4)])

            return sig, codegen

        return mma

    @intrinsic
    def prmt(typingctx, a, b, sel):
        """``prmt.b32 d, a, b, sel``: byte k of d is byte (sel >> 4k) & 7 of the 8 bytes b:a (a = bytes 0-3)."""
        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            return builder.call(ir.InlineAsm(ir.FunctionType(i32, [i32] * 3), "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r"), vals)

        return types.uint32(types.uint32, types.uint32, types.uint32), codegen

    @intrinsic
    def f32_from_bits(typingctx, u):
        def codegen(context, builder, sig, args):
            return builder.bitcast(context.cast(builder, args[0], sig.args[0], types.uint32), f32)

        return types.float32(types.uint32), codegen

    @intrinsic
    def load_stream_u32x4(typingctx, arr, i):
        """128 bits at uint32 element ``i`` (a multiple of 4) of a 16-byte aligned array, read-only and not kept
        in L1 (``ld.global.nc.L1::no_allocate.v4.u32``): weights are read once, L1 keeps x and the scales."""
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.ndim == 1):
            return None

        def codegen(context, builder, sig, args):
            from numba.cuda import cgutils

            ary = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]], wraparound=False)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * 4), [ir.IntType(64)]),
                               "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
            v = builder.call(asm, [builder.ptrtoint(ptr, ir.IntType(64))])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, k) for k in range(4)])

        return types.UniTuple(types.uint32, 4)(arr, i), codegen

    @intrinsic
    def load_u32_of_bytes(typingctx, arr, i):
        """The 32 bits at byte ``i`` (a multiple of 4) of a 4-byte aligned uint8 array, little-endian: 4 bytes in
        one ``ld.global.u32``."""
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint8 and arr.ndim == 1):
            return None

        def codegen(context, builder, sig, args):
            from numba.cuda import cgutils

            ary = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]], wraparound=False)
            asm = ir.InlineAsm(ir.FunctionType(i32, [ir.IntType(64)]), "ld.global.u32 $0, [$1];", "=r,l")
            return builder.call(asm, [builder.ptrtoint(ptr, ir.IntType(64))])

        return types.uint32(arr, i), codegen

    @intrinsic
    def bar_sync(typingctx, bid, n):
        """``bar.sync bid, n``: a barrier of n threads (a multiple of 32) of the block, id 1-15 (0 is syncthreads')."""
        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i32]), "bar.sync $0, $1;", "r,r,~{memory}",
                               side_effect=True)
            builder.call(asm, vals)
            return context.get_dummy_value()

        return types.none(types.uint32, types.uint32), codegen

    @intrinsic
    def dyn_base(typingctx):
        """The shared-window address where the block's dynamic shared memory starts."""
        def codegen(context, builder, sig, args):
            mod = builder.module
            gv = mod.globals.get("nf4lab_dyn_smem")
            if gv is None:  # every extern shared array starts where the block's dynamic shared memory does
                gv = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(8), 0), "nf4lab_dyn_smem", addrspace=3)
                gv.linkage, gv.align = "external", 16
            return builder.trunc(builder.ptrtoint(gv, ir.IntType(64)), i32)

        return types.uint32(), codegen

    mma_bf16, mma_f16 = make_mma(mma16.format("bf16"), _soft_mma()), make_mma(mma16.format("f16"), f16_two_k8)


@functools.cache
def _lookup_at(base):
    """``ld.shared.u32 d, [off + base]``: the table's base in the load's immediate, no add per lookup."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def lookup(typingctx, off):
        def codegen(context, builder, sig, args):
            o = context.cast(builder, args[0], sig.args[0], types.uint32)
            i32 = ir.IntType(32)
            return builder.call(ir.InlineAsm(ir.FunctionType(i32, [i32]), f"ld.shared.u32 $0, [$1+{int(base)}];",
                                             "=r,r"), [o])

        return types.uint32(types.uint32), codegen

    return lookup


# nf4lab.measure.ptx pickles these by name, so that a PTX subprocess (compile mode) gets the device versions.
DEVICE_OPS = ("mma_bf16", "mma_f16", "prmt", "lookup", "shfl_xor_sync", "f32_from_bits", "load_stream_u32x4", "syncwarp",
              "shared_load4", "shared_store4", "shfl_idx", "load_u32_of_bytes", "bar_sync")
if runtime.SIMULATOR:
    mma_bf16, mma_f16 = functools.partial(_py_mma, True), functools.partial(_py_mma, False)
    prmt, lookup, shfl_xor_sync, dyn_base, syncwarp = _py_prmt, _py_lookup, _py_shfl_xor_sync, None, _py_syncwarp
    shared_load4, shared_store4 = _py_load4, _py_store4
    f32_from_bits, load_stream_u32x4 = _py_f32_from_bits, _py_load_stream_u32x4
    shfl_idx, load_u32_of_bytes, bar_sync = _py_shfl_idx, _py_load_u32_of_bytes, _py_bar_sync
else:
    _lds_stand_in = _lookup_at(0x400)

    @cuda.jit(device=True, inline="always")
    def lookup(tab, off):  # the PTX tool's stand-in for the simulator's twin (any base assembles)
        return _lds_stand_in(off)

    shfl_xor_sync = cuda.shfl_xor_sync

    @cuda.jit(device=True, inline="always")
    def syncwarp():
        cuda.syncwarp(0xFFFFFFFF)

    @cuda.jit(device=True, inline="always")
    def shfl_idx(value, src):  # lane src's value, full warp (numba shuffles signed ints)
        return uint32(cuda.shfl_sync(0xFFFFFFFF, int32(value), src))


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


@functools.cache
def table_lookup(base):
    """``look(tab, off)``: the shared table's word at byte ``off``, with ``base`` (where dynamic shared memory
    starts, :func:`probe_base`) in the load's immediate; in the simulator the twin, which indexes ``tab``."""
    if runtime.SIMULATOR:
        return lookup
    lds = _lookup_at(base)

    @cuda.jit(device=True, inline="always")
    def look(tab, off):
        return lds(off)

    return look


@functools.cache
def _vec4_at(base):
    """``ld.shared.v4.u32`` / ``st.shared.v4.u32`` at byte ``off + base`` (``off`` a multiple of 16)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)

    @intrinsic
    def load4(typingctx, off):
        def codegen(context, builder, sig, args):
            o = context.cast(builder, args[0], sig.args[0], types.uint32)
            v = builder.call(ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32]),
                                          f"ld.shared.v4.u32 {{$0, $1, $2, $3}}, [$4+{int(base)}];",
                                          "=r,=r,=r,=r,r,~{memory}", side_effect=True), [o])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, k) for k in range(4)])

        return types.UniTuple(types.uint32, 4)(types.uint32), codegen

    @intrinsic
    def store4(typingctx, off, a, b, c, d):
        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32] * 5),
                                      f"st.shared.v4.u32 [$0+{int(base)}], {{$1, $2, $3, $4}};", "r,r,r,r,r,~{memory}",
                                      side_effect=True), vals)
            return context.get_dummy_value()

        return types.void(*[types.uint32] * 5), codegen

    return load4, store4


def table_vec4(base):
    """``(load4(tab, off) -> 4 words, store4(tab, off, a, b, c, d))``: 16 bytes of the shared table at byte
    ``off``, ``base`` as in :func:`table_lookup`; in the simulator the twins, which index ``tab``."""
    if runtime.SIMULATOR:
        return shared_load4, shared_store4
    lds4, sts4 = _vec4_at(base)

    @cuda.jit(device=True, inline="always")
    def load4(tab, off):
        return lds4(off)

    @cuda.jit(device=True, inline="always")
    def store4(tab, off, a, b, c, d):
        sts4(off, a, b, c, d)

    return load4, store4


if not runtime.SIMULATOR:
    shared_load4, shared_store4 = table_vec4(0x400)  # what the PTX tool compiles for the simulator's twins


def x_slot_ops(base):
    """The GEMV's x slot at M = 1 (``base`` as in :func:`table_lookup`): each warp's next step of x (512 bytes, 16 a
    lane) waits in 4 spare half-rows of the table, rows 16 + 4 warp + block b, words 32..63 rotated by 4 b words so
    that the 4 lanes reading it (one per block) hit different banks. Each lane addresses the slot from two registers
    it computes once. ``(slot_at, x_quad, x_put, x_get)``:

    - ``xs, xa = slot_at(warp, lane)``: byte offsets of the lane's 16 bytes in its warp's slot and of word 0 of
      block ``lane & 3``'s 64 columns (what the lanes with g = q read);
    - ``x_quad(xq, x_u32, c, lane, k)``: the lane's 16 bytes of step c's x into xq, zeros past K (where K % 256 ==
      0 the GEMV's ``fetch1`` loads them, untested);
    - ``x_put(sm, xs, xq)``: those bytes into the slot;
    - ``x_get(xr, sm, xa, h)``: piece h's 32 columns of block q into xr[0:16]: its words 4 j are ``xa + 16 j``
      bytes (4 q + 4 j < 32: no wrap), piece 1's the same XOR 64 bytes (16 words further, mod 32).
    """
    load4, store4 = table_vec4(base)
    from numba import uint32, uint64

    @cuda.jit(device=True, inline="always")
    def slot_at(warp, lane):
        b, q = lane >> uint32(3), lane & uint32(3)
        xs = (((uint32(16) + uint32(4) * warp + b) << uint32(6)) + uint32(32)
              + ((uint32(4) * (lane & uint32(7)) + uint32(4) * b) & uint32(31))) << uint32(2)
        return xs, (((uint32(16) + uint32(4) * warp + q) << uint32(6)) + uint32(32) + uint32(4) * q) << uint32(2)

    @cuda.jit(device=True, inline="always")
    def x_quad(xq, x_u32, c, lane, k):
        ok, z = uint32(c * uint32(256) + uint32(8) * lane) < k, uint32(0)
        a, b, d, e = ops.load_u32x4(x_u32, uint64(c * uint32(128) + uint32(4) * lane if ok else uint32(0)))
        xq[0], xq[1], xq[2], xq[3] = a if ok else z, b if ok else z, d if ok else z, e if ok else z

    @cuda.jit(device=True, inline="always")
    def x_put(sm, xs, xq):
        store4(sm, xs, xq[0], xq[1], xq[2], xq[3])

    @cuda.jit(device=True, inline="always")
    def x_get(xr, sm, xa, h):
        for j in range(4):
            xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = load4(sm, uint32(xa + uint32(16 * j)) ^ uint32(64 * h))

    return slot_at, x_quad, x_put, x_get
