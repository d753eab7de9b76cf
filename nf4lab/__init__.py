"""nf4lab: NF4 dequantization with numba.cuda, step by step, bit-exact with bitsandbytes.

Importing nf4lab decides once whether kernels run on a CUDA GPU or in numba's simulator
(see :mod:`nf4lab.runtime`); import it before ``numba.cuda``.

The package is layered; each layer imports only from the layers below it (the import-linter
contract in pyproject.toml keeps it so; docs/DEVELOPING.md draws it):

    lesson        what only the notebooks' story needs: exercises (check), plots, the helpers students wrote
    measure       timing, results, profiles, PTX of every kernel, the model benchmark
    harness       cases, buffers, verification, the notebook-kernel loader, the GEMV's check
    integrations  torch custom ops, the bitsandbytes backend (install), the lean Linear4bit, nf4lab.dequantize
    kernels       the shipped kernels and their launcher: dequantization, the fused GEMV
    device        device operations with plain-Python twins for the simulator
    format        the NF4/FP4 format, its numpy reference and byte model (no other nf4lab import)
    runtime       GPU or simulator; arch: the target architecture; config: the environment variables

This module is the public API: the names below, imported from where they live. Modules that need
torch or bitsandbytes import them inside the functions that use them, so ``import nf4lab`` stays light.
"""
from . import runtime  # first: it may switch numba to the simulator
from .runtime import MODE, ON_GPU, SIMULATOR, default_shape, describe, device_info
from .format.bytemodel import bytes_moved
from .harness.buffers import Buffers, make_buffers, run_and_verify, verify_versions
from .harness.cases import Case, edge_shapes, make_case
from .harness.verification import VerificationError, compare, verify
from .integrations.bnb_backend import compile_for_decode, install, installed, installed_in, uninstall
from .integrations.dequantize import dequantize
from .lesson.exercises import check
from .measure.ptx import compile_ptx

__version__ = "0.1.0"

__all__ = [
    "MODE", "ON_GPU", "SIMULATOR", "default_shape", "describe", "device_info",
    "bytes_moved", "Buffers", "make_buffers", "run_and_verify", "verify_versions",
    "Case", "edge_shapes", "make_case", "VerificationError", "compare", "verify",
    "compile_for_decode", "install", "installed", "installed_in", "uninstall", "dequantize",
    "check", "compile_ptx",
]

import warnings as _warnings  # noqa: E402

# Without ipywidgets, tqdm.auto falls back to text bars (fine in notebooks and on GitHub) but
# warns once per kernel; the warning says nothing a student needs.
_warnings.filterwarnings("ignore", message="IProgress not found")
