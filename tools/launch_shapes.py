"""Which launch shape reaches the wall on this GPU: notebook 06's kernel at several block sizes.

    python tools/launch_shapes.py          # writes data/results/<gpu>/launch_shapes.json

For each shape (16384x16384 and the LLM shapes, bf16): the ceilings, the traffic-matched bound
(best of bench.SHAPES) and bitsandbytes, notebook 06's kernel at THREADS x UNITS for every
pair below, and nf4lab.dequantize as shipped, each verified bit for bit before it is timed. The shipped shape is one
for all GPUs (nf4lab/kernels/fastkernel.py THREADS, WORDS_PER_THREAD; notebook 06's THREADS, UNITS):
this file is the evidence that it is at the bound on the GPU it ran on.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (before numba.cuda)
from nf4lab.measure import bench  # noqa: E402
from nf4lab import runtime
from nf4lab.kernels import fastkernel
from nf4lab.harness import versions

SHAPES = [(16384, 16384), (4096, 14336), (8192, 28672)]
PAIRS = [(128, 1), (128, 2), (128, 4), (256, 2), (512, 2), (1024, 2)]


def notebook06(threads: int, units: int):
    """Notebook 06's kernel cell, run as a module with its launch shape set before anything compiles."""
    mod = versions.load_module("06_output_dtypes")
    mod.THREADS, mod.UNITS = threads, units
    mod.KERNELS = {d: mod.make_kernel(d) for d in mod.OUT_KINDS}   # read THREADS/UNITS when they compile
    return mod.launch


def main() -> int:
    if not runtime.ON_GPU:
        print("launch_shapes: no CUDA GPU here", file=sys.stderr)
        return 2
    print(runtime.describe())
    run = bench.Run()
    for shape in SHAPES:
        case = nf4lab.make_case(shape, "bf16")
        vs = {f"06 kernel, {t} threads x {u}": notebook06(t, u) for t, u in PAIRS}
        run.add(bench.run_versions(vs, case, strict=True).records)   # with the ceilings, bound and bitsandbytes
        # Notebook 06 lists every kernel record of this file as "this kernel at several launch shapes":
        # the drop-in is 06's design at the shape it ships with, and its name says so.
        run.add(bench.time_dequantize(case, f"nf4lab.dequantize (out=), {fastkernel.THREADS} threads x "
                                            f"{fastkernel.WORDS_PER_THREAD}"))
    run.finalize()
    path = run.save("launch_shapes")
    print(run.table())
    print(f"saved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
