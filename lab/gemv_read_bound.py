"""How fast can ANY kernel read a GEMV's weight bytes? A read-only bound for notebook 09 (GPU only).

For each LLM shape, a kernel that only reads the bytes the fused GEMV reads (``gemv.weight_bytes``: packed
codes and scales) with 128-bit streaming loads, several loads in flight per thread, and XORs them together
(one conditional store keeps the compiler from dropping the loads): no table, no arithmetic, no output. It
is timed exactly like the GEMV (``nf4lab.measure.bench.gpu_time_ms``, CUDA-graph replays, cycling over enough copies
of the bytes to exceed 4x the L2 cache) for a grid of configurations (loads in flight per thread, blocks per
SM); the best per shape is the bound. The 1 GiB copy ceiling is measured in the same run.

A GEMV must at least read its weight once, so no GEMV at that shape can beat this bound, measured the same
way. Writes data/results/<gpu>/09_read_bound.json (and a copy under $OUT).

    python lab/gemv_read_bound.py
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (first: decides GPU or simulator)
from numba import cuda, uint32, uint64  # noqa: E402  (module globals: the simulator swaps them in kernels)

from nf4lab.kernels.gemv import load_stream_u32x4  # noqa: E402

NAME = "09_read_bound"
UNROLLS = (1, 2, 4, 8)
BLOCKS_PER_SM = (2, 4, 8, 16)
THREADS = 256


def make_reader(unroll):
    @cuda.jit
    def read_only(src, nvec, out):
        """XOR of every 16-byte vector of src, ``unroll`` independent 128-bit loads in flight per thread."""
        i = uint64(cuda.grid(1))
        stride = uint64(cuda.gridsize(1))
        acc = uint32(0)
        while i + uint64((unroll - 1)) * stride < nvec:
            for u in range(unroll):
                a, b, c, d = load_stream_u32x4(src, (i + uint64(u) * stride) * uint64(4))
                acc ^= a ^ b ^ c ^ d
            i += uint64(unroll) * stride
        while i < nvec:
            a, b, c, d = load_stream_u32x4(src, i * uint64(4))
            acc ^= a ^ b ^ c ^ d
            i += stride
        if acc == uint32(0x9E3779B9):  # practically never: keeps the loads alive
            out[0] = acc

    return read_only


def main() -> int:
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure")
        return 2
    import torch

    from nf4lab.measure import bench, results
    from nf4lab.kernels.gemv import LLM_SHAPES
    from nf4lab.measure import gemv_bench
    from nf4lab import runtime

    t0 = time.time()
    info = runtime.device_info()
    sms, l2 = info.get("sms") or 132, info.get("l2_bytes") or (50 << 20)
    run = bench.Run(method=bench.METHOD + "; read-only kernel over the GEMV's weight bytes, cycled over copies "
                    "totalling > 4x L2; best of unroll x blocks-per-SM configurations")
    run.add(bench.ceilings(gemv_bench.COPY_BYTES))
    readers = {u: make_reader(u) for u in UNROLLS}
    out = cuda.device_array(1, dtype="uint32")
    for N, K in LLM_SHAPES:
        nb = gemv_bench.weight_bytes(N, K)
        nvec = -(-nb // 16)
        copies = max(2, math.ceil(4 * l2 / nb))
        bufs = [cuda.as_cuda_array(torch.randint(0, 2**31 - 1, (nvec * 4,), dtype=torch.int32, device="cuda")).view("uint32")
                for _ in range(copies)]
        best = None
        for u in UNROLLS:
            for bps in BLOCKS_PER_SM:
                state = {"i": 0}

                def fn(stream, u=u, bps=bps):
                    b = bufs[state["i"]]
                    state["i"] = (state["i"] + 1) % copies
                    readers[u][sms * bps, THREADS, stream](b, nvec, out)

                t = bench.gpu_time_ms(fn, launches=max(bench.LAUNCHES, copies))
                cfg = f"unroll {u}, {bps} blocks of {THREADS} per SM"
                if best is None or t["ms"] < best[0]["ms"]:
                    best = (t, cfg)
                print(f"  {N}x{K}: {cfg}: {t['ms'] * 1e3:.1f} us, {nb / t['ms'] / 1e6:.0f} GB/s", flush=True)
        t, cfg = best
        run.add(bench._record("bound", "read-only stream of the weight bytes (best config)", (N, K), "bf16", t, nb,
                              config=cfg, copies=copies, fits_l2=False, M=1))
        del bufs
        torch.cuda.empty_cache()
    run.finalize()
    copy = max(r["gbps"] for r in run.records if r["name"] == gemv_bench.COPY)
    for r in run.records:
        if r["kind"] == "bound":
            print(f"{'x'.join(map(str, r['shape'])):>11}: {r['ms'] * 1e3:6.1f} us, {r['gbps']:5.0f} GB/s = "
                  f"{r['gbps'] / copy:.0%} of the copy ceiling ({copy:.0f} GB/s)  [{r['config']}]")
    path = run.save(NAME)
    print("saved", path.relative_to(ROOT), "--", results.label(run.meta), f"({time.time() - t0:.0f} s)")
    if os.environ.get("OUT"):
        shutil.copy(path, Path(os.environ["OUT"]) / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
