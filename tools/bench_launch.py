"""What one eager call costs: nf4lab against bitsandbytes, as users call them (GPU only).

At 4096x4096 (bf16, NF4, nested statistics, blocksize 64), for dequantize and the M=1 GEMV:

- ``host us``: time for the call to return to Python (GPU work queued, not awaited): the launch cost;
- ``per call us``: a loop of calls then one synchronize, divided by the calls: what a decode loop pays,
  the larger of host cost and GPU time.

Each figure: median of REPS loops of CALLS calls, each after a warm-up call, the cases taken in turn in
every round (so a host whose speed drifts during the run moves them all alike). Calls timed:

dequantize  bitsandbytes F.dequantize_4bit; nf4lab.dequantize; F.dequantize_4bit after nf4lab.install()
            (bitsandbytes' Python, nf4lab's kernel); torch.ops.nf4lab.dequantize_4bit (the custom op, eager)
gemv M=1    bitsandbytes matmul_4bit (no grad); the same after nf4lab.install(); torch.ops.nf4lab.gemv_4bit;
            nf4lab.kernels.gemv.launch_torch directly; torch bf16 ``x @ w.t()`` (the unquantized reference)

Writes data/results/<gpu>/launch_cost.json (and $OUT/) through nf4lab.measure.results.

    python tools/bench_launch.py [--calls 200] [--reps 7] [--profile]

``--profile`` also runs cProfile over 2000 calls of ``matmul_4bit`` and of ``F.dequantize_4bit`` after
install(), and of ``F.dequantize_4bit`` without it, and prints where the host time goes (the functions with
the most own time).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (first: decides GPU or simulator)


def loop_us(fn, calls, torch):
    """One loop of ``calls`` calls: (host us per call, us per call with the final synchronize)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def interleaved(cases, calls, reps, torch):
    """Median per case of ``reps`` loops, the cases taken in turn within each round (A B C .. A B C ..),
    so that a host that slows down or speeds up during the run moves every case alike; a case with
    ``installed`` runs between install() and uninstall(), with one warm-up call each time."""
    host = {i: [] for i in range(len(cases))}
    total = {i: [] for i in range(len(cases))}
    for _ in range(reps):
        for i, (_op, _name, fn, inst) in enumerate(cases):
            if inst:
                nf4lab.install()
            try:
                fn()
                h, t = loop_us(fn, calls, torch)
            finally:
                if inst:
                    nf4lab.uninstall()
            host[i].append(h)
            total[i].append(t)
    return [(statistics.median(host[i]), statistics.median(total[i])) for i in range(len(cases))]


def profile_installed(fn, torch, label, calls=2000, installed=True):
    import cProfile
    import pstats

    if installed:
        nf4lab.install()
    try:
        fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
    finally:
        nf4lab.uninstall()
    print(f"\ncProfile, {calls} calls of {label} {'after install()' if installed else 'without nf4lab'} "
          "(own time first):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    if not nf4lab.ON_GPU:
        sys.exit("bench_launch needs a CUDA GPU (nf4lab is in simulator mode)")
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    from nf4lab.kernels import gemv
    from nf4lab.integrations import torch_ops
    from nf4lab.kernels import dequant
    from nf4lab.measure import results

    N = K = 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(N, K, generator=g, device="cuda").to(torch.bfloat16)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    x = torch.randn(1, K, generator=g, device="cuda").to(torch.bfloat16)
    wd = F.dequantize_4bit(packed, qs)
    y = torch.empty(1, N, dtype=torch.bfloat16, device="cuda")
    dq_args = dequant.op_args(dequant.plan(packed, qs, None))
    gv_args = (packed, list(qs.shape), qs.absmax, qs.state2.absmax, qs.state2.code, qs.offset, qs.blocksize)
    off = torch_ops.offset_value(qs.offset)
    nf4lab.uninstall()

    def bnb_mm():
        with torch.no_grad():
            return bnb.matmul_4bit(x, packed.t(), quant_state=qs)

    cases = [
        ("dequantize", "bitsandbytes F.dequantize_4bit", lambda: F.dequantize_4bit(packed, qs), False),
        ("dequantize", "nf4lab.dequantize", lambda: nf4lab.dequantize(packed, qs), False),
        ("dequantize", "F.dequantize_4bit after nf4lab.install()", lambda: F.dequantize_4bit(packed, qs), True),
        ("dequantize", "torch.ops.nf4lab.dequantize_4bit (eager)", lambda: torch.ops.nf4lab.dequantize_4bit(*dq_args),
         False),
        ("gemv M=1", "bitsandbytes matmul_4bit", bnb_mm, False),
        ("gemv M=1", "matmul_4bit after nf4lab.install()", bnb_mm, True),
        ("gemv M=1", "torch.ops.nf4lab.gemv_4bit (eager)", lambda: torch.ops.nf4lab.gemv_4bit(x, *gv_args), False),
        ("gemv M=1", "nf4lab.kernels.gemv.launch_torch", lambda: gemv.launch_torch(x, packed, qs.shape, qs.absmax,
                                                                          qs.state2.absmax, qs.state2.code, off,
                                                                          qs.blocksize, y), False),
        ("gemv M=1", "torch bf16 x @ w.t() (unquantized)", lambda: x @ wd.t(), False),
    ]
    # The installed GEMV call in pieces (no dispatcher above them): where its host time goes.
    from nf4lab.integrations import bnb_backend
    from bitsandbytes.backends.cuda import ops as bnb_cuda

    ours = bnb_backend._make_kernels(bnb_backend._bnb_cuda_fallbacks())
    ours_kernel = ours["gemm_4bit"]
    mm_args = (x, packed, qs.shape, qs.state2.absmax, qs.blocksize, qs.quant_type, None, qs.absmax, qs.state2.code,
               qs.offset)

    def bnb_op():
        return torch.ops.bitsandbytes.gemm_4bit.default(*mm_args[:6], bias=None, absmax_8bit=qs.absmax,
                                                        absmax_code=qs.state2.code, absmax_offset=qs.offset)

    absmax_plain = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset  # what F.dequantize_4bit hands the op

    def bnb_dq_op():
        return torch.ops.bitsandbytes.dequantize_4bit.default(packed, absmax_plain, qs.blocksize, qs.quant_type,
                                                              qs.shape, qs.dtype)

    # Inside the installed dequantize op, innermost last: where its host time goes.
    from nf4lab.kernels import dequant as nf_dq
    from nf4lab.kernels import fastkernel

    ours_dq = ours["dequantize_4bit"]
    dq_out = torch.empty(qs.shape, dtype=qs.dtype, device="cuda")
    nf4lab.dequantize(packed, qs)  # makes the lean launcher and the table
    lean = fastkernel.lean_launcher("bf16", False, "vector")
    table = nf_dq._LUT_CACHE[("nf4", packed.device)].data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    grid = lean.grid(N * K)
    dq_ptrs = (packed.data_ptr(), absmax_plain.data_ptr(), table, dq_out.data_ptr())

    def lean_call():
        a_ptr, st, lut, o_ptr = dq_ptrs
        lean(stream, grid, a_ptr, st, st, st, st, lut, o_ptr, N * K, nf_dq._BSHIFT[qs.blocksize], 0)

    cases += [
        ("dequantize pieces", "nf4lab's dequantize_4bit kernel function, called directly",
         lambda: ours_dq(packed, absmax_plain, qs.blocksize, qs.quant_type, qs.shape, qs.dtype), False),
        ("dequantize pieces", "bnb_backend._dequantize_handles alone",
         lambda: bnb_backend._dequantize_handles(packed, absmax_plain, qs.blocksize, qs.quant_type, qs.shape,
                                                 qs.dtype), False),
        ("dequantize pieces", "dequant.dequantize_plain_fast (out given)",
         lambda: nf_dq.dequantize_plain_fast(packed, absmax_plain, qs.blocksize, qs.quant_type, qs.shape, qs.dtype,
                                             dq_out), False),
        ("dequantize pieces", "fastkernel.LeanLauncher call (cuLaunchKernel through ctypes)", lean_call, False),
        ("dequantize pieces", "torch.empty of the output alone",
         lambda: torch.empty(qs.shape, dtype=qs.dtype, device=packed.device), False),
    ]
    cases += [
        ("gemv M=1 pieces", "bitsandbytes' gemm_4bit CUDA impl, called directly",
         lambda: bnb_cuda._gemm_4bit_kernel_impl(*mm_args), False),
        ("gemv M=1 pieces", "nf4lab's gemm_4bit kernel function, called directly", lambda: ours_kernel(*mm_args),
         False),
        ("gemv M=1 pieces", "torch_ops.gemv_call directly", lambda: torch_ops.gemv_call(
            x, packed, qs.shape, qs.absmax, qs.state2.absmax, qs.state2.code, qs.offset, qs.blocksize), False),
        ("gemv M=1 pieces", "torch.ops.bitsandbytes.gemm_4bit.default (dispatcher + impl)", bnb_op, False),
        ("gemv M=1 pieces", "torch.ops.bitsandbytes.gemm_4bit.default after nf4lab.install()", bnb_op, True),
        ("dequantize pieces", "torch.ops.bitsandbytes.dequantize_4bit.default (plain statistics)", bnb_dq_op, False),
        ("dequantize pieces", "torch.ops.bitsandbytes.dequantize_4bit.default after nf4lab.install()", bnb_dq_op,
         True),
        ("gemv M=1 pieces", "torch.empty(1, N) alone", lambda: torch.empty((1, N), dtype=x.dtype, device=x.device),
         False),
    ]
    records = []
    for (op, name, _fn, inst), (host, per) in zip(cases, interleaved(cases, a.calls, a.reps, torch)):
        records.append({"kind": "launch", "op": op, "name": name, "shape": [N, K], "dtype": "bf16",
                        "host_us": round(host, 2), "per_call_us": round(per, 2), "installed": inst})
        print(f"{op:15s} {name:62s} host {host:7.1f} us   per call {per:7.1f} us")
    if a.profile:
        profile_installed(bnb_mm, torch, "matmul_4bit (M=1)")
        profile_installed(lambda: F.dequantize_4bit(packed, qs), torch, "F.dequantize_4bit (QLoRA's path)")
        profile_installed(lambda: F.dequantize_4bit(packed, qs), torch, "F.dequantize_4bit (QLoRA's path)",
                          installed=False)  # bitsandbytes' own, the same calls: where the two differ
    meta = results.meta(f"eager calls: median of {a.reps} loops of {a.calls} calls, cases interleaved loop by loop, "
                        "each loop after a warm-up call; host_us = "
                        "time to return (work queued), per_call_us = loop then one synchronize, per call")
    data = {"meta": meta, "records": records}
    if not a.no_save:
        path = results.save(data, "launch_cost")
        print("wrote", path)
        import os
        import shutil

        if os.environ.get("OUT"):
            shutil.copy(path, Path(os.environ["OUT"]) / path.name)


if __name__ == "__main__":
    main()
