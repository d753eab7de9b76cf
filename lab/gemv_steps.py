"""Where the fused GEMV's time goes between a fixed cost and a cost per step, beside the read bound's, from one record.

At N = 4096 every block of the shipped kernel takes one 16-row tile, and its 8 warps each take K / 2048 steps of
256 columns, so a sweep over K at N = 4096 varies only the steps per warp. A least-squares line through
(steps per warp, us) splits each kernel's time into a fixed part (launch, prologue, the first step's latency, the
reduction) and a part per step; the read bound's line, over the same shapes in the same run, says what a kernel
that only reads the bytes pays for each. The shapes at K = 4096 show the tile balance (rows / 16 tiles over the
grid's blocks). The record comes from

    python -m lab.gemv_peers --shapes 4096x2048 4096x4096 4096x8192 4096x14336 4096x28672 8192x4096 \\
        12672x4096 14336x4096 16896x4096 8192x28672 --dtypes bf16 --no-batch
    # then data/results/<gpu>/09_gemv_peers.json renamed 09_gemv_steps.json

    python -m lab.gemv_steps [GPU folder]      # prints the split; default: every GPU with a record
    python -m lab.gemv_steps --peers data/results/<gpu>/09_gemv_peers.json   # its shapes at the shipped rule's steps
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "09_gemv_steps.json"
OURS = "fused NF4 gemv (numba) [TC]"
READ = "read-only stream of the weight bytes (best config)"


def line(points):
    """Least squares ``us = a + b * steps`` through (steps, us): (a, b)."""
    n = len(points)
    sx, sy = sum(p[0] for p in points), sum(p[1] for p in points)
    sxx, sxy = sum(p[0] ** 2 for p in points), sum(p[0] * p[1] for p in points)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - b * sx) / n, b


def split(records):
    """{name: (fixed us, us per step, [(steps, us), ...])} for ours and the read bound over the N = 4096 sweep."""
    out = {}
    for name in (OURS, READ):
        pts = sorted((r["shape"][1] / 2048, r["ms"] * 1e3) for r in records
                     if r["name"] == name and r["shape"][0] == 4096 and r["dtype"] == "bf16" and r.get("M", 1) == 1)
        if len(pts) >= 2:
            out[name] = (*line(pts), pts)
    return out


def report(path: Path) -> str:
    d = json.loads(path.read_text())
    meta, recs = d["meta"], d["records"]
    s = split(recs)
    lines = [f"{meta.get('gpu', path.parent.name)}, {meta.get('date', '?')}, run {meta.get('run', '?')} ({path.name})"]
    if OURS not in s or READ not in s:
        return lines[0] + ": no N = 4096 sweep in this record"
    (a, b, pts), (ra, rb, rpts) = s[OURS], s[READ]
    lines.append("N = 4096, bf16, M = 1: us = fixed + per step x steps per warp (least squares)")
    lines.append(f"  nf4lab     fixed {a:5.2f} us, per step {b:5.3f} us")
    lines.append(f"  read bound fixed {ra:5.2f} us, per step {rb:5.3f} us")
    lines.append(f"  nf4lab / read bound: fixed +{a - ra:.2f} us, per step {b / rb:.2f}x")
    lines.append("  steps  nf4lab us  line us  read us  % of bound")
    read = dict(rpts)
    for x, y in pts:
        lines.append(f"  {x:5.0f}  {y:9.2f}  {a + b * x:7.2f}  {read.get(x, float('nan')):7.2f}  "
                     f"{100 * read.get(x, float('nan')) / y:9.0f}%")
    k4 = sorted((r["shape"][0], r["ms"] * 1e3) for r in recs if r["name"] == OURS and r["shape"][1] == 4096)
    rk4 = {r["shape"][0]: r["ms"] * 1e3 for r in recs if r["name"] == READ and r["shape"][1] == 4096}
    if k4:
        lines.append("K = 4096 (2 steps a warp a tile): rows, 16-row tiles, nf4lab us, read us, % of bound")
        for n, y in k4:
            lines.append(f"  {n:6d} {n // 16:5d} {y:8.2f} {rk4.get(n, float('nan')):8.2f} "
                         f"{100 * rk4.get(n, float('nan')) / y:5.0f}%")
    # What 85% of the read bound asks at the first shape, given each part.
    x = 7.0
    if x in read:
        need = read[x] / 0.85
        lines.append(f"85% of the bound at 4096x14336 is {need:.2f} us: with this per-step cost the fixed part must be "
                     f"{need - b * x:.2f} us (now {a:.2f}); with this fixed part each step must take {(need - a) / x:.3f} us "
                     f"(now {b:.3f})")
    return "\n".join(lines)


def shipped_steps(N, K, sms):
    """Steps a warp of the shipped M = 1 kernel takes at (N, K) on ``sms`` SMs: its rounds of tiles (grid and G as
    ``gemv.grid_size`` and ``gemv.warps_a_tile`` choose them) times a warp's steps a tile."""
    from nf4lab.kernels import gemv

    tiles, steps, grid = -(-N // 16), -(-K // 256), gemv.grid_size(N, sms)
    G = gemv.warps_a_tile(N, 1, grid)
    rounds = -(-tiles * G // (grid * gemv.W))
    return rounds * -(-steps // G)


def peers_report(path: Path) -> str:
    """The same split over a gemv_peers record's shapes (bf16, M = 1), each at the steps the shipped rule gives it."""
    d = json.loads(path.read_text())
    meta = d["meta"]
    pts = sorted((shipped_steps(*r["shape"], meta.get("sms") or 132), r["ms"] * 1e3, tuple(r["shape"]))
                 for r in d["records"] if r["name"] == OURS and r["dtype"] == "bf16" and r.get("M", 1) == 1)
    a, b = line([(x, y) for x, y, _ in pts])
    out = [f"{meta.get('gpu')}, {meta.get('date')}, run {meta.get('run')} ({path.name}): shipped rule's steps a warp",
           f"  nf4lab fixed {a:.2f} us, per step {b:.3f} us (least squares)", "  shape        steps  us     line us"]
    out += [f"  {n}x{k:<6} {x:5d} {y:7.2f} {a + b * x:7.2f}" for x, y, (n, k) in pts]
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--peers"]:   # python -m lab.gemv_steps --peers data/results/<gpu>/09_gemv_peers.json
        print(peers_report(Path(argv[1])))
        return 0
    folders = [ROOT / "data" / "results" / g for g in argv] or sorted((ROOT / "data" / "results").iterdir())
    found = [f / NAME for f in folders if (f / NAME).exists()]
    if not found:
        print(f"no {NAME} under data/results/")
        return 1
    print("\n\n".join(report(p) for p in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
