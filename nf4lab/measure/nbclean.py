"""What an executed notebook keeps: the results a reader should see, not the noise of the run.

An execution leaves behind things no reader wants in a committed notebook: ANSI colour codes
(numba colours its messages), progress-bar frames separated by ``\\r`` (tqdm's text bars),
progress widgets (tqdm in JupyterLab), and Python warnings on stderr. :func:`clean` removes them
from a notebook in place and returns what it removed, so the runner can print the warnings
instead of losing them. :func:`problems` lists what is left; the tests fail on any.
"""
from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# "path.py:12: SomeWarning: text" and the source line Python prints under it.
WARNING = re.compile(r"^.*:\d+: \w*Warning: .*$")
WIDGET = "application/vnd.jupyter.widget-view+json"


def _final_frames(text: str) -> str:
    """Each line as a terminal would show it at the end: what follows its last carriage return."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def _drop_warnings(text: str, removed: list) -> str:
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        if WARNING.match(lines[i]):
            removed.append(lines[i])
            i += 1
            # the indented source line (and a bare "warnings.warn(" line) Python prints under it
            while i < len(lines) and lines[i].startswith("  "):
                i += 1
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _is_progress(text: str) -> bool:
    """A tqdm bar's last frame, e.g. 'notebooks: 100%|#####| 9/9 [00:12<00:00, 1.3s/it]'."""
    return bool(re.search(r"\d+%\|.*\| *\d+/\d+ \[", text))


EXERCISE_TAG = "exercise"   # a lesson's exercise cell (tools/build_notebooks.py tags it): committed without outputs


def clean(nb) -> list[str]:
    """Strip ANSI codes, \\r frames, progress bars and warnings from ``nb``'s outputs, in place.

    Cells tagged ``exercise`` (a lesson's starting points, tools/build_notebooks.py) lose their outputs: what
    the starting point prints is the answer its exercise asks the student to predict; the solution notebook
    keeps them.

    Returns the warning lines that were removed (the caller shows them where the run is watched).
    """
    removed: list[str] = []
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        if EXERCISE_TAG in cell.get("metadata", {}).get("tags", []):
            cell["outputs"], cell["execution_count"] = [], None
            cell["metadata"].pop("execution", None)
            continue
        kept = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                text = ANSI.sub("", o.get("text", ""))
                text = _final_frames(text)
                text = _drop_warnings(text, removed)
                text = "\n".join(line for line in text.split("\n") if not _is_progress(line))
                if not text.strip():
                    continue
                o["text"] = text
            elif o.get("output_type") in ("display_data", "execute_result"):
                data = o.get("data", {})
                if WIDGET in data:          # a progress widget: it showed while running, that was its job
                    continue
                if "text/plain" in data:
                    data["text/plain"] = ANSI.sub("", data["text/plain"])
            elif o.get("output_type") == "error":
                o["traceback"] = [ANSI.sub("", t) for t in o.get("traceback", [])]
            kept.append(o)
        cell["outputs"] = kept
    nb.metadata.pop("widgets", None)
    return removed


def _texts(nb):
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                yield i, o.get("text", "")
            elif "data" in o and "text/plain" in o["data"]:
                yield i, o["data"]["text/plain"]
            elif o.get("output_type") == "error":
                yield i, "\n".join(o.get("traceback", []))


def problems(nb) -> list[str]:
    """What a committed notebook must not show: ANSI, \\r frames, warnings, widgets, a table twice."""
    found = []
    tables: dict[str, int] = {}
    for i, text in _texts(nb):
        if ANSI.search(text) or "\x1b" in text:
            found.append(f"cell {i}: ANSI escape codes")
        if "\r" in text:
            found.append(f"cell {i}: carriage-return frames (a progress bar)")
        for line in text.split("\n"):
            if WARNING.match(line):
                found.append(f"cell {i}: a warning: {line.strip()[:120]}")
            elif _is_progress(line):
                found.append(f"cell {i}: a progress bar: {line.strip()[:80]}")
        # a table: three or more lines in a row that look like rows (separated columns)
        lines = [ln for ln in text.split("\n") if ln.strip()]
        if len(lines) >= 3:
            body = "\n".join(lines)
            if body in tables:
                found.append(f"cell {i}: the same {len(lines)}-line output as cell {tables[body]}")
            tables.setdefault(body, i)
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if WIDGET in o.get("data", {}):
                found.append(f"cell {i}: a progress widget")
    return found


# ---------------------------------------------------------------- stale outputs
#: What a run's record hashes. 1: the code cells. 2: also the markdown cells that contain a number
#: (prose that states a result must change with it) and the kernel cells of the notebooks the code
#: loads through nf4lab's loader (07 and 08 run 01-06's kernels: their outputs go stale with them).
#: 3: as 2, without the targets of markdown links (a file name's digits state no result).
HASH_VERSION = 3
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
# The calls that run other notebooks' kernel cells: nf4lab's loader, and the profiler's step_versions (01-06).
_LOADS = re.compile(r"""\b(?:versions\.(?:load_all|load|load_module)|profiling\.step_versions)"""
                    r"""\(\s*(?:(?:upto|last)\s*=\s*(\d+)|["'](\d\d_\w+)["'])?""")


def loaded_notebooks(nb) -> list[str]:
    """Stems of the notebooks whose kernel cells ``nb``'s code runs (nf4lab's loader, the profiler)."""
    from ..harness.versions import NOTEBOOKS

    stems = set()
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        for m in _LOADS.finditer(c.source):
            if m.group(2):
                stems.add(m.group(2))
            elif "load_all" in m.group(0) or "step_versions" in m.group(0):
                upto = int(m.group(1) or 6)
                stems.update(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if 1 <= int(p.stem[:2]) <= upto)
    return sorted(stems)


def code_hash(nb, version: int = HASH_VERSION) -> str:
    """SHA-256 of what a run's outputs come from: every code cell's source, in order, except the cells
    tagged ``setup`` (the Colab/Kaggle install cell, which does nothing elsewhere); from version 2 also
    the markdown cells with a number in them and the kernel cells of the notebooks it loads; from version 3
    without link targets."""
    import hashlib

    h = hashlib.sha256()
    for c in nb.cells:
        if c.cell_type == "code" and "setup" not in c.get("metadata", {}).get("tags", []):
            h.update(c.source.encode() + b"\x00")
        elif version >= 2 and c.cell_type == "markdown":
            text = _LINK_TARGET.sub("]", c.source) if version >= 3 else c.source
            if re.search(r"\d", text):
                h.update(b"md\x00" + text.encode() + b"\x00")
    if version >= 2:
        from ..harness.versions import NOTEBOOKS, kernel_cells

        for stem in loaded_notebooks(nb):
            path = NOTEBOOKS / f"{stem}.ipynb"
            cells = kernel_cells(path) if path.exists() else ["<missing>"]
            h.update(f"nb {stem}\x00".encode() + "\x00".join(cells).encode() + b"\x00")
    return h.hexdigest()


def record(nb) -> None:
    """Note in ``nb``'s metadata what its outputs come from (after a run)."""
    md = nb.metadata.setdefault("nf4lab", {})
    md["code_sha256"] = code_hash(nb)
    md["hash_version"] = HASH_VERSION


def has_outputs(nb) -> bool:
    return any(c.cell_type == "code" and c.get("outputs") for c in nb.cells)


def stale(nb) -> str | None:
    """Why a notebook's outputs do not come from its cells as they are now, or None.

    A run records :func:`code_hash` in ``metadata.nf4lab.code_sha256`` (with ``hash_version``; records
    without it hash the code cells only); outputs with no record, or with a record of other cells or other
    loaded kernels, are stale: something changed after the run that produced them."""
    if not has_outputs(nb):
        return None
    md = nb.metadata.get("nf4lab", {})
    recorded = md.get("code_sha256")
    if recorded is None:
        return "outputs without a record of the code that produced them (execute it: python -m nf4lab notebooks)"
    if recorded != code_hash(nb, md.get("hash_version", 1)):
        what = ("a code cell, a markdown cell with a number, or a loaded notebook's kernel"
                if md.get("hash_version", 1) >= 2 else "a code cell")
        return f"{what} changed after the run whose outputs it shows (execute it again)"
    return None
