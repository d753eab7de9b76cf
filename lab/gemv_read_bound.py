"""How fast can ANY kernel read a GEMV's weight bytes? A read-only bound for notebook 09 (GPU only).

For each LLM shape, a kernel that only reads the bytes the fused GEMV reads (``gemv_bench.weight_bytes``: packed
codes and scales) with 128-bit streaming loads, several loads in flight per thread, and XORs them together
(one conditional store keeps the compiler from dropping the loads): no table, no arithmetic, no output. It
is timed exactly like the GEMV (``nf4lab.measure.bench.gpu_time_ms``, CUDA-graph replays, cycling over enough copies
of the bytes to exceed 4x the L2 cache) for a grid of configurations (loads in flight per thread, blocks per
SM); the best per shape is the bound. The 1 GiB copy ceiling is measured in the same run.

A GEMV must at least read its weight once, so no GEMV at that shape can beat this bound, measured the same
way. Writes data/results/<gpu>/09_read_bound.json (and a copy under $OUT).

    python -m lab.gemv_read_bound
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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


def make_tiled_reader(unroll):
    @cuda.jit
    def read_tiled(src, n, kw, out):
        """The shipped GEMV's M = 1 access pattern with nothing else: a block per 16-row tile (persistent), its 8
        warps on 256-column steps w, w + 8, ...; lane (g, q) reads rows g and g + 8 at words 32 c + 8 q and + 4
        (4 x 16 bytes a step), ``unroll`` steps of loads in flight."""
        lane, warp = uint32(cuda.threadIdx.x) & uint32(31), uint32(cuda.threadIdx.x) >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        nwarps = uint32(cuda.blockDim.x) >> uint32(5)
        steps, tiles = kw >> uint32(5), (n + uint32(15)) >> uint32(4)
        acc = uint32(0)
        t = uint32(cuda.blockIdx.x)
        while t < tiles:
            r0 = min(t * uint32(16) + g, n - uint32(1))
            r1 = min(t * uint32(16) + g + uint32(8), n - uint32(1))
            c = warp
            while c < steps:
                for u in range(unroll):
                    cu = min(c + uint32(u) * nwarps, steps - uint32(1))
                    w0, w1 = r0 * kw + cu * uint32(32) + uint32(8) * q, r1 * kw + cu * uint32(32) + uint32(8) * q
                    a0, b0, c0, d0 = load_stream_u32x4(src, uint64(w0))
                    a1, b1, c1, d1 = load_stream_u32x4(src, uint64(w0 + uint32(4)))
                    a2, b2, c2, d2 = load_stream_u32x4(src, uint64(w1))
                    a3, b3, c3, d3 = load_stream_u32x4(src, uint64(w1 + uint32(4)))
                    acc ^= a0 ^ b0 ^ c0 ^ d0 ^ a1 ^ b1 ^ c1 ^ d1 ^ a2 ^ b2 ^ c2 ^ d2 ^ a3 ^ b3 ^ c3 ^ d3
                c += uint32(unroll) * nwarps
            t += uint32(cuda.gridDim.x)
        if acc == uint32(0x9E3779B9):
            out[0] = acc

    return read_tiled


def main_tiled() -> int:
    """``--tiled``: the weight codes read in the GEMV's own tile pattern (make_tiled_reader) for unroll x blocks
    per SM, beside the flat stream's best of the same run; prints only (lab/README.md keeps what it showed)."""
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure")
        return 2
    import torch

    from nf4lab import runtime
    from nf4lab.kernels.gemv import LLM_SHAPES
    from nf4lab.measure import bench

    info = runtime.device_info()
    sms, l2 = info.get("sms") or 132, info.get("l2_bytes") or (50 << 20)
    print(nf4lab.describe())
    out = cuda.device_array(1, dtype="uint32")
    flat, tiled = make_reader(4), {u: make_tiled_reader(u) for u in (1, 2, 4)}  # compiled once each
    for N, K in LLM_SHAPES:
        nb = N * K // 2
        copies = max(2, math.ceil(4 * l2 / nb))
        bufs = [cuda.as_cuda_array(torch.randint(0, 2**31 - 1, (nb // 4,), dtype=torch.int32, device="cuda")).view("uint32")
                for _ in range(copies)]
        tiles = -(-N // 16)
        for label, unroll, bps in [("flat stream, unroll 4", 4, 2)] + [("tiled", u, b) for u in (1, 2, 4) for b in (2, 4, 8)]:
            state = {"i": 0}
            kern = flat if label.startswith("flat") else tiled[unroll]

            def fn(stream, kern=kern, label=label, bps=bps):
                b = bufs[state["i"]]
                state["i"] = (state["i"] + 1) % copies
                if label.startswith("flat"):
                    kern[sms * bps, THREADS, stream](b, nb // 16, out)
                else:
                    kern[min(tiles, sms * bps), THREADS, stream](b, uint32(N), uint32(K // 8), out)

            t = bench.gpu_time_ms(fn, launches=max(bench.LAUNCHES, copies))
            print(f"  {N}x{K} codes only ({nb / 1e6:.1f} MB): {label}, unroll {unroll}, {bps} blocks of {THREADS} "
                  f"per SM: {t['ms'] * 1e3:.1f} us, {nb / t['ms'] / 1e6:.0f} GB/s", flush=True)
        del bufs
        torch.cuda.empty_cache()
    return 0


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
    sys.exit(main_tiled() if "--tiled" in sys.argv[1:] else main())
