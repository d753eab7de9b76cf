"""The fused GEMV on a GPU, every code path: bf16 and fp16, M = 1..8, nested and plain statistics, small
adversarial shapes and the LLM shapes, each output checked against float64 (within the table-rounding
tolerance of nf4lab.kernels.gemv). Run it twice, as tools/gpu_check.sh does for the dequantizer:

    python tools/gpu_gemv_paths.py                    # this GPU's paths (mma.sync m16n8k16 on sm_80+)
    NF4LAB_ARCH=sm_75 python tools/gpu_gemv_paths.py  # a T4's: fp16 as two m16n8k8, bf16 on the FP32 units

Writes data/results/<gpu>/gemv_paths[_sm_75].json: one record per case (worst error/tolerance, ok).
"""
from __future__ import annotations

import sys
import time

import nf4lab
from nf4lab import arch
from nf4lab.kernels import gemv
from nf4lab.harness import gemv_check
from nf4lab.measure import bench

CASES = [(20, 320, 1, {}), (7, 192, 3, {}), (11, 256, 1, {"dist": "heavy", "x_dist": "heavy"}), (17, 576, 8, {}),
         (6, 384, 2, {"blocksize": 128}), (33, 448, 1, {"dist": "codes"}), (20, 320, 1, {"nested": False}),
         (9, 704, 3, {"nested": False, "blocksize": 128}), (6, 2112, 1, {}), (5, 64, 1, {})]
CASES += [(5, 128, m, {}) for m in (2, 4, 5, 6, 7)] + [(N, K, m, {}) for N, K in gemv.LLM_SHAPES[1:3] for m in (1, 8)]


def main() -> int:
    if not nf4lab.ON_GPU:
        print("gpu_gemv_paths: no CUDA GPU here", file=sys.stderr)
        return 2
    print(nf4lab.describe(), f"NF4LAB_ARCH={arch.name(arch.forced()) if arch.forced() else 'unset'}")
    run = bench.Run(method="outputs of nf4lab.kernels.gemv.launch against float64 x @ W.T (table-rounding tolerance)")
    run.meta["nf4lab_arch"] = arch.name(arch.forced()) if arch.forced() else None
    bad = 0
    for N, K, M, opts in CASES:
        for dtype in ("bf16", "fp16"):
            t0 = time.time()
            gc = gemv_check.make_gemv_case(N, K, dtype, M=M, seed=N + M, **opts)
            g = gemv.make_gemv_buffers(gc)
            gemv.launch(g)
            rep = gemv_check.compare(g.result(), gc, name=f"{N}x{K} {dtype} M={M} {opts}", rounded_table=True)
            bad += not rep.ok
            print(f"{rep} ({time.time() - t0:.1f} s)", flush=True)
            run.add(dict(kind="check", name=rep.name, shape=[N, K], dtype=dtype, M=M, ok=rep.ok,
                         worst_ratio=rep.worst_ratio, options=opts))
    path = run.save("gemv_paths" + (f"_{arch.name(arch.forced())}" if arch.forced() else ""))
    print(f"{bad} outside the tolerance; saved {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
