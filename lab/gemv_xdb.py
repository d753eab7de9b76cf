"""The shipped M = 1 GEMV with two x slots used in turn ("TC xdb", ``gemv.make_kernel(xdb=True)``), timed beside it.

The shipped step ends with syncwarp, x_put, syncwarp: the first barrier keeps the next step's x from overwriting the
slot before every lane has read this step's. With two slots (rows 16-47 and 48-79 of the table's spare words, taken in
turn) a step writes the slot the previous step read, which the previous step's closing syncwarp already released:
one syncwarp a step, the same values into the same mmas, the same bits.

    NUMBA_ENABLE_CUDASIM=1 python -m lab.gemv_xdb --check   # simulator: the shipped kernel's bits, small cases
    python -m lab.gemv_xdb --bench                          # GPU: A B A B at 5 shapes -> 09_gemv_xdb.json
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time

import nf4lab  # noqa: F401  (first: decides GPU or simulator)
from nf4lab.kernels import gemv

NAME = "09_gemv_xdb"
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (12672, 4096)]


def launch(g):
    gemv.validate(g)
    if g.M != 1 or not gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)):
        raise ValueError("lab gemv_xdb: M = 1 with the statistics word only")
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    base = gemv.probe_base() if nf4lab.ON_GPU else gemv.default_base(nf4lab.runtime.target_cc())
    kern = gemv.prepare(gemv.make_kernel(g.dtype == "bf16", 1, base, True, xdb=True), args)
    kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, gemv.SMEM](*args)


def check() -> int:
    """Simulator: the variant against the shipped kernel's bits (several tiles a block, odd N, warps past K)."""
    import numpy as np
    from nf4lab.harness import gemv_check

    bad = 0
    for N, K, dtype, G in ((37, 512, "bf16", 2), (45, 1024, "fp16", 1), (20, 256, "bf16", 3)):
        gc = gemv_check.make_gemv_case(N, K, dtype, seed=7)
        g = dataclasses.replace(gemv.make_gemv_buffers(gc), grid=G)
        gemv.launch(g)
        ref = g.result().copy()
        g.y.copy_to_device(np.full(N, 0x7FBF, np.uint16))
        launch(g)
        same = np.array_equal(g.result(), ref)
        print(f"{N}x{K} {dtype} grid {G}: shipped bits {same}", flush=True)
        bad += not same
    print("PASSED" if not bad else f"FAILED: {bad} cases")
    return 1 if bad else 0
def bench() -> int:
    """GPU: the shipped kernel and every variant at SHAPES, bf16 M = 1, CUDA-graph GPU time over weight copies
    totalling > 4x L2, timed twice in turn (A B A B) in one process, each output checked once against float64."""
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure (the simulator's timings mean nothing)")
        return 2
    import bitsandbytes.functional as F
    import torch

    from lab.gemv_peers import copies_for, cycled
    from nf4lab.measure import bench as nbench, gemv_bench

    t0, log, bad, dtype = time.time(), [], 0, "bf16"

    def say(s):
        log.append(s := f"[{time.time() - t0:5.1f} s] {s}")
        print(s, flush=True)

    say(nf4lab.describe())
    run = nbench.Run(method=nbench.METHOD + "; weights cycled over copies totalling > 4x L2; all kernels in one process")
    run.meta.update(checks=[], default_kernel=gemv_bench.kernel_name("TC"))
    fns = {"TC": gemv.launch, "TC xdb": launch}
    for N, K in SHAPES:
        nb, grid = gemv_bench.weight_bytes(N, K), gemv.grid_size(N)
        copies = copies_for(nb, nf4lab.device_info().get("l2_bytes") or (50 << 20))
        data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]
        q0, x, outs, calls, times, checks = data[0][1], data[0][2], {}, {}, {}, {}
        q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
        w64 = F.dequantize_4bit(data[0][0], q32).double()
        y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
        for name, fn in fns.items():
            y = torch.empty(1, N, dtype=x.dtype, device="cuda")
            bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                            q.blocksize, y) for p, q, _ in data]
            fn(bufs[0])  # the first launch compiles
            y.fill_(float("nan"))
            fn(bufs[0])
            torch.cuda.synchronize()
            outs[name] = y.clone()
            checks[name] = dict(gemv_bench._gpu_check(y, y64, tol, gemv_bench.kernel_name(name)), shape=[N, K],
                                dtype=dtype, M=1)
            run.meta["checks"].append(checks[name])
            calls[name] = (lambda i, s, fn=fn, bufs=bufs: fn(dataclasses.replace(bufs[i], stream=s)))
        for name in [*calls, *calls]:
            times.setdefault(name, []).append(cycled(calls[name], copies))
        line = f"{N}x{K} {dtype} grid {grid}:"
        for name, ts in times.items():
            chk = checks[name]
            extra = {} if name == "TC" else {
                "bits_equal_shipped": bool(torch.equal(outs[name].view(torch.int16), outs["TC"].view(torch.int16)))}
            bad += (not chk["ok"]) + (extra.get("bits_equal_shipped") is False)
            run.add(nbench._record("kernel", chk["name"], (N, K), dtype, ts[0], nb, within_tol=chk["ok"], copies=copies,
                                   fits_l2=False, M=1, grid=grid, ms_again=ts[1]["ms"], **extra))
            line += (f" {name} {ts[0]['ms'] * 1e3:.2f} / {ts[1]['ms'] * 1e3:.2f} us (ok {chk['ok']}"
                     + "".join(f", {k} {v}" for k, v in extra.items()) + ");")
        say(line)
        del data, w64, y64, tol
        torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    path = run.save(NAME)
    say(f"saved {path}; outside tolerance or bits unlike the shipped kernel's: {bad}")
    path.with_suffix(".log").write_text("\n".join(log) + "\n")
    if os.environ.get("OUT"):   # the device tool brings back files <= 2 folders down
        os.makedirs(dst := os.path.join(os.environ["OUT"], path.parent.name), exist_ok=True)
        for p in (path, path.with_suffix(".log")):
            shutil.copy(p, dst)
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    for m in ("check", "bench"):
        mode.add_argument(f"--{m}", action="store_true")
    args = ap.parse_args()
    sys.exit(check() if args.check else bench())
