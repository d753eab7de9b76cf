# Capstone: a tensor-core NF4 GEMV for decoding (percent-format source of notebooks/09_fused_gemv.ipynb)
# %% [markdown]
# # 09 · Capstone: fuse NF4 dequantization into a tensor-core GEMV
#
# **Goal.** Generating a token multiplies each layer's weight by a few rows of activations: `y = x @ W.T`, `x` (M, K), M = 1..8 (a GEMV: matrix times
# vector), `W` (N, K) in NF4. We rebuild, cell by cell, the kernel `nf4lab` ships (`nf4lab.kernels.gemv`; `tests/test_nb09.py` checks at M = 1 and 8 that both compile to the same PTX, names, comments and the operand order of `min.u32` aside) and time the notebook's copy: each packed byte read once, made two bf16/fp16 weights by one
# shared-memory load, multiplied on the tensor cores (the SM's matrix-multiply units, driven by `mma` instructions) by `mma.sync` (a warp-wide matrix multiply-add; a T4's bf16 path: section 5); we check it against float64 and time it against
# bitsandbytes and a kernel that only reads the weight (the read bound). **You will learn** how `mma.sync.m16n8k16` spreads its operands over a warp,
# how to feed it from a lookup table, how warps of a block share a row's K (here split-K within a block: a block's warps each take part of K; CUTLASS's "Efficient GEMM in CUDA", "Parallelized Reductions", calls this sliced-K and keeps split-K for splitting K across blocks), and why the read bound is the target.
#
# **Contents:** 1. [Bytes: a prediction](#bytes) · 2. [The mma and its fragments](#mma) · 3. [Tiles, steps, split-K](#work) ·
# 4. [The kernel](#kernel) · 5. [PTX evidence](#evidence) · 6. [Check: a tolerance, not bits](#check) · 7. [Benchmark](#benchmark) ·
# 8. [Batch: M = 2, 4, 8](#batch) · 9. [What we learned](#learned) · 10. [Exercise: one mma by hand](#exercise) · [Appendix](#road)
# %%
import nf4lab  # first: may switch numba to its simulator
import functools, itertools, numpy as np  # noqa: E401
import matplotlib.pyplot as plt
from numba import cuda, float32, uint32, uint64
from nf4lab import arch
from nf4lab.device.warp_ops import load_stream_u32x4, mma_bf16   # (the kernel cells import theirs: they run alone too)
from nf4lab.harness import gemv_check
from nf4lab.kernels import gemv
from nf4lab.measure import bench, gemv_bench, provenance, ptx, results
print(nf4lab.describe())   # the simulator runs the kernel too: mma, byte permute (prmt) and lookups have Python twins
RUN = bench.Run.load(gemv.NAME + "_notebook")   # this notebook's last GPU run (section 7 measures a new one on a GPU)
# %% [markdown]
# <a id="bytes"></a>
# ## 1. Bytes: a prediction
# A weight serves 2 flops per row of x and is read once: at M = 1 a GEMV is limited by how fast the weight is read,
# if the instructions keep up. Dequantize-then-multiply reads 0.5 byte a weight, writes 2 and reads them again; the
# fused kernel reads the 0.5 byte and the statistics (absmax codes, absmax2, code2). **Prediction:** at the copy
# speed (notebook 00's device copy, in the run named below) the fused kernel would need about:
# %%
copy = (CEIL := bench.Run.load("00_ceiling")) and CEIL.get(bench.COPY, dtype="bf16")   # no cell here replaces 00's record
print(f"{'W (N x K)':>12} {'fused reads':>12} {'dequant + matmul':>17} {'ratio':>6} {'us at copy speed':>17}")
for N, K in gemv.LLM_SHAPES:
    f, u = gemv_bench.weight_bytes(N, K), gemv_bench.unfused_bytes(N, K)
    print(f"{N:>5} x {K:<5} {f / 1e6:>9.1f} MB {u / 1e6:>14.1f} MB {u / f:>6.1f} {f / copy['gbps'] / 1e3 if copy else float('nan'):>17.1f}")
print(f"(copy speed {copy['gbps']:.0f} GB/s: notebook 00's run, {results.label(CEIL.meta)}; section 7 measures its own)"
      if copy else "(no run of notebook 00 recorded: no copy speed)")
# %% [markdown]
# <a id="mma"></a>
# ## 2. The mma and its fragments
# `mma.sync.m16n8k16` is one warp's instruction: D (16 x 8) = A (16 x 16) B (16 x 8) + C, A and B in bf16 (or fp16),
# C and D in float32. Each lane holds a **fragment** of each, a few 32-bit registers. Lane l is (g, q) = (l >> 2,
# l & 3) (PTX's groupID and threadID_in_group): its A registers a0, a1 hold rows g, g + 8 at columns 2q, 2q + 1, and a2, a3 the same rows at 2q + 8, 2q + 9
# (two bf16 values a register); b0 holds B's rows 2q, 2q + 1 and b1 rows 2q + 8, 2q + 9 of column g; c0-c3 C's rows
# g, g + 8 at columns 2q, 2q + 1 (float32). (PTX ISA, "Matrix Fragments for mma.m16n8k16", whose a0-a7 name values.)
#
# Our A is a **tile**, 16 consecutive rows of W. A sum does not care which W columns are called k, so lane q's k are
# columns it reads cheaply: at M = 1, its bytes lie in absmax **block** q (64 columns, one scale) of each 256 columns.
# Blocks are scaled before they are added, so B keeps them apart: its column b is nonzero only in the k of lanes q = b, and C's
# column b is block b's sum. In the figure, a **step** is one warp's loop trip, a tile's 16 rows x 256 columns (2 KB of
# codes); **mma i** (0-7) takes bytes 2i, 2i + 1 of each **piece** h = 0, 1 a lane loads (16 bytes: 32 codes of a row).
# %%
def panel(ax, title, rows, cols, who, colour, xlabels, xlabel, ylabel):   # who: (lane, register); colour: block or -1
    ax.imshow(np.ma.masked_less([[colour(r, c) for c in range(cols)] for r in range(rows)], 0), cmap="Pastel1",
              vmin=0, vmax=8, aspect="auto")
    ax.set_facecolor("0.85")
    for r, c in itertools.product(range(rows), range(cols)):
        ax.text(c, r, "{}\n{}".format(*who(r, c)), ha="center", va="center", fontsize=6.5)
    ax.set_xticks(range(cols), xlabels, fontsize=7, rotation=90)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
lane_q = lambda k: (k % 8) // 2            # k = 2q, 2q + 1, 2q + 8, 2q + 9 belong to lane q  # noqa: E731
col = lambda k: 64 * lane_q(k) + k % 2 + 2 * (k >= 8)   # the W column (in the step) of A's column k  # noqa: E731
ns, tile = [f"n{n}: block {n}" if n < 4 else f"n{n}: 0" for n in range(8)], "row of the 16-row tile"
fig, axes = plt.subplots(1, 3, figsize=(16, 6.4), gridspec_kw={"width_ratios": [16, 8, 8]}, layout="constrained")
panel(axes[0], "A: 16 rows of W; a0/a2: row g, a1/a3: row g + 8", 16, 16,
      lambda r, k: (4 * (r % 8) + lane_q(k), f"a{int(r >= 8) + 2 * int(k >= 8)}"), lambda r, k: lane_q(k),
      [f"k{k}: w{col(k)}" for k in range(16)], "k (A column): the W column it holds, 64 q + 32 h + 4 i + j (piece h = 0, mma i = 0; j = 0..3: the lane's 4 columns)", tile)
panel(axes[1], "B: x; column n = block n (M = 1)", 16, 8, lambda k, n: (4 * n + lane_q(k), f"b{int(k >= 8)}"),
      lambda k, n: n if n == lane_q(k) and n < 4 else -1, ns, "B column n", "k: x at the same W column as A's k")
panel(axes[2], "C: float32 sums; column n: block n", 16, 8, lambda r, n: (4 * (r % 8) + n // 2, f"c{n % 2 + 2 * int(r >= 8)}"),
      lambda r, n: n if n < 4 else -1, ns, "C column n", tile)
_ = fig.suptitle("mma.sync.m16n8k16 in this kernel: mma i = 0 of a step at M = 1. Number: the lane holding the cell; a/b/c: "
             "its register.\nColour: the block q of the step (W columns 64q..64q+63) whose codes or x (A, B) or whose sums (C) it holds; grey: zero.", fontsize=9)
# %% [markdown]
# Lane 5 is (g, q) = (1, 1); its a0 holds row 1, W columns 64, 65 of the step: one packed byte's two codes; a2 holds
# columns 66, 67, the next byte. Only lanes with g = q (0, 5, 10, 15) hold x. C's columns 4-7 are zero at M = 1 and hold batch row 1 at M = 2;
# past M = 2, B needs more columns than one mma's 8: the kernel runs (M + 1) // 2 **n-tiles**, each one mma's N = 8 columns of B and C (2 batch rows x 4 blocks), on the same A fragments; in n-tile nt, B's column 4 m + b is batch row 2 nt + m, block b.
#
# <a id="work"></a>
# ## 3. Tiles, steps, split-K: who does what
# - Lane (g, q) loads a step's 2 pieces of row g and 2 of row g + 8 (M = 1: columns 64q..64q + 63; M > 1: 32 columns at 128 h + 32 q of piece h, block 2 h + q // 2).
# - **Split-K**: the 8 warps of a thread block (CUDA's block, not an absmax block) share a tile's K columns: warp w
#   takes steps w, w + 8, ... and keeps its own float32 sums of the 16 rows; at the tile's end the sums meet in shared memory.
#   At M = 1, where tiles outnumber blocks (e.g. 14336 rows: 896 tiles; section 7 prints the blocks), `gemv.warps_a_tile` may form
#   **warp groups** (not the lane's g) of G = 2 or 4 warps that take a tile each, at a barrier of their own (`bar.sync id, 32 G`): it picks the G whose
#   rounds (a round: every group of the grid, the blocks launched, takes one tile), a warp's K / G columns a tile, take least time, the fewest warps on a tie (fewer sums to add); M > 1 keeps 8.
# - **Persistent blocks**: at most 2 per SM (`gemv.grid_size`); block t takes tiles t, t + grid, ... (with WARPS = 8 warps a block,
#   its warp group j of WARPS // G takes tiles (WARPS // G) t + j, then every (WARPS // G) grid further): one lookup table
#   (section 4) a block. **Steps in flight**: a warp issues its next step's loads before it computes the current one.
#
# <a id="kernel"></a>
# ## 4. The kernel
# **The per-lane table.** Entry e (a code byte) is (lut[e >> 4], lut[e & 15]) (lut: the 16 NF4 values, notebook 05) as bf16x2 (or f16x2), the high nibble (the first column) in the low
# half: an A register. Reads of different words of one shared-memory **bank** are serialized (32 banks, successive 32-bit words in successive banks:
# bank = word mod 32; CUDA C++ Programming Guide, "Shared Memory"), so each lane has its own copy: lane l's entry e is word `(e << 6) | l`, bank l.
# 256 rows of 64 words, 64 KB; words 32-63 are spare: code2 (rows 0-7), x slots (rows 16-47: defined with the step below), sums (rows 128-255). Each
# block builds it once, with 16-byte stores of 4 lanes' copies (lab/README.md times it against the 4-byte stores before: H200, 2026-11-29 03:57 UTC).
#
# **`prmt` makes the table address.** `prmt.b32 d, a, b, sel`: d's byte j is byte `(sel >> 4j) & 7` of the 8 bytes
# b:a (bytes 0-3 are a's). With a = the code word, b = `lane << 2`, sel = `0x5504 | p << 4`, the **selectors** are:
# byte 0 = 4 (b's byte 0: the lane's offset), byte 1 = p (a's byte p: the code byte e), bytes 2, 3 = 5 (zero). So
# d = `e << 8 | lane << 2`, the byte offset of word `(e << 6) | l`, in one instruction. Dynamic shared memory starts
# at a `base` (`probe_base()` asks the GPU once) that rides in the load's immediate (a constant offset encoded in the instruction itself), `ld.shared.u32 d, [off + base]`.
# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
import functools
from numba import cuda, float32, uint32, uint64
from nf4lab.device import ops
from nf4lab.device.warp_ops import (bar_sync, f32_from_bits, mma_bf16, mma_f16, prmt, shfl_idx, shfl_xor_sync,  # one
                                    syncwarp, table_lookup, table_vec4, x_slot_ops)   # instruction each, with a Python twin
from nf4lab.kernels import gemv
THREADS, WARPS, BLOCKS_PER_SM = 256, 8, 2   # 8 warps a block; launch bounds: ptxas (the assembler from PTX to SASS, the GPU's own instructions: section 5) caps registers so that 2 blocks fit an SM

def make_build_table(half_bits, store4):
    @cuda.jit(device=True, inline="always")
    def build_table(sm, lut, code2, tid):
        sm[tid + (tid & uint32(0xE0)) + uint32(32)] = ops.float_bits(code2[tid])   # code2[c]: word 32 + (c & 31) of row c >> 5
        # 256 entries x 32 lanes (the used half of each row): a 16-byte store holds 4 lanes' copies of entry e = p >> 3,
        # p = tid + 256 j; its halves lut[e >> 4] and lut[e & 15] come from lut itself, so no barrier comes first
        hi = half_bits(lut[(tid >> uint32(3)) & uint32(15)]) << uint32(16)
        for j in range(32 * 256 // (4 * THREADS)):
            p, v = uint32(tid + uint32(THREADS * j)), half_bits(lut[(tid >> uint32(7)) + uint32(2 * j)]) | hi
            store4(sm, ((p >> uint32(3)) << uint32(8)) | ((p & uint32(7)) << uint32(4)), v, v, v, v)   # word (e << 6) | 4 (p & 7)
        cuda.syncthreads()
    return build_table

def make_a_fragments(look):
    @cuda.jit(device=True, inline="always")
    def a_fragments(A, buf, h, sm, lane4):  # piece h's code words: buf[4h..] (row g), buf[8 + 4h..] (row g + 8)
        for i in range(8):                  # mma i: bytes 2i (a0, a1) and 2i + 1 (a2, a3) of the pieces
            wa, wb = buf[4 * h + (i >> 1)], buf[8 + 4 * h + (i >> 1)]
            sel0, sel1 = uint32(0x5504 | ((2 * (i & 1)) << 4)), uint32(0x5504 | ((2 * (i & 1) + 1) << 4))
            A[4 * i] = look(sm, prmt(wa, lane4, sel0))
            A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
            A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
            A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
    return a_fragments
# %% [markdown]
# **A step.** Per piece: the A fragments of 8 mmas, then B and the mmas, n-tile by n-tile. At M = 1 B comes from the
# **x slot**: with the next step's weights each lane loads 16 of that step's 512 bytes of x and, after the current step,
# stores them in its warp's slot of spare table words (`x_put`); lanes g = q read their block's 64 bytes a piece
# (`x_get`), the others keep zeros; `slot_at` gives a lane both addresses once. At M > 1 x comes from global memory (L1/L2) at each step. Then the
# scales. A step's loads end with one **statistics word** a lane: lanes 0-15 load the step's 4 absmax codes (a byte a
# block) of row `lane`, lanes 16-31 its absmax2 (float32, one per 256 blocks); 4 shuffles (`shfl_idx`: another lane's
# register) bring lane (g, q) those of rows g, g + 8. Its C columns 2q, 2q + 1 (batch row 2 nt + q // 2, blocks
# 2(q & 1) and 2(q & 1) + 1) get bitsandbytes' scale, `code2[code] * absmax2 + offset` rounded twice (`fmul_rn`, `fadd_rn`).
# %% tags=["kernel"]
def make_step(M, is_bf16, look, x_get):
    NT, WIDE = (M + 1) // 2, M > 1          # n-tiles of 8 columns: 2 batch rows x 4 blocks each
    mma, a_fragments = mma_bf16 if is_bf16 else mma_f16, make_a_fragments(look)
    @cuda.jit(device=True, inline="always")
    def step(acc, cf, s, A, xr, buf, sm, x_u32, offset, c, g, q, k, kx, lane4, xa):
        for i in range(4 * NT):
            cf[i] = float32(0.0)
        xcol = uint32(c * uint32(256) + uint32(64) * q)   # lane q's 64 columns: block q of the step
        for h in range(2):
            if WIDE:                        # M > 1: piece h is 32 columns at 128 h + 32 q, block 2 h + q // 2
                xcol = uint32(c * uint32(256) + uint32(128 * h) + uint32(32) * q)
                blk = uint32(2 * h) + (q >> uint32(1))
            else:
                blk = q
            a_fragments(A, buf, h, sm, lane4)
            for nt in range(NT):
                m = uint32(2 * nt) + (g >> uint32(2))     # B column g = 4 mm + b: batch row 2 nt + mm, block b
                if M == 1:
                    if g == q:
                        x_get(xr, sm, xa, h)
                elif (blk if WIDE else q) == (g & uint32(3)) and m < uint32(M) and xcol < k:
                    xi = uint64(m * kx + (xcol >> uint32(1)) + uint32(0 if WIDE else 16 * h))
                    for j in range(4):
                        xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = ops.load_u32x4(x_u32, xi + uint64(4 * j))
                else:
                    for j in range(16):
                        xr[j] = uint32(0)
                for i in range(8):
                    cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3] = mma(
                        A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3], xr[2 * i], xr[2 * i + 1],
                        cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3])
        raw = buf[16]                          # this lane's statistics word; the shuffles fetch rows g, g + 8's
        wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
        ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
        sh = uint32(16) * (q & uint32(1))
        if (q >> uint32(1)) < uint32(M):
            for i in range(4):
                code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                s[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code + (code & uint32(0xE0)) + uint32(32)]),
                                               f32_from_bits(ag if i < 2 else ag8)), offset)
            for nt in range(NT):
                acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
    return step
# %% [markdown]
# **The kernel.** A lane's loads of a step (4 x 16 bytes of codes, the statistics word: 17 words) are imported: `fetch` (`gemv.step_ops`) does section
# 3's loads, clamped at the last row and step; at M = 1 `fetch1` also loads x, and `rows` puts a tile's row offsets in `rb`, every step, by `min`
# (a clamp, not a branch; the wrap from one tile to the next is a conditional expression, emitted as `selp`: section 5 counts both; timed against a branch in another run: lab/README.md, "No branch in the M = 1 step loop"). The first step's loads go out before the table is built; each trip
# fetches the next step, across tiles too. Local arrays indexed by unrolled loops live in registers (up to the register cap: section 5 prints the spills, values ptxas moves from registers to per-thread local memory). **The tile's sum:** lanes q and q ^ 1 hold a
# batch row's blocks 0-1 and 2-3 (a `shfl.xor` adds them); each warp writes its 16 M sums to spare words (`gemv.spare`), and after a barrier 16 M
# threads add the G warps' and write y (`parity`: two sets of words, so that the next tile's sums cannot overwrite words still being read, with no
# second barrier). The launcher validates (a misaligned 128-bit load is fatal: CUDA Runtime API, `cudaErrorMisalignedAddress`) and allows 64 KB
# (`gemv.prepare`).
# %%
import inspect   # M = 1's loads as the kernel imports them; put: a 16-byte load kept out of L1 (read once)
print(inspect.getsource(gemv.step1_ops))
# %% tags=["kernel"]
@functools.cache
def make_kernel(is_bf16, M, base, full=False, G=WARPS):   # full: every warp has a step (gemv.full_apply); G: warps a tile
    NT = (M + 1) // 2
    NACC, NCF, FB, NB = 2 * NT, 4 * NT, 17, 34   # per step in buf: 16 code words, 1 statistics word; 2 steps
    _, half_bits, fetch = gemv.step_ops(is_bf16, M, base, True, True)   # the shipped loads (see above)
    rows, fetch1 = gemv.step1_ops()                                     # M = 1's; rows every step, by `min`
    look, (slot_at, _, x_put, x_get) = table_lookup(base), x_slot_ops(base)
    build_table, step = make_build_table(half_bits, table_vec4(base)[1]), make_step(M, is_bf16, look, x_get)
    @cuda.jit(launch_bounds=(THREADS, BLOCKS_PER_SM))
    def gemv_tc(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm, tid = cuda.shared.array(0, uint32), uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw, kx = k >> uint32(3), k >> uint32(1)
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        ash, grid = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x) * uint32(WARPS // G)   # tiles at once
        buf = cuda.local.array(NB, uint32)          # this step's loads and the next one's
        t, c = uint32(cuda.blockIdx.x), warp       # split-K: warp w starts at step w of the block's first tile
        if G < WARPS:                                  # WARPS // G groups of G warps, a tile each: warp w at step w % G
            t, c = t * uint32(WARPS // G) + warp // uint32(G), warp % uint32(G)
        c0, tp, cp = c, t, c                       # a warp's first step of every tile; the step whose loads go out next
        xq, rb, (xs, xa) = cuda.local.array(4, uint32), cuda.local.array(3, uint32), slot_at(warp, lane)   # M = 1
        if M == 1:
            rows(rb, tp, g, q, lane, n, kw, tiles)
        for d in range(1):   # one trip, shaped as the shipped kernel's prologue (LLVM schedules straight code otherwise)
            if M == 1:
                fetch1(buf, FB * (d + 1), xq, packed_u32, absmax_q, absmax2, x_u32, rb, cp, lane, steps)
            else:
                fetch(buf, FB * (d + 1), packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            cp = uint32(cp + uint32(G))
            if cp >= steps:
                cp, tp = c0, uint32(tp + grid)
                if M == 1:
                    rows(rb, tp, g, q, lane, n, kw, tiles)
        build_table(sm, lut, code2, tid)
        lane4, parity = lane << uint32(2), uint32(0)
        acc, cf, s = cuda.local.array(NACC, float32), cuda.local.array(NCF, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        if M == 1:                                 # lanes without x keep zeros; the first step's x into the slot
            for j in range(16):
                xr[j] = uint32(0)
            x_put(sm, xs, xq)
            syncwarp()
        while t < tiles:                           # persistent: tiles t, t + grid, ...
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:                            # steps c, c + G, ... of tile t
                for i in range(FB):
                    buf[i] = buf[i + FB]
                if M == 1:                         # the next step's x rides with its weights
                    fetch1(buf, FB, xq, packed_u32, absmax_q, absmax2, x_u32, rb, cp, lane, steps)
                else:
                    fetch(buf, FB, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                cn, tn = cp, tp                    # the step just fetched comes next (M > 1: counted apart)
                if M > 1:
                    cn, tn = uint32(c + uint32(G)), t
                    if cn >= steps:
                        cn, tn = c0, uint32(t + grid)
                cp = uint32(cp + uint32(G))
                if M == 1:                         # the wrap by a select, the rows by `min` (section 5 counts both)
                    wrap = cp >= steps
                    cp, tp = (c0 if wrap else cp), (uint32(tp + grid) if wrap else tp)
                    rows(rb, tp, g, q, lane, n, kw, tiles)
                elif cp >= steps:
                    cp, tp = c0, uint32(tp + grid)
                if (M == 1 and full) or (c0 if M == 1 else c) < steps:   # a warp's steps: c0, c0 + G, ...
                    step(acc, cf, s, A, xr, buf, sm, x_u32, offset, c, g, q, k, kx, lane4, xa)
                if M == 1:                         # into the slot once every lane has read this step's x
                    syncwarp()
                    x_put(sm, xs, xq)
                    syncwarp()
                c = cn
                if tn != t:
                    break
            sums0 = uint32(parity * uint32(WARPS * 16 * M) + warp * uint32(16 * M))   # this warp's first sum word (see above)
            for nt in range(NT):
                a0 = acc[2 * nt] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt], 1)
                a1 = acc[2 * nt + 1] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt + 1], 1)
                m = uint32(2 * nt) + (q >> uint32(1))
                if m < uint32(M) and (q & uint32(1)) == uint32(0):
                    sm[gemv.spare(sums0 + m * uint32(16) + g)] = ops.float_bits(a0)
                    sm[gemv.spare(sums0 + m * uint32(16) + g + uint32(8))] = ops.float_bits(a1)
            if G < WARPS:   # the group's own barrier (id 1 + group, 32 G threads); lt: a thread's index in its group
                bar_sync(uint32(1) + warp // uint32(G), uint32(32 * G))
            else:
                cuda.syncthreads()
            lt, gb = (tid & uint32(32 * G - 1), (warp - c0) * uint32(16 * M)) if G < WARPS else (tid, uint32(0))
            if lt < uint32(16 * M):                # 16 M threads of the group add its G warps' sums
                first, v = uint32(parity * uint32(WARPS * 16 * M) + gb + lt), float32(0.0)
                for w in range(G):
                    v += f32_from_bits(sm[gemv.spare(first + uint32(w * 16 * M))])
                row = uint32(t * uint32(16) + (lt & uint32(15)))
                if row < n:
                    y[uint32((lt >> uint32(4)) * n + row)] = half_bits(v)
            parity, t = parity ^ uint32(1), tn
    return gemv_tc

def launch(g):
    gemv.validate(g)
    if not gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)):
        return gemv.launch(g)              # no statistics word (see gemv.words_apply): the package's byte-wise loads
    grid = g.grid or gemv.grid_size(g.N)
    G = gemv.warps_a_tile(g.N, g.M, grid)   # WARPS, or fewer where the tiles outnumber the blocks (section 3)
    kern = make_kernel(g.dtype == "bf16", g.M, gemv.probe_base() if nf4lab.ON_GPU else 0, gemv.full_apply(True, g.M, g.K, G), G)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    gemv.prepare(kern, args, gemv.SMEM)[grid, THREADS, g.stream, gemv.SMEM](*args)
# %% [markdown]
# <a id="evidence"></a>
# ## 5. PTX evidence
# Per step at M = 1 (the kernel as `launch` runs 4096x4096: `full`, G = 8): 16 `mma.sync` (2 pieces x 8), 64 `prmt`, 64 lookups with the base in the immediate; the codes' 16-byte loads as
# `ld.global.nc.L1::no_allocate.v4` (`.nc`: through the read-only path; read once: kept out of L1, which holds x and the scales); no `ld.local` (the local arrays are in registers; ptxas's spills are printed below), no float64. Registers: the
# driver's build, or `ptxas` (the assembler from PTX to SASS, the GPU's own instructions). A T4 (sm_75) has no m16n8k16: fp16 runs each mma as two m16n8k8 (the K = 8 shape sm_75 has; PTX ISA,
# mma's "Matrix Shape" and target notes), bf16 on the FP32 units (`warp_ops._soft_mma`: by its source, 32 shuffles, 64 FMAs and their operand moves a lane in place of one mma); the cell checks the fp16 kernel there. In the first line it prints, the 4 `mul.rn.f32` are the blocks' scales (each followed in the PTX by an `add.rn.f32`, counted on the line that starts with the architecture), never fused; its `fma` are the float32 sums `cf * s[0] + cf * s[1]` of the tile's accumulation, which the compiler contracts (section 6's tolerance allows for it).
# %%
cc = nf4lab.runtime.target_cc(); T4 = cc < (8, 0)  # noqa: E702
kern = make_kernel(not T4, 1, base := gemv.probe_base() if nf4lab.ON_GPU else gemv.default_base(cc), True)   # full
code = ptx.compile_ptx(kern, gemv.signature(), cc=cc, launch_bounds=(THREADS, BLOCKS_PER_SM))
LOOKUP, MMA = r"^ld\.shared\.u32 %r\d+, \[%r\d+\+\d+\]", r"^mma\.sync\.aligned\." + (r"m16n8k8\.row\.col\.f32\.f16" if T4 else r"m16n8k16\.row\.col\.f32\.bf16")
ptx.show(code, [r"^prmt\.b32", LOOKUP, r"^mma\.sync"], limit=2)
ptx.check(code, present=[MMA, r"^prmt\.b32", LOOKUP], absent=[r"^ld\.local", r"^st\.local", r"\.f64"])
print(arch.name(cc), {w: ptx.count(code, p) for w, p in [("mma", r"^mma\.sync"), ("prmt", r"^prmt"), ("lookups", LOOKUP), ("selp", r"^selp"), ("min", r"^min\."), ("add.rn.f32", r"^add\.rn\.f32"),
                                                        ("16-byte loads kept out of L1 (4 a step, 2 call sites)", r"^ld\.global\.nc\.L1::no_allocate\.v4")]})
ptx_g2 = ptx.compile_ptx(make_kernel(not T4, 1, gemv.default_base(cc), True, 2), gemv.signature(), cc=cc)   # G = 2
print("barriers with a register id (bar.sync id, threads): G = 2: " + str(ptx.count(ptx_g2, r"^bar\.sync\s+%r")) + "; G = 8: " + str(ptx.count(code, r"^bar\.sync\s+%r")) + "; bar.sync 0 at G = 8: " + str(ptx.count(code, r"^bar\.sync\s+0")))
for M, k in ((M, kern if M == 1 else make_kernel(not T4, M, base)) for M in (1, 2, 4, 8)):   # as `launch` runs them (M > 1: not full, fetch's longer step loop); the driver's build, else ptxas -v.
    print(f"M = {M}:", ptx.resources(k, gemv.signature(), code if M == 1 else ptx.compile_ptx(k, gemv.signature(), cc=cc, launch_bounds=(THREADS, BLOCKS_PER_SM)), cc))
# %% [markdown]
# <a id="check"></a>
# ## 6. Check: a tolerance, not bits
# Each GEMV adds in its own order, so none agree bit for bit. We check a bound against the float64 `y64 = x @ W.T`: a float32 sum's error `K * eps32 *
# sum|x w|` (eps32 = 2^-23, twice float32's unit roundoff: Higham §3.1's bound, with room for the tensor core's own order and rounding of its sums),
# the output's rounding `u * |y|` (u = 2^-8 bf16, 2^-11 fp16), and `u * sum|x w|` as the table holds NF4 values *rounded* (`rounded_table=True`).
# bitsandbytes' error is beside (its own rounding and order of sums): either may have the larger worst error on a given case.
# %%
SHAPES = ([((20, 256), "bf16", 1), ((9, 256), "fp16", 3)] if nf4lab.SIMULATOR else
          [((512, 4096), "bf16", 1), ((255, 14336), "fp16", 1), ((100, 4352), "bf16", 4), ((64, 4096), "fp16", 8)])
for (N, K), dtype, M in SHAPES:
    gc = gemv_check.make_gemv_case(N, K, dtype, M=M)
    launch(g := gemv.make_gemv_buffers(gc))
    ours = gemv_check.check(g.result(), gc, name=f"ours {N}x{K} {dtype} M={M}", rounded_table=True)
    theirs = gemv_check.compare(gemv_check.bnb_output(gc, "cuda" if nf4lab.ON_GPU else "cpu"), gc, rounded_table=True)
    print(f"{ours}\n  bitsandbytes: worst error/tolerance {theirs.worst_ratio:.3g}: ours is "
          + ("no worse" if ours.worst_ratio <= theirs.worst_ratio else "worse on this case"))
# %% [markdown]
# <a id="benchmark"></a>
# ## 7. Benchmark: against bitsandbytes and the read bound
#
# One GPU run times, per shape and dtype, ours, bitsandbytes `matmul_4bit`, dequantize + matmul and the **read bound**, a kernel that
# only reads the weight's bytes (best of 4 grid sizes). GPU time of CUDA-graph replays, each launch on another copy of the weight (> 4x L2 in all:
# from DRAM, as in decoding); and once a 1 GiB copy, the copy ceiling (section 8's call times its own). x bnb = bnb's time / ours; % copy = our bandwidth / the copy's; % of read = the bound's time / ours. Without a GPU: this
# notebook's last GPU run. Its check leaves out section 6's table allowance, for ours and bitsandbytes alike: a stricter tolerance, so larger worst ratios.
# %%
@cuda.jit
def read_only(src, nvec, out):           # every 16 bytes of the weight once; the XOR keeps the loads alive
    i, acc = uint64(cuda.grid(1)), uint32(0)
    while i < nvec:
        a, b, c, d = load_stream_u32x4(src, i * uint64(4))
        acc ^= a ^ b ^ c ^ d
        i += uint64(cuda.gridsize(1))
    if acc == uint32(0x9E3779B9):
        out[0] = acc
def read_bound(N, K):                    # the fastest of 4 grid sizes, over copies of the weight's bytes (> 4x L2)
    nb, out = gemv_bench.weight_bytes(N, K), cuda.device_array(1, np.uint32)
    nvec, copies = -(-nb // 16), max(2, -(-4 * nf4lab.device_info()["l2_bytes"] // nb))
    bufs = itertools.cycle([cuda.device_array(4 * nvec, np.uint32) for _ in range(copies)])
    t = min((bench.gpu_time_ms(lambda s, b=b: read_only[b * gemv.sms(), 256, s](next(bufs), nvec, out),
                               launches=max(bench.LAUNCHES, copies)) for b in (2, 4, 8, 16)), key=lambda t: t["ms"])
    return bench._record("bound", "read-only stream of the weight bytes", (N, K), "bf16", t, nb, copies=copies, M=1)
if nf4lab.ON_GPU:   # a progress line per (shape, dtype): wall-clock seconds of that step, not a kernel time
    RUN = gemv_bench.benchmark({"notebook 09": launch})
    RUN.add([read_bound(N, K) for N, K in gemv.LLM_SHAPES])
    print(f"saved {RUN.save(gemv.NAME + '_notebook').relative_to(results.ROOT)}")
if RUN is not None:
    print(f"(blocks, warps a tile) at M = 1 on {gemv.sms()} SMs{'' if nf4lab.ON_GPU else ' (the simulator plans for an H100)'}:", {f"{N}x{K}": (gemv.grid_size(N), gemv.warps_a_tile(N, 1, gemv.grid_size(N))) for N, K in gemv.LLM_SHAPES})
    print(f"{results.label(RUN.meta)}; kernel: {gemv_bench.default_kernel(RUN)}\n\n{gemv_bench.summary(RUN, RUN)}\n{bench.read_bound_line(RUN)}")
    if not any(r["kind"] == "bound" for r in RUN.records) and (other := bench.Run.load("09_read_bound")):
        print(f"(% of read: this run has no read bound; 09_read_bound.json: {provenance.why_not_comparable(other.meta, {}, RUN.meta, {})})")
    gemv_bench.plot(RUN)
# %% [markdown]
# <a id="batch"></a>
# ## 8. Batch: M = 2, 4, 8
#
# M rows of x cost (M + 1) // 2 n-tiles of mmas on the same A fragments; the weight is still read once. bitsandbytes 0.50.2's
# `gemm_4bit` (by its source, `backends/cuda/ops.py`) takes its fused kernel at M <= 4; above, a rule per M, N, K and GPU picks it or
# dequantize + `F.linear`: the cell asks that rule, per shape and dtype, at M = 2, 4 and 8 (the table's and the plot's bitsandbytes rows are `matmul_4bit`, whichever path it took).
# %%
if nf4lab.ON_GPU:
    BATCH = gemv_bench.benchmark({"notebook 09": launch}, ms=(2, 4, 8))
    import torch, bitsandbytes.backends.cuda.ops as bnb_ops  # noqa: E401  (private: the rule bitsandbytes 0.50.2 applies past M = 4)
    fused = getattr(bnb_ops, "_gemm_4bit_use_custom_cuda", None)
    for m in (2, 4, 8): print(f"bitsandbytes' path inside matmul_4bit at M = {m} here (bf16 / fp16):", {f"{N}x{K}": " / ".join("?" if fused is None else "fused" if fused(torch.cuda.current_device(), dt, m, N, K) else "dequantize + F.linear" for dt in (torch.bfloat16, torch.float16)) for N, K in gemv.LLM_SHAPES})  # noqa: E701
    print(f"saved {BATCH.save(gemv.NAME + '_notebook_batch').relative_to(results.ROOT)}")
else:   # this notebook's batch run, else an older lab kernel's (lab/bench_gemv.py; its label names kernel and date)
    BATCH = bench.Run.load(gemv.NAME + "_notebook_batch") or bench.Run.load("09_gemv_tc_batch")
if BATCH:   # % of read: section 7's read bound (the weight's bytes, read once at every M), if of the same run
    why = "not recorded" if RUN is None else provenance.why_not_comparable(RUN.meta, {}, BATCH.meta, {})
    print(f"{BATCH.path if BATCH.recorded else 'this run'} ({results.label(BATCH.meta)}); kernel: {gemv_bench.default_kernel(BATCH)}"
          f"\n\n{gemv_bench.summary(BATCH, None if why else RUN)}\n(% of read: section 7's read bound of M = 1, "
          + ("the same run: the weight's bytes are the same at every M)" if not why else f"{why})"))
    gemv_bench.plot(BATCH, batch=True)
# %% [markdown]
# <a id="learned"></a>
# ## 9. What we learned
#
# - Bytes bound a GEMV: section 1 predicts a time at copy speed; section 7 prints the read bound (a read-only kernel) as a share of its copy speed:
#   where that is far below 100%, section 1's time is out of reach of the read-only kernel measured here, so the target is the read bound of each shape. A table of A registers makes dequantization a `prmt` and a load.
# - The mma sums over k in any order: we pick k so that each lane reads contiguous bytes, and B's columns keep the absmax blocks apart so that each
#   is scaled once, in float32, by the scale bitsandbytes computes; section 7 prints how far above its own run's read bound each shape lands.
# - A batch reads the weight once but is not free: past M = 2 more n-tiles of mmas on the same A registers; at M > 1 x comes from L1 or L2 at each
#   step, not the slot; a tile has 8 warps (M = 1's groups are not used); the step loop is `fetch`'s longer one (section 5 prints its registers
#   and spills). Section 8 prints the fall, not how it splits among these. [Marlin](https://github.com/IST-DASLab/marlin), [FLUTE](https://github.com/HanGuo97/flute): further reading.
#
# <a id="exercise"></a>
# ## 10. Exercise: one mma by hand
#
# Compute Y (16 x 8) = W (16 x 16) @ X (16 x 8) with one `mma_bf16` in one warp: write `fragments`, the six registers
# lane (g, q) passes, a0-a3 from `w` and b0, b1 from `xt`, bf16 pairs in uint32 words: `w[8 r + j]` holds W's row r,
# columns 2j (low half) and 2j + 1; `xt[8 n + j]` holds X's column n, rows 2j (low half) and 2j + 1. Use section 2
# (here B has data in all 8 columns, and W's column k is A's column k: no permutation). Checked bit for bit (W and X are small integers, every sum exact in float32), and each lane's registers against the PTX layout: a k order A and B share leaves Y unchanged.
# %%
@cuda.jit(device=True, inline="always")
def fragments(w, xt, g, q):
    ### BEGIN SOLUTION
    r0, r1 = g * uint32(8), (g + uint32(8)) * uint32(8)   # W's rows g and g + 8; B's column n = g: xt's words 8 g ..
    return w[r0 + q], w[r1 + q], w[r0 + q + uint32(4)], w[r1 + q + uint32(4)], xt[uint32(8) * g + q], xt[uint32(8) * g + q + uint32(4)]
    ### STUDENT
    # TODO: a0, a1, a2, a3 from w and b0, b1 from xt (about 3 lines)
    return uint32(0), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0)
    ### END SOLUTION
@cuda.jit
def one_mma(w, xt, y):                   # one warp; lane (g, q) writes its four C values
    g, q, z = uint32(cuda.threadIdx.x) >> uint32(2), uint32(cuda.threadIdx.x) & uint32(3), float32(0.0)
    a0, a1, a2, a3, b0, b1 = fragments(w, xt, g, q)
    y[g, 2 * q], y[g, 2 * q + 1], y[g + 8, 2 * q], y[g + 8, 2 * q + 1] = mma_bf16(a0, a1, a2, a3, b0, b1, z, z, z, z)
from nf4lab.lesson.exercises import check_one_mma   # random small integers: every sum exact, checked bit for bit
result = check_one_mma(one_mma, fragments)
### BEGIN SOLUTION
assert result
### END SOLUTION
# %% [markdown]
# <a id="road"></a>
# ## Appendix: other designs the lab timed
#
# The lab timed other designs (an FFMA kernel with a pair lookup: float32 multiply-adds instead of the mma; a `cp.async` ring:
# asynchronous copies into shared memory; more blocks per SM; stream-K: tiles split across blocks; L2 prefetch, ...): `python -m
# lab.gemv_road` prints each one's time, bf16, M = 1, beside the tensor-core kernel where the same run timed one, and for older
# records (before records named their run) says why they are not compared; `lab/README.md` tells why none shipped.
