"""Build the nf4lab site (build/site/) with Sphinx and myst-nb, offline, without executing anything.

    python tools/build_site.py                    # the notebooks as committed
    python tools/build_site.py --executed build   # prefer this run's executed copies (build/notebooks/...)

What it stages in build/site_src/ (Sphinx reads only that folder; docs/site/conf.py configures it):
- index.md: the landing page, docs/site/index.md with its notebook table, toctrees and the GB/s plot
  (`python -m nf4lab plot`) of the GPU whose outputs the notebook pages show, named;
- notebooks/NN_*.ipynb and notebooks/solutions/*_SOLUTION.ipynb, each with a line saying where its
  outputs come from and a link to its solution (or student) version;
- docs/*.md (results, instructors' guide, developer guide, ...) and any repository file these pages
  link to (a linked .md becomes a page outside the navigation, anything else a download).
Files are copied only when their content changed, so Sphinx's cache (build/site_doctrees/) makes a
second build fast.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_SRC = ROOT / "docs" / "site"
RESULTS = ROOT / "data" / "results"
# Relative link targets in markdown: [text](target) where target is no URL and no in-page anchor.
LINK = re.compile(r"\]\(\s*<?([^)\s>#]+)(?:#[^)\s]*)?>?\s*\)")
MATHJAX_FILES = ["tex-chtml.js", "output/chtml/fonts/woff-v2"]


def gpu_slug(name: str) -> str:
    # Same folder names as nf4lab.measure.results.gpu_slug; not imported, so that building the site
    # does not start numba (and its simulator) just to name a folder.
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "unknown"


WRITTEN: set[Path] = set()   # what this build staged; anything else in the stage is a leftover


def write_if_changed(path: Path, data: bytes) -> None:
    """Keep the file (and its mtime) when its content is the same, so Sphinx does not re-read it."""
    WRITTEN.add(path.resolve())
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def notebook_sources(executed: Path | None) -> list[tuple[Path, Path]]:
    """(repository path, file to read) of every student notebook, then every solution."""
    rel = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    rel += sorted((ROOT / "notebooks" / "solutions").glob("[0-9][0-9]_*_SOLUTION.ipynb"))
    out = []
    for p in rel:
        r = p.relative_to(ROOT)
        copy = executed / r if executed else None
        # An executed copy older than the notebook is a previous run's (a GPU run since then executed
        # the notebook in place, or its source changed): the notebook is the newer record.
        newer = copy is not None and copy.exists() and copy.stat().st_mtime >= p.stat().st_mtime
        out.append((r, copy if newer else p))
    return out


def has_outputs(nb: dict) -> bool:
    return any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


def simulated(executed_on: str) -> bool:
    """Whether `nf4lab.describe()`, recorded as executed_on, tells of a run in the simulator."""
    return executed_on.startswith("mode=") or "simulator" in executed_on


def executed_gpu(nb: dict) -> str | None:
    """The GPU a notebook's outputs were recorded on, from the metadata `nf4lab notebooks` writes."""
    on = nb.get("metadata", {}).get("nf4lab", {}).get("executed_on") or ""
    if not on or simulated(on) or not has_outputs(nb):
        return None
    return on.split(" (")[0]


def provenance(nb: dict) -> str:
    on = nb.get("metadata", {}).get("nf4lab", {}).get("executed_on")
    if not has_outputs(nb):
        return ("This page shows the notebook without outputs: it has not been executed since its code "
                "last changed. Run it yourself: `jupyter lab notebooks/`.")
    if on and simulated(on):
        return ("The outputs below come from a run without a GPU, in numba's CUDA simulator: the kernels "
                "ran on small cases, and the timings and plots are recorded GPU results, named where "
                f"shown. The run: {on}")
    if on:
        return f"The outputs below were recorded when this notebook ran on {on}."
    return "The outputs below were recorded by a run whose machine the notebook does not name."


def title_of(nb: dict, fallback: str) -> str:
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            for line in "".join(c["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


ANCHOR_LINK = re.compile(r"\[([^\]]+)\]\(#([\w-]+)\)")


REMOTE_IMAGE = re.compile(r"!\[([^\]]*)\]\((https?://[^)\s]+)\)")


def local_links(text: str) -> str:
    """A remote image (the "Open in Colab" badge) becomes its alt text, so that the site loads nothing
    from the network and a badge link stays a link. Links a notebook's markdown makes to its own <a id=...> anchors become HTML links (MyST would
    look them up as Sphinx labels, which must be unique across the site, and drop them). (A solution's
    links to its neighbours already point to the lessons: tools/build_notebooks.py writes them so.)"""
    def html(m):
        label = re.sub(r"`([^`]+)`", r"<code>\1</code>", m.group(1))
        return f'<a href="#{m.group(2)}">{label}</a>'

    text = REMOTE_IMAGE.sub(lambda m: m.group(1) or m.group(2), text)
    return ANCHOR_LINK.sub(html, text)


def stage_notebook(rel: Path, src: Path, titles: dict[str, str], stage: Path) -> dict:
    nb = json.loads(src.read_text())
    solution = rel.parent.name == "solutions"
    stem = rel.stem.removesuffix("_SOLUTION")
    note = provenance(nb).rstrip()
    note += "" if note.endswith(".") else "."
    if solution:
        note += f" The students' version: [{titles[stem]}](../{stem}.ipynb)."
    elif (ROOT / "notebooks" / "solutions" / f"{stem}_SOLUTION.ipynb").exists():
        note += f" Its solution: [{stem} solution](solutions/{stem}_SOLUTION.ipynb)."
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            c["source"] = local_links("".join(c["source"]))
    block = f":::{{admonition}} Outputs\n:class: nf4lab-provenance\n{note}\n:::\n"
    # The note goes right under the title (a Colab badge cell may come first): where these outputs
    # come from is read before any of them.
    md = [c for c in nb["cells"] if c["cell_type"] == "markdown"]
    titled = next((c for c in md if "".join(c["source"]).startswith("# ")), None)
    if titled is None:
        if md:
            md[0]["source"] = block + "\n" + "".join(md[0]["source"])
    else:
        title, _, rest = "".join(titled["source"]).partition("\n")
        titled["source"] = title + (" (solution)" if solution else "") + "\n\n" + block + "\n" + rest
    write_if_changed(stage / rel, json.dumps(nb, indent=1, ensure_ascii=False).encode())
    return nb


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text())
        return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return path.read_text()


def stage_linked(pages: list[Path], stage: Path) -> None:
    """Stage every repository file that a staged page links to, following links between .md files."""
    todo, seen = list(pages), set(pages)
    while todo:
        rel = todo.pop()
        for target in LINK.findall(markdown_of(stage / rel)):
            if "://" in target or target.startswith("mailto:"):
                continue
            dest = Path(os.path.normpath(rel.parent / target))
            if dest.parts and dest.parts[0] == ".." or dest in seen:
                continue
            repo_file = ROOT / dest
            seen.add(dest)
            if not repo_file.is_file() or (stage / dest).resolve() in WRITTEN:
                continue   # not a file of the repository, or already a page of the site
            if dest.suffix == ".md":
                # A page reached only through a link: no place in the navigation.
                write_if_changed(stage / dest, b"---\norphan: true\n---\n" + repo_file.read_bytes())
                todo.append(dest)
            else:
                write_if_changed(stage / dest, repo_file.read_bytes())


def pick_results_gpu(notebooks: list[dict], summary: dict | None = None) -> str | None:
    """The GPU whose summary the landing page plots: the one notebook 07's page (``summary``) was executed on,
    else the one most notebook pages' outputs were recorded on; for simulator runs, the recorded GPU they show
    (the one whose notebooks ran last, as nf4lab chooses)."""
    on = collections.Counter(g for g in map(executed_gpu, notebooks) if g)
    first = executed_gpu(summary) if summary else None
    for name in ([first] if first else []) + [name for name, _ in on.most_common()]:
        if (RESULTS / gpu_slug(name) / "07_summary.json").exists():
            return gpu_slug(name)
    env = os.environ.get("NF4LAB_RESULTS_GPU")
    if env and (RESULTS / gpu_slug(env) / "07_summary.json").exists():
        return gpu_slug(env)
    dirs = [d for d in RESULTS.iterdir() if d.is_dir() and (d / "07_summary.json").exists()] if RESULTS.exists() else []

    def book_date(d: Path) -> str:   # as nf4lab.measure.results.default_gpu: notebook_times.json's date
        try:
            return str(json.loads((d / "notebook_times.json").read_text()).get("meta", {}).get("date", ""))
        except (OSError, ValueError):
            return ""

    dirs.sort(key=lambda d: (-len(list(d.glob("*.json"))), d.name))
    dated = {d: book_date(d) for d in dirs}
    ran = [d for d in dirs if dated[d]]
    return (max(ran, key=dated.get) if ran else dirs[0]).name if dirs else None   # equal dates: the order above


def results_section(gpu: str | None, stage: Path, python: str) -> str:
    if gpu is None:
        return ("No GPU results are recorded yet: run `notebooks/07_summary.ipynb` on a GPU, then "
                "`./run.sh site`.")
    meta = json.loads((RESULTS / gpu / "07_summary.json").read_text())["meta"]
    env = dict(os.environ, NF4LAB_RESULTS_GPU=gpu, MPLBACKEND="Agg")
    done = subprocess.run([python, "-m", "nf4lab", "plot"], cwd=ROOT, env=env, capture_output=True, text=True)
    png = ROOT / "build" / "gbps.png"
    where = (f"recorded on the **{meta.get('gpu')}** on {meta.get('date')} (driver {meta.get('driver')}; "
             f"numba-cuda {meta.get('numba_cuda')}, bitsandbytes {meta.get('bitsandbytes')}, "
             f"torch {meta.get('torch')})")
    text = (f"Every version of the series beside the GPU's ceilings and bitsandbytes, as summarized by "
            f"[notebook 07](notebooks/07_summary.ipynb), {where}.\n\n")
    if done.returncode == 0 and png.exists():
        write_if_changed(stage / "gbps.png", png.read_bytes())
        text += f"![GB/s of every version of the series on the {meta.get('gpu')}](gbps.png)\n\n"
    else:
        print(f"build_site: WARNING: `python -m nf4lab plot` failed, the landing page has no plot:\n{done.stderr[-2000:]}",
              file=sys.stderr)
    text += ("Each notebook's page shows its own measurements; every recorded result, on every GPU, is on "
             "the [results page](docs/results.md).")
    return text


def stage_mathjax(stage_root: Path) -> Path | None:
    """MathJax 3 (one script and its fonts) from the sphinx-mathjax-offline wheel, for _static/mathjax."""
    from importlib import metadata

    try:
        base = Path(metadata.distribution("sphinx-mathjax-offline").locate_file(
            "sphinx-mathjax-offline/static/mathjax"))
    except metadata.PackageNotFoundError:
        return None
    if not (base / "tex-chtml.js").exists():
        return None
    out = stage_root / "mathjax_static"
    for rel in MATHJAX_FILES:
        src = base / rel
        for f in ([src] if src.is_file() else sorted(src.rglob("*"))):
            if f.is_file():
                write_if_changed(out / "mathjax" / f.relative_to(base), f.read_bytes())
    return out


def stage_all(stage: Path, executed: Path | None, python: str) -> None:
    stage.mkdir(parents=True, exist_ok=True)
    sources = notebook_sources(executed)
    titles = {}
    for rel, src in sources:
        if rel.parent.name == "notebooks":
            titles[rel.stem] = title_of(json.loads(src.read_text()), rel.stem)
    staged = [stage_notebook(rel, src, titles, stage) for rel, src in sources]
    students = [(rel, nb) for (rel, _), nb in zip(sources, staged) if rel.parent.name == "notebooks"]
    solutions = {rel.stem.removesuffix("_SOLUTION") for rel, _ in sources if rel.parent.name == "solutions"}

    rows = ["| | Notebook | Solution |", "| --- | --- | --- |"]
    for rel, nb in students:
        num, sep, name = titles[rel.stem].partition(" · ")    # "01 · Naive: ..."
        if not sep:
            num, name = rel.stem[:2], titles[rel.stem]
        sol = f"[solution](notebooks/solutions/{rel.stem}_SOLUTION.ipynb)" if rel.stem in solutions else ""
        rows.append(f"| {num} | [{name}](notebooks/{rel.stem}.ipynb) | {sol} |")

    docs = sorted((ROOT / "docs").glob("*.md"))
    order = {"results.md": 0, "instructors.md": 1, "DEVELOPING.md": 2}
    docs.sort(key=lambda p: (order.get(p.name, 3), p.name))
    for d in docs:
        write_if_changed(stage / "docs" / d.name, d.read_bytes())
    if not (ROOT / "docs" / "results.md").exists():
        # The results page is generated (tools/readme_results.py); until it is, say so instead of a dead link.
        write_if_changed(stage / "docs" / "results.md",
                         b"# Results\n\nNo results page has been generated yet.\n")
        docs.insert(0, ROOT / "docs" / "results.md")

    summary = next((nb for rel, nb in students if rel.stem == "07_summary"), None)
    gpu = pick_results_gpu([nb for _, nb in students], summary)
    index = (SITE_SRC / "index.md").read_text()
    index = (index.replace("%%NOTEBOOK_TABLE%%", "\n".join(rows))
             .replace("%%RESULTS%%", results_section(gpu, stage, python))
             .replace("%%NOTEBOOK_TOC%%", "\n".join(f"notebooks/{rel.stem}" for rel, _ in students))
             .replace("%%SOLUTION_TOC%%", "\n".join(f"notebooks/solutions/{s}_SOLUTION" for s in sorted(solutions)))
             .replace("%%DOCS_TOC%%", "\n".join(f"docs/{d.stem}" for d in docs)))
    write_if_changed(stage / "index.md", index.encode())
    stage_linked([Path("index.md")] + [Path("docs") / d.name for d in docs] + [rel for rel, _ in sources], stage)
    # A notebook or page removed from the repository must not linger as a page of the site.
    for f in sorted(stage.rglob("*"), reverse=True):
        if f.is_file() and f.resolve() not in WRITTEN:
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    ap.add_argument("--executed", type=Path, default=None,
                    help="folder whose notebooks/... copies (from `nf4lab notebooks` without a GPU) replace "
                         "the committed notebooks where they are newer")
    ap.add_argument("--stage", type=Path, default=ROOT / "build" / "site_src")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    python = sys.executable
    stage_all(args.stage, args.executed, python)
    env = dict(os.environ)
    mathjax = stage_mathjax(args.stage.parent / "site_mathjax")
    if mathjax is None:
        print("build_site: WARNING: sphinx-mathjax-offline is not installed (pip install -e '.[docs]'): formulas "
              "will load MathJax from the network", file=sys.stderr)
    else:
        env["NF4LAB_SITE_MATHJAX"] = str(mathjax)
    doctrees = args.stage.parent / "site_doctrees"
    cmd = [python, "-m", "sphinx", "-b", "html", "-q", "-j", "auto", "-c", str(SITE_SRC),
           "-d", str(doctrees), str(args.stage), str(args.out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env)
    if done.returncode:
        print(f"build_site: sphinx-build failed ({done.returncode})", file=sys.stderr)
        return done.returncode
    out = args.out.resolve()
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"site: {shown}/index.html ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
