# 00 -- The ceiling: how fast can NF4 dequantization possibly be?
#
# Percent-format source of notebooks/00_ceiling.ipynb (build: python tools/build_notebooks.py 00_ceiling).

# %% [markdown]
# # 00 · The ceiling: how fast can NF4 dequantization be?
#
# **Goal.** Before writing a single kernel we want two numbers: how many bytes NF4
# dequantization *must* move, and how fast this GPU can move bytes at all. Their ratio bounds
# the time any kernel can reach. Section 4 measures three such speeds (a copy, a write-only
# fill, and a kernel that moves NF4's bytes, all but a few, with no floating-point arithmetic) and uses the last,
# the traffic-matched bound. We also time bitsandbytes' own `dequantize_4bit` on the same
# data, so that every later step can be compared with the ceiling *and* with the library we
# want to beat, bit for bit.
#
# **Contents**
# 1. [Memory-bound, in one paragraph](#memory-bound)
# 2. [The NF4 formula, with a worked example](#formula)
# 3. [The byte model: what 16384 x 16384 moves](#bytes)
# 4. [Ceilings and the bitsandbytes baseline, measured](#measured): the bound kernel and the
#    CUDA-graph timing loop, written out
# 5. [What we learned](#learned)
# 6. [Exercise](#exercises)
#
# Every byte count and speed in this notebook is computed from the byte model, measured (and,
# for the ceilings, recorded under `data/results/` with GPU, date and versions), or cited with
# its source (the datasheet peak). On a machine without a GPU, kernels run in numba's CUDA
# *simulator*, which runs them as Python on the CPU: slow, nothing to time, and with numpy's float
# arithmetic, not the GPU's (01 shows where that matters). The notebook then shows the recorded
# measurements and says where they come from.

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import numpy as np

from nf4lab import runtime
from nf4lab.measure import bench, results
from nf4lab.format import bytemodel, reference
from nf4lab.lesson import plots

print(nf4lab.describe())

# %% [markdown]
# The line above says where this notebook ran. On a GPU it names its SMs (*streaming
# multiprocessors*: the GPU's cores, each running many threads at once), its L2 (the cache that
# all SMs share, between them and DRAM, the GPU's main memory) and its *compute capability*
# ("cc": NVIDIA's version number for an SM's architecture, which decides the instructions it has;
# 9.0 is Hopper: CUDA C++ Programming Guide, "Compute Capability").

# %% [markdown]
# <a id="memory-bound"></a>
# ## 1. Memory-bound, in one paragraph
#
# A kernel is *memory-bound* when the time to move its bytes through DRAM is larger than the
# time to do its arithmetic. Dequantization reads half a byte per weight, looks it up in a
# 16-entry table, multiplies by a scale and writes two bytes (bf16: bfloat16, a 16-bit float with
# float32's 8-bit exponent and 7 mantissa bits, the dtype LLM weights are used in). That is about one
# multiply per 2.5 bytes moved. Our prediction: **memory-bound**, because a data-center GPU's
# peak float32 rate divided by its DRAM bandwidth (section 4 prints both for the GPU at hand, each with its
# source: neither is measured here) should be many operations per byte, far more than 0.4. The count is of the
# arithmetic only: a kernel also issues instructions for addresses, unpacking and conversions, several per byte,
# and a GPU issues only so many a second; 01-03 may meet that limit before the bytes' limit (03's prediction weighs
# it). This notebook measures the ceiling that
# prediction implies: section 4 times a kernel that moves the same bytes with no floating-point arithmetic
# at all (only index work and an integer XOR per word that keeps each load live). Notebook 06 tests the prediction itself: a kernel that does the arithmetic and still runs
# at that bound is limited by its bytes, not by its arithmetic. If the prediction holds, the only
# question for speed is *how close to the memory ceiling do we get*, and the unit of progress in
# this series is GB/s of the byte model (below), against the traffic-matched bound of section 4
# and, beside it, what a plain copy reaches.

# %% [markdown]
# <a id="formula"></a>
# ## 2. The NF4 formula, with a worked example
#
# bitsandbytes stores a weight matrix of n values as
#
# * `packed`: n/2 bytes, two 4-bit codes per byte, **high nibble first**:
#   weight `2j` is `packed[j] >> 4`, weight `2j+1` is `packed[j] & 15`;
# * `absmax_q`: one uint8 per **block of 64 weights** (the block's scale, itself quantized). This is a
#   *quantization block*; CUDA has blocks of its own, *thread blocks* (the groups of threads a kernel
#   is launched in, section 4), and the series always says which one it means when it is not clear;
# * `absmax2`: one float32 per **group of 256 blocks** at every block size (16384 weights at 64), and `code2`, a
#   256-entry float32 table, plus one float32 `offset` (nested, "double" quantization);
# * `LUT`: the 16 NF4 levels, normal-distribution quantiles in [-1, 1].
#
# Each weight is
#
# $$ w = \mathrm{LUT}[q] \times \big(\mathrm{code2}[\mathrm{absmax\_q}[\mathit{block}]] \times \mathrm{absmax2}[\mathit{group}] + \mathit{offset}\big) $$
#
# with `block = i // 64` and `group = block // 256`, computed in float32 with **every operation
# rounded separately** (multiply, round, add, round, multiply, round) and then rounded to the
# nearest even bf16. Being *bit-exact* with bitsandbytes means reproducing exactly this sequence
# of roundings; notebook 01 shows how easily a compiler breaks it.
#
# Here is the formula by hand, in numpy, on a real case made by bitsandbytes, at its first byte whose two codes differ:

# %%
case = nf4lab.make_case()
print(case)

# the first byte whose two codes differ: with equal nibbles the check below could not tell their order
j = next(j for j in range(case.n // 2) if case.packed[j] >> 4 != case.packed[j] & 15)
byte = int(case.packed[j])
q_hi, q_lo = byte >> 4, byte & 15       # weights 2j and 2j+1: high nibble first
block = (2 * j) // case.blocksize       # 64 weights per block
group = block // 256                    # 256 blocks per group
f32 = np.float32
scaled = f32(case.code2[case.absmax_q[block]] * case.absmax2[group])   # rounded once
scale = f32(scaled + case.offset)                                     # rounded again
w = [f32(reference.NF4_LUT[q] * scale) for q in (q_hi, q_lo)]          # and again
bits = reference.f32_to_bf16_bits(np.array(w, dtype=np.float32))

print(f"packed[{j}] = 0x{byte:02x} -> codes {q_hi} (high nibble), {q_lo} (low nibble)")
print(f"block {block}: absmax_q = {case.absmax_q[block]}, code2[absmax_q] = {case.code2[case.absmax_q[block]]!r}")
print(f"group {group}: absmax2 = {case.absmax2[group]!r}; offset = {case.offset!r}")
print(f"scale = code2[.] * absmax2 + offset = {scale!r}")
for k, (q, wk, bk) in enumerate(zip((q_hi, q_lo), w, bits)):
    print(f"w[{2 * j + k}] = LUT[{q:2d}] * scale = {reference.NF4_LUT[q]!r} * {scale!r} = {wk!r}"
          f" -> bf16 0x{bk:04x}; bitsandbytes wrote 0x{case.expected[2 * j + k]:04x}")
assert list(bits) == list(case.expected[2 * j: 2 * j + 2]), "the worked example disagrees with bitsandbytes"

# %% [markdown]
# The same in one vectorised call, for the whole case: `nf4lab.format.reference` is the numpy spec
# that every kernel in the series is checked against (and bitsandbytes' own output is stored
# in the case, so the spec itself is checked here too):

# %%
ref_bits = reference.dequantize_case(case)
print(f"numpy reference vs bitsandbytes: {np.count_nonzero(ref_bits != case.expected)} of {case.n:,} "
      "outputs differ")
assert np.array_equal(ref_bits, case.expected)

# %% [markdown]
# <a id="bytes"></a>
# ## 3. The byte model: what 16384 x 16384 moves
#
# The fewest bytes any kernel must move: every input read once, every output written once (counted
# whole: all 256 entries of `code2`, whatever n; not the 16-entry LUT, which a kernel can hold as constants)
# (`nf4lab.format.bytemodel`, the one place the series counts bytes). Per weight that is 0.5 byte of
# packed codes, 1/64 byte of `absmax_q`, a negligible share of `absmax2` and `code2`, and
# 2 bytes of bf16 output.

# %%
SHAPE = (16384, 16384)
n = SHAPE[0] * SHAPE[1]
parts = bytemodel.breakdown(n, "bf16", 64)
total = bytemodel.bytes_moved(n, "bf16", 64)
assert total == sum(parts.values())
print(f"{'buffer':<10} {'bytes':>14} {'bytes/weight':>13} {'share':>7}")
for name, nb in parts.items():
    print(f"{name:<10} {nb:>14,} {nb / n:>13.5f} {100 * nb / total:>6.2f}%")
print(f"{'total':<10} {total:>14,} {total / n:>13.5f} {100:>6.2f}%")
print(f"\n{total / 1e6:.0f} MB per call; the output alone is {100 * parts['output'] / total:.1f}% of it: "
      "most of the bytes this kernel moves are writes.")

# %% [markdown]
# Two consequences:
#
# * **Writes dominate** (79.5% of the bytes, printed above). We therefore predict that how we *store* bf16
#   values matters; 03 changes the stores alone, 04 the loads with the stores and then the store
#   layout alone, so those two show how much.
# * **It should not fit in L2.** One call moves 675 MB; a GPU's L2 is far smaller (the cell
#   below prints this GPU's), so repeated timing runs should go to DRAM (not measured here: 08's
#   profiles count DRAM bytes, but of one launch with the caches flushed). Sizes
#   that fit in L2 should be partly served from it on repeats, so their speed need not be DRAM's
#   (higher or lower; not measured here: notebook 07's sweep shows which): results carry a `fits_l2` flag and plots mark them.

# %%
l2 = nf4lab.device_info().get("l2_bytes")
recorded = bench.Run.load("00_ceiling")
if not l2 and recorded is not None and recorded.meta.get("l2_bytes"):   # no GPU here: the recorded GPU's
    l2 = recorded.meta["l2_bytes"]
    print(f"no GPU here: L2 of the recorded {recorded.meta['gpu']}")
for shape in [(4096, 4096), SHAPE]:
    nb = bytemodel.bytes_moved(shape[0] * shape[1])
    where = (f"L2 is {l2 / 2**20:.0f} MiB = {l2 / 1e6:.0f} MB: {'fits' if nb <= l2 else 'does not fit'}"
             if l2 else "L2 size unknown")
    print(f"{shape[0]}x{shape[1]}: {nb / 1e6:7.1f} MB per call ({where})")

# %% [markdown]
# <a id="measured"></a>
# ## 4. Ceilings and the bitsandbytes baseline, measured
#
# Three ceilings, timed exactly like our kernels will be (`nf4lab.measure.bench`):
#
# * **device copy**: half of the bytes read and half written, the classic "achievable
#   bandwidth" (the faster of torch's `copy_` and a numba kernel copying 16 bytes per thread);
# * **write-only fill**: every byte written, none read (the faster of torch's `fill_` and a
#   numba kernel storing 16 bytes per thread: a library's fill is not always the fastest
#   writer). Our kernel is 79.5% writes; whether writes alone are faster than a copy is not
#   a given, and the run below says which it is here;
# * **traffic-matched bound**: a kernel that moves NF4's bytes (codes and `absmax_q` read, the output
#   written: all but `absmax2` and `code2`, under 0.02% of them) with 16-byte stores and no floating-point arithmetic. No dequantization
#   kernel should beat it by much, so it is the target the series measures against.
#
# And the **baseline**: bitsandbytes `dequantize_4bit` on the same data, with a
# preallocated `out=` (GPU time), and end to end as a user calls it: host time per call, calls
# back to back with one synchronization at the end, allocation and launch included. Back to back,
# each call's host work can overlap the kernels already queued: when the host keeps ahead of the GPU,
# this time should come out close to the GPU time and not show the launch cost on its own; when it
# does not, the host's cost shows. The summary at the end of this section prints the ratio of the two
# and says which it looks like in this run (below: a numba launch, timed on its own; bitsandbytes' own launch
# is not measured here).
#
# ### The traffic-matched bound, written out
#
# `nf4lab.measure.bench` times this kernel at a few launch shapes and keeps the fastest; here is the
# one for bf16 output at 256 threads x 2 words per thread. Each 32-bit word of codes holds 8
# weights, whose 16 bf16 output bytes go out in one 16-byte store; each word also reads its
# block's `absmax_q` byte (8 words per block of 64 weights). What it stores is the loaded bits,
# not weights: the bytes are right, the values are not. (`absmax2` and `code2`, under 0.02% of
# the bytes, are left out.) A launch `kernel[blocks, threads](...)` runs `blocks` thread blocks of
# `threads` threads each (a third entry, a stream, comes with the timing below); the blocks of one
# launch are its *grid*, and each thread finds its place from `cuda.blockIdx.x` and `cuda.threadIdx.x`.

# %%
from numba import cuda, uint32, uint64

from nf4lab.device import ops
from nf4lab.measure import ptx

THREADS, UNITS = 256, 2        # one of bench.SHAPES: threads per thread block x words per thread


@cuda.jit
def bound_bf16(packed_u32, absmax_q, out_u32, nwords):
    base = uint64(cuda.blockIdx.x) * uint64(THREADS * UNITS) + uint64(cuda.threadIdx.x)
    words = cuda.local.array(UNITS, uint32)
    for k in range(UNITS):     # all loads issued before any store: 2 x UNITS a thread
        u = base + uint64(k * THREADS)          # thread t: words first + t + k THREADS, first = blockIdx.x THREADS UNITS
        words[k] = uint32(0)
        if u < nwords:
            words[k] = packed_u32[u] ^ uint32(absmax_q[u >> uint64(3)])   # 8 words per block of 64
    for k in range(UNITS):
        u = base + uint64(k * THREADS)
        if u < nwords:         # a warp's store (a warp: 32 threads issued together): 32 x 16 = 512 contiguous bytes
            w = words[k]
            ops.store_u32x4(out_u32, u << uint64(2), w, w ^ uint32(1), w ^ uint32(2), w ^ uint32(3))


# PTX is NVIDIA's virtual instruction set, what numba compiles a kernel to (the driver assembles it into
# machine code); 01 reads it in detail. Here: 16-byte stores, and not one float instruction.
bound_ptx = nf4lab.compile_ptx(bound_bf16, "(uint32[::1], uint8[::1], uint32[::1], uint64)")
ptx.check(bound_ptx, present=[r"^st\.global\.v4\.u32", r"^ld\.global"], absent=[r"\.f32", r"\.f64"])

# Every word read once and 16 bytes written for it, on a small buffer (here, GPU or simulator):
nw = 1000
p = (np.arange(nw, dtype=np.uint64) * 2654435761 % 2**32).astype(np.uint32)
aq = (np.arange(-(-nw // 8)) % 251).astype(np.uint8)
d_out = cuda.device_array(4 * nw, dtype=np.uint32)
bound_bf16[-(-nw // (THREADS * UNITS)), THREADS](cuda.to_device(p), cuda.to_device(aq), d_out, uint64(nw))
w = p ^ aq[np.arange(nw) >> 3].astype(np.uint32)
assert np.array_equal(d_out.copy_to_host(), np.stack([w, w ^ 1, w ^ 2, w ^ 3], axis=1).ravel())
print(f"bound_bf16: {nw} words of codes read, {16 * nw:,} output bytes written, no float instruction")

# %% [markdown]
# ### How we time: a CUDA graph
#
# A numba launch from Python has a host cost of its own (the cell below prints one, measured), which
# can be a large share of a sub-millisecond kernel when launches are timed one by one. So we capture 20 launches in a CUDA
# graph and replay it: one host call per 20 launches. Two CUDA *events* around a replay measure GPU
# time: an event is a marker the GPU timestamps once all the work queued before it in its *stream*
# (the queue a launch goes into, run in order) is done (CUDA C++ Programming Guide, "Streams" and
# "Events").
# This is the loop `nf4lab.measure.bench` runs for every timing in the series (`bench.gpu_time_ms`,
# which also falls back to plain launches for code that cannot be captured). Host-side cost is
# measured separately (`host_ms`). In the simulator there is no GPU to time: the cell shows the
# code, and the recorded run below was timed with it.

# %%
def graph_time_ms(launch, launches=20, replays=15):
    """GPU time of one ``launch(stream)``: the median replay of a graph of ``launches`` launches."""
    import torch

    s = torch.cuda.Stream()
    ns = cuda.external_stream(s.cuda_stream)     # numba launches on torch's capture stream
    with torch.cuda.stream(s):
        launch(ns)                               # compile and warm up outside the graph
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):          # captured, not run
        for _ in range(launches):
            launch(ns)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.cuda.stream(s):
        g.replay()                               # the first replay uploads the graph
        for _ in range(replays):
            start.record(s)
            g.replay()
            end.record(s)
            end.synchronize()
            times.append(start.elapsed_time(end) / launches)
    return float(np.median(times))


mine = None
if nf4lab.ON_GPU:                                # the bound at 16384 x 16384 -> bf16, this shape only
    n_big = 16384 * 16384
    d_p = cuda.device_array(n_big // 8, dtype=np.uint32)
    d_aq = cuda.device_array(n_big // 64, dtype=np.uint8)
    d_o = cuda.device_array(n_big // 2, dtype=np.uint32)
    grid = -(-(n_big // 8) // (THREADS * UNITS))
    ms = graph_time_ms(lambda s: bound_bf16[grid, THREADS, s](d_p, d_aq, d_o, uint64(n_big // 8)))
    mine = bytemodel.gbps(bytemodel.bytes_moved(n_big), ms)
    print(f"bound_bf16 ({THREADS} x {UNITS}), timed by graph_time_ms: {ms:.4f} ms, {mine:.0f} GB/s of the byte model")
    del d_p, d_aq, d_o
    # The host cost of one launch: the small kernel of the cell above (two thread blocks), launched back
    # to back from Python; a kernel this small should finish before the next launch arrives (not timed here).
    d_ps, d_aqs = cuda.to_device(p), cuda.to_device(aq)
    host = sorted(bench.wall_time_ms(lambda: bound_bf16[-(-nw // (THREADS * UNITS)), THREADS](d_ps, d_aqs, d_out,
                                                                                              uint64(nw))) for _ in range(9))
    print(f"one numba launch of a small kernel from Python, back to back: {host[4] * 1e3:.1f} us of host time "
          f"per launch (median of 9 repeats of 200 launches and a synchronize; fastest {host[0] * 1e3:.1f} us, "
          f"slowest {host[-1] * 1e3:.1f} us, the spread within this process; another process or another host load "
          f"may shift it further, which this run does not measure), measured now on the {nf4lab.device_info()['gpu']}")
else:
    print("no GPU here: nothing to time; the recorded run below was timed with this loop")
# A recorded host cost per call (tools/bench_launch.py): nf4lab.dequantize, one kernel launch with its
# argument handling, on a 4096 x 4096 weight, timed two ways: the call's return (no synchronize), and a loop
# of calls ended by one synchronize, the loop above's method. Another run and another launch path
# (nf4lab.dequantize calls cuLaunchKernel, the CUDA driver's launch call, directly, past numba's dispatcher,
# the Python layer that checks and converts a kernel's arguments at every launch): it is shown, not compared.
cost = results.load("launch_cost")
call = next((r for r in cost["records"] if r.get("name") == "nf4lab.dequantize"), None) if cost else None
if call is not None:
    print(f"recorded: one nf4lab.dequantize call (the package's drop-in, named in 06, timed in 07; "
          f"{'x'.join(map(str, call['shape']))}) returns after "
          f"{call['host_us']:.1f} us of host time, without waiting for the GPU; {call['per_call_us']:.1f} us a call "
          f"in a loop ended by one synchronize, the loop above's method ({cost['path']}: {results.label(cost['meta'])}). "
          "It launches through cuLaunchKernel (the CUDA driver's launch call), not numba's dispatcher (the Python layer "
          "that checks and converts a kernel's arguments at every launch); another run: not compared with the line above")

# %% [markdown]
# The run below (on a GPU; in the simulator, a recorded one) times the ceilings and bitsandbytes and prints them as a table, the same table notebooks
# 01-06 print. Its columns: `ms`, GPU time per launch; `GB/s`, the bytes the row moves (the
# byte model's, for NF4) over that time; `%copy`, `%fill` and `%bound`, that speed as a percent of the
# copy, the fill and the traffic-matched bound of the same run; `x bnb`, bitsandbytes' GPU time over
# the row's (above 1: faster than bitsandbytes); `exact`, whether the row's output has the same bits
# as the case's, which bitsandbytes made (blank for the ceilings: they do not dequantize). A dash
# marks a value the row does not have: one that does not apply (the datasheet row has no time: its
# GB/s is cited) or one that run did not measure (bitsandbytes not timed, a kernel that failed), and a
# footnote names any row whose `ms` is host time.

# %%
if nf4lab.ON_GPU:
    big = nf4lab.make_case()                      # 16384 x 16384 bf16 on a GPU
    nbytes = bytemodel.bytes_moved(big.n, big.dtype, big.blocksize)
    run = bench.Run().add(bench.ceilings(nbytes, big.shape, big.dtype, n=big.n)).add(bench.bnb_baselines(big))
    path = run.save("00_ceiling")
    print(f"measured now, saved to {path.relative_to(results.ROOT)}")   # relative to the repository root
else:
    run = bench.Run.load("00_ceiling")
    if run is None:
        print("No GPU here and no recorded results for 00_ceiling under data/results/ yet: "
              "run this notebook on a GPU to record them.")
    else:
        print(f"No GPU here: showing the results recorded in {run.path}")
if run is not None:
    print(run.table())

# %%
if run is not None:
    plots.bars(run, title="The ceilings and bitsandbytes, 16384 x 16384 -> bf16")

# %% [markdown]
# What the measurements say, read from the run (nothing typed in by hand):

# %%
if run is not None:
    copy, fill, bnb = run.get(bench.COPY), run.get(bench.FILL), run.get(bench.BNB_GPU)
    e2e = run.get(bench.BNB_E2E)
    shape, nb = bnb["shape"], bnb["bytes"]
    print(f"NF4 {'x'.join(map(str, shape))} -> {bnb['dtype']} moves {nb / 1e6:.0f} MB per call")
    print(f"at the copy ceiling ({copy['gbps']:.0f} GB/s) that takes {nb / copy['gbps'] / 1e6:.3f} ms; "
          f"at the fill ceiling ({fill['gbps']:.0f} GB/s) {nb / fill['gbps'] / 1e6:.3f} ms")
    fc = bench.change_pct(fill, copy)   # judged against the noise margin, from the GB/s as printed
    vs = {"within": "no difference measured from a copy", "near": "near a copy's: re-run to tell",
          "beyond": f"{'faster' if fc > 0 else 'slower'} than a copy"}[bench.noise_band(fc)]
    print(f"writes alone run at {100 * fill['gbps'] / copy['gbps']:.0f}% of the copy's speed on the {run.meta['gpu']} "
          f"({vs}: {fc:+.1f}% against the series' {bench.NOISE_PCT}% noise margin for two timings of one run, past "
          f"twice it to call a direction; fill by "
          f"{fill.get('source', 'torch fill_')}, copy by {copy.get('source', 'torch copy_')})")
    tb = run.get(bench.BOUND)
    if tb:
        print(f"the traffic-matched bound: {tb['gbps']:.0f} GB/s = {tb['ms']:.3f} ms, "
              f"{100 * tb['gbps'] / copy['gbps']:.0f}% of copy: the target for our kernels")
    else:
        print("(this recorded run predates the traffic-matched bound: re-run on a GPU to measure it)")
    print(f"bitsandbytes takes {bnb['ms']:.3f} ms of GPU time = {bnb['gbps']:.0f} GB/s "
          f"= {bnb['pct_copy']:.0f}% of copy"
          + (f", {bnb['pct_bound']:.0f}% of the bound" if bnb.get("pct_bound") else "")
          + f"; bit-exact with the case: "
          f"{bnb['bit_exact']}")
    if e2e:
        # 10%: this cell's own threshold for "close", not the series' 1% margin (two kernels timed in one run)
        ratio = e2e["host_ms"] / bnb["ms"]
        verdict = ("within 10%, this cell's threshold: what we expect when the host keeps ahead of the GPU"
                   if ratio <= 1.1 else "more than 10% above it: some per-call cost (host work, allocation or gaps "
                   "between launches) was not hidden behind the GPU's work; this run does not measure which")
        print(f"end to end from Python, calls back to back (allocation + launch included): "
              f"{e2e['host_ms']:.3f} ms per call, {ratio:.2f}x the GPU time above ({verdict})")
    if mine is not None and tb and tb.get("alternatives"):
        print(f"the same shape inside bench.bound, this session: "
              f"{tb['alternatives'].get(f'{THREADS} threads x {UNITS}', float('nan')):.0f} GB/s "
              f"(graph_time_ms above: {mine:.0f} GB/s); bench keeps the fastest shape, {tb.get('source')}")
    spec = run.get("spec peak (datasheet)")
    if spec:
        print(f"datasheet peak {spec['gbps']:.0f} GB/s (cited, not measured: {runtime.spec_peak_source(run.meta['gpu'])}): "
              f"copy reaches {100 * copy['gbps'] / spec['gbps']:.0f}% of it")
        if flops := runtime.fp32_flops(run.meta):   # section 1's prediction, with this GPU's figures
            sms, mhz = run.meta["sms"], run.meta["clocks"]["sm_mhz"]
            print(f"peak float32: {flops / 1e12:.0f} TFLOP/s ({sms} SMs x {flops / sms / 2 / mhz / 1e6:.0f} FMA lanes x 2 x "
                  f"{mhz} MHz, the SM clock the driver reports as CU_DEVICE_ATTRIBUTE_CLOCK_RATE, printed by CUDA's "
                  f"deviceQuery sample as 'GPU Max Clock rate': a maximum; the clock under load is not measured here and can be lower; lanes per SM: "
                  f"{runtime.FP32_LANES_SOURCE}), {flops / (spec['gbps'] * 1e9):.0f} operations per byte "
                  f"at the datasheet peak (an FMA, a fused multiply-add, counted as 2; this kernel's multiplies stay "
                  f"unfused: half, {flops / 2 / (spec['gbps'] * 1e9):.0f} per byte), against the 0.4 this kernel needs: "
                  "the prediction of section 1")
    print(f"({results.label(run.meta)})")

# %% [markdown]
# <a id="learned"></a>
# ## 5. What we learned
#
# * NF4 dequantization does well under one floating-point operation per byte it moves, so we
#   predict it is memory-bound if the other instructions it issues (addresses, unpacking) do not limit it first: its speed is then bytes moved over time, and the byte model fixes the bytes
#   (about 2.5 bytes per bf16 weight, nearly four fifths of them writes). Notebook 06 tests the
#   prediction against the traffic-matched bound, measured again in its own run.
# * The ceilings are measured: a copy, a write-only fill and a kernel that moves NF4's bytes
#   without the arithmetic, timed through CUDA graphs so that the host's cost of each launch does not
#   count (one graph launch per 20 kernels and the GPU's own gap between the graph's kernels still fall
#   between the timing events; neither is measured here).
#   The datasheet peak is printed beside them only to show how far below it a real copy runs.
#   Which ceiling is fastest is measured, not assumed: the lines above say which it is on this GPU.
# * bitsandbytes is the baseline to beat; the table above says how far it is from the ceiling.
#   Everything we write must produce the *same bits* as it does.
# * The formula has three separately rounded float32 operations; high nibble first; blocks of
#   64 weights, groups of 256 blocks.
#
# Next, [01 · naive](01_naive.ipynb): one thread per byte, and the first two traps of numba
# (FMA contraction: a multiply and an add fused into one instruction; and signed indices).

# %% [markdown]
# <a id="exercises"></a>
# ## 6. Exercise: the byte model, by hand
#
# Every GB/s in the series divides the bytes of the byte model by a time, so it is worth
# being able to write it yourself. Write `bytes_needed(n, dtype, blocksize)`: the fewest bytes
# that dequantizing `n` NF4 weights to `dtype` (`"bf16"`, `"fp16"` or `"fp32"`) must move,
# with nested statistics, each input read once and each output written once, counted as section 3
# does (all of `code2`, whatever n; not the LUT). Use section 2's
# layout and section 3's table, not `bytemodel` (the `offset` is a kernel argument, not a byte in memory:
# not counted). Mind the partial byte, block and group at the
# end of an odd `n`. The check compares it with the series' byte model on six cases, from one
# weight to 16384 x 16384 + 3, and at blocksizes 64, 128 and 256.
#
# *Then predict:* at the traffic-matched bound recorded above, how long should 16384 x 16384
# -> **fp32** take if its bytes move as fast as bf16's? (06 measures it.)

# %%
### BEGIN SOLUTION
def bytes_needed(n, dtype, blocksize):
    nblocks = -(-n // blocksize)                 # one absmax_q byte per block, the last one partial
    ngroups = -(-nblocks // 256)                 # one float32 absmax2 per 256 blocks
    itemsize = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    return -(-n // 2) + nblocks + 4 * ngroups + 256 * 4 + n * itemsize   # codes, stats, code2, output
### STUDENT
# TODO: the bytes dequantization must move (about 5 lines): codes, absmax_q, absmax2, code2, output.
def bytes_needed(n, dtype, blocksize):
    return 0
### END SOLUTION


def check_bytes(fn):
    """Compare ``fn`` with nf4lab's byte model; True when every case agrees (and ``fn`` counts for itself)."""
    model = (bytemodel, bytemodel.bytes_moved, bytemodel.breakdown)   # by name or under another name
    if {"bytemodel", "bytes_moved", "breakdown"} & set(fn.__code__.co_names) or \
            any(fn.__globals__.get(k) is m for k in fn.__code__.co_names for m in model):
        print("NOT PASSED: bytes_needed calls the byte model: count the bytes from section 2's layout instead")
        return False
    cases = ((1, "bf16", 64), (15, "bf16", 64), (16385, "fp16", 64), (4096 * 4096, "fp32", 64),
             (1_000_001, "bf16", 128), (16384 * 16384 + 3, "bf16", 256))
    for n, dtype, bs in cases:
        got, want = fn(n, dtype, bs), bytemodel.bytes_moved(n, dtype, bs)
        if got != want:
            print(f"NOT PASSED: n = {n:,} -> {dtype}, blocksize {bs}: {got:,} bytes, the byte model says {want:,}"
                  f" ({got - want:+,})")
            return False
    print(f"PASSED: bytes_needed agrees with the byte model on {len(cases)} cases")
    return True


result = check_bytes(bytes_needed)
### BEGIN SOLUTION
assert result
tb = run.get(bench.BOUND) if run is not None else None
if tb:
    n = 16384 * 16384
    nb32 = bytes_needed(n, "fp32", 64)
    copy, fill = run.get(bench.COPY), run.get(bench.FILL)
    share = {"bf16": 2 * n / bytes_needed(n, "bf16", 64), "fp32": 4 * n / nb32}   # the bytes that are writes
    # a direction only if this run's speeds rise (or fall) with the write share, copy 50%, bound, fill 100%,
    # each step beyond twice the noise margin (a near step asks for a re-run, not a direction)
    runs = [c for c in (copy, tb, fill) if c]
    speeds = [c["gbps"] for c in runs]
    steps = [bench.change_pct(b, a) for a, b in zip(runs, runs[1:])]
    order = None if len(speeds) < 3 or any(bench.noise_band(x) != "beyond" for x in steps) else \
        "rose" if all(x > 0 for x in steps) else "fell" if all(x < 0 for x in steps) else None
    writes = (f"this run's speeds {order} with the write share (copy 50%, the bound {share['bf16']:.1%}, fill 100%), so "
              f"fp32 may come out {'faster' if order == 'rose' else 'slower'}" if order else
              "this run's speeds do not rise or fall with the write share (steps " + ", ".join(f"{x:+.1f}%" for x in steps)
              + (": copy or fill not recorded" if len(speeds) < 3 else
                 f": a step (or steps) within twice the {bench.NOISE_PCT}% noise margin"
                 if any(bench.noise_band(x) != "beyond" for x in steps) else ": the steps change sign") + f"; copy 50%, the bound {share['bf16']:.1%}, fill 100%: "
              + ", ".join(f"{c['gbps']:.0f}" for c in (copy, tb, fill) if c) + " GB/s), so no direction is predicted")
    print(f"fp32: {nb32 / 1e6:.0f} MB; at the bf16 bound's {tb['gbps']:.0f} GB/s ({results.label(run.meta)}): "
          f"{nb32 / tb['gbps'] / 1e6:.3f} ms if fp32's bytes move as fast (a prediction: {share['fp32']:.1%} of fp32's "
          f"bytes are writes against bf16's {share['bf16']:.1%}, and {writes}; 06 measures it, in a run of its own)")
### STUDENT
### END SOLUTION
