# 08 -- Profiling the versions with Nsight Compute.
#
# Percent-format source of notebooks/08_profiling.ipynb (build: python tools/build_notebooks.py 08_profiling).

# %% [markdown]
# # 08 · Profiling: what Nsight Compute says about each version
#
# **Goal.** Notebooks 01-06 explained every step with a prediction and a timing. Here we look
# inside the kernels with NVIDIA Nsight Compute (`ncu`): how much of the DRAM bandwidth each
# version uses, how many 32-byte *sectors* each warp-wide memory instruction touches, how many
# warps were resident, and what the warps were waiting for, down to the Python source line.
# Every profiler number is read from a profile; none is typed in. Sections 3 and 5 also use the
# ceilings of notebook 07's benchmark (the copy, and in section 3 the traffic-matched bound), and
# section 5 an assumed DRAM latency, each labelled as such where it is printed.
#
# Most machines cannot profile: `ncu` is often not installed, and many cloud GPUs refuse
# access to the performance counters (`ERR_NVGPUCTRPERM`). So the profiles of every version,
# measured by `tools/profile_all.py`, are committed under `data/ncu/<gpu>/` (section 1
# prints whose), and this notebook reads them whenever it cannot profile itself. Every table says which
# GPU its rows come from: a profile recorded on another GPU is evidence about that GPU.
#
# **Contents**
# 1. [Where the numbers come from](#source)
# 2. [All versions side by side](#table)
# 3. [DRAM throughput: how close to the wall](#dram)
# 4. [Sectors per request: coalescing, measured](#sectors)
# 5. [Occupancy: enough warps to keep bytes in flight?](#occupancy)
# 6. [Stall reasons: what the warps wait for](#stalls)
# 7. [Down to the source line](#lines)
# 8. [Profiling your own kernel](#own)
# 9. [What we learned](#learned)
# 10. [Exercise: the hot spot of 04's kernel](#exercises)

# %%
import nf4lab  # first: decides GPU or simulator before numba.cuda is imported

import tempfile
from datetime import datetime, timezone

from nf4lab.measure import bench, profiling, results
from nf4lab.format import bytemodel
from nf4lab import lesson

print(nf4lab.describe())

# %% [markdown]
# <a id="source"></a>
# ## 1. Where the numbers come from
#
# `nf4lab.measure.profiling.profile_version(notebook, version, outdir)` runs a small driver program
# under `ncu`: it builds the 16384x16384 case, launches the version a few times (the first
# launch compiles; the others warm up), and then launches it **once** between
# `cuda.profile_start()` and `cuda.profile_stop()`. `ncu --profile-from-start off` profiles
# exactly that launch. The command line it builds:

# %%
cmd = profiling.ncu_command(["python", "-m", "nf4lab.measure.profiling", "drive", "--notebook", "NN_topic",
                             "--version", "NAME"], export="NAME.ncu-rep")
print(profiling.shell_lines(cmd))   # one option (or the target program) a line, as typed in a terminal

# %% [markdown]
# The sections collected: `SpeedOfLight` (DRAM and SM throughput as % of peak), `Occupancy` and
# `LaunchStats` give our table, with the counters named below; `WarpStateStats` its stall reasons;
# `SourceCounters` the stall samples per instruction of section 7's source page; and
# `MemoryWorkloadAnalysis` the memory pages of the full report, which the table does not read. ncu
# replays the kernel once per group of counters it cannot read together, restoring memory
# in between, so the profiled launch takes far longer than the kernel itself. The kernels are
# compiled with `lineinfo=True` (set by the driver) where numba-cuda can compile them with it (else the
# profile has no line info, and the next cell names such profiles), which maps every SASS instruction (SASS: the GPU's native
# machine code, which `ptxas` assembles from the PTX that numba generates) to the Python line it came from; `--clock-control none`
# leaves the clocks where the benchmarks ran.
#
# Pick a version to profile live (when this machine can), then load what is recorded.

# %%
VERSION = None  # a version name from the table below; None: the last one of notebooks 01-06

live = None
if nf4lab.ON_GPU:
    todo = profiling.step_versions()
    chosen = [(nb, n) for nb, n in todo if n == VERSION] or todo[-1:]
    if not chosen:
        print("no step notebook defines a kernel version yet")
    elif profiling.find_ncu() is None:
        print("ncu is not installed here: reading the recorded profiles instead")
    else:
        nb, name = chosen[0]
        print(f"profiling {name!r} from {nb} with ncu (about 10-20 s) ...")
        try:
            when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")   # the recorded rows' format
            res = profiling.profile_version(nb, name, tempfile.mkdtemp(prefix="nf4lab_ncu_"))
            live = {"name": name, "notebook": nb, "gpu": nf4lab.device_info()["gpu"], "date": when, **res,
                    "summary": profiling.summarize(profiling.main_kernel(res["kernels"]))}
            print(f"profiled on this GPU, {when}: {', '.join(res['files'])} pages written to a temporary folder")
        except profiling.NcuUnavailable as exc:
            print(f"ncu could not profile here ({exc.reason}): {exc}\n-> reading the recorded profiles instead")
else:
    print("No GPU here (simulator): nothing can be profiled; reading the recorded profiles.")

rec = profiling.load_recorded()  # this GPU's profiles if any are recorded, else another GPU's
if rec is not None and rec["versions"]:
    m = rec["meta"]
    print(f"recorded profiles: {rec['dir']} -- {m.get('gpu')}, profiled {' and '.join(rec['dates'])}, ncu {m.get('ncu')}, "
          f"numba-cuda {m.get('numba_cuda')}, case {m.get('shape')} {m.get('dtype')}")
    if rec["gpu"] != results.current_gpu():
        print(f"  recorded on {m.get('gpu')}, not on this machine"
              + (f" ({nf4lab.device_info()['gpu']}): its own numbers may differ" if nf4lab.ON_GPU else ""))
    for line in profiling.earlier_kernel_lines(rec):
        print(line)
    for name, v in rec["versions"].items():
        if v.get("lineinfo") is False:
            print(f"  {name}: this recorded profile has no line info (section 7 cannot show its lines)")
    MEASURED = True
else:
    print("No profile recorded yet (data/ncu/ is empty): the tables below show the hand-made example in "
          "tests/fixtures/ -- it shows ncu's format, its numbers are invented, NOT a measurement.")
    rec = profiling.load_fixture()
    MEASURED = False

# Each recorded row: [the date it was profiled, whether that was the kernel its notebook teaches now].
summaries = {(profiling.row_label(name, v, rec["meta"]) if MEASURED else name): v["summary"] for name, v in rec["versions"].items()}
if live is not None:
    summaries[f"{live['name']} (live)"] = live["summary"]
NW = max(len(k) for k in summaries)   # the name column of the tables below
# One line naming whose rows the tables below show, and what the (live) row may be compared with.
live_rec = rec["versions"].get(live["name"], {}) if live else {}
apart = [w for w, differs in (("another GPU", MEASURED and live and rec["meta"].get("gpu") != live["gpu"]),
                              ("another kernel", live_rec.get("earlier_kernel"))) if differs]
WHERE = (f"{'profiles recorded on ' + rec['meta'].get('gpu', '?') if MEASURED else 'an invented example'}"
         + (f"; the row marked (live): profiled now on {live['gpu']}, {live['date']}" if live else "")
         + (f" ({' and '.join(apart)} than the recorded rows: not comparable with them)" if live and apart else ""))
print(WHERE)

# %% [markdown]
# <a id="table"></a>
# ## 2. All versions side by side
#
# One row per version (its longest kernel when a launch runs several). Columns: kernel time
# under the profiler; **DRAM %**, DRAM throughput as % of its peak; **mem %**, the busiest of
# the memory units (L1, L2, DRAM); **SM %**, the busiest of the SM's sub-units (Nsight Compute's Compute (SM)
# Throughput: instruction issue and every pipe, memory-instruction paths included, not only arithmetic); achieved and theoretical
# **occupancy**; registers per thread; **sectors per request** for global loads and stores; and
# the three largest **stall reasons** in cycles per issued instruction.

# %%
print(("" if MEASURED else "EXAMPLE (NOT A MEASUREMENT)\n") + WHERE + "\n" + profiling.table(summaries))

# %% [markdown]
# The same numbers as a list of dicts, one per version, for your own plots (`pandas.DataFrame(rows)`
# if you have pandas):

# %%
rows = profiling.rows(summaries)
print({k: rows[0][k] for k in ("version", "dram_pct", "achieved_occupancy", "ld_sectors_per_request",
                               "st_sectors_per_request", "top_stalls")} if rows else "no rows")

# %% [markdown]
# <a id="dram"></a>
# ## 3. DRAM throughput: how close to the wall
#
# `dram__throughput.avg.pct_of_peak_sustained_elapsed` is the DRAM traffic over the kernel's
# duration as a share of what the memory can sustain. A memory-bound kernel is finished when
# this is close to 100 %: there is nothing left to win but bytes. No real kernel gets to 100 %:
# reads and writes share the bus, and DRAM has overheads of its own (refresh, switching between
# rows; known causes in general, not measured here), so expect the device copy of notebooks 00
# and 07 below the datasheet peak too: the cell prints its share of the peak where the record
# holds one. A row's DRAM traffic may be set beside the copy ceiling and the traffic-matched bound
# (notebooks 00 and 07) only where those were measured on the GPU that row names: the cell prints,
# for each GPU in the table, whether a ceiling record of that GPU exists (`data/results/<gpu>/`)
# and compares that GPU's rows with it only. Even then they are different
# runs and different metrics: the profiles (their GPU and date are printed with them) time one
# launch with the caches flushed and count DRAM traffic as a share of the peak, while the
# benchmark times many launches in CUDA graphs and divides the byte model by that time. Read the
# two side by side as a cross-check of the picture, not as one number measured twice.
#
# ncu also counts the bytes DRAM really moved. Compare them with the byte model, the fewest
# bytes any kernel must move: a ratio near 1.0 means every byte was read or written once.
# More means re-reads (an evicted L2 line read again) or partial writes.

# %%
n = 16384 * 16384
model = bytemodel.bytes_moved(n, "bf16", 64)
print(f"byte model for 16384x16384 bf16: {model / 1e6:.0f} MB; {WHERE}\n")
print(f"{'version':<{NW}} {'DRAM %':>7} {'DRAM MB':>9} {'/ model':>8} {'GB/s':>7}")
dram_gbps = {}
for name, s in summaries.items():
    if not s or s["dram_read_bytes"] is None:
        continue
    moved = s["dram_read_bytes"] + s["dram_write_bytes"]
    dram_gbps[name] = gbps = moved / (s["duration_us"] * 1e-6) / 1e9
    print(f"{name:<{NW}} {s['dram_pct']:>7.0f} {moved / 1e6:>9.0f} {moved / model:>8.2f} {gbps:>7.0f}")

# Each row beside the ceilings of its own GPU only: the recorded rows' GPU, and the live row's.
if MEASURED:
    by_gpu = {}
    for name in dram_gbps:
        is_live = live is not None and name == f"{live['name']} (live)"
        by_gpu.setdefault(live["gpu"] if is_live else rec["meta"].get("gpu"), []).append(name)
    for gpu, row_names in by_gpu.items():
        c = profiling.ceiling_record(gpu)
        if c is None:
            print(f"\n{gpu}: no ceiling recorded under data/results/{results.gpu_slug(gpu)}/: its rows are not "
                  "comparable with any ceiling this book prints")
            continue
        print(f"\n{gpu}: ceilings from notebook {c['notebook'][:2]}'s run ({c['label']}): copy {c['copy_gbps']:.0f} GB/s"
              + (f" = {c['copy_gbps'] / c['spec_peak_gbps']:.0%} of the datasheet peak {c['spec_peak_gbps']:.0f} GB/s "
                 f"(cited: {nf4lab.runtime.spec_peak_source(gpu)})" if c["spec_peak_gbps"] else " (no datasheet peak in that record)")
              + (f", traffic-matched bound {c['bound_gbps']:.0f} GB/s" if c["bound_gbps"] else ""))
        for name in row_names:
            print(f"  {name:<{NW}} {dram_gbps[name]:>6.0f} GB/s of DRAM traffic under the profiler = "
                  f"{dram_gbps[name] / c['copy_gbps']:.0%} of that copy")

# %% [markdown]
# Look at the per-byte version first: a low DRAM %, although the bytes moved match the model.
# The kernel does not move *more* than it must; most likely it cannot keep enough bytes *in flight*
# to cover the DRAM latency (section 5 estimates how many it would need, with an assumed latency;
# section 6 shows its warps waiting on loads). The versions that reach the wall move the same bytes in less time.
# A ratio slightly below 1 is most likely the L2 cache: the last part of the output is still in L2 when
# the kernel ends and is written back to DRAM after it; a ratio above 1 most likely means some lines
# went to DRAM more than once (stores that reach L2 in pieces; not tested here).
#
# Use the benchmarks (notebooks 00-07) for times and ncu for explanations: ncu flushes the
# caches before each replay (its default, `--cache-control all`, which is why the printed ncu
# command does not spell it out) and times a single launch.

# %% [markdown]
# <a id="sectors"></a>
# ## 4. Sectors per request: coalescing, measured
#
# One warp-wide load or store instruction is one *request* to the L1/TEX unit (the unit that serves
# global loads and stores, through the L1 cache); memory is
# served in 32-byte *sectors* (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory",
# as in notebooks 02 and 04). `l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum` divided by
# `l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum` tells how many sectors a warp's
# instruction touches. For 32 lanes reading consecutive elements of `w` bytes, that is
# `32 * w / 32 = w`: 1 for bytes, 4 for 32-bit words, 16 for 128-bit vectors. Anything above
# `w` means one instruction's lanes do not read one contiguous run (strided or scattered), so part of
# each sector fetched goes unused (half of it at a stride of twice the width); the measured column
# averages every load instruction of the kernel.

# %%
def expected_sectors(width_bytes, stride_bytes=None, lanes=32):
    """Distinct 32-byte sectors one warp instruction touches: each lane accesses width_bytes,
    lane k at byte k * stride (aligned start)."""
    stride = stride_bytes or width_bytes
    return len({(lane * stride + b) // 32 for lane in range(lanes) for b in range(width_bytes)})


for what, w, stride in [("uint8 load, consecutive (packed codes, per byte)", 1, None),
                        ("uint16 store at stride 2 elements (out[2i], out[2i+1])", 2, 4),
                        ("uint32 load or store, consecutive", 4, None),
                        ("128-bit load or store, consecutive", 16, None),
                        ("128-bit stores, each lane 64 contiguous bytes (4 vectors)", 16, 64)]:
    print(f"{what:<62} {expected_sectors(w, stride):>3} sectors per request")
print(f"\nmeasured ({WHERE}):")
for name, s in summaries.items():
    if s:
        f = lambda x: "-" if x is None else f"{x:.1f}"
        print(f"{name:<{NW}} loads {f(s['ld_sectors_per_request']):>5}   stores {f(s['st_sectors_per_request']):>5}")

# %% [markdown]
# Reading the measured column against the kernels' code:
#
# - **Per byte (01).** The packed code is a `uint8` load: consecutive lanes, 1 sector. Each
#   thread stores `out[2i]` and `out[2i+1]` as two 16-bit stores: a warp's first store
#   covers every other element of 128 bytes, so it touches 4 sectors while writing only 64
#   bytes; the second store touches the same 4 again. The scale loads (`absmax_q`, `code2`,
#   `absmax2`) are one address for all lanes of a warp: 1 sector each. The average over all
#   loads is a little above 1 because of the table lookups: 32 lanes read the 16-float table,
#   64 bytes, spread over 2 sectors.
# - **Packed 32-bit stores (03).** One `uint32` per lane holding two bf16: 4 sectors for 128
#   bytes, every byte used.
# - **16-byte accesses (04-06).** 16 sectors per request is the ideal for 128-bit accesses:
#   a warp moves 512 bytes with one instruction. When each lane instead writes its own 64
#   contiguous bytes (four vectors in a row), one store instruction spans 32 x 64 bytes and
#   touches 32 sectors, each only half written by it. The next instruction writes the other half
#   of the same 32 sectors, and the last two do the same for the other 32 (each lane's second
#   sector), so every sector is completed by two instructions (notebook 04, section 4). The bytes all get written, but the warp's stores no longer arrive as
#   whole contiguous lines (the "scattered stores" version of notebook 04).
# - **The loads' column (04-06)** is an average over every global load instruction: the code
#   loads (16 sectors for a 128-bit load, 4 for a 32-bit word) together with the scale loads
#   and the table loads (2 sectors where the lookups read a table in global memory, as in 04; the lookups
#   of 05's profiled kernels and of 06 read shared memory, constant memory or registers, and 06, like 05's shared-memory kernel,
#   loads the table from global memory only to fill shared memory). Of the scale loads, `absmax_q` and `absmax2` touch 1 sector each, and
#   `code2` (8 entries a sector) at most one sector per distinct entry that the warp's `absmax_q`
#   values pick: up to 4 where a warp's lanes take 32 consecutive words (04's second kernel, 05's),
#   up to 16 in 04's scattered kernel, whose warp load spans 1024 weights, 16 blocks. 06's kernel
#   copies `code2` whole into shared memory, 4 sectors a coalesced 32-bit load; a row marked EARLIER
#   is the kernel 06 replaced, which read `code2` from global memory as 05's do. The value printed is
#   that mix, so this column alone cannot show whether the code loads are fully coalesced.

# %% [markdown]
# <a id="occupancy"></a>
# ## 5. Occupancy: enough warps to keep bytes in flight?
#
# Achieved occupancy (`sm__warps_active.avg.pct_of_peak_sustained_active`) is the average
# number of resident warps per SM as a share of the maximum (ncu records the GPU's limits with
# every profile; the cell prints them); theoretical occupancy is what registers, shared memory and block size allow. A memory-bound
# kernel needs occupancy only as a means: by Little's law, the bytes in flight must equal
# bandwidth times latency. A warp never waits for a store's data to come back (a store needs no answer
# to go on; stores can still hold issue back where their queue is full: section 6's stall reasons), so
# the bytes whose latency must be covered are reads: a kernel that moves the byte model's
# bytes at the copy ceiling's rate reads at that rate times the model's read share, which the cell
# prints. The estimate below takes the copy ceiling measured on the GPU in hand (without one: the
# recorded GPU; the cell prints which) and the series' one assumed DRAM latency
# (`nf4lab.lesson.ASSUMED_DRAM_LATENCY_NS`): an order of magnitude, not a measurement.

# %%
LATENCY_NS = lesson.ASSUMED_DRAM_LATENCY_NS  # assumed, the same figure in every notebook
ceil_from = next((nb for nb in ("07_summary", "00_ceiling") if bench.Run.load(nb) is not None), None)
ceil = bench.Run.load(ceil_from) if ceil_from else None   # one run: its label is printed with its copy
copy = ceil.get(bench.COPY, (16384, 16384), "bf16") if ceil is not None else None   # section 3's case
sms = ceil.meta.get("sms") if ceil is not None else None
# The per-SM limits of the GPU whose ceiling is used: as ncu recorded them with a profile of that GPU
# (the live one, else a recorded one), or, on a GPU without such a profile, numba's device attributes.
same_gpu = ceil is not None and MEASURED and rec["meta"].get("gpu") == ceil.meta.get("gpu")
shown = live if live is not None else (next((v for v in rec["versions"].values() if v.get("kernels")), None)
                                       if same_gpu else None)
attrs = {}
if shown is not None:
    m = profiling.main_kernel(shown["kernels"])["metrics"]
    attrs = {k: m[f"device__attribute_{k}"]["value"] for k in ("max_warps_per_multiprocessor",
             "max_threads_per_multiprocessor", "max_registers_per_multiprocessor") if f"device__attribute_{k}" in m}
    where = f"live, {live['gpu']}, {live['date']}" if live is not None else f"recorded on {rec['meta'].get('gpu')}, {shown.get('date')}"
    print(f"per SM, as ncu recorded it ({where}): " + ", ".join(f"{k.replace('_', ' ')} {v:,.0f}" for k, v in attrs.items()))
elif nf4lab.ON_GPU and nf4lab.device_info().get("max_threads_per_sm"):
    attrs = {"max_warps_per_multiprocessor": nf4lab.device_info()["max_threads_per_sm"] // 32}
    print(f"per SM, from numba's device attributes ({nf4lab.device_info()['gpu']}): "
          f"{attrs['max_warps_per_multiprocessor']} warps")
warps = int(attrs.get("max_warps_per_multiprocessor") or 0)
read_share = 1 - bytemodel.breakdown(n, "bf16", 64)["output"] / model   # all but the output is read
if copy and sms and warps:
    inflight = copy["gbps"] * LATENCY_NS  # GB/s * ns = bytes, reads and writes together
    reads = inflight * read_share
    per_thread = reads / sms / warps / 32
    print(f"copy ceiling of the GPU in hand, else of a recorded GPU: {results.source_note(results.gpu_slug(ceil.meta['gpu']))}")
    print(f"  copy ceiling from notebook {ceil_from[:2]}'s run: {results.label(ceil.meta)}")
    print(f"  copy ceiling {copy['gbps']:.0f} GB/s (measured) x {LATENCY_NS} ns (assumed) = {inflight / 1e6:.1f} MB "
          "in flight, reads and writes together")
    print(f"  the byte model reads {read_share:.1%} of its bytes (16384x16384 bf16): reads in flight "
          f"{reads / 1e6:.2f} MB, {reads / sms / 1024:.1f} KiB per SM ({sms} SMs)")
    print(f"  with {warps} resident warps per SM: {reads / sms / warps:.0f} bytes per warp, "
          f"{per_thread:.1f} bytes per thread")
    print("  with one load in flight per thread (each waits for its load before the next): 1-byte loads "
          + ("cannot get there" if per_thread > 1 else "can get there")
          + (", 16-byte ones can." if per_thread <= 16 else ", nor can one 16-byte load per thread."))
else:
    print("no copy ceiling or per-SM limits recorded for this GPU (run notebook 00 or 07 on it): no estimate")
# The register limit of each GPU the occupancy rows below come from: the live profile's and the recorded ones'.
profiled_on = ([(f"live, {live['gpu']}", live)] if live is not None else []) + (
    [(f"the recorded profiles, {rec['meta'].get('gpu')}", next((v for v in rec["versions"].values() if v.get("kernels")), None))]
    if MEASURED else [])
for who, v in profiled_on:
    limit = profiling.full_warps_register_limit(profiling.main_kernel(v["kernels"])) if v else None
    if limit:
        print(f"registers per thread that still let every warp slot fill ({who}, as ncu recorded it): {limit:.0f}")
print(f"\noccupancy ({WHERE}):")
for name, s in summaries.items():
    if s:
        print(f"{name:<{NW}} achieved {s['achieved_occupancy'] or 0:>5.1f}%  theoretical "
              f"{s['theoretical_occupancy'] or 0:>5.1f}%  registers {s['registers'] or 0:>4.0f}")

# %% [markdown]
# High occupancy does not make the per-byte kernel fast: its warps are resident, but each
# holds only a few bytes of loads in flight. In section 3's table three kernels with coalesced
# 16-byte stores and a cheap table lookup reach the wall: 04's second kernel and 05's shared-memory
# table, which also load their codes 16 bytes at a time, and 06, whose code loads are 32-bit (its
# recorded row is an earlier kernel that loaded its words the same way). In the table above they do
# so with about the occupancy of 02's grid-stride kernel, which does not (its code loads are 1 byte
# and its stores 2 bytes, one weight each): what changed is the bytes each memory instruction carries. Wide loads
# alone are not enough: 04's scattered stores stay far below the wall at high occupancy (section 4's
# store column: the sectors per request that `expected_sectors` gives for each lane's 64 contiguous bytes).
# Nor are wide loads with coalesced stores: 05's constant-memory and register tables stay far below too,
# with the sectors per store request that section 4 expects of consecutive 128-bit stores; the register table's occupancy is
# lower, capped by its registers as the table above prints. Most likely the stores hold back the
# first and the lookups the other two (section 6's stall reasons). (The estimate above is for the GPU it names; the rows here are the
# profiles' own GPUs, so read it against them as an order of magnitude.) Achieved far
# below theoretical means the launch did not supply the warps: a grid-stride launch with a
# small, fixed grid (notebook 02) leaves most warp slots empty however few registers the
# kernel uses. Even with a full grid, expect achieved to stay below theoretical, by an amount
# that depends on the kernel and the GPU. Where ncu's Occupancy section flags the gap (see the
# `.details.csv` pages under `data/ncu/`), it says the difference "can be the result of warp
# scheduling overheads or workload imbalances during the kernel execution"; in these kernels,
# expect for example a last wave of blocks that does not fill the GPU (a GPU runs a grid's blocks
# in *waves*: as many at once as its SMs can hold, the next ones as earlier ones finish, so the
# last wave may be partial), and blocks that take time to start and end. The table above shows
# how far below theoretical each version lands on the GPU it was profiled on. In these rows, theoretical below 100 % comes from the registers: an SM's register
# file, shared by all its resident threads, allows as many registers per thread as the lines
# above print for the GPU each names (compare a row with its own GPU's line); a kernel that needs more cannot fill every warp slot.

# %% [markdown]
# <a id="stalls"></a>
# ## 6. Stall reasons: what the warps wait for
#
# Each cycle a warp scheduler picks one ready warp; the others are *stalled*, and ncu records
# why (`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`: cycles spent in
# each state per issued instruction). The ones that matter here (the last column says which code
# causes each; which version shows it most, in the profiles shown, the cells below print):
#
# | reason | the warp waits for | in these kernels |
# | --- | --- | --- |
# | `long_scoreboard` | a result from global (or local) memory | the loads of the packed codes and of the scales |
# | `lg_throttle` | room in the queue of global memory instructions | a thread issuing several memory instructions back to back, e.g. four 16-byte stores in a row |
# | `mio_throttle`, `short_scoreboard` | the MIO unit (memory input/output: a queue and pipes that, by Nsight Compute's Profiling Guide, include those of shared-memory, special-math and dynamic-branch instructions): room in its queue (`mio_throttle`) or a result from it (`short_scoreboard`) | table lookups in constant memory whose lanes read different entries (05's LUT in constant memory), or shared-memory traffic; the queue carries other instructions too, so a kernel with neither shared nor constant memory can show `mio_throttle` (04's scattered kernel, where the cells below print it): which of its instructions fill the queue there, these profiles do not measure |
# | `barrier` | the other warps of the block at `cuda.syncthreads()` | kernels that stage data in shared memory |
# | `math_pipe_throttle` | a busy arithmetic pipe | many instructions per weight, e.g. the LUT as a tree of selects (05) |
# | `drain` | its stores to leave, at exit | store-heavy kernels: 4 bytes out for every byte in |
# | `wait` | a fixed-latency dependency | plain arithmetic |
# | `dispatch_stall` | nothing of its own: it was ready, and the dispatcher held back its instruction (by Nsight Compute's Profiling Guide, for "other conflicts or events") | rare in these kernels |
# | `not_selected` | nothing: it was ready but another warp issued | more ready warps than the scheduler needs: harmless beside memory waits; where it is on top, the schedulers issue every cycle they can and instructions are the limit |
#
# Which version shows each reason most:

# %%
print(WHERE)
for name, s in summaries.items():
    if s and s["stalls"]:
        top = ", ".join(f"{r} {v:.1f}" for r, v in s["stalls"][:4])
        print(f"{name:<{NW}} {top}   ({s['stall_unit']})")

# %%
REASONS = ("long_scoreboard", "lg_throttle", "mio_throttle", "short_scoreboard", "barrier", "math_pipe_throttle",
           "drain", "wait", "not_selected")
most, LIVE = {}, f"{live['name']} (live)" if live else None
for name, s in summaries.items():
    if name == LIVE and apart:   # another GPU or kernel than the recorded rows: not ranked with them
        continue
    for reason, v in (s["stalls"] if s else []):   # each reason of the table above, not only a row's largest
        if reason in REASONS and v > most.get(reason, ("", 0.0))[1]:
            most[reason] = (name, v)
print("among the recorded rows" + (" (the live row left out: " + " and ".join(apart) + ")" if LIVE and apart else ""))
for reason, (name, v) in sorted(most.items(), key=lambda x: -x[1][1]):
    print(f"{reason:<20} largest in {name} ({v:.1f})")

# %% [markdown]
# A memory-bound kernel at the wall still shows `long_scoreboard` first: its warps wait on DRAM,
# as they must. What changes from version to version is how many bytes each wait brings in.
# When another reason comes first, the kernel is held up by something other than DRAM: that is
# the version to look at in its notebook.

# %% [markdown]
# <a id="lines"></a>
# ## 7. Down to the source line
#
# `tools/profile_all.py` also exports ncu's *source page* (`--page source --print-source
# cuda,sass`): the stall samples of every SASS instruction, grouped under the Python line it
# came from (line info). Below: the lines where a version's warps spent their samples, and the
# instruction of each line that collected most of them. It shows the live profile when there is
# one, else the fastest recorded profile that has line info (section 1 names those without), leaving
# out 04's coalesced kernel: the exercise at the end is about that one.

# %%
def hot_lines(path, top=6):
    """Source lines with most stall samples in an ncu source page ([] without line info)."""
    lines = profiling.parse_source_csv(open(path).read(), top=top) if path else []
    return lines if any(t["line"] for t in lines) else []


def show_lines(lines):
    for t in lines:
        print(f"{t['pct']:5.1f}%  line {t['line']:>4}: {t['source'][:72]}")
        print(f"{'':14}hottest instruction: {t['sass']}")


lines, source_page = [], None
if live is not None:
    source_page = live["files"].get("source")
    lines = hot_lines(source_page)
    print(f"{live['name']}, profiled now on {live['gpu']}, {live['date']}"
          + (":" if lines else ": no line info in this profile (compiled without lineinfo=True)"))
if not lines and MEASURED:
    found = {n: hot_lines(f"{profiling.ROOT}/{rec['dir']}/{v['source']}") if v.get("source") else []
             for n, v in rec["versions"].items()}
    missing = [n for n, t in found.items() if not t]
    if missing:
        print(f"no line info recorded for: {', '.join(missing)}")
    fastest = sorted((v["summary"]["duration_us"], n) for n, v in rec["versions"].items()
                     if found[n] and v["summary"] and n != "04 16B loads, coalesced stores")
    pick = VERSION if found.get(VERSION) else (fastest[0][1] if fastest else None)
    if pick:
        print(f"{pick}, recorded on {rec['meta'].get('gpu')}, {rec['versions'][pick].get('date')}:")
        lines = found[pick]
        source_page = f"{profiling.ROOT}/{rec['dir']}/{rec['versions'][pick]['source']}"
show_lines(lines) if lines else print("No source page with line info recorded: no source lines to show.")

# %% [markdown]
# How to read it (SASS opcodes: `LDG`/`STG` global load/store, `LDS`/`STS` shared load/store, `LDC`/`ULDC`
# constant-bank loads, `S2R` a read of a special register such as the thread index; `UR...` are uniform
# registers, one value for the whole warp). The kernel's `def` line collects what line info maps to no other line of the
# cell: the kernel's entry code (its parameters and the launch's constants read from constant bank
# 0, `LDC`/`ULDC ... c[0x0][...]`, where by common SASS convention the first `LDC R1, c[0x0][...]`
# sets up the stack pointer rather than reading a parameter; at times the thread and block indices' `S2R`,
# which more often keep the line that reads them)
# and inlined helpers (`inline="always"`) whose lines lie above the `def` line: numba-cuda charges
# any line number smaller than the `def` line's to it (its lowering's `_adjust_line_if_prologue`),
# and an inlined helper keeps its own line numbers, even one from another file: the page prints those
# against the lines of the kernel's cell that carry the same numbers. Numbers smaller than the `def`
# line's land on it; larger ones on whatever line of the cell has that number, which may not hold such
# an instruction at all (a kernel whose `def` line sits near the top of its cell can show a helper's load on
# a line of its body that loads nothing): read an instruction's kind and width before its line. On 06's page (the one a live profile shows) every helper's line number is
# smaller than the `def` line's: the helpers its kernel
# cell defines above the kernel (its `LDS` are `weights`' table reads, 2 a call, and `scale_of`'s
# `code2` reads) and, from other files, `block_scale` (01 writes it, 02-06 import it from
# `nf4lab.lesson`; it loads one byte of `absmax_q` and a float each of `code2` and `absmax2`) and the
# `nf4lab.device.ops` instructions those helpers call (`fmul_rn`, `pack_bf16x2`, `to_bf16_bits`).
# What the kernel body computes itself keeps its line, the ops intrinsics it calls included: the
# 16-byte stores, and the tail's table reads and their multiplications (its `block_scale` calls, at lines of their own file numbered below the
# `def` line's, land on the `def` line). The cell below counts what the `def` line holds on the page shown, so a `def` line near the top is read
# from its instructions. It also prints the `def` line's global loads with their offsets in the
# kernel (the hottest instruction's offset is printed with it) and how many global loads each line
# holds: where a line that reads global memory in the source holds none, line info charged its
# load to another line, or the compiler merged it with another load (and a line can hold another line's loads,
# so a line's count can exceed its source's loads); the load's width (`.U8`: 1
# byte, no suffix: 4 bytes, `.128`: 16 bytes) narrows down which array it reads.
#
# A stall sample is charged to the instruction a warp would issue next and did not. That warp may
# be waiting for an operand (`long_scoreboard`, `short_scoreboard`, `wait`); it may be ready while
# another warp issues, its pipe is busy or the dispatcher holds it back (`not_selected`,
# `math_pipe_throttle`, `dispatch_stall`); or it may wait for something else: the block's barrier,
# room in a queue, or its stores to leave (`barrier`, `lg_throttle`, `mio_throttle`, `drain`). Where
# operand waits hold most of an instruction's samples, the instruction itself is rarely slow: what
# it waits for is the instruction that wrote its operand register. The cell below reads the whole SASS listing of the same source
# page in address order, with the registers each instruction writes and reads, and names the
# hottest instruction (`profiling.hottest`). Walking back from it to the instruction that last
# wrote one of its source registers, and on, writer by writer, is the exercise at the end of this
# notebook, on another kernel's page; where the walk ends (a load, a kernel parameter, the thread
# index, ...) depends on the page. The exercise prints this page's chain too once you have written
# it. The listing also keeps each instruction's stall samples by reason (the page's `stall_*`
# columns, named as in section 6).

# %%
import collections
import csv
import re


def program(path):
    """Every SASS instruction of an ncu source page, in address order, with its Python line, its samples
    ("samples": the page's Warp Stall Sampling (All Samples), issued ones included) and its stall samples by
    reason ("stalls": the page's stall_* columns, issued samples left out)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r[:1] == ["Line No"])
    why = {k: profiling.SOURCE_STALLS.get(c[6:], c[6:]) for k, c in enumerate(rows[head])
           if c.startswith("stall_") and "Not Issued" not in c and c != "stall_selected"}
    prog, line, src = [], None, None
    for r in rows[head + 1:]:
        if r[0].strip():
            line, src = r[0].strip(), r[1].strip()
        elif len(r) > 4 and r[2].startswith("0x"):
            stalls = {w: profiling.to_number(r[k]) for k, w in why.items() if k < len(r)}
            prog.append({"addr": int(r[2], 16), "sass": r[3].strip(), "samples": float(r[4] or 0),
                         "line": line, "source": src, "stalls": {w: v for w, v in stalls.items() if v}})
    return sorted(prog, key=lambda x: x["addr"])


NO_DEST = ("ST", "RED", "BRA", "EXIT", "BAR", "RET", "CALL", "BSYNC", "BSSY", "WARPSYNC", "ISETP", "FSETP", "DSETP")


def operands(sass):
    """(opcode, registers written, registers read) of one SASS instruction; R4.64 is R4 and R5, a wide store's data
    covers its width (`STG.E.128 [R2.64], R4` reads R4 to R7) and a .WIDE's last operand is a register pair."""
    op, _, rest = re.sub(r"^@!?U?P\w+\s+", "", sass).partition(" ")
    ops = [o.strip() for o in rest.split(",")] if rest else []
    width = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
    dest = set()
    if ops and not op.startswith(NO_DEST):
        m = re.match(r"R(\d+)", ops.pop(0))
        dest = {int(m.group(1)) + k for k in range(width)} if m else set()
    src = set()
    for k, o in enumerate(ops):
        last = k == len(ops) - 1
        for m in re.finditer(r"\bR(\d+)(\.64)?", o):
            n = (width if last and op.startswith(NO_DEST) and "[" not in o else 2 if last and ".WIDE" in op
                 else 2 if m.group(2) else 1)
            src |= {int(m.group(1)) + i for i in range(n)}
    return op, dest, src


prog = program(source_page) if source_page and lines else None
if prog:
    total = sum(x["samples"] for x in prog)
    start = prog[0]["addr"]   # short offsets from here; the page itself lists full addresses
    print(f"source page: {source_page}" + (" (live: a temporary folder on this machine)" if live is not None else ""))
    print(f"offsets below count from the kernel's first instruction, at address {start:#x} on that page")
    hot = profiling.hottest(prog)
    # Its share is of all the samples on the page, as section 7's line shares are: a line's samples are the sum of
    # its instructions', so a line holds at least the share of its hottest instruction.
    print(f"hottest instruction ({hot['share']:.1%} of the page's samples), at +{hot['offset']:#06x}, line "
          f"{hot['line']}: {hot['sass']}  (reads {sorted(operands(hot['sass'])[2])})")
    defs = [x for x in prog if x["source"].startswith("def ")]
    if defs:
        ops = collections.Counter(operands(x["sass"])[0].split(".")[0] for x in defs)
        print(f"the def line (line {defs[0]['line']}): {len(defs)} instructions, {sum(x['samples'] for x in defs) / total:.1%} "
              f"of the samples; {sum('c[0x0]' in x['sass'] for x in defs)} read constant bank 0 (parameters and launch constants, c[0x0][...]); "
              f"most frequent opcodes: {', '.join(f'{o} {k}' for o, k in ops.most_common(8))}")
        loads = collections.defaultdict(list)   # opcode with its width -> offsets of the def line's global loads
        for x in defs:
            if operands(x["sass"])[0].startswith("LDG"):
                loads[operands(x["sass"])[0]].append(x["addr"] - start)
        print(f"  its global loads: {sum(map(len, loads.values()))}" + ("" if loads else " (none)"))
        for op, offs in loads.items():
            print(f"  {op:<14} {len(offs):>3} at " + ", ".join(f"+{o:#06x}" for o in offs))
    per_line = collections.Counter(x["line"] for x in prog if operands(x["sass"])[0].startswith("LDG"))
    print("global loads per line: " + (", ".join(f"line {ln}: {k}" for ln, k in sorted(per_line.items(), key=lambda t: int(t[0] or 0)))
                                       or "none on this page"))

# %% [markdown]
# <a id="own"></a>
# ## 8. Profiling your own kernel
#
# On a machine where `ncu` may read the counters (your own workstation, or a server where an
# administrator allowed it), profile any version of the step notebooks:
#
# ```python
# res = profiling.profile_version("04_vector_loads", "<version name>", "my_profiles")
# print(profiling.table({"mine": profiling.summarize(profiling.main_kernel(res["kernels"]))}))
# ```
#
# or from a terminal, for your own script, with the same sections and metrics as section 1's command
# (the cell builds it with the same `profiling.ncu_command`). Your script need not call
# `cuda.profile_start()`: this command profiles from the start and picks one launch by kernel name
# instead; then the second line prints the table of its CSV.

# %%
print(profiling.shell_lines(profiling.ncu_command(["python", "my_script.py"], profile_from_start=True,
                                                  kernel_regex="my_kernel", launch_skip=2, launch_count=1), "> my.csv"))
print("python -m nf4lab.measure.profiling table my.csv")

# %% [markdown]
# (`--launch-skip 2` skips `my_kernel`'s first two launches, the one that compiles it and a warm-up,
# so your script should launch it at least three times.) `ERR_NVGPUCTRPERM` means the
# driver only lets administrators read the counters; `ncu` cannot help there, and the recorded
# profiles are what this notebook shows instead.

# %% [markdown]
# <a id="learned"></a>
# ## 9. What we learned
#
# - DRAM throughput % is the verdict for a memory-bound kernel; the DRAM bytes ncu counts
#   check the byte model (each byte moved once).
# - Sectors per request measures coalescing: the access width in bytes for consecutive lanes,
#   more when lanes stride; over a kernel it averages all its loads (or stores).
# - Occupancy is a means: what a memory-bound kernel needs is bytes in flight. Wider accesses
#   supply more bytes in flight per warp: sections 3 and 5 show the kernels with coalesced 16-byte
#   stores and a cheap lookup (04's second and 05's shared-memory table with 16-byte code loads, 06
#   with 32-bit ones) near the wall with about
#   the occupancy of the slower full-occupancy kernels (02, 03 grid-stride). Occupancy is not what
#   sets them apart, and neither is the access width alone: 05's other two tables have the same
#   loads and stores and stay far below.
# - `long_scoreboard` comes first in the memory-bound versions: the warps wait on memory. Any
#   other reason on top (`lg_throttle`, `mio_throttle`, `math_pipe_throttle`, or `not_selected`
#   in an instruction-bound kernel) names what holds a version back before DRAM does.
# - With `lineinfo=True`, stalls land on Python lines, which is where a fix is written (an inlined
#   helper from another file lands on the line of the cell with its own number, or on the `def` line
#   where that number is smaller: section 7). The
#   hottest instruction is the one with the most samples (issued ones included); its stall reasons
#   say why. Where operand waits hold most of its samples, walking back to the writers of its
#   operands finds a chain that may lead to what it waited for; where ready warps or a busy pipe
#   hold most of them, it waited for no operand. The exercise's page says which holds there.

# %% [markdown]
# <a id="exercises"></a>
# ## 10. Exercise: the hot spot of 04's kernel
#
# Section 7 read another kernel's page; this one is yours: the source page of 04's coalesced
# kernel, profiled now where `ncu` can (the cell says), else its recorded page (the cell names
# the GPU and the date). Write `hot_spot(prog)` for a listing `prog` (section 7's `program`): a
# dict with `"hot"`, the index of the instruction with the most samples (its `"samples"`, issued ones included); `"line"`, the
# Python line it came from; and `"waits_for"`, the index of the last instruction before it that
# **writes** a register it **reads** (`operands(sass)` gives both sets), or None. The check
# verifies each against the listing. Once it passes, the cell prints, on this page and on section
# 7's, the hot instruction's share of the page's samples and its stall samples by reason (with the
# share that waits for an operand, and the share of ready warps or a busy pipe), and walks back from
# it, writer by writer,
# until the walk reaches a load or an instruction with no writer to follow; it prints where the
# walk ended: a load from global or shared memory, a kernel parameter (constant bank), a special
# register such as the thread index, an instruction whose inputs it cannot follow, or none of
# these within its steps. Which one depends on the page, and pages differ from run to run.

# %%
from nf4lab.lesson import exercises


def hot_spot(prog):
### BEGIN SOLUTION
    hot = max(range(len(prog)), key=lambda k: prog[k]["samples"])
    reads = operands(prog[hot]["sass"])[2]
    writer = next((j for j in range(hot - 1, -1, -1) if operands(prog[j]["sass"])[1] & reads), None)
    return {"hot": hot, "line": prog[hot]["line"], "waits_for": writer}
### STUDENT
    return None   # TODO: a dict of three indices or lines (about 5 lines)
### END SOLUTION


EX = "04 16B loads, coalesced stores"
prog04, page = None, rec and rec["versions"].get(EX, {}).get("source")
if nf4lab.ON_GPU and profiling.find_ncu() is not None:
    try:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        res04 = profiling.profile_version("04_vector_loads", EX, tempfile.mkdtemp(prefix="nf4lab_ncu_"))
        if res04["files"].get("source"):
            prog04 = program(res04["files"]["source"])
            print(f"{EX}, profiled now on {nf4lab.device_info()['gpu']}, {when}: {len(prog04)} instructions; "
                  f"its page: {res04['files']['source']} (a temporary folder on this machine)")
    except profiling.NcuUnavailable as exc:
        print(f"ncu could not profile 04's kernel here ({exc.reason}): reading its recorded page")
if prog04 is None and MEASURED and page:
    prog04 = program(f"{profiling.ROOT}/{rec['dir']}/{page}")
    print(f"{EX}, recorded on {rec['meta'].get('gpu')}, {rec['versions'][EX].get('date')}: {len(prog04)} instructions; "
          f"its page: {profiling.ROOT}/{rec['dir']}/{page}")
ok = exercises.check_hot_spot(hot_spot, prog04, operands) if prog04 else print("no source page of 04's kernel: nothing to check")
### BEGIN SOLUTION
assert ok is not False
### STUDENT
### END SOLUTION
for listing, what in ((prog04, "04's page"), (prog, "section 7's page")):
    if ok and listing:   # with hot_spot written: the hot instruction, its stall reasons, the chain of writers behind it
        exercises.show_hot_spot(listing, hot_spot(listing)["hot"], operands, what)

# %% [markdown]
# *What to notice:* read the printed instructions with their lines and the source text beside
# them. Where did the walk end, and on which line? If it ended at a load: which array does the
# load read, and how wide is it? Does the line's source hold such a load (section 7: a helper
# inlined from another file lands on the line of the kernel's cell (04's, for this page) that has its own
# number, or on the kernel's `def` line where that number is smaller)? If not: what is the hot instruction waiting for, and how often
# does a warp pass its line? Then read the hot instruction's stall reasons (section 6's table says
# what each means) and their split: do they agree with where the walk ended? Do the same for
# section 7's page.
# ### BEGIN SOLUTION
# The page decides, and pages differ from run to run and from GPU to GPU: read the case that the
# lines above print ("the walk ends at: ...") together with the hot instruction's stall reasons and
# their split ("of them: ... waits for an operand, ... ready warps or a busy pipe").
#
# - **A global load** (`LDG`), with `long_scoreboard` on top: if the walk followed the path of the
#   hot instruction's operand, the warps wait for memory, and the load's width and operands (not
#   always its line) name the array. A
#   16-byte load (`LDG.E.128`) in 04's kernel is the word load of the packed codes. A one-byte load
#   (`LDG.E.U8`) whose value becomes an address (`IMAD.WIDE ..., 0x4`: an index times 4 bytes) is an
#   `absmax_q` byte turned into the address of the `code2` float it indexes (`block_scale`): a load
#   whose address needs another load; `block_scale` comes from `nf4lab/lesson`, so on 04's page its
#   loads sit on the line of 04's cell that has their own file's number, a line that loads nothing.
#   That reading holds where the hot instruction is that address
#   computation or a load through it. Where the cell warns instead that the first writer computes an
#   address while the hot instruction uses the register as data, the walk followed a reuse of the
#   register (an address, `IMAD.WIDE`) rather than the word the hot instruction read. In 06's
#   kernel that word is `w`, loaded on the `words[k] = packed_u32[...]` line (section 7 prints how
#   many global loads each line holds), while the address (the `IMAD.WIDE`) and the `absmax_q` byte
#   load behind it are the tail's `block_scale` code (`elif u == nunits`): its lines in `nf4lab/lesson`
#   are numbered below the `def` line's, so they land on the `def` line (section 7's rule), another code
#   path than the hot main-loop instruction. The
#   end of such a walk says nothing about the wait; the hot instruction's own reasons do
#   (where `long_scoreboard` is on top: a global load's result, which it reads as data).
# - **A shared-memory load** (`LDS`), or a hot shared store (`STS`, on a `stage[...]` line): the
#   exchange through shared memory. Where the exchange itself costs, its waits are MIO ones
#   (`short_scoreboard`, `mio_throttle`) or `barrier` at the `cuda.syncthreads()`. A hot `STS` whose
#   samples are `long_scoreboard` waits for its data, a word of the 16-byte global load, even where
#   the walk goes up the store's address arithmetic instead.
# - **No load within the walk's steps** (`steps`): the chain ran through more arithmetic (an address,
#   often) than the walk follows. Where it started from a store, look at its first step: where that
#   writes the store's address register (a `LEA`, say), the walk followed the address, not the data;
#   read the hot instruction's reasons (`long_scoreboard`: a global load's result).
# - **A special register** (`S2R SR_TID.X`, the thread index): there is no memory in the chain.
#   The hot instruction is on the kernel's first lines (`lane = ...threadIdx.x % 32`), and its
#   operand is the thread index. Whether the warps waited for that read, the split of its samples
#   says: where ready warps and a busy pipe (`not_selected`, `math_pipe_throttle`,
#   `dispatch_stall`) hold most of them, the warps were not waiting for the thread index: they
#   were ready, and other warps issued or the pipe was busy. Where waits for an
#   operand hold most of them, the warps did wait at that instruction, for the thread index or, by
#   a false path, for another writer. 04's kernel gives each thread one 16-byte chunk, with no
#   grid-stride loop, so each warp passes those lines once, at its start: the samples there are
#   warps that have just started, and the printed share of the page's samples says how much of
#   the kernel's waiting that is. Where the same warps waited for memory later, the next lines of
#   the page (section 7's method, `hot_lines`) show.
# - **A kernel parameter** (`LDC`) or **no writer** (inputs in uniform registers, `UR...`: registers that hold one value for the whole warp): the
#   kernel's entry code, or values the walk cannot follow; the stall reasons say what kind of wait
#   it was (`barrier`, for instance, is a wait for the block's other warps, not for a load).
#
# Section 7's page is read the same way, with the same caution as below: its walk may have taken
# a false path, so its last line says where one chain of writers ends, not what the warps waited for.
# ### STUDENT
# ### END SOLUTION
#
# How far to trust the chain: the walk goes by register and by address order only, and at each
# step it follows the first writer it finds. It ignores branches and predicates (near a loop's
# head the last writer may sit at the loop's end), and a 64-bit write (`.WIDE`, `.64`) counts for
# both its registers, so the walk can take a false path: it may end at a load, or at a special
# register, other than the one the hot instruction's data came from. What you can conclude is
# where one chain of writers behind the hot instruction ends, not which instruction the warps
# waited for; the hot instruction's stall reasons, read from the same page, say what kind of wait
# it was. To check by hand, open the source page (section 7 and the exercise cell print the full
# path of each page they read), find the hottest instruction, take its source registers, and search
# upward for the instruction that writes each of them; the stall samples on each load say which of
# them the warps really waited for.
