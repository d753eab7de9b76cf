# 03 -- Packed u32 stores: both outputs of a byte in one 32-bit store.
#
# Percent-format source of notebooks/03_packed_u32.ipynb (build: python tools/build_notebooks.py 03_packed_u32).

# %% [markdown]
# # 03 · Packed u32 stores: one store per byte
#
# **Goal.** Nearly four fifths of the bytes we move are writes (00's byte model), and the
# kernels so far write them two bytes at a time: two `st.global.u16` per packed byte. The two
# weights of a byte are adjacent in the output, so they fit in one 32-bit word. Here we convert
# both at once (`ops.pack_bf16x2`: one `cvt.rn.bf16x2.f32` on compute capability 8.0 and newer, as the
# PTX ISA's `cvt` entry requires `sm_80` for `.bf16x2`; integer rounding on a T4) and write them with one `st.global.u32`, halving the store
# instructions, and handle the one case where that would be wrong: the last byte of an
# odd-length tensor, which holds a single weight.
#
# **Contents**
# 1. [Prediction](#prediction)
# 2. [The kernel](#kernel)
# 3. [PTX evidence](#ptx)
# 4. [Verification](#verify)
# 5. [Benchmark](#bench)
# 6. [What we learned](#learned)
# 7. [Exercises](#exercises)

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import numpy as np
from numba import cuda, uint64

from nf4lab.measure import bench, profiling, ptx
from nf4lab.format import bytemodel, reference
from nf4lab.device import ops
from nf4lab.lesson import exercises, plots
from nf4lab.harness import versions

print(nf4lab.describe())
case = nf4lab.make_case()
print(case)
SIG = ("(uint8[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, uint16[::1], uint32[::1], "
       "int64, int64)")

# %% [markdown]
# <a id="prediction"></a>
# ## 1. Prediction
#
# The byte model's bytes do not change (whether DRAM sees the same bytes is predicted below, not
# measured here); what changes is how many store
# instructions carry them, and how much each warp store covers:

# %%
N_BIG = 16384 * 16384
out_bytes = bytemodel.breakdown(N_BIG)["output"]
for name, width in (("01/02: two 16-bit stores per byte", 2), ("03: one 32-bit store per byte", 4)):
    print(f"{name:<36} {out_bytes // width:>12,} store instructions (thread level), "
          f"{32 * width} bytes per warp store")
print(f"writes: {out_bytes / bytemodel.bytes_moved(N_BIG):.1%} of the bytes moved (00's byte model)")

# %% [markdown]
# Half the store instructions, each warp store writing 128 contiguous bytes (a full cache
# line, 02's 128 bytes) instead of 64 bytes in every other
# 2-byte slot of the same 128. L2 should merge the two
# 16-bit stores of 01 into the same lines before they reach DRAM, so the DRAM traffic should
# be the same; what we save is instruction issue and load/store-unit work per byte (the
# load/store units: the parts of an SM that execute memory instructions, computing addresses and
# sending requests to the caches). Our
# prediction: **some gain if those instructions were part of the limit, none if DRAM latency
# was all of it**; and, we expect, not the ceiling either way, because each thread still loads a
# single byte per iteration (02's PTX showed that its grid-stride loop issues an iteration's
# loads only after the previous iteration's stores, so a thread has one iteration's loads in
# flight; section 3 prints the order of 03's loop too). The benchmark measures 01 and 02 in the same run, so
# that each 03 version is compared with the kernel it differs from *in source* by the store alone
# (and its conversion: one bf16x2 pack instead of two bf16 conversions). The compiled loops may differ
# too: section 3 prints the grid-stride version's loads and stores in PTX order, to set beside 02's;
# what any difference there costs in time is not measured here.
#
# Bit order: `out[2j]` (the high nibble) is at the lower address, and on a little-endian machine
# the lower address holds the *low* half of a 32-bit word. `ops.pack_bf16x2(lo, hi)` puts `lo` in
# the low half, so `lo` is the high nibble's weight. The check below runs in numpy on the host,
# which is little-endian; so is the GPU as the compiler sees it (the `e` that starts the target data
# layout numba-cuda gives NVVM, `numba_cuda/numba/cuda/cudadrv/nvvm.py`, is LLVM's mark for
# little-endian), and on a GPU section 4's bit-exact verification confirms the order there:

# %%
w = reference.dequantize_f32(case.packed, reference.block_absmax(case.absmax_q, case.absmax2, case.code2,
                                                                 case.offset), case.n, case.blocksize)
# the first pair whose two weights differ: with equal halves the check could not tell the order
j = next(j for j in range(0, case.n - 1, 2) if case.expected[j] != case.expected[j + 1])
word = int(ops.bf16_bits_py(w[j])) | (int(ops.bf16_bits_py(w[j + 1])) << 16)   # pack_bf16x2(w[j], w[j + 1])
print(f"weights {j} and {j + 1} as bf16: 0x{case.expected[j]:04x}, 0x{case.expected[j + 1]:04x}; "
      f"packed word 0x{word:08x}")
assert np.array([word], dtype=np.uint32).view(np.uint16).tolist() == case.expected[j:j + 2].tolist()

# %% [markdown]
# <a id="kernel"></a>
# ## 2. The kernel
#
# Two versions: the packed store on 01's one-thread-per-byte layout, and on 02's grid-stride
# loop, so that the measurement separates the effect of the store from the effect of the loop.
# `block_scale` and the grid sizing are the ones written in 01 and 02 (`nf4lab.lesson`).
# `b.out_u32` is the same memory as `b.out`, viewed as 32-bit words: word `i` holds outputs
# `2i` and `2i+1`. When n is odd the last byte has one weight, and a 32-bit store would write
# `out[n]`, one past the end: that byte gets a 16-bit store instead.

# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
from numba import cuda, uint64

from nf4lab.device import ops

from nf4lab.lesson import BLOCK_SHIFT, block_scale, blocks_per_sm, grid_for  # written in 01 and 02

THREADS = 256


@cuda.jit(device=True, inline="always")
def dequant_byte(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, i):
    byte = packed[i]
    s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
    hi_w = lut[byte >> 4] * s               # out[2i]: the high nibble, the lower address
    if uint64(2) * i + uint64(1) < n:
        out_u32[i] = ops.pack_bf16x2(hi_w, lut[byte & 15] * s)   # one 32-bit store, low half = out[2i]
    else:
        out[uint64(2) * i] = ops.to_bf16_bits(hi_w)              # odd n: the last byte holds one weight


@cuda.jit
def dequant_u32(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, nbytes):
    i = uint64(cuda.grid(1))
    if i < uint64(nbytes):
        dequant_byte(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, uint64(n), i)


@cuda.jit
def dequant_u32_grid_stride(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, nbytes):
    n = uint64(n)
    nbytes = uint64(nbytes)
    for i in range(uint64(cuda.grid(1)), nbytes, uint64(cuda.gridsize(1))):
        dequant_byte(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, i)


def _args(b):
    if b.dtype != "bf16":
        raise ValueError(f"this kernel writes bf16, the case wants {b.dtype}")
    return (b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32, b.n, b.nbytes)


def launch(b):
    dequant_u32[(b.nbytes + THREADS - 1) // THREADS, THREADS, b.stream](*_args(b))


def launch_grid_stride(b):
    grid = grid_for(b.nbytes, THREADS, blocks_per_sm(THREADS))     # 02's full-occupancy grid
    dequant_u32_grid_stride[grid, THREADS, b.stream](*_args(b))


VERSIONS = {
    "03 packed u32 (per byte)": launch,
    "03 packed u32 (grid-stride)": launch_grid_stride,
}

# %% [markdown]
# <a id="ptx"></a>
# ## 3. PTX evidence
#
# One `cvt.rn.bf16x2.f32` and one `st.global.u32` for the main path; the single
# `st.global.u16` (with its `cvt.rn.bf16.f32`) is the odd-n tail, on the other side of the
# branch. Still no `fma`, no float64. (The two `cvt` exist from compute capability 8.0; PTX for
# a T4, sm_75, rounds in integer instructions instead; there the check below prints a line
# saying so.)

# %%
u32_ptx = nf4lab.compile_ptx(dequant_u32, SIG)
ptx.show(u32_ptx, [r"^st\.global", r"^cvt\.rn\.bf16", r"^setp"])
ptx.check(u32_ptx, present=[r"^st\.global\.(u32|b32)", r"^cvt\.rn\.bf16x2\.f32", r"^mul\.rn\.f32", r"^add\.rn\.f32"],
          absent=[r"^fma", r"\.f64", r"^st\.global\.v"])
assert ptx.count(u32_ptx, r"^st\.global\.(u32|b32)") == 1
assert ptx.count(u32_ptx, r"^st\.global\.(u16|b16)") == 1      # the tail only
# The grid-stride version's global loads (L) and stores (S) in PTX order, as 02 printed its own: the copies of the
# loop body one after another, each loading after the previous copy's stores.
seq = [t for t in map(str.strip, nf4lab.compile_ptx(dequant_u32_grid_stride, SIG).splitlines())
       if t.startswith(("ld.global", "st.global", "bra"))]          # "bra": unconditional branches only
order = "".join("L" if t.startswith("ld.") else "S" for t in seq if t.startswith(("ld.", "st.")))
print(f"grid-stride version, global loads (L) and stores (S) in PTX order: {order}")
# In 02 a copy's two S were two 16-bit stores, the second skipped only for an odd n's last byte. Here: W a 32-bit store, H a 16-bit one, b an
# unconditional branch; "WbH" is a 32-bit path that ends in a branch instead of running on into the tail's store.
kinds = "".join("L" if t.startswith("ld.") else "b" if t.startswith("bra") else
                "W" if t.startswith(("st.global.u32", "st.global.b32")) else "H" for t in seq)
if kinds.count("WbH") == kinds.count("W") == kinds.count("H") > 0:
    print(f"  each copy's two S: its 32-bit store, then the odd-n tail's 16-bit store, with an unconditional branch "
          f"(bra.uni) between them that ends the 32-bit path: alternatives, one of them runs per byte "
          f"({kinds.count('W')} such pairs)")
else:
    print("  this PTX does not put an unconditional branch between each 32-bit store and a 16-bit store: read the "
          "PTX itself to tell which stores run together")

# %% [markdown]
# Where is that one 16-bit store? The PTX from the conditional branch (`@%p bra`) before the two stores shows
# it on the side reached only by the last byte of an odd n:

# %%
# the instructions and the labels the branches jump to (ptx.instructions drops labels)
lines = [s for s in (ln.strip() for ln in u32_ptx.splitlines()) if s and not s.startswith(("//", ".", "{", "}"))]
store16 = next(k for k, s in enumerate(lines) if s.startswith("st.global.u16"))
store32 = next(k for k, s in enumerate(lines) if s.startswith("st.global.u32"))
branch = max((k for k, s in enumerate(lines[:min(store16, store32)]) if s.startswith("@") and " bra" in s),
             default=min(store16, store32) - 4)
for s in lines[branch: max(store16, store32) + 2]:
    print("   ", s)

# %% [markdown]
# <a id="verify"></a>
# ## 4. Verification
#
# The tail is exactly what the edge shapes with an odd n test (printed below). Verification also fills the bytes just past the output with a *poisoned
# guard* (a value no correct kernel writes) and checks them after every launch.

# %%
print("edge shapes with an odd n:", [s for s in nf4lab.edge_shapes() if s[0] * s[1] % 2])
# (1, 64): one quantization block, an even n, no tail at all. On a GPU it is already an edge shape, and
# verify_versions does not repeat it (the count it prints is the edge shapes'); the simulator's subset lacks it.
nf4lab.verify_versions(VERSIONS, case, extra_shapes=[(1, 64)]);

# %% [markdown]
# <a id="bench"></a>
# ## 5. Benchmark
#
# Both versions, and the two kernels they are compared with, in one run: 01 (one thread per
# byte, two 16-bit stores) and 02 at full occupancy (the same with a grid-stride loop), loaded
# from their notebooks' `kernel` cells. The plot after the table also draws the earlier steps'
# other kernels from their own runs; each such bar names its run.

# %%
# The contract: one size, 16384 x 16384 -> bf16 (make_case's default on a GPU); each version timed
# in one run against the copy and fill ceilings and the traffic-matched bound (00's, measured again in this run) and bitsandbytes;
# GB/s = bytemodel.bytes_moved(n, "bf16", 64) / GPU time (median of CUDA-graph replays, as in 00).
BASELINE = {**versions.load("01_naive"), "02 grid-stride (full occupancy)":
            versions.load("02_grid_stride")["02 grid-stride (full occupancy)"]}
run = bench.step("03_packed_u32", {**BASELINE, **VERSIONS})
if run is not None and run.recorded:          # loaded from disk (no GPU here); on a GPU bench.step printed it
    print(run.table())

# %%
plots.progress("03_packed_u32");

# %% [markdown]
# Against the prediction, like with like: the per-byte packed kernel against 01, the
# grid-stride one against 02. A change no larger than `bench.NOISE_PCT` (the series' one noise
# margin, printed below) counts as none, within noise. A change past the margin but within twice it
# is near: printed as such, with no direction called until a re-run. Only a change past twice the
# margin counts as a gain or a loss and decides the verdict (00's rule, `bench.noise_band`'s "beyond").
# The cell first prints how far 01's and 02's kernels, timed again in this run, lie from
# their own notebooks' records: the same kernel in two runs. Those lines show how much one
# kernel's number moved between this run and another; they do not measure the margin.
# The margin is for kernels timed in one run. Records of other runs may lie further apart than
# it, even on the same day (another run may get another card of the same model, at its own clocks
# and temperature), so every verdict below compares kernels of this run. A change close to twice
# the margin can land on either side of it from one execution to the next: the solution twin,
# executed at the same time on another GPU, may print another verdict for it.

# %%
NOISE_PCT = bench.NOISE_PCT
print(f"noise margin: {NOISE_PCT}% (a change counts as a gain or a loss only past twice it)")
# The same kernel in two runs: this run's number against the record of the notebook that wrote it.
for nb, name in (("01_naive", "01 naive (per byte)"), ("02_grid_stride", "02 grid-stride (full occupancy)")):
    own = bench.Run.load(nb)
    here, there = (run.get(name) if run is not None else None), (own.get(name) if own is not None else None)
    if here and there:
        print("  " + bench.run_to_run(name, here, own, nb))
PAIRS = (("03 packed u32 (per byte)", "01_naive", "01 naive (per byte)"),
         ("03 packed u32 (grid-stride)", "02_grid_stride", "02 grid-stride (full occupancy)"))
changes = {}                           # version -> change in %, as printed (one decimal)
for name, nb, base_name in (PAIRS if run is not None else ()):
    r, base = run.get(name), run.get(base_name)
    if r is not None and base is None and bench.Run.load(nb) is not None:   # recorded before baselines were re-timed
        other = bench.Run.load(nb).get(base_name)
        if other:
            print(f"{name}: {r['gbps']:.0f} GB/s; {base_name}: {other['gbps']:.0f} GB/s in {nb}'s own run: two runs, "
                  "so no verdict against the margin")
        continue
    if r is None or base is None:
        continue
    change = bench.change_pct(r, base)   # from the GB/s as printed, to one decimal
    changes[name] = change
    print(f"{name}: {r['gbps']:.0f} GB/s vs {base_name}: {base['gbps']:.0f} GB/s, {change:+.1f}%")
# 00's rule (bench.noise_band): only a change past twice the margin ("beyond") is a gain or a loss; a "near" one
# (past the margin, within twice it) gets no direction until a re-run; a "within" one is none.
band = {k: bench.noise_band(c) for k, c in changes.items()}
gains = {k: c for k, c in changes.items() if band[k] == "beyond" and c > 0}
losses = {k: c for k, c in changes.items() if band[k] == "beyond" and c < 0}
near = [k for k in changes if band[k] == "near"]
if_near = (f" (not counting the near change{'s' if len(near) > 1 else ''} below, which need{'' if len(near) > 1 else 's'}"
           " a re-run)" if near else "")
# Whose numbers these are: this run's, or a recorded GPU's (no GPU here).
where = "on this GPU" if run is not None and not run.recorded else \
    f"on the {(run.meta.get('gpu') if run is not None else None) or 'recorded GPU'} (recorded)"
# Not measured here: whether DRAM sees the same bytes (08's recorded profiles count DRAM bytes per version,
# on the GPU each profile names, which need not be this one).
l2_note = ("DRAM likely sees the same bytes either way (L2, the cache in front of DRAM, probably merges "
           "01's 16-bit stores into whole lines before writing them back; 08 prints DRAM bytes per version "
           "from Nsight Compute profiles recorded on the GPU it names, not measured in this notebook)")
if not changes:
    print("no recorded runs of 01, 02 and 03 to compare yet")
elif gains and losses:
    up = [f"{k} ({c:.1f}%)" for k, c in gains.items()]
    down = [f"{k} ({-c:.1f}%)" for k, c in losses.items()]
    print(f"mixed {where}{if_near}: the packed store gained in "
          f"{', '.join(up)} and lost in {', '.join(down)}, which the prediction (some gain, or none) did not "
          "foresee. The cause was not measured here: the pack (cvt.rn.bf16x2) is in both versions, so it alone "
          "does not explain it; the two kernels differ in how their loads and stores are scheduled (one byte a thread "
          "against a grid-stride loop like 02's, whose PTX 02 showed unrolled; section 3 prints 03's loop's load and store order), and " + profiling.where_to_look(
              run.meta.get("gpu"), [n for pair in PAIRS for n in (pair[0], pair[2])]) + ".")
elif losses:
    print(f"no gain from the packed store {where}{if_near}: {len(losses)} of {len(changes)} comparisons slower by "
          f"more than twice the {NOISE_PCT}% margin (up to {-min(losses.values()):.1f}%)"
          + {0: "", 1: ", the other not past twice it"}.get(len(changes) - len(losses), ", the others not past twice it")
          + ", which the prediction (some gain, or none) did not foresee. The cause was not measured here: the pack "
          "(cvt.rn.bf16x2) takes the place of 01's and 02's two conversions, so it is no extra work; the compiled "
          "code may differ beyond the store (section 3 prints the grid-stride loop's load and store order, to set "
          "beside the one 02 printed; nothing else in the compiled code was compared here), and " + profiling.where_to_look(run.meta.get("gpu"), [n for pair in PAIRS for n in (pair[0], pair[2])])
          + ". 04 widens the loads.")
elif gains and max(gains.values()) >= 10:
    print(f"a clear gain from the packed store (up to {max(gains.values()):.1f}%) {where}{if_near}: issuing the stores "
          "was likely a real part of what limited one byte per thread.")
elif gains:
    print(f"a small gain from the packed store (up to {max(gains.values()):.1f}%) {where}{if_near}: the store instructions "
          "were likely a small part of the limit; most of the time probably still goes to waiting for "
          f"one-byte loads, and {l2_note}. 04 widens the loads.")
elif near:
    print(f"no settled gain or loss from the packed store {where}: no change is past twice the {NOISE_PCT}% noise "
          "margin, and the near one" + ("s" if len(near) > 1 else "") + " below get" + ("" if len(near) > 1 else "s")
          + " no direction until a re-run.")
else:
    print(f"no measured gain from the packed store {where}: every change is within the {NOISE_PCT}% noise "
          "margin (the 'none' of the prediction)"
          + ". The store instructions were likely not the limit: the threads probably spend their time "
          f"waiting for their one-byte loads, and {l2_note}. Halving instructions pays only where "
          "instructions are the limit: 04 widens the loads.")
for name in near:
    print(f"  {name}: {changes[name]:+.1f}% is near (past the {NOISE_PCT}% margin, within twice it): "
          "no direction until a re-run")

# %% [markdown]
# <a id="learned"></a>
# ## 6. What we learned
#
# * One 32-bit store per byte instead of two 16-bit ones halves the store instructions but not
#   the bytes. Whether that is faster depends on what limits the kernel: the like-with-like
#   comparison above says what it bought (or cost) on the GPU whose results it shows, against the
#   noise margin; the run-to-run lines show how far one kernel moved between two runs. An
#   optimization that gains nothing, or loses, is a measurement worth keeping: it says where the
#   limit is *not*.
# * `cvt.rn.bf16x2.f32` (compute capability 8.0 and newer) converts two floats with
#   round-to-nearest-even in one instruction; `ops.pack_bf16x2` falls back to integer rounding
#   on a T4. Either way, mind which half is which (the lower address is the low half).
# * Wider stores bring a tail: whenever a store covers more than one output, the end of the
#   tensor needs a narrower store, or the kernel writes past `n`. Poisoned guard regions in the
#   verification catch it.
# * Each thread still reads one byte per iteration. 04 widens the loads and stores further
#   (one 128-bit load of codes and 128-bit stores per thread), and 05 moves the LUT.
#
# Next, [04 · vector loads](04_vector_loads.ipynb).

# %% [markdown]
# <a id="exercises"></a>
# ## 7. Exercises
#
# ### Exercise 1: four weights, one 64-bit store
#
# One step further than section 2: each thread takes two adjacent packed bytes (four weights, always
# in the same quantization block, so one scale) and writes them with **one 64-bit store**
# (`st.global.u64`) through `out_u64`, the output viewed as 64-bit words: word `t` holds outputs
# `4t` to `4t + 3`, the lowest address in the low 16 bits. The kernel below does that in every
# thread. The check runs its shapes from the smallest up and stops at the first wrong one.
# **Predict** what it reports for the first shape it runs, 1 x 1 (a single weight), then run it and
# read the message. Then make it right for every n: bit-exact whatever n mod 4 is, and still one
# 64-bit store wherever four weights are left (the goal). Before you run the check again, go through
# n mod 4 = 0, 1, 2 and 3: how many weights does the last thread have, and what may it write? The
# check verifies the bits on shapes with every remainder of n mod 4, and that the kernel's PTX has a
# 64-bit store (`st.global.u64`): a kernel without one does not pass. Which threads take that store
# it does not check: that four weights go out as one 64-bit store wherever four are left is yours
# to make sure of.

# %%
SIG64 = ("(uint8[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, uint16[::1], uint32[::1], "
         "uint64[::1], int64, int64)")


### BEGIN SOLUTION
@cuda.jit
def u64_store(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, out_u64, n, nbytes):
    t = uint64(cuda.grid(1))                 # weights 4t .. 4t+3, bytes 2t and 2t+1
    n = uint64(n)
    i = uint64(2) * t
    if i < uint64(nbytes):
        b0, b1 = packed[i], packed[i + uint64(1)]     # packed is zero-padded: byte i+1 exists
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        lo = ops.pack_bf16x2(lut[b0 >> 4] * s, lut[b0 & 15] * s)     # outputs 4t, 4t+1
        j = uint64(4) * t
        if j + uint64(3) < n:
            hi = ops.pack_bf16x2(lut[b1 >> 4] * s, lut[b1 & 15] * s)
            out_u64[t] = uint64(lo) | (uint64(hi) << uint64(32))
        elif j + uint64(1) < n:              # 2 or 3 weights left
            out_u32[uint64(2) * t] = lo
            if j + uint64(2) < n:
                out[j + uint64(2)] = ops.to_bf16_bits(lut[b1 >> 4] * s)
        else:                                # 1 weight left
            out[j] = ops.to_bf16_bits(lut[b0 >> 4] * s)
### STUDENT
# TODO: predict, run the check, read the message, then make the end right (about 8 lines).
@cuda.jit
def u64_store(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, out_u64, n, nbytes):
    t = uint64(cuda.grid(1))                 # weights 4t .. 4t+3, bytes 2t and 2t+1
    n = uint64(n)
    i = uint64(2) * t
    if i < uint64(nbytes):
        b0, b1 = packed[i], packed[i + uint64(1)]     # packed is zero-padded: byte i+1 exists
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        lo = ops.pack_bf16x2(lut[b0 >> 4] * s, lut[b0 & 15] * s)     # outputs 4t, 4t+1
        hi = ops.pack_bf16x2(lut[b1 >> 4] * s, lut[b1 & 15] * s)     # outputs 4t+2, 4t+3
        out_u64[t] = uint64(lo) | (uint64(hi) << uint64(32))
### END SOLUTION


def launch_u64(b):
    pairs = (b.nbytes + 1) // 2              # one thread per two packed bytes
    u64_store[(pairs + THREADS - 1) // THREADS, THREADS, b.stream](*_args(b)[:8], b.out.view(np.uint64),
                                                                   b.n, b.nbytes)


result = exercises.check_u64_store(launch_u64, u64_store, SIG64)
### BEGIN SOLUTION
assert result


# The prediction's answer: the starting point (a 64-bit store in every thread) on the first shape the check
# runs, 1 x 1, and on one shape of each other n mod 4.
@cuda.jit
def u64_as_given(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, out_u64, n, nbytes):
    t = uint64(cuda.grid(1))
    i = uint64(2) * t
    if i < uint64(nbytes):
        b0, b1 = packed[i], packed[i + uint64(1)]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        lo = ops.pack_bf16x2(lut[b0 >> 4] * s, lut[b0 & 15] * s)
        hi = ops.pack_bf16x2(lut[b1 >> 4] * s, lut[b1 & 15] * s)
        out_u64[t] = uint64(lo) | (uint64(hi) << uint64(32))


def launch_as_given(b):
    pairs = (b.nbytes + 1) // 2
    u64_as_given[(pairs + THREADS - 1) // THREADS, THREADS, b.stream](*_args(b)[:8], b.out.view(np.uint64),
                                                                      b.n, b.nbytes)


for shape in ((1, 1), (1, 2), (3, 5), (1, 64)):
    given = nf4lab.check(launch_as_given, name="the starting point", shapes=(shape,),
                         verbose=False)
    print(f"n = {shape[0] * shape[1]} (n mod 4 = {shape[0] * shape[1] % 4}): "
          + str(given.report if given.report is not None else given.error or "bit-exact"))
### STUDENT
### END SOLUTION

# %% [markdown]
# ### Exercise 2: fp16 output
#
# bitsandbytes also dequantizes to float16. Write a launch function that works for a bf16 case
# *and* an fp16 case. Think about what must change: the rounding (`ops.pack_f16x2`,
# `ops.to_f16_bits`: float16 has a different exponent range, so it is not "the upper half"),
# and how one `launch` picks the kernel for `b.dtype`. Numba kernels are compiled per argument
# types, not per value: a separate kernel per dtype is the simple way.

# %%
SMALL = ((3, 5), (1, 64), (1, 65), (7, 33))   # the shapes exercises 2 and 3 check


### BEGIN SOLUTION
@cuda.jit
def dequant_u32_f16(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, nbytes):
    i = uint64(cuda.grid(1))
    n = uint64(n)
    if i < uint64(nbytes):
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        if uint64(2) * i + uint64(1) < n:
            out_u32[i] = ops.pack_f16x2(lut[byte >> 4] * s, lut[byte & 15] * s)
        else:
            out[uint64(2) * i] = ops.to_f16_bits(lut[byte >> 4] * s)


def launch_any_dtype(b):
    kernel = {"bf16": dequant_u32, "fp16": dequant_u32_f16}[b.dtype]
    kernel[(b.nbytes + THREADS - 1) // THREADS, THREADS, b.stream](
        b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32, b.n, b.nbytes)
### STUDENT
# TODO: a launch function for bf16 and fp16 cases (about 16 lines: an fp16 kernel and the launch).
def launch_any_dtype(b):
    raise NotImplementedError("write an fp16 kernel and pick the kernel by b.dtype")
### END SOLUTION


result = all([nf4lab.check(launch_any_dtype, name="exercise 2: fp16", dtype="fp16", shapes=SMALL),
              nf4lab.check(launch_any_dtype, name="exercise 2: still bf16", dtype="bf16", shapes=SMALL)])
### BEGIN SOLUTION
assert result
### STUDENT
### END SOLUTION

# %% [markdown]
# ### Exercise 3 (think): FP4
#
# bitsandbytes' other 4-bit type, FP4, uses a different 16-entry table. **Predict:** does
# `launch` (the 03 kernel) produce bit-exact FP4 results without any change? Why, or why not?
# Write your prediction in the cell, then run it: the check runs only once you have predicted.
# Once it has run, the cell asks one more question.

# %%
### BEGIN SOLUTION
BIT_EXACT_ON_FP4 = True   # the kernel reads the table from b.lut, which holds the case's table
# Baked-in constants would need one kernel per table (one per quant_type, chosen at launch): 05's constant-memory
# and register kernels bake in NF4's table and refuse fp4 cases; its exercise adds an fp4 constant-memory kernel.
### STUDENT
# TODO: your prediction (1 line): True if `launch` is bit-exact on FP4 cases unchanged, False if not.
BIT_EXACT_ON_FP4 = None
### END SOLUTION

if BIT_EXACT_ON_FP4 is None:
    result = None
    print("NOT RUN: write your prediction (True or False) in BIT_EXACT_ON_FP4 first, then run this cell again")
else:
    # checks the kernel on fp4 cases and grades your prediction against what it finds; then one more question
    result = exercises.check_fp4_prediction(launch, BIT_EXACT_ON_FP4, shapes=SMALL)
### BEGIN SOLUTION
assert result and BIT_EXACT_ON_FP4
### STUDENT
### END SOLUTION
