"""One GPU call for lab/gemv_next.py: the read bound, the shipped GEMV, torch's int4 tinygemm and the register-table
candidates, timed the same way in one process (CUDA-graph GPU time, weights cycled over copies > 4x L2), each
candidate's output compared bit for bit with the shipped kernel's and against float64 (gemv.tolerance).

    python lab/gemv_next_bench.py [--variants 'NX B2' 'NX B3'] [--batch-shape 4096x14336]

Writes data/results/<gpu>/09_gemv_next.json (one run: meta with GPU, date, versions and the kernels' source hashes)
and a copy under $OUT.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (first: decides GPU or simulator)
from nf4lab.kernels import gemv  # noqa: E402

NAME = "09_gemv_next"
READ_CONFIGS = [(u, b) for u in (1, 2, 4) for b in (4, 8, 16)]   # unroll x blocks per SM: every winner so far
TINY = "torch _weight_int4pack_mm (tinygemm int4, group 128)"


def variants():
    from lab import gemv_next

    out = {"TC": gemv.launch}
    for mb in (2, 3):
        out[f"NX B{mb}"] = (lambda g, mb=mb: gemv_next.launch(g, min_blocks=mb))
    return out


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def read_bound(N, K, sms, l2, progress):
    """Best of READ_CONFIGS of lab/gemv_read_bound.py's reader over the weight bytes at (N, K)."""
    import torch
    from numba import cuda

    from lab.gemv_read_bound import THREADS, make_reader
    from nf4lab.measure import bench, gemv_bench

    nb = gemv_bench.weight_bytes(N, K)
    nvec, copies = -(-nb // 16), max(2, math.ceil(4 * l2 / nb))
    bufs = [cuda.as_cuda_array(torch.randint(0, 2**31 - 1, (nvec * 4,), dtype=torch.int32, device="cuda")).view("uint32")
            for _ in range(copies)]
    out, best = cuda.device_array(1, dtype="uint32"), None
    for u, bps in READ_CONFIGS:
        reader, turn = make_reader(u), itertools.cycle(range(copies))
        t = bench.gpu_time_ms(lambda s: reader[sms * bps, THREADS, s](bufs[next(turn)], nvec, out),
                              launches=max(bench.LAUNCHES, copies))
        if best is None or t["ms"] < best[0]["ms"]:
            best = (t, f"unroll {u}, {bps} blocks of {THREADS} per SM")
    progress(f"{N}x{K} read bound {best[0]['ms'] * 1e3:.2f} us [{best[1]}]")
    del bufs
    torch.cuda.empty_cache()
    return bench._record("bound", "read-only stream of the weight bytes (best config)", (N, K), "bf16", best[0], nb,
                         config=best[1], copies=copies, fits_l2=False, M=1)


def tinygemm(N, K, M, l2):
    """torch's int4 tinygemm at group 128 on bf16 (its only dtype on CUDA): (timing, bytes) or None."""
    import torch

    from nf4lab.measure import bench

    try:
        nb = N * K // 2 + (K // 128) * N * 2 * 2
        copies = max(2, math.ceil(4 * l2 / nb))
        ws = []
        for i in range(copies):
            q = torch.randint(0, 16, (N, K), dtype=torch.int32, device="cuda")
            packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
            wp = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
            sz = torch.randn(K // 128, N, 2, device="cuda").to(torch.bfloat16) * 0.01
            ws.append((wp, sz))
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm(x, ws[0][0], 128, ws[0][1])
        turn = itertools.cycle(range(copies))
        def call(s):
            wp, sz = ws[next(turn)]
            torch.ops.aten._weight_int4pack_mm(x, wp, 128, sz)

        t = bench.gpu_time_ms(call, launches=max(bench.LAUNCHES, copies))
        return t, nb, copies
    except Exception as e:  # noqa: BLE001  (recorded, not fatal)
        print("tinygemm failed:", type(e).__name__, str(e)[:200])
        return None


def measure(launches, N, K, dtype, M, l2, run, progress):
    import torch

    from nf4lab.measure import bench, gemv_bench

    nb = gemv_bench.weight_bytes(N, K)
    copies = max(2, math.ceil(4 * l2 / nb))
    data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i, M=M) for i in range(copies)]
    x, y = data[0][2], torch.empty(M, N, dtype=data[0][2].dtype, device="cuda")
    bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                    q.blocksize, y) for p, q, _ in data]
    import bitsandbytes.functional as F

    q0 = data[0][1]
    q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
    w64 = F.dequantize_4bit(data[0][0], q32).double()
    y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
    ref = None
    for key, fn in launches.items():
        fn(bufs[0])
        y.fill_(float("nan"))
        fn(bufs[0])
        torch.cuda.synchronize()
        bits = y.view(torch.int16).clone()
        ref = bits if ref is None else ref
        chk = dict(gemv_bench._gpu_check(y, y64, tol, gemv_bench.kernel_name(key)), shape=[N, K], dtype=dtype, M=M,
                   bits_equal_shipped=bool(torch.equal(bits, ref)),
                   max_abs_diff_vs_shipped=float((y.float() - ref.view(y.dtype).float()).abs().max()))
        run.meta["checks"].append(chk)
        turn = itertools.cycle(range(copies))
        t = bench.gpu_time_ms(lambda s, fn=fn: fn(dataclasses.replace(bufs[next(turn)], stream=s)),
                              launches=max(bench.LAUNCHES, copies))
        run.add(bench._record("kernel", gemv_bench.kernel_name(key), (N, K), dtype, t, nb, within_tol=chk["ok"],
                              bits_equal_shipped=chk["bits_equal_shipped"], copies=copies, fits_l2=False, M=M))
        progress(f"{N}x{K} {dtype} M={M} {key}: {t['ms'] * 1e3:.2f} us, within tol {chk['ok']} "
                 f"(worst {chk['worst_ratio']:.2g}), bits = shipped: {chk['bits_equal_shipped']}")
    del data, bufs, y64, tol, w64
    torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="*", help="candidates besides the shipped 'TC' (default: all)")
    ap.add_argument("--shapes", nargs="*", help="NxK at M = 1 (default: the four LLM shapes)")
    ap.add_argument("--batch-shape", default="4096x14336")
    ap.add_argument("--batch-variants", nargs="*", default=["NX B2"])
    args = ap.parse_args(argv)
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure")
        return 2
    import torch

    from nf4lab import runtime
    from nf4lab.measure import bench

    t0 = time.time()
    progress = lambda s: print(f"[{time.time() - t0:5.0f} s] {s}", flush=True)  # noqa: E731
    info = runtime.device_info()
    sms, l2 = info.get("sms") or 132, info.get("l2_bytes") or (50 << 20)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(nf4lab.describe(), "\nnvidia-smi:", smi)
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2; read bound: best of "
                    f"{READ_CONFIGS} (unroll, blocks per SM) of lab/gemv_read_bound.py's reader, same process")
    run.meta.update(nvidia_smi=smi, checks=[], sources={p: sha(ROOT / p) for p in (
        "lab/gemv_next.py", "lab/gemv_next_bench.py", "nf4lab/kernels/gemv.py", "lab/gemv_read_bound.py")})
    launches = variants()
    if args.variants:
        launches = {k: v for k, v in launches.items() if k == "TC" or k in args.variants}
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else list(gemv.LLM_SHAPES)
    for N, K in shapes:
        run.add(read_bound(N, K, sms, l2, progress))
    for (N, K), dtype in itertools.product(shapes, ("bf16", "fp16")):
        measure(launches, N, K, dtype, 1, l2, run, progress)
        if dtype == "bf16":
            tg = tinygemm(N, K, 1, l2)
            if tg:
                run.add(bench._record("baseline", TINY, (N, K), "bf16", tg[0], tg[1], copies=tg[2], fits_l2=False, M=1))
                progress(f"{N}x{K} bf16 M=1 tinygemm: {tg[0]['ms'] * 1e3:.2f} us")
    bN, bK = (int(v) for v in args.batch_shape.split("x"))
    blaunch = {k: v for k, v in launches.items() if k == "TC" or k in args.batch_variants}
    for M in range(2, 9):
        measure(blaunch, bN, bK, "bf16", M, l2, run, progress)
    run.meta["seconds"] = round(time.time() - t0, 1)
    run.finalize()
    bound = {tuple(r["shape"]): r["ms"] for r in run.records if r["kind"] == "bound"}
    tiny = {tuple(r["shape"]): r["ms"] for r in run.records if r["name"] == TINY}
    print(f"\n{'shape':>11} {'dtype':>5} {'M':>2} {'variant':<8} {'us':>7} {'% bound':>8} {'tinygemm us':>12}")
    for r in run.records:
        if r["kind"] == "kernel":
            s, b = tuple(r["shape"]), bound.get(tuple(r["shape"]))
            pct = f"{100 * b / r['ms']:.0f}%" if b and r.get("M", 1) == 1 else ""
            tg = f"{tiny[s] * 1e3:.2f}" if s in tiny and r["dtype"] == "bf16" and r.get("M", 1) == 1 else ""
            print(f"{'x'.join(map(str, s)):>11} {r['dtype']:>5} {r.get('M', 1):>2} {r['name'].split('[')[-1][:-1]:<8} "
                  f"{r['ms'] * 1e3:7.2f} {pct:>8} {tg:>12}")
    for s, b in bound.items():
        print(f"read bound {s}: {b * 1e3:.2f} us")
    path = run.save(NAME)
    print("saved", path.relative_to(ROOT))
    if os.environ.get("OUT"):
        shutil.copy(path, Path(os.environ["OUT"]) / path.name)
    bad = [c for c in run.meta["checks"] if not c["ok"]]
    print("checks outside tolerance:", len(bad), "| bits differing from shipped:",
          sum(not c["bits_equal_shipped"] for c in run.meta["checks"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
