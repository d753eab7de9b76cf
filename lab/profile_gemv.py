"""Nsight Compute on the fused GEMV variants of notebook 09 (GPU machine with ncu): what limits them.

    python -m lab.profile_gemv --shapes 8192x28672 4096x14336 --variants auto "R8 S2 C32 W8 B2 H16"
    python -m lab.profile_gemv --save        # the default set, recorded for notebook 09

For each (shape, variant) a driver process (this file, ``drive``) quantizes a bf16 W with bitsandbytes on the
GPU, warms the variant up and launches it once between cudaProfilerStart/Stop; ncu profiles that launch at
the benchmark's clocks (``--clock-control none``). Printed per profile: time, DRAM and L1/shared data-pipe
throughput (% of peak), the pipe's wavefronts (all, and those of shared-memory instructions: table reads,
shuffles) per 1000 weights, issue slots busy, achieved warps per SM, registers and spill requests.

``--save`` writes data/ncu/<gpu>/09_fused_gemv.json (notebook 09 shows it), a copy under $OUT, and ncu's
details pages as $OUT/ncu_gemv.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SchedulerStats",
            "WarpStateStats", "Occupancy", "LaunchStats")
DEFAULT_SHAPES = ("8192x28672", "4096x14336")
DEFAULT_VARIANTS = ("auto", "R4 S2 C32 W8 B3", "R8 S2 C32 W8 B2 X4", "R8 S2 C32 W8 B2 Q16", "R8 S2 C32 W8 B2 H16")


def drive(shape: str, variant: str, dtype: str = "bf16") -> None:
    import torch
    from numba import cuda

    from lab import bench_gemv, gemv_reports  # noqa: F401
    from nf4lab.kernels import gemv
    from nf4lab.measure import gemv_bench

    N, K = (int(v) for v in shape.split("x"))
    mod = bench_gemv.load_kernel()
    launch = bench_gemv.variant_launches(mod, [variant])[variant]
    packed, qs, x = gemv_bench._quantize_gpu(N, K, dtype)
    y = torch.empty(1, N, device="cuda", dtype=x.dtype)
    g = gemv.buffers_from_torch(x, packed, qs.shape, qs.absmax, qs.state2.absmax, qs.state2.code, qs.offset.item(),
                                qs.blocksize, y)
    for _ in range(3):
        launch(g)
    cuda.synchronize()
    cuda.profile_start()
    launch(g)
    cuda.synchronize()
    cuda.profile_stop()


def stall_summary(csv_text: str, top: int = 30) -> str:
    """The instructions with the most warp-stall samples in ncu's source page (CSV, SASS), with their non-zero
    stall columns, and the samples summed per opcode."""
    import collections
    import csv
    import io

    from lab.gemv_reports import opcode

    lines = csv_text.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith('"Address"')), 0)  # after a kernel-name row
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))
    if not rows:
        return "no source page in the report:\n" + csv_text[:1000]
    cols = list(rows[0])
    total = next((c for c in cols if c and c.startswith("Warp Stall Sampling (All")), None)
    src = next((c for c in cols if c.strip().lower() == "source"), cols[min(1, len(cols) - 1)])
    if total is None:
        return "columns: " + ", ".join(cols)
    num = lambda r, c: float((r.get(c) or "0").replace(",", "") or 0)  # noqa: E731
    reasons = [c for c in cols if c and "stall" in c.lower() and c != total]
    rows.sort(key=lambda r: -num(r, total))
    allsum = sum(num(r, total) for r in rows) or 1
    by_op = collections.Counter()
    for r in rows:
        by_op[opcode((r.get(src) or "").strip() or "?").split(".")[0]] += num(r, total)
    out = [f"{allsum:.0f} stall samples; by opcode: " + ", ".join(f"{k} {v / allsum:.0%}" for k, v in by_op.most_common(12))]
    for r in rows[:top]:
        parts = sorted(((num(r, c), c) for c in reasons if num(r, c) > 0), reverse=True)[:4]
        out.append(f"{num(r, total) / allsum:6.1%}  {(r.get(src) or '')[:60]:60}  "
                   + "; ".join(f"{c} {v:.0f}" for v, c in parts))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--source", action="store_true",
                    help="also sample warp stalls per SASS instruction (SourceCounters): the CSV of ncu's source "
                         "page under $OUT, and the most-stalled instructions printed")
    a = ap.parse_args(argv)
    import nf4lab
    from nf4lab.measure import results
    from nf4lab.kernels.gemv import NAME
    from lab.gemv_reports import NCU_METRICS, ncu_summary, ncu_table
    from nf4lab.measure.profiling import find_ncu, parse_csv

    ncu = find_ncu()
    if not ncu or not nf4lab.ON_GPU:
        print("needs a GPU and ncu")
        return 2
    run = {"meta": {**results.meta("Nsight Compute, one launch per variant after 3 warm-up launches, "
                                   "--clock-control none, bf16, M=1; W quantized by bitsandbytes on the GPU"),
                    "ncu": subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1],
                    "metrics": NCU_METRICS},
           "rows": []}
    details = []
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="ncu_gemv_"))
    for shape in a.shapes:
        N, K = (int(v) for v in shape.split("x"))
        for v in a.variants:
            if time.time() - t0 > a.budget_s:
                print(f"skipped {shape} [{v}]: out of budget")
                continue
            rep = tmp / f"r{len(run['rows'])}.ncu-rep"
            cmd = [ncu, "--target-processes", "all", "--clock-control", "none", "--profile-from-start", "off",
                   "--export", str(rep), "--force-overwrite"]
            for s in SECTIONS + (("SourceCounters",) if a.source else ()):
                cmd += ["--section", s]
            cmd += ["--metrics", ",".join(NCU_METRICS.values()), sys.executable, "-m", "lab.profile_gemv", "drive", shape, v]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
            if r.returncode or not rep.exists():
                print(f"{shape} [{v}]: ncu failed\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
                continue
            raw = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base"],
                                 capture_output=True, text=True).stdout
            kernels = parse_csv(raw)
            if not kernels:
                print(f"{shape} [{v}]: no kernel in the report")
                continue
            run["rows"].append({"shape": shape, "variant": v, "metrics": ncu_summary(kernels[-1], N, K)})
            det = subprocess.run([ncu, "--import", str(rep), "--page", "details"], capture_output=True, text=True).stdout
            details.append(f"===== {shape} [{v}]\n{det}")
            if a.source:
                src = subprocess.run([ncu, "--import", str(rep), "--page", "source", "--csv", "--print-source", "sass"],
                                     capture_output=True, text=True).stdout
                tag = f"{shape}_{v}".replace(" ", "_")
                if os.environ.get("OUT"):
                    Path(os.environ["OUT"], f"ncu_source_{tag}.csv").write_text(src)
                print(stall_summary(src))
            print(f"[{time.time() - t0:4.0f} s] {shape} [{v}] profiled", flush=True)
    print(ncu_table(run))
    print("measured on", results.label(run["meta"]))
    out = os.environ.get("OUT")
    if out:
        Path(out, "ncu_gemv.txt").write_text("\n".join(details))
    if a.save and run["rows"]:
        path = ROOT / "data" / "ncu" / results.gpu_slug(run["meta"]["gpu"]) / f"{NAME}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run, indent=1) + "\n")
        print("saved", path.relative_to(ROOT))
        if out:
            Path(out, "ncu_09_fused_gemv.json").write_text(path.read_text())
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        import nf4lab  # noqa: F401  (first: decides GPU or simulator)

        drive(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
