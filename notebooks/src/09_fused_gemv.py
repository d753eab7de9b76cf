# Capstone: a fused NF4 GEMV for decoding (percent-format source of notebooks/09_fused_gemv.ipynb)

# %% [markdown]
# # 09 · Capstone: fuse NF4 dequantization into the matrix-vector product
#
# **Goal.** At decode time (batch 1) every linear layer computes `y = x @ W.T` with `x` of shape
# (1, K) and an NF4 weight `W` of shape (N, K). We write one `numba.cuda` kernel that reads each
# packed weight byte once, dequantizes in registers and accumulates the dot products, and compare
# it, on the same data and in the same run, with bitsandbytes' own fused kernel (`matmul_4bit` with
# a one-row input) and with `dequantize_4bit` followed by `torch.matmul`. The same kernel then takes
# a small batch (up to 8 rows of `x`), still reading each weight byte once.
#
# 1. Why fusing pays: the byte count
# 2. The kernel: what limited the first version, and a streaming design
# 3. PTX and SASS evidence
# 4. Correctness: a tolerance from the summation length, and the difference from bitsandbytes
# 5. Benchmark: effective weight bandwidth vs the copy ceiling at LLM shapes
# 6. What limits it: the SM's load/store data pipe (Nsight Compute)
# 7. Batch: up to 8 rows of x
# 8. Reading: what Marlin does beyond this
# 9. Exercise

# %%
import nf4lab  # first: may switch numba to its simulator

import dataclasses
import subprocess

import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab import gemv, ops
from nf4lab.gemv import (MAX_M, bar_sync, f16_to_f32, f32_from_bits, lds_pair, lds_u32, load_stream_u32x4, prmt,
                         shfl_down_sync, shfl_idx)

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
# **The arithmetic** (unchanged from the first version of this kernel):
#
# - **A byte-pair table.** A code byte holds two weights, so a 256-entry table of *pairs*
#   `(lut[byte >> 4], lut[byte & 15])` gives both with one 64-bit shared read. With 256 entries, lanes
#   reading different bytes would hit the same bank; 16 copies of the table (32 KB), copy `c` in banks
#   2c and 2c+1 of every 128-byte row, lane `l` reading copy `l & 15`, make every read conflict-free.
#   The read is addressed in bytes, `(byte << 7) | lane8`: one shift and one and-or of the 32-bit
#   code word (`gemv.lds_pair` emits `ld.shared.v2.f32`).
# - **The scale out of the inner sum.** A lane's columns of a row lie in one absmax block:
#   `acc += scale * sum_k lut[q_k] x_k`, one FMA per weight and one scale per lane per block.
# - **x shared by several rows**, converted to float32 once; **float32 sums** per lane over the whole
#   row, then five `shfl.sync.down` per row, and lane 0 rounds to nearest even to bf16/fp16.
#
# **What limited the first version.** The kernel this notebook first taught (kept as
# `nf4lab.gemv_v1`: 4 rows per warp, 64 columns per lane per step) stayed at about half the copy
# ceiling or below on an H100 (section 5 shows the recorded run). Its SASS explains why: each lane held
# 64 converted activations and the codes of 4 rows for two steps, about 170 registers per thread
# (section 3 prints ptxas' report). An SM has 65536 registers, so it held 2 blocks of 4 warps: 8 warps,
# when it can run 64. A memory-bound kernel is limited by the bytes it keeps in flight (Little's law:
# bandwidth = bytes in flight / latency). At about 3 TB/s and a DRAM latency near 1 us under load, the
# GPU needs about 3 MB in flight, some 20-25 KB per SM, at every moment. Eight warps that each issue
# 4 KB and then compute for a long time do not keep that up.
#
# **A streaming design.** The new kernel is organised around what a warp does in one loop trip, an
# *item*: R rows (2 to start with; the default for large W, below, takes 4) times 32 lanes times
# 32 columns. Per row a lane loads 16 bytes (one 128-bit load, 32 codes), so a warp reads 512
# contiguous bytes of each row per item.
#
# - **Software pipeline in few registers.** A lane holds two items: the one it computes and the next
#   one, whose loads are issued before the current one is computed. With R = 2 that is 2 x (8 code
#   words + 2 scale bytes + 2 absmax2 floats), and the whole kernel fits in 64 registers: the
#   launch bounds (`cuda.jit(launch_bounds=(256, 4))`, i.e. `.maxntid 256` and `.minnctapersm 4` in the
#   PTX) ask ptxas for 4 blocks of 256 threads per SM, 32 warps, 4x the first version. Each keeps its
#   next item (1 KB) in flight: 32 KB per SM.
# - **No drain between row groups.** After the last item of a row group comes the first item of the
#   warp's next group, so the pipeline never empties; the very first item is loaded before the block
#   builds its table, so its latency overlaps the table build.
# - **Weights bypass L1.** Codes are read once: `ld.global.nc.L1::no_allocate.v4.u32`
#   (`gemv.load_stream_u32x4`) keeps them out of L1, which holds what is reused (x and the scales).
# - **Split-K for short W.** With N = 4096 and 2 rows per item there are only 2048 row groups, half
#   the warps 132 SMs hold. A *team* of S warps then shares each row group: warp j of the team takes
#   items j, j + S, ... of the row; at the end each warp reduces its lanes with shuffles, writes its
#   sums to shared memory, and the team meets at a named barrier (`bar.sync id, 32*S`: only its own
#   warps wait) before its first warp adds them up. `auto_design` picks S = 2 when the row groups are
#   too few (N = 4096).
# - **The default, chosen by measurement.** Two H100 runs of the variants (section 5) chose it. More rows
#   per item won on every shape: each lane has more 128-bit loads in flight and converts each activation
#   once for more rows. How many rows, and whether to split K, depends on how many warps the row groups
#   give the GPU: with N = 4096, 4 rows with K split over 2 warps; with N = 8192, 8 rows with K split over
#   2 warps; otherwise (and for every batch M > 1) 4 rows without a split, at 2 blocks per SM so that the
#   128 registers never spill. The earlier defaults stay as variants (`auto (R2, before)`,
#   `auto (R4/R2, before)`) for comparison.
# - **Cheap index arithmetic.** All indices are 32-bit (`validate` refuses N*K/8 >= 2^32); only the
#   final offsets of a load are widened, so that consecutive 128-bit loads use immediate offsets.
# - **x converted once per item** for all R rows (the first version: for 4 rows), and the block scale
#   once per lane per item (a lane's 32 columns lie in one absmax block).
# - **Batch M (section 7)** is the same kernel with M rows of x: each NF4 value read from the table
#   feeds M FMAs, and a lane keeps R x M partial sums.
#
# The compile-time choices live in a `Design` (rows R, split S, columns per lane C, warps per block W,
# batch M, launch-bound blocks B, streaming loads); `Design().name` is how a variant is named in the
# benchmark, e.g. `R2 S1 C32 W8 B4`. Helpers from `nf4lab.gemv`, because the simulator lacks them:
# `f32_from_bits` (a bit cast, to turn bf16 bits into a float) / `f16_to_f32` (`cvt.f32.f16`),
# `lds_pair` (`ld.shared.v2.f32`), `load_stream_u32x4`, `bar_sync` and `shfl_down_sync` (on a GPU:
# `cuda.shfl_down_sync` itself). Local arrays (`cuda.local.array`) are indexed only by loop
# variables of `range(constant)`, which NVVM unrolls, so they live in registers (section 3 checks
# that no local memory is left).

# %% tags=["kernel"]
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


def sms():
    return nf4lab.device_info().get("sms") or 132  # the simulator has none: plan for an H100


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
    kern = gemv.with_dynamic_shared(kern, args, d.dynamic_smem)
    grid = g.grid if getattr(g, "grid", None) else grid_size(kern, d, g.N, policy)
    kern[grid, 32 * d.warps, g.stream, d.dynamic_smem](*args)


# Variants a GPU run times side by side (tools/bench_gemv.py): the first is the notebook's default. A value is
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

# %% [markdown]
# ## 3. PTX and SASS evidence
#
# For the base design `Design()` (R = 2 rows, 32 columns per lane, 8 warps, bf16) the PTX should hold: the
# launch bounds (`.maxntid 256`, `.minnctapersm 4`); the code loads as
# `ld.global.nc.L1::no_allocate.v4.u32`, R per item, written twice (before the table is built, and in
# the loop); 4 loads of x per item (`ld.global.v4.u32`, 8 activations each); one `ld.shared.v2.f32` per
# code byte (R x 16); five `shfl.sync.down` per row; and no local memory, no float64, no 64-bit division.

# %%
D0 = Design()
ptx = gemv.kernel_ptx(kernel(D0, "bf16"), SIG)
nf4lab.ptx.show(ptx, [r"^ld\.global\.nc\.L1::no_allocate\.v4", r"^ld\.global\.v4", r"^shfl"], limit=4)
nf4lab.ptx.check(ptx, present=[r"^ld\.global\.nc\.L1::no_allocate\.v4\.u32", r"^ld\.global\.v4\.u32",
                               r"^shfl\.sync\.down", r"^ld\.shared\.v2\.f32"],
                 absent=[r"^ld\.local", r"^st\.local", r"\.f64", r"^(div|rem)\.(s|u)64"])
n_codes = nf4lab.ptx.count(ptx, r"^ld\.global\.nc\.L1::no_allocate\.v4")
n_x = nf4lab.ptx.count(ptx, r"^ld\.global\.v4")
n_pair = nf4lab.ptx.count(ptx, r"^ld\.shared\.v2\.f32")
n_shfl = nf4lab.ptx.count(ptx, r"^shfl\.sync\.down")
bounds = [line.strip() for line in ptx.splitlines() if ".maxntid" in line or ".minnctapersm" in line]
print(f"\nlaunch bounds: {bounds}\ncode loads: {n_codes} (R = {D0.rows} rows, in the prologue and in the loop); "
      f"x loads: {n_x}; pair reads: {n_pair} (one per code byte); shuffles: {n_shfl} (5 per row)")
assert n_codes == 2 * D0.rows and n_x == 4 and n_pair == D0.rows * 16 and n_shfl == 5 * D0.rows
assert any(".maxntid 256" in b for b in bounds) and any(".minnctapersm 4" in b for b in bounds)

# %% [markdown]
# PTX is not what runs: `ptxas` turns it into SASS, the GPU's own instructions. When the CUDA
# toolkit's `ptxas` and `cuobjdump` are installed (no GPU needed), we assemble the kernel for the
# H100 (sm_90) and read the registers per thread (which decide how many warps an SM holds) and the
# instructions of its inner loop, one item, per weight. The floor is one FMA per weight, half a
# table read, about one instruction per weight to cut the bytes out of the code words, and one
# conversion per activation shared by R rows; the rest (addresses, loads, scale, the copy of the
# next item into the current one) is shared by the R x 32 weights of a lane's item. Below it, the report
# `tools/sass_gemv.py` recorded for every variant of `VARIANTS` and for the first version: more
# instructions per weight than the first version's, traded for 4x the warps.

# %%
try:
    r = gemv.sass_report(kernel(D0, "bf16"), SIG, D0.rows * D0.cols, "gemv_bf16", ptx=ptx)
    print(f"{D0.name} bf16: {r['registers']} registers, {r['spill_bytes']} bytes spilled; inner loop: "
          f"{r['loop_instructions']} SASS instructions for {r['weights_per_trip']} weights per lane = "
          f"{r['per_weight']:.2f} per weight")
    print("    " + ", ".join(f"{k} {v}" for k, v in list(r["opcodes"].items())[:10]))
    warps = min(64, 65536 // (-(-r["registers"] // 8) * 8 * 32 * D0.warps) * D0.warps)
    print(f"    -> {warps} warps per SM by registers")
except (FileNotFoundError, OSError, subprocess.CalledProcessError) as exc:
    print(f"no SASS here ({exc}); install the CUDA toolkit's ptxas and cuobjdump to count instructions")
report = gemv.load_sass_report()
if report is None:
    print("\nno recorded SASS report for the variants (python tools/sass_gemv.py --all --v1 --batch --save writes one)")
else:
    m = report["meta"]
    print(f"\nrecorded in {report['path']} ({m['date']}, {m['ptxas']}, numba-cuda {m['numba_cuda']}), bf16, batch 1:")
    print(gemv.sass_table(report))

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
# The simulator runs the kernel on small shapes: odd N (the last group of rows is partial), K not a
# multiple of the 1024 columns of an item (some lanes idle in a row's last item), a case spanning two
# absmax2 groups (53 x 320 > 256 x 64), bf16 and fp16, one warp per row group (`Design()`) and, for
# the short W of the other two, `auto_design`'s split of K over two warps.

# %%
SHAPES = [((24, 192), "bf16", Design()), ((53, 320), "fp16", None), ((7, 2112), "bf16", None)] if nf4lab.SIMULATOR \
    else [((512, 4096), "bf16", None), ((255, 14336), "bf16", None), ((100, 4160), "fp16", None)]
cases = {}
for (N, K), dtype, design in SHAPES:  # design None: auto_design(N)
    gc = gemv.make_gemv_case(N, K, dtype)
    g = gemv.make_gemv_buffers(gc)
    launch(g, design)
    y = g.result()
    rep = gemv.check(y, gc, name=f"fused {N}x{K} {dtype} [{(design or auto_design(N)).name}]")  # raises outside the tolerance
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
    "32 columns (one lane's item) lost": gc.x[:, 32:] @ gc.w[:, 32:].T,
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
# `dequantize_4bit` followed by `torch.matmul`, our kernel (`auto`) and the first version (`v1`), at
# four LLM shapes, bf16 and fp16, plus the device-to-device copy ceiling. GPU time comes from CUDA-graph
# replays (`nf4lab.bench.gpu_time_ms`); every timed function cycles over enough copies of the weight to
# exceed 4x the L2 cache, so the weights come from DRAM, as in a real decoding step. The effective
# weight bandwidth is (packed codes + absmax_q + absmax2 + code2 bytes) / time, for all of them (so
# for dequantize + matmul it is far below what that pair actually moves). A notebook run on a GPU saves
# to `data/results/<gpu>/09_fused_gemv_notebook.json`; `python tools/bench_gemv.py` times every
# variant and grid policy and saves `09_fused_gemv.json`, which is what a GPU-less session shows. Each
# kernel record is named `fused NF4 gemv (numba) [variant]`; a record named without a variant comes from
# a run made before this redesign, and is the first version.

# %%
from nf4lab import bench, gemv_v1, results

if nf4lab.ON_GPU:
    run = gemv.benchmark({"auto": launch, "v1": gemv_v1.launch})
    path = run.save(gemv.NAME + "_notebook")
    print(gemv.table(run))
    print(f"saved {path.relative_to(results.ROOT)}")
else:
    run = bench.Run.load(gemv.NAME)
    if run is None:
        print("No GPU here, and no GPU results recorded for 09_fused_gemv under data/results/: "
              "nothing to show. Run `python tools/bench_gemv.py` on a GPU to record them.")
    else:
        print(f"No GPU here: showing the results recorded in {run.path}\n  ({results.label(run.meta)})")
        print("  " + gemv.describe_kernels(run) + "\n")
        print(gemv.table(run))
        for c in run.meta.get("checks", []):
            print(f"  {c['name']:<40} {'x'.join(map(str, c['shape'])):>11} {c['dtype']}: within tolerance "
                  f"{c['ok']} (worst error/tolerance {c['worst_ratio']:.2g}), max |ours - bnb| "
                  f"{c['max_abs_diff_vs_bnb']:.3g}")
if run is not None:
    gemv.plot(run)

# %% [markdown]
# What to look for: our kernel against the dashed copy ceiling and the dotted 85% line, and against
# bitsandbytes' GEMV at 4096x14336 and 8192x28672 (the target: faster than bitsandbytes and at least
# 85% of the copy ceiling there); and the first version beside it, if the run has both. 4096x4096
# moves only 8 MB: launch and ramp-up take a large share of its few microseconds. Dequantize + matmul
# is far behind, as the byte count predicted. The variants of `VARIANTS` answer the design questions:
# more loads in flight per lane (C64, R4) against more warps (R1, R2 at 64 registers), split-K or not,
# bigger blocks, and whether keeping the weights out of L1 matters. After the first H100 run, which made
# R4 the default for large N, a second set probes the remaining gap: R4 with split-K (for N = 4096, where
# R4 alone has too few row groups), R4 allowed 128 registers (no spill, fewer instructions per weight),
# R4 in 512-thread blocks (whose 64-register cap spills), R3 (N/3 row groups fill more warp slots than
# N/4) and R8 (4 KB per warp in flight, with and without split-K). A plausible reading of C64's
# slowness, not verified with a profiler: a lane's two 16-byte loads are 32 bytes apart, so each load
# instruction of a warp uses half of every 32-byte sector it touches, and with the weights kept out of
# L1 the second load fetches the same sectors from L2 again. The variants after those (PRMT, X, Q16,
# H16) come from the profiling of section 6.
#
# ## 6. What limits it: the SM's load/store data pipe
#
# The default stops at about three quarters of the copy ceiling at 8192x28672 and near half at
# 4096x14336, while DRAM is far from busy. Nsight Compute (`python tools/profile_gemv.py --save` on a
# GPU, recorded in `data/ncu/<gpu>/09_fused_gemv.json`) says where the time goes. The column to read is
# the **data pipe**: every load or store that goes through an SM's L1/shared memory, the table reads
# included, passes its data stage one *wavefront* (up to 128 bytes) per cycle. A warp's table read
# returns 32 lanes x 8 bytes = 256 bytes, two wavefronts for 64 weights: one wavefront per 32 weights,
# whatever the layout, because a float32 NF4 value is 4 bytes. The codes, x, the scales and any spilled
# registers add their own. With W wavefronts per 1000 weights and one wavefront per cycle per SM, no
# kernel that moves them can exceed `SMs x clock / W` weights per second: the *pipe ceiling* the cell
# prints, in GB/s of weight bytes like the benchmark.
#
# What the profiles (table below) and the variants of section 5 show, on the H100:
# - The default's pipe is the busiest unit (`pipe %`, well above `DRAM %`), and shared-memory instructions
#   make most of its wavefronts (`shared/1k w` against `pipe/1k w`: the table alone is 31.25 per 1000
#   weights). Its pipe ceiling (last column) is barely above 85% of the copy at 8192x28672, where the
#   target would need the pipe busy nearly every cycle, and below 85% at 4096x14336, where 4 rows per
#   item load x for fewer weights than 8 rows do.
# - **PRMT** (a 64 KB table whose rows are 256 bytes, so that one byte permute `prmt` turns a code byte into
#   its table address): fewer SASS instructions per weight (section 3's report), and no faster.
#   Instructions were not the limit.
# - **X** (NF4 values from warp shuffles, lane l holding lut[l & 15], for some rows): as many
#   shared-memory wavefronts as the table. A shuffle goes through the same pipe as a table read. (Section
#   3's SASS counts for X are inflated: ptxas adds a fallback copy of the loop, each shuffle wrapped in
#   `WARPSYNC.COLLECTIVE`, which runs only if the warp arrives diverged; `BRA.DIV` picks the path.)
# - **Q16** (the absmax code table in 16 copies, no bank conflicts): a few shared-memory wavefronts fewer,
#   but more spilled registers (`pipe/1k w` does not drop): no faster.
# - **H16**, an experiment, *not exact*: the table holds fp16 pairs, so a read returns 4 bytes per code
#   byte, half the traffic. Its pipe is far from full and it is the fastest variant at 8192x28672, yet
#   still below 85%: issue slots and latency (16 warps per SM at 128 registers) take over. And its NF4
#   values are rounded (relative error up to 2^-11): not what bitsandbytes dequantizes to.
#
# A bound that holds for *any* GEMV, not just this design: it must read its weight bytes once.
# `python tools/gemv_read_bound.py` times a kernel that does nothing else (128-bit streaming loads, up to 8
# in flight per thread, the best of 16 configurations), exactly as the benchmark times the GEMV. The
# second cell prints it per shape beside the copy ceiling and our default. Where even a pure read of
# the weight stays below 85% of the copy ceiling (a 1 GiB copy), no GEMV can reach the target at that
# shape: a few-microsecond kernel pays its launch, the first loads' latency and its tail in full.
#
# So with an exact float32 table this kernel is bound by the data pipe, and 85% of the copy is out of reach.
# Beyond it (not built here): fewer non-table wavefronts (x kept in registers by giving each warp a fixed
# slice of K, no spills, codes through the TMA), or less table traffic with approximate values, which is
# what bitsandbytes' own GEMV does when it rounds every weight to bf16.

# %%
prof = gemv.load_ncu()
if prof is None:
    print("No Nsight Compute profiles recorded (data/ncu/<gpu>/09_fused_gemv.json): "
          "`python tools/profile_gemv.py --save` on a GPU records them.")
else:
    print(f"Recorded profiles ({results.label(prof['meta'])}; {prof['meta'].get('ncu', 'ncu')}):\n")
    print(gemv.ncu_table(prof))
    copy = bench.Run.load(gemv.NAME)
    copy_gbps = max((r["gbps"] for r in copy.records if r["name"] == gemv.COPY), default=None) if copy else None
    print(f"\n{'W (N x K)':>11}  {'variant':<22} {'measured GB/s':>14} {'pipe ceiling GB/s':>18}"
          + (f" {'ceiling / copy':>15}" if copy_gbps else ""))
    for r in prof["rows"]:
        N, K = (int(v) for v in r["shape"].split("x"))
        m, ceil = r["metrics"], gemv.pipe_ceiling_gbps(r["metrics"], N, K, prof["meta"].get("sms") or 132)
        print(f"{r['shape']:>11}  {r['variant']:<22} {gemv.weight_bytes(N, K) / m['time_us'] / 1e3:>14.0f} "
              f"{ceil:>18.0f}" + (f" {ceil / copy_gbps:>15.0%}" if copy_gbps else ""))
    if copy_gbps:
        print(f"\n(copy ceiling: {copy_gbps:.0f} GB/s, from {copy.path}; a profiled launch runs a little "
              "slower than the benchmark's CUDA-graph replays)")

# %%
bound = bench.Run.load("09_read_bound")
if bound is None:
    print("No read-only bound recorded (data/results/<gpu>/09_read_bound.json): "
          "`python tools/gemv_read_bound.py` on a GPU records it.")
else:
    print(f"Read-only bound, {results.label(bound.meta)}:\n")
    print(gemv.read_bound_table(bound, bench.Run.load(gemv.NAME)))

# ## 7. Batch: up to 8 rows of x
#
# Speculative decoding and small-batch serving multiply a few rows of activations by the same
# weights. The kernel above takes `Design(m=M)`: per item each lane reads its codes once, looks each
# byte pair up once, and does M FMAs with it, one per row of x, into R x M partial sums; the scale
# still multiplies once per 32 columns. The weights are read once whatever M is, so the bytes stay
# those of section 1, but the work per byte grows M-fold: converting M activations and M FMAs per
# weight. The recorded SASS report (section 3's `data/sass/09_fused_gemv.json`, rows with m > 1) shows
# the instructions per weight growing with M, so we expect the kernel to become bound by instructions
# rather than bytes from M of about 2 on, which is where tensor cores take over (section 8).
# bitsandbytes' `matmul_4bit` does not use its GEMV kernel for M > 1: it dequantizes the whole weight
# to bf16/fp16 and calls a matmul, so by section 1's byte model it moves about 9x our bytes.

# %%
for (N, K, M, dtype) in [(9, 192, 3, "bf16"), (6, 320, 8, "fp16")]:
    gc = gemv.make_gemv_case(N, K, dtype, M=M, seed=7)
    g = gemv.make_gemv_buffers(gc)
    launch(g)
    print(gemv.check(g.result(), gc, name=f"fused {N}x{K} {dtype}, batch M={M} [{auto_design(N, M).name}]"))

# %% [markdown]
# On a GPU, `python tools/bench_gemv.py` also times M = 2, 4, 8 against bitsandbytes' `matmul_4bit`
# (dequantize + matmul at M > 1) and `dequantize_4bit` + `torch.matmul`, and saves
# `data/results/<gpu>/09_fused_gemv_batch.json`. The plot shows effective weight bandwidth per M. For
# M > 1 `auto_design` takes 4 rows, which shares each converted activation among 4 rows and so needs fewer
# instructions per weight (the SASS report's m > 1 rows), at 128 registers and with spills from M = 4 on;
# it beat 2 rows at every M in the H100 run, and `BATCH_VARIANTS` keeps the 2-row design beside it.

# %%
run_b = bench.Run.load(gemv.NAME_BATCH)
if run_b is None:
    print("No batch results recorded yet (data/results/<gpu>/09_fused_gemv_batch.json does not exist): "
          "nothing to plot. `python tools/bench_gemv.py` on a GPU records them.")
else:
    print(f"Batch results recorded in {run_b.path} ({results.label(run_b.meta)}):\n")
    print(gemv.table(run_b))
    gemv.plot_batch(run_b)

# %% [markdown]
# ## 8. Reading: what Marlin does beyond this
#
# For batch 1 the whole game is streaming the weights once at full bandwidth, which a kernel with
# enough 128-bit loads in flight can do. With a batch of 16-64 tokens (speculative decoding, batched
# serving) the same weight bytes feed M rows of activations, the arithmetic grows M-fold and
# CUDA cores become the bottleneck, as section 7 showed already at M = 8. Marlin (Frantar, Castro et
# al., IST Austria, 2024, "MARLIN: Mixed-Precision Auto-Regressive Parallel Inference on Large
# Language Models") keeps the kernel memory-bound up to batch 16-32 with:
#
# - **Tensor cores**: `mma.sync m16n8k16` on fp16; the 4-bit weights are dequantized in registers
#   straight into the fragment layout the MMA expects. The weights are **reshuffled offline** so
#   that one 128-bit load gives a thread exactly the codes of its fragments, and dequantization uses
#   bit tricks (`lop3` plus a magic-number fp16 subtraction) instead of a table.
# - **Asynchronous copies**: `cp.async` global-to-shared loads in a multi-stage pipeline (4 stages),
#   with an evict-first cache hint on weights (read once) while activations stay in L2; the next
#   tiles load while tensor cores work on the current one. Our kernel's two-item register pipeline
#   is the same idea without shared memory.
# - **Striped partitioning**: instead of one output tile per block, each SM takes a stripe of tiles
#   across several output columns and the K dimension, so that all SMs are busy for any shape, and
#   partial sums of tiles split along K are reduced in a global-memory buffer with a lock-step
#   ("serial") reduction. Our split-K teams do the same inside a block, through shared memory.
# - **Layout of the scales** per group of 128, applied once per tile, and double buffering of
#   shared memory to hide latency.
#
# The Chinese walk-through in `shared/seeds/001_2aefac3babe15ae3.txt` traces `marlin_cuda` on a
# 128x256x768 problem: `thread_k`/`thread_n` tile choice (128x128 for m <= 16, else 64x256), the
# 16x16 tiles of `m16n8k16`, and how the stripes are assigned to SMs.
#
# ## 9. Exercise: the reduction is wrong
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
        launch(g, design=Design(), kern=make_gemv(True, Design(), reduce=warp_sum_ex))
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
