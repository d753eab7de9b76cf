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
K a multiple of 64, bf16/fp16, 16-byte aligned x and weight: :func:`gemv_call`), on
nf4lab.kernels.gemv's fused kernel (lean ``cuLaunchKernel`` after a bit-for-bit check against
``nf4lab.kernels.gemv.launch_torch``); otherwise, and on CPU, it dequantizes and multiplies.
It is not bit-exact with anything (a sum in its own order); the tolerance is
:func:`nf4lab.kernels.gemv.tolerance`.

CUDA graphs and streams: the ops launch on the caller's current stream. A first call per
variant compiles and self-checks the kernel (synchronizing), which cannot happen inside
stream capture: run the op once eagerly before capturing (torch.compile's ``reduce-overhead``
mode does warm-up runs by itself).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from ..format import reference
from ..kernels import dequant as _dq
from ..kernels import gemv as _gemv
from ..kernels import qweight as _qw

_TDTYPE = reference.dtype_names()  # torch dtype -> "bf16" | "fp16" | "fp32"


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
    return _dq.run(_dq.plan(A, qs, out), out)


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


# ---------------------------------------------------------------- GEMV
_OFFSETS: dict = {}  # id(tensor) -> (weakref to it, its _version, value as a float)


def _cached_offset(offset):
    """The offset as a float without reading the device, or None where that would need a read."""
    if not isinstance(offset, torch.Tensor):
        return float(offset)
    hit = _OFFSETS.get(id(offset))
    if hit is not None and hit[0]() is offset and hit[1] == offset._version:
        return hit[2]
    return None


def offset_value(offset) -> float:
    """A nested state's offset as a Python float, read from the device once per tensor (and again
    only if it is modified in place). A fresh ``float(offset)`` per call would synchronize the
    stream every call and cannot run inside CUDA-graph capture."""
    value = _cached_offset(offset)
    if value is None:
        key = id(offset)
        value = float(offset.reshape(-1)[0].item())
        _OFFSETS[key] = (weakref.ref(offset, lambda _, k=key: _OFFSETS.pop(k, None)), offset._version, value)
    return value


class _GemvLean:
    """Launch a compiled fused-GEMV kernel with ``cuLaunchKernel`` from raw pointers, on a parameter block laid
    out from the kernel's signature (:class:`nf4lab.kernels.fastkernel.ParamLayout`, as for dequantize):
    numba's dispatcher plus seven ``cuda.as_cuda_array`` conversions cost far more host time than the kernel
    takes at decode sizes. Real sizes are written, so the kernel may read shapes.

    For one weight and batch size only x's and y's pointers change from call to call: each such pair
    keeps a :class:`_Block` with every other slot written once, and a launch writes two slots."""

    # argument order: packed_u32 absmax_q absmax2 code2 lut | offset | x_u32 y | N K bs_shift
    X_ARG, Y_ARG = 5, 6   # x_u32 and y among the array arguments

    def __init__(self, compiled, argtypes):
        import threading

        from ..kernels.fastkernel import ParamLayout, driver_launch

        self._launch = driver_launch()
        self._func = int(compiled._codelibrary.get_cufunc().handle)
        self.layout = ParamLayout(argtypes)
        self._lock = threading.Lock()   # a block's two slots and its launch, one thread at a time

    @staticmethod
    def prefix(ptrs, counts, offset) -> tuple:
        """The arguments packed_u32, absmax_q, absmax2, code2, lut (pointer, element count) and the offset."""
        return (*zip(ptrs, counts), offset)

    def block(self, w, M, grid, smem):
        """The parameter block of weight ``w`` (a :class:`_Weight`) at batch size M."""
        return _Block(self, w, M, grid, smem)


class _Block:
    """One weight's launch at one batch size: the whole parameter block in a buffer of its own, with x's and
    y's pointers the only slots a call writes (two 8-byte stores into a memoryview, no packing)."""

    __slots__ = ("lean", "grid", "smem", "block", "params_addr", "view", "x_slot", "y_slot")

    def __init__(self, lean, w, M, grid, smem):
        from ..kernels.fastkernel import ParamBlock

        self.lean, self.grid, self.smem = lean, grid, smem
        self.block = ParamBlock(lean.layout, *w.prefix, (0, M * w.K // 2), (0, M * w.N), w.N, w.K, w.bs_shift)
        self.params_addr = self.block.params_addr
        self.view = self.block.view
        self.x_slot, self.y_slot = lean.layout.data[_GemvLean.X_ARG], lean.layout.data[_GemvLean.Y_ARG]

    def __call__(self, stream, x_ptr, y_ptr):
        lean, v = self.lean, self.view
        with lean._lock:
            v[self.x_slot] = x_ptr
            v[self.y_slot] = y_ptr
            err = lean._launch(lean._func, self.grid, _gemv.THREADS, stream, self.params_addr, self.smem)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed: CUresult {err}")


_GEMV_LEAN: dict = {}  # (M, dtype, device, words, full, G) -> _GemvLean, or False once it disagreed with the dispatcher


def _first_launch(key, grid, w, x, M, packed, absmax_q, absmax2, code2, blocksize, out):
    """A kernel's first call on a device (key: M, dtype, device, words, full, G): numba's launch (it compiles there), then once the lean
    launcher into a scratch tensor, compared bit for bit (same kernel, same grid: the same summation
    order); from then on the lean launcher serves alone. Under stream capture nothing is checked: an
    unchecked kernel keeps numba's launch."""
    import warnings

    _gemv.launch_torch(x, packed, w.shape, absmax_q, absmax2, code2, w.prefix[-1], blocksize, out)
    kern = _gemv.kernel(key[1], key[0], words=key[3], full=key[4], G=key[5])
    if key in _GEMV_LEAN or len(kern.overloads) != 1 or torch.cuda.is_current_stream_capturing():
        return
    try:
        argtypes, compiled = next(iter(kern.overloads.items()))
        lean = _GemvLean(compiled, argtypes)
        scratch = torch.full_like(out, float("nan"))
        idx = x.get_device()
        lean.block(w, M, grid, _gemv.SMEM)(torch._C._cuda_getCurrentRawStream(idx), x.data_ptr(), scratch.data_ptr())
        torch.cuda.synchronize(x.device)
        same = torch.equal(scratch.view(torch.int16), out.view(torch.int16))
    except Exception as exc:  # an ABI surprise in a numba/cuda-bindings release: stay correct, be slow
        same, why = False, f"{type(exc).__name__}: {exc}"
    else:
        why = "its output differed from numba's launch"
    if same:
        _GEMV_LEAN[key] = lean
    else:
        _GEMV_LEAN[key] = False
        warnings.warn(f"nf4lab GEMV: lean launch unavailable ({why}); using numba's dispatcher (correct, slower)",
                      RuntimeWarning, stacklevel=4)


class _Gemv:
    """What the fused GEMV keeps of a checked weight (hung on its :class:`nf4lab.kernels.qweight.QWeight`):
    derived once, then reused by every call on it."""

    __slots__ = ("shape", "N", "K", "bs_shift", "words", "prefix", "device_index", "launches")


def _weight(packed, shape, absmax_q, absmax2, code2, offset, blocksize):
    """The weight's GEMV record, or None where the fused GEMV does not take this weight. The weight's checks
    are qweight's, made once per weight; a kept weight costs identity checks only."""
    w = _qw.checked(packed, shape, blocksize, "nf4", absmax_q, absmax2, code2, offset, 256, nested=True)
    if w is None:
        return None
    g = w.gemv
    if g is None:
        g = _gemv_prepare(w, absmax_q, absmax2, code2, offset)
    return g or None


def _gemv_prepare(w, absmax_q, absmax2, code2, offset):
    """The GEMV's record for a checked weight, False where the fused kernel does not take it (kept on the weight),
    None where making it now would read the device inside a stream capture (the caller serves the call another way)."""
    if (len(w.shape) != 2 or w.device.type != "cuda" or w.ptr % 16
            or _gemv.limits_problem(w.shape[0], w.shape[1], w.bs_shift)):
        w.gemv = False
        return False
    if torch.cuda.is_current_stream_capturing() and (_cached_offset(offset) is None
                                                     or not _dq.lut_ready("nf4", w.device)):
        return None
    g = _Gemv()
    g.shape, (g.N, g.K), g.bs_shift, g.device_index = w.shape, w.shape, w.bs_shift, w.device_index
    g.launches = {}  # (M, x dtype) -> its _Block, once that kernel's lean launcher is checked
    g.words = _gemv.words_apply(True, g.bs_shift, g.K, absmax_q.data_ptr())   # as _gemv.launch decides
    lut = _dq.device_lut("nf4", w.device)
    g.prefix = _GemvLean.prefix(
        (w.ptr, absmax_q.data_ptr(), absmax2.data_ptr(), code2.data_ptr(), lut.data_ptr()),
        (g.N * g.K // 8, absmax_q.numel(), absmax2.numel(), code2.numel(), 16), offset_value(offset))
    w.gemv = g
    return g


def gemv_call(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize):
    """``x @ W.T`` on the fused GEMV as a new tensor, or None where it does not apply (the caller then
    serves the call another way). The per-call work once a weight is known: x's checks, one empty
    tensor and ``cuLaunchKernel`` on the weight's parameter block with x's and y's pointers written in;
    what the weight needs is cached. Eager decode runs this 224 times a token on an 8B model, on a host
    that is the bottleneck there: each tensor attribute is read once (``x.shape`` and ``x.device`` build
    new Python objects at every access)."""
    dt = x.dtype
    if dt is not torch.bfloat16 and dt is not torch.float16:
        return None
    xs = x.shape
    K, n = xs[-1], x.numel()
    if n > _gemv.MAX_M * K:
        return None
    w = _weight(packed, shape, absmax_q, absmax2, code2, offset, blocksize)
    if w is None or K != w.K or n == 0:
        return None
    idx = x.get_device()   # -1 for a CPU tensor
    if idx != w.device_index or idx != torch._C._cuda_getDevice() or not x.is_contiguous():
        return None   # (cuLaunchKernel runs in the current device's context, where this kernel is not loaded)
    xp = x.data_ptr()
    if xp % 16:
        return None
    M = n // K
    out = x.new_empty((*xs[:-1], w.N))   # x's dtype and device, without parsing them again
    blk = w.launches.get((M, dt))
    if blk is None:
        grid = _gemv.grid_size(w.N)   # once per weight, M and dtype: w.launches keeps it
        G = _gemv.warps_a_tile(w.N, M, grid)
        key = (M, _TDTYPE[dt], idx, w.words, _gemv.full_apply(w.words, M, K, G), G)   # the kernel _gemv.launch picks
        lean = _GEMV_LEAN.get(key)
        if not isinstance(lean, _GemvLean):
            _first_launch(key, grid, w, x, M, packed, absmax_q, absmax2, code2, blocksize, out)
            return out
        blk = w.launches[(M, dt)] = lean.block(w, M, grid, _gemv.SMEM)
    blk(torch._C._cuda_getCurrentRawStream(idx), xp, out.data_ptr())
    return out


def _gemv_reference(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize):
    qs = _state(absmax_q, absmax2, code2, offset, blocksize, 256, "nf4", shape, x.dtype)
    w = _run(packed.reshape(-1), qs, None)
    return torch.nn.functional.linear(x, w)


def dequant_linear(x, packed, shape, absmax, blocksize, quant_type, bias=None, absmax_q=None, code2=None,
                   offset=None):
    """``F.linear(x, W, bias)`` with W dequantized by nf4lab (nested statistics fused into the one kernel), in
    bitsandbytes' gemm_4bit argument order: ``absmax`` is the float32 absmax (plain statistics) or the group
    scales (nested, with the codes ``absmax_q``, their ``code2`` and ``offset``). The same bits as
    bitsandbytes' dequantize + F.linear fallback, whose dequantization nf4lab matches bit for bit; None where
    nf4lab's dequantization does not take these tensors (the caller hands the call to bitsandbytes).
    A training step dequantizes each frozen weight three times (forward, its recomputation under
    checkpointing, backward) and host time bounds such a step: the weight is checked once and each of its
    launches prepared once (kept on its qweight record)."""
    nested = absmax_q is not None
    if x.dtype not in _TDTYPE or len(shape) != 2 or x.shape[-1] != shape[1]:
        return None
    state = (absmax_q, absmax, code2, offset) if nested else (absmax, None, None, None)
    w = _qw.checked(packed, shape, blocksize, quant_type, *state, 256, nested=nested)
    if w is None or w.device != x.device:
        return None
    W = _dq_launch(w, x) if w.device.type == "cuda" else None
    if W is None:   # the call's own tensors (the kept record holds none of them strongly)
        p = _dq.plan_of(_qw.record(packed.reshape(-1), shape, blocksize, quant_type, *state, 256, nested), x.dtype)
        if w.device.type != "cuda":
            return torch.nn.functional.linear(x, _dq.run_cpu(p, None), bias)
        W = _dq.run_cuda(p, None)
        if p.n:
            stats, a2, c2, off = _dq.state_pointers(p)
            lut = _dq.device_lut(p.quant_type, w.device).data_ptr()
            w.dq[x.dtype] = (p.dtype, p.nested, p.n, stats, a2, c2, off, lut, p.blocksize.bit_length() - 1,
                             p.gsize.bit_length() - 1 if p.nested else 0)
    return torch.nn.functional.linear(x, W, bias)


def _dq_launch(w, x):
    """Dequantize a kept weight into a new tensor of x's dtype: allocate, then launch; None where x is on
    another device than the current one, or that path's launch is not prepared or its launcher not checked yet."""
    rec = w.dq.get(x.dtype)
    if rec is None or w.device_index != torch._C._cuda_getDevice():
        return None
    dtype, nested, n, stats, a2, c2, off, lut, bshift, gshift = rec
    out = torch.empty(w.shape, dtype=x.dtype, device=w.device)
    if not _dq.launch_ready(dtype, nested, w.device_index, w.ptr, stats, a2, c2, off, lut, out.data_ptr(), n,
                            bshift, gshift):
        return None
    return out


@torch.library.custom_op("nf4lab::gemv_4bit", mutates_args=())
def gemv_4bit(x: torch.Tensor, packed: torch.Tensor, shape: list[int], absmax_q: torch.Tensor,
              absmax2: torch.Tensor, code2: torch.Tensor, offset: torch.Tensor, blocksize: int) -> torch.Tensor:
    _check_gemv(x, shape)
    out = gemv_call(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize)
    if out is not None:
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
