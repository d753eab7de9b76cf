"""The work behind ``nf4lab.dequantize(A, quant_state, out=None)``, bitsandbytes' ``dequantize_4bit``'s drop-in
(:mod:`nf4lab.integrations.dequantize`): validation (``plan``) and the eager CUDA and CPU paths (``run``).

Same inputs (the packed uint8 tensor and its ``QuantState``, or a ``Params4bit`` weight that
carries its state), same result (a tensor of ``quant_state.shape`` and ``quant_state.dtype``,
or ``out`` filled and returned), bit for bit:

- CUDA tensors run :mod:`nf4lab.kernels.fastkernel`'s kernels (128-bit path where pointers allow,
  scalar path otherwise), launched with a lean launcher; bits of bitsandbytes' CUDA kernel.
- CPU tensors run torch CPU ops that reproduce bitsandbytes' CPU backend, including which
  sign its fp4 code 8 (zero) gets and the (1, n) shape it returns for some 1-D states: both
  depend on the path it takes (see ``bnb_cpu_path``). One thing is NOT reproduced: its
  AVX-512 kernel indexes absmax per row (``row * (cols // blocksize) + col // blocksize``),
  which picks wrong scales when the last dim is not a multiple of the blocksize. There we
  return the blockwise result that bitsandbytes' CUDA kernel, torch fallback and scalar
  kernel all give (tests check it against bitsandbytes' own torch fallback).
  The CPU kernels whose bits count are those of the ONE native library bitsandbytes loaded:
  on a GPU host its CUDA build, compiled without AVX2/AVX-512: its native kernel is always the
  scalar loop, whose fp16 conversion rounds ties away from zero (``bnb_cpu_fp16_ties_away``).

Every check happens before anything is launched, and raises TypeError or ValueError naming
the parameter. Like bitsandbytes, the result is returned transposed (``out.t()``) when
``A.shape[0] == 1``: callers that pass the packed weight as a [1, n/2] row get [K, N] back.
"""
from __future__ import annotations

import functools
import math
import threading
import warnings
from typing import NamedTuple

import numpy as np

from ..format import reference
from ..format.reference import BLOCKSIZES, FP4_LUT, NF4_LUT
from . import qweight



class _Plan:
    """What validation learned about a call: the checked weight (:class:`nf4lab.kernels.qweight.QWeight`) and
    the result's dtype; everything the launch needs, nothing recomputed."""

    __slots__ = ("w", "A", "shape", "n", "nbytes", "dtype", "tdtype", "blocksize", "nested", "nblocks", "gsize",
                 "quant_type")


def _torch():
    import torch

    return torch


def _quant_state_type():
    from bitsandbytes.functional import QuantState

    return QuantState


def plan(A, quant_state, out) -> _Plan:
    """Validate ``nf4lab.dequantize``'s arguments (TypeError/ValueError naming the parameter): the QuantState
    here, its tensors by :func:`nf4lab.kernels.qweight.problem`, the rules every entry point shares."""
    torch = _torch()
    QuantState = _quant_state_type()
    if quant_state is None:
        quant_state = getattr(A, "quant_state", None)
        if quant_state is None:
            raise TypeError("quant_state is required: pass the QuantState that quantize_4bit returned "
                            "(or a Params4bit weight, which carries its own)")
    if not isinstance(quant_state, QuantState):
        raise TypeError(f"quant_state must be a bitsandbytes.functional.QuantState, got {type(quant_state).__name__}")
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"A must be a torch.Tensor of packed uint8 codes, got {type(A).__name__}")
    if type(A) is not torch.Tensor:  # Params4bit and other subclasses: their data is the packed tensor
        A = A.data
    qs = quant_state
    shape = qs.shape
    try:
        dims = tuple(int(s) for s in shape)
    except TypeError:
        dims = None   # qweight.problem names it
    if dims is not None and A.dim() >= 1 and A.shape[0] == 1 and len(dims) > 2:
        raise ValueError(f"A has shape {tuple(A.shape)} (one row), so the result would be transposed as "
                         f"bitsandbytes does, which needs a quant_state.shape of at most 2 dims, got {dims}")
    nested = bool(getattr(qs, "nested", False))
    if nested:
        s2 = qs.state2
        if not isinstance(s2, QuantState):
            raise TypeError(f"quant_state.state2 must be a QuantState for nested statistics, got {type(s2).__name__}")
        w = qweight.check(A, shape, qs.blocksize, qs.quant_type, qs.absmax, s2.absmax, s2.code, qs.offset,
                          s2.blocksize, qs.dtype, out, nested=True)
    else:
        w = qweight.check(A, shape, qs.blocksize, qs.quant_type, qs.absmax, dtype=qs.dtype, out=out, nested=False)
    return plan_of(w, qs.dtype)


def plan_of(w, tdtype, A=None) -> _Plan:
    """The plan for a checked weight, the result's torch dtype and (for a kept weight) this call's packed tensor."""
    p = _Plan()
    p.w, p.A, p.shape, p.n, p.nbytes = w, w.A if A is None else A, w.shape, w.n, w.nbytes
    p.dtype, p.tdtype = reference.dtype_names()[tdtype], tdtype
    p.blocksize, p.nested, p.nblocks, p.gsize, p.quant_type = w.blocksize, w.nested, w.nblocks, w.gsize, w.quant_type
    return p


def plan_checked(A, absmax, blocksize, quant_type, shape, dtype) -> _Plan:
    """A plan for plain (float32 absmax) statistics that already passed :func:`nf4lab.kernels.qweight.problem`
    (nf4lab.install's kernel for bitsandbytes' op, see bnb_backend._dequantize_handles): the eager path
    there pays for its checks once, not twice."""
    return plan_of(qweight.record(A, shape, blocksize, quant_type, absmax, nested=False), dtype)


def run(p, out):
    """Dequantize a validated call (:func:`plan`) eagerly: the CUDA kernels or the CPU path, by A's device.
    The result is never transposed (the ``A.shape[0] == 1`` shim is :func:`nf4lab.dequantize`'s)."""
    if p.A.device.type == "cuda":
        return run_cuda(p, out)
    return run_cpu(p, out)


def compiling() -> bool:
    compiler = getattr(_torch(), "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def op_args(p):
    """The arguments of nf4lab's torch op ``dequantize_4bit`` for a validated call (:func:`plan`; traceable:
    attribute reads only)."""
    torch = _torch()
    w = p.w
    if w.nested:
        off = w.offset
        if not isinstance(off, torch.Tensor):
            off = torch.tensor(float(off), dtype=torch.float32, device=w.device)
        return (p.A, w.absmax, w.absmax2, w.code2, off, w.blocksize, w.gsize, w.quant_type, list(w.shape), p.tdtype)
    return (p.A, w.absmax, None, None, None, w.blocksize, 256, w.quant_type, list(w.shape), p.tdtype)


# ---------------------------------------------------------------- CPU
class BnbCpu(NamedTuple):
    """What decides bitsandbytes' CPU ``dequantize_4bit`` bits: ``native``: a native library is
    loaded; ``torch_avx512``: torch reports AVX-512 (backends/cpu/ops.py ``_has_avx512``, also our
    stand-in for the C++'s cpuid avx512f); ``built_avx512`` / ``built_avx2``: the LOADED library's
    csrc/cpu_ops.cpp was compiled with ``-mavx512f`` / ``-mavx2`` (only the CPU build is)."""

    native: bool
    torch_avx512: bool
    built_avx512: bool
    built_avx2: bool


def _bnb_build_flags(lib_file: str, system: str, machine: str) -> tuple:
    """(``__AVX512F__``, ``__AVX2__``) in the library named ``lib_file``, from CMakeLists.txt:
    gcc/clang add -mavx512f.. and -mavx2 -mf16c only when BUILD_CPU on x86_64/amd64, so the
    CUDA/ROCm/XPU builds (libbitsandbytes_cuda130.so, ...) have neither; MSVC builds every x86
    target with /arch:AVX2 and never -mavx512f."""
    machine = machine.lower()
    if system == "Windows":
        return False, machine in ("x86", "x64", "amd64", "x86_64")
    cpu_build = lib_file.startswith("libbitsandbytes_cpu")
    x86 = machine in ("x86_64", "amd64")
    return cpu_build and x86, cpu_build and x86


@functools.cache
def _bnb_cpu_flags() -> BnbCpu:
    """:class:`BnbCpu` for the bitsandbytes in this process (cached: asked per CPU dequantize)."""
    import os
    import platform

    try:
        from bitsandbytes.backends.cpu import ops as cpu_ops
        from bitsandbytes.cextension import ErrorHandlerMockBNBNativeLibrary, lib
    except Exception:
        return BnbCpu(False, False, False, False)
    torch_avx512 = bool(getattr(cpu_ops, "_has_avx512", False))
    if isinstance(lib, ErrorHandlerMockBNBNativeLibrary):
        return BnbCpu(False, torch_avx512, False, False)
    name = getattr(getattr(lib, "_lib", None), "_name", None)  # the ctypes.CDLL's path
    if not isinstance(name, str):  # no file name: only a plain BNBNativeLibrary is the CPU build
        name = "libbitsandbytes_cpu" if type(lib).__name__ == "BNBNativeLibrary" else ""
    built_avx512, built_avx2 = _bnb_build_flags(os.path.basename(name), platform.system(), platform.machine())
    return BnbCpu(True, torch_avx512, built_avx512, built_avx2)


def bnb_cpu_path(shape, blocksize) -> str:
    """Which of its three CPU paths bitsandbytes 0.50.2 takes: ``torch``, ``avx512`` or ``scalar``.

    backends/cpu/ops.py uses its torch fallback for an odd last dim, or when torch reports
    AVX-512 and blocksize >= 2048; otherwise the native kernel, which (csrc/cpu_ops.cpp) runs
    the AVX-512 loop when it was compiled in (the CPU build only), the CPU has avx512f, the last
    dim is a multiple of 16 and blocksize >= 16, and a scalar loop otherwise. (bitsandbytes asks
    torch for AVX-512, the C++ asks the CPU for avx512f: the same on real CPUs.)
    """
    f = _bnb_cpu_flags()
    last = shape[-1] if shape else 1
    if not f.native or last % 2 == 1 or (f.torch_avx512 and blocksize >= 2048):
        return "torch"
    if f.built_avx512 and f.torch_avx512 and last % 16 == 0 and blocksize >= 16:
        return "avx512"
    return "scalar"


def bnb_cpu_fp16_ties_away(path: str) -> bool:
    """Whether bitsandbytes' fp16 output on ``path`` rounds ties away from zero: its scalar loop
    calls csrc/cpu_ops.h ``float_to_fp16``, ``_mm_cvtps_ph`` (nearest even, as torch) where
    compiled with ``__AVX2__`` and a software conversion (:func:`fp16_bits_half_away`) where
    not, as in the CUDA build. The AVX-512 loop and the torch fallback round to nearest even."""
    return path == "scalar" and not _bnb_cpu_flags().built_avx2


def fp16_bits_half_away(x) -> np.ndarray:
    """float32 -> fp16 bit patterns (uint16), bit for bit bitsandbytes' software ``float_to_fp16``
    (csrc/cpu_ops.h, no ``__AVX2__``): ties round away from zero; magnitudes below 2^-24 (the
    smallest subnormal) become zero, ties included; overflow gives inf; NaN gives sign|0x7E00."""
    b = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32).astype(np.int64)
    sign = (b >> 31) << 15
    exp = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    # normal: round at bit 12 by adding 0x1000; a mantissa carry moves into the exponent,
    # and from exponent 30 to 31 it gives 0x7C00 (inf), as the C's explicit branches do.
    h = ((exp - 112) << 10) + ((mant + 0x1000) >> 13)
    sub = (exp >= 0x67) & (exp < 0x71)
    shift = np.where(sub, 0x71 - exp, 0)
    h = np.where(sub, ((mant | 0x800000) + (np.int64(1) << (shift + 12))) >> (shift + 13), h)
    h = np.where(exp < 0x67, 0, h)
    h = np.where(exp > 0x70 + 0x1E, 0x7C00, h)
    h = np.where(exp == 0xFF, np.where(mant != 0, 0x7E00, 0x7C00), h)
    return (sign | h).astype(np.uint16).reshape(np.shape(x))


def _cpu_fp4_zero(path: str) -> float:
    """fp4 code 8 on CPU: the torch and AVX-512 paths read +0.0 from a table, the scalar loop's
    table (csrc/cpu_ops.cpp ``fp4_lut``) holds -0.0f (the CUDA kernel gives -0.0 too, see fastkernel)."""
    return -0.0 if path == "scalar" else 0.0


def _cpu_absmax(p):
    torch = _torch()
    w = p.w
    if not p.nested:
        return w.absmax[: p.nblocks]
    idx = torch.arange(p.nblocks) // p.gsize
    # Two roundings, as bitsandbytes: dequantize_blockwise (code2[q] * absmax2), then += offset.
    a = w.code2.take(w.absmax[: p.nblocks].long()) * w.absmax2.take(idx)
    return a + w.offset


def run_cpu(p, out):
    torch = _torch()
    n, bs = p.n, p.blocksize
    path = bnb_cpu_path(p.shape, bs)
    if out is None:
        # bitsandbytes' native CPU kernels return a 1-D shape (n,) as (1, n): kept, for drop-in.
        shape = (1, p.shape[0]) if len(p.shape) == 1 and path != "torch" else p.shape
        out = torch.empty(shape, dtype=p.tdtype)
    if n == 0:
        return out
    flat = p.A.reshape(-1)[: p.nbytes]
    lut = (NF4_LUT if p.quant_type == "nf4" else FP4_LUT).copy()
    if p.quant_type == "fp4":
        lut[8] = np.float32(_cpu_fp4_zero(path))
    # One gather per byte from a 256 x 2 table: (high nibble, low nibble), high first.
    pairs = torch.from_numpy(np.stack([np.repeat(lut, 16), np.tile(lut, 16)], axis=1))
    vals = pairs.index_select(0, flat.long()).view(-1)[:n]
    absmax = _cpu_absmax(p)
    full = n // bs * bs
    res = torch.empty(n, dtype=torch.float32)
    if full:
        torch.mul(vals[:full].view(-1, bs), absmax[: full // bs].view(-1, 1), out=res[:full].view(-1, bs))
    if full < n:
        torch.mul(vals[full:], absmax[full // bs], out=res[full:])
    if p.tdtype == torch.float16 and bnb_cpu_fp16_ties_away(path):
        out.view(-1).view(torch.int16).copy_(torch.from_numpy(fp16_bits_half_away(res.numpy()).view(np.int16)))
    else:
        out.view(-1).copy_(res)  # float32 -> bf16/fp16 rounds to nearest even, like bitsandbytes
    return out


# ---------------------------------------------------------------- CUDA
_LUT_CACHE: dict = {}
_OFFSET_CACHE: dict = {}
_lean_state = {"ok": None}  # None: untried, True: checked and used, False: disabled (fallback)
_lean_ready: dict = {}  # (dtype, nested, path) -> its lean launcher, once it passed its self-check
_lock = threading.Lock()


class _DeviceTable:
    """A code table in device memory that numba allocated (cuMemAlloc), outside torch's caching
    allocator. Cached for the process, so it must not come from a CUDA-graph memory pool: under
    ``torch.compile(mode="reduce-overhead")`` the first call runs inside cudagraph trees' warm-up,
    where a torch allocation kept alive after the step fails their pool check."""

    def __init__(self, values, device):
        from numba import cuda

        index = device.index if device.index is not None else _torch().cuda.current_device()
        with cuda.gpus[index]:
            self._array = cuda.to_device(values)
        self._ptr = self._array.__cuda_array_interface__["data"][0]  # built as a new dict on every read

    def data_ptr(self) -> int:
        return self._ptr


def lut_ready(quant_type, device) -> bool:
    """Whether the quant type's table is on ``device`` already (a first copy there cannot run under stream capture)."""
    return (quant_type, device) in _LUT_CACHE


def device_lut(quant_type, device):
    """The quant type's 16 floats on ``device`` (an object with ``data_ptr()``), copied there once."""
    key = (quant_type, device)
    t = _LUT_CACHE.get(key)
    if t is None:
        from .fastkernel import LUTS_CUDA

        if _torch().cuda.is_current_stream_capturing():
            raise RuntimeError("nf4lab: the first CUDA call on a device copies its table there, which stream "
                               "capture forbids; run one call eagerly before capturing a CUDA graph")
        t = _LUT_CACHE[key] = _DeviceTable(LUTS_CUDA[quant_type].copy(), device)
    return t


def _raw_stream(device) -> int:
    torch = _torch()
    try:
        return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else
                                                   torch.cuda.current_device())
    except Exception:
        return torch.cuda.current_stream(device).cuda_stream


def state_pointers(p):
    """Device addresses of the state, in the kernels' argument order (stats, absmax2, code2, offset)."""
    w = p.w
    stats = w.absmax.data_ptr()
    if not p.nested:
        # Unused by the plain kernels, but they must be valid addresses: pass absmax again.
        return stats, stats, stats, stats
    off = w.offset
    if not isinstance(off, _torch().Tensor):
        key = (float(off), p.A.device)
        off = _OFFSET_CACHE.get(key)
        if off is None:
            off = _OFFSET_CACHE[key] = _DeviceTable(np.array([key[0]], dtype=np.float32), p.A.device)
    return stats, w.absmax2.data_ptr(), w.code2.data_ptr(), off.data_ptr()


def run_cuda(p, out):
    torch = _torch()
    from . import fastkernel as fk

    device = p.A.device
    if out is None:
        out = torch.empty(p.shape, dtype=p.tdtype, device=device)
    if p.n == 0:
        return out
    with _device_guard(device):
        a_ptr, o_ptr = p.A.data_ptr(), out.data_ptr()
        path = fk.choose_path(a_ptr, o_ptr)
        stats, a2, c2, off = state_pointers(p)
        lut = device_lut(p.quant_type, device).data_ptr()
        bshift = p.blocksize.bit_length() - 1
        gshift = p.gsize.bit_length() - 1 if p.nested else 0
        stream = _raw_stream(device)
        grid = fk.grid_size(p.n, path, p.dtype)
        args = (a_ptr, stats, a2, c2, off, lut, o_ptr, p.n, bshift, gshift)
        # the lean launcher (checked once against numba's launch, see _lean), else numba's dispatcher
        launcher = _lean(p.dtype, p.nested, path) if _lean_state["ok"] is not False else None
        if launcher is not None:
            launcher(stream, grid, *args)
        else:
            _launch_dispatcher(p, path, stream, *args)
    return out


_BSHIFT = {b: b.bit_length() - 1 for b in BLOCKSIZES}


def dequantize_plain_fast(A, absmax, blocksize, quant_type, shape, dtype, out):
    """The plain-statistics launch of nf4lab.install()'s ``bitsandbytes::dequantize_4bit`` kernel, for
    tensors bnb_backend has checked: nothing but the launch's own values is computed here (no plan, no
    guard object, no import, only launchers that passed their self-check), since a training step makes
    hundreds of these calls and its host time bounds it. None where anything is not ready yet (another
    device current, the variant's launcher or the table not made yet, an empty tensor); the caller then
    takes the general path, which makes them."""
    torch = _torch()
    dev = A.device
    idx = dev.index
    n = math.prod(shape)
    if n == 0 or idx is None or idx != torch._C._cuda_getDevice():
        return None
    table = _LUT_CACHE.get((quant_type, dev))
    dts = reference.dtype_names().get(dtype)
    if table is None or dts is None:
        return None
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=dev)
    st = absmax.data_ptr()
    if not launch_ready(dts, False, idx, A.data_ptr(), st, st, st, st, table.data_ptr(), out.data_ptr(), n,
                        _BSHIFT[blocksize], 0):
        return None
    return out


@functools.cache
def _fastkernel():
    """The fastkernel module (it imports numba's CUDA support, so this module imports it only when it launches)."""
    from . import fastkernel

    return fastkernel


def launch_ready(dtype, nested, device_index, a_ptr, stats, a2, c2, off, lut, o_ptr, n, bshift, gshift) -> bool:
    """Launch on the current stream of ``device_index`` (the current device) through a lean launcher that
    already passed its self-check, for the prepared paths (install()'s plain dequantize, a prepared
    weight's dequantize + linear); False where that variant has none yet (its first call goes the
    general way, which checks it)."""
    # The one rule for the 128-bit path (a misaligned vector access kills the CUDA context): never a copy of it.
    launcher = _lean_ready.get((dtype, nested, _fastkernel().choose_path(a_ptr, o_ptr)))
    if launcher is None:
        return False
    launcher(_torch()._C._cuda_getCurrentRawStream(device_index), launcher.grid(n), a_ptr, stats, a2, c2, off,
             lut, o_ptr, n, bshift, gshift)
    return True


class _device_guard:
    """Make A's device current only when it is not already (the common case costs nothing)."""

    __slots__ = ("device", "ctx")

    def __init__(self, device):
        self.device, self.ctx = device, None

    def __enter__(self):
        torch = _torch()
        if self.device.index is not None and self.device.index != torch.cuda.current_device():
            self.ctx = torch.cuda.device(self.device)
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def _as_numba(ptr, count, np_dtype):
    from numba import cuda

    desc = {"shape": (int(count),), "typestr": np.dtype(np_dtype).str, "data": (int(ptr), False),
            "version": 3, "strides": None}
    return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


def _launch_dispatcher(p, path, stream, a_ptr, stats, a2, c2, off, lut, o_ptr, n, bshift, gshift):
    """The plain numba launch (tens of microseconds of host time; 00 measures it): fallback when the lean launcher is unusable."""
    from numba import cuda

    from . import fastkernel as fk

    out_dtype = np.uint32 if p.dtype == "fp32" else np.uint16
    nblocks = p.nblocks
    arrays = dict(
        packed=_as_numba(a_ptr, p.nbytes, np.uint8),
        stats=_as_numba(stats, nblocks, np.uint8 if p.nested else np.float32),
        absmax2=_as_numba(a2, max(1, -(-nblocks // p.gsize)) if p.nested else 1, np.float32),
        code2=_as_numba(c2, 256 if p.nested else 1, np.float32),
        offset=_as_numba(off, 1, np.float32),
        lut=_as_numba(lut, 16, np.float32),
        out=_as_numba(o_ptr, n, out_dtype),
    )
    fk.launch_arrays(arrays["packed"], arrays["stats"], arrays["absmax2"], arrays["code2"], arrays["offset"],
                     arrays["lut"], arrays["out"], n=n, blocksize=p.blocksize, nested=p.nested, dtype=p.dtype,
                     nested_blocksize=p.gsize if p.nested else 256, stream=cuda.external_stream(stream),
                     path=path)


def _lean(dtype, nested, path):
    """The lean launcher for a variant, checked once against the dispatcher; None if unusable."""
    from . import fastkernel as fk

    key = (dtype, bool(nested), path)
    try:
        launcher = fk.lean_launcher(dtype, nested, path)
        # The self-check synchronizes, which stream capture forbids: a variant first met while a
        # CUDA graph is being captured is launched unchecked and checked at its next eager call.
        if key not in _lean_ready and not _torch().cuda.is_current_stream_capturing():
            with _lock:
                if key not in _lean_ready:
                    _self_check(launcher, dtype, nested, path)
                    _lean_ready[key] = launcher
        _lean_state["ok"] = True
        return launcher
    except Exception as exc:  # an ABI surprise in a numba/cuda-bindings release: stay correct, be slow
        _lean_state["ok"] = False
        _lean_ready.clear()
        warnings.warn(f"nf4lab.dequantize: lean kernel launch unavailable ({type(exc).__name__}: {exc}); "
                      "falling back to numba's dispatcher (correct, but tens of microseconds more per call)",
                      RuntimeWarning, stacklevel=3)
        return None


def _self_check(launcher, dtype, nested, path):
    """Launch a small case through the lean launcher and through numba's dispatcher: same bits, or raise."""
    torch = _torch()
    from . import fastkernel as fk

    g = torch.Generator().manual_seed(1)
    n, bs = 4 * 64 + 5, 32
    nb = -(-n // bs)
    dev = torch.device("cuda", torch.cuda.current_device())
    pk = torch.randint(0, 256, ((n + 1) // 2 + 16,), dtype=torch.uint8, generator=g).to(dev)
    if nested:
        stats = torch.randint(0, 256, (nb,), dtype=torch.uint8, generator=g).to(dev)
    else:
        stats = torch.rand(nb, generator=g).to(dev)
    a2 = torch.rand(16, generator=g).to(dev)
    c2 = torch.randn(256, generator=g).to(dev)
    off = torch.tensor([0.25]).to(dev)
    lut = device_lut("nf4", dev)
    tdtype = reference.torch_dtype(dtype)
    # Misalign on purpose for the scalar path, so the check runs the way it will be used.
    shift = 0 if path == "vector" else 1
    a_t = pk[shift:]
    outs = [torch.full((n + 8,), float("nan"), dtype=tdtype, device=dev) for _ in range(2)]
    p = _Plan()
    p.nbytes, p.nblocks, p.nested, p.gsize, p.dtype, p.blocksize = (n + 1) // 2, nb, nested, 2, dtype, bs
    stream = _raw_stream(dev)
    s_ptr = stats.data_ptr()
    ptrs = (s_ptr, a2.data_ptr(), c2.data_ptr(), off.data_ptr()) if nested else (s_ptr,) * 4
    for i, o in enumerate(outs):
        o_view = o[shift:] if path == "scalar" else o
        args = (a_t.data_ptr(), *ptrs, lut.data_ptr(), o_view.data_ptr(), n, 5, 1)
        if i == 0:
            launcher(stream, fk.grid_size(n, path, dtype), *args)
        else:
            _launch_dispatcher(p, path, stream, *args)
    torch.cuda.synchronize()
    if not torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8)):
        raise RuntimeError("lean launch and dispatcher launch disagree on a self-check case")
