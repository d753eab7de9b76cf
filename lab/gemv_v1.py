"""The first fused NF4 GEMV of notebook 09 ("v1"), kept so that a GPU run can time it beside the current one.

This is the kernel notebook 09 taught before the streaming redesign, unchanged: one warp computes 4 rows,
each lane takes 64 consecutive columns (one absmax block) per step and holds 64 converted activations in
registers, and the next step's codes are loaded before the current step is computed. Its weakness, which
the notebook now explains: about 170 registers per thread (ptxas, sm_90), so an SM holds only 8 of its
warps and too few bytes are in flight to stream the weights at the copy ceiling.

``launch(g, policy=...)`` takes a :class:`nf4lab.kernels.gemv.GemvBuffers` (batch 1). ``tools/bench_gemv.py``
times it as the variant ``v1``; ``tools/sass_gemv.py --v1`` prints its registers and SASS per weight.
"""
import nf4lab  # noqa: F401  (first: may switch numba to its simulator)

from numba import cuda, float32, uint32, uint64
from numba import types as T

from nf4lab.kernels import gemv, ops
from nf4lab.kernels.gemv import f16_to_f32, f32_from_bits, lds_pair, shfl_down_sync

WARPS = 4      # warps per block
ROWS = 4       # rows of W per warp: each x value, loaded and converted once, feeds 4 rows
LANE_COLS = 64                 # consecutive columns (= one absmax block, 32 bytes) per lane per step
STEP = 32 * LANE_COLS          # columns a warp covers per step: 2048
COPIES = 16                    # copies of the byte-pair table, one per bank pair (see below)
TAB = 256 * COPIES             # table entries (8 bytes each: 32 KB)


@cuda.jit(device=True, inline="always")
def x_pair(u, is_bf16):
    """Two activations (one uint32 of x: column 2i in the low half, 2i+1 in the high half) as float32."""
    if is_bf16:  # bf16 -> float32 is a 16-bit shift of the bits
        return f32_from_bits(u << uint32(16)), f32_from_bits(u & uint32(0xFFFF0000))
    return f16_to_f32(u), f16_to_f32(u >> uint32(16))


@cuda.jit(device=True, inline="always")
def word_dot(tab, lane8, w, x, a, b):
    """4 code bytes (8 weights; byte j: columns 2j and 2j+1) times 8 float32 activations, added to
    two independent running sums a (high nibbles) and b (low nibbles): one FMA per weight.

    Byte j's pair (lut[high nibble], lut[low nibble]) is one 64-bit shared read at byte offset
    (byte << 7) | lane8: one shift and one and-or (a single LOP3) of the code word, in 32 bits."""
    l0, l1 = lds_pair(tab, ((w << uint32(7)) & uint32(0x7F80)) | lane8)
    l2, l3 = lds_pair(tab, ((w >> uint32(1)) & uint32(0x7F80)) | lane8)
    l4, l5 = lds_pair(tab, ((w >> uint32(9)) & uint32(0x7F80)) | lane8)
    l6, l7 = lds_pair(tab, ((w >> uint32(17)) & uint32(0x7F80)) | lane8)
    a = a + l0 * x[0] + l2 * x[2] + l4 * x[4] + l6 * x[6]
    b = b + l1 * x[1] + l3 * x[3] + l5 * x[5] + l7 * x[7]
    return a, b


@cuda.jit(device=True, inline="always")
def load_x32(x_u32, i, is_bf16):
    """32 activations (16 words of x, four 128-bit loads) as float32, converted once for all rows."""
    a = ops.load_u32x4(x_u32, i)
    b = ops.load_u32x4(x_u32, i + uint64(4))
    c = ops.load_u32x4(x_u32, i + uint64(8))
    d = ops.load_u32x4(x_u32, i + uint64(12))
    return (x_pair(a[0], is_bf16) + x_pair(a[1], is_bf16) + x_pair(a[2], is_bf16) + x_pair(a[3], is_bf16)
            + x_pair(b[0], is_bf16) + x_pair(b[1], is_bf16) + x_pair(b[2], is_bf16) + x_pair(b[3], is_bf16)
            + x_pair(c[0], is_bf16) + x_pair(c[1], is_bf16) + x_pair(c[2], is_bf16) + x_pair(c[3], is_bf16)
            + x_pair(d[0], is_bf16) + x_pair(d[1], is_bf16) + x_pair(d[2], is_bf16) + x_pair(d[3], is_bf16))


@cuda.jit(device=True, inline="always")
def load_codes(packed_u32, absmax_q, absmax2, row, k, c, bs_shift):
    """What one lane needs of one row for one step: 64 codes (two 128-bit loads) and its block's
    absmax_q byte and absmax2 float."""
    i = (row * k + c) >> uint64(3)     # first uint32 word
    blk = (row * k + c) >> uint64(bs_shift)
    return (ops.load_u32x4(packed_u32, i), ops.load_u32x4(packed_u32, i + uint64(4)),
            absmax_q[blk], absmax2[blk >> uint64(8)])


@cuda.jit(device=True, inline="always")
def row_step(tab, lane8, code2_s, offset, codes, xlo, xhi):
    """scale * sum of the lane's 64 products lut[q_k] * x_k: the scale multiplies once per block."""
    va, vb, q, a2 = codes
    a, b = word_dot(tab, lane8, va[0], xlo[0:8], float32(0.0), float32(0.0))
    a, b = word_dot(tab, lane8, va[1], xlo[8:16], a, b)
    a, b = word_dot(tab, lane8, va[2], xlo[16:24], a, b)
    a, b = word_dot(tab, lane8, va[3], xlo[24:32], a, b)
    a, b = word_dot(tab, lane8, vb[0], xhi[0:8], a, b)
    a, b = word_dot(tab, lane8, vb[1], xhi[8:16], a, b)
    a, b = word_dot(tab, lane8, vb[2], xhi[16:24], a, b)
    a, b = word_dot(tab, lane8, vb[3], xhi[24:32], a, b)
    d = a + b
    return ops.fadd_rn(ops.fmul_rn(code2_s[q], a2), offset) * d


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


def make_gemv(is_bf16, reduce=warp_sum):
    """The fused kernel for one activation dtype (a compile-time constant), with a given warp reduction."""

    @cuda.jit
    def gemv(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        # Byte-pair table: entry (byte << 4) | copy, at byte offset (byte << 7) | (copy << 3), holds
        # lut[byte >> 4] (low 32 bits) and lut[byte & 15] (high 32 bits). Copy c sits in banks 2c,
        # 2c+1 of every 128-byte row and lane l reads copy l & 15: the 16 lanes of a half-warp
        # (one 64-bit shared access serves 16 lanes at a time) never share a bank.
        tab = cuda.shared.array(TAB, uint64)
        code2_s = cuda.shared.array(256, float32)
        lut_s = cuda.shared.array(16, float32)
        tid = cuda.threadIdx.x
        for i in range(tid, 256, WARPS * 32):
            code2_s[i] = code2[i]
        if tid < 16:
            lut_s[tid] = lut[tid]
        cuda.syncthreads()
        for i in range(tid, TAB, WARPS * 32):  # consecutive threads, consecutive entries: no conflicts
            byte = i // COPIES
            tab[i] = uint64(ops.float_bits(lut_s[byte >> 4])) | (uint64(ops.float_bits(lut_s[byte & 15])) << uint64(32))
        cuda.syncthreads()
        lane = uint64(tid & 31)
        lane8 = uint32((tid & (COPIES - 1)) << 3)  # byte offset of this lane's copy within an entry row
        n = uint64(N)
        k = uint64(K)
        nwarps = uint64(cuda.gridDim.x) * uint64(WARPS)
        group = uint64(cuda.blockIdx.x) * uint64(WARPS) + uint64(tid >> 5)
        while group * uint64(ROWS) < n:          # grid-stride over groups of ROWS rows (whole warps)
            r0 = group * uint64(ROWS)
            r1 = min(r0 + uint64(1), n - uint64(1))  # rows past N repeat the last row, not stored
            r2 = min(r0 + uint64(2), n - uint64(1))
            r3 = min(r0 + uint64(3), n - uint64(1))
            acc0 = float32(0.0)
            acc1 = float32(0.0)
            acc2 = float32(0.0)
            acc3 = float32(0.0)
            c = lane * uint64(LANE_COLS)         # the lane's first column
            cc = min(c, k - uint64(LANE_COLS))   # (a valid address even for a lane with no work)
            # software pipeline: the codes of step s+1 are loaded before step s is computed
            n0 = load_codes(packed_u32, absmax_q, absmax2, r0, k, cc, bs_shift)
            n1 = load_codes(packed_u32, absmax_q, absmax2, r1, k, cc, bs_shift)
            n2 = load_codes(packed_u32, absmax_q, absmax2, r2, k, cc, bs_shift)
            n3 = load_codes(packed_u32, absmax_q, absmax2, r3, k, cc, bs_shift)
            while c < k:
                w0, w1, w2, w3 = n0, n1, n2, n3
                cn = c + uint64(STEP)
                if cn < k:
                    n0 = load_codes(packed_u32, absmax_q, absmax2, r0, k, cn, bs_shift)
                    n1 = load_codes(packed_u32, absmax_q, absmax2, r1, k, cn, bs_shift)
                    n2 = load_codes(packed_u32, absmax_q, absmax2, r2, k, cn, bs_shift)
                    n3 = load_codes(packed_u32, absmax_q, absmax2, r3, k, cn, bs_shift)
                xlo = load_x32(x_u32, c >> uint64(1), is_bf16)   # the lane's 64 activations, once
                xhi = load_x32(x_u32, (c >> uint64(1)) + uint64(16), is_bf16)
                acc0 += row_step(tab, lane8, code2_s, offset, w0, xlo, xhi)
                acc1 += row_step(tab, lane8, code2_s, offset, w1, xlo, xhi)
                acc2 += row_step(tab, lane8, code2_s, offset, w2, xlo, xhi)
                acc3 += row_step(tab, lane8, code2_s, offset, w3, xlo, xhi)
                c = cn
            acc0 = reduce(acc0)
            acc1 = reduce(acc1)
            acc2 = reduce(acc2)
            acc3 = reduce(acc3)
            if lane == 0:
                store(y, r0, acc0, is_bf16)
                if r0 + uint64(1) < n:
                    store(y, r1, acc1, is_bf16)
                if r0 + uint64(2) < n:
                    store(y, r2, acc2, is_bf16)
                if r0 + uint64(3) < n:
                    store(y, r3, acc3, is_bf16)
            group += nwarps

    return gemv


GEMV = {"bf16": make_gemv(True), "fp16": make_gemv(False)}


def resident_blocks(kernel):
    """Blocks of a compiled kernel one SM holds at once (registers, shared memory), None if unknown."""
    info = nf4lab.device_info()
    if not info.get("sms") or not getattr(kernel, "overloads", None):
        return None  # simulator, or not compiled yet (the first launch compiles it)
    try:
        regs = kernel.get_regs_per_thread()
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        smem = kernel.get_shared_mem_per_block()
        smem = max(smem.values()) if isinstance(smem, dict) else smem
    except Exception:  # an API change: fall back to one block per group (correct, a little slower)
        return None
    by_regs = 65536 // (-(-regs // 8) * 8 * 32 * WARPS)       # 64K registers, 8-register granules
    by_smem = (info.get("smem_per_sm") or 228 * 1024) // (smem + 1024)  # 1 KB reserved per block
    by_threads = (info.get("max_threads_per_sm") or 2048) // (32 * WARPS)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def grid_size(kern, N, policy="balanced"):
    """Blocks to launch. The kernel loops over groups of ROWS rows (whole warps), so any grid is correct.

    "full": one warp per group (the 32 KB table is built once per WARPS * ROWS rows);
    "resident": as many blocks as the GPU holds at once (some warps then do one group more than
    others); "balanced" (default): the fewest rounds the resident warps need, and just enough
    warps that each does that many groups."""
    groups = -(-N // ROWS)
    full = -(-groups // WARPS)
    per_sm = resident_blocks(kern)
    if policy == "full" or not per_sm:
        return full
    capacity = per_sm * nf4lab.device_info()["sms"]
    if policy == "resident":
        return min(full, capacity)
    rounds = -(-groups // (capacity * WARPS))
    return min(full, -(-groups // (rounds * WARPS)))


def launch(g, kernels=GEMV, policy="balanced"):
    """Run the fused GEMV on a gemv.GemvBuffers (batch 1), on g.stream."""
    gemv.validate(g, max_m=1)
    kern = kernels[g.dtype]
    grid = g.grid if getattr(g, "grid", None) else grid_size(kern, g.N, policy)
    kern[grid, WARPS * 32, g.stream](g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset,
                                     g.x_u32, g.y, g.N, g.K, g.bs_shift)


GRID_POLICIES = ("balanced", "resident", "full")

SIG = (T.uint32[::1], T.uint8[::1], T.float32[::1], T.float32[::1], T.float32[::1], T.float32,
       T.uint32[::1], T.uint16[::1], T.int64, T.int64, T.int64)  # the kernel's argument types, for PTX/SASS
