"""nf4lab.install(): bitsandbytes' 4-bit CUDA ops on nf4lab's kernels; 4-bit models compileable for decode.

Public API, at the package top level (this module is ``nf4lab.integrations.bnb_backend``: a module named
``install`` would be shadowed by the function)::

    nf4lab.install(compile=False) -> bool     # True when nf4lab's kernels now serve bitsandbytes on CUDA
    nf4lab.uninstall() -> None                # bitsandbytes exactly as it was (its own registrations back)
    nf4lab.installed() -> bool
    with nf4lab.installed_in():               # install() for the block, uninstall() after (if it installed)
        ...
    nf4lab.compile_for_decode(model) -> model  # install(), then make a transformers bnb-4bit model compileable
                                               # for decode, with cheap guards (see its docstring)

What install() changes: it registers nf4lab's implementation as the CUDA kernel of three of
bitsandbytes' own torch ops (``bitsandbytes::dequantize_4bit``, ``bitsandbytes::dequantize_4bit.out``
and ``bitsandbytes::gemm_4bit``), through a ``torch.library.Library`` it owns. Everything above the
ops is untouched: ``bitsandbytes.functional.dequantize_4bit``, ``Linear4bit`` forward and
backward, ``Params4bit`` dequantization and ``matmul_4bit`` all reach nf4lab through the
dispatcher, in eager mode and under ``torch.compile`` (the ops' fake implementations are
bitsandbytes' own, so tracing is unchanged). uninstall() destroys that Library: the dispatcher
then serves bitsandbytes' registrations again, unchanged.

What nf4lab does not handle falls through to bitsandbytes' own CUDA implementation inside the
op (see :func:`_dequantize_handles` and :func:`_gemm_handles`), never to a different answer:
CPU tensors are never touched (the CUDA key only), and without a GPU install() does nothing.
"""
from __future__ import annotations

import contextlib
import threading
import warnings

from ..kernels import dequant as _dq
from ..kernels import qweight as _qw

__all__ = ["install", "uninstall", "installed", "installed_in", "compile_for_decode", "prepare_for_compile"]

_lock = threading.RLock()
_state = {"lib": None, "ops": (), "held": set(), "quantizers": []}  # the Library we own, what it serves, patched quantizers
# Calls our registered kernels took ("nf4lab") and handed to bitsandbytes ("bitsandbytes"), per op:
# the GPU test run reports them, so that "all passed" cannot hide "nf4lab never ran".
calls: dict = {}


def _count(op: str, who: str) -> None:
    key = (op, who)
    calls[key] = calls.get(key, 0) + 1


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------- which calls nf4lab takes
def _dequantize_handles(A, absmax, blocksize, quant_type, shape, dtype, out=None) -> bool:
    """The rules every nf4lab entry point applies (:func:`nf4lab.kernels.qweight.problem`), checked without
    launching; False sends the call to bitsandbytes (other quant_storage dtypes, non-contiguous or short
    tensors, other devices). Not kept per weight: bitsandbytes' Python hands this op a fresh absmax for
    nested statistics at every call."""
    return _qw.problem(A, shape, blocksize, quant_type, absmax, dtype=dtype, out=out, nested=False) is None


def _run_checked(A, absmax, blocksize, quant_type, shape, dtype, out):
    got = None
    if A.device.type == "cuda":
        got = _dq.dequantize_plain_fast(A, absmax, blocksize, quant_type, shape, dtype, out)
    if got is not None:
        return got
    return _dq.run(_dq.plan_checked(A, absmax, blocksize, quant_type, shape, dtype), out)


def _gemm_takes(absmax_8bit, absmax_code, absmax_offset, quant_type, bias, A) -> bool:
    """The op-level conditions; :func:`nf4lab.integrations.torch_ops.gemv_call` checks the tensors."""
    if absmax_8bit is None or absmax_code is None or absmax_offset is None or quant_type != "nf4":
        return False
    return bias is None or (bias.dtype == A.dtype and bias.device == A.device)


# ---------------------------------------------------------------- the kernels registered for CUDA
def _make_kernels(fallback):
    """Our implementations of bitsandbytes' ops; ``fallback[name]`` is bitsandbytes' own."""
    from . import torch_ops

    def dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype):
        if not _dequantize_handles(A, absmax, blocksize, quant_type, shape, dtype):
            _count("dequantize_4bit", "bitsandbytes")
            return fallback["dequantize_4bit"](A, absmax, blocksize, quant_type, shape, dtype)
        _count("dequantize_4bit", "nf4lab")
        return _run_checked(A, absmax, blocksize, quant_type, shape, dtype, None)

    def dequantize_4bit_out(A, absmax, blocksize, quant_type, shape, dtype, out):
        if not _dequantize_handles(A, absmax, blocksize, quant_type, shape, dtype, out):
            _count("dequantize_4bit.out", "bitsandbytes")
            return fallback["dequantize_4bit.out"](A, absmax, blocksize, quant_type, shape, dtype, out)
        _count("dequantize_4bit.out", "nf4lab")
        _run_checked(A, absmax, blocksize, quant_type, shape, dtype, out)

    def gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None,
                  absmax_offset=None):
        out = None
        if _gemm_takes(absmax_8bit, absmax_code, absmax_offset, quant_type, bias, A):
            # bitsandbytes' gemm_4bit passes the nested group scales as ``absmax`` and the codes as absmax_8bit.
            out = torch_ops.gemv_call(A, B, shapeB, absmax_8bit, absmax, absmax_code, absmax_offset, blocksize)
        if out is not None:
            _count("gemm_4bit", "nf4lab")
            if bias is not None:
                out.add_(bias)
            return out
        # Where bitsandbytes itself would dequantize and call F.linear (a training step's M = 1024, say),
        # nf4lab dequantizes instead: the same bits, one kernel for nested statistics instead of three.
        if fallback["gemm_4bit_dequantizes"](A, shapeB, blocksize):
            out = torch_ops.dequant_linear(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit,
                                           absmax_code, absmax_offset)
            if out is not None:
                _count("gemm_4bit", "nf4lab dequantize + linear")
                return out
        _count("gemm_4bit", "bitsandbytes")
        return fallback["gemm_4bit"](A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit,
                                     absmax_code, absmax_offset)

    return {"dequantize_4bit": dequantize_4bit, "dequantize_4bit.out": dequantize_4bit_out, "gemm_4bit": gemm_4bit}


def _bnb_cuda_fallbacks():
    """bitsandbytes 0.50.2's CUDA implementations, called by name (its registered kernels are all
    named ``_``): what our kernels hand a call they do not take. KeyError-free: missing names raise
    here, at install(), and then nothing is installed."""
    from bitsandbytes.backends.cuda import ops as c

    torch = _torch()

    def dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype):
        out = torch.empty(shape, dtype=dtype, device=A.device)
        c._dequantize_4bit_impl(A, absmax, blocksize, quant_type, dtype, out=out)
        return out

    def dequantize_4bit_out(A, absmax, blocksize, quant_type, shape, dtype, out):
        if out.shape != tuple(shape):
            raise ValueError(f"Expected out.shape == {shape}, got {out.shape}")
        if out.dtype != dtype:
            raise ValueError(f"Expected out.dtype == {dtype}, got {out.dtype}")
        c._dequantize_4bit_impl(A, absmax, blocksize, quant_type, dtype, out=out)

    names = ("_dequantize_4bit_impl", "_gemm_4bit_custom_max_m", "_gemm_4bit_use_custom_fn",
             "_dequant_linear_fallback", "_gemm_4bit_kernel_impl")
    missing = [n for n in names if not hasattr(c, n)]
    if missing:
        raise RuntimeError(f"bitsandbytes.backends.cuda.ops lacks {missing}: this bitsandbytes release is not "
                           "the one nf4lab.install was written for (0.50.2)")

    def gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None,
                  absmax_offset=None):
        # bitsandbytes 0.50.2's registered gemm_4bit CUDA kernel, statement for statement.
        K = A.shape[-1]
        M = A.numel() // K
        N = shapeB[0]
        if M > c._gemm_4bit_custom_max_m:
            use_custom = False
        elif K % blocksize != 0:
            warnings.warn(f"inner dimension ({K}) is not aligned for fast kernel with blocksize={blocksize}, "
                          "falling back to slower implementation.", UserWarning)
            use_custom = False
        else:
            use_custom = c._gemm_4bit_use_custom_fn(A.device.index, A.dtype, M, N, K)
        if not use_custom:
            return c._dequant_linear_fallback(A, B, shapeB, absmax, blocksize, quant_type, bias,
                                              absmax_8bit=absmax_8bit, absmax_code=absmax_code,
                                              absmax_offset=absmax_offset)
        return c._gemm_4bit_kernel_impl(A, B, shapeB, absmax, blocksize, quant_type, bias, absmax_8bit,
                                        absmax_code, absmax_offset)

    def gemm_4bit_dequantizes(A, shapeB, blocksize):
        """Whether bitsandbytes' gemm_4bit would take its dequantize + F.linear fallback without a warning."""
        K = A.shape[-1]
        M = A.numel() // K
        if M > c._gemm_4bit_custom_max_m:
            return True
        return K % blocksize == 0 and not c._gemm_4bit_use_custom_fn(A.device.index, A.dtype, M, shapeB[0], K)

    return {"dequantize_4bit": dequantize_4bit, "dequantize_4bit.out": dequantize_4bit_out, "gemm_4bit": gemm_4bit,
            "gemm_4bit_dequantizes": gemm_4bit_dequantizes}


def _register(dispatch_key: str, fallback, ops) -> None:
    """Register our kernels for ``ops`` under ``dispatch_key`` in a Library we own (tests use the CPU key)."""
    torch = _torch()
    import bitsandbytes  # noqa: F401  (defines the ops and registers its own kernels first)

    kernels = _make_kernels(fallback)
    lib = torch.library.Library("bitsandbytes", "IMPL")
    # bitsandbytes registers its kernels from Python (torch.library.register_kernel), and torch keeps
    # a set of such registrations. torch 2.11's Library.impl refuses a key in that set unless told
    # allow_override=True (newer torch allows it by default); the dispatcher itself stacks the two
    # registrations, so destroying ours serves bitsandbytes' again. Destroying ours also drops the
    # key from torch's set, though, so the keys bitsandbytes held are put back at uninstall().
    keys = {f"bitsandbytes/{name}/{dispatch_key}" for name in ops}
    held = keys & torch.library._impls
    try:
        with warnings.catch_warnings():
            # Overriding bitsandbytes' registration is the point; torch warns about it each time.
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            kw = _override_kw(lib)
            if not kw:  # a torch without the flag checks the set only: step past it
                torch.library._impls.difference_update(held)
            for name in ops:
                lib.impl(name, kernels[name], dispatch_key, **kw)
    except Exception:
        _release(lib, held)
        raise
    _state["lib"], _state["ops"], _state["held"] = lib, tuple(ops), held


def _release(lib, held) -> None:
    """Destroy our Library and leave torch's set of Python registrations holding bitsandbytes' keys.
    Both _destroy() and the Library's finalizer (when it is collected) remove the keys in its
    _op_impls from that set: keep bitsandbytes' out of ours, then put them back."""
    lib._op_impls.difference_update(held)
    lib._destroy()
    _torch().library._impls.update(held)


def _override_kw(lib) -> dict:
    import inspect

    return {"allow_override": True} if "allow_override" in inspect.signature(lib.impl).parameters else {}


# ---------------------------------------------------------------- public API
def install(compile: bool = False) -> bool:
    """Serve bitsandbytes' 4-bit CUDA ops with nf4lab's kernels; returns whether they are now installed.

    Harmless twice. Without a usable CUDA GPU (or in numba's simulator) it changes nothing and
    returns False. ``compile`` is accepted for symmetry with :func:`compile_for_decode` and must
    be a bool. The GEMV (``bitsandbytes::gemm_4bit``, M = 1..8) is served by
    :func:`nf4lab.integrations.torch_ops.gemv_call` where it applies, else by bitsandbytes.
    """
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be a bool, got {type(compile).__name__}")
    with _lock:
        if _state["lib"] is not None:
            return True
        from .. import runtime

        torch = _torch()
        if runtime.SIMULATOR or not torch.cuda.is_available():
            return False
        _register("CUDA", _bnb_cuda_fallbacks(), ["dequantize_4bit", "dequantize_4bit.out", "gemm_4bit"])
        return True


def uninstall() -> None:
    """bitsandbytes exactly as before install(): our Library is destroyed, so the dispatcher serves
    bitsandbytes' own registrations again; quantizers marked by compile_for_decode are unmarked. Models keep
    compile_for_decode's lean Linear4bit forward (it calls bitsandbytes' own op, served by bitsandbytes again):
    ``nf4lab.integrations.lean_linear.restore(model)`` gives their layers back their classes."""
    with _lock:
        lib = _state["lib"]
        if lib is not None:
            _release(lib, _state["held"])
        _state["lib"], _state["ops"], _state["held"] = None, (), set()
        for q, cls in _state["quantizers"]:
            q.__class__ = cls
        _state["quantizers"] = []


def installed() -> bool:
    return _state["lib"] is not None


@contextlib.contextmanager
def installed_in(compile: bool = False):
    """``with nf4lab.installed_in(): ...``: installed for the block; uninstalled after, unless it
    was installed before the block (then left as it was)."""
    before = installed()
    ok = install(compile=compile)
    try:
        yield ok
    finally:
        if not before:
            uninstall()


def compile_for_decode(model):
    """install(), then let transformers compile a bitsandbytes-4bit model's decode step, with cheap guards.

    Three changes, nothing else in transformers or bitsandbytes:

    1. transformers' ``generate`` compiles the forward pass (with a static cache) only when the model's
       quantizer says ``is_compileable``; its bitsandbytes 4-bit quantizer says False. The class of that one
       quantizer object becomes a subclass whose ``is_compileable`` is True (uninstall() puts it back).
       Sound because every 4-bit step of the forward is a registered torch op with a fake implementation
       (bitsandbytes' own ``gemm_4bit``/``dequantize_4bit``/``dequantize_blockwise``), with nf4lab's
       kernels (or bitsandbytes') inside the op, so dynamo traces no pointer arithmetic.
    2. Each ``Linear4bit`` gets the lean forward of :mod:`nf4lab.integrations.lean_linear`: the same op call on
       the same tensors, read from a snapshot in the module instead of through ``weight.quant_state``, so
       that dynamo does not re-check five tensors and two Python objects per layer at every decode step
       (lab/guard_cost.py: 2.3 us of guards a layer on the H100's host against 0.15 with this forward and step
       3, 224 layers in an 8B model). Where that forward does not
       mirror bitsandbytes' (gradients, CPU repacking, ...) it calls bitsandbytes' forward. uninstall() does
       not touch models; ``nf4lab.integrations.lean_linear.restore(model)`` does.
    3. ``torch._dynamo.config.use_recursive_dict_tags_for_guards = True`` (process-wide; torch's own flag,
       off by default): dynamo checks a module whose guards are all on its own attributes by the version tags
       of its dicts instead of guard by guard. It then does not see a tensor's metadata changed in place
       (``p.data = other``) under a module that was not reassigned; decoding does not do that.

    Returns the model. Raises TypeError for a model without a bitsandbytes 4-bit quantizer; without a GPU
    (install() returns False) the model is returned unchanged.
    """
    q = getattr(model, "hf_quantizer", None)
    cfg = getattr(q, "quantization_config", None)
    if q is None or not getattr(cfg, "load_in_4bit", False):
        raise TypeError(f"model must be a transformers model loaded with a bitsandbytes 4-bit quantization_config, "
                        f"got {type(model).__name__} with quantizer {type(q).__name__}")
    if install(compile=True):  # without a GPU nothing is nf4lab-backed: the model is left as it is
        _mark_compileable(q)
        prepare_for_compile(model)
    return model


def prepare_for_compile(model) -> int:
    """Steps 2 and 3 of :func:`compile_for_decode` alone (no install, no quantizer change): the lean
    Linear4bit forward and dynamo's dict-tag guards. Returns how many Linear4bit modules were prepared."""
    from . import lean_linear

    _torch()._dynamo.config.use_recursive_dict_tags_for_guards = True
    return lean_linear.prepare(model)


def _mark_compileable(q) -> None:
    with _lock:
        if not getattr(type(q), "_nf4lab_compileable", False):
            cls = type(q)
            q.__class__ = type(f"NF4Lab{cls.__name__}", (cls,),
                               {"is_compileable": property(lambda self: True), "_nf4lab_compileable": True})
            _state["quantizers"].append((q, cls))
