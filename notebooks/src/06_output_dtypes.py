# 06 -- One kernel for bf16, fp16 and fp32 output, each bit-exact, measured against the memory wall.
#
# Percent-format source of notebooks/06_output_dtypes.ipynb
# (build: python tools/build_notebooks.py 06_output_dtypes).

# %% [markdown]
# # 06 · bf16, fp16 and fp32 output, against the memory wall
#
# **Goal.** bitsandbytes dequantizes to bf16, fp16 or fp32, and our kernel must match it bit for
# bit in each. We write **one kernel source** and let numba compile a specialised kernel per output
# dtype, choosing the conversion at compile time: `cvt.rn.bf16x2.f32` for bf16, `cvt.rn.f16x2.f32`
# for fp16, the float32 bits themselves for fp32. Given the same float32 value (each multiply and
# add rounded on its own, never an FMA), that rounding instruction decides the output bits (fp32
# has none), and the PTX shows which one each kernel carries. The kernel also changes the
# access pattern of 04 and 05 (no shared-memory exchange); the benchmark times it beside 05's
# kernels in the same run, kernel against kernel, and compares it with the faster of them in that run. The memory
# wall of the title is 00's traffic-matched bound: the same bytes moved with no floating-point arithmetic, timed beside
# each kernel in section 6. Section 7 shows what a T4 (sm_75), which lacks the sm_80
# conversion instructions, runs instead.
#
# **Contents**
# 1. [Prediction](#prediction)
# 2. [The access pattern, against 04 and 05](#design)
# 3. [The kernel](#kernel)
# 4. [PTX evidence, per dtype](#ptx)
# 5. [Verification, per dtype](#verify)
# 6. [Benchmark](#bench)
# 7. [Older GPUs: the sm_75 (T4) path](#sm75)
# 8. [What we learned](#learned)
# 9. [Exercise](#exercises)

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import numpy as np
from numba import cuda

from nf4lab.measure import bench, provenance, ptx, results
from nf4lab.format import bytemodel
from nf4lab.lesson import plots
from nf4lab.harness import versions

print(nf4lab.describe())
cases = {d: nf4lab.make_case(dtype=d) for d in ("bf16", "fp16", "fp32")}   # default shape
for c in cases.values():
    print(c)


def sig(dtype):
    """Argument types for compiling PTX: the output array is uint16 bits, or uint32 for fp32."""
    out = "uint32" if dtype == "fp32" else "uint16"
    return ("(uint8[::1], uint32[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, "
            f"{out}[::1], uint32[::1], uint64, uint64)")

# %% [markdown]
# <a id="prediction"></a>
# ## 1. Prediction
#
# The byte model: the inputs are the same for every dtype, the output is 2 or 4 bytes per weight.
# The time at the copy ceiling (measured in 00, on the GPU model its label names, in another run),
# bytes / bandwidth, is a reference
# point, not a floor: our traffic is write-mostly (fp32's most of all: it writes twice the output
# bytes, and the cell prints its total against bf16's), and the write-only fill ceiling can be
# faster than the copy, so the cell also prints fp32's time at the fill ceiling. Section 6 judges every dtype against the
# traffic-matched bound (the same bytes moved with no floating-point arithmetic) and prints the copy and the
# write-only fill beside it.

# %%
N_BIG = 16384 * 16384
ceil = bench.Run.load("00_ceiling")
copy = ceil.get(bench.COPY) if ceil is not None else None
fill = ceil.get(bench.FILL) if ceil is not None else None
if copy:
    print(f"ceilings from notebook 00's run: {results.label(ceil.meta, ceil.path)}")
for d in ("bf16", "fp16", "fp32"):
    nbytes = bytemodel.bytes_moved(N_BIG, d)
    line = f"16384 x 16384 -> {d}: {nbytes / 1e6:.0f} MB"
    if copy:
        line += f"; at the copy ceiling ({copy['gbps']:.0f} GB/s): {nbytes / copy['gbps'] / 1e6:.3f} ms"
    if fill and d == "fp32":
        line += f"; at the fill ceiling ({fill['gbps']:.0f} GB/s): {nbytes / fill['gbps'] / 1e6:.3f} ms"
    print(line)
print(f"fp32 moves {bytemodel.bytes_moved(N_BIG, 'fp32') / bytemodel.bytes_moved(N_BIG, 'bf16'):.2f}x the bytes "
      f"of bf16 (the same inputs, twice the output bytes); the codes are "
      + ", ".join(f"{N_BIG // 2 / bytemodel.bytes_moved(N_BIG, d):.0%} of {d}'s" for d in ("bf16", "fp32")))
if copy is None:
    print("(no recorded ceiling for this GPU: run notebook 00 on a GPU)")

# %% [markdown]
# <a id="design"></a>
# ## 2. The access pattern, against 04 and 05
#
# 04 and 05 load 16 bytes of codes per thread and exchange them through shared memory, so that
# each warp's stores stay contiguous. Here the unit of work is what one 16-byte store holds: the
# 8 weights of one packed 32-bit word (bf16, fp16), or 4 weights, half a word (fp32). Thread `t`
# of a block of `THREADS` threads takes units `t`, `t + THREADS`, ... (`UNITS` of them; both are set in the kernel cell): each warp store writes 512
# contiguous bytes and each warp load reads 128 (64 for fp32), with no exchange. So the code loads
# are 32-bit again, not 04's 16-byte ones: the codes are the share of the bytes moved that the cell
# above prints, and this notebook does not measure what the narrower loads cost. A thread issues
# all its global loads (its words, their scales, its share of the LUT and of `code2`) before the
# block's one barrier (all but the one tail thread, whose loads follow it), so that we expect a block to wait for memory about once; `code2` sits in
# shared memory beside the LUT, so that `code2[absmax_q[b]]` is not a second trip to global memory. The LUT is in
# shared memory although 05 may have found a global table as fast or faster: `code2` already needs the block's
# barrier, so the LUT adds only its 16 entries to the fill (this notebook does not time its placement on its own;
# `lab/README.md` records the shared table's fill order and a table by shuffles; a global-memory table
# was not timed for this kernel). The scale is computed
# once per unit with `fmul_rn`/`fadd_rn` (never an FMA), and the one thread just past the last
# whole unit writes the tail. These are design choices, not measured advantages: section 6 times
# 05's kernels beside this one in the same run, and its verdict, read against the noise margin,
# compares this kernel with the faster of them in that run; it is the only comparison of 05's
# kernels with this one that this notebook makes (a comparison of the whole kernels: the choices
# above differ together). How these choices were
# tried and timed is in `lab/README.md`.
#
# <a id="kernel"></a>
# ## 3. The kernel
#
# **Choosing the dtype at compile time.** `make_kernel(dtype)` defines the kernel inside a
# function, closing over the constant `OUT`. numba freezes closure constants into the code, so
# `if OUT == FP32:` is decided at compile time and each kernel contains only its own conversion
# (the PTX below shows it). `launch(b)` picks the kernel for `b.dtype`.
#
# **The launch shape.** `THREADS` and `UNITS` are one shape for every GPU. The cell prints a record
# of this kernel timed at several launch shapes (`tools/launch_shapes.py`), with its GPU and date,
# says for each parameter whether its spread is beyond the noise margin, and where the shape the
# kernel uses stands against the fastest.

# %%
import re

used = (256, 2)   # the kernel cell's THREADS and UNITS, below: section 4's cell checks that they still agree
shapes = bench.Run.load("launch_shapes")
if shapes is None:
    print("no launch-shape run recorded for this GPU (python tools/launch_shapes.py records one)")
else:
    print(f"this kernel at several launch shapes, 16384 x 16384 bf16, {results.label(shapes.meta)}:")
    for k in shapes.kernels():
        if k["shape"] == [16384, 16384] and k["dtype"] == "bf16":
            bound = f", {k['pct_bound']:.0f}% of the traffic-matched bound" if k.get("pct_bound") else ""
            pkg = "" if k["name"].startswith("06") else " (the package's kernel, nf4lab.dequantize: section 8)"
            print(f"  {k['name']}{pkg}: {k['gbps']:.0f} GB/s, {k['pct_copy']:.0f}% of copy{bound}")
    # (threads, units) -> GB/s, rounded as printed above: the spreads and gaps below are computed from these
    gbps = {tuple(map(int, m.groups())): round(k["gbps"]) for k in shapes.kernels()
            if k["shape"] == [16384, 16384] and k["dtype"] == "bf16" and k["name"].startswith("06")
            and (m := re.search(r"(\d+) threads x (\d+)", k["name"]))}
    for fixed, label, vary, unit in ((1, "units per thread", "block sizes", "threads per block"),
                                     (0, "threads per block", "units per thread", "units per thread")):
        for f in sorted({key[fixed] for key in gbps}):
            g = {key[1 - fixed]: v for key, v in gbps.items() if key[fixed] == f}
            if len(g) > 1:
                spread = round(100 * (max(g.values()) - min(g.values())) / max(g.values()), 1)   # as printed
                top = max(g.values())   # each value's gap below the fastest, in the series' three bands
                by = {b: [v for v in sorted(g) if bench.noise_band(100 * (top - g[v]) / top) == b]
                      for b in ("within", "near", "beyond")}
                verdict = (f"within the {bench.NOISE_PCT}% noise margin, no measurable effect"
                           if spread <= bench.NOISE_PCT else
                           f"past the {bench.NOISE_PCT}% noise margin: "
                           + "; ".join(part for part in (
                               f"{by['beyond']} {unit} slower by more than twice the margin" if by["beyond"] else "",
                               f"{by['near']} near the fastest (1-2% below it: re-run to tell)" if by["near"] else "",
                               f"{by['within']} within the margin of the fastest") if part)
                           + " (gaps judged as printed, to one decimal)")
                print(f"  at {f} {label}, {vary} {sorted(g)}: {min(g.values()):.0f}-{max(g.values()):.0f} GB/s, "
                      f"a spread of {spread:.1f}%: {verdict}")
    best = max(gbps, key=gbps.get)
    if used in gbps:
        gap = round(100 * (gbps[best] - gbps[used]) / gbps[best], 1)
        print(f"  the kernel cell's {used[0]} threads x {used[1]}: {gap:.1f}% below the fastest shape "
              f"({best[0]} threads x {best[1]}), " + {"within": "within", "near": "past, but within twice,",
                                                       "beyond": "beyond twice"}[bench.noise_band(gap)]
              + f" the {bench.NOISE_PCT}% noise margin")

# %% [markdown]
# Each spread is read against the series' one noise margin (`bench.NOISE_PCT`), and the verdict
# ends its line. Where a parameter's spread is inside the margin, that parameter did not
# measurably move the bandwidth in this record. The last line places the shape the kernel cell
# uses (one shape for every GPU) against the fastest shape of the record: within the margin, it
# is one of the fastest on the record's GPU, not a tuned optimum; beyond twice it, that GPU would gain
# from another shape; between one and two margins, re-run to tell. The record is the one named above (its GPU and date), not a run of this
# notebook.

# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
import numpy as np
from numba import cuda, float32, uint32, uint64

from nf4lab.device import ops
from nf4lab.lesson import GROUP_SHIFT, block_scale  # 01's scale, both operations rounded (never an FMA)

THREADS = 256          # threads per block: one shape for every GPU (tools/launch_shapes.py measures it)
UNITS = 2              # units of 16 output bytes per thread, at stride THREADS
# Typed constants keep the arithmetic unsigned: a bare Python int is int64, and arithmetic or bitwise
# operations of an unsigned value with an int64 give int64 (numba types them, and shifts, at 64 bits or
# wider either way; 04, section 3).
NIB, BYTE, U4, U8_32, U16_32, U24_32 = uint32(15), uint32(255), uint32(4), uint32(8), uint32(16), uint32(24)
U0, U1, U2, U3, U7 = uint64(0), uint64(1), uint64(2), uint64(3), uint64(7)
GROUP = uint64(GROUP_SHIFT)   # log2 of the quantization blocks in one group (256), which share one absmax2
BF16, FP16, FP32 = 0, 1, 2
OUT_KINDS = {"bf16": BF16, "fp16": FP16, "fp32": FP32}


@cuda.jit(device=True, inline="always")
def weights(table, byte, s):
    """The two weights of one packed byte: high nibble first."""
    return ops.fmul_rn(table[byte >> U4], s), ops.fmul_rn(table[byte & NIB], s)


def make_kernel(dtype):
    OUT = OUT_KINDS[dtype]     # a constant of the closure: numba compiles only the branches it selects
    # A unit is what one 16-byte store holds: 8 weights of a 16-bit dtype (a whole packed word),
    # or 4 float32 weights (half a packed word). Unit u starts at weight u << SHIFT.
    SHIFT = uint64(2 if OUT == FP32 else 3)
    C2N = -(-256 // THREADS)   # code2's 256 entries, copied into shared memory by the whole block

    @cuda.jit(device=True, inline="always")
    def pack2(lo, hi):
        """Two weights -> one uint32 of two 16-bit values, `lo` at the lower address."""
        if OUT == BF16:
            return ops.pack_bf16x2(lo, hi)          # cvt.rn.bf16x2.f32
        return ops.pack_f16x2(lo, hi)               # cvt.rn.f16x2.f32

    @cuda.jit(device=True, inline="always")
    def bits1(x):
        """One weight -> its output bits, for the tail."""
        if OUT == BF16:
            return ops.to_bf16_bits(x)
        if OUT == FP16:
            return ops.to_f16_bits(x)
        return ops.float_bits(x)

    @cuda.jit(device=True, inline="always")
    def scale_of(c2s, q, g, offset):
        """block_scale with code2 read from shared memory: the same two rounded operations."""
        return ops.fadd_rn(ops.fmul_rn(c2s[q], g), offset)

    @cuda.jit
    def kernel(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        table = cuda.shared.array(16, float32)      # the LUT in shared memory (step 05)
        c2s = cuda.shared.array(256, float32)       # code2 too: absmax_q indexes it
        tid = cuda.threadIdx.x
        nunits = n >> SHIFT                         # whole units; the rest is the tail
        base = uint64(cuda.blockIdx.x) * uint64(THREADS * UNITS) + uint64(tid)
        words = cuda.local.array(UNITS, uint32)
        qs = cuda.local.array(UNITS, uint32)
        gs = cuda.local.array(UNITS, float32)
        for k in range(UNITS):                      # 1. every global load of the block first
            u = base + uint64(k * THREADS)
            words[k] = uint32(0)
            qs[k] = uint32(0)
            gs[k] = float32(0)
            if u < nunits:
                blk = (u << SHIFT) >> log2_bs
                words[k] = packed_u32[(u << SHIFT) >> U3]
                qs[k] = uint32(absmax_q[blk])
                gs[k] = absmax2[blk >> GROUP]
        entry = lut[tid & NIB]                      #    the two small tables, in flight with the data
        c2 = cuda.local.array(C2N, float32)
        for j in range(C2N):
            if tid + uint32(j * THREADS) < 256:
                c2[j] = code2[tid + uint32(j * THREADS)]
        if tid < 16:                                # 2. into shared memory, one barrier
            table[tid] = entry
        for j in range(C2N):
            if tid + uint32(j * THREADS) < 256:
                c2s[tid + uint32(j * THREADS)] = c2[j]
        cuda.syncthreads()

        for k in range(UNITS):                      # 3. convert and store: one 16-byte store per unit
            u = base + uint64(k * THREADS)
            first = u << SHIFT                      # the unit's first weight
            if u < nunits:
                s = scale_of(c2s, qs[k], gs[k], offset)
                w = words[k]
                if OUT == FP32:                     # odd units take the upper two bytes of the word
                    w >>= uint32((first & U7) << U2)
                a, b = weights(table, w & BYTE, s)
                c, d = weights(table, (w >> U8_32) & BYTE, s)
                if OUT == FP32:
                    ops.store_u32x4(out_u32, u << U2, ops.float_bits(a), ops.float_bits(b),
                                    ops.float_bits(c), ops.float_bits(d))
                else:
                    e, f = weights(table, (w >> U16_32) & BYTE, s)
                    g, h = weights(table, w >> U24_32, s)
                    ops.store_u32x4(out_u32, u << U2, pack2(a, b), pack2(c, d), pack2(e, f), pack2(g, h))
            elif u == nunits:                       # 4. the tail: the one thread just past the last unit
                i = first
                while i < n:
                    byte = uint32(packed[i >> U1])
                    q = (byte >> U4) if (i & U1) == U0 else (byte & NIB)
                    out[i] = bits1(ops.fmul_rn(table[q], block_scale(absmax_q, absmax2, code2, offset,
                                                                     i >> log2_bs)))
                    i += U1

    return kernel


KERNELS = {d: make_kernel(d) for d in OUT_KINDS}


def address(a):
    try:
        return a.__cuda_array_interface__["data"][0]
    except AttributeError:
        return a.__array_interface__["data"][0]


def launch(b):
    """NF4 -> b.dtype (bf16, fp16 or fp32), bit-exact with bitsandbytes."""
    if address(b.out_u32) % 16 or address(b.packed_u32) % 4:
        raise ValueError("the output must be 16-byte aligned and the codes 4-byte aligned for vector access")
    units = (b.n >> (2 if b.dtype == "fp32" else 3)) + 1   # whole units, plus one thread for the tail
    blocks = (units + THREADS * UNITS - 1) // (THREADS * UNITS)
    KERNELS[b.dtype][blocks, THREADS, b.stream](
        b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
        np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))


VERSIONS = {"06 best kernel (bf16/fp16/fp32)": launch}

# %% [markdown]
# <a id="ptx"></a>
# ## 4. PTX evidence, per dtype
#
# Each kernel contains only its own conversion: compiled for sm_80 or newer, bf16 `cvt.rn.bf16x2.f32`
# and no `f16x2`, fp16 the reverse, fp32 neither (the float32 bits go straight into the stores); for
# sm_75 (a T4, or `NF4LAB_ARCH=sm_75`) the check prints which instructions stand in (section 7). All three: `UNITS`
# 32-bit loads one after another at a stride of `THREADS` units, i.e. `THREADS` words (half that
# for fp32, whose unit is half a word), the loop unrolled and the local arrays in registers (no
# `ld.local`); 16-byte stores (one per unit), shared LUT, no FMA, no float64. The other loads and stores
# the counts below include are each unit's statistics loads (`absmax_q`, `absmax2`), the LUT's and `code2`'s
# staging, `block_scale`'s loads and the tail's (one thread: byte loads; 16-bit stores, 32-bit for fp32).

# %%
# The launch-shape cell of section 3 printed where `used` stands; it must be the kernel cell's shape.
assert (THREADS, UNITS) == used, (f"the kernel cell uses {THREADS} threads x {UNITS}, section 3's launch-shape "
                                  f"cell says {used[0]} x {used[1]}: update `used` there")
kernel_ptx = {}
for d in ("bf16", "fp16", "fp32"):
    kernel_ptx[d] = p = nf4lab.compile_ptx(KERNELS[d], sig(d))
    print(f"--- {d}")
    ptx.show(p, [r"^ld\.global\.(nc\.)?u32", r"^st\.global\.v4", r"^cvt\.rn\.\w+x2"], limit=4)
    print()

common_present = [r"^st\.global\.v4\.u32", r"^ld\.shared\.f32", r"^bar\.sync", r"^mul\.rn\.f32", r"^add\.rn\.f32"]
common_absent = [r"^fma", r"\.f64\b", r"^ld\.local", r"^st\.local", r"^(div|rem)\."]
ptx.check(kernel_ptx["bf16"], present=common_present + [r"^cvt\.rn\.bf16x2\.f32"],
          absent=common_absent + [r"^cvt\.rn\.f16x2"])
ptx.check(kernel_ptx["fp16"], present=common_present + [r"^cvt\.rn\.f16x2\.f32"],
          absent=common_absent + [r"^cvt\.rn\.bf16x2"])
ptx.check(kernel_ptx["fp32"], present=common_present, absent=common_absent + [r"^cvt\.rn\.\w+x2"])
print("PTX checks passed (all three):", ", ".join(common_present), "present;", ", ".join(common_absent), "absent")
for d, p in kernel_ptx.items():
    loads = ptx.count(p, r"^ld\.global\.(nc\.)?u32")
    assert loads >= UNITS, f"{d}: expected the {UNITS} word loads unrolled, found {loads}"
    print(f"{d}: {loads} ld.global.u32 (word loads), {ptx.count(p, r'^st.global.v4')} st.global.v4")

# %% [markdown]
# <a id="verify"></a>
# ## 5. Verification, per dtype
#
# fp16 deserves attention: its range is small (largest finite value 65504) and it has subnormals.
# Verification includes "heavy" weights, with per-row scales over orders of magnitude: the
# widest-ranging case the series generates, but not one built to reach fp16's ends. For fp16 it is
# scaled down where its tail would pass half of fp16's range: a weight that is infinite in fp16
# would, we expect, make bitsandbytes' offset infinite and every output NaN (the note in
# `generate`, `nf4lab/harness/cases.py`), and NaN against NaN checks nothing. By the PTX ISA
# (`cvt`, `.rn`), `cvt.rn.f16x2.f32` rounds to nearest even; we expect it to overflow to infinity
# and keep subnormal results, as IEEE 754 rounding does, and bitsandbytes' own conversion to do the
# same: bit-exact means the same infinities and subnormals too, where a case reaches them. Whether
# the heavy case reaches them is for the cell to say: it counts them in bitsandbytes' output for a
# heavy fp16 case at the main case's shape (on a GPU, the one verification used; in the simulator
# the shapes are small), and prints the largest and the smallest nonzero magnitude of that output
# beside fp16's limits. `tools/gpu_exactness.py` also checks the conversions alone, on the GPU;
# section 7 prints its records.

# %%
nf4lab.verify_versions(VERSIONS, cases["bf16"], dtypes=("bf16", "fp16", "fp32"))
heavy = nf4lab.make_case(cases["fp16"].shape, dtype="fp16", dist="heavy")
e = heavy.expected.view(np.uint16)
print(f"bitsandbytes' fp16 output, heavy case {heavy.shape[0]}x{heavy.shape[1]}: "
      f"{int(np.isnan(e.view(np.float16)).sum()):,} NaNs, {int(((e & 0x7FFF) == 0x7C00).sum()):,} infinities, "
      f"{int((((e & 0x7C00) == 0) & ((e & 0x03FF) != 0)).sum()):,} subnormals")
mag = np.abs(e.view(np.float16).astype(np.float32))
mag = mag[np.isfinite(mag) & (mag > 0)]
f16 = np.finfo(np.float16)
if not mag.size:
    print("  no finite nonzero output: this case checks nothing about fp16's range")
else:
    print(f"  its magnitudes: largest {mag.max():.6g} (fp16's largest finite: {float(f16.max):g}), "
          f"smallest nonzero {mag.min():.3g} (fp16's smallest normal: {float(f16.smallest_normal):.3g})")

# %% [markdown]
# Read the count beside the bit-exact verdict above it: where it prints no infinities and no
# subnormals, the heavy case reached neither half-precision overflow nor its subnormal range
# (the magnitudes printed under it say how far it stayed from each), and the bit-exact verdict
# says nothing about them. Those ends are checked on their own by
# `tools/gpu_exactness.py`, in its first part: the conversions alone, on the GPU against
# plain-Python twins, over the special value classes its docstring lists (zeros, subnormals, ties,
# the largest finite values, infinities, NaNs). fp16's twin is numpy's float32-to-float16 cast
# (IEEE round-to-nearest-even as numpy implements it), bit for bit except for NaN inputs, where
# any NaN passes (the tool's comment: the GPU gives its canonical NaN, numpy keeps the payload);
# numpy has no bf16, so bf16's twin is section 7's integer formula, NaN to 0x7FFF. Neither is
# bitsandbytes: that bitsandbytes' fp16 output matches at those ends remains an expectation.
# Section 7 prints the records.

# %% [markdown]
# <a id="bench"></a>
# ## 6. Benchmark
#
# One kernel source, timed for each output dtype at the default shape, each with its own ceilings
# and bitsandbytes (for the same dtype) in the same run. Beside the bf16 kernel, the same run
# times 05's kernels: its shared-LUT kernel and its baseline with the table in global memory (both
# 16-byte loads and an exchange, built from notebook 05's `kernel` cell as 05's benchmark builds
# them), on the same data, in one process. This kernel is compared with the one of 05's that took
# less time in this run, and the verdict names it. That compares two kernels as a whole: their access
# patterns, but also their loads per thread, where `code2` lives (section 2) and their launch shapes
# (this kernel's in section 3: 256 threads x 2 units of section 2, 16 bf16 weights a thread; 05's: 128
# threads, one 16-byte chunk of codes, 32 weights, a thread), and for 05's
# baseline where the LUT lives, so a difference is not the access pattern's alone.
# The cell ends with verdicts read
# against the noise margin: whether each dtype reaches the traffic-matched bound, which moves the
# same bytes with no floating-point arithmetic (00's prediction that dequantization is memory-bound, tested), and
# whether this kernel and the faster of 05's differ. A kernel past the margin but within twice it is called *near* the
# bound: one such gap may land on the other side of the margin in another execution (`bench.bound_band`).
# Between those two, fp32's time is printed beside the prediction of 00's exercise: 00's run
# and this one are two runs, so that line gives no verdict at the margin, and a direction only where the gap
# is larger than the bf16 bound's own move between the two runs (printed beside it).
# A third verdict follows it, from this run alone: whether fp32's bound moves its bytes as fast as
# bf16's.

# %%
# Under NF4LAB_ARCH=sm_75 (section 7) these kernels carry the T4 paths: their results get a file of their own.
SM75_RUN = nf4lab.arch.forced() is not None and nf4lab.arch.forced() < (8, 0)
RESULTS_NAME = "sm_75_06_output_dtypes" if SM75_RUN else "06_output_dtypes"
PREV = "05 LUT in shared memory"           # 04's access pattern with 05's shared LUT
v05 = versions.load_module("05_shared_lut")    # 05's kernel cell: its VERSIONS and its baseline
BASE05 = v05.BASELINE                          # the same kernel with the table in global memory
run = bench.step(RESULTS_NAME, {
    PREV: (v05.VERSIONS[PREV], cases["bf16"]),
    BASE05: (v05.BASELINE_LAUNCH, cases["bf16"]),
    "06 best kernel -> bf16": (launch, cases["bf16"]),
    "06 best kernel -> fp16": (launch, cases["fp16"]),
    "06 best kernel -> fp32": (launch, cases["fp32"]),
})
if run is not None:
    if run.recorded:                 # no GPU: a recorded run, so print its table (on a GPU bench.step printed it)
        print(run.table())
    # each dtype's bound and each kernel's share of it, from the GB/s as the table prints them (whole numbers)
    bg = {d: round(b["gbps"]) for d in ("bf16", "fp16", "fp32") if (b := run.get(bench.BOUND, dtype=d))}
    pct = {r["name"]: round(100 * round(r["gbps"]) / bg[r["dtype"]], 1) for r in run.kernels() if r["dtype"] in bg}
    for r in run.kernels():
        bound = f", {pct[r['name']]:.1f}% of the traffic-matched bound" if r["name"] in pct else ""
        print(f"{r['name']}: {r['gbps']:.0f} GB/s, {r['pct_copy']:.0f}% of copy, {r['pct_fill']:.0f}% of fill"
              f"{bound}, {r['speedup_vs_bnb']:.2f}x bitsandbytes")
    # Whose numbers these are: this run's, or a recorded GPU's (no GPU here).
    where = "on this GPU" if not run.recorded else f"on the {run.meta.get('gpu', 'recorded GPU')} (recorded)"
    for r in run.kernels():             # the prediction of 00: the arithmetic hides behind the bytes
        if r["name"].startswith("06") and r["name"] in pct:
            pb = pct[r["name"]]               # judged as printed, to one decimal
            band = bench.bound_band(pb)       # the series' rule: at, near (up to twice the margin) or below
            print(f"-> {r['dtype']}: {r['gbps']:.0f} of the bound's {bg[r['dtype']]} GB/s, {pb:.1f}% of the bound that does no floating-point "
                  "arithmetic, " + (
                f"within the {bench.NOISE_PCT}% noise margin: at the bound, memory-bound {where}, as 00 predicted"
                if band == "at" else
                f"{100 - pb:.1f}% below it, within twice the {bench.NOISE_PCT}% noise margin: near the bound, "
                f"memory-bound for practical purposes {where}, as 00 predicted (a gap this small can fall on either "
                "side of the margin in another execution: one result with 'at the bound')" if band == "near" else
                f"{100 - pb:.1f}% below it, more than twice the {bench.NOISE_PCT}% noise margin: {where} the "
                "arithmetic costs measurable time, not the memory-bound result 00 predicted"))
    # 00's exercise predicted fp32's time from 00's bf16 bound; this run measured it: two runs, two dates
    base = bench.Run.load("00_ceiling", results.gpu_slug(run.meta["gpu"])) if run.meta.get("gpu") else None
    tb00 = base.get(bench.BOUND) if base is not None else None
    f32, tb32, tb16 = (run.get("06 best kernel -> fp32"), run.get(bench.BOUND, dtype="fp32"),
                       run.get(bench.BOUND, dtype="bf16"))
    if tb00 and f32 and tb32 and tb16:
        pred = bytemodel.bytes_moved(f32["shape"][0] * f32["shape"][1], "fp32") / tb00["gbps"] / 1e6
        late = 100 * (f32["ms"] / pred - 1)
        drift = 100 * (tb16["gbps"] / tb00["gbps"] - 1)   # one bound, bf16, in the two runs: how far the runs differ
        print(f"00's prediction for fp32 at the bf16 bound's speed ({results.label(base.meta)}): {pred:.4f} ms; "
              f"this run: the fp32 kernel {f32['ms']:.4f} ms, fp32's bound {tb32['ms']:.4f} ms; the bf16 bound moved "
              f"{drift:+.1f}% (GB/s) from 00's run to this one. "
              + (f"The kernel took {abs(late):.1f}% {'longer' if late > 0 else 'less time'} than predicted, more than "
                 "that move" if abs(late) > abs(drift) else
                 f"The kernel is {abs(late):.1f}% from the prediction, no more than that move: no direction")
              + " (00's run and this one: two runs, not judged at the noise margin, which is for kernels timed in one run)")
        gap = 100 * (tb32["gbps"] / tb16["gbps"] - 1)     # one run: comparable
        print(f"   within this run, fp32's bound moved its bytes {abs(gap):.1f}% "
              f"{'faster' if gap > 0 else 'slower'} than bf16's ({tb32['gbps']:.0f} against {tb16['gbps']:.0f} GB/s): "
              + {"within": f"within the {bench.NOISE_PCT}% noise margin, as fast, as 00 assumed",
                 "near": f"past the {bench.NOISE_PCT}% noise margin but within twice it: re-run to confirm",
                 "beyond": f"beyond twice the {bench.NOISE_PCT}% noise margin: fp32's bytes move "
                           + ("faster" if gap > 0 else "slower") + ", not as fast as 00 assumed"}[bench.noise_band(gap)])
    bf = run.get("06 best kernel -> bf16")
    timed05 = {n: r for n in (PREV, BASE05) if (r := run.get(n, dtype="bf16"))}   # 05's kernels in this run
    if bf and timed05:
        fast05 = min(timed05, key=lambda n: timed05[n]["ms"])   # the one of 05's with the shorter time here
        prev, other = timed05[fast05], next(n for n in (PREV, BASE05) if n != fast05)
        if other in timed05:
            shown = {n: round(r["ms"], 4) for n, r in timed05.items()}   # as printed: `apart` is computed from these
            apart = round(100 * (shown[other] / shown[fast05] - 1), 1)
            band = {"within": f"within the {bench.NOISE_PCT}% noise margin, their order not measured",
                    "near": f"past the {bench.NOISE_PCT}% noise margin but within twice it: re-run to confirm",
                    "beyond": f"beyond twice the {bench.NOISE_PCT}% noise margin"}[bench.noise_band(apart)]
            print(f"05's kernels in this run, bf16: {PREV!r} {shown[PREV]:.4f} ms, {BASE05!r} "
                  f"{shown[BASE05]:.4f} ms; compared below, the faster: {fast05!r} (the other takes "
                  f"{apart:.1f}% longer: {band})")
        else:
            print(f"this run did not time {other!r}: compared below with {fast05!r} only")
        ratio, why = provenance.compare(run.meta, bf, run.meta, prev)   # one run: comparable
        print(f"same run, bf16: this kernel {bf['ms']:.4f} ms, {fast05!r} {prev['ms']:.4f} ms: "
              + (f"{fast05!r} takes {ratio:.3f}x this kernel's time" if ratio else why)
              + f" ({results.label(run.meta)})")
        if ratio:
            change = round(100 * (ratio - 1), 1)        # judged to one decimal, as the line above
            faster = 'this kernel' if change > 0 else repr(fast05)
            print({"within": f"-> within the {bench.NOISE_PCT}% noise margin: {where} neither kernel is measurably "
                             "faster",
                   "near": f"-> near (past the {bench.NOISE_PCT}% noise margin but within twice it): {where} {faster} "
                           "may be the faster one; one run does not settle it, re-run to confirm",
                   "beyond": f"-> beyond twice the {bench.NOISE_PCT}% noise margin: {where} {faster} is the faster one",
                   }[bench.noise_band(change)])
    else:
        print(f"this run ({results.label(run.meta)}) did not time 05's kernels beside this kernel: "
              "no comparison (run the notebook on a GPU to measure them)")

# %% [markdown]
# The last verdict above is the only comparison of 05's kernels (sixteen-byte loads and an
# exchange) with this one (packed words, no exchange): it takes the faster of 05's kernels in this
# run, named in the line above it, and it carries the
# conclusion: where it says within the noise margin, neither kernel is measurably faster on that GPU
# (their order is not measured); near it (past the margin, within twice it), one run does not settle
# which; beyond twice the margin, one kernel is, for all its differences together (section 2), not for its access
# pattern alone. The point of this notebook is the three output dtypes and their bit-exactness,
# not speed; read section 8's lines about the access pattern with that verdict in mind. In the plot
# below, a bar that names another notebook's run is context from that run, not a comparison at the noise margin.

# %%
plots.progress("06_output_dtypes");

# %%
if run is not None:
    for d in ("fp16", "fp32"):
        try:
            plots.bars(run, dtype=d, highlight={f"06 best kernel -> {d}"},   # this step's colour, as above
                       title=f"06 best kernel -> {d} (orange), with its ceilings and bitsandbytes")
        except ValueError as exc:
            print(exc)

# %% [markdown]
# <a id="sm75"></a>
# ## 7. Older GPUs: the sm_75 (T4) path
#
# Three instructions used above exist only from sm_80 (Ampere), by the PTX ISA's `cvt` entry (its
# `.bf16` and `.f16x2` forms require `sm_80` or higher): `cvt.rn.bf16.f32`, `cvt.rn.bf16x2.f32` and
# `cvt.rn.f16x2.f32`. A T4 (sm_75) has none of them: the second cell below compiles one unit of 8
# weights for sm_75 (and for sm_90) and prints what one pair of them becomes instead.
# `nf4lab.device.ops` holds a second path for each, and NVVM picks one *when the kernel compiles*,
# from the architecture it compiles for (`__nvvm_reflect("__CUDA_ARCH")`, libdevice's mechanism):
# each GPU's code holds one.
#
# * **bf16, rounded in integers.** With `u` the float's bits: `(u + 0x7FFF + ((u >> 16) & 1)) >> 16`.
#   Adding just under half a bf16 step, plus 1 when the last kept bit is odd, carries into the kept
#   bits exactly when round-to-nearest-even rounds up. **NaN** needs its own rule: 0x7F800001 would
#   come out as infinity (0x7F80) and 0x7FFFFFFF as -0.0 (0x8000), so every NaN becomes 0x7FFF,
#   what `cvt.rn.bf16.f32` gives.
# * **fp16 pairs.** `cvt.rn.f16.f32` exists on sm_75: two of them and a 32-bit pack (`mov.b32 {lo, hi}`).
#
# Both paths and the sm_80 instructions are checked on a GPU against the same plain-Python
# twins (section 5 says what they are: for bf16 the integer formula above, NaN to 0x7FFF, so a
# record of the sm_80 instructions with no mismatch says that `cvt.rn.bf16.f32` and the formula
# agree on every input checked; for fp16 numpy's cast, any NaN accepted for a NaN input), over
# random float32 bit patterns plus the special value classes the tool's docstring lists (zeros,
# subnormals, ties, the largest finite values, infinities, NaNs), and the step kernels are
# verified under each: `tools/gpu_exactness.py`, run with and without `NF4LAB_ARCH=sm_75`
# (`data/results/<gpu>/exactness.json`, `exactness_sm75.json`). The first cell below prints
# the records there, each with its GPU and date. To run the T4 path on any GPU, start Python
# with `NF4LAB_ARCH=sm_75` set (e.g. `NF4LAB_ARCH=sm_75 jupyter lab`): nf4lab reads it once, at
# import. A run id (the hex in each record's label) names a session, not one process: to time both paths
# under one run id, give both processes the same `NF4LAB_RUN_ID`.
# The second cell compiles one unit of the kernel's work (a word of 8 weights to one 16-byte
# store, with the kernel's own `weights` helper; no scale or index arithmetic) for both targets,
# prints one pair's bf16 instructions on each and counts the unit's instructions.

# %%
for gpu in results.gpus():              # every GPU with recorded results, not only this one
    for name, paths in (("exactness", "sm_80 instructions"), ("exactness_sm75", "NF4LAB_ARCH=sm_75 paths")):
        rec = results.load(name, gpu)
        if rec is None:
            continue
        conv = [r for r in rec["records"] if r["name"].startswith("ops.")]
        steps = [r for r in rec["records"] if "notebook" in r]
        print(f"{paths}, {results.label(rec['meta'])}:\n  conversions: "
              + ", ".join(f"{r['name']} {r['mismatches']} of {r['inputs']:,} inputs differ" for r in conv)
              + f"\n  step kernels: {sum(bool(r['bit_exact']) for r in steps)} of {len(steps)} bit-exact")

# %%
def unit_probe(dtype):
    """One unit of the kernel above and nothing else: a packed word (8 weights) -> one 16-byte store."""
    OUT = OUT_KINDS[dtype]

    @cuda.jit
    def probe(packed_u32, lut, s, out_u32):
        w = packed_u32[0]
        a, b = weights(lut, w & BYTE, s)
        c, d = weights(lut, (w >> U8_32) & BYTE, s)
        e, f = weights(lut, (w >> U16_32) & BYTE, s)
        g, h = weights(lut, w >> U24_32, s)
        if OUT == BF16:
            ops.store_u32x4(out_u32, U0, ops.pack_bf16x2(a, b), ops.pack_bf16x2(c, d),
                            ops.pack_bf16x2(e, f), ops.pack_bf16x2(g, h))
        else:
            ops.store_u32x4(out_u32, U0, ops.pack_f16x2(a, b), ops.pack_f16x2(c, d),
                            ops.pack_f16x2(e, f), ops.pack_f16x2(g, h))
    return probe


def work(p):   # the unit's instructions, without parameter loads, address conversions and ret
    return [x for x in ptx.instructions(p) if not x.startswith(("ld.param", "cvta", "ret"))]


count = {}
if SM75_RUN:
    print("NF4LAB_ARCH=sm_75 caps every compilation at the sm_75 paths: both columns below are sm_75 code")
for d in ("bf16", "fp16"):
    for cc in ((9, 0), (7, 5)):
        p = nf4lab.compile_ptx(unit_probe(d), "(uint32[::1], float32[::1], float32, uint32[::1])", cc=cc)
        count[d, cc] = len(work(p))
        if d == "bf16":
            ins = work(p)
            first = next(i for i, x in enumerate(ins) if x.startswith(("cvt.rn.bf16x2", "mov.b32")))
            n = 1 if cc == (9, 0) else 16       # one pair: 1 instruction, or 2 x 8 (an or.b32 packs them later)
            print(f"--- bf16, one pair of weights, sm_{cc[0]}{cc[1]}:\n    " + "\n    ".join(ins[first:first + n]))
for d in ("bf16", "fp16"):
    n90, n75 = count[d, (9, 0)], count[d, (7, 5)]
    print(f"{d}: {n90} PTX instructions per 8 weights on sm_90, {n75} on sm_75 ({n75 / n90:.2f}x)")

# %% [markdown]
# **Estimate, from these counts:** the factor printed above is of PTX instructions, a proxy for
# the instructions the GPU issues (the machine code that runs may differ). If the kernel were
# limited by issuing instructions, we would expect the T4 path to cost up to about that factor
# (the cell below times nothing: it prints a recorded timing of the sm_75 code on this GPU, if one is
# recorded, made by an `NF4LAB_ARCH=sm_75` process (the cell says whether it shares this run's id), not on a T4, whose bandwidth and SMs differ:
# its ratio is this GPU's, not a T4's cost); a kernel near the traffic-matched bound may have cycles
# in which an SM could issue an instruction but has none ready, and hide part of the extra work in
# them, behind memory time, so we predict a cost below that factor,
# largest for bf16; how far below is for a measurement to say, and the cell below prints one where
# an `NF4LAB_ARCH=sm_75` run is recorded for this GPU. The two timings come from two runs (two processes),
# so they are compared only when both carry one run id (both started with the same `NF4LAB_RUN_ID`) and
# nothing but the code path differs: the same GPU, driver, versions and kernel source
# (`nf4lab.measure.provenance`); otherwise the cell says what differs. fp32 converts nothing: its
# ratio should differ from 1 only by run-to-run noise. As said above, a run id names a session:
# every process started with the same `NF4LAB_RUN_ID` prints it (a lesson, its solution and the sm_75
# process may all share one), while the noise margin is defined for kernels timed in one process.

# %%
sm80 = bench.Run.load("06_output_dtypes") if SM75_RUN else run
sm75 = run if SM75_RUN else bench.Run.load("sm_75_06_output_dtypes")
if sm75 is None or sm80 is None:
    print("no NF4LAB_ARCH=sm_75 run recorded for this GPU: the cost above is an estimate only")
else:
    print(f"sm_75 paths: {results.label(sm75.meta, sm75.path)}\nsm_80 paths: {results.label(sm80.meta, sm80.path)}")
    # Two processes (NF4LAB_ARCH is read at import), hence two dates: do they share a run id, and what else differs?
    why = provenance.why_not_comparable(sm80.meta, {}, sm75.meta, {}, about="code_path")
    paths = (sm80.meta.get("code_path"), sm75.meta.get("code_path"))
    print(f"the two records: {why}" if why is not None else
          f"both records carry run id {sm80.meta['run']} (two processes given one NF4LAB_RUN_ID), with the same "
          + ", ".join(k for k in provenance.SAME_SETUP if k != "code_path") + "; "
          + (f"only the code path differs ({paths[0]} / {paths[1]})" if paths[0] != paths[1] else
             f"the code path is the same too ({paths[0]})") + "; each line below also compares the kernel's source")
    for d in ("bf16", "fp16", "fp32"):    # provenance.compare: one run id, and only the code path differs
        a, b = sm80.get(f"06 best kernel -> {d}"), sm75.get(f"06 best kernel -> {d}")
        if a and b:
            ratio, why = provenance.compare(sm80.meta, a, sm75.meta, b, about="code_path")
            print(f"{d}: the sm_75 paths take {ratio:.3f}x the time of the sm_80 instructions" if ratio
                  else f"{d}: {why}")

# %% [markdown]
# <a id="learned"></a>
# ## 8. What we learned
#
# * One source, three kernels: a factory closing over a constant lets numba compile a specialised
#   kernel per dtype, and the PTX proves each one carries only its own conversion.
# * Given the same float32 value, bit-exactness per dtype is decided by the *rounding instruction*: `cvt.rn.bf16x2.f32`,
#   `cvt.rn.f16x2.f32` (round to nearest even, both lanes at once, first operand to the upper
#   half), or no rounding at all for fp32.
# * 00 predicted that dequantization is memory-bound; section 6 tests it per dtype against the
#   traffic-matched bound, which moves the same bytes with no floating-point arithmetic. Where the verdict says
#   at the bound (within the noise margin) or near it (within twice the margin), the arithmetic costs
#   no time that matters and the bytes set the pace (fp32 writes twice the output bytes, and its bound
#   counts them). "At" and "near" are read as one result: a gap this close to the margin may land
#   on the other side of it in another execution (`nf4lab/measure/bench.py` records one such case;
#   how often is not measured here). Counting "near" as "at"
#   favours the prediction: a gap up to twice the margin still reads as memory-bound.
# * 05's kernels (16-byte loads with an exchange) and this one (u32 words) are compared by
#   measurement, in one run on the same data: section 6's verdict takes the faster of 05's kernels
#   in that run, names it, and says whether it and this kernel differ beyond the noise margin on
#   the GPU whose results it shows. They differ in more than the access pattern (loads per thread,
#   `code2` in shared memory, launch shape, and for 05's baseline where the LUT lives), and the
#   verdict is about the kernels, not the pattern alone. 07 holds every kernel to the
#   traffic-matched bound.
# * A GPU without an instruction gets a second path chosen at compile time, not a second kernel:
#   on sm_75 bf16 is rounded in integers; the cost is counted in PTX, and measured only where both
#   paths were timed under one run id (the same `NF4LAB_RUN_ID`): the cell above says whether such a pair
#   is recorded for this GPU.
# * `nf4lab.dequantize` (the drop-in, `nf4lab/kernels/fastkernel.py`) uses this design.
#
# The summary, [07](07_summary.ipynb), puts all steps side by side and across sizes.

# %% [markdown]
# <a id="exercises"></a>
# ## 9. Exercise: the fp16 path
#
# A colleague wrote an fp16-only version of a simple one-word-per-thread kernel, reasoning that
# bf16 and fp16 "are both 16 bits". Run the cell: the check compares its output with
# bitsandbytes' fp16 bit for bit, and the cell prints the pair conversions of the kernel's PTX
# (in code for sm_75, a T4's or under `NF4LAB_ARCH=sm_75`, what stands in for them: section 7). Which
# rounding instruction does fp16 output need (section 4), and which one does this kernel carry?
# Fix the kernel (one line changes). The check also reads the fixed kernel's PTX, sm_75 code
# included, and where it finds something missing its message names what it looked for.

# %%
### BEGIN SOLUTION
@cuda.jit(device=True, inline="always")
def f16_pair(byte, table, s):
    """The two weights of one packed byte (high nibble first), as two fp16 in one uint32."""
    return ops.pack_f16x2(ops.fmul_rn(table[(byte >> U4) & NIB], s), ops.fmul_rn(table[byte & NIB], s))
### STUDENT
# TODO: this kernel is not bit-exact for fp16 output. Run the cell, read the check's message and
# the PTX printed below (the clue), then fix the kernel (one line changes).
@cuda.jit(device=True, inline="always")
def f16_pair(byte, table, s):
    """The two weights of one packed byte (high nibble first), packed in one uint32."""
    return ops.pack_bf16x2(ops.fmul_rn(table[(byte >> U4) & NIB], s), ops.fmul_rn(table[byte & NIB], s))
### END SOLUTION


@cuda.jit
def dequant_fp16(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
    table = cuda.shared.array(16, float32)
    if cuda.threadIdx.x < 16:
        table[cuda.threadIdx.x] = lut[cuda.threadIdx.x]
    cuda.syncthreads()
    wi = uint64(cuda.grid(1))
    first = wi << 3
    if first < n:
        s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
        w = packed_u32[wi]
        if first + uint64(8) <= n:
            ops.store_u32x4(out_u32, wi << U2, f16_pair(w & BYTE, table, s), f16_pair((w >> U8_32) & BYTE, table, s),
                            f16_pair((w >> U16_32) & BYTE, table, s), f16_pair(w >> U24_32, table, s))
        else:
            i = first
            while i < n:
                byte = w >> uint32(((i - first) >> U1) << U3)
                q = ((byte >> U4) & NIB) if (i & U1) == U0 else (byte & NIB)
                out[i] = ops.to_f16_bits(ops.fmul_rn(table[q], s))
                i += U1


def launch_fp16(b):
    words = (b.n + 7) // 8
    dequant_fp16[(words + 127) // 128, 128, b.stream](
        b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
        np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))


from nf4lab.lesson import exercises   # noqa: E402  (the graders of the series' exercises)

result = exercises.check_fp16_path(launch_fp16, dequant_fp16, sig("fp16"))   # the bits, then the PTX
ex_ptx = nf4lab.compile_ptx(dequant_fp16, sig("fp16"))
if ptx.sm75_paths(ex_ptx):   # the odd tail's cvt.rn.f16.f32 is no pair: the halves' pack is what stands in
    print("sm_75 code: cvt.rn.bf16x2 and cvt.rn.f16x2 exist from sm_80; below, what stands in for each (section 7): "
          "bf16's NaN test, and two fp16 halves packed into one register")
ptx.show(ex_ptx, [r"^setp\.nan\.f32", exercises.HALVES_PACKED] if ptx.sm75_paths(ex_ptx) else
         [r"^cvt\.rn\.bf16x2", r"^cvt\.rn\.f16x2"], limit=2)
### BEGIN SOLUTION
assert result
assert all(holds for _, holds in exercises.fp16_pair_design(ex_ptx))   # what the grader read, on either target
### STUDENT
### END SOLUTION

# %% [markdown]
# ### BEGIN SOLUTION
# *What to notice:* by the code, the tail (written one weight at a time with `ops.to_f16_bits`, never
# through `f16_pair`) was right all along; only the packed pairs went through the wrong conversion.
# Two 16-bit formats with the same size round differently and place their bits differently (bf16: 8 exponent bits, fp16: 5), so
# bit-exactness is decided by the instruction that rounds, and the PTX is where to look for it.
# ### STUDENT
# *What to notice* (run the exercise cell first): the kernel writes its weights in two ways, whole words and a
# tail. Did the check's message point at both, or at one? Two 16-bit formats with
# the same size round differently and place their bits differently (bf16: 8 exponent bits, fp16:
# 5), so bit-exactness is decided by the instruction that rounds, and the PTX is where to look for it.
# ### END SOLUTION
