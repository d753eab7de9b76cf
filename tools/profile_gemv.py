"""Nsight Compute on the fused GEMV variants of notebook 09 (GPU machine with ncu).

    python tools/profile_gemv.py --shapes 8192x28672 4096x14336 --variants auto "R4 S1 C32 W8 B2"

For each (shape, variant) a driver process (this file, ``drive``) quantizes a bf16 W with bitsandbytes on the
GPU, warms the variant up, and launches it once between cudaProfilerStart/Stop; ncu profiles that launch with
the sections below at the benchmark's clocks (``--clock-control none``). Prints ncu's details page (speed of
light, memory and compute workload, issue slots, warp stalls, occupancy) and, when $OUT is set, writes it to
$OUT/ncu_gemv.txt. Nothing here is recorded in data/: it answers "what limits this kernel?" while tuning.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "SchedulerStats",
            "WarpStateStats", "Occupancy", "LaunchStats", "InstructionStats")
METRICS = ("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_pipe_lsu_wavefronts.sum",
           "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
           "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
           "smsp__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_elapsed",
           "sm__cycles_elapsed.avg.per_second", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "gpu__time_duration.sum")


def drive(shape: str, variant: str, dtype: str = "bf16") -> None:
    import torch
    from numba import cuda

    import bench_gemv
    from nf4lab import gemv

    N, K = (int(v) for v in shape.split("x"))
    mod = bench_gemv.load_kernel()
    launch = bench_gemv.variant_launches(mod, [variant])[variant]
    packed, qs, x = gemv._quantize_gpu(N, K, dtype)
    y = torch.empty(1, N, device="cuda", dtype=x.dtype)
    g = gemv.buffers_from_torch(packed, qs, x, y)
    for _ in range(3):
        launch(g)
    cuda.synchronize()
    cuda.profile_start()
    launch(g)
    cuda.synchronize()
    cuda.profile_stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8192x28672", "4096x14336"])
    ap.add_argument("--variants", nargs="+", default=["auto"])
    ap.add_argument("--budget-s", type=float, default=240)
    a = ap.parse_args(argv)
    from nf4lab.profiling import find_ncu

    ncu = find_ncu()
    if not ncu:
        print("ncu not found")
        return 2
    out = []
    t0 = time.time()
    for shape in a.shapes:
        for v in a.variants:
            if time.time() - t0 > a.budget_s:
                out.append(f"skipped {shape} {v}: budget")
                continue
            cmd = [ncu, "--target-processes", "all", "--clock-control", "none", "--profile-from-start", "off"]
            for s in SECTIONS:
                cmd += ["--section", s]
            cmd += ["--metrics", ",".join(METRICS), "--print-units", "base",
                    sys.executable, __file__, "drive", shape, v]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            text = f"===== {shape} [{v}] ({time.time() - t0:.0f} s)\n" + r.stdout[-20000:] + (r.stderr[-3000:] if r.returncode else "")
            print(text, flush=True)
            out.append(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "ncu_gemv.txt").write_text("\n".join(out))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        import nf4lab  # noqa: F401  (first: decides GPU or simulator)

        drive(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
