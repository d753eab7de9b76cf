"""When to fill the shared LUT: before the data loads, or after them.

    python lab/lut_order.py          # writes data/results/<gpu>/lut_order.json

nf4lab.dequantize's vector kernel (nf4lab/fastkernel.py) built both ways, and notebook 06's
kernel as the notebook has it, each verified bit for bit and timed with the ceilings, the
traffic-matched bound and bitsandbytes, at 16384x16384 and the LLM shapes, bf16 and fp16.

"early": the 16 LUT lanes load the table, store it to shared memory, and the block waits at a
barrier before any thread issues its data loads. Every block then waits a memory round trip
before its first load; at the start of a launch no other block hides that wait.
"late": every thread issues its data and statistics loads first and fills the table after.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import nf4lab  # noqa: E402  (before numba.cuda)
from nf4lab import bench, fastkernel, runtime, versions  # noqa: E402

SHAPES = [(16384, 16384), (4096, 14336), (14336, 4096), (8192, 28672), (4096, 4096)]


def fast(lut_late: bool):
    """fastkernel's nested vector kernel for bf16/fp16, launched on a notebook's buffers."""
    from numba import cuda

    ks = {d: fastkernel._build(d, True, "vector", lut_late=lut_late)[0] for d in ("bf16", "fp16")}
    offsets = {}   # the kernels take the offset as a 1-element array; made at the first (eager) call

    def launch(b):
        if id(b) not in offsets:
            offsets[id(b)] = cuda.to_device(np.array([b.offset], np.float32))
        ks[b.dtype][fastkernel.grid_size(b.n, "vector", b.dtype), fastkernel.THREADS, b.stream](
            b.packed, b.packed_u32, b.absmax_q, b.absmax2, b.code2, offsets[id(b)], b.lut, b.out, b.out_u32,
            np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1), np.uint64(8))
    return launch


def main() -> int:
    if not runtime.ON_GPU:
        print("lut_order: no CUDA GPU here", file=sys.stderr)
        return 2
    print(runtime.describe())
    nb06 = versions.load_module("06_output_dtypes").launch
    vs = {"nf4lab.dequantize kernel, LUT early": fast(False),
          "nf4lab.dequantize kernel, LUT late": fast(True),
          "06 kernel (as in the notebook)": nb06}
    run = bench.Run()
    for shape in SHAPES:
        for dtype in ("bf16", "fp16"):
            run.add(bench.run_versions(vs, nf4lab.make_case(shape, dtype), strict=True, progress=False).records)
    run.finalize()
    path = run.save("lut_order")
    print(run.table())
    print(f"saved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
