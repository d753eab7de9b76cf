"""What a result record measured, and whether two records may be compared.

Every run's meta says which run it was (``run``), on which GPU, with which versions and through which
code path (``code_path``: ``native``, or the architecture ``NF4LAB_ARCH`` capped it at); every kernel
record says which source it timed (``source_sha256``). A printed comparison of two records goes through
:func:`compare`, which gives the ratio only when the two are comparable and otherwise says plainly what
differs:

- a timing ratio (x faster, +% time, % of a bound) compares records of ONE run: the same process, or
  processes that an orchestrating script gave one ``NF4LAB_RUN_ID``;
- a comparison about one thing (``about="code_path"``, a dtype, a launch shape) also holds everything
  else equal: the GPU, the driver, the versions and the kernel's source.
"""
from __future__ import annotations

import hashlib
import inspect
import os
import uuid

from .. import config

#: This process's run: one id for every record it writes, unless NF4LAB_RUN_ID joins several processes.
RUN_ID = config.run_id() or uuid.uuid4().hex[:12]

#: What must be equal besides the run for a comparison about one thing.
SAME_SETUP = ("gpu", "driver", "numba_cuda", "torch", "bitsandbytes", "code_path")


def code_path() -> str:
    """``native``, or the architecture NF4LAB_ARCH caps the code paths at (e.g. ``sm_75``)."""
    return config.arch() or "native"


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        code = getattr(obj, "__code__", None)
        return repr(code.co_code + repr(code.co_consts).encode()) if code is not None else repr(obj)


def source_hash(fn) -> str:
    """SHA-256 (16 hex digits) of what ``fn`` runs: its source and that of the kernels and device functions
    it names (numba dispatchers, found through its globals, one level deep). Notebook cells count: IPython
    keeps their source where ``inspect`` finds it."""
    fn = getattr(fn, "__wrapped__", fn)
    parts = [_source(fn)]
    code = getattr(fn, "__code__", None)
    glb = getattr(fn, "__globals__", {})
    for name in sorted(set(code.co_names) if code is not None else ()):
        obj = glb.get(name)
        py = getattr(obj, "py_func", None)   # a numba Dispatcher: the kernel's Python source
        if py is not None:
            parts.append(_source(py))
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def module_hash(*modules) -> str:
    """SHA-256 (16 hex digits) of the source files of ``modules`` (a shipped kernel and its launcher)."""
    h = hashlib.sha256()
    for m in modules:
        h.update(_source(m).encode() + b"\x00")
    return h.hexdigest()[:16]


def _when(meta: dict) -> str:
    return f"recorded {meta.get('date') or 'on an unknown date'} on {meta.get('gpu') or 'an unknown GPU'}"


def why_not_comparable(meta_a: dict, rec_a: dict, meta_b: dict, rec_b: dict, about: str | None = None) -> str | None:
    """None if the two records may be compared, else what differs, in words a reader can act on."""
    if not meta_a.get("run") or not meta_b.get("run"):
        old = meta_a if not meta_a.get("run") else meta_b
        return f"{_when(old)}, before records named their run: not compared"
    if meta_a["run"] != meta_b["run"]:
        return f"{_when(meta_b)} in another run than {_when(meta_a)[9:]}: not compared"
    if about is None:
        return None
    differ = [k for k in SAME_SETUP if k != about and meta_a.get(k) != meta_b.get(k)]
    sa, sb = rec_a.get("source_sha256"), rec_b.get("source_sha256")
    if about != "source_sha256" and sa and sb and sa != sb:
        differ.append("kernel source")
    if differ:
        return f"not only the {about} differs ({', '.join(differ)} too): not compared"
    return None


def compare(meta_a: dict, rec_a: dict, meta_b: dict, rec_b: dict, *, about: str | None = None,
            key: str = "ms") -> tuple[float | None, str]:
    """(b[key] / a[key], "1.23x") when comparable, else (None, the reason). For times, >1 means a is faster."""
    why = why_not_comparable(meta_a, rec_a, meta_b, rec_b, about)
    if why is not None:
        return None, why
    a, b = rec_a.get(key), rec_b.get(key)
    if not a or not b:
        return None, f"no {key} in one of the records: not compared"
    return b / a, f"{b / a:.2f}x"
