# Capstone: a tensor-core NF4 GEMV for decoding (percent-format source of notebooks/09_fused_gemv.ipynb)
# %% [markdown]
# # 09 · Capstone: fuse NF4 dequantization into a tensor-core GEMV
#
# **Goal.** Decoding computes `y = x @ W.T` per layer, `x` (M, K) with M = 1..8, `W` (N, K) in NF4. We build, one
# device function at a time, the kernel `nf4lab` ships (`nf4lab.kernels.gemv`): each packed byte read once, two codes
# turned into a bf16/fp16 pair by one shared-memory load, the products and float32 sums left to `mma.sync`; and
# compare it with bitsandbytes' `matmul_4bit`, which is its `gemm_4bit` op at every M.
#
# **Contents:** 1. [The byte count: a prediction](#bytes) · 2. [The kernel](#kernel) · 3. [PTX evidence](#evidence) ·
# 4. [Correctness: a tolerance, not bits](#correctness) · 5. [Benchmark: against bitsandbytes and the read bound](#benchmark) ·
# 6. [Batch: up to 8 rows of x](#batch) · 7. [The road here: what lost, and why](#road) · 8. [Reading](#reading) · 9. [Exercise](#exercise)
# %%
import nf4lab  # first: may switch numba to its simulator
import json, subprocess, tempfile  # noqa: E401
from nf4lab.measure import bench, gemv_bench, ptx, results
from nf4lab.kernels import gemv
from nf4lab.harness import gemv_check
from nf4lab import arch
from nf4lab.measure import ptxall
print(nf4lab.describe())   # the simulator runs the kernel too: its mma, PRMT and lookups have plain-Python twins
RUN, BATCH, BOUND = (bench.Run.load(n) for n in ("09_gemv_tc", "09_gemv_tc_batch", "09_read_bound"))
# %% [markdown]
# <a id="bytes"></a>
# ## 1. The byte count: a prediction
#
# 2 flops per weight read once: memory-bound, if the instructions keep up. Dequantize + matmul moves 0.5 + 2 + 2 bytes
# per weight, fused 0.5 plus scales. Times if we only read, at the recorded copy speed and *read bound* (a kernel that only reads them):
# %%
copy = RUN and RUN.get(gemv_bench.COPY)
reads = {tuple(r["shape"]): r["ms"] for r in (BOUND.records if BOUND else []) if r["kind"] == "bound"}
print(f"{'W (N x K)':>12} {'fused reads':>12} {'dequant + matmul':>17} {'ratio':>6} {'us at copy':>11} {'read bound us':>14}")
for N, K in gemv.LLM_SHAPES:
    f, u = gemv_bench.weight_bytes(N, K), gemv_bench.unfused_bytes(N, K)
    print(f"{N:>5} x {K:<5} {f / 1e6:>9.1f} MB {u / 1e6:>14.1f} MB {u / f:>6.1f} "
          f"{f / copy['gbps'] / 1e3 if copy else float('nan'):>11.1f} {reads.get((N, K), float('nan')) * 1e3:>14.1f}")
print(f"(copy: {results.label(RUN.meta)}; read bound: {results.label(BOUND.meta) if BOUND else 'none'})" if RUN else "")
sass = json.loads((results.ROOT / "data" / "sass" / "09_fused_gemv.json").read_text())
ffma = next(r for r in sass["rows"] if r["variant"] == "R4 S2 C32 W8 B3" and r["dtype"] == "bf16")  # its M = 1 design
print(f"FFMA design {ffma['variant']}: {ffma['per_weight']:.2f} SASS instructions per weight ({sass['meta']['arch']}, offline)")
# %% [markdown]
# The FFMA design (09's former kernel, `lab/gemv_variants.py`) spends per code byte a pair lookup, two FFMAs and
# address math (count above); its times were the same on GPUs of different copy speeds (`09_gemv_tc.json` per GPU):
# instructions set its pace. **Prediction:** fewer instructions per weight bring it toward the read bound. Here
# a byte costs one `prmt` (its table address) and one shared load of a bf16x2 pair, an mma operand as is.
#
# <a id="kernel"></a>
# ## 2. The kernel
#
# W is flat (`row*K + col`, high nibble first, absmax blocks of 64). Persistent blocks (2 per SM, 8 warps) take
# 16-row **tiles**; a warp's loop trip, a **step**, is 16 rows x 256 columns, warp w taking steps w, w + 8, ...
# (split-K). Lane (g, q) = (lane >> 2, lane & 3) holds two 16-byte pieces (32 codes each) of rows g, g + 8.
#
# **The per-lane table.** Entry e (a code byte) is (lut[e >> 4], lut[e & 15]) as bf16x2 (or f16x2), first
# column low. Each lane has its own copy (no bank conflicts): lane l's entry e at word `(e << 6) | l`, 256-byte
# rows, 64 KB of dynamic shared memory, a T4's limit per block. Words 32..63 of each row are free: code2 lives in
# rows 0-7's (`c + (c & 0xE0) + 32`: bank c & 31, as in a flat array), the 16 values in row 8's, the warps'
# partial sums in rows 128-255's (`spare`).
# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
import functools
from numba import cuda, float32, uint32, uint64
from nf4lab.kernels import gemv
from nf4lab.device import ops
# inline PTX, with plain-Python twins for the simulator: mma.sync, prmt, ld.shared at an immediate, shfl.xor
from nf4lab.kernels.gemv import (_lookup_at, load_u32_of_bytes, lookup, mma_bf16, mma_f16, prmt, shfl_idx, shfl_xor_sync,
                                 spare, syncwarp, x_slot_ops)

THREADS, W, BLOCKS_PER_SM = 256, 8, 2   # launch bounds: 2 blocks of 8 warps per SM (measured fastest)
LUT = (8 << 6) | 32                     # the 16 values: row 8's spare words; code2: rows 0-7's

@cuda.jit(device=True, inline="always")
def bf16_bits(v):
    return uint32(ops.to_bf16_bits(v))

@cuda.jit(device=True, inline="always")
def f16_bits(v):
    return uint32(ops.to_f16_bits(v))

def make_build_table(half_bits):
    @cuda.jit(device=True, inline="always")
    def build_table(sm, lut, code2, tid):
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        sm[tid + (tid & uint32(0xE0)) + uint32(32)] = ops.float_bits(code2[tid])   # word 32 + c of row c >> 5
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):    # the used half of each 256-byte row
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
    return build_table
# %% [markdown]
# **The table address is one `prmt`**: byte p of code word w is at `(w.byte p) << 8 | lane << 2`. `prmt.b32 d,
# a, b, sel` picks d's bytes from the 8 of b:a; a = w, b = lane << 2, sel = 0x5504 | p << 4 give byte 0 = b's
# low byte, byte 1 = w's byte p, bytes 2-3 = 0. **The lookup has no add**: dynamic shared memory starts at a
# `base` of the shared window (`gemv.probe_base()` asks the GPU once), carried in the load's immediate,
# `ld.shared.u32 d, [off + base]`. Four lookups make an mma's A fragment: rows g, g + 8, bytes 2i, 2i + 1.
# %% tags=["kernel"]
def table_lookup(base):
    if nf4lab.SIMULATOR:
        return lookup                      # the twin indexes the array itself
    lds = _lookup_at(base)
    @cuda.jit(device=True, inline="always")
    def look(tab, off):                    # tab: for the simulator's twin
        return lds(off)
    return look

def make_a_fragments(look):
    @cuda.jit(device=True, inline="always")
    def a_fragments(A, wv, h, sm, lane4):  # piece h's code words: wv[4h..] (row g), wv[8 + 4h..] (row g + 8)
        for i in range(8):
            wa, wb = wv[4 * h + (i >> 1)], wv[8 + 4 * h + (i >> 1)]
            sel0, sel1 = uint32(0x5504 | ((2 * (i & 1)) << 4)), uint32(0x5504 | ((2 * (i & 1) + 1) << 4))
            A[4 * i] = look(sm, prmt(wa, lane4, sel0))
            A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
            A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
            A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
    return a_fragments
# %% [markdown]
# **The mma and its fragments.** `mma.sync.m16n8k16` adds A (16 x 16) B (16 x 8) to C (16 x 8) in float32. Lane
# (g, q) holds A[g, 2q..2q+1], A[g+8, 2q..2q+1] and both at k + 8; B[2q..2q+1, g], B[2q+8..2q+9, g]; C[g, 2q..2q+1],
# C[g+8, 2q..2q+1]. A sum ignores which columns are called k: lane q's k are its piece's columns, so its B holds x
# there. B's column 4 mm + b holds batch row mm's x where the piece is in the step's 64-column block b, else 0.
# A T4 (sm_75) has no bf16 mma: `mma_f16` runs two m16n8k8 there, `mma_bf16` the products on the FP32 units. Use fp16.
#
# **x through a shared slot (M = 1).** x loaded from L1/L2 just before each mma made every step wait (section 7).
# So each lane loads 16 of the next step's 512 bytes of x with that step's weights (`x_quad`) and, after this step,
# stores them in its warp's slot (`x_stash`): 4 spare half-rows, rows 16 + 4 warp + block, rotated 4 words per block
# against bank conflicts, zeros past K. The lanes g = q read their 64 bytes a piece there (`x_read`, `ld.shared.v4`);
# the others keep zeros. The three are small device functions in `nf4lab.device.warp_ops.x_slot_ops`.
# %% tags=["kernel"]
def make_mma_piece(M, is_bf16, x_read):
    NT, WIDE = (M + 1) // 2, M > 1          # n-tiles of 8 columns: 2 batch rows x 4 blocks each
    mma = mma_bf16 if is_bf16 else mma_f16
    @cuda.jit(device=True, inline="always")
    def mma_piece(cf, A, xr, x_u32, g, q, blk, xcol, k, kx, h, sm, warp):
        for nt in range(NT):
            m = uint32(2 * nt) + (g >> uint32(2))     # B column g = 4 mm + b: batch row 2 nt + mm, block b
            if M == 1:
                if g == q:
                    x_read(xr, sm, warp, q, h)
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
    return mma_piece
# %% [markdown]
# **Fetch.** A step's loads: lane q's pieces of rows g, g + 8 (16 bytes each, skipping L1; M = 1: columns 64q..; a
# batch: 32q.. and 128 + 32q.., whole sectors) and one statistics word. A step holds 4 whole blocks of each row
# (blocksize 64, K a multiple of 256): lanes 0-15 load row `lane`'s 4 absmax codes in one 32-bit load, lanes 16-31 its
# absmax2, 16 rows' cache lines where byte loads reached 64 (lab/README.md, "TC statword"; else `gemv.words_apply` is False
# and the package's byte-wise loads run).
# %% tags=["kernel"]
def make_fetch(M):
    WIDE, QO = M > 1, 16                    # buf[o:o+16]: code words; then the statistics word
    @cuda.jit(device=True, inline="always")
    def put(buf, i, packed_u32, w):
        buf[i], buf[i + 1], buf[i + 2], buf[i + 3] = gemv.load_stream_u32x4(packed_u32, uint64(w))
    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_q, absmax2, t, c, g, q, n, kw, tiles, steps, ash):
        tt, cc = min(t, uint32(tiles - uint32(1))), min(c, uint32(steps - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
        if WIDE:
            wq0, wq1 = (min(uint32(cc * uint32(32) + uint32(4) * q), uint32(kw - uint32(4))),
                        min(uint32(cc * uint32(32) + uint32(16) + uint32(4) * q), uint32(kw - uint32(4))))
            put(buf, o, packed_u32, r0 * kw + wq0)
            put(buf, o + 4, packed_u32, r0 * kw + wq1)
            put(buf, o + 8, packed_u32, r1 * kw + wq0)
            put(buf, o + 12, packed_u32, r1 * kw + wq1)
        else:
            wq = min(uint32(cc * uint32(32) + uint32(8) * q), uint32(kw - uint32(8)))   # lane q's first word
            w0, w1 = uint32(r0 * kw + wq), uint32(r1 * kw + wq)
            put(buf, o, packed_u32, w0)
            put(buf, o + 4, packed_u32, w0 + uint32(4))
            put(buf, o + 8, packed_u32, w1)
            put(buf, o + 12, packed_u32, w1 + uint32(4))
        lane = g * uint32(4) + q            # the step's first block of row `lane & 15`:
        r = min(uint32(tt * uint32(16) + (lane & uint32(15))), uint32(n - uint32(1)))
        blk = r * (kw >> uint32(3)) + cc * uint32(4)
        if lane < uint32(16):
            buf[o + QO] = load_u32_of_bytes(absmax_q, blk)          # its 4 absmax codes
        else:
            buf[o + QO] = ops.float_bits(absmax2[blk >> uint32(8)])  # its absmax2 (one per 256 blocks)
    return fetch
# %% [markdown]
# **The step.** 2 pieces x 8 mmas per n-tile, then the scales: lane q's C columns 2q, 2q + 1 are batch row 2 nt + q // 2,
# blocks 2 (q & 1), +1 of rows g, g + 8 (4 shuffles bring their words), scaled as bitsandbytes does (`fmul_rn`, `fadd_rn`).
# %% tags=["kernel"]
def make_step(M, is_bf16, look, x_read):
    NT, WIDE, QO = (M + 1) // 2, M > 1, 16
    a_fragments, mma_piece = make_a_fragments(look), make_mma_piece(M, is_bf16, x_read)
    @cuda.jit(device=True, inline="always")
    def step(acc, cf, s, A, xr, wv, buf, sm, x_u32, offset, c, g, q, k, kx, lane4, warp):
        for i in range(16):
            wv[i] = buf[i]
        for i in range(4 * NT):
            cf[i] = float32(0.0)
        xcol = uint32(c * uint32(256) + uint32(64) * q)   # lane q's 64 columns: block q of the step
        for h in range(2):
            if WIDE:                       # piece h: 32 columns at 128 h + 32 q, block 2 h + q // 2
                xcol = uint32(c * uint32(256) + uint32(128 * h) + uint32(32) * q)
                blk = uint32(2 * h) + (q >> uint32(1))
            else:
                blk = q
            a_fragments(A, wv, h, sm, lane4)
            mma_piece(cf, A, xr, x_u32, g, q, blk, xcol, k, kx, h, sm, warp)
        raw = buf[QO]
        wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
        ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
        sh = uint32(16) * (q & uint32(1))
        if (q >> uint32(1)) < uint32(M):
            for i in range(4):
                code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                s[i] = ops.fadd_rn(ops.fmul_rn(gemv.f32_from_bits(sm[code + (code & uint32(0xE0)) + uint32(32)]),
                                               gemv.f32_from_bits(ag if i < 2 else ag8)), offset)
            for nt in range(NT):
                acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
    return step
# %% [markdown]
# **The reduction.** Lanes q and q ^ 1 hold a batch row's blocks 0-1 and 2-3: `shfl.xor` adds them (`pair_sum`, the
# exercise's hook). Warps write 16 M sums to shared memory; after a barrier 16 M threads add the 8 warps' and write
# y. Two buffers (`parity`) let the next tile start while this one is read.
# %% tags=["kernel"]
@cuda.jit(device=True, inline="always")
def pair_sum(v):
    return v + shfl_xor_sync(0xFFFFFFFF, v, 1)

def make_tile_sum(M, half_bits, reduce):
    NT = (M + 1) // 2
    @cuda.jit(device=True, inline="always")
    def tile_sum(sm, acc, y, t, n, tid, warp, g, q, parity):
        base = uint32(parity * uint32(W * 16 * M) + warp * uint32(16 * M))
        for nt in range(NT):
            a0, a1 = reduce(acc[2 * nt]), reduce(acc[2 * nt + 1])
            m = uint32(2 * nt) + (q >> uint32(1))
            if m < uint32(M) and (q & uint32(1)) == uint32(0):
                sm[spare(base + m * uint32(16) + g)] = ops.float_bits(a0)
                sm[spare(base + m * uint32(16) + g + uint32(8))] = ops.float_bits(a1)
        cuda.syncthreads()
        if tid < uint32(16 * M):
            first, v = uint32(parity * uint32(W * 16 * M) + tid), float32(0.0)
            for w in range(W):
                v += gemv.f32_from_bits(sm[spare(first + uint32(w * 16 * M))])
            row = uint32(t * uint32(16) + (tid & uint32(15)))
            if row < n:
                y[uint32((tid >> uint32(4)) * n + row)] = half_bits(v)
    return tile_sum
# %% [markdown]
# **The kernel.** A warp keeps one step's loads in flight ahead of the one it computes (`buf` holds both): the first
# step's go out before the table is built, each trip fetches the next, across tiles too. Sizes are compile-time
# constants (local arrays indexed by unrolled loops live in registers). The launcher validates (a misaligned 128-bit
# load kills the context), takes one block per tile up to 2 per SM, and allows 64 KB of shared memory (`gemv.prepare`).
# %% tags=["kernel"]
@functools.cache
def make_kernel(is_bf16, M, base, reduce=pair_sum):
    NT = (M + 1) // 2
    NACC, NCF, FB, NB = 2 * NT, 4 * NT, 17, 34   # per step in buf: 16 code words, 1 statistics word
    half_bits = bf16_bits if is_bf16 else f16_bits
    x_quad, x_stash, x_read = x_slot_ops(base)  # x's slot: load 16 bytes a lane, stash them, read a piece's 64
    build_table, fetch = make_build_table(half_bits), make_fetch(M)
    step, tile_sum = make_step(M, is_bf16, table_lookup(base), x_read), make_tile_sum(M, half_bits, reduce)
    @cuda.jit(launch_bounds=(THREADS, BLOCKS_PER_SM))
    def gemv_tc(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm, tid = cuda.shared.array(0, uint32), uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw, kx = k >> uint32(3), k >> uint32(1)
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        ash, grid = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x)
        buf = cuda.local.array(NB, uint32)        # this step's loads and the next one's
        t, c = uint32(cuda.blockIdx.x), warp
        tp, cp = t, c                              # the step whose loads go out next
        xq, xok = cuda.local.array(4, uint32), True   # M = 1: this lane's 16 bytes of x for step cp
        if M == 1:
            xok = x_quad(xq, x_u32, cp, lane, k)
        for d in range(1):   # one trip, shaped as the shipped kernel's prologue (LLVM schedules straight code otherwise)
            fetch(buf, FB * (d + 1), packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            cp = uint32(cp + uint32(W))
            if cp >= steps:
                cp, tp = warp, uint32(tp + grid)
        build_table(sm, lut, code2, tid)
        lane4, parity = lane << uint32(2), uint32(0)
        acc, cf, s = cuda.local.array(NACC, float32), cuda.local.array(NCF, float32), cuda.local.array(4, float32)
        A, xr, wv = cuda.local.array(32, uint32), cuda.local.array(32, uint32), cuda.local.array(16, uint32)
        if M == 1:                                 # lanes without x keep zeros; the first step's x into the slot
            for j in range(16):
                xr[j] = uint32(0)
            x_stash(sm, xq, xok, warp, lane)
            syncwarp()
        while t < tiles:
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:
                for i in range(FB):
                    buf[i] = buf[i + FB]
                fetch(buf, FB, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                if M == 1:                         # the next step's x rides with its weights
                    xok = x_quad(xq, x_u32, min(cp, uint32(steps - uint32(1))), lane, k)
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp, tp = warp, uint32(tp + grid)
                cn = uint32(c + uint32(W))
                tn = t
                if cn >= steps:
                    cn, tn = warp, uint32(t + grid)
                if c < steps:
                    step(acc, cf, s, A, xr, wv, buf, sm, x_u32, offset, c, g, q, k, kx, lane4, warp)
                if M == 1:                         # into the slot once every lane has read this step's x
                    syncwarp()
                    x_stash(sm, xq, xok, warp, lane)
                    syncwarp()
                c = cn
                if tn != t:
                    break
            tile_sum(sm, acc, y, t, n, tid, warp, g, q, parity)
            parity, t = parity ^ uint32(1), tn
    return gemv_tc

def launch(g, reduce=pair_sum):
    gemv.validate(g)
    if not gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)):
        assert reduce is pair_sum, "this case runs the package's kernel (byte-wise statistics), not yours"
        return gemv.launch(g)
    kern = make_kernel(g.dtype == "bf16", g.M, gemv.probe_base() if nf4lab.ON_GPU else 0, reduce)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    smem = 4 * 256 * 64                    # the table, with everything else in its rows' spare words
    gemv.prepare(kern, args, smem)[g.grid or min(-(-g.N // 16), BLOCKS_PER_SM * gemv.sms()), THREADS, g.stream, smem](*args)
# %% [markdown]
# <a id="evidence"></a>
# ## 3. PTX evidence
#
# Per step: 16 `mma.sync` (2 pieces x 8), 64 `prmt`, 64 lookups, base in the load's immediate; no local memory or
# float64. Registers, spills: the driver's build (GPU) or ptxas (offline). Below sm_80 (a T4): fp16's kernel.
# %%
cc = arch.target_cc(); T4 = cc < (8, 0)  # noqa: E702
kern = make_kernel(not T4, 1, gemv.probe_base() if nf4lab.ON_GPU else gemv.default_base(cc))
code = ptx.compile_ptx(kern, gemv.signature(), cc=cc, launch_bounds=(THREADS, BLOCKS_PER_SM))
LOOKUP = r"^ld\.shared\.u32 %r\d+, \[%r\d+\+\d+\]"
MMA = r"^mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.f16" if T4 else r"^mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16"
ptx.show(code, [r"^prmt\.b32", LOOKUP, r"^mma\.sync"], limit=2)
ptx.check(code, present=[MMA, r"^prmt\.b32", LOOKUP], absent=[r"^ld\.local", r"^st\.local", r"\.f64"])
print(arch.name(cc), {w: ptx.count(code, p) for w, p in [("mma", r"^mma\.sync"), ("prmt", r"^prmt"), ("lookups", LOOKUP)]})
if nf4lab.ON_GPU:   # the driver's build for this GPU (a GPU image may have no ptxas)
    print(f"{(kk := kern.compile(gemv.signature())).regs_per_thread} registers, {kk.local_mem_per_thread} bytes of local memory (spills) per thread")
else:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(code), f.flush()
        out = subprocess.run([ptxall.find_ptxas(), f"-arch={arch.name(cc)}", "-v", "-o", "/dev/null", f.name],
                             capture_output=True, text=True).stderr
    print("ptxas:", "; ".join(ln.split(":")[-1].strip() for ln in out.splitlines() if "Used" in ln or "spill" in ln))
# %% [markdown]
# <a id="correctness"></a>
# ## 4. Correctness: a tolerance, not bits
#
# Each GEMV sums in its own order, so we check a bound against float64 `y64 = x @ W.T`: any float32 sum's error
# `K * eps32 * sum|x w|` (Higham §3.1) plus the output rounding `u * |y|`. mma takes bf16/fp16, so the table holds the
# NF4 values *rounded to the dtype*: the bound grows by `u * sum|x w|` (`rounded_table=True`). bitsandbytes' beside.
# %%
SHAPES = ([((20, 256), "bf16", 1), ((9, 256), "fp16", 3)] if nf4lab.SIMULATOR else
          [((512, 4096), "bf16", 1), ((255, 14336), "fp16", 1), ((100, 4160), "bf16", 4), ((64, 4096), "fp16", 8)])
for (N, K), dtype, M in SHAPES:
    gc = gemv_check.make_gemv_case(N, K, dtype, M=M)
    g = gemv.make_gemv_buffers(gc)
    launch(g)
    ours = gemv_check.check(g.result(), gc, name=f"ours {N}x{K} {dtype} M={M}", rounded_table=True)
    theirs = gemv_check.compare(gemv_check.bnb_output(gc, "cuda" if nf4lab.ON_GPU else "cpu"), gc, rounded_table=True)
    print(f"{ours}; bitsandbytes {theirs.worst_ratio:.3g}")
# %% [markdown]
# <a id="benchmark"></a>
# ## 5. Benchmark: against bitsandbytes and the read bound
#
# One run: bitsandbytes `matmul_4bit` (`gemm_4bit`'s fused kernel at M = 1), dequantize + matmul, ours; GPU time, DRAM.
# %%
if nf4lab.ON_GPU:   # a progress line per (shape, dtype): wall-clock seconds of that step, not a kernel time
    run = gemv_bench.benchmark({"notebook 09": launch})
    print(f"saved {run.save(gemv.NAME + '_notebook').relative_to(results.ROOT)}")
else:
    run = RUN
    print("No GPU here: the run recorded in " + (f"{run.path}" if run else "(none: lab/bench_gemv.py on a GPU)"))
if run is not None:
    print(f"({results.label(run.meta)}; read bound: {results.label(BOUND.meta) if BOUND else 'none'})\n")
    print(gemv_bench.summary(run, BOUND))
    gemv_bench.plot(run)
# %% [markdown]
# <a id="batch"></a>
# ## 6. Batch: up to 8 rows of x
#
# M rows cost (M + 1) // 2 n-tiles of mmas on the same A fragments (x from L1/L2: the slot is for M = 1). bitsandbytes'
# `gemm_4bit` runs its fused kernel up to M = 4; past that a per-GPU heuristic may pick dequantize + `F.linear`. Recorded by the lab:
# %%
print(f"{BATCH.path} ({results.label(BATCH.meta)}):\n\n{gemv_bench.summary(BATCH)}" if BATCH else "No batch run recorded here.")
if BATCH:
    gemv_bench.plot(BATCH, batch=True)
# %% [markdown]
# <a id="road"></a>
# ## 7. The road here: what lost, and why
#
# bf16 times recorded by the lab (`lab/README.md` tells each story; `-`: no record), x = time / the shipped kernel's in
# the same file, else in `09_gemv_tc*.json`. The ring's and chains' records predate the 64 KB layout and x's slot.
# %%
ROAD = [("FFMA design (09's former)", "09_fused_gemv", "auto", "pair lookup + 2 FFMA per byte: issue-bound"),
        ("tensor core (shipped)", "09_gemv_tc", None, "this notebook"),
        ("cp.async ring, 2 stages", "09_gemv_ring", "TC R2", "weights via cp.async: no M = 1 gain; batch: a lead"),
        ("chains of mmas, 2", "09_gemv_chains", "TC C2", "the mma chain is not the wait"),
        ("x from L1/L2 at each step", "09_gemv_tc", "TC x-global", "each step waits for x (2 KB of weights ahead)"),
        ("statistics loaded in pairs", "09_gemv_stats2", "TC stats2", "half the loads, the same cache lines"),
        ("3 blocks per SM, no spills", "09_gemv_b3", "TC B3 D1", "80 registers: 24 warps, each slower"),
        ("weights into L2, 2 steps ahead", "09_gemv_l2prefetch", "TC PF2", "more requests, not less waiting"),
        ("D2-3, B4, carveout, +add, 128 cols", None, "", "register moves; spills; L1 shrinks; an add; overhead")]
print(f"{'design, bf16, ' + (RUN.meta['gpu'] if RUN else 'none recorded'):<37}{'4096x14336 M=1':>20}{'8192x28672 M=1':>20}{'4096x14336 M=8':>20}  why")
for label, stem, v, why in ROAD:
    cells = []
    for shape, M in (((4096, 14336), 1), ((8192, 28672), 1), ((4096, 14336), 8)):
        f = stem and bench.Run.load(stem + ("_batch" if M > 1 else ""))
        r = f and gemv_bench.find_record(f, gemv_bench.kernel_name(v) if v else gemv_bench.default_kernel(f), shape, "bf16", M)
        ship = BATCH if M > 1 else RUN
        ref = (f and gemv_bench.find_record(f, gemv_bench.kernel_name("TC"), shape, "bf16", M)
               or ship and gemv_bench.find_record(ship, gemv_bench.default_kernel(ship), shape, "bf16", M))
        cells.append(f"{r['ms'] * 1e3:.1f} us {r['ms'] / ref['ms']:.2f}x" if r and ref else "-")
    print(f"{label:<37}" + "".join(f"{c:>20}" for c in cells) + f"  {why}")
# %% [markdown]
# <a id="reading"></a>
# ## 8. Reading: Marlin and FLUTE
#
# - **Marlin** (https://github.com/IST-DASLab/marlin): 4-bit weights on tensor cores to batch 16-32: weights
#   reshuffled offline, `lop3` dequantization, `cp.async` pipelines, global split-K reduction.
# - **FLUTE** (https://github.com/HanGuo97/flute): lookup-table formats like NF4 on tensor cores, the table
#   duplicated in shared memory against bank conflicts, as our per-lane copies are.
#
# <a id="exercise"></a>
# ## 9. Exercise: the pair sum is wrong
#
# With `pair_sum_ex` as `reduce` the outputs are far off. Make each lane return its value plus that of the lane
# holding its batch row's other two blocks (1 line). **Hint.** Lane q holds C columns 2q, 2q + 1: who has 2q ^ 2?
# %%
@cuda.jit(device=True, inline="always")
def pair_sum_ex(v):
    ### BEGIN SOLUTION
    return v + shfl_xor_sync(0xFFFFFFFF, v, 1)
    ### STUDENT
    return v   # TODO: add the partner lane's v (shfl_xor_sync(mask, value, lane_mask); 1 line)
    ### END SOLUTION

result = gemv_check.check_exercise(lambda g: launch(g, reduce=pair_sum_ex), "exercise: pair sum", True, (16, 256))
### BEGIN SOLUTION
assert result
### END SOLUTION
