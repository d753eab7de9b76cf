"""Benchmark the fused NF4 GEMV of notebook 09 against bitsandbytes, on a GPU, in one call.

Loads the design family (lab/gemv_variants.py), then, in one run:
bitsandbytes matmul_4bit (without grad its gemm_4bit op: the fused kernel up to M=4, then a per-GPU heuristic),
dequantize_4bit + torch.matmul, and our kernels, with the copy ceiling. Checks every output
against a float64 reference, prints tables, and writes

- data/results/<gpu>/09_fused_gemv.json: batch 1, every variant of the notebook's VARIANTS (the first,
  "auto", is the notebook's default), the default's other grid policies ("auto, resident grid", ...), and the
  tensor-core kernel ("TC") where the GPU has it, at the LLM shapes (older records also hold "v1", the first
  version of the kernel: lab/gemv_v1.py at commit 3d50406);
- data/results/<gpu>/09_fused_gemv_batch.json: batch M = 2, 4, 8 (the default and the notebook's
  BATCH_VARIANTS),

and copies of both under $OUT when that variable is set. Kernel records are named
"fused NF4 gemv (numba) [variant]".

    python -m lab.bench_gemv                      # everything, within --budget-s (default 170 s)
    python -m lab.bench_gemv --shapes 4096x14336 --dtypes bf16 --ms 1 --no-save
    python -m lab.bench_gemv --variants TC 'TC B3 D1'   # only these variants
    python -m lab.bench_gemv --variants TC 'TC PP' --no-save   # the two-buffer step loop beside the shipped kernel
    python -m lab.bench_gemv --variants TC 'TC grid tiles' 'TC grid 132' --no-save   # other grids, same kernel

Variants after the first are timed on --variant-dtypes only (default bf16), to keep the run short:
each variant is a separate compile (a few seconds each).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import shutil
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402  (first: decides GPU or simulator)
import nf4lab.kernels.gemv  # noqa: E402

T0 = time.time()
TARGET_SHAPES = ((4096, 14336), (8192, 28672))  # the target shapes


def load_kernel(src=None):
    """The design family (lab/gemv_variants.py): Design, make_gemv, VARIANTS, launch, ..."""
    from lab import gemv_variants

    return gemv_variants


def variant_launches(mod, names=None, policies=None) -> dict:
    """{variant name: launch(g)}: the notebook's VARIANTS (the first is its default), its other grid
    policies for the default ("auto, resident grid"), the tensor-core kernel ("TC") where available, and the
    tensor-core knobs when named ("TC B3 D1", ...)."""
    out = {}
    variants = getattr(mod, "VARIANTS", {"auto": None})
    first = next(iter(variants))
    for key, design in variants.items():  # a Design, a function (N, M) -> Design, None, or (one of those, policy)
        d, p = design if isinstance(design, tuple) else (design, "balanced")
        out[key] = (lambda g, d=d, p=p: mod.launch(g, design=d, policy=p))
    out["TC"] = nf4lab.kernels.gemv.launch  # the shipped tensor-core kernel (09_gemv_tc.json)
    pols = list(getattr(mod, "GRID_POLICIES", ())) if policies is None else list(policies)
    for p in pols[1:]:
        out[f"{first}, {p} grid"] = (lambda g, p=p: mod.launch(g, design=variants[first], policy=p))
    if names:
        from lab import gemv_mma

        for bps in (1, 2, 3, 4):  # the tensor-core design's knobs, only by name: blocks per SM, steps in flight
            for dd in (0, 1, 2, 3):
                out[f"TC B{bps} D{dd}"] = (lambda g, b=bps, dd=dd: gemv_mma.launch(g, blocks_per_sm=b, D=dd))
        out["TC B2 D1 carve"] = (lambda g: gemv_mma.launch(g, carveout=True))
        # M = 1: G warps a tile, W // G tiles a block at once, each group's own barrier (14336x4096: one tile end a warp
        # instead of 4, the same 8 steps; lab/README "Where 14336x4096 stands")
        out["TC G2"] = (lambda g: gemv_mma.launch(g, G=2))
        out["TC G4"] = (lambda g: gemv_mma.launch(g, G=4))
        out["TC x-global"] = (lambda g: gemv_mma.launch(g, xslot=False))  # M = 1: x from L1/L2 at each step (former)
        from lab import gemv_ablate

        out.update(gemv_ablate.variant_launches())  # stages left out, timing only ("TC -lut", ...)
        out["TC bytes"] = (lambda g: gemv_mma.launch(g, words=False))  # the statistics byte by byte (before the word)
        for n in names:  # "TC grid 896": the shipped kernel on another persistent grid; "TC grid tiles": one tile a block
            m = re.fullmatch(r"TC grid (\d+|tiles)", n)
            if m:
                out[n] = (lambda g, v=m.group(1): nf4lab.kernels.gemv.launch(
                    dataclasses.replace(g, grid=-(-g.N // 16) if v == "tiles" else int(v))))
        missing = [n for n in names if n not in out]
        if missing:
            raise SystemExit(f"unknown variants {missing}; known: {list(out)}")
        out = {n: out[n] for n in names}
    return out


def describe_design(v) -> str:
    """How a VARIANTS value is recorded in a run's meta: the Design's name, the function that picks it, a policy."""
    if isinstance(v, tuple):
        return f"{describe_design(v[0])}, {v[1]} grid"
    if v is None:
        return "auto_design(N, M)"
    return f"{v.__name__}(N, M)" if callable(v) else v.name


def _save(run, name, save):
    from nf4lab.measure import results

    out = os.environ.get("OUT")
    if not any(r["kind"] == "kernel" for r in run.records):
        print(f"{name}: nothing was measured (out of time?): not saved")
        return
    if save:
        path = run.save(name)
        print("saved", path.relative_to(ROOT))
        if out:
            dst = Path(out) / path.parent.name / path.name  # the device tool returns files <= 2 folders down
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dst)
            print("copied to", dst)
    elif out:
        run.finalize()
        (Path(out) / f"{name}.json").write_text(json.dumps({"meta": run.meta, "records": run.records},
                                                           indent=1, default=str))
    print("measured on", results.label(run.meta))


def benchmark(launches, shapes, dtypes, ms, variant_dtypes=None, deadline=None, progress=print):
    """gemv_bench.benchmark one (shape, dtype) at a time, merged into one run: the variants after the first only on
    ``variant_dtypes`` (default: all), and no (shape, dtype) started after ``deadline`` (a ``time.time()``;
    ``meta["incomplete"]`` then says so). Each part measures its own copy ceiling."""
    from nf4lab.measure import bench, gemv_bench

    first, run, skipped = next(iter(launches)), None, False
    for (N, K), dtype in itertools.product(shapes, dtypes):
        if deadline is not None and time.time() > deadline:
            skipped = True
            progress(f"deadline reached: {N}x{K} {dtype} and later skipped")
            continue
        keys = [k for k in launches if k == first or variant_dtypes is None or dtype in variant_dtypes]
        part = gemv_bench.benchmark({k: launches[k] for k in keys}, [(N, K)], [dtype], ms, progress=progress)
        if run is None:
            run = part
        else:
            run.records += part.records
            run.meta["checks"] += part.meta["checks"]
            run.meta["seconds"] = round(run.meta["seconds"] + part.meta["seconds"], 1)
    run = run or bench.Run()
    run.meta.setdefault("checks", [])
    run.meta.update(variants=list(launches), incomplete=skipped, default_kernel=gemv_bench.kernel_name(first))
    return run


def _report(run):
    from lab import gemv_reports
    from nf4lab.measure.gemv_bench import FUSED

    print(gemv_reports.table(run))
    for c in run.meta["checks"]:
        print(f"  {c['name']:<58} {'x'.join(map(str, c['shape'])):>11} {c['dtype']} M={c.get('M', 1)}: within "
              f"tolerance {c['ok']} (worst error/tolerance {c['worst_ratio']:.2g}), max |ours - bnb| "
              f"{c['max_abs_diff_vs_bnb']:.3g}")
    return [c for c in run.meta["checks"] if c["name"].startswith(FUSED) and not c["ok"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", help="NxK (W shape) for batch 1, default: the four LLM shapes")
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp16"])
    ap.add_argument("--variants", nargs="*", help="variants to time (default: all); the first is the default")
    ap.add_argument("--variant-dtypes", nargs="*", default=["bf16"],
                    help="dtypes on which the variants after the first are timed (default: bf16)")
    ap.add_argument("--policies", nargs="*", help="grid policies of the default variant (default: all)")
    ap.add_argument("--ms", nargs="*", type=int, default=[1, 2, 4, 8], help="batch sizes (default 1 2 4 8)")
    ap.add_argument("--batch-shapes", nargs="*", help="NxK for M > 1 (default: 4096x14336 8192x28672)")
    ap.add_argument("--batch-dtypes", nargs="*", default=["bf16"])
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="no new measurement starts after this many seconds since start (default 170: the whole "
                         "run, about 20 variants and the batch, stays within 3 minutes)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    from nf4lab.kernels import gemv

    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure (the simulator's timings mean nothing)")
        return 2
    print(nf4lab.describe())
    deadline = T0 + args.budget_s
    mod = load_kernel()
    parse = (lambda ss: [tuple(int(v) for v in s.split("x")) for s in ss])  # noqa: E731
    shapes = parse(args.shapes) if args.shapes else gemv.LLM_SHAPES
    launches = variant_launches(mod, args.variants, args.policies)
    first = next(iter(launches))
    print(f"variants: {', '.join(launches)} (default: {first!r}; the others on {args.variant_dtypes} only)")
    bad = []
    if 1 in args.ms:
        run = benchmark(launches, shapes, tuple(args.dtypes), ms=(1,), variant_dtypes=args.variant_dtypes,
                        deadline=deadline, progress=lambda s: print(f"[{time.time() - T0:5.0f} s] {s}", flush=True))
        run.meta["grid_policies"] = list(getattr(mod, "GRID_POLICIES", ()))
        run.meta["designs"] = {k: describe_design(v) for k, v in getattr(mod, "VARIANTS", {}).items()}
        bad += _report(run)
        _save(run, gemv.NAME, not args.no_save)
    ms = tuple(m for m in args.ms if m > 1)
    if ms:
        bshapes = parse(args.batch_shapes) if args.batch_shapes else TARGET_SHAPES
        bkeys = [first] + [k for k in getattr(mod, "BATCH_VARIANTS", ()) if k != first and k in launches]
        bkeys += [k for k in launches if k.startswith("TC") and k not in bkeys]
        run = benchmark({k: launches[k] for k in bkeys}, bshapes, tuple(args.batch_dtypes), ms=ms, deadline=deadline,
                        progress=lambda s: print(f"[{time.time() - T0:5.0f} s] {s}", flush=True))
        bad += _report(run)
        _save(run, gemv.NAME + "_batch", not args.no_save)
    print(f"total {time.time() - T0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
