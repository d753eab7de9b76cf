"""Fingerprints of the shipped GEMV's output bits, to show that a change to the kernel keeps them (GPU or simulator).

Runs ``nf4lab.kernels.gemv.launch`` on tools/gpu_gemv_paths.py's cases (every path: bf16 and fp16, M = 1..8, nested
and plain statistics, odd shapes, the LLM shapes) and prints one SHA-256 of y's bits per case, and of all of them.
Run it in two checkouts and compare the lines (``diff``): equal digests, equal bits.

    python -m lab.gemv_bits > after.txt; (cd ../before && python -m lab.gemv_bits) > before.txt; diff before.txt after.txt
    python -m lab.gemv_bits --small     # the small cases only (the simulator: minutes)
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402  (first: decides GPU or simulator)
from nf4lab.kernels import gemv  # noqa: E402
from nf4lab.harness import gemv_check  # noqa: E402
from tools.gpu_gemv_paths import CASES  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="only the cases with N x K under 2^16")
    a = ap.parse_args(argv)
    print(nf4lab.describe(), file=sys.stderr)
    total = hashlib.sha256()
    for N, K, M, opts in CASES:
        if a.small and N * K >= 1 << 16:
            continue
        for dtype in ("bf16", "fp16"):
            gc = gemv_check.make_gemv_case(N, K, dtype, M=M, seed=N + M, **opts)
            g = gemv.make_gemv_buffers(gc)
            gemv.launch(g)
            digest = hashlib.sha256(g.result().tobytes()).hexdigest()[:16]
            total.update(digest.encode())
            print(f"{N}x{K} {dtype} M={M} {opts}: {digest}", flush=True)
    print("all:", total.hexdigest()[:16])
    return 0


if __name__ == "__main__":
    sys.exit(main())
