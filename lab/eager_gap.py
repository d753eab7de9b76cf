"""Where installed ``F.dequantize_4bit`` loses its microseconds against bitsandbytes' own (GPU only; prints).

tools/bench_launch.py times 100-call loops: installed 84.9 against 56.3 us a call (H100), while cProfile sees
the same Python-level work in both. Here, at 4096x4096 bf16 with nested statistics, each case's host time per
call, median of 15 rounds taken in turn:

- ``loop``: 100 calls, then a synchronize (as bench_launch);
- ``alone``: one call after a synchronize, each timed by itself (no GPU work queued ahead of it);
- installed with the driver launch replaced by a no-op (``no launch``): the same Python, nothing launched.

If ``loop`` is dear but ``alone`` is not, the launch waits on queued GPU work; if ``no launch`` is as cheap as
bitsandbytes, the driver launch is the difference.

    python -m lab.eager_gap
"""
from __future__ import annotations

import statistics
import sys
import time

import nf4lab  # noqa: E402  (first: decides GPU or simulator)


def main() -> int:
    if not nf4lab.ON_GPU:
        print("needs a CUDA GPU")
        return 2
    import bitsandbytes.functional as F
    import torch

    from nf4lab.kernels import fastkernel as fk
    from tools.bench_launch import loop_us

    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(4096, 4096, generator=g, device="cuda").to(torch.bfloat16)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    call = lambda: F.dequantize_4bit(packed, qs)  # noqa: E731

    def loop():
        return loop_us(call, 100, torch)[0]

    def alone():
        ts = []
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return statistics.median(ts) * 1e6

    real = fk.LeanLauncher.__call__

    def no_launch(self, *a):
        return None

    cases = [("bitsandbytes", False, False), ("installed", True, False), ("installed, no launch", True, True)]
    res = {(c, how): [] for c, _, _ in cases for how in ("loop", "alone")}
    for _ in range(15):
        for name, inst, skip in cases:
            if inst:
                nf4lab.install()
            try:
                call()
                if skip:
                    fk.LeanLauncher.__call__ = no_launch
                for how, fn in (("loop", loop), ("alone", alone)):
                    res[(name, how)].append(fn())
            finally:
                fk.LeanLauncher.__call__ = real
                nf4lab.uninstall()
    print(nf4lab.describe())
    for name, _, _ in cases:
        print(f"  {name:<24} loop {statistics.median(res[(name, 'loop')]):6.1f} us a call   "
              f"alone {statistics.median(res[(name, 'alone')]):6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
