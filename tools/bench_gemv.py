"""Benchmark the fused NF4 GEMV of notebook 09 against bitsandbytes, on a GPU.

Runs the kernel cells (tag "kernel") of notebooks/src/09_fused_gemv.py, then, in one run:
bitsandbytes matmul_4bit with a one-row input (its fused 4-bit GEMV), dequantize_4bit + torch.matmul,
and the fused kernel, at the LLM shapes, bf16 and fp16, with the copy ceiling. Checks every output
against a float64 reference, prints a table, writes data/results/<gpu>/09_fused_gemv.json
(and a copy under $OUT when that variable is set).

    python tools/bench_gemv.py                      # all four shapes, bf16 and fp16
    python tools/bench_gemv.py --shapes 4096x14336 --dtypes bf16 --no-save
    python tools/bench_gemv.py --policies balanced  # only the notebook's default grid

By default every grid policy the notebook's launch offers (GRID_POLICIES) is timed in the same run:
the first as the kernel, the others as variants "[policy]".
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import nf4lab  # noqa: E402  (first: decides GPU or simulator)


def load_kernel(src=ROOT / "notebooks" / "src" / "09_fused_gemv.py"):
    try:
        import nbformat  # noqa: F401  (build_notebooks imports it; parse/variant do not need it)
    except ImportError:
        sys.modules["nbformat"] = types.ModuleType("nbformat")
    import build_notebooks as bn

    mod = types.ModuleType("nf4lab_nb_09")
    mod.__file__ = str(src)
    code = [c for c in bn.parse(src.read_text()) if c["type"] == "code"]
    for c in code[:1] + [c for c in code[1:] if "kernel" in c["tags"]]:  # the imports, then the kernel
        exec(compile("\n".join(bn.variant(c["lines"], True)), str(src), "exec"), mod.__dict__)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", help="NxK (W shape), default: the four LLM shapes")
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp16"])
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--policies", nargs="*", help="grid policies of the notebook's launch to time (default: all)")
    args = ap.parse_args(argv)
    from nf4lab import gemv, results

    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure (the simulator's timings mean nothing)")
        return 2
    print(nf4lab.describe())
    mod = load_kernel()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else gemv.LLM_SHAPES
    policies = args.policies if args.policies is not None else list(getattr(mod, "GRID_POLICIES", ()))
    if policies:
        launches = {p: (lambda g, p=p: mod.launch(g, policy=p)) for p in policies}
        print("grid policies:", ", ".join(policies), f"(the first is recorded as {gemv.FUSED!r})")
    else:
        launches = mod.launch
    run = gemv.benchmark(launches, shapes, tuple(args.dtypes))
    run.meta["grid_policies"] = policies
    print(gemv.table(run))
    bad = [c for c in run.meta["checks"] if c["name"].startswith(gemv.FUSED) and not c["ok"]]
    for c in run.meta["checks"]:
        print(f"  {c['name']:<40} {'x'.join(map(str, c['shape'])):>11} {c['dtype']}: within tolerance {c['ok']} "
              f"(worst error/tolerance {c['worst_ratio']:.2g}), max |ours - bnb| {c['max_abs_diff_vs_bnb']:.3g}")
    print("measured on", results.label(run.meta))
    if not args.no_save:
        path = run.save(gemv.NAME)
        print("saved", path.relative_to(ROOT))
        out = os.environ.get("OUT")
        if out:
            dst = Path(out) / path.parent.name / path.name  # the device tool returns files <= 2 folders down
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dst)
            print("copied to", dst)
    elif os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "09_fused_gemv.json").write_text(
            json.dumps({"meta": run.meta, "records": run.records}, indent=1, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
