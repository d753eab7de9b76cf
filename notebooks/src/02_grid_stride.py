# 02 -- Grid-stride loop: a grid sized to the GPU, not to the data.
#
# Percent-format source of notebooks/02_grid_stride.ipynb (build: python tools/build_notebooks.py 02_grid_stride).

# %% [markdown]
# # 02 · Grid-stride loop: a grid sized to the GPU
#
# **Goal.** The naive kernel launches one thread per packed byte: 134 million threads for a
# 16384 x 16384 matrix, in half a million thread blocks (here "block" alone means a CUDA thread
# block, a group of threads launched together; the 64 weights that share a scale are always
# called a quantization block, except in 01's helper names `BLOCK_SHIFT` and `block_scale`, kept as
# they are). The classic alternative is a *grid-stride loop*: launch just enough blocks to fill
# every SM (streaming multiprocessor, one of the GPU's cores that run thread blocks; 00 printed how
# many this GPU has) from the SM count and the *occupancy* (how many threads an SM keeps resident,
# out of the most it can hold), and let each thread walk the data with a stride of the whole grid. We predict what that should
# change, measure it against 01, and look at what numba makes of a `range` loop.
#
# **Contents**
# 1. [Prediction](#prediction)
# 2. [The kernel](#kernel)
# 3. [PTX evidence: what a `range` loop compiles to](#ptx)
# 4. [Verification](#verify)
# 5. [Benchmark](#bench)
# 6. [What we learned](#learned)
# 7. [Exercises](#exercises)

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import numpy as np
from numba import cuda, uint64

from nf4lab.measure import bench, profiling, ptx, results
from nf4lab.format import bytemodel
from nf4lab import lesson
from nf4lab.device import ops
from nf4lab.lesson import plots
from nf4lab.harness import versions

print(nf4lab.describe())
case = nf4lab.make_case()
print(case)
SIG = "(uint8[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, uint16[::1], int64, int64)"

# %% [markdown]
# <a id="prediction"></a>
# ## 1. Prediction
#
# What a grid-stride loop changes, for this kernel:
#
# * **Fewer blocks to schedule, less setup per byte.** Instead of hundreds of thousands of
#   short-lived blocks, each SM keeps the same few resident blocks for the whole kernel, and
#   each thread does its setup (index arithmetic, parameter loads) once for hundreds of bytes
#   or more (section 2 prints how many on this GPU) instead of once per byte. If waiting on
#   DRAM is all that limits 01, that saves little; if 01's threads are so short that their
#   fixed costs show, it saves more. Our prediction: **a small gain, possibly none**. The
#   measurement decides, on the GPU in hand.
# * **The grid size now matters.** A memory-bound kernel is fast only with enough bytes in
#   flight to cover DRAM latency (Little's law: bytes in flight = bandwidth x latency). With one
#   block of 256 threads per SM, each thread having one iteration's loads in flight, there is
#   far too little in flight: we predict that version to be **much slower**.
#
# The numbers behind the last point, from the copy ceiling recorded by 00 on this GPU (the cell
# prints which run) and an **assumed** DRAM latency, `nf4lab.lesson.ASSUMED_DRAM_LATENCY_NS`: a
# round figure we chose for a loaded HBM GPU (HBM being the stacked DRAM of data-center GPUs),
# not measured here or anywhere in the series, which uses this one value wherever it applies
# Little's law. Every amount and percentage the cell derives from it is an estimate that scales
# with it.
#
# Which bytes count as "in flight per thread": here, all the DRAM bytes one iteration moves, the
# code byte and the scale's bytes read and the four output bytes written (the byte model's bytes
# per packed byte, printed below), as if they were all outstanding at once. For the loads these are the
# DRAM bytes a packed byte needs, not the bytes its load instructions carry: its code byte and its share of
# its quantization block's `absmax_q` byte (and of the second-level scales and table, which the model counts
# once); the 4-byte loads of the scale and table entries are assumed to hit in cache (not measured here).
# The stores do not change the rate: section 3's PTX shows that the loop issues no later iteration's loads before an earlier iteration's have returned, so a
# thread finishes at most one iteration per load round trip, however long its stores stay outstanding.
# Section 5 sets the estimate beside the measurement.

# %%
N_BIG = 16384 * 16384
ceil = bench.Run.load("00_ceiling")
copy = ceil.get(bench.COPY) if ceil is not None else None
sms = (ceil.meta.get("sms") if ceil is not None else None) or nf4lab.device_info().get("sms")
EST_ONE = None   # one block of 256 per SM: the estimated share of the copy rate, for section 5
if copy and sms:
    latency = lesson.ASSUMED_DRAM_LATENCY_NS
    need = copy["gbps"] * latency                          # GB/s * ns = bytes
    per_byte = bytemodel.bytes_moved(N_BIG) / (N_BIG // 2)  # DRAM bytes per packed byte (one iteration)
    print(f"copy ceiling {copy['gbps']:.0f} GB/s x {latency} ns (assumed) = an estimated {need / 1e6:.1f} MB in flight, "
          f"{need / sms / 1e3:.1f} KB per SM ({sms} SMs); {results.source_note(results.gpu_slug(ceil.meta['gpu']))}")
    print(f"  the ceiling's record: {results.label(ceil.meta)}")
    print(f"  DRAM bytes per packed byte, one iteration (byte model: code, scale and output bytes): {per_byte:.2f}")
    # threads per SM: this GPU's attribute, or the recorded GPU's (no GPU here); absent from older records
    per_sm = nf4lab.device_info().get("max_threads_per_sm") or ceil.meta.get("max_threads_per_sm")
    print(f"  threads per SM: {per_sm or 'not in this record'}")
    EST_ONE = 100 * 256 * per_byte / (need / sms)
    for blocks in (1, per_sm // 256) if per_sm else (1,):
        have = blocks * 256 * per_byte
        print(f"  {blocks} block(s) of 256 per SM, one iteration each in flight: {have / 1e3:.1f} KB per SM, "
              f"an estimated {100 * have / (need / sms):.0f}% of that (with the assumed latency)")
else:
    print("no recorded copy ceiling for this GPU (run 00_ceiling on it): the argument above stays qualitative")

# %% [markdown]
# If even full occupancy covers less than 100% of it, one iteration's bytes per thread cannot
# reach the ceiling however the grid is sized (an estimate: with a shorter real latency the
# share is larger): the reason why the later steps move more bytes per access.

# %% [markdown]
# <a id="kernel"></a>
# ## 2. The kernel
#
# The body is 01's; the index now comes from a loop `for i in range(start, nbytes, stride)`
# with `start = cuda.grid(1)` and `stride = cuda.gridsize(1)`, all unsigned. Consecutive threads
# still touch consecutive bytes in every iteration, so accesses stay *coalesced*: a warp's 32
# accesses fall into a few consecutive cache lines (global memory is cached in 128-byte lines of four
# 32-byte sectors: CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory"), which the
# memory system serves together. `block_scale`
# and the shifts are the ones 01 defined: imported from `nf4lab.lesson`, where the series
# keeps the helpers an earlier notebook defined, not retyped.
#
# The grid: the SM count times the blocks that fit on one SM. That is limited by threads
# (the device attribute `max_threads_per_sm`: the cell after the kernel prints this GPU's SMs and
# blocks per SM), registers (each thread's own fastest storage, shared out from a fixed pool per SM) and
# shared memory (on-chip memory that the threads of one block share). This kernel uses no shared memory; whether its
# registers limit it more than threads do, the cell after the kernel prints. On a GPU: the
# registers per thread numba reports for the kernel compiled for that GPU (`get_regs_per_thread`),
# and the blocks per SM the driver's occupancy calculator allows it (registers, shared memory and
# threads at once). In the simulator neither exists, and the cell says so. It also prints the
# per-SM block limits that Nsight Compute (NVIDIA's kernel profiler; 08 reads its profiles)
# recorded for this version, with the GPU, its compute capability and the date of that profile.
# A profile recorded on another GPU stands in for this one only where both have the same compute
# capability (the SM's register file and thread limits are set per compute capability: CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability") and numba reports the same
# registers per thread for the kernel on both: on a GPU the cell compares both.
# We never launch more blocks than the data needs. In the simulator there are no SMs: a
# small fixed number makes the loop loop. (These three helpers join `nf4lab.lesson` for 03.)

# %% tags=["kernel"]
import nf4lab  # noqa: F811  (this cell runs on its own in nf4lab.harness.versions)
from numba import cuda, uint64

from nf4lab.device import ops
from nf4lab.lesson import BLOCK_SHIFT, block_scale  # defined in 01
from nf4lab.lesson import SIM_BLOCKS_PER_SM, SIM_SMS  # the simulator's grid size (section 2)

THREADS = 256


def sm_count():
    return nf4lab.device_info()["sms"] or SIM_SMS


def blocks_per_sm(threads):
    """Resident blocks per SM when threads are the limit (registers and shared memory are not, here)."""
    per_sm = nf4lab.device_info().get("max_threads_per_sm")
    return per_sm // threads if per_sm else SIM_BLOCKS_PER_SM


def grid_for(nbytes, threads, per_sm):
    needed = (nbytes + threads - 1) // threads
    return max(1, min(sm_count() * per_sm, needed))


@cuda.jit
def dequant_grid_stride(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    n = uint64(n)
    nbytes = uint64(nbytes)
    start = uint64(cuda.grid(1))
    stride = uint64(cuda.gridsize(1))
    for i in range(start, nbytes, stride):
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        j = uint64(2) * i
        out[j] = ops.to_bf16_bits(lut[byte >> 4] * s)
        if j + uint64(1) < n:
            out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * s)


def _launch(b, per_sm):
    if b.dtype != "bf16":
        raise ValueError(f"this kernel writes bf16, the case wants {b.dtype}")
    grid = grid_for(b.nbytes, THREADS, per_sm)
    dequant_grid_stride[grid, THREADS, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                 b.out, b.n, b.nbytes)


def launch(b):
    """Full occupancy: SMs x resident blocks per SM."""
    _launch(b, blocks_per_sm(THREADS))


def launch_one_block_per_sm(b):
    _launch(b, 1)


VERSIONS = {
    "02 grid-stride (full occupancy)": launch,
    "02 grid-stride (1 block per SM)": launch_one_block_per_sm,
}

# %%
nb = nf4lab.make_buffers(case).nbytes
print(f"{sm_count()} SMs x {blocks_per_sm(THREADS)} blocks of {THREADS} -> grid {grid_for(nb, THREADS, blocks_per_sm(THREADS))} "
      f"blocks for {nb:,} bytes ({-(-nb // THREADS):,} blocks in 01)")
print(f"each thread handles about {nb / (grid_for(nb, THREADS, blocks_per_sm(THREADS)) * THREADS):.1f} bytes")

# Registers: numba knows them once the kernel is compiled for this GPU (no registers in the simulator).
regs = None
if nf4lab.ON_GPU:
    launch(nf4lab.make_buffers(nf4lab.make_case((1, 64))))         # compiles dequant_grid_stride here
    regs = dequant_grid_stride.get_regs_per_thread()
    regs = sorted(set(regs.values())) if isinstance(regs, dict) else [regs]
    info = nf4lab.device_info()
    print(f"registers per thread (numba, compiled for the {info['gpu']}, cc {'.'.join(map(str, info['cc']))}, now): "
          f"{', '.join(map(str, regs))}")
    # The driver's occupancy calculator for the compiled kernel: every limit at once.
    try:
        compiled = next(iter(dequant_grid_stride.overloads.values()))
        live = compiled.max_cooperative_grid_blocks(THREADS) // sm_count()
    except Exception as exc:    # a numba API that may move: say so, do not stop the notebook
        print(f"  blocks per SM from the driver: not available ({type(exc).__name__}: {exc})")
    else:
        print(f"  blocks of {THREADS} per SM the driver allows it on this GPU (registers, shared memory and threads): "
              f"{live}, by threads alone: {blocks_per_sm(THREADS)} -> "
              + ("registers limit it no more than threads do" if live >= blocks_per_sm(THREADS) else
                 "registers or shared memory are the tighter limit"))
else:
    print("registers per thread and the driver's occupancy: not available in the simulator (numba reports them "
          "only for a kernel compiled for a GPU); the profile below is the recorded GPU's, not this machine's")
# The profile record: registers and how many blocks of THREADS each resource allows per SM.
prof = profiling.load_recorded()
entry = prof["versions"].get("02 grid-stride (full occupancy)") if prof else None
kern = profiling.main_kernel(entry["kernels"]) if entry else None
if kern is None:
    print("no Nsight Compute profile of this version recorded: registers not known here")
else:
    met = {k: v["value"] for k, v in kern["metrics"].items()}
    by_regs, by_warps = met.get("launch__occupancy_limit_registers"), met.get("launch__occupancy_limit_warps")
    prof_cc = kern.get("cc")       # ncu's CSV names the compute capability of the GPU it profiled
    print(f"recorded by Nsight Compute on the {prof['meta'].get('gpu', prof['gpu'])} "
          f"(cc {prof_cc or 'not recorded'}), "
          f"{entry.get('date') or prof['meta'].get('date')} ({entry['path']}): "
          f"{met.get('launch__registers_per_thread'):.0f} registers a thread; blocks of "
          f"{met.get('launch__block_size', THREADS):.0f} per SM allowed by registers: {by_regs:.0f}, by threads: "
          f"{by_warps:.0f} -> " + ("registers limit it no more than threads do" if by_regs >= by_warps else
                                   "registers are the tighter limit"))
    if regs is not None:
        same = regs == [round(met.get("launch__registers_per_thread"))]
        here_cc = ".".join(map(str, info["cc"]))
        same_cc = prof_cc == here_cc
        cc_word = "equals" if same_cc else "differs from" if prof_cc else "cannot be compared with"
        print("  numba's count on this GPU " + ("equals" if same else "differs from") + " the profile's, and this "
              f"GPU's compute capability (cc {here_cc}) {cc_word} the profile GPU's: "
              + ("the recorded limits should hold here" if same and same_cc else
                 "the recorded limits need not hold here; the driver's line above is this GPU's"))

# %% [markdown]
# <a id="ptx"></a>
# ## 3. PTX evidence: what a `range` loop compiles to
#
# Four things to see: the body is still free of `fma` and float64, still two 16-bit stores
# per byte; the loop is **unrolled**: the compiler copies its body several times, so that one pass
# of the compiled loop runs several iterations (the count of 16-bit stores printed below, two a byte, says
# how many copies with this numba and LLVM: the unrolled main loop's copies plus the remainder loop's, which runs the
# iterations left over when their count is not a multiple of the unroll); no copy's loads go out
# before the previous copy's stores (below); and numba computes the loop's
# *trip count* (how many iterations it runs: `len(range(start, stop, step))`) with a **64-bit
# division** (`div.s64`, beside a `div.u32` that LLVM adds, by our reading of the PTX, as a fast path for operands that fit
# in 32 bits), once per thread before the loop. One division per thread should be cheap
# here, not timed: a thread runs hundreds of iterations or more on 16384 x 16384 (printed above).
# A division *inside* a loop would not be. Exercise 1 removes it.
#
# The last line printed below lists the global loads (`L`) and stores (`S`) in the PTX's order.
# Each copy of the body reads five values before its first store (the code byte, the scale's
# three, one table entry) and the second table entry before its second: `LLLLLSLS`, once per copy.
# Each store needs its own copy's loads (its value is a table entry times the scale), and the next
# copy's loads come after it: nothing tells the compiler that the arrays do not overlap, so neither
# NVVM nor `ptxas` may move a load above an earlier store. A warp issues its instructions in order
# (NVIDIA's CUDA C++ Programming Guide, "Hardware Implementation": unlike CPU cores, its instructions
# "are issued in order", with no branch prediction or speculative execution), so a thread has one iteration's loads in flight at a time, as section 1's estimate assumed: the
# unrolled loop does not put more bytes read in flight per thread.

# %%
gs_ptx = nf4lab.compile_ptx(dequant_grid_stride, SIG)
ptx.show(gs_ptx, [r"^(div|rem)\.", r"^st\.global", r"^(mul|add)\.rn\.f32"], limit=4)
ptx.check(gs_ptx, present=[r"^div\.s64", r"^mul\.rn\.f32", r"^add\.rn\.f32", r"^st\.global\.u16"],
          absent=[r"^fma", r"\.f64"])
n16 = ptx.count(gs_ptx, r"^st\.global\.u16")
print(f"\n16-bit stores in the PTX: {n16} ({n16 // 2} copies of the loop body, 2 stores each)")
assert ptx.count(gs_ptx, r"^st\.global\.u16") > 2, "expected the loop to be unrolled"
# Global loads (L) and stores (S) in the PTX's order: the copies of the body one after another.
order = "".join("L" if t.startswith("ld.global") else "S" for t in map(str.strip, gs_ptx.splitlines())
                if t.startswith(("ld.global", "st.global")))
print(f"global loads (L) and stores (S) in PTX order: {order} ({order.count('LLLLLSLS')} times LLLLLSLS)")
body_by_body = order == "LLLLLSLS" * (n16 // 2)   # each copy loads only after the previous copy's stores

# %% [markdown]
# <a id="verify"></a>
# ## 4. Verification
#
# A grid-stride loop has its own ways to go wrong: a grid larger than the data (threads that
# never enter the loop), a stride that skips bytes, a last iteration that runs past the end.
# We verify both versions on the default case and the edge shapes.

# %%
nf4lab.verify_versions(VERSIONS, case, extra_shapes=[(2, 16383)]);   # in the simulator: more bytes than threads

# %% [markdown]
# <a id="bench"></a>
# ## 5. Benchmark
#
# Both versions, and the baseline they are compared with: 01's kernel (loaded from 01's
# `kernel` cell by `nf4lab.harness.versions`), measured in the same run with the ceilings and
# bitsandbytes, so that the comparison does not mix runs.

# %%
# The contract: one size, 16384 x 16384 -> bf16 (make_case's default on a GPU); each version timed
# in one run against the copy and fill ceilings and the traffic-matched bound (00's, measured again in this run) and bitsandbytes;
# GB/s = bytemodel.bytes_moved(n, "bf16", 64) / GPU time (median of CUDA-graph replays, as in 00).
BASELINE = versions.load("01_naive")          # {"01 naive (per byte)": launch}
run = bench.step("02_grid_stride", {**BASELINE, **VERSIONS})
if run is not None and run.recorded:          # loaded from disk (no GPU here); on a GPU bench.step printed it
    print(run.table())

# %%
plots.progress("02_grid_stride");

# %% [markdown]
# Against the prediction, from this run's numbers. A change no larger than `bench.NOISE_PCT`
# (the series' one noise margin, printed below) counts as none, and one within twice it is near: re-run
# before calling it a gain or a loss (00's rule). The margin is for two kernels timed
# in one run, so no verdict compares across runs. The run-to-run line compares records of two runs,
# which may come from different processes or sessions, possibly on another card of the same model;
# such records may lie further apart than the margin, even on one day (`nf4lab/measure/bench.py`'s
# comment above `NOISE_PCT` names a recorded case).

# %%
NOISE_PCT = bench.NOISE_PCT
print(f"noise margin: {NOISE_PCT}%")
base = run.get("01 naive (per byte)") if run is not None else None
full = run.get("02 grid-stride (full occupancy)") if run is not None else None
one = run.get("02 grid-stride (1 block per SM)") if run is not None else None
if base is None and full and bench.Run.load("01_naive") is not None:   # a recorded run without 01 in it
    other = bench.Run.load("01_naive").get("01 naive (per byte)")
    if other:
        print(f"02 (full occupancy) {full['gbps']:.0f} GB/s; 01 {other['gbps']:.0f} GB/s in its own run: two runs, "
              "so no verdict against the margin (execute this notebook on a GPU to time both in one run)")
if base and full and one:
    # The same kernel in two runs: how far one kernel's number moves between two runs (not the margin, which is
    # for kernels timed in one run).
    own01 = bench.Run.load("01_naive")
    there = own01.get("01 naive (per byte)") if own01 is not None else None
    if there and run.get("01 naive (per byte)"):
        print(bench.run_to_run("01 naive (per byte)", base, own01, "01"))
    change = bench.change_pct(full, base)   # from the GB/s as printed, to one decimal
    print(f"full occupancy: {full['gbps']:.0f} GB/s vs 01's {base['gbps']:.0f} GB/s: {change:+.1f}% "
          f"({full['pct_copy']:.0f}% vs {base['pct_copy']:.0f}% of copy)")
    if bench.noise_band(change) == "near":    # past the margin by little: one pair this close can flip
        print(f"  ({abs(change):.1f}% is past the {NOISE_PCT}% margin but within twice it: re-run to confirm "
              "the verdict below)")
    hold = "if a re-run confirms it, " if bench.noise_band(change) == "near" else ""   # near: no settled verdict
    if change > NOISE_PCT:
        verdict = "the small gain we predicted" if change < 10 else "more than the small gain we predicted"
        print(f"  {hold}a gain of {change:.1f}%, {verdict}. One cause fits, not measured here: the fixed costs of "
              "01's one-byte threads (setup, launching and retiring blocks), which the loop pays once per thread. "
              + ("More bytes read in flight per thread does not: section 3's PTX has each copy of the loop body load only "
                 "after the previous copy's stores. " if body_by_body else
                 "More bytes read in flight per thread may count too: section 3's PTX loads ahead of earlier copies' "
                 "stores. ")
              + "To see where 01's time goes, "
              + profiling.where_to_look(run.meta.get("gpu"), ("01 naive (per byte)", "02 grid-stride (full occupancy)"))
              + ".")
    elif change < -NOISE_PCT:
        print(f"  {hold}a loss of {-change:.1f}% (we predicted a small gain or none): most likely the loop's own work "
              "(the trip count, the counter) cost more on this GPU than the block scheduling it saved.")
    else:
        print("  no measurable change (the 'possibly none' of the prediction): most likely DRAM waits were all "
              "that limited 01 on this GPU, and block scheduling kept up. That is a result too: here the loop "
              "buys flexibility, not speed.")
    print(f"1 block per SM: {one['gbps']:.0f} GB/s, {one['gbps'] / full['gbps']:.2f}x full occupancy "
          f"({'much slower, as predicted' if one['gbps'] < 0.5 * full['gbps'] else 'not much slower: the prediction failed here'})")
    if EST_ONE:   # section 1's estimate beside the measurement, both as a share of the same copy record (00's)
        ran = 100 * one["gbps"] / copy["gbps"]
        print(f"  section 1 estimated one block per SM at about {EST_ONE:.0f}% of 00's recorded copy rate; it ran at "
              f"{ran:.0f}% of it" + (": above the estimate. One cause fits, not measured here: at this light load the "
              f"latency is shorter than the assumed {lesson.ASSUMED_DRAM_LATENCY_NS} ns (a thread finishes at most one "
              "iteration per load round trip, section 1)" if round(ran) > round(EST_ONE) else ": at or below the estimate"))
else:
    print("no recorded runs of 01 and 02 to compare yet")

# %% [markdown]
# <a id="learned"></a>
# ## 6. What we learned
#
# * A grid-stride loop decouples the grid from the data: the launch is sized from the GPU
#   (SMs x resident blocks), and the kernel works for any n with any grid.
# * Whether it is also a speed-up is measured, not assumed: the comparison printed above says
#   what it did on the GPU of this run, in one run against 01, and which cause fits, not
#   measured here (08 shows how to profile it). Judge by the numbers, not by the folklore.
# * Occupancy is not optional: one block per SM was slower here (the table above says by how much), and by section 1's
#   estimate (its latency assumed) it leaves too few bytes in flight to cover DRAM latency. Bytes in flight, not
#   threads, is what a memory-bound kernel needs: 03 first halves the store instructions; 04 puts more bytes in
#   flight with 16-byte loads.
# * numba's `range` with a runtime step computes its trip count with one division per thread (a
#   64-bit `div.s64` in the PTX, with a 32-bit fast path that this case's operands, both below 2^32, should
#   take) and is unrolled (how
#   many times depends on the compiler: section 3 counts the copies of the loop body in the PTX,
#   main loop and remainder together, not the unroll factor); read the PTX before you trust a loop.
#
# Next, [03 · packed u32 stores](03_packed_u32.ipynb).

# %% [markdown]
# <a id="exercises"></a>
# ## 7. Exercises
#
# ### Exercise 1: a loop without the division
#
# Rewrite the loop as a `while` loop (`i = start`, `while i < nbytes: ...; i += stride`), so that
# numba need not compute a trip count. The cell checks bit-exactness, then reads the PTX: no
# division (of any width) left is the goal, and the verdict names any it finds. It checks the bits twice: launched as `launch`
# does, and on a grid of 2 blocks of 64 threads: on the largest shape (31x67, 1,039 bytes) every thread loops. A stride smaller than
# the grid's (`cuda.gridDim.x` counts blocks, not threads) writes the same bits with repeated work,
# which no check of the bits can see: the stride is `cuda.gridsize(1)`, and the cell checks that the PTX multiplies
# the threads per block by the grid's blocks (`ptx.reads_grid_size`). (Think: why is the `while` loop allowed to skip the trip count, and could it still
# be unrolled?)

# %%
### BEGIN SOLUTION
@cuda.jit
def dequant_while(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
    n = uint64(n)
    nbytes = uint64(nbytes)
    i = uint64(cuda.grid(1))
    stride = uint64(cuda.gridsize(1))
    while i < nbytes:
        byte = packed[i]
        s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
        j = uint64(2) * i
        out[j] = ops.to_bf16_bits(lut[byte >> 4] * s)
        if j + uint64(1) < n:
            out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * s)
        i += stride


def launch_while(b):
    grid = grid_for(b.nbytes, THREADS, blocks_per_sm(THREADS))
    dequant_while[grid, THREADS, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                           b.out, b.n, b.nbytes)
### STUDENT
# TODO: write dequant_while, dequant_grid_stride with a while loop, and launch it like `launch` does
# (about 18 lines: copy the kernel, change its loop, and a 4-line launch function).
dequant_while = None   # your @cuda.jit kernel


def launch_while(b):
    raise NotImplementedError("write dequant_while and launch it here")
### END SOLUTION


from nf4lab.lesson import exercises   # noqa: E402  (the graders of the series' exercises)

WHILE_SHAPES = ((3, 5), (1, 65), (7, 33), (31, 67))
# One verdict: bit-exact as `launch` sizes the grid and on 2 blocks of 64 threads (up to 9 passes a thread on
# 31x67), then the PTX: no division, and the stride of cuda.gridsize(1).
result = exercises.check_while_loop(launch_while, dequant_while, SIG, shapes=WHILE_SHAPES)
### BEGIN SOLUTION
assert result
while_ptx = nf4lab.compile_ptx(dequant_while, SIG)
ptx.check(while_ptx, present=[r"^st\.global\.u16"], absent=[r"^(div|rem)\.", r"^fma", r"\.f64"])
# The two questions. Skipping the count: a while loop tests its condition before each iteration and never
# needs to know how many there are, where numba lowers range() by computing its length first (the division
# of section 3). Unrolling: a compiler may still unroll it (copies of the body, each keeping the test, or a
# count it computes itself); whether this numba and LLVM did, the store count says.
n16w = ptx.count(while_ptx, r"^st\.global\.u16")
print(f"16-bit stores in the while loop's PTX: {n16w} ({n16w // 2} cop{'ies' if n16w > 3 else 'y'} of the body; "
      f"section 3's range loop: {n16 // 2}): " + ("unrolled, with no division" if n16w > 2 else
                          "not unrolled by this numba and LLVM: one copy of the body, the test before each iteration"))
### STUDENT
### END SOLUTION

# %% [markdown]
# ### Exercise 2: 128 threads per block
#
# **Predict first**, then measure: with 128 threads per block (and twice as many resident blocks
# per SM, so the same number of threads), does the full-occupancy version get faster, slower,
# or stay the same? Write `launch_128` and check it. On a GPU, the cell then times it next to
# `launch` in one run; in the simulator only correctness is checked. The check verifies the bits
# and that `dequant_grid_stride` is launched with 128 threads a block, in a grid sized as `launch`
# sizes its own, at 128 threads a block: SMs x resident blocks, no more blocks than the bytes need (it
# prints only whether the threads in all match; sizing the grid is yours). On a GPU it adds a shape larger than the resident
# threads, so that their cap is checked too.

# %%
### BEGIN SOLUTION
def launch_128(b):
    grid = grid_for(b.nbytes, 128, blocks_per_sm(128))
    dequant_grid_stride[grid, 128, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                             b.out, b.n, b.nbytes)
### STUDENT
# TODO: launch dequant_grid_stride with 128 threads per block and a grid sized for it (about 3 lines).
def launch_128(b):
    raise NotImplementedError("launch with 128 threads per block")
### END SOLUTION


result = exercises.check_block_size(launch_128, dequant_grid_stride, 128, name="exercise 2: 128 threads",
                                    shapes=((3, 5), (1, 65), (7, 33), (31, 67)))
if result and nf4lab.ON_GPU:
    ex = bench.run_versions({"02 grid-stride, 256 threads": launch, "02 grid-stride, 128 threads": launch_128},
                            nf4lab.make_case(), baselines=False)
    print(ex.table())
    a, b128 = ex.get("02 grid-stride, 256 threads"), ex.get("02 grid-stride, 128 threads")
    change = bench.change_pct(b128, a)   # one run; from the GB/s as printed, to one decimal
    # The series' bands (bench.noise_band): a near change is not called faster or slower, only re-run.
    print(f"128 threads against 256: {change:+.1f}%: " + {
        "within": f"no difference measured, within the series' noise margin of {bench.NOISE_PCT}%",
        "near": f"near (past the {bench.NOISE_PCT}% noise margin but within twice it): not a settled "
                f"{'gain' if change > 0 else 'loss'}, since one pair this close can flip in another execution; "
                "re-run to confirm",
        "beyond": f"{'faster' if change > 0 else 'slower'}, by more than twice the {bench.NOISE_PCT}% noise margin",
    }[bench.noise_band(change)])
### BEGIN SOLUTION
assert result
### STUDENT
### END SOLUTION
