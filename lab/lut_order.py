"""When to fill the shared LUT, and whether the statistics loads belong in the load loop.

    python lab/lut_order.py          # writes data/results/<gpu>/lut_order.json

Recorded (data/results/NVIDIA_H200/lut_order.json, NVIDIA_H100_80GB_HBM3/lut_order.log): a variant
of nf4lab.dequantize's kernel that issued each unit's statistics loads in the load loop and filled
the LUT either before ("early") or after ("late") them, against notebook 06's kernel (the LUT
first, statistics read in the store loop). Both variants lost: 85-88% of the traffic-matched bound
on the H200 against 06's 96-99%, 1-3 points on the H100; "late" never beat "early". The variant is
in git (commit 0fb4628, nf4lab/fastkernel.py ``lut_late``); the package kept 06's shape.

Run now, the script times notebook 06's kernel and nf4lab.dequantize as shipped, verified bit for
bit, with the ceilings, the bound and bitsandbytes, at the LLM shapes and 16384x16384.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (before numba.cuda)
from nf4lab import bench, bytemodel, runtime, versions  # noqa: E402

SHAPES = [(4096, 14336), (14336, 4096), (16384, 16384)]


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
            run.add(time_drop_in(case, "nf4lab.dequantize (out=)"))
    run.finalize()
    path = run.save("lut_order")
    print(run.table())
    print(f"saved {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
