"""SASS of the FFMA GEMV designs (lab/gemv_variants.py) without a GPU: registers and instructions per weight.

Compiles a design to PTX (NVVM, works in the simulator),
assembles it for sm_90 with ptxas (the PTX ``.version`` line is lowered to what the installed ptxas
accepts; the launch bounds the kernel was jitted with stay in the PTX), disassembles with cuobjdump
and counts the instructions of the kernel's hottest loop (the innermost loop with the most
instructions: one item of the streaming kernel), per weight: loop instructions / weights one lane
handles per trip (rows x columns per lane; for a batch of M, each weight counts once, not M times).

    python -m lab.sass_gemv                       # the default design, bf16 and fp16
    python -m lab.sass_gemv --all                 # every variant of VARIANTS
    python -m lab.sass_gemv --variants "R2 S1 C32 W8 B4" --m 1 2 4 8 --dtypes bf16
    python -m lab.sass_gemv --keep /tmp/sass      # also keep .ptx/.cubin/.sass
    python -m lab.sass_gemv --all --batch --save   # record data/sass/09_fused_gemv.json (notebook 09 prints it)

Needs ptxas (CUDA toolkit) and cuobjdump (the toolkit's, or ``pip install nvidia-cuda-cuobjdump``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)


def _line(label, r, wpt):
    warps = r.get("warps_per_sm")
    return (f"{label}: {r['registers']} registers, {r['spill_bytes']} B spilled, {r['smem_bytes']} B static smem"
            + (f", {warps} warps/SM by registers" if warps else "")
            + f"; hottest loop {r['loop_instructions']} SASS instructions for {wpt} weights per lane = "
            f"{r['per_weight']:.2f} per weight\n    " + " ".join(f"{k}:{v}" for k, v in r["opcodes"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp16"])
    ap.add_argument("--variants", nargs="*", help="names from gemv_variants.VARIANTS (default: the default design)")
    ap.add_argument("--all", action="store_true", help="every variant of VARIANTS")
    ap.add_argument("--m", nargs="*", type=int, default=[1], help="batch sizes (default 1)")
    ap.add_argument("--batch", action="store_true",
                    help="also auto_design for M = 2, 4, 8 (short and long W) and BATCH_VARIANTS")
    ap.add_argument("--keep", help="folder to keep the .ptx/.cubin/.sass files in")
    ap.add_argument("--save", action="store_true", help="write the report to data/sass/09_fused_gemv.json")
    args = ap.parse_args(argv)
    from lab import gemv_reports
    from lab import gemv_variants as mod

    rows = []
    names = list(mod.VARIANTS) if args.all else (args.variants or [])
    designs = {}
    for n in names:
        d = mod.VARIANTS[n]
        d = d[0] if isinstance(d, tuple) else d  # (design, grid policy): the grid does not change the code
        if d is None or callable(d):  # "auto" and the like: the designs picked for short and long W
            pick = d or mod.auto_design
            for N in (4096, 8192):
                dd = pick(N)
                designs.setdefault(dd.name, dd)
        else:
            designs.setdefault(d.name, d)
    if not designs:
        designs[mod.Design().name] = mod.Design()
    for label, d in designs.items():
        for m in args.m:
            dm = d if m == d.m else dataclasses.replace(
                d, m=m, min_blocks=d.min_blocks if m == 1 else mod.auto_design(8192, m).min_blocks)
            wpt = dm.rows * dm.cols
            for dtype in args.dtypes:
                k = mod.kernel(dm, dtype)
                r = gemv_reports.sass_report(k, mod.SIG, wpt, f"gemv_{dm.name.replace(' ', '_')}_{dtype}", args.keep)
                if r["registers"]:
                    r["warps_per_sm"] = min(64, 65536 // (-(-r["registers"] // 8) * 8 * 32 * dm.warps) * dm.warps)
                print(_line(f"{dm.name} {dtype}", r, wpt))
                rows.append(dict(r, variant=dm.name, dtype=dtype, m=m))
    if args.batch:
        seen = set()
        extra = [mod.VARIANTS[k] for k in getattr(mod, "BATCH_VARIANTS", ()) if k in mod.VARIANTS]
        extra = [d[0] if isinstance(d, tuple) else d for d in extra]
        extra = [d for d in extra if d is not None and not callable(d)]
        for m in (2, 4, 8):
            for dm in [mod.auto_design(N, m) for N in (4096, 8192)] + [dataclasses.replace(d, m=m) for d in extra]:
                if dm in seen:
                    continue
                seen.add(dm)
                for dtype in args.dtypes:
                    r = gemv_reports.sass_report(mod.kernel(dm, dtype), mod.SIG, dm.rows * dm.cols,
                                         f"gemv_{dm.name.replace(' ', '_')}_{dtype}", args.keep)
                    if r["registers"]:
                        r["warps_per_sm"] = min(64, 65536 // (-(-r["registers"] // 8) * 8 * 32 * dm.warps) * dm.warps)
                    print(_line(f"{dm.name} {dtype}", r, dm.rows * dm.cols))
                    rows.append(dict(r, variant=dm.name, dtype=dtype, m=m))
    if args.save:
        import datetime
        import json

        from nf4lab import runtime

        meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), arch="sm_90",
                    ptxas=gemv_reports.ptxas_version(), numba=runtime.versions()["numba"],
                    numba_cuda=runtime.versions()["numba_cuda"], command="python -m lab.sass_gemv " + " ".join(
                        argv if argv is not None else sys.argv[1:]),
                    note="offline: ptxas -arch=sm_90 -v and cuobjdump -sass of the PTX numba compiles; no GPU")
        path = ROOT / gemv_reports.SASS_REPORT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print("saved", path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
