# Capstone: a fused NF4 GEMV for decoding (percent-format source of notebooks/09_fused_gemv.ipynb)
# %% [markdown]
# # 09 · Capstone: fuse NF4 dequantization into the matrix-vector product
#
# **Goal.** At decode time every linear layer computes `y = x @ W.T` with `x` of shape (1, K) and an NF4
# weight `W` of shape (N, K). We write one `numba.cuda` kernel that reads each packed weight byte once,
# dequantizes in registers and accumulates the dot products, and compare it, on the same data and in the
# same run, with bitsandbytes' own fused kernel (`matmul_4bit`, which runs `gemv_4bit` for one row of x).
# The same kernel then takes up to 8 rows of x (bitsandbytes: `gemm_4bit`).
#
# **Contents**
# 1. [The byte count: a prediction](#bytes)
# 2. [The kernel](#kernel)
# 3. [PTX and SASS evidence](#evidence)
# 4. [Correctness: a tolerance, not bits](#correctness)
# 5. [Benchmark: against bitsandbytes and the read bound](#benchmark)
# 6. [Batch: up to 8 rows of x](#batch)
# 7. [The road here: what lost, and why](#road)
# 8. [Reading: Marlin and FLUTE](#reading)
# 9. [Exercise](#exercise)

# %%
import nf4lab  # first: may switch numba to its simulator

import json

import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab import bench, gemv, ops, reference, results
from nf4lab.gemv import (MAX_M, Design, auto_design, bar_sync, f16_to_f32, f32_from_bits, grid_size, lds_pair,
                         load_stream_u32x4, shfl_down_sync)

print(nf4lab.describe())
RECORDED, BOUND = bench.Run.load(gemv.NAME), bench.Run.load("09_read_bound")  # lab/bench_gemv.py, gemv_read_bound.py

# %% [markdown]
# <a id="bytes"></a>
# ## 1. The byte count: a prediction
#
# A GEMV does 2 flops per weight read once: memory-bound. Dequantize + matmul moves 0.5 + 2 + 2 bytes per weight;
# fused, 0.5 plus the scales. With a GEMV run recorded for this GPU, the time at its copy ceiling (a prediction):

# %%
copy = next((r for r in RECORDED.records if r["name"] == gemv.COPY), None) if RECORDED else None
print(f"{'W (N x K)':>12} {'fused reads':>12} {'dequant + matmul':>17} {'ratio':>6}"
      + (f" {'fused us at copy speed':>23}" if copy else ""))
for N, K in gemv.LLM_SHAPES:
    f, u = gemv.weight_bytes(N, K), gemv.unfused_bytes(N, K)
    print(f"{N:>5} x {K:<5} {f / 1e6:>9.1f} MB {u / 1e6:>14.1f} MB {u / f:>6.1f}"
          + (f" {f / copy['gbps'] / 1e3:>23.1f}" if copy else ""))
print(f"(copy ceiling {copy['gbps']:.0f} GB/s, {results.label(RECORDED.meta)})" if copy
      else "(no GEMV run recorded for this GPU: no copy ceiling to time against)")

# %% [markdown]
# Little's law: bandwidth = bytes in flight / latency. With the series' assumed 700 ns DRAM latency, 3 TB/s
# (about an H100's copy) needs about 2.1 MB in flight (16 KB per SM of its 132): many 128-bit loads outstanding.
#
# <a id="kernel"></a>
# ## 2. The kernel
#
# W is flat (`row*K + col`, high nibble first, blocks of 64). A warp's loop trip, an **item**, is R rows x
# 32 lanes x 32 columns: one 128-bit load (32 codes) per lane and row, 512 contiguous bytes per warp and row.
#
# - **Byte-pair table**: 256 pairs `(lut[byte >> 4], lut[byte & 15])`, one 64-bit shared read per code byte
#   (`lds_pair`); 16 copies (32 KB), lane `l` reading copy `l & 15`: no bank conflicts.
# - **The scale out of the inner sum**: a lane's 32 columns share one absmax block, one scale per item.
# - **Software pipeline**: a lane computes one item while the next one's loads fly, across row groups too.
# - **Weights bypass L1** (`load_stream_u32x4`: `ld.global.nc.L1::no_allocate.v4.u32`): read once. **Launch
#   bounds** (`cuda.jit(launch_bounds=(256, B))`) ask ptxas to fit B blocks per SM.
# - **Split-K teams**: with too few row groups, S warps share one and add their sums after a named barrier.
#
# `auto_design(N, M)` (the lab's H100 measurements, section 7) goes by how many warps the row groups give the
# SMs; with 132 (H100, H200): R4 S2 B3 for N up to about 6300 (N = 4096, section 4's small shapes), R8 S2 B2 up
# to about 8400 (N = 8192), else (N = 14336, every batch) R4 S1 B2. First the device functions, one job each:

# %%
@cuda.jit(device=True, inline="always")
def x_pair(u, is_bf16):
    if is_bf16:  # bf16 -> float32 is a 16-bit shift of the bits
        return f32_from_bits(u << uint32(16)), f32_from_bits(u & uint32(0xFFFF0000))
    return f16_to_f32(u), f16_to_f32(u >> uint32(16))


@cuda.jit(device=True, inline="always")
def load_x8(x_u32, i, is_bf16):
    a = ops.load_u32x4(x_u32, i)
    return x_pair(a[0], is_bf16) + x_pair(a[1], is_bf16) + x_pair(a[2], is_bf16) + x_pair(a[3], is_bf16)


@cuda.jit(device=True, inline="always")
def lut8(tab, lane8, w, L, o):
    """The 8 NF4 values of code word w into L[o..o+7]: byte j's pair at byte offset (byte << 7) | lane8."""
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

# %% [markdown]
# The factory: sizes are compile-time constants; local arrays indexed by unrolled loops live in registers.

# %%
def make_gemv(is_bf16, d=Design(), reduce=warp_sum):
    R, S, M = d.rows, d.split, d.m
    W, THREADS, STEP, SSH = 8, 256, 1024, 10   # 8 warps; a warp covers 32 lanes x 32 columns per item
    TEAMS, RM, NC, NL, NRED, TAB = W // S, R * M, 4 * R, 8 * R, 2 * W * R * M, 256 * 16

    @cuda.jit(device=True, inline="always")
    def row_offsets(ro, g, n, kw):  # first code word of each row of group g (rows past N repeat the last)
        for r in range(R):
            ro[r] = uint32(min(uint32(g * uint32(R) + uint32(r)), uint32(n - uint32(1))) * kw)

    @cuda.jit(device=True, inline="always")
    def fetch(packed_u32, absmax_q, absmax2, nc, nq, na, ro, wofs, ash):  # issue one item's loads
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
        part = warp & uint32(S - 1)            # this warp takes items part, part + S, ... of a row group
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
        ash = uint32(uint32(bs_shift) - uint32(3))   # code word -> absmax block
        nc, nq, na = cuda.local.array(NC, uint32), cuda.local.array(R, uint32), cuda.local.array(R, float32)
        cc, cq, ca = cuda.local.array(NC, uint32), cuda.local.array(R, uint32), cuda.local.array(R, float32)
        ro, rn, rs = cuda.local.array(R, uint32), cuda.local.array(R, uint32), cuda.local.array(R, uint32)
        L, p, acc = cuda.local.array(NL, float32), cuda.local.array(RM, float32), cuda.local.array(RM, float32)
        # the first item's loads fly while the block builds its tables
        row_offsets(ro, min(g, uint32(groups - uint32(1))), n, kw)
        fetch(packed_u32, absmax_q, absmax2, nc, nq, na, ro, min(uint32(uint32(part << uint32(SSH - 3)) + lw), lwmax), ash)
        code2_s = cuda.shared.array(256, float32)
        red = cuda.shared.array(NRED, float32)
        if tid < uint32(256):
            code2_s[tid] = code2[tid]
        tab = cuda.shared.array(TAB, uint64)   # entry (byte << 4) | copy: lut[byte >> 4] low, lut[byte & 15] high
        for j in range(TAB // THREADS):
            i = uint32(tid + uint32(j * THREADS))
            tab[i] = (uint64(ops.float_bits(lut[i >> uint32(8)]))
                      | (uint64(ops.float_bits(lut[(i >> uint32(4)) & uint32(15)])) << uint64(32)))
        lane8 = (tid & uint32(15)) << uint32(3)
        cuda.syncthreads()
        parity = uint32(0)
        while g < groups:                      # this team's row groups: g, g + nteams, ...
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
                s1 = uint32(s + uint32(S))     # the next item's loads: (g, s + S), or the next group's first
                last = s1 >= steps
                for r in range(R):
                    rs[r] = rn[r] if last else ro[r]
                nxt = uint32((part if last else s1) << uint32(SSH - 3))
                fetch(packed_u32, absmax_q, absmax2, nc, nq, na, rs, min(uint32(nxt + lw), lwmax), ash)
                col = uint32(uint32(s << uint32(SSH)) + lane * uint32(32))
                if col < k:                    # p[r, m] = sum over the lane's 32 columns of lut[q] * x[m]
                    for i in range(RM):
                        p[i] = float32(0.0)
                    xi = uint64(col >> uint32(1))
                    for w in range(4):
                        for r in range(R):
                            lut8(tab, lane8, cc[4 * r + w], L, 8 * r)
                        for mm in range(M):
                            xv = load_x8(x_u32, xi + uint64(uint32(mm) * kx) + uint64(4 * w), is_bf16)
                            for r in range(R):
                                p[r * M + mm] = dot8(L, 8 * r, xv, p[r * M + mm])
                    for r in range(R):         # the block scale, once per 32 columns
                        sc = ops.fadd_rn(ops.fmul_rn(code2_s[cq[r]], ca[r]), offset)
                        for mm in range(M):
                            acc[r * M + mm] += sc * p[r * M + mm]
                s = s1
            if S == 1:                         # the group's sums: over 32 lanes, then over the team's S warps
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

# %% [markdown]
# The launcher: validate (a misaligned 128-bit load kills the context), compile once per Design, size the
# grid (`grid_size`: fewest rounds of resident teams). `nf4lab.gemv.launch` ships the same kernel (tests compare
# PTX) where the GPU has no bf16 `mma.sync` (a T4) or under `NF4LAB_ARCH=sm_75`; on sm_80+ it ships a tensor-core
# design that feeds the table's values to `mma.sync` (`nf4lab.kernels.gemv_tc`, measured in `lab/README.md`).

# %%
KERNELS = {}


def launch(g, design=None, reduce=warp_sum):
    gemv.validate(g)
    d = design or auto_design(g.N, g.M)
    if d.m != g.M:
        d = Design(rows=d.rows, split=d.split, m=g.M, min_blocks=d.min_blocks)
    key = (d, g.dtype, reduce)
    if key not in KERNELS:
        KERNELS[key] = make_gemv(g.dtype == "bf16", d, reduce)
    KERNELS[key][g.grid or grid_size(d, g.N), 256, g.stream](
        g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)

# %% [markdown]
# <a id="evidence"></a>
# ## 3. PTX and SASS evidence
#
# PTX of the design `auto_design` picks at N = 4096 (R4 S2 B3 with 132 SMs): launch bounds, 2R streaming code loads
# (`fetch` is inlined twice), 4 x loads, R x 16 pair reads, 5 shuffles per row, split-K's named barrier; no local
# memory, float64, 64-bit division. SASS (sm_90, recorded offline by `lab/sass_gemv.py`): registers and spills.

# %%
D = auto_design(4096)
ptx = gemv.kernel_ptx(make_gemv(True, D))
nf4lab.ptx.show(ptx, [r"^ld\.global\.nc\.L1::no_allocate\.v4", r"^ld\.shared\.v2", r"^bar\.sync"], limit=3)
nf4lab.ptx.check(ptx, present=[r"^ld\.global\.nc\.L1::no_allocate\.v4\.u32", r"^ld\.global\.v4\.u32",
                               r"^shfl\.sync\.down", r"^ld\.shared\.v2\.f32", r"^bar\.sync"],
                 absent=[r"^ld\.local", r"^st\.local", r"\.f64", r"^(div|rem)\.(s|u)64"])
counts = {what: nf4lab.ptx.count(ptx, pat) for what, pat in [
    ("code loads", r"^ld\.global\.nc\.L1::no_allocate\.v4"), ("x loads", r"^ld\.global\.v4"),
    ("pair reads", r"^ld\.shared\.v2\.f32"), ("shuffles", r"^shfl\.sync\.down")]}
print(D.name, counts)
assert counts == {"code loads": 2 * D.rows, "x loads": 4, "pair reads": 16 * D.rows, "shuffles": 5 * D.rows}
assert ".maxntid 256, 1, 1" in ptx and f".minnctapersm {D.min_blocks}" in ptx
sass = json.loads((results.ROOT / "data" / "sass" / "09_fused_gemv.json").read_text())
print(f"\nSASS recorded offline ({sass['meta']['date']}, {sass['meta']['ptxas']}, {sass['meta']['arch']}):")
for d in [auto_design(4096), auto_design(8192), auto_design(14336)] + [auto_design(8192, m) for m in (2, 4, 8)]:
    r = next(r for r in sass["rows"] if r["variant"] in (d.name, d.name.replace(f" M{d.m}", "")) and r["dtype"] == "bf16"
             and r.get("m", 1) == d.m)
    print(f"  {d.name:<22} {r['registers']:>4} registers, {r['spill_bytes'] or 0:>4} bytes spilled, "
          f"{r['warps_per_sm']} warps/SM, {r['per_weight']:.2f} SASS instructions per weight")
    assert r["registers"] <= 65536 // (256 * d.min_blocks)   # the launch bounds held

# %% [markdown]
# The batch designs (M = 4 and up) do have `ld.local`, and ptxas spills where R x M sums exceed the register
# cap (R8; M >= 4, table above): the lab kept them, as they timed faster on the H100 than the alternatives.
#
# <a id="correctness"></a>
# ## 4. Correctness: a tolerance, not bits
#
# Each kernel sums in its own order: none is bit-exact with another, none is wrong. We compare with float64
# `y64 = x @ W.T`, allowing any float32 summation's error (Higham §3.1) `K * eps32 * sum|x w|` plus the output
# rounding `u_out * |y|`. Odd N, K not a multiple of 1024, two absmax2 groups, both dtypes, split-K and plain
# designs, a batch; bitsandbytes' own error on each case beside ours.

# %%
SHAPES = [((24, 192), "bf16", 1, Design(rows=4, min_blocks=2)), ((53, 320), "fp16", 1, None),
          ((7, 2112), "bf16", 1, None), ((9, 192), "fp16", 3, None)] if nf4lab.SIMULATOR else \
         [((512, 4096), "bf16", 1, None), ((255, 14336), "bf16", 1, None), ((100, 4160), "fp16", 4, None)]
for (N, K), dtype, M, design in SHAPES:
    gc = gemv.make_gemv_case(N, K, dtype, M=M)
    g = gemv.make_gemv_buffers(gc)
    launch(g, design)
    ours = gemv.check(g.result(), gc, name=f"ours {N}x{K} {dtype} M={M} [{(design or auto_design(N, M)).name}]")
    theirs = gemv.compare(gemv.bnb_output(gc, "cuda" if nf4lab.ON_GPU else "cpu"), gc, name="bitsandbytes")
    print(f"{ours.name}: worst error/tolerance {ours.worst_ratio:.2f}; bitsandbytes {theirs.worst_ratio:.2f} "
          f"({'within' if theirs.ok else 'OUTSIDE'} the float32 tolerance)")

# %% [markdown]
# bitsandbytes rounds weights to 16 bits first, an error the bound does not budget (ratios above). Planted bugs:

# %%
absmax = reference.block_absmax(gc.absmax_q, gc.absmax2, gc.code2, gc.offset)
codes = reference.unpack_codes(gc.packed, gc.N * gc.K)
bugs = {"nibbles swapped": gc.x @ (gc.lut[codes.reshape(-1, 2)[:, ::-1].reshape(-1)] * np.repeat(absmax, 64)).reshape(gc.N, gc.K).T,
        "offset forgotten": gc.x @ (gc.lut[codes] * np.repeat(absmax - gc.offset, 64)).reshape(gc.N, gc.K).T,
        "one lane's 32 columns lost": gc.x[:, 32:] @ gc.w[:, 32:].T}
for name, y_bug in bugs.items():
    rep = gemv.compare(y_bug.astype(np.float32), gc, name=name)
    print(f"{name}: worst error/tolerance {rep.worst_ratio:.0f} -> {'caught' if not rep.ok else 'MISSED'}")
    assert not rep.ok

# %% [markdown]
# <a id="benchmark"></a>
# ## 5. Benchmark: against bitsandbytes and the read bound
#
# One run, same weights: bitsandbytes `matmul_4bit` (`gemv_4bit` at M = 1), `dequantize_4bit` + `torch.matmul`,
# ours; 4 LLM shapes, bf16/fp16, the copy ceiling; CUDA-graph GPU time, weights cycled over > 4x L2 (from
# DRAM, as in decoding); GB/s = weight bytes / time. The *read bound* (`lab/gemv_read_bound.py`) only reads.
# On a GPU a progress line per (shape, dtype) gives the wall-clock seconds that step took: not a kernel time.

# %%
if nf4lab.ON_GPU:
    run = gemv.benchmark({"auto": launch})
    print(f"saved {run.save(gemv.NAME + '_notebook').relative_to(results.ROOT)}")
else:
    run = RECORDED
    print("No GPU here: the run recorded in " + (f"{run.path}" if run else "(none: run lab/bench_gemv.py on a GPU)"))
if run is not None:
    print(f"({results.label(run.meta)}; read bound: {results.label(BOUND.meta) if BOUND else 'not recorded'})\n")
    print(gemv.summary(run, BOUND))
    ours = [r for r in run.records if r["name"] == gemv.default_kernel(run) and r.get("M", 1) == 1]
    print(f"\nfaster than bitsandbytes gemv_4bit at {sum(r['speedup_vs_bnb'] > 1 for r in ours)} of {len(ours)} "
          f"(shape, dtype); x bitsandbytes from {min(r['speedup_vs_bnb'] for r in ours):.2f} "
          f"to {max(r['speedup_vs_bnb'] for r in ours):.2f}")
    gemv.plot(run)

# %% [markdown]
# `% of read` (- without a recorded read bound) says how much of the gap any GEMV could still close at a shape.
#
# <a id="batch"></a>
# ## 6. Batch: up to 8 rows of x
#
# `Design(m=M)` reads each code and table pair once and does M FMAs with it: same bytes, M-fold arithmetic.
# bitsandbytes' `matmul_4bit` runs its `gemm_4bit` op for M > 1, which picks per GPU and shape between its
# fused kernel and `dequantize_4bit` + `F.linear`. Section 4 checked a batch (M = 4 on a GPU,
# M = 3 in the simulator); recorded:

# %%
run_b = bench.Run.load(gemv.NAME_BATCH)
if run_b is None:
    print("No batch results recorded (lab/bench_gemv.py on a GPU records them).")
else:
    print(f"{run_b.path} ({results.label(run_b.meta)}):\n")
    print(gemv.summary(run_b))
    gemv.plot(run_b, batch=True)

# %% [markdown]
# <a id="road"></a>
# ## 7. The road here: what lost, and why
#
# The lab (`lab/`) timed a family of designs in one run; each variant's speed relative to the default (bf16, M = 1):

# %%
ROAD = {
    "v1": "first version: 4 rows x 64 columns per lane, ~170 registers, 8 warps per SM",
    "auto (R2, before)": "first streaming default: 2 rows per item, 64 registers, 32 warps per SM",
    "R4 S1 C32 W8 B3": "4 rows, no split-K: too few row groups at N = 4096",
    "R4 S2 C32 W8 B3 PRMT": "byte-permute table (64 KB): fewer instructions, same data-pipe traffic",
    "R4 S2 C32 W8 B3 X2": "NF4 values from warp shuffles: same pipe as the table, more instructions",
    "R4 S2 C32 W8 B3 Q16": "absmax code table in 16 copies: fewer bank conflicts, more spills",
    "R4 S2 C32 W8 B3 H16": "table of fp16 pairs: half the table traffic, NOT exact (values rounded)",
}
if RECORDED is not None:
    shapes = [(4096, 4096), (4096, 14336), (8192, 28672)]
    auto = {s: gemv.find_record(RECORDED, gemv.default_kernel(RECORDED), s, "bf16") for s in shapes}
    print(f"{'variant':<26}" + "".join(f" {'x'.join(map(str, s)):>11}" for s in shapes) + "  what it tried")
    for v, why in ROAD.items():
        cells = [gemv.find_record(RECORDED, gemv.kernel_name(v), s, "bf16") for s in shapes]
        print(f"{v:<26}" + "".join(f" {auto[s]['ms'] / c['ms']:>10.2f}x" if c and auto[s] else f" {'-':>11}"
                                    for s, c in zip(shapes, cells)) + f"  {why}")
    print(f"(speed relative to the default; {results.label(RECORDED.meta)})")
else:
    print("No lab run recorded for this GPU (lab/bench_gemv.py on a GPU records one).")

# %% [markdown]
# The lab's Nsight Compute profiles (`lab/profile_gemv.py`, on the H100): the SM's load/store data pipe,
# which every table read passes, was busier than DRAM; an exact float32 table costs one wavefront per 32 weights.
#
# <a id="reading"></a>
# ## 8. Reading: Marlin and FLUTE
#
# - **Marlin** (arXiv 2408.11743, github.com/IST-DASLab/marlin): memory-bound to batch 16-32 with tensor cores
#   on offline-reshuffled weights, `lop3` dequantization, `cp.async` pipelines, global split-K reduction.
# - **FLUTE** (arXiv 2407.10960): lookup-table formats like NF4, the table vectorized and duplicated in shared
#   memory against bank conflicts (our 16 copies).
#
# <a id="exercise"></a>
# ## 9. Exercise: the reduction is wrong
#
# Our GEMV with a different warp reduction gives outputs far off. Fix `warp_sum_ex` so that lane 0 ends up
# with the sum of all 32 lanes (about 2 lines); the grader checks a small case against section 4's bound.
# **Hint.** `shfl_down_sync(mask, v, d)` gives lane i the value of lane i + d; d = 16 folds 32 lanes onto
# 16. How many folds until lane 0 has seen all 32?

# %%
@cuda.jit(device=True, inline="always")
def warp_sum_ex(v):
    ### BEGIN SOLUTION
    for offset in (16, 8, 4, 2, 1):
        v += shfl_down_sync(0xFFFFFFFF, v, offset)
    ### STUDENT
    # TODO: after these steps lane 0 holds the sum of only some lanes (about 2 lines missing)
    v += shfl_down_sync(0xFFFFFFFF, v, 16)
    v += shfl_down_sync(0xFFFFFFFF, v, 8)
    v += shfl_down_sync(0xFFFFFFFF, v, 4)
    ### END SOLUTION
    return v


result = gemv.check_exercise(lambda g: launch(g, Design(rows=4, min_blocks=2), reduce=warp_sum_ex))
### BEGIN SOLUTION
assert result
### END SOLUTION
