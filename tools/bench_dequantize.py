"""nf4lab.dequantize vs bitsandbytes' dequantize_4bit on a CUDA GPU: bit-exactness, then speed.

    python tools/bench_dequantize.py            # full run, writes data/results/<gpu>/dequantize.json
    python tools/bench_dequantize.py --quick    # smaller matrix, two shapes

1. Bit-exactness on the GPU against bitsandbytes' CUDA kernel: nf4/fp4, nested or not, every
   blocksize, bf16/fp16/fp32, odd and tiny sizes, misaligned views (A[1:], out at +2 bytes),
   out= and the one-row (transposed) input.
2. Speed at 4096x4096 ... 16384x16384, bf16 and fp16: end to end (wall clock of back-to-back
   calls as users make them, synchronised at the end) and GPU time (CUDA-graph replay).

Each case runs in its own try: a failure is recorded and the run goes on. A table is printed
at the end; the results file is written under data/results/ and copied under $OUT if set.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (before numba.cuda)
from nf4lab.measure import bench, results  # noqa: E402
from nf4lab.format import bytemodel
from nf4lab import runtime

SPEED_SHAPES = [(4096, 4096), (4096, 14336), (8192, 28672), (16384, 16384)]
EXACT_SHAPES = [(3, 5), (7,), (1, 4096), (130, 129), (257, 1023), (1024, 1000), (4096, 4096)]
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def bits_equal(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(iv), b.contiguous().view(iv)))


def exactness(quick: bool) -> list[dict]:
    import torch
    import bitsandbytes.functional as F

    recs = []
    shapes = EXACT_SHAPES[:5] if quick else EXACT_SHAPES
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    for shape in shapes:
        for bs in BLOCKSIZES:
            for qt in ("nf4", "fp4"):
                for nested in (True, False):
                    for dname, dt in dtypes.items():
                        name = f"{qt} b{bs} {'nested' if nested else 'plain'}"
                        try:
                            g = torch.Generator(device="cuda").manual_seed(hash((shape, bs)) % 2**31)
                            w = torch.randn(shape, device="cuda", generator=g).to(dt)
                            w.view(-1)[::7] = 0
                            packed, qs = F.quantize_4bit(w, blocksize=bs, quant_type=qt, compress_statistics=nested)
                            if qt == "fp4":
                                packed.view(-1)[::5] = 0x88  # code 8: the signed zero
                            exp = F.dequantize_4bit(packed, qs)
                            ok = bits_equal(nf4lab.dequantize(packed, qs), exp)
                            # Misaligned views: A one byte in (scalar path), out 2 bytes off 16.
                            big = torch.zeros(packed.numel() + 1, dtype=torch.uint8, device="cuda")
                            big[1:] = packed.view(-1)
                            mis = big[1:].view(packed.shape)
                            ok &= bits_equal(nf4lab.dequantize(mis, qs), exp)
                            n = w.numel()
                            obig = torch.empty(n + 8, dtype=dt, device="cuda")
                            out = obig[1:n + 1].view(qs.shape)
                            r = nf4lab.dequantize(packed, qs, out=out)
                            ok &= r is out and bits_equal(out, exp)
                            out2 = torch.empty(qs.shape, dtype=dt, device="cuda")
                            ok &= bits_equal(nf4lab.dequantize(packed, qs, out=out2), exp)
                            if len(shape) == 2 and shape[0] > 1:
                                row = packed.t()  # one row: transposed result, like bitsandbytes
                                ok &= bits_equal(nf4lab.dequantize(row, qs), F.dequantize_4bit(row, qs))
                            torch.cuda.synchronize()
                            recs.append({"kind": "exactness", "name": name, "shape": list(shape), "dtype": dname,
                                         "bit_exact": bool(ok)})
                        except Exception as exc:
                            recs.append({"kind": "exactness", "name": name, "shape": list(shape), "dtype": dname,
                                         "bit_exact": False, "error": f"{type(exc).__name__}: {exc}"})
                            traceback.print_exc()
    return recs


def speed(quick: bool, ceilings: dict) -> list[dict]:
    import torch
    import bitsandbytes.functional as F

    recs = []
    shapes = SPEED_SHAPES[:2] if quick else SPEED_SHAPES
    for shape in shapes:
        for dname, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            try:
                w = torch.randn(shape, device="cuda", dtype=dt)
                packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
                del w
                n = packed.numel() * 2
                nbytes = bytemodel.bytes_moved(n, dname, 64, True)
                ours = nf4lab.dequantize(packed, qs)
                exp = F.dequantize_4bit(packed, qs)
                exact = bits_equal(ours, exp)
                del ours, exp
                out = torch.empty(shape, dtype=dt, device="cuda")
                e2e_ours = bench.wall_time_ms(lambda: nf4lab.dequantize(packed, qs))
                e2e_bnb = bench.wall_time_ms(lambda: F.dequantize_4bit(packed, qs))
                gpu_ours = bench.gpu_time_ms(lambda s: nf4lab.dequantize(packed, qs, out=out))
                gpu_bnb = bench.gpu_time_ms(lambda s: F.dequantize_4bit(packed, qs, out=out))
                for name, t, other, kind in (
                        ("nf4lab.dequantize (end to end)", {"ms": e2e_ours, "method": bench.WALL_CLOCK}, e2e_bnb, "kernel"),
                        ("bitsandbytes dequantize_4bit (end to end)", {"ms": e2e_bnb, "method": bench.WALL_CLOCK}, None,
                         "baseline"),
                        ("nf4lab.dequantize (out=, GPU time)", gpu_ours, gpu_bnb["ms"], "kernel"),
                        ("bitsandbytes dequantize_4bit (out=, GPU time)", gpu_bnb, None, "baseline")):
                    rec = bench._record(kind, name, shape, dname, t, nbytes, bit_exact=exact)
                    rec["speedup_vs_bnb"] = (other / t["ms"]) if other else None
                    c = ceilings.get(dname)
                    if c and rec["gbps"]:
                        rec["pct_copy"] = 100 * rec["gbps"] / c[0]
                        rec["pct_fill"] = 100 * rec["gbps"] / c[1]
                    recs.append(rec)
                del packed, qs, out
                torch.cuda.empty_cache()
            except Exception as exc:
                recs.append({"kind": "kernel", "name": "nf4lab.dequantize", "shape": list(shape), "dtype": dname,
                             "error": f"{type(exc).__name__}: {exc}"})
                traceback.print_exc()
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller exactness matrix and two speed shapes")
    ap.add_argument("--skip-exact", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args(argv)
    if not runtime.ON_GPU:
        print("no CUDA GPU here: nothing to measure (run this on the GPU machine)", file=sys.stderr)
        return 2
    import torch

    t0 = time.time()
    print(runtime.describe(), flush=True)
    recs = []
    ceilings = {}
    try:
        for dname in ("bf16", "fp16"):
            nbytes = bytemodel.bytes_moved(16384 * 16384, dname, 64, True)
            c = bench.ceilings(nbytes, (16384, 16384), dname)
            ceilings[dname] = (c[0]["gbps"], c[1]["gbps"])
            recs += c
    except Exception:
        traceback.print_exc()
    if not args.skip_exact:
        recs += exactness(args.quick)
        print(f"exactness done in {time.time() - t0:.0f} s", flush=True)
    if not args.skip_speed:
        recs += speed(args.quick, ceilings)
    from nf4lab.kernels import dequant

    meta = results.meta("end to end: wall clock per call of back-to-back calls from Python, synchronised at the "
                        "end (bench.wall_time_ms); GPU time: " + bench.METHOD)
    meta["lean_launch"] = dequant._lean_state["ok"]
    meta["words_per_thread"] = __import__("nf4lab.kernels.fastkernel", fromlist=["x"]).WORDS_PER_THREAD
    data = {"meta": meta, "records": recs}
    name = "dequantize_quick" if args.quick else "dequantize"
    path = results.save(data, name)
    out_dir = os.environ.get("OUT")
    if out_dir:
        shutil.copy(path, Path(out_dir) / path.name)
    # The table.
    exact = [r for r in recs if r["kind"] == "exactness"]
    bad = [r for r in exact if not r.get("bit_exact")]
    print(f"\nbit-exact: {len(exact) - len(bad)}/{len(exact)} cases" + ("" if not bad else "; failures:"))
    for r in bad[:30]:
        print("   ", r["name"], r["shape"], r["dtype"], r.get("error", ""))
    print(f"\n{'name':48} {'shape':>14} {'dtype':>5} {'ms':>9} {'GB/s':>7} {'xbnb':>6} exact")
    for r in recs:
        if r["kind"] in ("kernel", "baseline"):
            ms = r.get("ms")
            print(f"{r['name'][:48]:48} {'x'.join(map(str, r['shape'])):>14} {r['dtype']:>5} "
                  f"{(ms or float('nan')):9.4f} {(r.get('gbps') or 0):7.0f} "
                  f"{(r.get('speedup_vs_bnb') or float('nan')):6.2f} {r.get('bit_exact')} {r.get('error', '')}")
    print(f"\nlean launch: {dequant._lean_state['ok']}; written {path}; {time.time() - t0:.0f} s")
    torch.cuda.synchronize()
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
