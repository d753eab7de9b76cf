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

import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab import gemv, ops
from nf4lab.gemv import f16_to_f32, f32_from_bits, shfl_down_sync

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
# absmax2 group every 256 blocks), so with K a multiple of 32 each row is a whole number of 16-byte
# vectors of 32 weights, and a vector never straddles a block.
#
# - **One warp per two rows.** Lane `l` takes vectors `l, l+32, l+64, ...` of the row: each
#   iteration the warp reads 512 contiguous bytes per row with one `ld.global.v4.u32` per lane
#   (128-bit loads, coalesced). Two rows per warp let one load of `x` feed both rows and keep two
#   independent weight loads in flight.
# - **x** (K activations, 8-56 KB) is read with 128-bit loads too: four per 32 columns. Every warp
#   of the GPU reads the same x, so it stays in L1/L2; only the weights stream from DRAM.
# - **Dequantize in registers**: the 16-entry NF4 table and the 256-entry `code2` table in shared
#   memory; the block scale `fadd_rn(fmul_rn(code2[absmax_q[b]], absmax2[b >> 8]), offset)` once
#   per 32 weights, and the partial dot product `sum lut[q] * x` is multiplied by it once.
# - **Accumulate in float32**, then reduce the 32 lanes with `shfl.sync.down` (five steps), and lane
#   0 writes `y[row]`, rounded to nearest even to bf16/fp16.
#
# Two helpers come from `nf4lab.gemv` because the simulator lacks them: `f32_from_bits` (a bit
# cast, to turn bf16 bits into a float) / `f16_to_f32` (`cvt.f32.f16`), and `shfl_down_sync`
# (on a GPU: `cuda.shfl_down_sync` itself).

# %% tags=["kernel"]
WARPS = 4   # warps per block
ROWS = 2    # rows of W per warp


@cuda.jit(device=True, inline="always")
def dot8(w, xa, xb, xc, xd, lut, is_bf16):
    """8 codes of one word (byte j: high nibble = column 2j, low = 2j+1) times 8 activations in 4 words."""
    if is_bf16:  # bf16 -> float32 is a 16-bit shift of the bits
        x0 = f32_from_bits(xa << uint32(16))
        x1 = f32_from_bits(xa & uint32(0xFFFF0000))
        x2 = f32_from_bits(xb << uint32(16))
        x3 = f32_from_bits(xb & uint32(0xFFFF0000))
        x4 = f32_from_bits(xc << uint32(16))
        x5 = f32_from_bits(xc & uint32(0xFFFF0000))
        x6 = f32_from_bits(xd << uint32(16))
        x7 = f32_from_bits(xd & uint32(0xFFFF0000))
    else:
        x0 = f16_to_f32(xa)
        x1 = f16_to_f32(xa >> uint32(16))
        x2 = f16_to_f32(xb)
        x3 = f16_to_f32(xb >> uint32(16))
        x4 = f16_to_f32(xc)
        x5 = f16_to_f32(xc >> uint32(16))
        x6 = f16_to_f32(xd)
        x7 = f16_to_f32(xd >> uint32(16))
    s = lut[(w >> uint32(4)) & uint32(15)] * x0
    s += lut[w & uint32(15)] * x1
    s += lut[(w >> uint32(12)) & uint32(15)] * x2
    s += lut[(w >> uint32(8)) & uint32(15)] * x3
    s += lut[(w >> uint32(20)) & uint32(15)] * x4
    s += lut[(w >> uint32(16)) & uint32(15)] * x5
    s += lut[(w >> uint32(28)) & uint32(15)] * x6
    s += lut[(w >> uint32(24)) & uint32(15)] * x7
    return s


@cuda.jit(device=True, inline="always")
def dot32(packed_u32, wi, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, lut, is_bf16):
    """One 128-bit load of 32 codes, dotted with 32 activations (16 words)."""
    w0, w1, w2, w3 = ops.load_u32x4(packed_u32, wi)
    return (dot8(w0, x0, x1, x2, x3, lut, is_bf16) + dot8(w1, x4, x5, x6, x7, lut, is_bf16)
            + dot8(w2, x8, x9, x10, x11, lut, is_bf16) + dot8(w3, x12, x13, x14, x15, lut, is_bf16))


@cuda.jit(device=True, inline="always")
def block_scale(absmax_q, absmax2, code2_s, offset, b):
    return ops.fadd_rn(ops.fmul_rn(code2_s[absmax_q[b]], absmax2[b >> uint64(8)]), offset)


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
        lut_s = cuda.shared.array(16, float32)
        code2_s = cuda.shared.array(256, float32)
        tid = cuda.threadIdx.x
        for i in range(tid, 256, WARPS * 32):
            code2_s[i] = code2[i]
        if tid < 16:
            lut_s[tid] = lut[tid]
        cuda.syncthreads()
        lane = uint64(tid & 31)
        n = uint64(N)
        k = uint64(K)
        r0 = (uint64(cuda.blockIdx.x) * uint64(WARPS) + uint64(tid >> 5)) * uint64(ROWS)
        if r0 >= n:
            return  # the whole warp leaves together
        has_r1 = r0 + uint64(1) < n
        r1 = r0 + uint64(1) if has_r1 else r0
        nvec = k >> uint64(5)              # 16-byte vectors (32 weights) per row
        w0 = r0 * (k >> uint64(3))         # first uint32 word of each row
        w1 = r1 * (k >> uint64(3))
        acc0 = float32(0.0)
        acc1 = float32(0.0)
        v = lane
        while v < nvec:
            xi = v << uint64(4)            # 32 activations = 16 words
            x0, x1, x2, x3 = ops.load_u32x4(x_u32, xi)
            x4, x5, x6, x7 = ops.load_u32x4(x_u32, xi + uint64(4))
            x8, x9, x10, x11 = ops.load_u32x4(x_u32, xi + uint64(8))
            x12, x13, x14, x15 = ops.load_u32x4(x_u32, xi + uint64(12))
            col = v << uint64(5)
            s0 = block_scale(absmax_q, absmax2, code2_s, offset, (r0 * k + col) >> uint64(bs_shift))
            s1 = block_scale(absmax_q, absmax2, code2_s, offset, (r1 * k + col) >> uint64(bs_shift))
            d0 = dot32(packed_u32, w0 + (v << uint64(2)), x0, x1, x2, x3, x4, x5, x6, x7,
                       x8, x9, x10, x11, x12, x13, x14, x15, lut_s, is_bf16)
            d1 = dot32(packed_u32, w1 + (v << uint64(2)), x0, x1, x2, x3, x4, x5, x6, x7,
                       x8, x9, x10, x11, x12, x13, x14, x15, lut_s, is_bf16)
            acc0 += s0 * d0
            acc1 += s1 * d1
            v += uint64(32)
        acc0 = reduce(acc0)
        acc1 = reduce(acc1)
        if lane == 0:
            store(y, r0, acc0, is_bf16)
            if has_r1:
                store(y, r1, acc1, is_bf16)

    return gemv


GEMV = {"bf16": make_gemv(True), "fp16": make_gemv(False)}


def launch(g, kernels=GEMV):
    """Run the fused GEMV on a gemv.GemvBuffers (batch 1), on g.stream."""
    if g.M != 1:
        raise ValueError("this kernel computes one row of x (batch 1)")
    rows_per_block = WARPS * ROWS
    grid = (g.N + rows_per_block - 1) // rows_per_block
    kernels[g.dtype][grid, WARPS * 32, g.stream](g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset,
                                                 g.x_u32, g.y, g.N, g.K, g.bs_shift)


GEMV_VERSIONS = {gemv.FUSED: launch}

# %% [markdown]
# ## 3. PTX evidence
#
# The loop should hold six 128-bit loads (four of x, one per row of W), shared-memory loads for
# the tables, the scale's two byte/float loads per 32 weights (not per weight), no local memory,
# no float64, and five `shfl.sync.down` per row at the end.

# %%
from numba import types as T

SIG = (T.uint32[::1], T.uint8[::1], T.float32[::1], T.float32[::1], T.float32[::1], T.float32,
       T.uint32[::1], T.uint16[::1], T.int64, T.int64, T.int64)
ptx = nf4lab.compile_ptx(GEMV["bf16"], SIG)
nf4lab.ptx.show(ptx, [r"^ld\.global", r"^shfl"], limit=16)
nf4lab.ptx.check(ptx, present=[r"^ld\.global(\.nc)?\.v4\.u32", r"^shfl\.sync\.down", r"^ld\.shared\.f32"],
                 absent=[r"^ld\.local", r"\.f64", r"^(div|rem)\.(s|u)64"])
n_v4 = nf4lab.ptx.count(ptx, r"^ld\.global(\.nc)?\.v4")
n_u8 = nf4lab.ptx.count(ptx, r"^ld\.global(\.nc)?\.u8")
print(f"\n128-bit loads: {n_v4} (4 of x, 1 per row of W); absmax_q byte loads: {n_u8} (one per row per "
      "32 weights); the other scalar loads fill the shared tables before the loop")
assert n_v4 == 6 and n_u8 == 2

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
# each 32-term partial sum by the block scale, then add the final rounding to bf16/fp16,
# `u_out * |y|` with `u_out = 2^-8` (bf16) or `2^-11` (fp16). The bound is worst-case (real
# errors grow like sqrt(K)), yet a real bug (a swapped nibble, a missing reduction step, a wrong
# scale) exceeds it by orders of magnitude, as the planted bugs below show.
#
# The simulator runs the kernel on small shapes: odd N, K not a multiple of 256, a case spanning
# two absmax2 groups, bf16 and fp16.

# %%
SHAPES = [((48, 192), "bf16"), ((96, 320), "bf16"), ((33, 320), "fp16")] if nf4lab.SIMULATOR else \
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
    "32 columns (one lane's vector) lost": gc.x[:, 32:] @ gc.w[:, 32:].T,
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
