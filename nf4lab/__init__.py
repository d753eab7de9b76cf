"""nf4lab: NF4 dequantization with numba.cuda, step by step, bit-exact with bitsandbytes.

Importing nf4lab decides once whether kernels run on a CUDA GPU or in numba's
simulator (see :mod:`nf4lab.runtime`); import it before ``numba.cuda``.
"""
from . import runtime  # noqa: F401  (first: may switch numba to the simulator)
from .runtime import MODE, ON_GPU, SIMULATOR, default_shape, describe, device_info  # noqa: F401
from . import arch  # noqa: F401,E402  (reads NF4LAB_ARCH now: a bad value fails at import, not at a launch)

__version__ = "0.1.0"

import warnings as _warnings

# Without ipywidgets, tqdm.auto falls back to text bars (fine in notebooks and on GitHub) but
# warns once per kernel; the warning says nothing a student needs.
_warnings.filterwarnings("ignore", message="IProgress not found")

# Everything else loads on first use, so that `import nf4lab` stays light and a
# helper module may import torch or bitsandbytes only when it is needed.
_LAZY = {
    "make_case": "cases", "Case": "cases", "edge_shapes": "cases",
    "verify": "verification", "compare": "verification", "VerificationError": "verification",
    "make_buffers": "buffers", "run_and_verify": "buffers", "verify_versions": "buffers", "Buffers": "buffers",
    "bytes_moved": "bytemodel",
    "compile_ptx": "ptx",
    "dequantize": "dequant",
    "check": "exercises",
    "install": "bnb_backend", "uninstall": "bnb_backend", "installed": "bnb_backend", "installed_in": "bnb_backend",
    "compile_for_decode": "bnb_backend",
}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'nf4lab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
