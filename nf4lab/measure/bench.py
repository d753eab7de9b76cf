"""Timing that holds up: GPU time without launch overhead, ceilings and bitsandbytes in the same run.

Method (``METHOD``): each measured function is launched once to compile (JIT excluded),
then ``LAUNCHES`` launches are captured in one CUDA graph (torch.cuda.graph, numba
launching on ``cuda.external_stream`` of the capture stream). The graph is replayed
``REPLAYS`` times between CUDA events; ms = replay time / LAUNCHES; we report the median
replay and the 10th-90th percentile spread. Replay leaves out the host's cost of each launch
(a numba launch from Python costs tens of microseconds of host time; notebook 00 measures it),
so this is GPU time.
Host-side cost is measured separately (``wall_time_ms``): back-to-back calls from
Python, synchronized at the end, as a user calls them.

L2: results carry ``fits_l2`` (bytes moved <= L2 size). Such sizes are partly served
from L2 on repeats, so their speed is not DRAM's (the copy can run above it there, the kernels
mostly below, where launch and tail costs weigh more); plots mark them.
"""
from __future__ import annotations

import functools
import statistics
import time

import numpy as np

from ..format import bytemodel
from . import provenance, results
from .. import runtime

LAUNCHES = 20
REPLAYS = 15
# One noise margin for the whole series, in percent: a change between two kernels timed in one run
# counts only when it is larger than this. Why 1: it lies above every difference the book's records
# show between two runs of one kernel in one device call, minutes apart (the H200 book of 2026-11-29
# 16:23-16:42 UTC: 0.0-0.3% in the run-to-run lines of 04 and 05; 14:16-14:30 UTC: 0.2-0.8% in 02-05's),
# and a change past it but within twice it is printed "near" (noise_band). A wider margin (it was 3) called losses
# that every run repeated "not a measured difference". Each record's spread_ms says how much one run varies.
# It is a margin for two kernels timed in one run, not for records of two calls, which may get two cards
# of one model: on an NVIDIA H200 on 2026-11-29, 03's run of 16:25 UTC timed 01's naive kernel 2.2% faster than
# 01's record of 12:26 UTC (both since replaced; git has them: `git show b45e52d:data/results/NVIDIA_H200/
# 03_packed_u32.json` and `git show 69bac21:data/results/NVIDIA_H200/01_naive.json`).
# Every notebook that calls a change "a gain", "a loss" or "none" uses this name and prints it.
NOISE_PCT = 1
# A pair of kernels just past the margin is not yet a settled result: one such gap came out on both sides of
# it in two processes of one session (06's fp16 kernel at 99.0% and 98.8% of its bound, H200, 2026-11-29).
# Between one and two margins a verdict says "near" and asks for a re-run instead of deciding (noise_band).
NEAR_FACTOR = 2


def noise_band(change_pct: float, margin: float = NOISE_PCT) -> str:
    """Where a signed change in percent stands against the series' noise margin, judged to one decimal as
    printed: "within" (|change| <= margin), "near" (past the margin, up to NEAR_FACTOR margins: one
    pair this close can fall either side of it in another execution) or "beyond"."""
    c = abs(round(float(change_pct), 1))
    return "within" if c <= margin else "near" if c <= NEAR_FACTOR * margin else "beyond"


def bound_band(pct_bound: float, margin: float = NOISE_PCT) -> str:
    """A kernel's percent of the traffic-matched bound, judged by the same rule as :func:`noise_band`:
    "at" (no more than the margin below it, or above it), "near" (below by more than the margin, up to
    NEAR_FACTOR margins: memory-bound for practical purposes, and a gap this small can flip between
    executions) or "below"."""
    gap = round(100 - round(float(pct_bound), 1), 1)
    return "at" if gap <= margin else "near" if gap <= NEAR_FACTOR * margin else "below"


METHOD = (f"GPU time: median of {REPLAYS} CUDA-graph replays of {LAUNCHES} captured launches each "
          "(torch.cuda.graph + numba external_stream), after a warm-up launch; spread = p10-p90")

BNB_GPU = "bitsandbytes dequantize_4bit (out=)"
BNB_E2E = "bitsandbytes dequantize_4bit (end to end)"
WALL_CLOCK = "wall clock"   # a record's timing when it is host time per call, not GPU time
COPY = "device copy (read + write)"
FILL = "write-only fill"
# The same bytes as NF4 dequantization (codes and absmax_q read, the output written, in the
# kernels' access pattern) with no arithmetic: what any dequantization kernel can reach at best.
BOUND = "traffic-matched bound (NF4 bytes, no arithmetic)"
SPEC_PEAK = "spec peak (datasheet)"   # the datasheet's DRAM peak, recorded beside the measured ceilings
# Launch shapes the bound and the fill are timed at; the best is the ceiling (a bound timed at one
# shape would be a property of that shape, not of the memory system).
SHAPES = ((128, 1), (128, 2), (256, 1), (256, 2), (512, 2))


class NoGPUError(RuntimeError):
    pass


def _require_gpu():
    if not runtime.ON_GPU:
        raise NoGPUError("no CUDA GPU here (nf4lab runs in the simulator): timings would be meaningless, "
                         "so none are taken. Recorded GPU results are under data/results/.")


def gpu_time_ms(fn, *, launches: int = LAUNCHES, replays: int = REPLAYS) -> dict:
    """GPU time of ``fn(stream)`` (stream: a numba stream to launch on)."""
    _require_gpu()
    import torch
    from numba import cuda

    s = torch.cuda.Stream()
    ns = cuda.external_stream(s.cuda_stream)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        fn(ns)  # compile and warm up outside the graph
    torch.cuda.synchronize()
    method = "graph"
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(launches):
                fn(ns)
        run = g.replay
    except Exception:  # a baseline that cannot be captured: time plain launches with events
        torch.cuda.synchronize()
        method = "events"

        def run():
            for _ in range(launches):
                fn(ns)
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        run()  # one untimed replay: first replay uploads the graph
        for _ in range(replays):
            start.record(s)
            run()
            end.record(s)
            end.synchronize()
            times.append(start.elapsed_time(end) / launches)
    torch.cuda.synchronize()
    q = np.percentile(times, [10, 90])
    return {"ms": float(statistics.median(times)), "spread_ms": [float(q[0]), float(q[1])], "method": method}


def change_pct(here: dict, base: dict) -> float:
    """The change in percent from record ``base`` to ``here``, computed from their GB/s as the series prints them
    (whole numbers) and rounded to one decimal, as verdicts judge it: a reader gets it from the printed line."""
    return round(100 * (round(here["gbps"]) / round(base["gbps"]) - 1), 1) + 0.0   # + 0.0: no "-0.0"


def read_bound_line(run) -> str:
    """Per shape, the read bound of ``run`` (notebook 09's records of kind "bound": a kernel that only reads the
    weight) as a time and a share of the same run's copy speed: where the share is far below 100%, a time
    predicted at copy speed is out of reach of that read-only kernel. "" without a copy or a bound in the run."""
    copy = next((r for r in run.records if r["name"] == COPY), None)
    bounds = [r for r in run.records if r["kind"] == "bound"]
    if not copy or not bounds:
        return ""
    return (f"the read bound against this run's copy speed ({copy['gbps']:.0f} GB/s): "
            + "; ".join(f"{'x'.join(map(str, r['shape']))} {r['ms'] * 1e3:.1f} us, {r['gbps'] / copy['gbps']:.0%} of it"
                        for r in bounds))


def run_to_run(name: str, here: dict, other: "Run", where: str) -> str:
    """One kernel in two runs: its GB/s in this run's record ``here`` against ``other``'s record of ``name``
    (notebook ``where``'s), and the change between them, computed from the GB/s as printed so that the line's
    own numbers give it. A change across runs is not judged against NOISE_PCT (a margin for one run)."""
    h, t = round(here["gbps"]), round(other.get(name)["gbps"])
    return (f"run to run, {name}: {h} GB/s here, {t} GB/s in {where}'s record ({results.label(other.meta)}): "
            f"{100 * (h / t - 1):+.2f}%")

def wall_time_ms(fn, *, calls: int = 200) -> float:
    """Host time per call of ``fn()``, back to back, synchronized at the end (launch overhead included)."""
    _require_gpu()
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / calls


def _record(kind, name, shape, dtype, timing, nbytes, **extra) -> dict:
    l2 = runtime.device_info().get("l2_bytes") if runtime.ON_GPU else None
    rec = {"kind": kind, "name": name, "shape": list(shape), "dtype": dtype, "ms": timing["ms"],
           "spread_ms": timing.get("spread_ms"), "gbps": bytemodel.gbps(nbytes, timing["ms"]),
           "bytes": int(nbytes), "pct_copy": None, "pct_fill": None, "speedup_vs_bnb": None,
           "bit_exact": None, "fits_l2": bool(l2 and nbytes <= l2), "timing": timing.get("method")}
    rec.update(extra)
    return rec


@functools.lru_cache(maxsize=None)
def _copy_kernel():
    """A 16-byte-per-thread copy kernel: the SM-driven copy our kernels compete with.

    torch's ``copy_`` of same-dtype tensors becomes a memcpy node in a CUDA graph, served
    by the copy engines, which on the H100 reached less than an SM-driven copy.
    """
    from numba import cuda, uint64

    from ..device import ops

    @cuda.jit
    def copy16(src, dst, nvec):
        i = uint64(cuda.grid(1))
        if i < nvec:
            a, b, c, d = ops.load_u32x4(src, i * uint64(4))
            ops.store_u32x4(dst, i * uint64(4), a, b, c, d)

    return copy16


@functools.lru_cache(maxsize=None)
def _store_kernel():
    """16-byte stores of a constant: a write-only ceiling that does not depend on torch's fill_
    (on the H200 torch's uint8 fill_ ran at 80% of the copy: not a write ceiling there)."""
    from numba import cuda, uint32, uint64

    from ..device import ops

    @cuda.jit
    def store16(dst, nvec):
        i = uint64(cuda.grid(1))
        if i < nvec:
            v = uint32(0x3F803F80)
            ops.store_u32x4(dst, i * uint64(4), v, v, v, v)

    return store16


@functools.lru_cache(maxsize=None)
def _bound_kernel(wide: bool, threads: int, units: int):
    """NF4's traffic without its arithmetic, in the access pattern of nf4lab.dequantize's kernel.

    A unit is what one 16-byte store holds (a u32 word of codes for 16-bit output, half a word
    for fp32); lane t of a block takes units base + t, base + t + threads, ... ; all loads first.
    Each unit also reads its block's absmax_q byte, so every input byte the kernel needs is read.
    The stored words are the loaded bits (no conversion): the output is garbage, the bytes are not.
    """
    from numba import cuda, uint32, uint64

    from ..device import ops

    ushift = uint64(2 if wide else 3)

    @cuda.jit
    def bound(packed_u32, absmax_q, out_u32, nunits):
        base = uint64(cuda.blockIdx.x) * uint64(threads * units) + uint64(cuda.threadIdx.x)
        words = cuda.local.array(units, uint32)
        for k in range(units):
            u = base + uint64(k * threads)
            words[k] = uint32(0)
            if u < nunits:
                first = u << ushift
                words[k] = packed_u32[first >> uint64(3)] ^ uint32(absmax_q[first >> uint64(6)])
        for k in range(units):
            u = base + uint64(k * threads)
            if u < nunits:
                w = words[k]
                ops.store_u32x4(out_u32, u << uint64(2), w, w ^ uint32(1), w ^ uint32(2), w ^ uint32(3))

    return bound


def _best(timings: dict) -> tuple[str, dict]:
    return min(timings.items(), key=lambda kv: kv[1]["ms"])


def bound(n: int, dtype: str, shape=None, blocksize: int = 64) -> dict:
    """The traffic-matched bound for ``n`` weights to ``dtype``: best over ``SHAPES``, bytes by the byte model."""
    _require_gpu()
    import torch
    from numba import cuda, uint64

    wide = dtype == "fp32"
    nunits = n >> (2 if wide else 3)
    packed = torch.full((max(4, -(-n // 2)) // 4 * 4 + 16,), 0x5A, dtype=torch.uint8, device="cuda")
    absmax_q = torch.full((-(-n // blocksize) + 16,), 3, dtype=torch.uint8, device="cuda")
    out = torch.empty(nunits * 16 + 16, dtype=torch.uint8, device="cuda")
    p32 = cuda.as_cuda_array(packed.view(torch.int32)).view(np.uint32)
    o32 = cuda.as_cuda_array(out.view(torch.int32)).view(np.uint32)
    aq = cuda.as_cuda_array(absmax_q)
    timings = {}
    for threads, units in SHAPES:
        k = _bound_kernel(wide, threads, units)
        grid = max(1, -(-nunits // (threads * units)))
        timings[f"{threads} threads x {units}"] = gpu_time_ms(
            lambda s, k=k, grid=grid, threads=threads: k[grid, threads, s](p32, aq, o32, uint64(nunits)))
    best, timing = _best(timings)
    nbytes = bytemodel.bytes_moved(n, dtype, blocksize)
    rec = _record("bound", BOUND, shape or [], dtype, timing, nbytes, source=best,
                  alternatives={k: bytemodel.gbps(nbytes, v["ms"]) for k, v in timings.items()})
    del packed, absmax_q, out
    return rec


def ceilings(nbytes: int, shape=None, dtype=None, n: int | None = None) -> list[dict]:
    """Copy (half read, half written) and write-only fill moving ``nbytes``, timed like kernels;
    with ``n`` (weights) also the traffic-matched bound for NF4 -> ``dtype``.

    The copy ceiling is the faster of torch's ``copy_`` and a 16-byte numba copy kernel, the fill
    the faster of torch's ``fill_`` and a 16-byte numba store kernel (field ``source`` says which).
    """
    _require_gpu()
    import torch
    from numba import cuda, uint64

    half = max(16, nbytes // 2 // 16 * 16)
    src = torch.empty(half, dtype=torch.uint8, device="cuda").fill_(7)
    dst = torch.empty_like(src)
    full = torch.empty(max(16, nbytes // 16 * 16), dtype=torch.uint8, device="cuda")
    src32, dst32 = cuda.as_cuda_array(src.view(torch.int32)), cuda.as_cuda_array(dst.view(torch.int32))
    src32, dst32 = src32.view(np.uint32), dst32.view(np.uint32)
    nvec = half // 16
    kern = _copy_kernel()
    copies = {
        "torch copy_": gpu_time_ms(lambda s: dst.copy_(src)),
        "numba 16-byte copy kernel": gpu_time_ms(
            lambda s: kern[(nvec + 255) // 256, 256, s](src32, dst32, uint64(nvec))),
    }
    if not torch.equal(src, dst):
        raise RuntimeError("copy ceiling: the copy kernel did not copy")
    source, copy = _best(copies)
    full32 = cuda.as_cuda_array(full.view(torch.int32)).view(np.uint32)
    nfill = full.numel() // 16
    store = _store_kernel()
    fills = {
        "torch fill_": gpu_time_ms(lambda s: full.fill_(3)),
        "numba 16-byte store kernel": gpu_time_ms(
            lambda s: store[(nfill + 255) // 256, 256, s](full32, uint64(nfill))),
    }
    fill_source, fill = _best(fills)
    recs = [_record("ceiling", COPY, shape or [], dtype, copy, 2 * half, source=source,
                    alternatives={k: bytemodel.gbps(2 * half, v["ms"]) for k, v in copies.items()}),
            _record("ceiling", FILL, shape or [], dtype, fill, full.numel(), source=fill_source,
                    alternatives={k: bytemodel.gbps(full.numel(), v["ms"]) for k, v in fills.items()})]
    if n is not None and dtype in ("bf16", "fp16", "fp32"):
        recs.append(bound(n, dtype, shape))
    peak = runtime.device_info().get("spec_peak_gbps")
    if peak:
        recs.append({"kind": "ceiling", "name": SPEC_PEAK, "shape": list(shape or []),
                     "dtype": dtype, "ms": None, "gbps": peak, "bytes": None, "pct_copy": None,
                     "pct_fill": None, "speedup_vs_bnb": None, "bit_exact": None, "fits_l2": False,
                     "timing": "datasheet"})
    del src, dst, full
    torch.cuda.empty_cache()
    return recs


def bnb_baselines(case) -> list[dict]:
    """bitsandbytes on the same data: GPU time with a preallocated out=, and end to end as users call it."""
    _require_gpu()
    import torch
    import bitsandbytes.functional as F

    packed, qs = case.quant_state("cuda")
    out = torch.empty(case.shape, dtype=qs.dtype, device="cuda")
    F.dequantize_4bit(packed, qs, out=out)
    torch.cuda.synchronize()
    from ..harness.verification import compare

    exact = compare(out, case.expected, case.dtype, n=case.n, blocksize=case.blocksize).ok
    nbytes = bytemodel.bytes_moved(case.n, case.dtype, case.blocksize)
    gpu = gpu_time_ms(lambda s: F.dequantize_4bit(packed, qs, out=out))
    e2e_ms = wall_time_ms(lambda: F.dequantize_4bit(packed, qs))
    return [_record("baseline", BNB_GPU, case.shape, case.dtype, gpu, nbytes, bit_exact=exact),
            _record("baseline", BNB_E2E, case.shape, case.dtype, {"ms": e2e_ms, "method": WALL_CLOCK},
                    nbytes, bit_exact=exact, host_ms=e2e_ms)]


def time_dequantize(case, name: str = "nf4lab.dequantize (out=)") -> dict:
    """nf4lab.dequantize on the case's bitsandbytes tensors, ``out=`` preallocated like bitsandbytes'
    row: verified bit for bit, then timed like the kernels."""
    import torch

    from ..harness.verification import compare
    from ..integrations.dequantize import dequantize

    packed, qs = case.quant_state("cuda")
    out = torch.empty(case.shape, dtype=qs.dtype, device="cuda")
    dequantize(packed, qs, out=out)
    exact = compare(out, case.expected, case.dtype, n=case.n, blocksize=case.blocksize).ok
    t = gpu_time_ms(lambda s: dequantize(packed, qs, out=out))
    from ..integrations import dequantize as drop_in
    from ..kernels import dequant, fastkernel

    return _record("kernel", name, case.shape, case.dtype, t,
                   bytemodel.bytes_moved(case.n, case.dtype, case.blocksize), bit_exact=exact,
                   source_sha256=provenance.module_hash(drop_in, dequant, fastkernel))


def measure_kernel(name, launch, case, *, buffers=None, host=True) -> dict:
    """Verify ``launch`` bit for bit on ``case`` (raises on mismatch), then time it."""
    from ..harness.buffers import make_buffers, run_and_verify

    b = buffers if buffers is not None else make_buffers(case)
    # A launch marked no_verify is a bound (same traffic, no real work), not a kernel.
    verified = not getattr(launch, "no_verify", False)
    if verified:
        run_and_verify(launch, case, name=name, buffers=b)
    if not runtime.ON_GPU:
        return None

    def fn(stream):
        b.stream = stream
        launch(b)

    timing = gpu_time_ms(fn)
    b.stream = 0
    rec = _record("kernel" if verified else "bound", name, case.shape, case.dtype, timing,
                  bytemodel.bytes_moved(case.n, case.dtype, case.blocksize), bit_exact=True if verified else None,
                  source_sha256=provenance.source_hash(launch))
    if host:
        rec["host_ms"] = wall_time_ms(lambda: launch(b))
    if verified:
        # The timed runs wrote over the verified output: check that it is still right.
        run_and_verify(launch, case, name=name, buffers=b)
    return rec


class Run:
    """Records of one run plus its meta; ``finalize`` relates them, ``save`` writes them."""

    def __init__(self, method: str = METHOD, meta: dict | None = None, records=None):
        self.meta = meta if meta is not None else (results.meta(method) if runtime.ON_GPU else {})
        self.records = list(records or [])
        self.recorded = False  # True when loaded from disk rather than measured now
        self.path = None       # the file it was loaded from (results.load), None when measured now

    def add(self, recs):
        if isinstance(recs, dict):
            recs = [recs]
        self.records.extend(r for r in recs if r is not None)
        return self

    def finalize(self) -> "Run":
        for r in self.records:
            for key in ("pct_copy", "pct_fill", "pct_bound", "speedup_vs_bnb", "bit_exact"):
                r.setdefault(key, None)
            same = [q for q in self.records if q["shape"] == r["shape"] and q["dtype"] == r["dtype"]]
            copy = next((q for q in same if q["name"] == COPY), None)
            fill = next((q for q in same if q["name"] == FILL), None)
            tb = next((q for q in same if q["name"] == BOUND), None)
            if r.get("gbps") and tb:
                r["pct_bound"] = 100 * r["gbps"] / tb["gbps"]
            bnb = next((q for q in same if q["name"] == BNB_GPU), None)
            if r.get("gbps") and copy:
                r["pct_copy"] = 100 * r["gbps"] / copy["gbps"]
            if r.get("gbps") and fill:
                r["pct_fill"] = 100 * r["gbps"] / fill["gbps"]
            if r.get("ms") and bnb:
                r["speedup_vs_bnb"] = bnb["ms"] / r["ms"]
        return self

    def save(self, name: str):
        self.finalize()
        return results.save({"meta": self.meta, "records": self.records}, name)

    @classmethod
    def load(cls, name: str, gpu: str | None = None) -> "Run | None":
        data = results.load(name, gpu)
        if data is None:
            return None
        run = cls(meta=data["meta"], records=data["records"])
        run.recorded = True
        run.path = data.get("path")
        return run

    def kernels(self):
        return [r for r in self.records if r["kind"] == "kernel"]

    def get(self, name, shape=None, dtype=None):
        for r in self.records:
            if r["name"] == name and (shape is None or r["shape"] == list(shape)) and \
                    (dtype is None or r["dtype"] == dtype):
                return r
        return None

    def table(self) -> str:
        def f(x, fmt):
            return "-" if x is None else format(x, fmt)

        # The name column is as wide as the longest name: no name is cut.
        width = max([len("version")] + [len(r["name"]) for r in self.records])
        rows = [f"{'version':<{width}} {'shape':>13} {'dtype':>5} {'ms':>8} {'GB/s':>7} {'%copy':>6} "
                f"{'%fill':>6} {'%bound':>6} {'x bnb':>6} {'exact':>5}"]
        for r in self.records:
            shape = "x".join(map(str, r["shape"])) if r["shape"] else ""
            exact = {True: "yes", False: "NO", None: ""}[r.get("bit_exact")]
            rows.append(f"{r['name']:<{width}} {shape:>13} {r['dtype'] or '':>5} {f(r['ms'], '.4f'):>8} "
                        f"{f(r['gbps'], '.0f'):>7} {f(r['pct_copy'], '.0f'):>6} {f(r['pct_fill'], '.0f'):>6} "
                        f"{f(r.get('pct_bound'), '.0f'):>6} "
                        f"{f(r['speedup_vs_bnb'], '.2f'):>6} {exact:>5}")
        for r in self.records:   # host time: its ratios set it against GPU-time records
            if r.get("timing") == WALL_CLOCK:
                rows.append(f"{r['name']}: ms is host time per call, not GPU time; its %copy, %fill, %bound and "
                            "x bnb divide that host time by GPU-time records")
        if self.meta:
            rows.append(f"measured on {results.label(self.meta)}")
        return "\n".join(rows)

    def __repr__(self):
        return self.table()


def run_versions(versions: dict, case, *, baselines=True, progress=True, strict=False) -> Run:
    """Measure several launch functions on one case, with ceilings and bitsandbytes, in one run."""
    _require_gpu()
    from tqdm.auto import tqdm

    from ..harness.buffers import make_buffers

    run = Run()
    nbytes = bytemodel.bytes_moved(case.n, case.dtype, case.blocksize)
    run.add(ceilings(nbytes, case.shape, case.dtype, n=case.n))
    if baselines:
        run.add(bnb_baselines(case))
    b = make_buffers(case)
    for name, launch in tqdm(list(versions.items()), desc=f"{'x'.join(map(str, case.shape))} {case.dtype}",
                             disable=not progress):
        try:
            run.add(measure_kernel(name, launch, case, buffers=b))
        except Exception as exc:
            if strict:
                raise
            # Keep going (CLI, sweeps): record the failure instead of a timing.
            from ..harness.verification import VerificationError

            print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            run.add({"kind": "kernel", "name": name, "shape": list(case.shape), "dtype": case.dtype,
                     "ms": None, "gbps": None, "bit_exact": False if isinstance(exc, VerificationError) else None,
                     "error": f"{type(exc).__name__}: {exc}"[:2000]})
    return run.finalize()


def step(notebook: str, versions: dict, case=None) -> Run | None:
    """The benchmark cell of a step notebook.

    On a GPU: verify each version bit for bit on the full-size case, time it with the
    ceilings and bitsandbytes in the same run, save data/results/<gpu>/<notebook>.json
    and return the run. ``versions`` maps names to ``launch`` functions, or to
    ``(launch, case)`` pairs when versions need different cases (e.g. output dtypes).

    In the simulator: no timing (it would be meaningless); return the run recorded on
    a GPU for this notebook, if any, and say where it comes from.
    """
    if not runtime.ON_GPU:
        run = Run.load(notebook)
        if run is None:
            print(f"No GPU here, and no recorded GPU results for {notebook} under data/results/.")
            return None
        print(f"No GPU here: showing the results recorded in {run.path}\n  ({results.label(run.meta)})")
        return run
    from ..harness.cases import make_case

    default = case if case is not None else make_case()
    groups: dict = {}
    for name, v in versions.items():
        launch, c = v if isinstance(v, tuple) else (v, default)
        groups.setdefault(id(c), (c, {}))[1][name] = launch
    run = Run()
    for c, vs in groups.values():
        part = run_versions(vs, c, strict=True)
        run.add(part.records)
    run.finalize()
    path = run.save(notebook)
    print(run.table())
    print(f"saved {path.relative_to(results.ROOT)}")
    return run
