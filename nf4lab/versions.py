"""Load the kernels of the step notebooks, so that one process can run them side by side.

A step notebook marks the cells that define its kernels with the tag ``kernel``;
together they define ``VERSIONS``, a dict from version name to ``launch(b)``.
The summary notebook and ``python -m nf4lab bench`` execute those cells (and only
those) of every notebook in order.
"""
from __future__ import annotations

import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def kernel_cells(path: Path) -> list[str]:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code" and "kernel" in c.metadata.get("tags", [])]


def load_module(notebook: str | Path) -> types.ModuleType:
    """The kernel cells of one notebook (a stem like '03_packed_u32' or a path), run as a fresh module:
    its kernels, launch functions, constants and ``VERSIONS``."""
    path = Path(notebook)
    if not path.suffix:
        path = NOTEBOOKS / f"{notebook}.ipynb"
    mod = types.ModuleType(f"nf4lab_nb_{path.stem}")
    mod.__file__ = str(path)
    for src in kernel_cells(path):
        exec(compile(src, f"<{path.name}>", "exec"), mod.__dict__)
    return mod


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
