"""Command line: ``python -m nf4lab {info,bench,sweep,notebooks,plot}``.

    python -m nf4lab info                       # where kernels run, versions
    python -m nf4lab bench --shape 16384 16384 --dtype bf16 --versions 03 06
    python -m nf4lab sweep --dtype bf16         # 1 MB .. 1 GB of output, every version
    python -m nf4lab notebooks                  # execute every notebook headless
    python -m nf4lab plot                       # the GB/s plot from recorded results
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nf4lab
from nf4lab import config, runtime
from nf4lab.measure import bench, results

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"

# Output sizes from ~1 MB to ~1 GB (bf16), square-ish and LLM shapes.
SWEEP_SHAPES = [(512, 1024), (1024, 2048), (2048, 2048), (2048, 4096), (4096, 4096), (4096, 8192),
                (4096, 14336), (8192, 8192), (8192, 16384), (16384, 16384), (8192, 28672), (16384, 32768)]


def _no_gpu(what: str) -> int:
    print(f"nf4lab {what}: no usable CUDA GPU here ({runtime.REASON}). Timings in the simulator would be "
          "meaningless, so none are taken. Recorded GPU results: data/results/.", file=sys.stderr)
    return 2


def _select(all_versions: dict, wanted) -> dict:
    if not wanted:
        return all_versions
    out = {k: v for k, v in all_versions.items() if any(k == w or k.startswith(w) for w in wanted)}
    if not out:
        raise SystemExit(f"--versions {' '.join(wanted)} matches none of: {', '.join(all_versions)}")
    return out


def _versions(wanted):
    from nf4lab.harness import versions

    found = versions.load_all()
    if not found:
        raise SystemExit("no kernel versions found in notebooks/ (cells tagged 'kernel' defining VERSIONS)")
    return _select(found, wanted)


def cmd_info(args) -> int:
    print(runtime.describe())
    for k, v in runtime.device_info().items():
        print(f"  {k}: {v}")
    for k, v in config.set_variables().items():
        print(f"  {k}={v}")
    return 0


def cmd_bench(args) -> int:
    if not runtime.ON_GPU:
        return _no_gpu("bench")
    from nf4lab.lesson import plots

    vs = _versions(args.versions)
    case = nf4lab.make_case(tuple(args.shape), args.dtype)
    run = bench.run_versions(vs, case)
    name = f"bench_{args.shape[0]}x{args.shape[1]}_{args.dtype}"
    path = run.save(name)
    print(run.table())
    import matplotlib

    matplotlib.use("Agg")
    ax = plots.bars(run, shape=case.shape, dtype=case.dtype)
    png = path.with_suffix(".png")
    ax.figure.savefig(png, dpi=120)
    print(f"results: {path.relative_to(ROOT)}\nplot:    {png.relative_to(ROOT)}")
    bad = [r["name"] for r in run.kernels() if r.get("bit_exact") is False or r.get("error")]
    if bad:
        print("NOT bit-exact or failed: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


def cmd_sweep(args) -> int:
    if not runtime.ON_GPU:
        return _no_gpu("sweep")
    from tqdm.auto import tqdm

    from nf4lab.lesson import plots

    vs = _versions(args.versions)
    total = bench.Run()
    for shape in tqdm(SWEEP_SHAPES, desc="sizes"):
        case = nf4lab.make_case(shape, args.dtype, cache=False)
        total.add(bench.run_versions(vs, case, progress=False).records)
        del case
    total.finalize()
    path = total.save(f"sweep_{args.dtype}")
    import matplotlib

    matplotlib.use("Agg")
    ax = plots.sweep(total, dtype=args.dtype)
    ax.figure.savefig(path.with_suffix(".png"), dpi=120)
    print(total.table())
    print(f"results: {path.relative_to(ROOT)}")
    return 0


def notebook_paths(solutions: bool = True) -> list[Path]:
    nbs = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if solutions:
        nbs += sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*_SOLUTION.ipynb"))
    return nbs


def notebook_client(nb, cwd: Path, timeout: int = 1800):
    """An nbclient for ``nb`` whose kernel talks over Unix sockets in a folder of its own: kernels
    started side by side (pytest -n 2) over TCP sometimes grab the same port and die at start."""
    import tempfile

    import nbclient
    from jupyter_client.manager import KernelManager

    sockets = tempfile.mkdtemp(prefix="nf4lab_kernel_")
    km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "k"))
    client = nbclient.NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.sockets = sockets  # for the caller to remove once the kernel is gone
    return client


def notebook_kind(path: Path) -> str:
    """NF4LAB_NOTEBOOK_KIND for a notebook's kernel: a solution's records are saved apart (results.save)."""
    from nf4lab.measure import results

    return results.SOLUTION_KIND if path.stem.endswith("_SOLUTION") else "lesson"


def execute_notebook(path: Path, out: Path, timeout: int = 1800) -> float:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    client = notebook_client(nb, path.parent, timeout)
    os.environ["NF4LAB_NOTEBOOK_KIND"] = notebook_kind(path)   # the kernel starts with this process's environment
    try:
        # nbclient keeps alive a kernel whose manager it was handed (km=): shut it down here, or
        # every kernel lives until this process exits and then prints "Parent appears to have exited".
        client.execute(cleanup_kc=True)
    finally:
        import shutil

        from nf4lab.measure import nbclean

        os.environ.pop("NF4LAB_NOTEBOOK_KIND", None)

        shutil.rmtree(client.sockets, ignore_errors=True)
        # What is committed is what a reader should see: no colour codes, bar frames or warnings.
        # The warnings are shown here, where the run is watched, instead of being lost.
        for line in nbclean.clean(nb):
            print(f"  {path.name}: {line.strip()}", file=sys.stderr)
        nb.metadata.setdefault("nf4lab", {})["executed_on"] = runtime.describe()
        # when: tools/book_order.py finds the notebooks that quote a record replaced after they ran
        nb.metadata["nf4lab"]["executed_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        nbclean.record(nb)   # what makes these outputs current: their code, numbers in prose, loaded kernels
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    return time.perf_counter() - t0


def record_time(notebook: str, secs: float) -> None:
    """How long a notebook takes on this GPU, for the instructor's guide (data/results/<gpu>/notebook_times.json)."""
    data = results.load("notebook_times", results.current_gpu()) or {"records": []}
    recs = [r for r in data["records"] if r["name"] != notebook]
    recs.append({"kind": "time", "name": notebook, "seconds": round(secs, 1)})
    results.save({"meta": results.meta("wall time of one headless execution (nbclient), kernel start "
                                       "and JIT compilation included"), "records": sorted(recs, key=lambda r: r["name"])},
                 "notebook_times")


def cmd_notebooks(args) -> int:
    """Execute notebooks headless: in place on a GPU (their outputs are the record), else into build/."""
    from tqdm.auto import tqdm

    inplace = args.inplace if args.inplace is not None else runtime.ON_GPU
    every = notebook_paths(not args.no_solutions)
    paths = [p for p in every if not args.only or any(p.name.startswith(o) for o in args.only)]
    if missing := [o for o in args.only or () if not any(p.name.startswith(o) for p in every)]:
        print(f"python -m nf4lab notebooks: --only {' '.join(missing)} matches no notebook; there are "
              f"{', '.join(sorted({p.name[:2] for p in every}))}", file=sys.stderr)
        return 2
    failed = []
    for p in tqdm(paths, desc="notebooks"):
        out = p if inplace else BUILD / p.relative_to(ROOT)
        try:
            secs = execute_notebook(p, out)
            tqdm.write(f"ok     {p.relative_to(ROOT)}  ({secs:.0f} s)")
            if runtime.ON_GPU:
                record_time(p.stem, secs)
        except Exception as exc:
            failed.append(p)
            msg = str(exc).strip().splitlines()
            tqdm.write(f"FAILED {p.relative_to(ROOT)}: {msg[-1] if msg else type(exc).__name__}")
    print(f"{len(paths) - len(failed)} notebooks ran, {len(failed)} failed"
          + ("" if inplace else f"; executed copies in {BUILD.relative_to(ROOT)}/notebooks"))
    if not args.no_plot:
        cmd_plot(args)
    return 1 if failed else 0


def cmd_plot(args) -> int:
    """The series' GB/s bar chart: measured now on a GPU if the summary ran, else as recorded."""
    import matplotlib

    matplotlib.use("Agg")
    from nf4lab.lesson import plots

    gpu = results.default_gpu()   # this GPU's own on a GPU, else a recorded one
    run = bench.Run.load("07_summary", gpu) if gpu else None
    if run is None:
        print("no summary results recorded yet (run notebooks/07_summary.ipynb on a GPU)")
        return 0
    ax = plots.bars(run, shape=run.kernels()[0]["shape"], dtype="bf16",
                    title="NF4 dequantization: every version of the series")
    BUILD.mkdir(exist_ok=True)
    png = BUILD / "gbps.png"
    ax.figure.savefig(png, dpi=120)
    print(f"GB/s plot ({results.label(run.meta)}): {png.relative_to(ROOT)}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nf4lab", description="nf4lab: NF4 dequantization with numba.cuda")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="where kernels run and with which versions").set_defaults(fn=cmd_info)
    b = sub.add_parser("bench", help="time the series' kernels, ceilings and bitsandbytes (GPU only)")
    b.add_argument("--shape", nargs=2, type=int, default=[16384, 16384], metavar=("ROWS", "COLS"))
    b.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    b.add_argument("--versions", nargs="*", help="version names or prefixes such as 03 or '06 best'")
    b.set_defaults(fn=cmd_bench)
    s = sub.add_parser("sweep", help="GB/s across sizes, 1 MB to 1 GB (GPU only)")
    s.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    s.add_argument("--versions", nargs="*")
    s.set_defaults(fn=cmd_sweep)
    n = sub.add_parser("notebooks", help="execute every notebook (and solution) headless")
    n.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 01 03")
    n.add_argument("--no-solutions", action="store_true")
    n.add_argument("--no-plot", action="store_true")
    n.add_argument("--inplace", action="store_true", default=None,
                   help="write outputs into the notebooks (default on a GPU)")
    n.set_defaults(fn=cmd_notebooks)
    from nf4lab.measure import ptxall

    x = sub.add_parser("ptx", help="compile every kernel to PTX and assemble it with ptxas for each architecture")
    ptxall.add_arguments(x)
    x.set_defaults(fn=ptxall.command)
    sub.add_parser("plot", help="write build/gbps.png from the recorded summary").set_defaults(fn=cmd_plot)
    from nf4lab.measure import models as _models  # light: imports torch/transformers only when run

    m = sub.add_parser("models", help="Llama-3-8B-shaped model: decode and QLoRA, bitsandbytes vs nf4lab (GPU)")
    _models.add_arguments(m)
    m.set_defaults(fn=_models.main)
    args = ap.parse_args(argv)
    for attr in ("no_plot",):
        if not hasattr(args, attr):
            setattr(args, attr, False)
    try:
        runtime.check_arch()
        results.check_results_gpu()   # a NF4LAB_RESULTS_GPU without results: say which GPUs have some
    except ValueError as exc:  # a bad NF4LAB_ARCH or NF4LAB_RESULTS_GPU: one line that names it, no traceback
        print(f"python -m nf4lab: {exc}", file=sys.stderr)
        return 2
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
