# 05 -- Where the 16-entry LUT lives: constant memory, shared memory, or registers.
#
# Percent-format source of notebooks/05_shared_lut.ipynb
# (build: python tools/build_notebooks.py 05_shared_lut).

# %% [markdown]
# # 05 · Where the LUT lives: constant, shared, or registers
#
# **Goal.** Every weight is `LUT[q] * scale` with `q` a 4-bit code. In step 04 the 16-entry
# table is a global array, read 8 times per packed word, which we expect L1 (the SM's own cache
# for global loads, sharing its on-chip storage with shared memory from compute capability 7.0 on: CUDA
# C++ Programming Guide, "Compute Capabilities", the shared-memory sections for 7.x, 8.x and 9.0) to
# serve: 04's PTX showed the
# table's loads as `ld.global.f32` with no cache operator, which defaults to `.ca`, "cache at all
# levels" (PTX ISA, "Cache Operators"); nothing here measures the hit rate. Here we rebuild 04's
# coalesced kernel as a factory and vary *only* where the table lives, three ways, measured side
# by side with the factory's own kernel that reads the table from global memory: **constant memory**
# (`cuda.const.array_like`: a small read-only space of device memory that each SM reads through its own
# constant cache), **shared memory** (filled by the first 16 threads of the block), and
# **registers** (a tree of `selp` instructions, no memory at all: `selp.f32 d, a, b, p` is PTX's
# select, `d = p ? a : b`, numba's `cuda.selp(p, a, b)`). The PTX shows each placement;
# the benchmark decides, against that global-table kernel as the baseline, in the same run.
#
# **Contents**
# 1. [Prediction: how each placement serves a warp](#prediction)
# 2. [The kernel, with the table as a parameter](#kernel)
# 3. [PTX evidence](#ptx)
# 4. [Verification](#verify)
# 5. [Benchmark](#bench)
# 6. [What we learned](#learned)
# 7. [Exercise](#exercises)

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import re

import numpy as np
from numba import cuda

from nf4lab.measure import bench, ptx
from nf4lab.lesson import plots
from nf4lab.harness import versions

print(nf4lab.describe())
case = nf4lab.make_case()
print(case)

# packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2(blocksize)
SIG = ("(uint8[::1], uint32[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, "
       "uint16[::1], uint32[::1], uint64, uint64)")

# %% [markdown]
# <a id="prediction"></a>
# ## 1. Prediction: how each placement serves a warp
#
# A warp looks up 32 codes at once, and with random weights the 32 codes are spread over the 16
# entries; each placement serves such a lookup its own way.
#
# | placement | one warp lookup with k distinct codes | cost |
# | --- | --- | --- |
# | constant memory | the constant cache serves a warp's distinct addresses **one after another**, each broadcast (one read serves every lane that asked for that address) | k passes, one after another (up to 16) |
# | shared memory | 16 entries in 16 different banks; equal addresses broadcast | one pass: no bank conflict |
# | registers (`selp` tree) | no memory access; 15 selects per lookup | arithmetic instructions (the SM's integer and floating-point units), the same for any k |
# | global (step 04) | cached in L1 like any load, if the 64 bytes stay there | a load through the L1 path |
#
# The first two rows are the CUDA C++ Programming Guide's rules ("Device Memory Accesses",
# Constant Memory: a request is split into as many requests as there are different addresses in
# it; and the "Shared Memory" sections of the compute capabilities, 5.x and later: banks and
# broadcast); the costs are what we expect from them. A *replay* here is the constant cache's (not the
# CUDA-graph replays the benchmarks time, 00): the constant cache serves one address per pass, so a
# warp's request with k distinct addresses takes k passes, one after another; the passes after the
# first are replays. Constant memory is built for the opposite
# access pattern (all lanes reading the same value).
# We predict shared memory to be the fastest of the three, but not clearly faster than the
# factory's global-table baseline: those 64 bytes are read by every warp all the time, so they should stay in L1.
# Whether the select tree's extra instructions hide behind memory time in a memory-bound kernel
# is for the measurement to answer.

# %%
# The bytes of up to 256 groups of 32 consecutive words, one warp lookup each.
nbytes = min(case.packed.size // 128, 256) * 128
codes = case.packed[:nbytes].reshape(-1, 128)[:, 0::4] >> 4   # byte 0 of each lane's word: one warp lookup, real data
distinct = np.array([len(np.unique(w)) for w in codes])
print(f"distinct codes per warp lookup on this case: mean {distinct.mean():.1f}, "
      f"min {distinct.min()}, max {distinct.max()} (of 16)")
# Where the 64-byte table starts decides whether a warp's lookups can stay in one 128-byte line (the line
# size of global memory's caches: CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory", as in 02).
lut = nf4lab.make_buffers(case).lut
iface = getattr(lut, "__cuda_array_interface__", None) or lut.__array_interface__
start = iface["data"][0] % 128
print(f"the table (b.lut, made by make_buffers as the benchmark's are) starts at byte {start} of a 128-byte line: "
      f"its {lut.nbytes} bytes span {1 + (start + lut.nbytes - 1) // 128} line(s)"
      + ("" if nf4lab.ON_GPU else " (simulator: a host array's address, not where a GPU would place it)"))

# %% [markdown]
# Most of the 16 entries are asked for in every warp lookup (printed above), so we expect
# the constant cache to replay nearly every lookup many times: 8 lookups per packed word, for every
# word.

# %% [markdown]
# <a id="kernel"></a>
# ## 2. The kernel, with the table as a parameter
#
# The kernel is a rebuild of step 04's version B (16-byte load, shared-memory exchange,
# warp-contiguous 16-byte stores): the same access pattern, with the word converter a loop over a
# local array and the tail written out in the kernel; section 5 times it against 04's kernel.
# `make_kernel(make_table, lookup)` builds it with two plug-ins:
#
# * `make_table(lut)` runs once per thread at the start and returns the table: the constant
#   array, the shared array (after the first 16 threads filled it and the block synchronized),
#   or the `lut` argument itself (`no_table`): the global table, which the baseline reads with
#   `index_lookup` and the register version ignores;
# * `lookup(table, q)` returns entry `q`.
#
# numba compiles each kernel with its plug-ins inlined (they are module-level functions the
# factory closes over), so the four kernels it builds (the three tables and a global-table
# baseline) differ in exactly those lines.
#
# A numba lesson on the way: device functions with `inline="always"` are inlined at the level of
# numba's own IR (its intermediate representation, built from Python bytecode before typing, not the
# LLVM IR of 04), and each call site is typed again, so we expect compilation time to grow with every call
# site (not measured here).
# The select tree is 15 `selp` calls and a word needs 8 lookups, so the word converter loops over
# its 4 bytes instead of spelling out 8 calls: 2 call sites, unrolled later by LLVM (the local
# array `pairs` becomes registers: the PTX has no `ld.local`). A `cuda.local.array` is per-thread memory: unless the
# compiler keeps it in registers it lives in off-chip *local memory*, read with `ld.local`.

# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab.device import ops
from nf4lab.lesson import block_scale  # 01's scale, both operations rounded (never an FMA)
from nf4lab.lesson import check_vector_buffers  # 04's: bf16 only, 16-byte aligned, before any launch
from nf4lab.format.reference import NF4_LUT

NIB = uint32(15)
U1 = uint64(1)
NF4 = tuple(float32(v) for v in NF4_LUT)   # 16 float32 constants, for the register version
THREADS = 128
WARPS = THREADS // 32
ROW = 128 + 128 // 32                      # 128 words per warp + one padding word per 32


# ---- the three placements: make_table(lut) -> table, lookup(table, q) -> float32
@cuda.jit(device=True, inline="always")
def const_table(lut):
    return cuda.const.array_like(NF4_LUT)      # constant memory, filled when the module loads


@cuda.jit(device=True, inline="always")
def shared_table(lut):
    table = cuda.shared.array(16, float32)
    if cuda.threadIdx.x < 16:                  # the first 16 threads copy the table ...
        table[cuda.threadIdx.x] = lut[cuda.threadIdx.x]
    cuda.syncthreads()                         # ... and everyone waits until it is there
    return table


@cuda.jit(device=True, inline="always")
def no_table(lut):
    return lut                                 # the global table: the baseline reads it, the select tree ignores it


@cuda.jit(device=True, inline="always")
def index_lookup(table, q):
    return table[q]


@cuda.jit(device=True, inline="always")
def select_lookup(table, q):
    """NF4[q] by a binary tree of selects on the bits of q: 8 + 4 + 2 + 1 selp, no memory."""
    b = (q & U1) != 0
    e0 = cuda.selp(b, NF4[1], NF4[0])
    e1 = cuda.selp(b, NF4[3], NF4[2])
    e2 = cuda.selp(b, NF4[5], NF4[4])
    e3 = cuda.selp(b, NF4[7], NF4[6])
    e4 = cuda.selp(b, NF4[9], NF4[8])
    e5 = cuda.selp(b, NF4[11], NF4[10])
    e6 = cuda.selp(b, NF4[13], NF4[12])
    e7 = cuda.selp(b, NF4[15], NF4[14])
    b = (q & uint32(2)) != 0
    f0 = cuda.selp(b, e1, e0)
    f1 = cuda.selp(b, e3, e2)
    f2 = cuda.selp(b, e5, e4)
    f3 = cuda.selp(b, e7, e6)
    b = (q & uint32(4)) != 0
    g0 = cuda.selp(b, f1, f0)
    g1 = cuda.selp(b, f3, f2)
    return cuda.selp((q & uint32(8)) != 0, g1, g0)


# ---- the step-04 kernel (version B), with the table plugged in
@cuda.jit(device=True, inline="always")
def padded(k):
    return k + (k >> 5)


def make_kernel(make_table, lookup):
    @cuda.jit(device=True, inline="always")
    def bf16_word(w, table, s):
        """One packed word (8 weights) -> 4 uint32 of bf16 pairs, high nibble first."""
        pairs = cuda.local.array(4, uint32)
        for p in range(4):
            byte = w >> uint32(8 * p)
            pairs[p] = ops.pack_bf16x2(lookup(table, (byte >> 4) & NIB) * s, lookup(table, byte & NIB) * s)
        return pairs[0], pairs[1], pairs[2], pairs[3]

    @cuda.jit
    def kernel(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        table = make_table(lut)
        stage = cuda.shared.array((WARPS, ROW), uint32)
        lane = uint64(cuda.threadIdx.x % 32)
        warp = uint64(cuda.threadIdx.x // 32)
        c = uint64(cuda.grid(1))
        w0 = w1 = w2 = w3 = uint32(0)
        if (c << 5) < n:
            w0, w1, w2, w3 = ops.load_u32x4(packed_u32, c << 2)
        k = lane << 2
        stage[warp, padded(k)] = w0
        stage[warp, padded(k + U1)] = w1
        stage[warp, padded(k + uint64(2))] = w2
        stage[warp, padded(k + uint64(3))] = w3
        cuda.syncthreads()
        warp_word0 = (c - lane) << 2
        for j in range(4):
            k = lane + (uint64(j) << 5)
            word = warp_word0 + k
            first = word << 3
            if first < n:
                s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
                if first + uint64(8) <= n:
                    a0, a1, a2, a3 = bf16_word(stage[warp, padded(k)], table, s)
                    ops.store_u32x4(out_u32, word << 2, a0, a1, a2, a3)
                else:                                   # the tail: weights first .. n-1
                    i = first
                    while i < n:
                        byte = uint32(packed[i >> 1])
                        q = (byte >> 4) if (i & U1) == 0 else (byte & NIB)
                        out[i] = ops.to_bf16_bits(lookup(table, q) * s)
                        i += U1

    return kernel


dequant_const = make_kernel(const_table, index_lookup)
dequant_shared = make_kernel(shared_table, index_lookup)
dequant_select = make_kernel(no_table, select_lookup)


def launcher(kernel, nf4_only):
    def launch(b):
        check_vector_buffers(b)
        if nf4_only and b.case.quant_type != "nf4":
            raise ValueError(f"this kernel has the NF4 table built in, the case is {b.case.quant_type}")
        chunks = (b.n + 31) // 32
        kernel[(chunks + THREADS - 1) // THREADS, THREADS, b.stream](
            b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
            np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))
    return launch


VERSIONS = {
    "05 LUT in constant memory": launcher(dequant_const, nf4_only=True),
    "05 LUT in shared memory": launcher(dequant_shared, nf4_only=False),
    "05 LUT in registers (selp tree)": launcher(dequant_select, nf4_only=True),
}
BASELINE = "05 baseline: LUT in global memory"   # section 5's baseline, the table in global memory (06 times it too)
BASELINE_LAUNCH = launcher(make_kernel(no_table, index_lookup), nf4_only=False)

# %% [markdown]
# <a id="ptx"></a>
# ## 3. PTX evidence
#
# Constant: the lookups are `ld.const.f32`. Shared: `ld.shared.f32` (and the one `ld.shared.u32`
# of the exchange, plus the fill and `bar.sync`). Registers: neither; the lookups became `selp.f32`
# with the NF4 values as immediate operands (constants encoded in the instruction itself; `0fBF800000` is -1.0). All three keep the 16-byte
# load and store, and no `fma`.

# %%
KERNELS = {"constant": dequant_const, "shared": dequant_shared, "registers": dequant_select}
ptxs = {}
for where, kernel in KERNELS.items():
    ptxs[where] = p = nf4lab.compile_ptx(kernel, SIG)
    print(f"--- LUT in {where}")
    ptx.show(p, [r"^ld\.(const|shared)\.f32", r"^selp\.f32"], limit=3)
    print()

common_present = [r"^ld\.global\.v4\.u32", r"^st\.global\.v4\.u32", r"^cvt\.rn\.bf16x2\.f32"]
common_absent = [r"^fma", r"\.f64\b", r"^ld\.local"]
ptx.check(ptxs["constant"], present=common_present + [r"^ld\.const\.f32"],
          absent=common_absent + [r"^ld\.shared\.f32", r"^selp\.f32"])
ptx.check(ptxs["shared"], present=common_present + [r"^ld\.shared\.f32", r"^bar\.sync"],
          absent=common_absent + [r"^ld\.const", r"^selp\.f32"])
ptx.check(ptxs["registers"], present=common_present + [r"^selp\.f32"],
          absent=common_absent + [r"^ld\.const", r"^ld\.shared\.f32"])
# A static count: instructions in the PTX text, not lookups executed at run time. The PTX is cut into its basic
# blocks (straight runs of instructions between labels, which branches jump to; cut here at the labels): the basic
# block with the 16-byte store converts one whole word (8 weights) and runs once per
# word, up to 4 times per thread (the loop over j); the other lookups are in the tail's code.
LOOKUP = r"^(ld\.(const|shared)\.f32|selp\.f32)"
print("lookup instructions (ld.const.f32, ld.shared.f32 or selp.f32) in each kernel's PTX, a static count:")
for where, p in ptxs.items():
    blocks = re.split(r"^\$L\w*:", p, flags=re.MULTILINE)
    word = sum(ptx.count(b, LOOKUP) for b in blocks if ptx.count(b, r"^st\.global\.v4"))
    total = ptx.count(p, LOOKUP)
    print(f"  {where}: {total} in all; {word} in the basic block that converts a whole word and stores it "
          f"({word / 8:g} per weight, run once per word), {total - word} in the tail's code")

# %% [markdown]
# <a id="verify"></a>
# ## 4. Verification

# %%
nf4lab.verify_versions(VERSIONS, case);

# %% [markdown]
# <a id="bench"></a>
# ## 5. Benchmark
#
# The three placements in one run, with the ceilings, bitsandbytes and the baseline: the same
# kernel with the table left in global memory (`make_kernel(no_table, index_lookup)`), so that the
# table's place is the one thing that differs. Step 04's coalesced kernel itself (loaded from
# notebook 04's kernel cells) runs too: against 04's own record of it, it shows how far one kernel
# moves between two runs, and against the baseline what 05's rewrite of the kernel (the factory's
# loop over a local array, the tail written out in the kernel) changed. Then every step so far: each kernel gets one bar, taken
# from the latest step whose recorded run timed it (the kernels timed here, from this run); a bar
# from another run says so in its label, "(NN's run of <date>)", NN the notebook whose run it is.
# Only bars of one run compare directly with each other and with the ceiling lines, which are this run's.

# %%
# The contract: one size, 16384 x 16384 -> bf16 (make_case's default on a GPU); each version timed
# in one run against the copy and fill ceilings, the traffic-matched bound of 00 and bitsandbytes;
# GB/s = bytemodel.bytes_moved(n, "bf16", 64) / GPU time (median of CUDA-graph replays, as in 00).
K04 = "04 16B loads, coalesced stores"
v04 = versions.load("04_vector_loads")
run = bench.step("05_shared_lut", {**VERSIONS, BASELINE: BASELINE_LAUNCH, K04: v04[K04]})
if run is not None:
    if run.recorded:                 # no GPU: a recorded run, so print its table (on a GPU bench.step printed it)
        print(run.table())
    ks = sorted(run.kernels(), key=lambda r: r["ms"])
    if ks:
        # Neighbours judged as the verdicts are (bench.noise_band): "~" within the margin, their order not
        # measured; "<~" near, past it but within twice it, an order one run does not settle; "<" beyond.
        # The bands are judged on the times as printed (to 0.1 us), so the printed numbers reproduce them.
        us = [round(k["ms"] * 1e3, 1) for k in ks]
        bands = [bench.noise_band(100 * (b / a - 1)) for a, b in zip(us, us[1:])]
        print("\nfastest to slowest: " + ks[0]["name"] + f" ({us[0]:.1f} us)" + "".join(
            {"within": " ~ ", "near": " <~ ", "beyond": " < "}[band] + f"{k['name']} ({t:.1f} us)"
            for band, k, t in zip(bands, ks[1:], us[1:])))
        if "near" in bands:
            print(f"(<~: near, past the {bench.NOISE_PCT}% noise margin but within twice it: re-run to confirm)")
    g, sh, k04 = run.get(BASELINE), run.get("05 LUT in shared memory"), run.get(K04)
    if k04:
        # The same kernel in two runs: 04's kernel here against 04's own record of it: how far it moved.
        r04 = bench.Run.load("04_vector_loads")
        there = r04.get(K04) if r04 is not None else None
        if there:
            print(bench.run_to_run(K04, k04, r04, "04"))
        if g:
            d = bench.change_pct(g, k04)   # from the GB/s the table prints
            print(f"05's rebuild of it (the baseline) against 04's kernel, this run: {d:+.1f}% (" + {
                "within": f"within the {bench.NOISE_PCT}% noise margin: no difference measured",
                "near": f"near: past the {bench.NOISE_PCT}% noise margin but within twice it, re-run to tell",
                "beyond": f"beyond twice the {bench.NOISE_PCT}% noise margin"}[bench.noise_band(d)] + ")")
    if g and sh:
        gain = bench.change_pct(sh, g)   # from the GB/s as printed
        print(f"shared table against global table: {g['gbps']:.0f} -> {sh['gbps']:.0f} GB/s ({gain:+.1f}%), "
              f"noise margin {bench.NOISE_PCT}%")
        # Whose numbers these are: this run's, or a recorded GPU's (no GPU here).
        where = "on this GPU" if not run.recorded else f"on the {run.meta.get('gpu', 'recorded GPU')} (recorded)"
        band = bench.noise_band(gain)   # the series' one margin: a near change decides nothing
        if band == "within":
            print(f"-> within the {bench.NOISE_PCT}% noise margin: {where} the shared table gains nothing "
                  "measurable over the global one")
        elif band == "near":
            print(f"-> near (past the {bench.NOISE_PCT}% noise margin but within twice it): {where} the shared table "
                  f"may be {'faster' if gain > 0 else 'slower'} than the global one; one run does not settle it, "
                  "re-run to confirm")
        else:
            print(f"-> beyond twice the {bench.NOISE_PCT}% noise margin: {where} the shared table is "
                  f"{'faster' if gain > 0 else 'slower'} than the global one")
    elif sh:
        print("(this recorded run predates the global-table baseline: run the notebook on a GPU to measure it)")
    for label, name in (("the select tree", "05 LUT in registers (selp tree)"),
                        ("the constant-memory table", "05 LUT in constant memory")):
        other = run.get(name)
        if g and other:
            print(f"{label} takes {other['ms'] / g['ms']:.2f}x the global table's time, in this run")

# %%
plots.progress("05_shared_lut");

# %% [markdown]
# <a id="learned"></a>
# ## 6. What we learned
#
# Read the ranking off the "fastest to slowest" line the benchmark cell printed: it holds this run's
# kernels only, and its bands are judged on the times it prints; "~" joins two whose times lie
# within the noise margin, and "<~" two that lie past it but within twice the margin ("near": one
# run does not settle their order). The line compares each kernel with its neighbour only: the verdict
# lines under it compare the shared and global tables directly, and decide between them. In the plot, a hatched bar labelled with another notebook's
# run is context from that run, not part of this ranking. The mechanisms behind the ranking:
#
# * **Global memory is already fine for this table** when the benchmark above finds the shared
#   table no faster (within the noise margin, or slower). The likely reason: the table is 16
#   floats, 64 bytes, read by every warp all the time, so it should stay in L1, and we expect a
#   warp's lookup of up to 16 addresses to be one L1 access, like a shared-memory lookup, when
#   the 64 bytes lie in one 128-byte line (the caches' line size, as 02 cites it; section 1 printed how many lines a table,
#   allocated as the benchmark's are, spans; a table that straddles two would need two). This
#   notebook times the kernels; it does not count cache hits or L1 accesses.
#   There, what shared memory buys is a guarantee rather than speed: the table cannot be evicted
#   by the data streaming through L1 (a kernel with more traffic or a different cache split may
#   see misses), and 16 entries in 16 banks with same-address broadcast are conflict-free by
#   construction. Measuring the baseline
#   is the lesson: an optimization that wins nothing on the GPU in hand is named as such. Where
#   the shared table came out slower by more than twice the margin, its per-block fill and `syncthreads` (third
#   bullet) are the likely cost: an expectation, not measured here.
# * **Constant memory** is for uniform access: the constant cache serves the distinct addresses
#   of a warp's request one after another. A LUT indexed by data is the worst case for it; the
#   benchmark above prints the constant-memory table's time against the global table's: where that
#   ratio is well above 1x, the constant cache's replays are likely not hidden and set the kernel's
#   time rather than DRAM
#   (not measured here).
# * **Shared memory** serves 32 lanes in one pass when they hit different banks or the same
#   address. 16 consecutive floats occupy 16 different banks, so a table lookup never conflicts.
#   It costs a fill and one `syncthreads` per block.
# * **Registers** avoid memory altogether but pay 15 `selp` per lookup, 120 per packed word:
#   whether that is hidden depends on how much time the kernel spends waiting for DRAM anyway.
#   The benchmark above prints the select tree's time against the global table's: where that ratio
#   is well above 1x, the selects are likely not hidden, and the kernel's time is then probably set by
#   their issue rather than by DRAM; not measured here.
#   (`data/results/<gpu>/05_shared_lut.json` holds the runs of each GPU recorded: records of two
#   GPUs are two runs, so compare each GPU's select tree with its own global table, then the two
#   ratios, not the times across GPUs.)
# * In numba, constant memory is `cuda.const.array_like(a_global_numpy_array)`, shared memory
#   `cuda.shared.array(shape, dtype)` plus an explicit barrier, and values in registers are
#   Python constants (`float32(...)` globals) frozen into the code.
#
# Next, [06 · output dtypes and the memory wall](06_output_dtypes.ipynb): one kernel for bf16,
# fp16 and fp32, and the last steps to the traffic-matched bound (the memory wall).

# %% [markdown]
# <a id="exercises"></a>
# ## 7. Exercise: a second table
#
# bitsandbytes has a second 4-bit format, **fp4**, with its own 16 values
# (`nf4lab.format.reference.lut_for("fp4", device)`). A case made with `quant_type="fp4"` carries that
# table in `b.lut`. Write `launch_fp4(b)` and the kernel it launches on fp4 cases,
# `dequant_const_fp4`, bit-exact, with the table in **constant memory**. The check also reads that
# kernel's PTX for constant-memory lookups (`ld.const.f32`): section 2's shared-memory kernel is
# bit-exact on fp4 too, but it is not this exercise.
#
# **Predict first:** the starting point below launches `dequant_const`, section 2's
# constant-memory kernel, on fp4 cases. Which of its outputs will be right, and why? Answer from
# section 2's kernel cell and fp4's 16 values (print `nf4lab.format.reference.lut_for("fp4",
# case.device)` beside `NF4_LUT`), then run the cell and compare.
#
# One trap: bitsandbytes has two fp4 tables one signed zero apart. For code 8 its CUDA kernel
# gives **-0.0**, and so does its scalar CPU loop; only its table-based CPU paths (the torch
# fallback and the AVX-512 kernel) give +0.0 (`FP4_LUT_CUDA` and `FP4_LUT` in `nf4lab.format.reference`;
# the docstring of `nf4lab/kernels/fastkernel.py` says why for CUDA, `bnb_cpu_path` in
# `nf4lab/kernels/dequant.py` which CPU path runs when). Bit-exact includes the sign of zero, so
# take the table of the bitsandbytes that made the cases: `lut_for("fp4", case.device)` (CUDA on
# a GPU; in the simulator the +0.0 table, right for this exercise's shapes: their last dimension
# is odd, which sends bitsandbytes' CPU code to its torch fallback).

# %%
### BEGIN SOLUTION
from nf4lab.format.reference import lut_for

# fp4 code 8 is -0.0 in bitsandbytes' CUDA kernel and +0.0 in its table-based CPU paths (the trap
# above): take the table of the device that made the cases (CUDA on a GPU, CPU in the simulator).
FP4_TABLE = lut_for("fp4", case.device)


@cuda.jit(device=True, inline="always")
def const_table_fp4(lut):
    return cuda.const.array_like(FP4_TABLE)


dequant_const_fp4 = make_kernel(const_table_fp4, index_lookup)


def launch_fp4(b):
    check_vector_buffers(b)
    kernel = {"nf4": dequant_const, "fp4": dequant_const_fp4}[b.case.quant_type]
    chunks = (b.n + 31) // 32
    kernel[(chunks + THREADS - 1) // THREADS, THREADS, b.stream](
        b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
        np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))
### STUDENT
# TODO: predict, run, then make this launch bit-exact on fp4 cases with the table in constant
# memory (about 10 lines).
dequant_const_fp4 = dequant_const   # the starting point: section 2's kernel, NF4's table


def launch_fp4(b):
    check_vector_buffers(b)
    chunks = (b.n + 31) // 32
    dequant_const_fp4[(chunks + THREADS - 1) // THREADS, THREADS, b.stream](
        b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
        np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))
### END SOLUTION


from nf4lab.lesson import exercises   # noqa: E402  (the graders of the series' exercises)

result = exercises.check_const_table(launch_fp4, dequant_const_fp4, SIG)   # bit-exact on fp4, then the PTX
### BEGIN SOLUTION
assert result
# The shared-memory kernel copies whatever table the launch passes, fp4's included (bit-exact), but its
# lookups are not constant-memory ones: the exercise's check refuses it
assert nf4lab.check(VERSIONS["05 LUT in shared memory"], name="section 2's shared-memory kernel on fp4",
                    quant_type="fp4", shapes=exercises.CONST_TABLE_SHAPES)
assert not exercises.check_const_table(VERSIONS["05 LUT in shared memory"], dequant_shared, SIG,
                                       name="section 2's shared-memory kernel, graded as the exercise", verbose=False)


def launch_as_given(b):   # the starting point, unchanged: the prediction's answer, printed
    chunks = (b.n + 31) // 32
    dequant_const[(chunks + THREADS - 1) // THREADS, THREADS, b.stream](
        b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
        np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))


given = nf4lab.check(launch_as_given, name="the starting point, fp4", quant_type="fp4", shapes=((3, 5),),
                     verbose=False)
print(given.report if given.report is not None else given.error or "bit-exact: not what we predicted")
### STUDENT
### END SOLUTION

# %% [markdown]
# ### BEGIN SOLUTION
# *What to notice:* none of the starting point's outputs could be right: the kernel holds NF4's
# 16 values, compiled in, whatever `b.lut` holds, and no code has the same value in NF4 and in
# fp4, so with a nonzero scale every weight comes out wrong (the report printed above counts the
# wrong weights of its 3x5 case). In numba a constant array (`cuda.const.array_like`) is compiled
# into the module with its values, and instruction constants are part of the code: both are fixed
# when the kernel is compiled, so each table needs its own kernel here (CUDA C++ can rewrite a
# `__constant__` array between launches, with `cudaMemcpyToSymbol`) (and
# section 2's launch functions for those two refuse fp4 cases); the shared-memory kernel copies
# whatever table the launch passes and serves fp4 unchanged (the second check above), though the
# exercise's check refuses it: its PTX has no `ld.const.f32`.
# Flexibility is an argument for shared (or global) memory whatever the measured speed.
# ### STUDENT
# *What to notice:* once your kernel passes: section 2's launch functions let the shared-memory
# kernel run on fp4 cases (`nf4_only=False`) and refuse them for the other two. Why can the
# shared-memory kernel serve any 16-entry table unchanged, and what would have to change in the
# constant-memory and register kernels for them to do the same?
# ### END SOLUTION
