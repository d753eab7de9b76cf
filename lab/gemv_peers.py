"""nf4lab's fused decode GEMV against its peers, on whatever GPU this runs on, all in one process (one run id), so
that every ratio it prints compares timings taken the same way, on the same card, minutes apart.

Timed, each as CUDA-graph GPU time (``nf4lab.measure.bench.gpu_time_ms``) over weight copies totalling more than 4x L2
(every launch reads its weight from DRAM, as in decoding):

- the shipped kernel, ``nf4lab.kernels.gemv.launch``, its output checked against float64 first
  (``gemv_bench.tolerance``);
- the read bound: a kernel that only reads the GEMV's weight bytes (lab/gemv_read_bound.py's ``make_reader``, best of
  several configurations): no GEMV at that shape can beat it;
- bitsandbytes' ``matmul_4bit`` on the same NF4 weights (without grad: its ``gemm_4bit`` op), checked like ours;
- torch's int4 tinygemm (``aten._weight_int4pack_mm``, group 128, bf16 only) on random int4 weights;
- cuBLAS on a dense weight of the same shape and dtype (``x @ w.t()``): what 4-bit weights must beat.

At M = 1 (one row of x: decode) for the four LLM shapes in bf16 and fp16; at M = 2..8 in bf16 at the three large
shapes, nf4lab and bitsandbytes only. Prints the GPU, the versions, a line per measurement, then the tables; writes
data/results/<gpu>/09_gemv_peers.json (and a copy under $OUT named by the run id). Needs torch with CUDA and bitsandbytes.

    python -m lab.gemv_peers
    python -m lab.gemv_peers --shapes 4096x14336 --dtypes bf16 --no-batch   # a shorter run
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import nf4lab  # first: decides GPU or simulator
from nf4lab.kernels import gemv

ROOT = Path(__file__).resolve().parent.parent
NAME = "09_gemv_peers"
OURS = "TC"                          # the shipped kernel's variant name in every GEMV record (lab/bench_gemv.py)
READ = "read-only stream of the weight bytes (best config)"   # lab/gemv_read_bound.py's record name
READ_CONFIGS = [(u, b) for u in (1, 2, 4) for b in (4, 8, 16)]   # unroll x blocks per SM: every winner so far
TINY = "torch _weight_int4pack_mm (tinygemm int4, group 128)"
CUBLAS = "cuBLAS dense x @ w.t() (torch)"
BATCH_SHAPES = ((4096, 14336), (14336, 4096), (8192, 28672))
BATCH_MS = tuple(range(2, gemv.MAX_M + 1))
SOURCES = ("lab/gemv_peers.py", "lab/gemv_read_bound.py", "nf4lab/kernels/gemv.py", "nf4lab/device/warp_ops.py",
           "nf4lab/device/ops.py", "nf4lab/measure/gemv_bench.py", "nf4lab/measure/bench.py")


def parse_shape(s: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is NxK (W's out x in features), got {s!r}") from None
    return n, k


def plan(shapes, dtypes, batch: bool):
    """[(N, K, dtype, Ms)]: M = 1 everywhere, M = 2..8 for bf16 at the large shapes (unless ``batch`` is off)."""
    return [(N, K, dt, (1, *(BATCH_MS if batch and dt == "bf16" and (N, K) in BATCH_SHAPES else ())))
            for (N, K), dt in itertools.product(shapes, dtypes)]


def copies_for(nbytes: int, l2: int) -> int:
    """Weight copies a timing cycles through: more than 4x L2 in all, so no launch finds its weight in L2."""
    return max(2, math.ceil(4 * l2 / nbytes))


def file_hash(rel: str) -> str | None:
    p = ROOT / rel
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.exists() else None


def nvidia_smi() -> str:
    q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=False)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({type(e).__name__})"


def cycled(call, copies) -> dict:
    """GPU time of ``call(i, stream)``, each launch on the next of ``copies`` weight copies i (bench.gpu_time_ms)."""
    from nf4lab.measure import bench

    turn = itertools.cycle(range(copies))
    return bench.gpu_time_ms(lambda s: call(next(turn), s), launches=max(bench.LAUNCHES, copies))


def read_bound(N, K, sms, l2, readers, progress):
    """Best of READ_CONFIGS of lab/gemv_read_bound.py's reader over the GEMV's weight bytes at (N, K)."""
    import torch
    from numba import cuda

    import lab.gemv_read_bound as rb
    from nf4lab.measure import bench, gemv_bench, provenance

    nb = gemv_bench.weight_bytes(N, K)
    nvec, copies = -(-nb // 16), copies_for(nb, l2)
    bufs = [cuda.as_cuda_array(torch.randint(0, 2**31 - 1, (nvec * 4,), dtype=torch.int32, device="cuda"))
            .view("uint32") for _ in range(copies)]
    out, best = cuda.device_array(1, dtype="uint32"), None
    for u, bps in READ_CONFIGS:
        t = cycled(lambda i, s, r=readers[u], grid=sms * bps: r[grid, rb.THREADS, s](bufs[i], nvec, out), copies)
        if best is None or t["ms"] < best[0]["ms"]:
            best = (t, f"unroll {u}, {bps} blocks of {rb.THREADS} per SM")
    progress(f"{N}x{K} read bound: {best[0]['ms'] * 1e3:.2f} us [{best[1]}]")
    bufs.clear()
    torch.cuda.empty_cache()
    return bench._record("bound", READ, (N, K), "bf16", best[0], nb, config=best[1], copies=copies, fits_l2=False,
                         M=1, source_sha256=provenance.module_hash(rb))


def bnb_path(dtype_t, M, N, K) -> str | None:
    """Which kernel bitsandbytes' gemm_4bit picks at this M: its own up to M = 4, then a per-GPU heuristic may pick
    dequantize + F.linear instead (a private function of bitsandbytes: None where it has moved)."""
    try:
        import torch
        from bitsandbytes.backends.cuda import ops as bops

        use = bops._gemm_4bit_use_custom_fn(torch.cuda.current_device(), dtype_t, M, N, K)
    except Exception:  # noqa: BLE001  (only a label)
        return None
    return "its fused kernel" if use else "dequantize + F.linear"


def tinygemm(N, K, l2, progress, failures):
    """torch's int4 tinygemm at group 128 on bf16 (its only dtype on CUDA), M = 1: (timing, bytes, copies) or None."""
    import torch

    try:
        nb = N * K // 2 + (K // 128) * N * 2 * 2   # int4 codes + a bf16 scale and zero per group of 128
        copies = copies_for(nb, l2)
        ws = []
        for _ in range(copies):
            q = torch.randint(0, 16, (N, K), dtype=torch.int32, device="cuda")
            packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
            del q
            wp = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
            sz = torch.randn(K // 128, N, 2, device="cuda").to(torch.bfloat16) * 0.01
            ws.append((wp, sz))
        x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm(x, ws[0][0], 128, ws[0][1])
        return cycled(lambda i, s: torch.ops.aten._weight_int4pack_mm(x, ws[i][0], 128, ws[i][1]), copies), nb, copies
    except Exception as e:  # noqa: BLE001  (some torch builds lack it: recorded, not fatal)
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        failures.append({"name": TINY, "shape": [N, K], "dtype": "bf16", "M": 1, "error": msg})
        progress(f"{N}x{K} bf16 M=1 tinygemm FAILED: {msg}")
        return None


def cublas(N, K, dtype, l2, total, progress, failures):
    """cuBLAS on a dense (N, K) weight, M = 1; the copies kept under half the GPU's memory: (timing, bytes, copies)."""
    import torch

    from nf4lab.format import reference

    t_ = reference.torch_dtype(dtype)
    nb = 2 * N * K
    room = total // 2 - torch.cuda.memory_allocated()
    copies = copies_for(nb, l2)
    while copies > 1 and copies * nb > room:
        copies -= 1
    if copies * nb > room:
        failures.append({"name": CUBLAS, "shape": [N, K], "dtype": dtype, "M": 1,
                         "error": f"skipped: a {nb / 2**30:.1f} GiB weight is more than half the GPU's memory"})
        progress(f"{N}x{K} {dtype} M=1 cuBLAS skipped: the dense weight does not fit half the GPU's memory")
        return None
    try:
        g = torch.Generator(device="cuda").manual_seed(7)
        ws = [(torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32) * 0.02).to(t_) for _ in range(copies)]
        x = torch.randn(1, K, generator=g, device="cuda", dtype=torch.float32).to(t_)
        return cycled(lambda i, s: x @ ws[i].t(), copies), nb, copies
    except Exception as e:  # noqa: BLE001  (a peer's failure is recorded; ours is not caught)
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        failures.append({"name": CUBLAS, "shape": [N, K], "dtype": dtype, "M": 1, "error": msg})
        progress(f"{N}x{K} {dtype} M=1 cuBLAS FAILED: {msg}")
        return None


def measure(N, K, dtype, Ms, l2, total, run, progress):
    """nf4lab and bitsandbytes on the same NF4 weight copies, at each M in ``Ms`` (each output checked against float64
    first); at M = 1 also tinygemm (bf16) and cuBLAS."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    from nf4lab.device import ops, warp_ops
    from nf4lab.format import reference
    from nf4lab.measure import bench, gemv_bench, provenance

    t_ = reference.torch_dtype(dtype)
    nb = gemv_bench.weight_bytes(N, K)
    copies = copies_for(nb, l2)
    data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]   # one W per seed, whatever M
    q0 = data[0][1]  # copy 0 checked against float64 (bitsandbytes' float32 weights), ours and bitsandbytes'
    q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
    w64 = F.dequantize_4bit(data[0][0], q32).double()
    ours, src = gemv_bench.kernel_name(OURS), provenance.module_hash(gemv, warp_ops, ops)
    for M in Ms:
        g = torch.Generator(device="cuda").manual_seed(1000 + M)
        x = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t_)
        y = torch.empty(M, N, dtype=t_, device="cuda")
        bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                        q.blocksize, y) for p, q, _ in data]
        y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
        gemv.launch(bufs[0])  # the first launch compiles
        y.fill_(float("nan"))
        gemv.launch(bufs[0])
        torch.cuda.synchronize()
        chk = dict(gemv_bench._gpu_check(y, y64, tol, ours), shape=[N, K], dtype=dtype, M=M)
        yb = bnb.matmul_4bit(x, data[0][0].t(), quant_state=data[0][1])
        torch.cuda.synchronize()
        chk_b = dict(gemv_bench._gpu_check(yb, y64, tol, gemv_bench.bnb_name(M)), shape=[N, K], dtype=dtype, M=M,
                     max_abs_diff_vs_ours=float((y.float() - yb.float().reshape(y.shape)).abs().max()))
        run.meta["checks"] += [chk, chk_b]
        del y64, tol, yb
        path = bnb_path(t_, M, N, K)
        for kind, name, call, c, extra in (   # call(i, stream): one launch on copy i of the weight
                ("kernel", ours, lambda i, s, b=bufs: gemv.launch(dataclasses.replace(b[i], stream=s)), chk,
                 {"source_sha256": src}),
                ("baseline", gemv_bench.bnb_name(M),
                 lambda i, s, x=x: bnb.matmul_4bit(x, data[i][0].t(), quant_state=data[i][1]), chk_b,
                 {"bnb_path": path})):
            t = cycled(call, copies)
            run.add(bench._record(kind, name, (N, K), dtype, t, nb, within_tol=c["ok"], copies=copies, fits_l2=False,
                                  M=M, **extra))
            who = "nf4lab" if kind == "kernel" else f"bitsandbytes ({path})" if path else "bitsandbytes"
            how = "" if t["method"] == "graph" else f" [timed {t['method']}]"
            progress(f"{N}x{K} {dtype} M={M} {who}: {t['ms'] * 1e3:.2f} us{how}, within tolerance {c['ok']} "
                     f"(worst {c['worst_ratio']:.2g})")
    data.clear()   # the weight copies
    del w64, q32
    torch.cuda.empty_cache()
    if 1 not in Ms:
        return
    failures = run.meta["failures"]
    if dtype == "bf16":
        tg = tinygemm(N, K, l2, progress, failures)
        torch.cuda.empty_cache()  # its weights, freed on return
        if tg:
            run.add(bench._record("baseline", TINY, (N, K), "bf16", tg[0], tg[1], copies=tg[2], fits_l2=False, M=1))
            progress(f"{N}x{K} bf16 M=1 tinygemm: {tg[0]['ms'] * 1e3:.2f} us")
    cb = cublas(N, K, dtype, l2, total, progress, failures)
    torch.cuda.empty_cache()
    if cb:
        run.add(bench._record("baseline", CUBLAS, (N, K), dtype, cb[0], cb[1], copies=cb[2],
                              fits_l2=bool(cb[1] * cb[2] <= l2), M=1))
        progress(f"{N}x{K} {dtype} M=1 cuBLAS: {cb[0]['ms'] * 1e3:.2f} us ({cb[2]} copies)")


def relate(run):
    """Each nf4lab record against its peers of the same shape, dtype and M, as fields of the record."""
    from nf4lab.measure import gemv_bench

    ours = gemv_bench.kernel_name(OURS)
    for r in run.records:
        if r["name"] == ours and r.get("ms"):
            b, tg = (gemv_bench.find_record(run, name, r["shape"], r["dtype"], r.get("M", 1))
                     for name in (gemv_bench.bnb_name(r.get("M", 1)), TINY))
            rb = next((x for x in run.records if x["kind"] == "bound" and x["shape"] == r["shape"]), None)
            r["speedup_vs_bnb"] = b["ms"] / r["ms"] if b and b.get("ms") else None
            r["speedup_vs_tinygemm"] = tg["ms"] / r["ms"] if tg and tg.get("ms") else None
            r["pct_read_bound"] = 100 * rb["ms"] / r["ms"] if rb else None   # any M reads the weight once
    return run


def _us(ms):
    return f"{ms * 1e3:.2f}" if ms else "-"


def _x(num, den):
    return f"{num / den:.2f}" if num and den else "-"


def tables(records) -> str:
    """The M = 1 table (against the read bound, tinygemm, bitsandbytes and cuBLAS) and the M = 2..8 table (against
    bitsandbytes), from the records of one run. "x peer": the peer's time / nf4lab's (above 1: nf4lab is faster)."""
    from nf4lab.measure import bench, gemv_bench

    run, ours = bench.Run(meta={}, records=records), gemv_bench.kernel_name(OURS)
    mine = [r for r in records if r["name"] == ours]
    bound = {tuple(r["shape"]): r for r in records if r["kind"] == "bound"}

    def get(name, r):
        return gemv_bench.find_record(run, name, r["shape"], r["dtype"], r.get("M", 1))

    def ms(rec):
        return rec.get("ms") if rec else None

    lines = [(f"{'W (N x K)':>11} {'dtype':>5} {'nf4lab us':>9} {'read bound us':>13} {'% of bound':>10} "
              f"{'tinygemm us':>11} {'x tinygemm':>10} {'bnb us':>7} {'x bnb':>6} {'cuBLAS us':>9}")]
    for r in (r for r in mine if r.get("M", 1) == 1):
        b, tg = bound.get(tuple(r["shape"])), get(TINY, r)
        bb, cb = get(gemv_bench.bnb_name(1), r), get(CUBLAS, r)
        pct = f"{100 * b['ms'] / r['ms']:.0f}%" if b and r["ms"] else "-"
        lines.append(f"{'x'.join(map(str, r['shape'])):>11} {r['dtype']:>5} {_us(r['ms']):>9} {_us(ms(b)):>13} "
                     f"{pct:>10} {_us(ms(tg)):>11} {_x(ms(tg), r['ms']):>10} {_us(ms(bb)):>7} "
                     f"{_x(ms(bb), r['ms']):>6} {_us(ms(cb)):>9}")
    batch = [r for r in mine if r.get("M", 1) > 1]
    if batch:
        lines += ["", (f"{'W (N x K)':>11} {'dtype':>5} {'M':>2} {'nf4lab us':>9} {'bnb us':>7} {'x bnb':>6}  "
                       "bitsandbytes ran")]
        for r in sorted(batch, key=lambda r: (r["shape"], r["dtype"], r["M"])):
            bb = get(gemv_bench.bnb_name(r["M"]), r)
            lines.append(f"{'x'.join(map(str, r['shape'])):>11} {r['dtype']:>5} {r['M']:>2} {_us(r['ms']):>9} "
                         f"{_us(ms(bb)):>7} {_x(ms(bb), r['ms']):>6}  {(bb or {}).get('bnb_path') or '-'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.gemv_peers",
                                 description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--shapes", nargs="+", type=parse_shape, metavar="NxK",
                    help="W shapes (default: the four LLM shapes; M = 2..8 only at the three large ones)")
    ap.add_argument("--dtypes", nargs="+", choices=gemv.DTYPES, default=list(gemv.DTYPES),
                    help="activation dtypes at M = 1 (default: bf16 fp16; M = 2..8 is bf16 only)")
    ap.add_argument("--no-batch", action="store_true", help="M = 1 only")
    args = ap.parse_args(argv)
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure")
        return 2
    try:
        import bitsandbytes  # noqa: F401
        import torch
    except ImportError as e:
        print(f"needs torch with CUDA and bitsandbytes: {e}")
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU for torch (a CPU-only build?): nothing to measure")
        return 2
    from lab.gemv_read_bound import make_reader
    from nf4lab import runtime
    from nf4lab.measure import bench, gemv_bench

    # The GEMV's one-thread probe of the shared-memory base (warp_ops.probe_base) is meant to be tiny: not a warning.
    warnings.filterwarnings("ignore", message=r".*under-utilization")
    t0 = time.time()

    def progress(s):
        print(f"[{time.time() - t0:5.0f} s] {s}", flush=True)

    info = runtime.device_info()
    sms, l2, total = info.get("sms") or 132, info.get("l2_bytes") or (50 << 20), info.get("memory_bytes") or (16 << 30)
    smi = nvidia_smi()
    print(nf4lab.describe(), "\nnvidia-smi (name, driver, SM and memory clocks now, their maxima):", smi, flush=True)
    shapes = args.shapes or list(gemv.LLM_SHAPES)
    todo = plan(shapes, args.dtypes, not args.no_batch)
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2 (cuBLAS: fewer where they "
                    "would exceed half the GPU's memory); read bound: best of "
                    f"{READ_CONFIGS} (unroll, blocks per SM) "
                    "of lab/gemv_read_bound.py's reader; all in one process")
    run.meta.update(nvidia_smi=smi, checks=[], failures=[], default_kernel=gemv_bench.kernel_name(OURS),
                    shapes=[list(s) for s in shapes], dtypes=list(args.dtypes),
                    batch=[[N, K, dt, list(Ms[1:])] for N, K, dt, Ms in todo if len(Ms) > 1],
                    sources={p: file_hash(p) for p in SOURCES})
    readers = {u: make_reader(u) for u in sorted({u for u, _ in READ_CONFIGS})}
    for N, K in shapes:
        run.add(read_bound(N, K, sms, l2, readers, progress))
    for N, K, dt, Ms in todo:
        measure(N, K, dt, Ms, l2, total, run, progress)
    run.meta["seconds"] = round(time.time() - t0, 1)
    relate(run.finalize())
    from nf4lab.measure import results

    print(f"\n{results.label(run.meta)}; code path {run.meta.get('code_path')}; "
          f"{run.meta['seconds']:.0f} s\nM = 1 (decode); x peer = the peer's time / nf4lab's\n")
    print(tables(run.records))
    for f in run.meta["failures"]:
        print(f"not measured: {f['name']} {f['shape'][0]}x{f['shape'][1]} {f['dtype']} M={f['M']}: {f['error']}")
    path = run.save(NAME)
    print("saved", path)
    if os.environ.get("OUT"):   # one copy per run: a second run in the same device call must not replace the first's
        shutil.copy(path, Path(os.environ["OUT"]) / f"{path.stem}_{run.meta.get('run')}{path.suffix}")
    bad = [c for c in run.meta["checks"] if not c["ok"]]
    for c in bad:
        print(f"OUTSIDE TOLERANCE: {c['name']} {c['shape'][0]}x{c['shape'][1]} {c['dtype']} M={c['M']} "
              f"(worst {c['worst_ratio']:.3g} x the tolerance)")
    print(f"checks outside tolerance: {len(bad)} of {len(run.meta['checks'])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
