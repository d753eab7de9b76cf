"""The tensor-core GEMV against the read bound and bitsandbytes, per recorded GPU (no GPU needed).

Reads data/results/<gpu>/09_gemv_tc.json and 09_gemv_tc_batch.json (lab/bench_gemv.py, "auto" = the shipped
default, "R2 S1 C32 W8 B4" = the FFMA design) and 09_read_bound.json (lab/gemv_read_bound.py, same session)
and prints, per GPU: M = 1 time, % of the read bound and x bitsandbytes for both dtypes; then the batch.

    python lab/gemv_tc_report.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS, FFMA = "fused NF4 gemv (numba) [auto]", "fused NF4 gemv (numba) [R2 S1 C32 W8 B4]"


def _ms(recs, name_start, shape, dtype, M=1):
    for r in recs:
        if r["name"].startswith(name_start) and r["shape"] == list(shape) and r["dtype"] == dtype and (r.get("M") or 1) == M:
            return r["ms"]
    return None


def report(gpu_dir: Path) -> str:
    run = json.loads((gpu_dir / "09_gemv_tc.json").read_text())
    bound = json.loads((gpu_dir / "09_read_bound.json").read_text())
    meta = run["meta"]
    out = [f"{meta['gpu']}, {meta['date']} (read bound {bound['meta']['date']})",
           f"{'W (N x K)':>11} {'dtype':>5} {'read us':>8} {'TC us':>7} {'% bound':>8} {'FFMA us':>8} {'bnb us':>7} {'x bnb':>6}"]
    for b in (r for r in bound["records"] if r["kind"] == "bound"):
        for dt in ("bf16", "fp16"):
            ours, ffma = _ms(run["records"], OURS, b["shape"], dt), _ms(run["records"], FFMA, b["shape"], dt)
            bnb = _ms(run["records"], "bitsandbytes matmul_4bit gemv", b["shape"], dt)
            if ours is None:
                continue
            out.append(f"{'x'.join(map(str, b['shape'])):>11} {dt:>5} {b['ms'] * 1e3:8.1f} {ours * 1e3:7.1f} "
                       f"{100 * b['ms'] / ours:7.0f}% {(ffma or float('nan')) * 1e3:8.1f} {bnb * 1e3:7.1f} {bnb / ours:6.2f}")
    batch = gpu_dir / "09_gemv_tc_batch.json"
    if batch.exists():
        recs = json.loads(batch.read_text())["records"]
        out.append(f"{'W (N x K)':>11} {'dtype':>5} {'M':>2} {'TC us':>7} {'bnb gemm_4bit us':>17} {'x bnb':>6}")
        for r in recs:
            if r["name"] != OURS:
                continue
            bnb = _ms(recs, "bitsandbytes matmul_4bit gemm_4bit", r["shape"], r["dtype"], r["M"])
            out.append(f"{'x'.join(map(str, r['shape'])):>11} {r['dtype']:>5} {r['M']:>2} {r['ms'] * 1e3:7.1f} "
                       f"{bnb * 1e3:17.1f} {bnb / r['ms']:6.2f}")
    return "\n".join(out)


def main() -> int:
    found = sorted(p.parent for p in (ROOT / "data" / "results").glob("*/09_gemv_tc.json"))
    for d in found:
        print(report(d), end="\n\n")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
