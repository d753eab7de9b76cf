"""The GEMV design family notebook 09 no longer shows: every variant the lab timed (lab/bench_gemv.py),
profiled (lab/profile_gemv.py) and assembled (lab/sass_gemv.py).

One kernel factory, ``make_gemv(is_bf16, Design(...))``, covers them all: rows per item R, split-K S,
columns per lane, warps per block, batch M, launch bounds, streaming loads, and the table experiments
(PRMT: a 64 KB table addressed by one byte permute; X: NF4 values from warp shuffles; Q16: the absmax
code table in 16 copies; H16: a table of fp16 pairs, NOT exact). The former shipped FFMA design (``auto_design``) is this factory with table="pair", cols=32, warps=8, no shuffles, one
scale copy (the FFMA design notebook 09 taught before the tensor-core kernel replaced it).

Import it as ``lab.gemv_variants`` (from the repository root): nf4lab.compile_ptx's subprocess then
finds this module's device ops by reference.
"""
import nf4lab  # first: may switch numba to its simulator

import dataclasses

import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab.kernels import gemv
from nf4lab.device import ops, warp_ops
from nf4lab.kernels.gemv import MAX_M, f32_from_bits, load_stream_u32x4, sms
from nf4lab import runtime


# ---------------------------------------------------------------- device ops of the FFMA family (nf4lab's GEMV has none of them)
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


def _build_ffma_ops():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

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

    return f16_to_f32, lds_pair, bar_sync


def _py_lds_pair(tab, off):
    t = np.asarray(tab)
    p = int(t.view(np.uint64)[int(off) >> 3]) if t.dtype.itemsize != 8 else int(t[int(off) >> 3])
    return warp_ops._py_f32_from_bits(p & 0xFFFFFFFF), warp_ops._py_f32_from_bits(p >> 32)



def _py_shfl_down_sync(mask, value, delta):
    return warp_ops._py_warp_exchange(value, lambda lane: lane + int(delta), "shfl_down_sync")


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


if runtime.SIMULATOR:
    f16_to_f32, lds_pair, bar_sync, shfl_down_sync = _py_f16_to_f32, _py_lds_pair, _py_bar_sync, _py_shfl_down_sync
    for _f, _name in ((f16_to_f32, "f16_to_f32"), (lds_pair, "lds_pair"), (bar_sync, "bar_sync"),
                      (shfl_down_sync, "shfl_down_sync")):
        _f.__name__ = _f.__qualname__ = _name   # pickled by name for the PTX subprocess: see prmt below
else:
    f16_to_f32, lds_pair, bar_sync = _build_ffma_ops()
    shfl_down_sync = cuda.shfl_down_sync


# ---------------------------------------------------------------- device ops only the variants use
def _py_prmt(a, b, sel):
    pool = (int(a) & 0xFFFFFFFF) | ((int(b) & 0xFFFFFFFF) << 32)
    out = 0
    for k in range(4):
        s = (int(sel) >> (4 * k)) & 0xF
        byte = (pool >> (8 * (s & 7))) & 0xFF
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return np.uint32(out)


def _py_lds_u32(tab, off):
    return np.uint32(np.asarray(tab).view(np.uint32)[int(off) >> 2])


def _py_shfl_idx(value, src):
    """shfl.sync.idx: the value of lane src & 31 of this warp."""
    return np.float32(warp_ops._py_warp_exchange(value, lambda lane: int(src) & 31, "shfl_idx"))


def _build_ops():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def lds_u32(typingctx, tab, off):
        """32 bits at byte offset ``off`` (uint32, a multiple of 4) of a shared array: one ld.shared.u32."""
        if not (isinstance(tab, types.Array) and tab.ndim == 1):
            return None
        sig = types.uint32(tab, types.uint32)

        def codegen(context, builder, sig, args):
            return builder.load(_shared_ptr(context, builder, sig, args, ir.IntType(32)), align=4)

        return sig, codegen

    @intrinsic
    def prmt(typingctx, a, b, sel):
        """``prmt.b32 d, a, b, sel``: byte k of d is byte (sel >> 4k) & 7 of the 8 bytes b:a (a = bytes 0-3),
        or its sign replicated when bit 3 of that nibble is set."""
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            i32 = ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3), "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen

    @cuda.jit(device=True, inline="always")
    def shfl_idx(v, src):
        """``shfl.sync.idx.b32`` over the full warp (numba's own: LLVM knows it is convergent)."""
        return cuda.shfl_sync(0xFFFFFFFF, v, src)

    return prmt, lds_u32, shfl_idx


if runtime.SIMULATOR:
    prmt, lds_u32, shfl_idx = _py_prmt, _py_lds_u32, _py_shfl_idx
    for _f, _name in ((prmt, "prmt"), (lds_u32, "lds_u32"), (shfl_idx, "shfl_idx")):
        # cloudpickle pickles a module-level function by module and qualified name: under these names, the
        # PTX subprocess (compile mode) of nf4lab.compile_ptx imports this module and gets the device versions
        _f.__name__ = _f.__qualname__ = _name
else:
    prmt, lds_u32, shfl_idx = _build_ops()


def with_dynamic_shared(kern, args, nbytes):
    """``kern`` ready to launch with ``nbytes`` of dynamic shared memory (past 48 KB the kernel's attribute must be
    raised first, which numba does not do): the shipped tensor-core kernel's own mechanism, gemv.prepare."""
    if nbytes == 0:
        return kern
    return gemv.prepare(kern, args, nbytes)


# ---------------------------------------------------------------- the design family
COPIES = 16                    # copies of the byte-pair table, one per bank pair (see lut8)
TAB = 256 * COPIES             # table entries (8 bytes each: 32 KB)
PCOPIES = 32                   # the "prmt" table: one copy per lane, rows of 256 bytes (see lut8_prmt)
PTAB = 256 * PCOPIES           # its entries: 64 KB, dynamic shared memory
SCALE_BYTES = 256 * 16 * 4     # the absmax code table (code2) in 16 copies: 16 KB


@dataclasses.dataclass(frozen=True)
class Design:
    """The compile-time shape of the kernel: what one warp does per loop trip ("item") and how warps share work."""
    rows: int = 2        # R: rows of W per item; each activation, loaded and converted once, feeds R rows
    split: int = 1       # S: warps sharing a group of rows, each taking every S-th item of K (split-K)
    cols: int = 32       # columns per lane per item: 32 = one 128-bit load (16 bytes) per row
    warps: int = 8       # warps per block; one 32 KB table per block
    m: int = 1           # batch: rows of x, each weight read once for all of them
    min_blocks: int = 4  # launch bounds: blocks per SM ptxas must fit (caps registers at 65536 / (threads * min_blocks))
    stream: bool = True  # codes with ld.global.nc.L1::no_allocate (weights read once stay out of L1)
    table: str = "pair"  # "pair": 32 KB table, 2 instructions per byte address; "prmt": 64 KB, one PRMT
    shfl_rows: int = 0   # rows of an item (the first ones) whose NF4 values come from warp shuffles, not the table
    scale_copies: int = 1  # 16: the 256-entry absmax code table in 16 copies (bank-conflict-free reads)
    lut16: bool = False  # experiment: table of fp16 pairs, 4 bytes per code byte (NOT exact: lut rounded to fp16)

    @property
    def name(self):
        s = f"R{self.rows} S{self.split} C{self.cols} W{self.warps} B{self.min_blocks}"
        s += "" if self.table == "pair" else f" {self.table.upper()}"
        s += f" X{self.shfl_rows}" if self.shfl_rows else ""
        s += f" Q{self.scale_copies}" if self.scale_copies > 1 else ""
        s += " H16" if self.lut16 else ""
        return s + (f" M{self.m}" if self.m > 1 else "") + ("" if self.stream else " cached")

    @property
    def dynamic_smem(self):
        """Bytes of dynamic shared memory a launch asks for (the prmt table does not fit the 48 KB static limit)."""
        if self.table == "prmt":
            return 8 * PTAB
        if self.lut16 or self.scale_copies > 1:  # the table (32 KB), then the scale codes' copies
            return 8 * TAB + (SCALE_BYTES if self.scale_copies > 1 else 0)
        return 0


@cuda.jit(device=True, inline="always")
def x_pair(u, is_bf16):
    """Two activations (one uint32 of x: column 2i in the low half, 2i+1 in the high half) as float32."""
    if is_bf16:  # bf16 -> float32 is a 16-bit shift of the bits
        return f32_from_bits(u << uint32(16)), f32_from_bits(u & uint32(0xFFFF0000))
    return f16_to_f32(u), f16_to_f32(u >> uint32(16))


@cuda.jit(device=True, inline="always")
def load_x8(x_u32, i, is_bf16):
    """8 activations (x words i..i+3: one 128-bit load) as float32."""
    a = ops.load_u32x4(x_u32, i)
    return x_pair(a[0], is_bf16) + x_pair(a[1], is_bf16) + x_pair(a[2], is_bf16) + x_pair(a[3], is_bf16)


@cuda.jit(device=True, inline="always")
def lut8(tab, lane8, w, L, o):
    """The 8 NF4 values of code word w (byte j: columns 2j, 2j+1) into L[o..o+7]: 4 byte-pair reads.

    Byte j's pair (lut[high nibble], lut[low nibble]) is one 64-bit shared read at byte offset
    (byte << 7) | lane8: one shift and one and-or (a single LOP3) of the code word, in 32 bits."""
    L[o], L[o + 1] = lds_pair(tab, ((w << uint32(7)) & uint32(0x7F80)) | lane8)
    L[o + 2], L[o + 3] = lds_pair(tab, ((w >> uint32(1)) & uint32(0x7F80)) | lane8)
    L[o + 4], L[o + 5] = lds_pair(tab, ((w >> uint32(9)) & uint32(0x7F80)) | lane8)
    L[o + 6], L[o + 7] = lds_pair(tab, ((w >> uint32(17)) & uint32(0x7F80)) | lane8)


@cuda.jit(device=True, inline="always")
def lut8_prmt(tab, lane8, w, L, o):
    """lut8 with one instruction per address: byte j's pair sits at byte offset (byte << 8) | lane8 of a
    table with 256-byte rows (32 copies, lane l reads copy l: lane8 = l << 3 < 256). A byte permute
    builds that offset from the code word directly: result bytes (lane8, byte j, 0, 0), i.e. selector
    nibbles 4 (lane8's low byte), j, 5, 5 (lane8's zero bytes)."""
    L[o], L[o + 1] = lds_pair(tab, prmt(w, lane8, uint32(0x5504)))
    L[o + 2], L[o + 3] = lds_pair(tab, prmt(w, lane8, uint32(0x5514)))
    L[o + 4], L[o + 5] = lds_pair(tab, prmt(w, lane8, uint32(0x5524)))
    L[o + 6], L[o + 7] = lds_pair(tab, prmt(w, lane8, uint32(0x5534)))


@cuda.jit(device=True, inline="always")
def lut8_h16(tab, lane4, w, L, o):
    """lut8 from a table of fp16 pairs: byte j's (lut[hi], lut[lo]) rounded to fp16 in one 32-bit word at
    byte offset (byte << 7) | lane4 (32 copies, lane l reads copy l: conflict-free). Half the shared-memory
    traffic of the float32 pairs, but the NF4 values are rounded (relative error up to 2^-11): an experiment."""
    a = lds_u32(tab, ((w << uint32(7)) & uint32(0x7F80)) | lane4)
    L[o], L[o + 1] = f16_to_f32(a), f16_to_f32(a >> uint32(16))
    a = lds_u32(tab, ((w >> uint32(1)) & uint32(0x7F80)) | lane4)
    L[o + 2], L[o + 3] = f16_to_f32(a), f16_to_f32(a >> uint32(16))
    a = lds_u32(tab, ((w >> uint32(9)) & uint32(0x7F80)) | lane4)
    L[o + 4], L[o + 5] = f16_to_f32(a), f16_to_f32(a >> uint32(16))
    a = lds_u32(tab, ((w >> uint32(17)) & uint32(0x7F80)) | lane4)
    L[o + 6], L[o + 7] = f16_to_f32(a), f16_to_f32(a >> uint32(16))


@cuda.jit(device=True, inline="always")
def lut8_shfl(t, w, L, o):
    """lut8 without shared memory: lane l holds lut[l & 15] in ``t``, and a shuffle from lane q returns lut[q].
    The shuffle reads only the low 5 bits of its lane index, and lanes l and l + 16 hold the same value,
    so a nibble needs no mask: one shift (none for the lowest) and one SHFL per weight."""
    L[o], L[o + 1] = shfl_idx(t, w >> uint32(4)), shfl_idx(t, w)
    L[o + 2], L[o + 3] = shfl_idx(t, w >> uint32(12)), shfl_idx(t, w >> uint32(8))
    L[o + 4], L[o + 5] = shfl_idx(t, w >> uint32(20)), shfl_idx(t, w >> uint32(16))
    L[o + 6], L[o + 7] = shfl_idx(t, w >> uint32(28)), shfl_idx(t, w >> uint32(24))


@cuda.jit(device=True, inline="always")
def dot8(L, o, x, a):
    """a + sum of L[o + j] * x[j] for j < 8: eight FMAs."""
    return (a + L[o] * x[0] + L[o + 1] * x[1] + L[o + 2] * x[2] + L[o + 3] * x[3]
            + L[o + 4] * x[4] + L[o + 5] * x[5] + L[o + 6] * x[6] + L[o + 7] * x[7])


@cuda.jit(device=True, inline="always")
def warp_sum(v):
    """Tree reduction over the warp: after it, lane 0 holds the sum of all 32 lanes."""
    v += shfl_down_sync(0xFFFFFFFF, v, 16)
    v += shfl_down_sync(0xFFFFFFFF, v, 8)
    v += shfl_down_sync(0xFFFFFFFF, v, 4)
    v += shfl_down_sync(0xFFFFFFFF, v, 2)
    v += shfl_down_sync(0xFFFFFFFF, v, 1)
    return v


@cuda.jit(device=True, inline="always")
def store(y, i, v, is_bf16):
    if is_bf16:
        y[i] = ops.to_bf16_bits(v)
    else:
        y[i] = ops.to_f16_bits(v)


def make_gemv(is_bf16, d=Design(), reduce=warp_sum):
    """The fused kernel for one activation dtype and one Design (all compile-time constants)."""
    R, S, LC, W, M = d.rows, d.split, d.cols, d.warps, d.m
    NV = LC // 32              # 128-bit code loads per row per item
    NW = LC // 8               # code words per row per item
    STEP = 32 * LC             # columns a warp covers per item
    SSH = STEP.bit_length() - 1
    THREADS = 32 * W
    TEAMS = W // S             # teams of S warps per block; a team computes one group of R rows at a time
    RM = R * M
    NC = R * NW                # code words per item
    NL = 8 * R                 # NF4 values of one word of each row
    NRED = 2 * W * RM          # split-K partial sums, double-buffered
    assert LC in (32, 64) and W * 32 <= 1024 and S & (S - 1) == 0 and W % S == 0 and (S == 1 or TEAMS <= 15) and 1 <= M <= MAX_M
    load_codes = load_stream_u32x4 if d.stream else ops.load_u32x4
    PRMT = d.table == "prmt"
    assert d.table in ("pair", "prmt")
    SR = d.shfl_rows
    assert 0 <= SR <= R
    H16 = d.lut16
    SQ = d.scale_copies > 1
    DYN = H16 or SQ                   # one dynamic array: the table, then the scale codes' copies
    assert d.scale_copies in (1, 16) and not (PRMT and DYN)
    lut8_of = lut8_h16 if H16 else (lut8_prmt if PRMT else lut8)

    @cuda.jit(device=True, inline="always")
    def row_offsets(ro, g, n, kw):
        """First code word of each row of group g (rows past N repeat the last row: loaded, never stored)."""
        for r in range(R):
            ro[r] = uint32(min(uint32(g * uint32(R) + uint32(r)), uint32(n - uint32(1))) * kw)

    @cuda.jit(device=True, inline="always")
    def fetch(packed_u32, absmax_q, absmax2, nc, nq, na, ro, wofs, ash):
        """Issue one item's loads: NV 128-bit code loads per row, its absmax byte and its absmax2 float."""
        for r in range(R):
            wi = uint32(ro[r] + wofs)
            for v in range(NV):
                c0, c1, c2, c3 = load_codes(packed_u32, uint64(wi) + uint64(4 * v))
                nc[r * NW + 4 * v] = c0
                nc[r * NW + 4 * v + 1] = c1
                nc[r * NW + 4 * v + 2] = c2
                nc[r * NW + 4 * v + 3] = c3
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
        lw = uint32(lane * uint32(LC // 8))    # the lane's first code word within an item
        lwmax = uint32(kw - uint32(LC // 8))   # lanes past K re-read the row's last words (never used)
        ash = uint32(uint32(bs_shift) - uint32(3))   # code word -> absmax block: >> (log2(blocksize) - 3)
        # Registers (local arrays indexed only by unrolled constants): the item in flight (nc, nq, na),
        # the item being computed (cc, cq, ca), row offsets of this group and the next.
        nc = cuda.local.array(NC, uint32)
        nq = cuda.local.array(R, uint32)
        na = cuda.local.array(R, float32)
        cc = cuda.local.array(NC, uint32)
        cq = cuda.local.array(R, uint32)
        ca = cuda.local.array(R, float32)
        ro = cuda.local.array(R, uint32)
        rn = cuda.local.array(R, uint32)
        rs = cuda.local.array(R, uint32)
        L = cuda.local.array(NL, float32)
        p = cuda.local.array(RM, float32)
        acc = cuda.local.array(RM, float32)
        # The first item's loads are issued now: they are in flight while the table is built.
        row_offsets(ro, min(g, uint32(groups - uint32(1))), n, kw)
        fetch(packed_u32, absmax_q, absmax2, nc, nq, na, ro, min(uint32(uint32(part << uint32(SSH - 3)) + lw), lwmax), ash)
        # Byte-pair table: entry (byte << 4) | copy holds lut[byte >> 4] (low 32 bits) and lut[byte & 15]
        # (high 32 bits) at byte offset (byte << 7) | (copy << 3); lane l reads copy l & 15.
        code2_s = cuda.shared.array(256, float32)
        red = cuda.shared.array(NRED, float32)
        for j in range((256 + THREADS - 1) // THREADS):
            i = uint32(tid + uint32(j * THREADS))
            if i < uint32(256):
                code2_s[i] = code2[i]
        if DYN:
            tab = cuda.shared.array(0, uint32)
            for j in range(2 * TAB // THREADS):
                i = uint32(tid + uint32(j * THREADS))
                if H16:   # word (byte << 5) | copy: fp16(lut[byte >> 4]) | fp16(lut[byte & 15]) << 16
                    tab[i] = (ops.to_f16_bits(lut[i >> uint32(9)])
                              | (ops.to_f16_bits(lut[(i >> uint32(5)) & uint32(15)]) << uint32(16)))
                else:     # the float32 pair table of the "pair" layout, one 32-bit half at a time
                    e = i >> uint32(1)
                    tab[i] = ops.float_bits(lut[e >> uint32(8)] if (i & uint32(1)) == 0
                                            else lut[(e >> uint32(4)) & uint32(15)])
            if SQ:        # code2[c] at byte 8 * TAB + (c << 6) | (copy << 2); lanes 2c', 2c'+1 read copy c' & 15
                for j in range(SCALE_BYTES // 4 // THREADS):
                    i = uint32(tid + uint32(j * THREADS))
                    tab[uint32(2 * TAB) + i] = ops.float_bits(code2[i >> uint32(4)])
            lane8 = (lane << uint32(2)) if H16 else ((tid & uint32(COPIES - 1)) << uint32(3))
        elif PRMT:  # entry (byte << 5) | copy: byte offset (byte << 8) | (copy << 3)
            tab = cuda.shared.array(0, uint64)
            for j in range(PTAB // THREADS):
                i = uint32(tid + uint32(j * THREADS))
                tab[i] = (uint64(ops.float_bits(lut[i >> uint32(9)]))
                          | (uint64(ops.float_bits(lut[(i >> uint32(5)) & uint32(15)])) << uint64(32)))
            lane8 = lane << uint32(3)
        else:
            tab = cuda.shared.array(TAB, uint64)
            for j in range(TAB // THREADS):        # consecutive threads, consecutive entries: no bank conflicts
                i = uint32(tid + uint32(j * THREADS))
                tab[i] = (uint64(ops.float_bits(lut[i >> uint32(8)]))
                          | (uint64(ops.float_bits(lut[(i >> uint32(4)) & uint32(15)])) << uint64(32)))
            lane8 = (tid & uint32(COPIES - 1)) << uint32(3)
        cuda.syncthreads()
        tl = lut[lane & uint32(15)]            # the shuffle table: lane l holds lut[l & 15]
        parity = uint32(0)
        while g < groups:                      # this team's row groups: g, g + nteams, ...
            gn = uint32(g + nteams)
            row_offsets(rn, min(gn, uint32(groups - uint32(1))), n, kw)
            for i in range(RM):
                acc[i] = float32(0.0)
            s = part
            while s < steps:                   # this warp's items of the group: s = part, part + S, ...
                for i in range(NC):
                    cc[i] = nc[i]
                for r in range(R):
                    cq[r] = nq[r]
                    ca[r] = na[r]
                # issue the next item's loads: (g, s + S), or after the last one (next group, part)
                s1 = uint32(s + uint32(S))
                last = s1 >= steps
                for r in range(R):
                    rs[r] = rn[r] if last else ro[r]
                nxt = uint32((part if last else s1) << uint32(SSH - 3))
                fetch(packed_u32, absmax_q, absmax2, nc, nq, na, rs, min(uint32(nxt + lw), lwmax), ash)
                # compute this item: p[r, m] = sum over the lane's LC columns of lut[q] * x[m]
                col = uint32(uint32(s << uint32(SSH)) + lane * uint32(LC))
                valid = col < k
                # Shuffles need the whole warp: with SR > 0 every lane computes (lanes past K on the row's
                # last columns, never added), so that no shuffle sits in a divergent branch.
                if SR > 0 or valid:
                    for i in range(RM):
                        p[i] = float32(0.0)
                    xi = uint64((col if valid else uint32(k - uint32(LC))) >> uint32(1))
                    for w in range(NW):
                        for r in range(R):
                            if r < SR:
                                lut8_shfl(tl, cc[r * NW + w], L, 8 * r)
                            else:
                                lut8_of(tab, lane8, cc[r * NW + w], L, 8 * r)
                        for mm in range(M):
                            xv = load_x8(x_u32, xi + uint64(uint32(mm) * kx) + uint64(4 * w), is_bf16)
                            for r in range(R):
                                p[r * M + mm] = dot8(L, 8 * r, xv, p[r * M + mm])
                    if valid:
                        for r in range(R):         # the block scale, once per LC columns
                            if SQ:
                                c2 = f32_from_bits(lds_u32(tab, uint32(8 * TAB) | (cq[r] << uint32(6))
                                                           | (((lane >> uint32(1)) & uint32(15)) << uint32(2))))
                            else:
                                c2 = code2_s[cq[r]]
                            sc = ops.fadd_rn(ops.fmul_rn(c2, ca[r]), offset)
                            for mm in range(M):
                                acc[r * M + mm] += sc * p[r * M + mm]
                s = s1
            # the group's sums: over the 32 lanes (shuffles), then over the S warps of the team (shared memory)
            if S == 1:
                for r in range(R):
                    row = uint32(g * uint32(R) + uint32(r))
                    for mm in range(M):
                        v = reduce(acc[r * M + mm])
                        if lane == uint32(0) and row < n:
                            store(y, uint32(uint32(mm) * n + row), v, is_bf16)
            else:
                base = uint32((parity * uint32(W) + warp) * uint32(RM))
                for i in range(RM):
                    v = reduce(acc[i])
                    if lane == uint32(0):
                        red[base + uint32(i)] = v
                bar_sync(uint32(1) + team, uint32(32 * S))   # the team's S warps only
                if part == uint32(0) and lane < uint32(RM):
                    first = uint32((parity * uint32(W) + warp) * uint32(RM) + lane)
                    v = red[first]
                    for j in range(1, S):
                        v += red[first + uint32(j * RM)]
                    row = uint32(g * uint32(R) + lane // uint32(M))
                    if row < n:
                        store(y, uint32(uint32(lane % uint32(M)) * n + row), v, is_bf16)
                parity ^= uint32(1)
            for r in range(R):
                ro[r] = rn[r]
            g = gn

    return gemv_kernel


GEMV = {}  # (Design, dtype) -> kernel, made on first use (a GPU compiles it at its first launch)


def kernel(d, dtype):
    if (d, dtype) not in GEMV:
        GEMV[(d, dtype)] = make_gemv(dtype == "bf16", d)
    return GEMV[(d, dtype)]




def auto_design_r2(N, M=1):
    """The first default (kept as the variant "auto (R2, before)"): 2 rows per item (64 registers for M=1, so
    32 warps per SM); when N/2 row groups cannot give every SM its 32 warps, split K over 2 warps."""
    min_blocks = 4 if M == 1 else (3 if M <= 3 else 2)
    warps_per_sm = 8 * min_blocks
    split = 2 if -(-N // 2) < 0.75 * warps_per_sm * sms() else 1
    return Design(rows=2, split=split, m=M, min_blocks=min_blocks)


def auto_design_r4(N, M=1):
    """The second default (kept as the variant "auto (R4/R2, before)"): R4 for large N, else auto_design_r2."""
    if M == 1 and -(-N // 4) >= 0.5 * 24 * sms():
        return Design(rows=4, min_blocks=3)
    return auto_design_r2(N, M)


def auto_design(N, M=1):
    """The default Design for W with N rows and a batch of M, chosen from the second H100 run of the variants.

    More rows per item won on every shape: more 128-bit loads in flight per lane and each activation
    converted once for more rows. Which R, and whether K is split, depends on how many warps the row
    groups give the GPU:
    - N/4 row groups too few for half the warp slots (N = 4096): 4 rows, K split over 2 warps.
    - R8 teams of 2 warps fitting the GPU's warp slots at 16 per SM (N = 8192): 8 rows, K split over 2.
    - otherwise, and for every batch M > 1: 4 rows, no split, 2 blocks per SM (128 registers, no spill)."""
    if M == 1 and -(-N // 4) < 0.5 * 24 * sms():
        return Design(rows=4, split=2, min_blocks=3)
    if M == 1 and 2 * -(-N // 8) <= 16 * sms():
        return Design(rows=8, split=2, min_blocks=2)
    return Design(rows=4, min_blocks=2, m=M)


def resolve(design, N, M=1):
    """A Design from what VARIANTS holds: None (auto_design), a function (N, M) -> Design, or a Design."""
    if design is None:
        return auto_design(N, M)
    return design(N, M) if callable(design) else design


def resident_blocks(kern, d):
    """Blocks of a compiled kernel one SM holds at once (registers, shared memory), None if unknown."""
    info = nf4lab.device_info()
    if not info.get("sms") or not getattr(kern, "overloads", None):
        return None  # simulator, or not compiled yet (the first launch compiles it)
    try:
        regs = kern.get_regs_per_thread()
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        smem = kern.get_shared_mem_per_block()
        smem = (max(smem.values()) if isinstance(smem, dict) else smem) + d.dynamic_smem
    except Exception:  # an API change: fall back to the launch bounds (correct, maybe a little slower)
        return d.min_blocks
    by_regs = 65536 // (-(-regs // 8) * 8 * 32 * d.warps)      # 64K registers, 8-register granules
    by_smem = (info.get("smem_per_sm") or 228 * 1024) // (smem + 1024)  # 1 KB reserved per block
    by_threads = (info.get("max_threads_per_sm") or 2048) // (32 * d.warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def grid_size(kern, d, N, policy="balanced"):
    """Blocks to launch. Teams of d.split warps loop over groups of d.rows rows, so any grid is correct.

    "full": one team per group; "resident": as many blocks as the GPU holds at once;
    "balanced" (default): the fewest rounds the resident teams need, and just enough teams that each
    does that many groups."""
    teams_per_block = d.warps // d.split
    groups = -(-N // d.rows)
    full = -(-groups // teams_per_block)
    per_sm = resident_blocks(kern, d) or d.min_blocks
    capacity = per_sm * sms()
    if policy == "full":
        return full
    if policy == "resident":
        return min(full, capacity)
    rounds = -(-groups // (capacity * teams_per_block))
    return min(full, -(-groups // (rounds * teams_per_block)))


def launch(g, design=None, policy="balanced", kern=None):
    """Run the fused GEMV on a gemv.GemvBuffers (batch g.M <= 8), on g.stream.

    ``design``: a Design (its m is set to g.M), a function (N, M) -> Design, None for auto_design(N, M), or
    (one of those, grid policy); ``kern``: a kernel made by make_gemv for that design, instead of the cached one."""
    gemv.validate(g)  # dtypes, sizes, alignment, M: raises before anything is launched
    if isinstance(design, tuple):  # (design, grid policy), as VARIANTS may hold
        design, policy = design
    d = resolve(design, g.N, g.M)
    if d.m != g.M:
        d = dataclasses.replace(d, m=g.M)
    kern = kern or kernel(d, g.dtype)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    kern = with_dynamic_shared(kern, args, d.dynamic_smem)
    grid = g.grid if getattr(g, "grid", None) else grid_size(kern, d, g.N, policy)
    kern[grid, 32 * d.warps, g.stream, d.dynamic_smem](*args)


# Variants a GPU run times side by side (lab/bench_gemv.py): the first is the notebook's default. A value is
# a Design, a function (N, M) -> Design, None (auto_design), or (one of those, grid policy).
VARIANTS = {
    "auto": None,                                       # auto_design(N, M): R4 S2 / R8 S2 / R4 by N (see above)
    "auto (R2, before)": auto_design_r2,                # the first default: R2 C32, S = 2 for short W
    "auto (R4/R2, before)": auto_design_r4,             # the second: R4 for large N, else the first
    "R2 S1 C32 W8 B4": Design(),                        # 2 loads (rows) in flight per lane, 64 registers
    "R2 S2 C32 W8 B4": Design(split=2),                 # split-K on every shape
    "R2 S1 C64 W8 B3": Design(cols=64, min_blocks=3),   # 4 loads in flight per lane, 80 registers, 24 warps/SM
    "R4 S1 C32 W8 B3": Design(rows=4, min_blocks=3),    # 4 loads in flight, x shared by 4 rows, 80 registers
    "R1 S1 C32 W8 B4": Design(rows=1),                  # 1 load in flight, no x sharing, the most warps
    "R1 S1 C64 W8 B4": Design(rows=1, cols=64),         # 2 loads in flight, one absmax block per lane
    "R2 S1 C32 W16 B2": Design(warps=16, min_blocks=2), # 512-thread blocks: half the table builds
    "R2 S1 C32 W8 B4 cached": Design(stream=False),     # codes through L1 (plain ld.global.nc.v4)
    # after the first H100 run: R4 won at large N with about 16 warps per SM (the balanced grid), so
    "R4 S2 C32 W8 B3": Design(rows=4, split=2, min_blocks=3),            # R4 with split-K: 2x the warps at N = 4096
    "R4 S2 C32 W8 B3, full grid": (Design(rows=4, split=2, min_blocks=3), "full"),  # ... one team per group
    "R4 S1 C32 W8 B2": Design(rows=4, min_blocks=2),    # R4 without the launch-bound squeeze: no spill, fewer instructions
    "R4 S1 C32 W16 B2": Design(rows=4, warps=16, min_blocks=2),          # bigger blocks (64 registers: spills)
    "R3 S1 C32 W8 B3": Design(rows=3, min_blocks=3),    # 3 loads in flight; N/3 groups fill more of 24 warps/SM
    "R8 S1 C32 W8 B2": Design(rows=8, min_blocks=2),    # 8 loads (4 KB per warp) in flight, 128 registers
    "R8 S2 C32 W8 B2": Design(rows=8, split=2, min_blocks=2),            # ... with split-K, enough warps at N = 8192
    # third to fifth runs (Nsight Compute: the SM's L1/shared data pipe is the bottleneck, section 6)
    "R4 S2 C32 W8 B3 PRMT": Design(rows=4, split=2, min_blocks=3, table="prmt"),      # one PRMT per table address
    "R8 S2 C32 W8 B2 PRMT": Design(rows=8, split=2, min_blocks=2, table="prmt"),
    "R4 S2 C32 W8 B3 X2": Design(rows=4, split=2, min_blocks=3, shfl_rows=2),         # half the rows from shuffles
    "R8 S2 C32 W8 B2 X4": Design(rows=8, split=2, min_blocks=2, shfl_rows=4),
    "R4 S2 C32 W8 B3 Q16": Design(rows=4, split=2, min_blocks=3, scale_copies=16),    # conflict-free scale codes
    "R8 S2 C32 W8 B2 Q16": Design(rows=8, split=2, min_blocks=2, scale_copies=16),
    "R4 S2 C32 W8 B3 H16": Design(rows=4, split=2, min_blocks=3, lut16=True),         # experiment, NOT exact:
    "R8 S2 C32 W8 B2 H16": Design(rows=8, split=2, min_blocks=2, lut16=True),         # fp16 table, half the traffic
}
BATCH_VARIANTS = ("auto", "auto (R2, before)")  # timed at M = 2, 4, 8
GRID_POLICIES = ("balanced", "resident", "full")

from numba import types as T  # noqa: E402

SIG = (T.uint32[::1], T.uint8[::1], T.float32[::1], T.float32[::1], T.float32[::1], T.float32,
       T.uint32[::1], T.uint16[::1], T.int64, T.int64, T.int64)  # the kernel's argument types, for PTX/SASS

