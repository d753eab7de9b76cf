# Capstone: a fused NF4 GEMV for decoding (percent-format source of notebooks/09_fused_gemv.ipynb)

# %% [markdown]
# # 09 · Capstone: fuse NF4 dequantization into the matrix-vector product
#
# **Goal.** At decode time (batch 1) every linear layer computes `y = x @ W.T` with `x` of shape
# (1, K) and an NF4 weight `W` of shape (N, K). We write one `numba.cuda` kernel that reads each
# packed weight byte once, dequantizes in registers and accumulates the dot products, and compare
# it, on the same data and in the same run, with bitsandbytes' own fused kernel (`matmul_4bit` with
# a one-row input) and with `dequantize_4bit` followed by `torch.matmul`.
#
# 1. Why fusing pays: the byte count
# 2. The kernel
# 3. PTX evidence
# 4. Correctness: a tolerance from the summation length, and the difference from bitsandbytes
# 5. Benchmark: effective weight bandwidth vs the copy ceiling at LLM shapes
# 6. Reading: what Marlin does beyond this
# 7. Exercise

# %%
import nf4lab  # first: may switch numba to its simulator

import subprocess

import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab import gemv, ops
from nf4lab.gemv import f16_to_f32, f32_from_bits, lds_pair, shfl_down_sync

print(nf4lab.describe())

# %% [markdown]
# ## 1. Why fusing pays
#
# A GEMV does 2 flops per weight and reads the weight once: it is bound by memory bandwidth, by
# a factor of hundreds. So its time is the bytes it moves divided by the bandwidth. Dequantizing
# first writes W in 16 bits and reads it back: 0.5 + 2 + 2 bytes per weight. A fused kernel reads
# 0.5 byte per weight plus the scales (1 byte per 64 weights, and a float per 16384): about 9x
# fewer bytes. The numbers from `nf4lab.gemv`'s byte model:

# %%
print(f"{'W (N x K)':>12} {'fused reads':>12} {'dequant + matmul':>17} {'ratio':>6}")
for N, K in gemv.LLM_SHAPES:
    f, u = gemv.weight_bytes(N, K), gemv.unfused_bytes(N, K)
    print(f"{N:>5} x {K:<5} {f / 1e6:>9.1f} MB {u / 1e6:>14.1f} MB {u / f:>6.1f}")

# %% [markdown]
# A fused kernel at the copy ceiling (about 3 TB/s on an H100) reads the 117 MB of an 8192x28672
# weight in about 40 us; dequantize + matmul needs at least 9x that. bitsandbytes already ships a
# fused kernel for this case; the question is how close to the ceiling it gets, and whether we can
# do better with the techniques of the series.
#
# ## 2. The kernel
#
# Layout: W is quantized flat (weight index `row*K + col`, high nibble first, blocks of 64, an
# absmax2 group every 256 blocks), so with K a multiple of 64 each row is a whole number of blocks.
#
# A first version (one warp per two rows, 16-entry table, scale per 32 weights) stayed far from the
# copy ceiling on an H100. Its inner loop, counted in SASS (the machine code, see section 3), spent
# several instructions per weight: two to cut a nibble out of a word, one shared-memory table read
# per weight, the multiply-add, and the conversion of x repeated for every second row. At 3 TB/s
# an H100 must consume 6e12 weights per second: with ~5 instructions per weight its
# schedulers are nearly saturated, and each shared read of 32 lanes takes one of the ~1 per clock
# per SM the shared memory can serve. This version cuts both:
#
# - **A byte-pair table.** A code byte holds two weights, so a 256-entry table of *pairs*
#   `(lut[byte >> 4], lut[byte & 15])` gives both with one 64-bit shared read: half the table
#   reads. With 256 entries, lanes reading different bytes would hit the same bank; 16 copies of the
#   table (32 KB), copy `c` in banks 2c and 2c+1 of every 128-byte row, lane `l` reading copy
#   `l & 15`, make every read conflict-free. The read is addressed in bytes, `(byte << 7) | lane8`:
#   one shift and one and-or of the 32-bit code word (`gemv.lds_pair` emits `ld.shared.v2.f32`, so
#   no index is widened to 64 bits and scaled per read).
# - **The scale out of the loop.** A lane takes 64 consecutive columns of a row, exactly one absmax
#   block: `acc += scale * sum_k lut[q_k] x_k`, one FMA per weight and one scale per 64.
# - **x in registers, shared by 4 rows.** A warp computes 4 rows. Per step a lane loads its 64
#   columns of x (128 bytes, eight 128-bit loads) once, converts each value once, and uses it for
#   the 4 rows' 64 codes (two 128-bit loads per row): a warp step reads 1 KB contiguous per row.
# - **Loads in flight.** The codes (and absmax bytes) of the next step are loaded before the current
#   step is computed: 128 bytes per lane always in flight, 4 KB per warp.
# - **Reduction at the end** only: each lane accumulates its columns in float32 over the whole row,
#   then five `shfl.sync.down` per row, and lane 0 rounds to nearest even to bf16/fp16.
# - **Grid.** Warps loop over groups of 4 rows, so the 32 KB table is built once per block; the
#   launch asks the compiled kernel how many blocks fit on an SM and launches just enough of them.
#
# Helpers from `nf4lab.gemv`, because the simulator lacks them: `f32_from_bits` (a bit cast, to
# turn bf16 bits into a float) / `f16_to_f32` (`cvt.f32.f16`), `lds_pair` and `shfl_down_sync`
# (on a GPU: `cuda.shfl_down_sync` itself).

# %% tags=["kernel"]
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
    if g.M != 1:
        raise ValueError("this kernel computes one row of x (batch 1)")
    kern = kernels[g.dtype]
    grid = g.grid if getattr(g, "grid", None) else grid_size(kern, g.N, policy)
    kern[grid, WARPS * 32, g.stream](g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset,
                                     g.x_u32, g.y, g.N, g.K, g.bs_shift)


GEMV_VERSIONS = {gemv.FUSED: launch}
GRID_POLICIES = ("balanced", "resident", "full")  # for tools/bench_gemv.py --policies

from numba import types as T  # noqa: E402

SIG = (T.uint32[::1], T.uint8[::1], T.float32[::1], T.float32[::1], T.float32[::1], T.float32,
       T.uint32[::1], T.uint16[::1], T.int64, T.int64, T.int64)  # the kernel's argument types, for PTX/SASS

# %% [markdown]
# ## 3. PTX and SASS evidence
#
# The loop should hold 128-bit loads only for x and the codes (8 of x, 2 per row, and 8 more for
# the next step's codes), one `ld.shared.v2.f32` per code byte (128 per step: 4 rows x 32 bytes),
# one absmax byte per row per step, no local memory, no float64, and five `shfl.sync.down` per
# row at the end.

# %%
ptx = nf4lab.compile_ptx(GEMV["bf16"], SIG)
nf4lab.ptx.show(ptx, [r"^ld\.global(\.nc)?\.v4", r"^ld\.shared\.v2", r"^shfl"], limit=6)
nf4lab.ptx.check(ptx, present=[r"^ld\.global(\.nc)?\.v4\.u32", r"^shfl\.sync\.down", r"^ld\.shared\.v2\.f32"],
                 absent=[r"^ld\.local", r"\.f64", r"^(div|rem)\.(s|u)64"])
n_v4 = nf4lab.ptx.count(ptx, r"^ld\.global(\.nc)?\.v4")
n_pair = nf4lab.ptx.count(ptx, r"^ld\.shared\.v2\.f32")
n_u8 = nf4lab.ptx.count(ptx, r"^ld\.global(\.nc)?\.u8")
print(f"\n128-bit loads: {n_v4} (8 of x + 2 per row, and 2 per row for the first step); pair reads: "
      f"{n_pair} (one per code byte); absmax_q byte loads: {n_u8} (one per row per step, and for the first)")
assert n_v4 == 8 + 2 * ROWS * 2 and n_pair == ROWS * 32 and n_u8 == 2 * ROWS

# %% [markdown]
# PTX is not what runs: `ptxas` turns it into SASS, the GPU's own instructions. When the CUDA
# toolkit's `ptxas` and `cuobjdump` are installed (no GPU needed), we assemble the kernel for the
# H100 (sm_90) and count the instructions of its inner loop per weight, with the registers per
# thread (which decide how many warps an SM holds). Ideal: one FMA per weight, half a table read,
# one shift and one LOP3 per byte; the rest (x conversion, loads, scale, loop) is shared by 256
# weights.

# %%
try:
    for dt in ("bf16",):
        r = gemv.sass_report(GEMV[dt], SIG, ROWS * LANE_COLS, f"gemv_{dt}", ptx=ptx)
        print(f"{dt}: {r['registers']} registers, {r['spill_bytes']} bytes spilled; inner loop: "
              f"{r['loop_instructions']} SASS instructions for {r['weights_per_trip']} weights per lane = "
              f"{r['per_weight']:.2f} per weight")
        print("    " + ", ".join(f"{k} {v}" for k, v in list(r["opcodes"].items())[:8]))
except (FileNotFoundError, OSError, subprocess.CalledProcessError) as exc:
    print(f"no SASS here ({exc}); install the CUDA toolkit's ptxas and cuobjdump to count instructions")

# %% [markdown]
# ## 4. Correctness
#
# The kernel sums K float32 products in its own order (32 lanes, then a tree), bitsandbytes in
# another, `torch.matmul` in a third: **no two of them are bit-exact with each other, and none is
# wrong**. So instead of bits we compare with the exact value computed in float64,
# `y64 = x @ W.T` with W the float32 weights bitsandbytes dequantizes to, and allow the error any
# float32 summation of K terms may make (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1):
#
# $$|\hat y - y_{64}| \le \gamma_K \sum_k |x_k w_k|, \qquad \gamma_K \approx K u_{32},\ u_{32} = 2^{-24}$$
#
# We take `K * eps32` (`eps32 = 2^-23`, twice the bound) to cover the extra rounding of scaling
# each 64-term partial sum by the block scale, then add the final rounding to bf16/fp16,
# `u_out * |y|` with `u_out = 2^-8` (bf16) or `2^-11` (fp16). The bound is worst-case (real
# errors grow like sqrt(K)), yet a real bug (a swapped nibble, a missing reduction step, a wrong
# scale) exceeds it by orders of magnitude, as the planted bugs below show.
#
# The simulator runs the kernel on small shapes: odd N (the last group of 4 rows is partial),
# K not a multiple of 256, a case spanning two absmax2 groups (53 x 320 > 256 x 64), bf16 and fp16.

# %%
SHAPES = [((24, 192), "bf16"), ((53, 320), "fp16")] if nf4lab.SIMULATOR else \
    [((512, 4096), "bf16"), ((255, 14336), "bf16"), ((100, 4160), "fp16")]
cases = {}
for (N, K), dtype in SHAPES:
    gc = gemv.make_gemv_case(N, K, dtype)
    g = gemv.make_gemv_buffers(gc)
    launch(g)
    y = g.result()
    rep = gemv.check(y, gc, name=f"fused {N}x{K} {dtype}")  # raises outside the tolerance
    yb = gemv.bnb_output(gc, "cuda" if nf4lab.ON_GPU else "cpu")
    rep_b = gemv.compare(yb, gc, name=f"bitsandbytes matmul_4bit {N}x{K} {dtype}")
    diff = np.abs(gemv.to_f32(y, dtype) - gemv.to_f32(yb, dtype).reshape(-1))
    print(rep)
    print(f"  {rep_b}".splitlines()[0])
    print(f"  |ours - bitsandbytes|: max {diff.max():.3g}, median {np.median(diff):.3g}; "
          f"{(diff == 0).mean():.0%} of outputs equal")
    cases[(N, K, dtype)] = gc

# %% [markdown]
# Our kernel is within the bound everywhere (the worst ratio is near 1 only because of the final
# rounding to 16 bits, which is part of the bound). bitsandbytes can fall outside it: on the CPU
# (and in its CUDA kernel) it rounds each dequantized weight to bf16/fp16 before multiplying, an
# extra relative error of up to 2^-8 per weight that the float32 bound does not allow. Its output
# is a fine answer, just a less exact one; the difference between the two is that rounding.
#
# Does the tolerance catch bugs? Feed it outputs computed with planted mistakes (in numpy, on the
# first case):

# %%
from nf4lab import reference

gc = cases[next(iter(cases))]
absmax = reference.block_absmax(gc.absmax_q, gc.absmax2, gc.code2, gc.offset)
codes = reference.unpack_codes(gc.packed, gc.N * gc.K)
swapped = codes.reshape(-1, 2)[:, ::-1].reshape(-1)  # low nibble first
bugs = {
    "nibbles swapped": gc.x @ (gc.lut[swapped] * np.repeat(absmax, 64)).reshape(gc.N, gc.K).T,
    "offset forgotten": gc.x @ (gc.lut[codes] * np.repeat(absmax - gc.offset, 64)).reshape(gc.N, gc.K).T,
    "64 columns (one lane's block) lost": gc.x[:, 64:] @ gc.w[:, 64:].T,
    "fine (float32, numpy order)": (gc.x @ gc.w.T).astype(np.float32),
}
for name, y_bug in bugs.items():
    print(str(gemv.compare(y_bug.astype(np.float32), gc, name=name)).splitlines()[0])
assert not gemv.compare(bugs["nibbles swapped"].astype(np.float32), gc).ok
assert gemv.compare(bugs["fine (float32, numpy order)"], gc).ok

# %% [markdown]
# ## 5. Benchmark
#
# On a GPU this cell measures, in one run and on the same weights and activations: bitsandbytes
# `matmul_4bit(x, W.t(), quant_state)` with a one-row `x` (its fused 4-bit GEMV kernel),
# `dequantize_4bit` followed by `torch.matmul`, and our kernel, at four LLM shapes, bf16 and fp16,
# plus the device-to-device copy ceiling. GPU time comes from CUDA-graph replays
# (`nf4lab.bench.gpu_time_ms`); every timed function cycles over enough copies of the weight to
# exceed 4x the L2 cache, so the weights come from DRAM, as in a real decoding step. The effective
# weight bandwidth is (packed codes + absmax_q + absmax2 + code2 bytes) / time, for all three (so
# for dequantize + matmul it is far below what that pair actually moves). The run is saved to
# `data/results/<gpu>/09_fused_gemv.json`. Without a GPU we show the recorded run, if any.

# %%
from nf4lab import bench, results

if nf4lab.ON_GPU:
    run = gemv.benchmark(launch)
    path = run.save(gemv.NAME)
    print(gemv.table(run))
    print(f"saved {path.relative_to(results.ROOT)}")
else:
    run = bench.Run.load(gemv.NAME)
    if run is None:
        print("No GPU here, and no GPU results recorded for 09_fused_gemv under data/results/: "
              "nothing to show. Run `python tools/bench_gemv.py` on a GPU to record them.")
    else:
        print(f"No GPU here: showing the results recorded in {run.path}\n  ({results.label(run.meta)})\n")
        print(gemv.table(run))
        for c in run.meta.get("checks", []):
            print(f"  {c['name']:<40} {'x'.join(map(str, c['shape'])):>11} {c['dtype']}: within tolerance "
                  f"{c['ok']} (worst error/tolerance {c['worst_ratio']:.2g}), max |ours - bnb| "
                  f"{c['max_abs_diff_vs_bnb']:.3g}")
if run is not None:
    gemv.plot(run)

# %% [markdown]
# What to look for: the fused kernel against the dashed copy ceiling and the dotted 85% line,
# and against bitsandbytes' GEMV at 4096x14336 and 8192x28672 (the issue's target: faster than
# bitsandbytes and at least 85% of the copy ceiling there). 4096x4096 moves only 8 MB: launch and
# ramp-up take a large share of its few microseconds. Dequantize + matmul is far behind, as the
# byte count predicted.
#
# ## 6. Reading: what Marlin does beyond this
#
# For batch 1 the whole game is streaming the weights once at full bandwidth, which a warp-per-row
# kernel with 128-bit loads can do. With a batch of 16-64 tokens (speculative decoding, batched
# serving) the same weight bytes feed M rows of activations, the arithmetic grows M-fold and
# CUDA cores become the bottleneck. Marlin (Frantar, Castro et al., IST Austria, 2024, "MARLIN:
# Mixed-Precision Auto-Regressive Parallel Inference on Large Language Models") keeps the kernel
# memory-bound up to batch 16-32 with:
#
# - **Tensor cores**: `mma.sync m16n8k16` on fp16; the 4-bit weights are dequantized in registers
#   straight into the fragment layout the MMA expects. The weights are **reshuffled offline** so
#   that one 128-bit load gives a thread exactly the codes of its fragments, and dequantization uses
#   bit tricks (`lop3` plus a magic-number fp16 subtraction) instead of a table.
# - **Asynchronous copies**: `cp.async` global-to-shared loads in a multi-stage pipeline (4 stages),
#   with an evict-first cache hint on weights (read once) while activations stay in L2; the next
#   tiles load while tensor cores work on the current one.
# - **Striped partitioning**: instead of one output tile per block, each SM takes a stripe of tiles
#   across several output columns and the K dimension, so that all SMs are busy for any shape, and
#   partial sums of tiles split along K are reduced in a global-memory buffer with a lock-step
#   ("serial") reduction.
# - **Layout of the scales** per group of 128, applied once per tile, and double buffering of
#   shared memory to hide latency.
#
# The Chinese walk-through in `shared/seeds/001_2aefac3babe15ae3.txt` traces `marlin_cuda` on a
# 128x256x768 problem: `thread_k`/`thread_n` tile choice (128x128 for m <= 16, else 64x256), the
# 16x16 tiles of `m16n8k16`, and how the stripes are assigned to SMs.
#
# **Batch up to 8 (stretch): not done in this notebook.** The plan: template the kernel on M
# (a compile-time constant <= 8), decode each weight once to `lut[q]` and apply it to M rows of x
# held in M accumulators; x traffic grows M-fold (still from L1/L2) and past M of about 4 the
# CUDA-core work per byte approaches the H100's limit, which is where tensor cores (Marlin) take over.
#
# ## 7. Exercise: the reduction is wrong
#
# The kernel below is our GEMV with a different `warp_sum_ex`. Its outputs are far off. Fix the
# reduction so that lane 0 ends up with the sum of all 32 lanes. The check runs it on a small case
# and compares with the float64 reference under the tolerance of section 4.

# %%
@cuda.jit(device=True, inline="always")
def warp_sum_ex(v):
    ### BEGIN SOLUTION
    for offset in (16, 8, 4, 2, 1):
        v += shfl_down_sync(0xFFFFFFFF, v, offset)
    ### STUDENT
    # Something is missing: after these steps lane 0 holds the sum of only some lanes.
    v += shfl_down_sync(0xFFFFFFFF, v, 16)
    v += shfl_down_sync(0xFFFFFFFF, v, 8)
    v += shfl_down_sync(0xFFFFFFFF, v, 4)
    ### END SOLUTION
    return v


def check_exercise():
    gc = gemv.make_gemv_case(16, 128, "bf16", seed=3)
    g = gemv.make_gemv_buffers(gc)
    try:
        launch(g, kernels={"bf16": make_gemv(True, reduce=warp_sum_ex)})
        rep = gemv.compare(g.result(), gc, name="exercise: warp reduction")
    except Exception as exc:  # a broken kernel must not stop the notebook
        print(f"NOT PASSED: the kernel raised {type(exc).__name__}: {exc}")
        return False
    print(("PASSED: " if rep.ok else "NOT PASSED (not solved yet): ") + str(rep))
    return rep.ok


check_exercise()

# %% [markdown]
# **Hint.** `shfl_down_sync(mask, v, d)` gives lane i the value of lane i + d. Adding it with
# d = 16 folds 32 lanes onto 16; how many folds does lane 0 need before it has seen all 32?
