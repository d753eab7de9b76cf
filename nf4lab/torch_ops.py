"""nf4lab's kernels as torch custom ops, so that ``torch.compile(fullgraph=True)`` traces through them.

Why ops: dynamo cannot trace what a CUDA launch needs (``data_ptr() % 16`` to pick the 128-bit
path, raw pointers, numba objects). Inside a ``torch.library.custom_op`` all of that runs as one
opaque call, and the traced graph only needs the op's fake (meta) implementation: output shape,
dtype and device. Alignment and path choice therefore happen inside the op, at run time, on the
real tensors, exactly as in eager mode.

Ops (namespace ``nf4lab``)::

    nf4lab::dequantize_4bit(A, absmax, absmax2?, code2?, offset?, blocksize, nested_blocksize,
                            quant_type, shape, dtype) -> Tensor
    nf4lab::dequantize_4bit_out(..., out) -> ()          (fills ``out``, mutates it)
    nf4lab::gemv_4bit(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize) -> Tensor

``dequantize_4bit`` works on CPU and CUDA tensors (the same functions as :func:`nf4lab.dequantize`,
so bit for bit the same). ``absmax2``/``code2``/``offset`` are given for nested statistics
(``absmax`` is then the uint8 codes), else None. The result is never transposed: the
``A.shape[0] == 1`` shim of bitsandbytes stays in traced Python (:func:`nf4lab.dequantize`).

``gemv_4bit`` is ``y = x @ W.T`` for x of 1..8 rows (nested NF4 statistics, blocksize >= 64,
K a multiple of 64, bf16/fp16), on nf4lab's fused GEMV where :mod:`nf4lab.gemv` provides a
launcher (see :func:`gemv_launcher`); otherwise, and on CPU, it dequantizes and multiplies.
It is not bit-exact with anything (a sum in its own order); the tolerance is
:func:`nf4lab.gemv.tolerance`.

CUDA graphs and streams: the ops launch on the caller's current stream. A first call per
variant compiles and self-checks the kernel (synchronizing), which cannot happen inside
stream capture: run the op once eagerly before capturing (torch.compile's ``reduce-overhead``
mode does warm-up runs by itself).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import dequant as _dq

_TDTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _state(absmax, absmax2, code2, offset, blocksize, nested_blocksize, quant_type, shape, dtype):
    """A bitsandbytes QuantState over the op's tensors, so that the op validates exactly like
    :func:`nf4lab.dequantize` (same messages) and runs the same code."""
    from bitsandbytes.functional import QuantState

    state2 = None
    off = None
    if absmax2 is not None or code2 is not None or offset is not None:
        if absmax2 is None or code2 is None or offset is None:
            raise ValueError("absmax2, code2 and offset: give all three (nested statistics) or none")
        state2 = QuantState(absmax=absmax2, code=code2, blocksize=int(nested_blocksize), dtype=torch.float32)
        off = offset.reshape(()) if offset.numel() == 1 else offset
    return QuantState(absmax=absmax, shape=torch.Size(shape), blocksize=int(blocksize), quant_type=quant_type,
                      dtype=dtype, offset=off, state2=state2)


def _run(A, qs, out):
    p = _dq._plan(A, qs, out)
    if p.A.device.type == "cuda":
        return _dq._dequantize_cuda(p, out)
    return _dq._dequantize_cpu(p, out)


@torch.library.custom_op("nf4lab::dequantize_4bit", mutates_args=())
def dequantize_4bit(A: torch.Tensor, absmax: torch.Tensor, absmax2: Optional[torch.Tensor],
                    code2: Optional[torch.Tensor], offset: Optional[torch.Tensor], blocksize: int,
                    nested_blocksize: int, quant_type: str, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    qs = _state(absmax, absmax2, code2, offset, blocksize, nested_blocksize, quant_type, shape, dtype)
    return _run(A, qs, None)


def _result_shape(A, shape, blocksize):
    """The shape :func:`nf4lab.dequantize` returns before its transpose shim: on CPU, bitsandbytes'
    native kernels give a 1-D state's result as (1, n), and nf4lab reproduces that."""
    shape = tuple(shape)
    if A.device.type == "cpu" and len(shape) == 1 and _dq.bnb_cpu_path(shape, blocksize) != "torch":
        return (1, shape[0])
    return shape


@dequantize_4bit.register_fake
def _(A, absmax, absmax2, code2, offset, blocksize, nested_blocksize, quant_type, shape, dtype):
    torch._check(dtype in _TDTYPE, lambda: f"quant_state.dtype must be bf16, fp16 or fp32, got {dtype}")
    return A.new_empty(_result_shape(A, shape, blocksize), dtype=dtype)


@torch.library.custom_op("nf4lab::dequantize_4bit_out", mutates_args=("out",))
def dequantize_4bit_out(A: torch.Tensor, absmax: torch.Tensor, absmax2: Optional[torch.Tensor],
                        code2: Optional[torch.Tensor], offset: Optional[torch.Tensor], blocksize: int,
                        nested_blocksize: int, quant_type: str, shape: list[int], dtype: torch.dtype,
                        out: torch.Tensor) -> None:
    qs = _state(absmax, absmax2, code2, offset, blocksize, nested_blocksize, quant_type, shape, dtype)
    _run(A, qs, out)


@dequantize_4bit_out.register_fake
def _(A, absmax, absmax2, code2, offset, blocksize, nested_blocksize, quant_type, shape, dtype, out):
    return None


def op_args(A, qs):
    """The op's arguments for a packed tensor and its QuantState (traceable: attribute reads only)."""
    if getattr(qs, "nested", False):
        off = qs.offset
        if not isinstance(off, torch.Tensor):
            off = torch.tensor(float(off), dtype=torch.float32, device=A.device)
        return (A, qs.absmax, qs.state2.absmax, qs.state2.code, off, qs.blocksize, qs.state2.blocksize,
                qs.quant_type, list(qs.shape), qs.dtype)
    return (A, qs.absmax, None, None, None, qs.blocksize, 256, qs.quant_type, list(qs.shape), qs.dtype)


# ---------------------------------------------------------------- GEMV
def gemv_launcher():
    """nf4lab's fused-GEMV launcher for torch tensors, from :mod:`nf4lab.gemv`, or None.

    Looked up by name, so that this module follows gemv.py as it is restructured:
    ``nf4lab.gemv.launch_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, out)``.
    Without it the op computes dequantize + matmul (still correct, not fused)."""
    from . import gemv

    return getattr(gemv, "launch_torch", None)


_OFFSETS: dict = {}  # id(tensor) -> (weakref to it, its _version, value as a float)


def offset_value(offset) -> float:
    """A nested state's offset as a Python float, read from the device once per tensor (and again
    only if it is modified in place). A fresh ``float(offset)`` per call would synchronize the
    stream every call and cannot run inside CUDA-graph capture."""
    if not isinstance(offset, torch.Tensor):
        return float(offset)
    key = id(offset)
    hit = _OFFSETS.get(key)
    if hit is not None and hit[0]() is offset and hit[1] == offset._version:
        return hit[2]
    import weakref

    value = float(offset.reshape(-1)[0].item())
    _OFFSETS[key] = (weakref.ref(offset, lambda _, k=key: _OFFSETS.pop(k, None)), offset._version, value)
    return value


def gemv_handles(x, packed, shape, absmax_q, absmax2, code2, blocksize) -> bool:
    """True where the fused GEMV applies: CUDA, 1..8 rows, bf16/fp16, nf4 nested 8-bit stats, 256 per
    group, blocksize >= 64, K a multiple of 64, contiguous, 16-byte aligned x and packed weight."""
    if x.device.type != "cuda" or x.dtype not in (torch.bfloat16, torch.float16) or len(shape) != 2:
        return False
    N, K = int(shape[0]), int(shape[1])
    M = x.numel() // K if K else 0
    from . import gemv

    return (K > 0 and x.shape[-1] == K and 1 <= M <= gemv.MAX_M and K % 64 == 0 and 64 <= blocksize <= 4096
            and blocksize & (blocksize - 1) == 0 and absmax_q.dtype == torch.uint8
            and packed.dtype == torch.uint8 and packed.numel() >= N * K // 2
            and absmax_q.numel() >= -(-N * K // blocksize) and absmax2.is_contiguous()
            and absmax2.dtype == torch.float32 and code2.dtype == torch.float32 and code2.numel() >= 256
            and x.is_contiguous() and packed.is_contiguous() and absmax_q.is_contiguous()
            and x.data_ptr() % 16 == 0 and packed.data_ptr() % 16 == 0 and N * K // 8 < 1 << 32
            and packed.device == x.device and absmax_q.device == x.device)


def _gemv_reference(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize):
    qs = _state(absmax_q, absmax2, code2, offset, blocksize, 256, "nf4", shape, x.dtype)
    w = _run(packed.reshape(-1), qs, None)
    return torch.nn.functional.linear(x, w)


@torch.library.custom_op("nf4lab::gemv_4bit", mutates_args=())
def gemv_4bit(x: torch.Tensor, packed: torch.Tensor, shape: list[int], absmax_q: torch.Tensor,
              absmax2: torch.Tensor, code2: torch.Tensor, offset: torch.Tensor, blocksize: int) -> torch.Tensor:
    _check_gemv(x, shape)
    launch = gemv_launcher()
    if launch is not None and gemv_handles(x, packed, shape, absmax_q, absmax2, code2, blocksize):
        out = torch.empty((*x.shape[:-1], int(shape[0])), dtype=x.dtype, device=x.device)
        launch(x, packed, shape, absmax_q, absmax2, code2, offset_value(offset), blocksize, out)
        return out
    return _gemv_reference(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize)


def _check_gemv(x, shape):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _TDTYPE:
        raise TypeError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if len(shape) != 2 or x.shape[-1] != shape[1]:
        raise ValueError(f"shape must be the weight's [N, K] with K = x.shape[-1] = {x.shape[-1]}, got {list(shape)}")


@gemv_4bit.register_fake
def _(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize):
    return x.new_empty((*x.shape[:-1], shape[0]))
