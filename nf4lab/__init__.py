"""nf4lab: NF4 dequantization with numba.cuda, step by step, bit-exact with bitsandbytes.

Importing nf4lab decides once whether kernels run on a CUDA GPU or in numba's
simulator (see :mod:`nf4lab.runtime`); import it before ``numba.cuda``.

The package is grouped by role: ``nf4lab.lesson`` (what the notebooks use), ``nf4lab.kernels``
(the shipped kernels) and ``nf4lab.measure`` (timing, profiling, PTX, results).
"""
from . import runtime  # noqa: F401  (first: may switch numba to the simulator)
from .runtime import MODE, ON_GPU, SIMULATOR, default_shape, describe, device_info  # noqa: F401
from .kernels import arch  # noqa: F401,E402  (reads NF4LAB_ARCH now: a bad value fails at import, not at a launch)

__version__ = "0.1.0"

import warnings as _warnings

# Without ipywidgets, tqdm.auto falls back to text bars (fine in notebooks and on GitHub) but
# warns once per kernel; the warning says nothing a student needs.
_warnings.filterwarnings("ignore", message="IProgress not found")

# Everything else loads on first use, so that `import nf4lab` stays light and a
# helper module may import torch or bitsandbytes only when it is needed.
_LAZY = {
    "make_case": "lesson.cases", "Case": "lesson.cases", "edge_shapes": "lesson.cases",
    "verify": "lesson.verification", "compare": "lesson.verification",
    "VerificationError": "lesson.verification",
    "make_buffers": "lesson.buffers", "run_and_verify": "lesson.buffers", "verify_versions": "lesson.buffers",
    "Buffers": "lesson.buffers",
    "bytes_moved": "measure.bytemodel",
    "compile_ptx": "measure.ptx",
    "dequantize": "kernels.dequant",
    "check": "lesson.exercises",
    "install": "kernels.bnb_backend", "uninstall": "kernels.bnb_backend", "installed": "kernels.bnb_backend",
    "installed_in": "kernels.bnb_backend", "compile_for_decode": "kernels.bnb_backend",
}

# The flat names the notebooks use (`from nf4lab import ops`, `import nf4lab.gemv`,
# `from nf4lab.reference import NF`, `python -m nf4lab.profiling`): the package was flat when
# their outputs were recorded. Each flat name is the moved module itself, not a copy (numba's
# simulator patches module globals), registered in sys.modules and as a package attribute on
# first use. New code imports the role paths (nf4lab.kernels.ops, ...).
_FLAT = {
    "cases": "lesson", "reference": "lesson", "verification": "lesson", "buffers": "lesson",
    "exercises": "lesson", "versions": "lesson", "plots": "lesson",
    "dequant": "kernels", "fastkernel": "kernels", "ops": "kernels", "arch": "kernels", "gemv": "kernels",
    "torch_ops": "kernels", "bnb_backend": "kernels",
    "bench": "measure", "bytemodel": "measure", "results": "measure", "profiling": "measure",
    "ptx": "measure", "ptxall": "measure", "nbclean": "measure", "models": "measure",
}


class _FlatNames:
    """Import hook: ``nf4lab.<flat>`` resolves to ``nf4lab.<role>.<flat>`` (the same module object)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        pkg, _, leaf = fullname.rpartition(".")
        if pkg != __name__ or leaf not in _FLAT:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, _FlatNames)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        import importlib
        import sys

        _, _, leaf = module.__name__.rpartition(".")
        # The import system returns what sys.modules holds after exec_module: the moved module.
        sys.modules[module.__name__] = importlib.import_module(f"{__name__}.{_FLAT[leaf]}.{leaf}")

    @staticmethod
    def get_code(fullname):
        """For ``python -m nf4lab.<flat>``: run the moved module as __main__, in its own package."""
        _, _, leaf = fullname.rpartition(".")
        real = f"{__name__}.{_FLAT[leaf]}.{leaf}"
        return compile(f"import runpy; runpy.run_module({real!r}, run_name='__main__', alter_sys=True)",
                       f"<{fullname}: {real}>", "exec")


import sys as _sys  # noqa: E402

if not any(f is _FlatNames for f in _sys.meta_path):
    # First, so that no other finder (an editable install of another checkout, a stale flat file
    # of an older install) answers for a flat name; it answers for nothing else.
    _sys.meta_path.insert(0, _FlatNames)


def __getattr__(name):
    import importlib

    if name in _FLAT:  # nf4lab.ops and the like: the moved module (see _FLAT)
        return importlib.import_module(f".{name}", __name__)
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'nf4lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY) + list(_FLAT))
