"""Profile every kernel version of the step notebooks with Nsight Compute; store the CSVs.

Run on a GPU machine where ncu may read the counters, from the repository root:

    python tools/profile_all.py                 # all versions of notebooks 01-06
    python tools/profile_all.py --only "NAME"   # some versions (repeat --only)
    python tools/profile_all.py --demo          # the built-in demo kernel only (checks the pipeline)

For each version a driver process (``python -m nf4lab.measure.profiling drive``) builds the
16384x16384 case, launches the version a few times to compile and warm up, and then
once between cudaProfilerStart/Stop; ncu profiles exactly that launch
(``--profile-from-start off``) with the sections of ``nf4lab.measure.profiling.SECTIONS``,
``--clock-control none`` (the clocks the benchmarks ran at) and line info on.
Written, per version (slug of its name):

    data/ncu/<gpu>/<slug>.csv          raw page (one column per metric; the notebook reads it)
    data/ncu/<gpu>/<slug>.details.csv  details page (ncu's own section tables and rule text)
    data/ncu/<gpu>/<slug>.source.csv   source page (stall samples per source/SASS line), if ncu gives it
    data/ncu/<gpu>/index.json          which file is which version, GPU (and its compute capability), date, ncu
                                       and package versions, and each version's kernel source hash: a profile
                                       whose hash is not its notebook's kernel now is shown as an EARLIER kernel

and, when $OUT is set, $OUT/ncu_<gpu>.tar.gz holding those files (paths relative to the
repository root: extract there), $OUT/ncu_<gpu>_reports.tar.gz with the .ncu-rep reports
(open them in ncu-ui) and $OUT/ncu_summary.txt.
Versions are skipped once --budget seconds have passed (default 330), and said so.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
        return out.strip().splitlines()[-1] if out.strip() else None
    except Exception:
        return None


def collect_versions(only=None, demo=False) -> list:
    """[(notebook stem, version name)] of notebooks 01-06, in order."""
    from nf4lab.measure.profiling import step_versions

    found = [] if demo else step_versions()
    if only:
        missing = [o for o in only if o not in {n for _, n in found}]
        if missing:
            print(f"  ! no version named {missing}; known: {[n for _, n in found]}")
        found = [(nb, n) for nb, n in found if n in only]
    if demo or not found:
        from nf4lab.measure.profiling import DEMO

        if not demo:
            print("  no versions defined by notebooks 01-06 yet: profiling the built-in demo kernel only")
        found.append(("demo", DEMO))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", help="profile only this version name (repeatable)")
    ap.add_argument("--demo", action="store_true", help="profile only the built-in demo kernel")
    ap.add_argument("--shape", default="16384x16384")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--budget", type=float, default=330, help="seconds after which no new version is started")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per version")
    ap.add_argument("--no-source", action="store_true", help="skip the source page export")
    ap.add_argument("--synthetic", action="store_true", help="random inputs instead of a bitsandbytes case")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="also copy everything here (default $OUT)")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    import nf4lab
    from nf4lab.measure import profiling, results
    from nf4lab import runtime

    if not runtime.ON_GPU:
        print(f"no GPU here ({runtime.REASON}): nothing to profile. Run this on a GPU machine.")
        return 1
    ncu = profiling.find_ncu()
    if ncu is None:
        print("ncu not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*); set $NCU")
        return 1
    info = runtime.device_info()
    gpu = results.gpu_slug(info["gpu"])
    dest = profiling.NCU_DIR / gpu
    dest.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    shape = tuple(int(s) for s in args.shape.split("x"))
    print(f"profiling on {nf4lab.describe()}\n  ncu: {ncu} ({_ncu_version(ncu)})")
    todo = collect_versions(args.only, args.demo)
    print(f"  {len(todo)} version(s): " + "; ".join(n for _, n in todo))

    index_path = dest / "index.json"
    old = json.loads(index_path.read_text()) if index_path.exists() else {}
    entries = {e["name"]: e for e in old.get("versions", [])}
    summaries, failed, skipped, reports = {}, [], [], []
    tmp = Path(tempfile.mkdtemp(prefix="nf4lab_ncu_"))
    for nb, name in todo:
        if time.perf_counter() - t_start > args.budget:
            skipped.append(name)
            continue
        t0 = time.perf_counter()
        try:
            res = profiling.profile_version(nb, name, tmp, ncu=ncu, shape=shape, dtype=args.dtype,
                                            timeout=args.timeout, source=not args.no_source,
                                            synthetic=args.synthetic)
        except profiling.NcuUnavailable as exc:
            print(f"  ! {name}: {exc}")
            failed.append(name)
            if exc.reason in ("missing", "permission", "unsupported"):
                break  # no point trying the others
            continue
        files = {}
        for kind, f in res["files"].items():
            f = Path(f)
            shutil.copy2(f, dest / f.name)
            files[kind] = f.name
        if Path(res["report"]).exists():
            reports.append(Path(res["report"]))
        k = profiling.main_kernel(res["kernels"])
        summaries[name] = profiling.summarize(k) if k else None
        entries[name] = {"name": name, "notebook": nb, "file": files.get("raw"), "details": files.get("details"),
                         "source": files.get("source"), "kernels": [x["kernel"] for x in res["kernels"]],
                         "seconds": round(time.perf_counter() - t0, 1), "lineinfo": res.get("lineinfo", True),
                         # what was profiled, so that a reader can tell when the notebook's kernel changed
                         "source_sha256": (profiling.source_hashes(nb) or {}).get(name) if nb != "demo" else None,
                         # per entry: a later run with --only refreshes some versions, not all
                         "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        print(f"  {name}: {len(res['kernels'])} kernel(s) profiled in {time.perf_counter() - t0:.0f} s")
    meta = {
        "gpu": info.get("gpu"), "cc": info.get("cc"), "driver": info.get("driver"), "sms": info.get("sms"),
        "l2_bytes": info.get("l2_bytes"),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "ncu": _ncu_version(ncu),
        "numba_cuda": info.get("numba_cuda"), "numba": info.get("numba"), "bitsandbytes": info.get("bitsandbytes"),
        "shape": list(shape), "dtype": args.dtype, "sections": list(profiling.SECTIONS),
        "metrics": list(profiling.METRICS), "clock_control": "none", "lineinfo": True,
        "method": "one launch after warm-up, between cudaProfilerStart/Stop (--profile-from-start off)",
    }
    order = [n for _, n in collect_versions(None, False)]  # the series' order, whatever was profiled now
    versions = sorted(entries.values(), key=lambda e: (order.index(e["name"]) if e["name"] in order else 1e9))
    if summaries:
        index = {"meta": meta, "versions": versions}
        index_path.write_text(json.dumps(index, indent=1) + "\n")
    summary = profiling.table(summaries) if summaries else "nothing profiled"
    if out and summaries:
        # Few files come back from a device run: one archive of what gets committed
        # (paths relative to the repository root: extract there), one of the ncu reports.
        import tarfile

        tgz = out / f"ncu_{gpu}.tar.gz"
        with tarfile.open(tgz, "w:gz") as tar:
            for f in sorted(dest.iterdir()):
                if f.is_file() and not f.name.endswith(".ncu-rep"):
                    tar.add(f, arcname=str(f.relative_to(ROOT)))
        if reports:
            with tarfile.open(out / f"ncu_{gpu}_reports.tar.gz", "w:gz") as tar:
                for f in reports:
                    tar.add(f, arcname=f.name)
        (out / "ncu_summary.txt").write_text(summary + "\n")
    print()
    print(summary)
    print(f"\n{len(summaries)} profiled, {len(failed)} failed {failed or ''}, {len(skipped)} skipped for time "
          f"{skipped or ''}; {time.perf_counter() - t_start:.0f} s")
    if summaries:
        print(f"written under {dest.relative_to(ROOT)}" + (
            f"; {out}/ncu_{gpu}.tar.gz holds them (extract in the repository root: "
            f"tar xzf ncu_{gpu}.tar.gz), ncu_{gpu}_reports.tar.gz the .ncu-rep reports for ncu-ui" if out else ""))
    return 0 if summaries and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
