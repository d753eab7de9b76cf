"""Load the kernels of the step notebooks, so that one process can run them side by side.

A step notebook marks the cells that define its kernels with the tag ``kernel``;
together they define ``VERSIONS``, a dict from version name to ``launch(b)``.
The summary notebook, ``python -m nf4lab bench``, the profiler (nf4lab.measure.profiling), the GPU tools
and the lab execute those cells (and only those) through :func:`load_module` / :func:`load`: the
one way a notebook's kernels are reused, with no edit of their source.

:func:`run_cell` is the one ``exec`` of nf4lab: ``python -m nf4lab ptx --all`` runs a notebook source's code
cells through it too, as they are, to see which kernels they launch.
"""
from __future__ import annotations

import json
import linecache
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def kernel_cells(path: Path) -> list[str]:
    """Sources of the cells tagged "kernel" (plain JSON: GPU images may lack nbformat)."""
    nb = json.loads(Path(path).read_text())
    out = []
    for c in nb.get("cells", []):
        if c.get("cell_type") == "code" and "kernel" in c.get("metadata", {}).get("tags", []):
            src = c.get("source", "")
            out.append("".join(src) if isinstance(src, list) else src)
    return out


def load_module(notebook: str | Path, srcdir: Path | None = None) -> types.ModuleType:
    """The kernel cells of one notebook (a stem like '03_packed_u32' or a path), run as a fresh module:
    its kernels, launch functions, constants and ``VERSIONS``. With ``srcdir`` each cell is compiled
    from a real file there, so that line info (the profiler's source view) points at text."""
    path = Path(notebook)
    if not path.suffix:
        path = NOTEBOOKS / f"{notebook}.ipynb"
    mod = types.ModuleType(f"nf4lab_nb_{path.stem}")
    mod.__file__ = str(path)
    if srcdir is not None:
        srcdir.mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(kernel_cells(path)):
        filename = f"<{path.name} kernel cell {i}>"
        # as IPython does for a cell: inspect.getsource then finds the text, so a kernel loaded here hashes
        # (provenance.source_hash) as it did in its own notebook, not by its bytecode
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        if srcdir is not None:
            f = srcdir / f"{path.stem}_cell{i}.py"
            f.write_text(src)
            filename = str(f)
        run_cell(src, filename, mod.__dict__)
    return mod


def run_cell(src: str, filename: str, namespace: dict) -> None:
    """Run one notebook cell's source, unedited, in ``namespace`` (``filename`` names it in tracebacks)."""
    exec(compile(src, filename, "exec"), namespace)


def load(notebook: str | Path) -> dict:
    """VERSIONS of one notebook (a stem like '03_packed_u32' or a path)."""
    return dict(getattr(load_module(notebook), "VERSIONS", {}))


def load_all(upto: int = 6) -> dict:
    """VERSIONS of every step notebook 01..upto, in order."""
    out = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        n = int(path.name[:2])
        if 1 <= n <= upto:
            out.update(load(path))
    return out
