"""A 4-bit weight's tensors, checked once: the one statement of what nf4lab's kernels need of them.

Every entry point that is handed bitsandbytes' tensors of a quantized weight asks :func:`problem`:
``nf4lab.dequantize`` (through :func:`nf4lab.kernels.dequant.plan`, which raises what it finds),
install()'s ``bitsandbytes::dequantize_4bit`` and ``gemm_4bit`` and the torch ops (which hand a call
with a problem back to bitsandbytes). The answer is None or ``(exception type, one line naming the
parameter)``, found before anything is launched.

A weight that passed and is used again (a model's layers: the fused GEMV, dequantize + linear) is kept
as a :class:`QWeight` by :func:`checked`: later calls on the same tensors find it with identity checks
only (:func:`known`), so decoding a token checks each weight once, not at every call. What the kernels
prepare for a weight (its launch blocks) hangs on the record, and goes when the weight's statistics
tensor is freed.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from ..format import reference
from ..format.reference import BLOCKSIZES, QUANT_TYPES


class QWeight:
    """A checked weight: its tensors and what the kernels derive from them."""

    __slots__ = ("A", "shape", "shape_obj", "n", "nbytes", "blocksize", "bs_shift", "quant_type", "nested",
                 "nblocks", "gsize", "absmax", "absmax2", "code2", "offset", "version", "device", "device_index",
                 "ref", "ptr", "adtype", "gemv", "dq", "__weakref__")


def _torch():
    import torch

    return torch


def sizes(n, blocksize, nested, gsize=256) -> dict:
    """The fewest elements each tensor of an n-value weight holds: packed bytes, absmax (or its codes), and for
    nested statistics the group scales and their code."""
    nblocks = -(-n // blocksize)
    return {"A": (n + 1) // 2, "absmax": nblocks, "absmax2": -(-nblocks // gsize) if nested else 0,
            "code2": 256 if nested else 0}


def _state_tensor(t, what, dtype, min_numel, device):
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        return TypeError, f"quant_state: {what} must be a torch.Tensor, got {type(t).__name__}"
    if t.dtype != dtype:
        return ValueError, f"quant_state: {what} must be {dtype}, got {t.dtype}"
    if t.numel() < min_numel:
        return ValueError, f"quant_state: {what} holds {t.numel()} values, the state needs {min_numel}"
    if t.device != device:
        return ValueError, (f"quant_state: {what} is on {t.device} but A is on {device}; "
                            "move A and quant_state to one device (quant_state.to(device))")
    if not t.is_contiguous():
        return ValueError, f"quant_state: {what} must be contiguous"
    return None


_ANY = object()   # no result dtype to check (the GEMV's is x's)


def _nested(nested, absmax2, code2, offset) -> bool:
    """Nested statistics: as told, else by the presence of their group scales, code or offset."""
    return nested if nested is not None else not (absmax2 is None and code2 is None and offset is None)


def problem(A, shape, blocksize, quant_type, absmax, absmax2=None, code2=None, offset=None, gsize=256,
            dtype=_ANY, out=None, nested=None):
    """None when nf4lab's kernels take these tensors, else ``(TypeError or ValueError, message)``.

    ``A``: the packed codes; ``shape``: the weight's; ``absmax``: float32 absmax (plain statistics) or the
    uint8 absmax codes (nested: ``absmax2`` the group scales of ``gsize`` blocks each, ``code2`` their 256-entry
    code, ``offset`` a float or one float32 value; ``nested``: which of the two, if not told by their presence);
    ``dtype`` and ``out``: the result's, where there is one."""
    torch = _torch()
    if not isinstance(A, torch.Tensor):
        return TypeError, f"A must be a torch.Tensor of packed uint8 codes, got {type(A).__name__}"
    if A.dtype != torch.uint8:
        return TypeError, (f"A must be a uint8 tensor of packed 4-bit codes, got {A.dtype} "
                           "(for another quant_storage, pass A.view(torch.uint8))")
    if not A.is_contiguous():
        return ValueError, "A must be contiguous (its bytes are read in order); pass A.contiguous()"
    if quant_type not in QUANT_TYPES:
        return ValueError, f"quant_state.quant_type must be one of {QUANT_TYPES}, got {quant_type!r}"
    if blocksize not in BLOCKSIZES:
        return ValueError, f"quant_state.blocksize must be one of {BLOCKSIZES}, got {blocksize!r}"
    if dtype is not _ANY and (not isinstance(dtype, torch.dtype) or dtype not in reference.dtype_names()):
        return ValueError, f"quant_state.dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype!r}"
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        return ValueError, f"quant_state.shape must be a sequence of ints, got {shape!r}"
    if any(s < 0 for s in dims):
        return ValueError, f"quant_state.shape must not be negative, got {dims}"
    nested = _nested(nested, absmax2, code2, offset)
    if nested and (not isinstance(gsize, int) or gsize <= 0 or gsize & (gsize - 1)):
        return ValueError, f"quant_state.state2.blocksize must be a power of two, got {gsize!r}"
    need = sizes(math.prod(dims), blocksize, nested, gsize)
    if A.numel() < need["A"]:
        return ValueError, f"A is too short for quant_state: {A.numel()} bytes, {dims} needs {need['A']}"
    device = A.device
    if device.type not in ("cpu", "cuda"):
        return ValueError, f"A must be on a CPU or CUDA device, got {device}"
    if not nested:
        why = _state_tensor(absmax, "absmax", torch.float32, need["absmax"], device)
        if why:
            return why
    else:
        for t, what, dt, count in ((absmax, "absmax (nested, quantized)", torch.uint8, need["absmax"]),
                                   (absmax2, "state2.absmax", torch.float32, need["absmax2"]),
                                   (code2, "state2.code", torch.float32, need["code2"])):
            why = _state_tensor(t, what, dt, count, device)
            if why:
                return why
        if isinstance(offset, torch.Tensor):
            if offset.numel() != 1 or offset.dtype != torch.float32 or offset.device != device:
                return ValueError, (f"quant_state.offset must be one float32 value on {device}, "
                                    f"got {offset.dtype} x {offset.numel()} on {offset.device}")
        elif not isinstance(offset, (float, int, np.floating)):
            return TypeError, f"quant_state.offset must be a float or a float32 tensor, got {type(offset).__name__}"
    if out is not None:
        if not isinstance(out, torch.Tensor):
            return TypeError, f"out must be a torch.Tensor, got {type(out).__name__}"
        if out.dtype != dtype:
            return TypeError, f"out has dtype {out.dtype}, quant_state.dtype is {dtype}"
        if tuple(out.shape) != dims:
            return ValueError, f"out has shape {tuple(out.shape)}, quant_state.shape is {dims}"
        if out.device != device:
            return ValueError, f"out is on {out.device} but A is on {device}"
        if not out.is_contiguous():
            return ValueError, "out must be contiguous"
    return None


def check(A, shape, blocksize, quant_type, absmax, absmax2=None, code2=None, offset=None, gsize=256,
          dtype=_ANY, out=None, nested=None) -> QWeight:
    """The weight as a :class:`QWeight` (not kept), or the :func:`problem` raised."""
    why = problem(A, shape, blocksize, quant_type, absmax, absmax2, code2, offset, gsize, dtype, out, nested)
    if why is not None:
        raise why[0](why[1])
    return record(A, shape, blocksize, quant_type, absmax, absmax2, code2, offset, gsize, nested)


def _version(offset):
    return getattr(offset, "_version", offset)


def record(A, shape, blocksize, quant_type, absmax, absmax2=None, code2=None, offset=None, gsize=256,
           nested=None) -> QWeight:
    """The record of tensors that passed :func:`problem` just now (not kept)."""
    w = QWeight()
    w.A, w.shape_obj, w.shape = A, shape, tuple(int(s) for s in shape)
    w.n = math.prod(w.shape)
    w.blocksize, w.bs_shift, w.quant_type = blocksize, int(blocksize).bit_length() - 1, quant_type
    w.nested = _nested(nested, absmax2, code2, offset)
    need = sizes(w.n, blocksize, w.nested, gsize)
    w.nbytes, w.nblocks, w.gsize = need["A"], need["absmax"], gsize if w.nested else 0
    w.absmax, w.absmax2, w.code2, w.offset, w.version = absmax, absmax2, code2, offset, _version(offset)
    w.device, w.device_index, w.ptr, w.adtype = A.device, A.device.index, A.data_ptr(), A.dtype
    w.ref, w.gemv, w.dq = None, None, {}
    return w


_KNOWN: dict = {}  # id(absmax tensor) -> QWeight (bitsandbytes passes a fresh view of the packed bytes each call)


def known(A, shape, blocksize, quant_type, absmax, absmax2=None, code2=None, offset=None):
    """The kept record of this weight, or None (never checked, or any of its tensors changed since).
    Identity checks only: this runs at every call of a layer."""
    w = _KNOWN.get(id(absmax))
    if (w is not None and w.ref() is absmax and w.ptr == A.data_ptr() and A.dtype is w.adtype
            and A.numel() >= w.nbytes and A.is_contiguous() and w.absmax2 is absmax2
            and w.code2 is code2 and w.offset is offset and w.version == _version(offset)
            and w.blocksize == blocksize and w.quant_type == quant_type
            and (w.shape_obj is shape or w.shape == tuple(shape))):
        return w
    return None


def checked(A, shape, blocksize, quant_type, absmax, absmax2=None, code2=None, offset=None, gsize=256,
            nested=None):
    """The weight's kept record (:func:`known`), else checked now and kept; None where it has a problem."""
    w = known(A, shape, blocksize, quant_type, absmax, absmax2, code2, offset)
    if w is not None:
        return w
    if problem(A, shape, blocksize, quant_type, absmax, absmax2, code2, offset, gsize, nested=nested) is not None:
        return None
    w = record(A, shape, blocksize, quant_type, absmax, absmax2, code2, offset, gsize, nested)
    key = id(absmax)
    w.ref = weakref.ref(absmax, lambda _, k=key, known=_KNOWN: known.pop(k, None))
    # Kept: no strong hold on the keyed statistics (the record would keep them alive) nor on a call's view of
    # the packed bytes (their address, w.ptr, is what it compares); a launch takes the call's own tensors.
    w.A = w.absmax = None
    _KNOWN[key] = w
    return w
