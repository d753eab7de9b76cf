"""SASS of the notebook 09 GEMV kernel without a GPU: registers and instructions per weight.

Compiles the kernel cells of notebooks/src/09_fused_gemv.py to PTX (NVVM, works in the simulator),
assembles it for sm_90 with ptxas (the PTX ``.version`` line is lowered to what the installed ptxas
accepts), disassembles with cuobjdump and counts the instructions of the kernel's hottest loop (the
largest backward branch), per weight: loop instructions / weights one lane handles per trip.

    python tools/sass_gemv.py                 # bf16 and fp16
    python tools/sass_gemv.py --dtypes bf16 --keep /tmp/sass   # also keep .ptx/.cubin/.sass

Needs ptxas (CUDA toolkit) and cuobjdump (the toolkit's, or ``pip install nvidia-cuda-cuobjdump``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import nf4lab  # noqa: E402  (first: decides GPU or simulator)

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp16"])
    ap.add_argument("--keep", help="folder to keep the .ptx/.cubin/.sass files in")
    ap.add_argument("--src", default=str(ROOT / "notebooks" / "src" / "09_fused_gemv.py"))
    args = ap.parse_args(argv)
    import bench_gemv
    from nf4lab import gemv

    mod = bench_gemv.load_kernel(Path(args.src))
    wpt = getattr(mod, "ROWS", 1) * getattr(mod, "LANE_COLS", 32)
    for dtype in args.dtypes:
        r = gemv.sass_report(mod.GEMV[dtype], mod.SIG, wpt, f"gemv_{dtype}", args.keep)
        print(f"{dtype}: {r['registers']} registers, {r['spill_bytes']} B spilled, {r['smem_bytes']} B static smem; "
              f"hottest loop {r['loop_instructions']} SASS instructions for {wpt} weights per lane = "
              f"{r['per_weight']:.2f} per weight")
        print("   ", " ".join(f"{k}:{v}" for k, v in r["opcodes"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
