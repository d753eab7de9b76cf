"""When to fill the shared LUT: before the data loads, or after them.

    python lab/lut_order.py          # writes data/results/<gpu>/lut_order.json

nf4lab.dequantize with its vector kernel (nf4lab/kernels/fastkernel.py) built both ways, and notebook
06's kernel as the notebook has it, each verified bit for bit and timed with the ceilings, the
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

import nf4lab  # noqa: E402  (before numba.cuda)
from nf4lab.measure import bench, bytemodel  # noqa: E402
from nf4lab.kernels import dequant, fastkernel
from nf4lab import runtime
from nf4lab.lesson import versions

SHAPES = [(16384, 16384), (4096, 14336), (14336, 4096), (8192, 28672), (4096, 4096)]


def use_order(lut_late: bool) -> None:
    """Make nf4lab.dequantize's nested bf16/fp16 vector kernels fill the LUT early or late."""
    for d in ("bf16", "fp16"):
        key = (d, True, "vector")
        fastkernel._KERNELS[key] = fastkernel._build(d, True, "vector", lut_late=lut_late)
        fastkernel._LEAN.pop(key, None)
    dequant._lean_checked.clear()


def time_drop_in(case, name):
    """nf4lab.dequantize on the case's bitsandbytes tensors (as notebook 07 times it), verified."""
    import torch

    packed, qs = case.quant_state("cuda")
    out = torch.empty(case.shape, dtype=qs.dtype, device="cuda")
    nf4lab.dequantize(packed, qs, out=out)
    exact = nf4lab.compare(out, case.expected, case.dtype, n=case.n, blocksize=case.blocksize).ok
    t = bench.gpu_time_ms(lambda s: nf4lab.dequantize(packed, qs, out=out))
    return bench._record("kernel", name, case.shape, case.dtype, t,
                         bytemodel.bytes_moved(case.n, case.dtype, case.blocksize), bit_exact=exact)


def main() -> int:
    if not runtime.ON_GPU:
        print("lut_order: no CUDA GPU here", file=sys.stderr)
        return 2
    print(runtime.describe())
    nb06 = versions.load_module("06_output_dtypes").launch
    run = bench.Run()
    for shape in SHAPES:
        for dtype in ("bf16", "fp16"):
            case = nf4lab.make_case(shape, dtype)
            run.add(bench.run_versions({"06 kernel (as in the notebook)": nb06}, case, strict=True,
                                       progress=False).records)
            for late in (False, True):
                use_order(late)
                run.add(time_drop_in(case, f"nf4lab.dequantize, LUT {'late' if late else 'early'}"))
    use_order(True)
    run.finalize()
    path = run.save("lut_order")
    print(run.table())
    print(f"saved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
