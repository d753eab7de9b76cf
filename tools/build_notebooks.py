"""Build the notebooks from their sources in notebooks/src/.

Each ``notebooks/src/NN_topic.py`` is a percent-format script (``# %%`` starts a
code cell, ``# %% [markdown]`` a markdown cell whose lines are ``# ``-commented;
``# %% tags=["kernel"]`` tags a cell), read by jupytext. It becomes two notebooks:

- ``notebooks/NN_topic.ipynb`` for students: every region between
  ``### BEGIN SOLUTION`` and ``### STUDENT`` is dropped, and the region from
  ``### STUDENT`` to ``### END SOLUTION`` is kept (the stub the student edits);
- ``notebooks/solutions/NN_topic_SOLUTION.ipynb``: the solution region kept, the
  student region dropped.

Outputs of an existing notebook are kept when its cell source did not change, so
re-building after a GPU run does not throw the recorded results away. Kept outputs are
cleaned (nf4lab/measure/nbclean.py: no ANSI codes, progress frames, widgets or warnings).

Every notebook starts with an "Open in Colab" badge and a setup cell that, on Colab or Kaggle
only, fetches this repository and installs what the runtime lacks (tools/setup_runtime.py);
elsewhere the cell does nothing.

    python tools/build_notebooks.py          # build all
    python tools/build_notebooks.py --check  # fail if a notebook is out of date
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
OUT = ROOT / "notebooks"
SOL = OUT / "solutions"

# Where the Colab badges and the setup cell fetch the series from; a fork changes this line.
REPO = "nf4lab/nf4lab"
COLAB = "https://colab.research.google.com/github/{repo}/blob/main/{path}"
BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
SETUP = f"""\
# Colab / Kaggle only: fetch nf4lab and install what the runtime lacks (once per session; its time
# there is not measured). Anywhere else this cell does nothing. See tools/setup_runtime.py for what it installs.
import os, subprocess, sys
if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
    repo = os.path.expanduser("~/nf4lab-repo")   # one fixed place: running this cell again reuses it
    if not os.path.isdir(repo):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "https://github.com/{REPO}", repo], check=True)
    subprocess.run([sys.executable, os.path.join(repo, "tools", "setup_runtime.py")], check=True)
    sys.path.insert(0, repo)
    os.chdir(os.path.join(repo, "notebooks"))"""


def _nbclean():
    """nf4lab.measure.nbclean: its stale check reads the kernel cells of other notebooks through
    nf4lab.harness.versions, so it is imported as part of the package (which prints nothing at import)."""
    from nf4lab.measure import nbclean

    return nbclean


def parse(text: str) -> list[dict]:
    """The cells of a percent-format source, read by jupytext. The comment block before the first
    ``# %%`` is the file's header, not a cell."""
    import jupytext

    cells = list(jupytext.reads(text, fmt="py:percent").cells)
    if cells and not text.lstrip().startswith("# %%"):
        cells = cells[1:]
    out = []
    for c in cells:
        lines = c.source.splitlines()
        head = next((l for l in lines if re.match(r"# #{1,6} \S", l)), None) if c.cell_type == "code" else None
        if head is not None:  # prose left in a code cell
            raise ValueError(f"a code cell holds the markdown heading {head!r}: a '# %% [markdown]' marker is missing")
        out.append({"type": c.cell_type, "tags": list(c.metadata.get("tags", [])), "lines": lines})
    return out


def variant(lines: list[str], solution: bool) -> list[str]:
    out, state = [], None  # None | "sol" | "stu"
    for line in lines:
        s = line.strip()
        if s == "### BEGIN SOLUTION":
            state = "sol"
            continue
        if s == "### STUDENT":
            state = "stu"
            continue
        if s == "### END SOLUTION":
            state = None
            continue
        if state is None or (state == "sol") == solution:
            out.append(line)
    return out


def build_one(src: Path, solution: bool) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    seen = collections.Counter()
    rel = target(src, solution).relative_to(ROOT).as_posix()
    head = [{"type": "markdown", "tags": [], "lines": [f"[![Open In Colab]({BADGE})]({COLAB.format(repo=REPO, path=rel)})"]},
            {"type": "code", "tags": ["setup"], "lines": SETUP.splitlines()}]
    for c in head + parse(src.read_text()):
        text = "\n".join(variant(c["lines"], solution))
        if c["type"] == "markdown":
            if solution:   # a link to a neighbour lesson: the lesson, one folder up from solutions/
                text = SIBLING.sub(r"](../\1", text)
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell(text)
        # a cell's id follows from its text (nbformat's are random): rebuilding leaves unchanged cells as they were
        seen[(c["type"], text)] += 1
        cell.id = hashlib.sha1(f"{c['type']}\0{text}\0{seen[(c['type'], text)]}".encode()).hexdigest()[:8]
        tags = list(c["tags"])
        if not solution and c["type"] == "code" and any(l.strip() == "### STUDENT" for l in c["lines"]):
            tags.append(_nbclean().EXERCISE_TAG)   # the student's starting point: nbclean clears its outputs
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


SIBLING = re.compile(r"\]\((\d\d_\w+\.ipynb)")


def target(src: Path, solution: bool) -> Path:
    return SOL / f"{src.stem}_SOLUTION.ipynb" if solution else OUT / f"{src.stem}.ipynb"


def keep_outputs(new: nbformat.NotebookNode, path: Path) -> None:
    if not path.exists():
        return
    old = nbformat.read(path, as_version=4)
    by_source = {}
    for c in old.cells:
        if c.cell_type == "code":
            by_source.setdefault(c.source, c)
    for c in new.cells:
        if c.cell_type == "code" and c.source in by_source:
            o = by_source[c.source]
            c.outputs, c.execution_count = o.outputs, o.execution_count
            if "execution" in o.metadata:   # when the cell ran (nbclient): kept with its outputs
                c.metadata["execution"] = o.metadata["execution"]
    for key in ("nf4lab", "language_info"):   # language_info: what the executing kernel reported
        if key in old.metadata:
            new.metadata[key] = old.metadata[key]
    nbc = _nbclean()
    # A valid record carries over to the current hash when what that hash covers is unchanged (a new
    # version that leaves something out, such as link targets): the outputs still come from these cells.
    if nbc.has_outputs(old) and nbc.stale(old) is None and nbc.code_hash(old) == nbc.code_hash(new):
        nbc.record(new)
    nbc.clean(new)


def code_of(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if any notebook differs from its source")
    ap.add_argument("names", nargs="*", help="source stems to build (default: all)")
    args = ap.parse_args(argv)
    SOL.mkdir(parents=True, exist_ok=True)
    stale, old_outputs = [], []
    for src in sorted(SRC.glob("[0-9][0-9]_*.py")):
        if args.names and src.stem not in args.names:
            continue
        for solution in (False, True):
            nb, path = build_one(src, solution), target(src, solution)
            if args.check:
                if not path.exists() or code_of(nbformat.read(path, as_version=4)) != code_of(nb):
                    stale.append(str(path.relative_to(ROOT)))
                continue
            keep_outputs(nb, path)
            nbformat.write(nb, path)
            if _nbclean().stale(nb):
                old_outputs.append(str(path.relative_to(ROOT)))
    if stale:
        print("out of date (run python tools/build_notebooks.py):\n  " + "\n  ".join(stale))
        return 1
    if old_outputs:
        # Written, but its outputs came from other code: a GPU run must execute it again.
        print("outputs from before a code change (run python -m nf4lab notebooks on a GPU):\n  "
              + "\n  ".join(old_outputs))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
