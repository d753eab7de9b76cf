# 01 -- The naive kernel: one thread per packed byte.
#
# Percent-format source of notebooks/01_naive.ipynb (build: python tools/build_notebooks.py 01_naive).

# %% [markdown]
# # 01 · Naive: one thread per packed byte
#
# **Goal.** Write the simplest correct NF4 dequantization kernel in numba: one thread per
# packed byte, the block scale (of the quantization block of 64 weights, 00's section 2) read from
# global memory (the GPU's device memory in DRAM, which every thread can read, through the caches) by
# every thread, two 16-bit stores.
# "Correct" means *bit-exact* with bitsandbytes, and on the way there numba sets two traps
# that every later kernel must avoid: it **fuses `a * b + c` into one FMA** (which can change the
# result: section 3 counts how often it does in the block scales, in float32 outputs and in bf16
# outputs, where we expect it to be rare), and **signed indices** make it emit wraparound code (and, half-fixed,
# float64 comparisons).
#
# **Contents**
# 1. [Prediction](#prediction)
# 2. [A first draft, and what its PTX says](#draft)
# 3. [Lesson: FMA contraction can break bit-exactness](#fma)
# 4. [Lesson: rounding float32 to bf16](#bf16)
# 5. [Lesson: signed indices](#signed)
# 6. [The kernel](#kernel)
# 7. [PTX evidence](#ptx)
# 8. [Verification](#verify)
# 9. [Benchmark](#bench)
# 10. [What we learned](#learned)
# 11. [Exercises](#exercises)

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import numpy as np
from numba import cuda, float32, uint64

from nf4lab.measure import bench, ptx, results
from nf4lab.format import bytemodel, reference
from nf4lab.device import ops
from nf4lab.lesson import plots

print(nf4lab.describe())
case = nf4lab.make_case()  # 16384 x 16384 on a GPU, 130 x 129 in the simulator
print(case)

# The argument types of every per-byte kernel in this notebook, for compiling PTX:
# packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes
SIG = "(uint8[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, uint16[::1], int64, int64)"

# %% [markdown]
# <a id="prediction"></a>
# ## 1. Prediction
#
# One thread per byte means, for each packed byte: a 1-byte load of the codes, a 1-byte load of
# `absmax_q`, two float32 loads of `code2` and `absmax2` (the same addresses for the 32 threads
# of a quantization block of 64 weights, so most likely served by the caches: L1, each SM's own cache for global loads (05 says more), or 00's L2), two loads from the 16-entry
# LUT, two 16-bit stores. The byte model only counts the bytes DRAM must move; the question for this
# kernel is whether such *narrow* accesses can keep enough bytes in flight (requested from DRAM
# and not yet returned; 02 sizes it). A warp (32 threads
# that execute one instruction together; CUDA C++ Programming Guide, "SIMT Architecture") writes
# 64 bytes with one 16-bit store instruction; a warp of 16-byte stores would write 512.

# %%
N_BIG = 16384 * 16384
per_thread = {"loads (1 B code, 1 B absmax_q, 2 x 4 B scale, 2 x 4 B LUT)": 6, "stores (2 B each)": 2}
print(f"16384 x 16384: {bytemodel.bytes_moved(N_BIG) / 1e6:.0f} MB to move, "
      f"{-(-N_BIG // 2):,} threads (one per byte)")
for what, k in per_thread.items():
    print(f"  per thread: {k} {what}")
moved_per_thread = bytemodel.bytes_moved(N_BIG) / (N_BIG // 2)
print(f"  {moved_per_thread:.2f} bytes of DRAM traffic per thread for "
      f"{sum(per_thread.values())} memory instructions")
ceil = bench.Run.load("00_ceiling")
for name in (bench.COPY, getattr(bench, "BOUND", None)):
    c = ceil.get(name) if ceil is not None and name else None
    if c is not None:
        print(f"at the {name} recorded in 00 on the {ceil.meta['gpu']} ({c['gbps']:.0f} GB/s) the time would be "
              f"{bytemodel.bytes_moved(N_BIG) / c['gbps'] / 1e6:.3f} ms")
if ceil is not None:
    print(f"  (00's run: {results.label(ceil.meta)})")

# %% [markdown]
# Our prediction: **correct, but far from the ceiling**, because 8 memory instructions move
# only about 5 bytes of DRAM traffic per thread. Notebooks 03-06 attack exactly that (02 first
# sizes the grid to the GPU).

# %% [markdown]
# <a id="draft"></a>
# ## 2. A first draft, and what its PTX says
#
# PTX is NVIDIA's virtual instruction set: numba compiles a kernel to PTX, and the driver's
# assembler (`ptxas`) turns that into the GPU's machine code. Reading it shows what the compiler
# made of our Python. The draft is written the way one writes Python: `i = cuda.grid(1)` (the
# thread's global index, `blockIdx.x * blockDim.x + threadIdx.x`, `blockDim.x` being the threads per block, the launch's second number: here, one thread per packed byte),
# the scale as `a * b + c`.

# %%
@cuda.jit(device=True, inline="always")
def scale_plain(absmax_q, absmax2, code2, offset, blk):
    return code2[absmax_q[blk]] * absmax2[blk >> 8] + offset      # looks harmless


@cuda.jit
def draft(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    i = cuda.grid(1)
    if i < nbytes:
        byte = packed[i]
        s = scale_plain(absmax_q, absmax2, code2, offset, i >> 5)
        out[2 * i] = ops.to_bf16_bits(lut[byte >> 4] * s)
        if 2 * i + 1 < n:
            out[2 * i + 1] = ops.to_bf16_bits(lut[byte & 15] * s)


draft_ptx = nf4lab.compile_ptx(draft, SIG)
ptx.show(draft_ptx, [r"^fma", r"^mul", r"^shr\.s64"])

# %% [markdown]
# Two things to notice, each a lesson below:
#
# * `fma.rn.f32`: numba (LLVM, then NVVM: the compiler stages that turn a numba kernel into PTX) *contracted*
#   `a * b + c` into one fused multiply-add.
# * `shr.s64 ..., 63`: the sign of a signed index, the test of `if i < 0: i += len(array)`, Python's
#   negative-index wraparound, done without a branch (the sign mask is and-ed with the length and
#   added). Accesses whose indices derive from the same signed index share it: one such line can
#   serve several accesses.

# %%
ptx.check(draft_ptx, present=[r"^fma\.rn\.f32", r"^shr\.s64\s+%rd\d+, %rd\d+, 63;"])

# %% [markdown]
# <a id="fma"></a>
# ## 3. Lesson: FMA contraction can break bit-exactness
#
# bitsandbytes computes the block scale as two float32 operations, each rounded:
# `t = round(code2[q] * absmax2[g])`, then `scale = round(t + offset)`. An FMA computes
# `round(code2[q] * absmax2[g] + offset)` with a single rounding. That is *more* accurate, and
# *different* in the last bit now and then: by one *ulp* (unit in the last place, the gap between
# a float32 and the next one). Bit-exact means the same roundings.
#
# Run the draft's scale computation on this machine and count blocks whose scale differs from
# the reference:

# %%
@cuda.jit
def scales_plain(absmax_q, absmax2, code2, offset, scales, nblocks):
    blk = cuda.grid(1)
    if blk < nblocks:
        scales[blk] = scale_plain(absmax_q, absmax2, code2, offset, blk)


ref_scale = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
d_scales = cuda.device_array(case.nblocks, dtype=np.float32)
scales_plain[-(-case.nblocks // 128), 128](cuda.to_device(case.absmax_q), cuda.to_device(case.absmax2),
                                           cuda.to_device(case.code2), case.offset, d_scales, case.nblocks)
here = d_scales.copy_to_host()
n_here = int(np.count_nonzero(here != ref_scale))
print(f"{'GPU' if nf4lab.ON_GPU else 'simulator'}: {n_here} of {case.nblocks:,} block scales differ "
      "from bitsandbytes' twice-rounded ones")
if nf4lab.ON_GPU:
    assert n_here > 0, "expected the FMA to change some scales"
else:
    print("The simulator computes with numpy, which rounds every operation: it cannot show the FMA.")

# %% [markdown]
# In the simulator we can still see what the GPU does, in numpy. The product of two float32
# values has at most 48 significant bits, so it is *exact* in float64; adding `offset` in
# float64 and rounding to float32 once is what the FMA computes, except where rounding twice
# (the sum to float64, then to float32) differs from rounding once: a rare corner case, which
# would show below as a count that differs from the GPU's.

# %%
def scale_fused(c):
    a = c.code2[c.absmax_q].astype(np.float64)
    g = c.absmax2[np.arange(c.nblocks) // 256].astype(np.float64)
    # the product exact, the sum rounded to float64 then float32: fma.rn.f32's one rounding but in rare corner cases
    return (a * g + np.float64(c.offset)).astype(np.float32)


def outputs_with(c, scales):
    return reference.f32_to_bits(reference.dequantize_f32(c.packed, scales, c.n, c.blocksize), c.dtype)


fused = scale_fused(case)                         # the default case's scales (GPU comparison above)
print(f"emulated FMA: {np.count_nonzero(fused != ref_scale)} of {case.nblocks:,} block scales differ "
      f"(largest difference {np.max(np.abs(fused.view(np.int32) - ref_scale.view(np.int32)))} ulp)")
if nf4lab.ON_GPU:
    print(f"(the GPU above: {n_here})")
demo_shape = (4096, 4096) if nf4lab.ON_GPU else case.shape   # numpy on 268M weights would be slow
for dtype in ("bf16", "fp32"):
    c = nf4lab.make_case(demo_shape, dtype=dtype)
    rep = nf4lab.compare(outputs_with(c, scale_fused(c)), c.expected, c.dtype, n=c.n, blocksize=c.blocksize,
                         name=f"FMA scales, {'x'.join(map(str, c.shape))}, {dtype} output", show=3)
    rep.hints = []   # the cause is known here (the FMA); the verifier's generic guesses would mislead
    print(rep, "\n")
# The main case in bf16: only the blocks whose scale changed can differ, so only they are computed.
bad = np.flatnonzero(fused != ref_scale)
idx = (bad[:, None] * case.blocksize + np.arange(case.blocksize)).ravel()
idx = idx[idx < case.n]
codes = (case.packed[idx // 2] >> np.where(idx % 2 == 0, 4, 0).astype(np.uint8)) & 15
w_fma = (reference.NF4_LUT[codes] * fused[idx // case.blocksize]).astype(np.float32)
n_bf16 = int(np.count_nonzero(reference.f32_to_bf16_bits(w_fma) != case.expected[idx]))
print(f"FMA scales on the main case ({case.n:,} weights), bf16 output: {n_bf16:,} outputs differ "
      f"(from the {idx.size:,} weights of the {bad.size:,} blocks whose scale changed; "
      f"{np.unique(fused[bad]).size:,} distinct changed scales, so at most 16 x that many distinct products)")

# %% [markdown]
# With float32 output some weights of an affected block are off, by up to the ulps printed above. With bf16 output
# the 16 low bits are rounded away, so most or all of the damage hides: a scale that is one
# float32 ulp off changes a bf16 result only when the product lands within that ulp of a bf16
# rounding boundary. Only distinct products count (16 per distinct changed scale; the line above
# prints how many scales), and each lands near a boundary or not: on a small case that may be no
# output at all, and the last line above counts it on the main case (268 million weights on a
# GPU, a small case in the simulator), where it can be none as well. A bf16 test alone, small
# or large, can let this bug through: that is why the series checks the PTX. For these bf16-only
# kernels the PTX check (no `fma`) is the guard; verifying float32 outputs, from 06 on, catches
# the same bug in the kernels that write them.
#
# **The fix:** `nf4lab.device.ops.fmul_rn` / `fadd_rn` (on the GPU libdevice's `__fmul_rn` / `__fadd_rn`:
# libdevice is NVIDIA's library of device math functions; plain numpy in the simulator). They compile to `mul.rn.f32` / `add.rn.f32`, and the explicit
# rounding modifier keeps `ptxas` from fusing them later: the PTX ISA's `mul` and `add` entries
# (Floating Point Instructions) say an instruction with an explicit rounding modifier is treated
# conservatively by the code optimizer, and only mul/add sequences *without* one may be turned
# into fused multiply-adds. (Do not expect `fastmath=True` to help: the draft above was contracted
# without it, and by numba-cuda's "CUDA Fast Math" page it also flushes subnormals (denormals: nonzero
# values smaller in magnitude than float32's smallest normal number, 2^-126) to zero and
# approximates division and square root. The explicitly rounded `fmul_rn` / `fadd_rn` are the fix.)

# %% [markdown]
# <a id="bf16"></a>
# ## 4. Lesson: rounding float32 to bf16
#
# bf16 is the upper half of a float32. Taking the upper 16 bits *truncates*; bitsandbytes rounds
# to nearest (the cell below checks it on every output). Where a float32 lies exactly halfway
# between two bf16 values (an exact *tie*), only the tie rule decides; the cell counts the ties, and
# a case without any cannot show how bitsandbytes breaks them. The formula below breaks them to the
# even neighbour, as torch's conversion does
# (PyTorch's `c10/util/BFloat16.h`, `round_to_nearest_even`: the formula below for numbers, a NaN
# there becomes 0x7FC0; not run here). On
# the bits `u` of the float32:
#
# `bf16 = (u + 0x7FFF + ((u >> 16) & 1)) >> 16`
#
# (add just under half an ulp, plus one more if the kept part is odd, so exact halves go to the
# even neighbour). On a GPU of compute capability 8.0 or newer, `ops.to_bf16_bits` is the single
# instruction `cvt.rn.bf16.f32` (the PTX ISA's `cvt` entry: `.bf16` needs `sm_80`); on older ones
# (a T4 is 7.5, by the compute-capability table of NVIDIA's CUDA GPUs page,
# https://developer.nvidia.com/cuda-gpus) it is this formula in integers.

# %%
w32 = reference.dequantize_f32(case.packed, ref_scale, case.n, case.blocksize)
u = w32.view(np.uint32).astype(np.uint64)
rne = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
trunc = (u >> 16).astype(np.uint16)
print(f"round to nearest even: {np.count_nonzero(rne != case.expected)} of {case.n:,} differ from bitsandbytes")
print(f"truncation:            {np.count_nonzero(trunc != case.expected)} of {case.n:,} differ")
ties = (u & 0xFFFF) == 0x8000   # exact halves: the only inputs where the tie rule matters
print(f"exact ties in this case: {np.count_nonzero(ties):,}" + ("" if ties.any() else
      " (none: the tie rule is not exercised by this case)"))
print("ops.bf16_bits_py (the host twin of ops.to_bf16_bits) agrees on the first 8:",
      all(int(ops.bf16_bits_py(x)) == int(e) for x, e in zip(w32[:8], case.expected[:8])))
assert np.array_equal(rne, case.expected)

# %% [markdown]
# <a id="signed"></a>
# ## 5. Lesson: signed indices
#
# `cuda.grid(1)` is a signed int64, and so are `n` and `nbytes` when Python passes ints. Numba
# follows Python semantics: a negative index counts from the end, so an `array[i]` with a
# signed `i` gets the wraparound code whose sign test we saw in the draft (`shr.s64 ..., 63`).
#
# Making the index unsigned (`uint64(cuda.grid(1))`) removes it, but only **half-way** fixes
# things: comparing a `uint64` with an `int64` has no exact integer type in numba's typing
# rules, so both sides are converted to **float64** (`cvt.rn.f64.s64`, `setp.geu.f64`). `setp` sets a predicate
# (a one-bit register) from a comparison; the compiler tests the negation of `i < nbytes` and branches past the
# body when it holds, hence `ge` (`geu`: greater or equal, or unordered, for floats).
# Convert the sizes too.

# %%
@cuda.jit
def mixed(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    i = uint64(cuda.grid(1))                 # unsigned index ...
    if i < nbytes:                           # ... compared with a signed int64
        byte = packed[i]
        blk = i >> uint64(5)
        s = ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)
        j = uint64(2) * i
        out[j] = ops.to_bf16_bits(lut[byte >> 4] * s)
        if j + uint64(1) < n:
            out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * s)


mixed_ptx = nf4lab.compile_ptx(mixed, SIG)
ptx.show(mixed_ptx, [r"\.f64", r"^shr\.s64"])
ptx.check(mixed_ptx, present=[r"^cvt\.rn\.f64\.s64", r"^setp\.\w+\.f64"], absent=[r"^shr\.s64"])

# %% [markdown]
# <a id="kernel"></a>
# ## 6. The kernel
#
# Everything unsigned, the scale with `fmul_rn`/`fadd_rn`, bf16 by `ops.to_bf16_bits`, and the
# odd-n case handled: when n is odd the last byte holds a single weight (its low nibble is
# padding), and we must not write `out[n]`. Block and group indices are shifts by
# compile-time constants (numba freezes module globals into the kernel).
#
# `block_scale` is the first helper of the series that later notebooks reuse: they import it
# (and the two shifts) from `nf4lab.lesson`, which keeps the helpers you have already written;
# a test checks that the copy there is the code of this cell.

# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
from numba import cuda, uint64

from nf4lab.device import ops

THREADS = 256       # threads per thread block
BLOCK_SHIFT = 5     # 64 weights per quantization block = 32 packed bytes: block = byte index >> 5
GROUP_SHIFT = 8     # 256 quantization blocks per absmax2 group


@cuda.jit(device=True, inline="always")
def block_scale(absmax_q, absmax2, code2, offset, blk):
    """code2[absmax_q[blk]] * absmax2[group] + offset, both operations rounded (never an FMA)."""
    return ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(GROUP_SHIFT)]), offset)


@cuda.jit
def dequant_naive(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    n = uint64(n)
    nbytes = uint64(nbytes)
    i = uint64(cuda.grid(1))                  # one thread per packed byte
    if i < nbytes:
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        j = uint64(2) * i
        out[j] = ops.to_bf16_bits(lut[byte >> 4] * s)               # high nibble first
        if j + uint64(1) < n:                                       # odd n: last byte has one weight
            out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * s)


def launch(b):
    if b.dtype != "bf16":
        raise ValueError(f"this kernel writes bf16, the case wants {b.dtype}")
    blocks = (b.nbytes + THREADS - 1) // THREADS
    dequant_naive[blocks, THREADS, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                             b.out, b.n, b.nbytes)


VERSIONS = {"01 naive (per byte)": launch}

# %% [markdown]
# <a id="ptx"></a>
# ## 7. PTX evidence
#
# Separately rounded `mul.rn.f32` + `add.rn.f32` and no `fma`; unsigned comparisons and no
# float64; no wraparound; exactly two 16-bit stores (`st.global.u16`), as designed.

# %%
naive_ptx = nf4lab.compile_ptx(dequant_naive, SIG)
ptx.show(naive_ptx, [r"^(mul|add)\.rn\.f32", r"^setp", r"^st\.global", r"^cvt\.rn\.bf16"])
ptx.check(naive_ptx, present=[r"^mul\.rn\.f32", r"^add\.rn\.f32", r"^setp\.\w+\.u64", r"^cvt\.rn\.bf16\.f32"],
          absent=[r"^fma", r"\.f64", r"^shr\.s64", r"^(div|rem)\."])
assert ptx.count(naive_ptx, r"^st\.global\.(u16|b16)") == 2

# %% [markdown]
# <a id="verify"></a>
# ## 8. Verification
#
# Bit for bit against bitsandbytes, on the default case and on shapes that break sloppy
# kernels (odd n, a single weight, partial blocks and groups), and on three weight
# distributions: *randn* (normal weights, the main case's), *heavy* (Student-t weights times a
# per-row scale: outliers) and *codes* (every block holds all 16 NF4 levels), described in
# `nf4lab/harness/cases.py`. A mismatch raises `VerificationError` with an explanation and stops the
# notebook. (In the simulator we use a subset of the edge shapes to keep it fast.)

# %%
nf4lab.verify_versions({"01 naive": launch}, case);

# %% [markdown]
# <a id="bench"></a>
# ## 9. Benchmark
#
# On a GPU, `bench.step` verifies the kernel once more on 16384 x 16384, times it through a
# CUDA graph (GPU time, without the host's cost of each launch; see 00) next to the ceilings of 00 (copy, fill, the
# traffic-matched bound), measured again in this run, and bitsandbytes, all in the same run, and records the run. It also
# measures the host time per call (`host_ms`: calls back to back, synchronized at the end). A
# numba launch from Python has a host cost of its own, which is why GPU time is measured with
# CUDA graphs (00 shows the timing loop); back to back, those launches can overlap with the kernels
# already queued, so on a kernel that runs longer than a launch takes, `host_ms` should come out close
# to the GPU time (the cell below prints both) and need not show the launch cost. In the simulator it
# shows the recorded run.

# %%
# The contract: one size, 16384 x 16384 -> bf16 (make_case's default on a GPU); each version timed
# in one run against the copy and fill ceilings and the traffic-matched bound (00's, measured again in this run) and bitsandbytes;
# GB/s = bytemodel.bytes_moved(n, "bf16", 64) / GPU time (median of CUDA-graph replays, as in 00).
run = bench.step("01_naive", VERSIONS)
if run is not None and run.recorded:          # loaded from disk (no GPU here); on a GPU bench.step printed it
    print(run.table())
if run is not None:
    k = run.get("01 naive (per byte)")
    if k is not None:
        print(f"\n01 naive: {k['gbps']:.0f} GB/s = {k['pct_copy']:.0f}% of the copy ceiling, "
              f"{k['speedup_vs_bnb']:.2f}x bitsandbytes; host time per call {k.get('host_ms', float('nan')):.3f} ms "
              f"vs {k['ms']:.3f} ms of GPU time")

# %%
plots.progress("01_naive");

# %% [markdown]
# <a id="learned"></a>
# ## 10. What we learned
#
# * Correctness first, and *bit-exact*: `a * b + c` in float32 becomes `fma.rn.f32`, which rounds
#   once instead of twice. The simulator cannot see it; the PTX can, and so can a float32-output
#   case. Use `ops.fmul_rn` / `ops.fadd_rn` and assert `absent=[r"^fma"]`.
# * bf16 conversion rounds to nearest (`cvt.rn.bf16.f32`, or the integer formula; both send ties to even,
#   which a case needs exact halves to test, as section 4 printed); truncating
#   gets a large share of the outputs wrong (section 4 counts them).
# * Unsigned indices and sizes: signed ones bring negative-index wraparound code, mixed
#   signed/unsigned comparisons go through float64.
# * The numbers (table and plot above) say how far one byte per thread with two 16-bit stores is
#   from the ceiling. The next steps change *how* the bytes move, not how many.
#
# Next, [02 · grid-stride loop](02_grid_stride.ipynb).

# %% [markdown]
# <a id="exercises"></a>
# ## 11. Exercises
#
# `nf4lab.check(launch, ...)` runs your launch function on several small cases and verifies
# every output bit for bit; it prints PASSED or the explanation of what is wrong.
#
# ### Exercise 1: a colleague's loop over nibbles
#
# A colleague wrote the kernel with a loop over the two nibbles of a byte, which reads nicely
# and generalises to other bit widths. It is not bit-exact. Run the cell, read the message,
# and fix the kernel (keep the loop).

# %%
### BEGIN SOLUTION
@cuda.jit
def nibble_loop(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    n = uint64(n)
    nbytes = uint64(nbytes)
    i = uint64(cuda.grid(1))
    if i < nbytes:
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        for k in range(2):
            j = uint64(2) * i + uint64(k)
            q = (byte >> (4 - 4 * k)) & 15          # high nibble first: k = 0 takes bits 7..4
            if j < n:
                out[j] = ops.to_bf16_bits(lut[q] * s)
### STUDENT
# TODO: this kernel is not bit-exact. Run the check, read its message, fix the kernel
# (one line changes).
@cuda.jit
def nibble_loop(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    n = uint64(n)
    nbytes = uint64(nbytes)
    i = uint64(cuda.grid(1))
    if i < nbytes:
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        for k in range(2):
            j = uint64(2) * i + uint64(k)
            q = (byte >> (4 * k)) & 15
            if j < n:
                out[j] = ops.to_bf16_bits(lut[q] * s)
### END SOLUTION


def launch_nibble_loop(b):
    blocks = (b.nbytes + THREADS - 1) // THREADS
    nibble_loop[blocks, THREADS, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                           b.out, b.n, b.nbytes)


SMALL = ((3, 5), (1, 65), (7, 33), (31, 67))
result = nf4lab.check(launch_nibble_loop, name="exercise 1: nibble loop", shapes=SMALL)
### BEGIN SOLUTION
assert result
### STUDENT
### END SOLUTION

# %% [markdown]
# ### Exercise 2: what happens at blocksize 128?
#
# bitsandbytes also quantizes with blocks of 32, 128, 256, ... weights. **Predict first:** what
# does `dequant_naive` (which hard-codes 64) produce on a blocksize-128 case? Which weights are
# right, which are wrong, and could it read memory it should not? Then run the cell and compare.
#
# Then make the block size a parameter: a kernel that takes the shift (`log2` of the bytes per
# block) as an argument, computed in `launch` from `b.blocksize`. The absmax2 group stays 256
# blocks at every block size (the blocksize-32 check includes a tensor of two groups).

# %%
### BEGIN SOLUTION
# The prediction, checked: 01's hard-coded kernel on blocksize-128 cases. nf4lab.check stops at
# the first wrong shape; here that comes before the one shape whose read would leave absmax_q (the
# lines below show which). Not a guarantee: had the shapes before 31x67 all passed, the check would have launched on it too.
hard = nf4lab.check(launch, name="01's kernel at blocksize 128", blocksize=128, shapes=SMALL, verbose=False)
print(hard.report if hard.report is not None else hard.error or "bit-exact on every shape: not what we predicted")
for rows, cols in SMALL:
    n = rows * cols
    nblocks = -(-n // 128)
    print(f"{rows}x{cols}: largest block index (nbytes - 1) >> 5 = {(-(-n // 2) - 1) >> 5}, "
          f"blocks in the case {nblocks}, absmax_q entries after padding to 16: {-(-nblocks // 16) * 16}")


@cuda.jit
def dequant_any_blocksize(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes, block_shift):
    n = uint64(n)
    nbytes = uint64(nbytes)
    i = uint64(cuda.grid(1))
    if i < nbytes:
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(block_shift))
        j = uint64(2) * i
        out[j] = ops.to_bf16_bits(lut[byte >> 4] * s)
        if j + uint64(1) < n:
            out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * s)


def launch_any_blocksize(b):
    block_shift = (b.blocksize // 2).bit_length() - 1      # bytes per block is a power of two
    blocks = (b.nbytes + THREADS - 1) // THREADS
    dequant_any_blocksize[blocks, THREADS, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                     b.out, b.n, b.nbytes, block_shift)
### STUDENT
# TODO: predict, run, then replace this with a kernel that takes the block size into account
# (about 18 lines: 01's kernel with a shift argument, and a launch that computes it).
def launch_any_blocksize(b):
    launch(b)   # the 01 kernel: 64 weights per block, hard-coded
### END SOLUTION


result = all([nf4lab.check(launch_any_blocksize, name="exercise 2: blocksize 128", blocksize=128, shapes=SMALL),
              nf4lab.check(launch_any_blocksize, name="exercise 2: blocksize 32", blocksize=32,
                           shapes=SMALL + ((1, 8195),))])   # 257 blocks of 32: absmax2 group 1 starts at weight 8192
### BEGIN SOLUTION
assert result
### STUDENT
### END SOLUTION

# %% [markdown]
# ### BEGIN SOLUTION
# *What to notice:* with blocks of 128 the hard-coded kernel uses block `i >> 5` where the
# right one is `i >> 6`. Only the first 64 weights are sure of the right scale: the first
# wrong index that the cell's first check lists is 64 or more. On any shape of more than 64
# weights the kernel also asks for blocks the case does not have: the largest block index it
# computes, `(nbytes - 1) >> 5`, is at least the case's block count and up to about twice it (the
# lines the cell prints). The buffers pad `absmax_q` with zeros to a multiple of 16 entries, so
# where the printed index is below the padded count the read lands in the padding, and where it
# is not, past the array's end. The simulator raises `IndexError` for a read past an array's
# end; a kernel compiled by numba has no bounds check, so on a GPU the read returns whatever lies there
# (or faults, if it leaves mapped memory; this notebook does not run it), and may even get the right value by luck (a shape
# can pass while reading the padding, where the `absmax_q` it should have read is 0 too).
# Bounds are the kernel's job, not the hardware's.
# ### STUDENT
# *What to notice:* compare the index of the first wrong weight with the block size. Then
# answer the question above by printing what the kernel computes beside what the case has.
# ### END SOLUTION
