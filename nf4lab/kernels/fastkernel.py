"""The CUDA kernels behind :func:`nf4lab.dequantize`, and the lean way to launch them.

Two kernels per (output dtype, nested statistics), compiled once each:

- ``vector``: each thread takes units of 16 output bytes (a u32 word of packed codes, 8
  weights, for bf16/fp16; half a word, 4 weights, for fp32) and writes each with one 128-bit
  store. Lane t of a warp handles unit base + t, so each warp's stores stay contiguous; a
  thread does ``WORDS_PER_THREAD`` units at stride ``THREADS``, all loads first. The last
  weights that do not fill a unit (the tail) are done by the one thread whose unit index
  equals the number of whole units, with narrow stores. Needs the packed data
  4-byte aligned and the output 16-byte aligned: a misaligned vector access is a sticky
  error that kills the CUDA context, so :func:`choose_path` checks before every launch.
- ``scalar``: one thread per packed byte, byte loads and 16/32-bit stores. Any alignment.

Both compute exactly what bitsandbytes' CUDA kernels compute::

    scale = fadd_rn(fmul_rn(code2[absmax_q[b]], absmax2[b >> gshift]), offset)   # nested
    scale = absmax[b]                                                          # not nested
    out   = round_to_nearest_even(fmul_rn(LUT[q], scale))

(separately rounded: numba would otherwise contract a*b+c into one FMA). The LUT is
``LUTS_CUDA[quant_type]``: for fp4 it differs from bitsandbytes' Python table at code 8.
bitsandbytes' kernels.cu computes fp4 as ``fp4_dequantization_lut[val & 7] * sign`` with
``sign = 1 - 2 * (val >> 3)`` (older releases: a comparison tree ``0.0f * absmax * sign``),
then ``* absmax``: code 8 gives ``0.0 * -1 = -0.0``, and -0.0 * absmax stays -0.0. Multiplying
by +-1 is exact, so a table holding the signed values (``-0.0`` at 8) gives the same bits for
every code. The magnitudes there (0.005208333333f, 0.66666667f, ...) round to the same
float32 values as the Python table's ``x / 12`` (checked in the tests).

Arguments (same order for both kernels, so one launcher serves both)::

    packed  u8[:]   packed_u32 u32[:] (same memory)   stats  (u8 absmax_q | f32 absmax)[:]
    absmax2 f32[:]  code2 f32[:]  offset f32[1]  lut f32[16]
    out     (u16 | u32)[:] output bits   out_u32 u32[:] (same memory)
    n u64  bshift u64 (log2 blocksize)  gshift u64 (log2 of state2.blocksize)

Kernels never read an array's shape (every bound comes from ``n``), which is what lets
the lean launcher pass raw pointers with a placeholder shape.
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from ..device import ops
from ..format.reference import FP4_LUT_CUDA, LUTS_CUDA  # noqa: F401  (re-exported)

# A module global, not a local of _build: the simulator swaps the name ``cuda`` in a
# kernel's globals for its fake module, and would miss a closure variable.
from numba import cuda  # noqa: E402

# One launch shape for every GPU: 256 threads x 2 units per thread. On the H200, 512-thread
# blocks left the kernel at 89% of copy; with every global load before the barrier (below), 256 x 2
# reached 98.3-99.1% of the traffic-matched bound at 4096x14336, 16384^2 and 8192x28672 on the H100
# and the H200 (lab/wall_small_shapes.py --focus; tools/launch_shapes.py checks the shipped shape).
THREADS = 256
# Units (16 output bytes each) per thread, at stride THREADS. A compile-time constant: the
# loops below are unrolled. Change the shape here only.
WORDS_PER_THREAD = 2

DTYPES = ("bf16", "fp16", "fp32")
PATHS = ("vector", "scalar")


# ---------------------------------------------------------------- kernels
def _build(dtype: str, nested: bool, path: str):
    wide = dtype == "fp32"
    pack = ops.pack_bf16x2 if dtype == "bf16" else ops.pack_f16x2
    to16 = ops.to_bf16_bits if dtype == "bf16" else ops.to_f16_bits
    fmul_rn, fadd_rn, float_bits = ops.fmul_rn, ops.fadd_rn, ops.float_bits
    store_u32x4 = ops.store_u32x4
    wpt = WORDS_PER_THREAD
    threads = THREADS

    # Variants are chosen here, in Python, so that each kernel only types the code it runs.
    if nested:
        @cuda.jit(device=True, inline="always")
        def scale_of(stats, absmax2, code2, offset, blk, gshift):
            return fadd_rn(fmul_rn(code2[stats[blk]], absmax2[blk >> gshift]), offset)
    else:
        @cuda.jit(device=True, inline="always")
        def scale_of(stats, absmax2, code2, offset, blk, gshift):
            return stats[blk]

    if wide:
        @cuda.jit(device=True, inline="always")
        def store_one(out, i, v):
            out[i] = float_bits(v)
    else:
        @cuda.jit(device=True, inline="always")
        def store_one(out, i, v):
            out[i] = to16(v)

    @cuda.jit(device=True, inline="always")
    def lut_load(lut, lut_s):
        # Shared-memory LUT: 16 lanes fill it, everyone waits. Not for speed (05 may find a global table as fast
        # or faster): code2 already needs this barrier, so the table adds only its 16 entries (06, section 2).
        tid = cuda.threadIdx.x
        if tid < 16:
            lut_s[tid] = lut[tid]
        cuda.syncthreads()

    if path == "vector":
        # A unit is what one 16-byte store holds: a whole packed word (8 weights) for 16-bit
        # output, half a word (4 weights) for fp32, so that every warp store instruction covers
        # 512 contiguous bytes (two 16-byte stores per lane, 32 bytes apart, would leave holes).
        ushift = np.uint64(2 if wide else 3)
        c2n = -(-256 // threads)   # code2 entries each thread copies into shared memory (nested)

        def kernel(packed, packed_u32, stats, absmax2, code2, offset, lut, out, out_u32, n, bshift, gshift):
            # Every global load of the block goes out first (words, statistics, the two small
            # tables), then one barrier, then the stores: a block waits on DRAM once. Reading
            # code2[absmax_q] from global memory after the data had arrived was a second dependent
            # round trip before the first store (lab/wall_small_shapes.py).
            lut_s = cuda.shared.array(16, np.float32)
            c2s = cuda.shared.array(256, np.float32)
            tid = cuda.threadIdx.x
            off = offset[0]
            nunits = n >> ushift
            nwords = n >> np.uint64(3)
            base = np.uint64(cuda.blockIdx.x) * np.uint64(threads * wpt) + np.uint64(tid)
            words = cuda.local.array(wpt, np.uint32)
            qs = cuda.local.array(wpt, np.uint32)
            gs = cuda.local.array(wpt, np.float32)
            for k in range(wpt):  # all loads first: wpt units' loads in flight per thread
                u = base + np.uint64(k * threads)
                wi = (u << ushift) >> np.uint64(3)
                words[k] = np.uint32(0)
                qs[k] = np.uint32(0)
                gs[k] = np.float32(0)
                if u < nunits:
                    blk = (u << ushift) >> bshift
                    if nested:
                        qs[k] = np.uint32(stats[blk])
                        gs[k] = absmax2[blk >> gshift]
                    else:
                        gs[k] = stats[blk]
                if wi < nwords:
                    words[k] = packed_u32[wi]
                elif u < nunits:
                    # fp32 only: the last whole unit may sit in a word that runs past the
                    # user's tensor; read just its two bytes.
                    j = u << np.uint64(1)
                    words[k] = np.uint32(packed[j]) | (np.uint32(packed[j + np.uint64(1)]) << np.uint32(8))
            entry = lut[tid & np.uint32(15)]
            c2 = cuda.local.array(c2n, np.float32)
            if nested:
                for j in range(c2n):
                    if tid + np.uint32(j * threads) < 256:
                        c2[j] = code2[tid + np.uint32(j * threads)]
            if tid < 16:
                lut_s[tid] = entry
            if nested:
                for j in range(c2n):
                    if tid + np.uint32(j * threads) < 256:
                        c2s[tid + np.uint32(j * threads)] = c2[j]
            cuda.syncthreads()
            for k in range(wpt):
                u = base + np.uint64(k * threads)
                first = u << ushift
                if u < nunits:
                    if nested:
                        s = fadd_rn(fmul_rn(c2s[qs[k]], gs[k]), off)
                    else:
                        s = gs[k]
                    # fp32: odd units take the upper two bytes of their word.
                    word = words[k] >> np.uint32((first & np.uint64(7)) << np.uint64(2))
                    b0 = word & np.uint32(0xFF)
                    b1 = (word >> np.uint32(8)) & np.uint32(0xFF)
                    # High nibble first: weight 2j is byte j >> 4, weight 2j+1 is byte j & 15.
                    v0 = fmul_rn(lut_s[b0 >> np.uint32(4)], s)
                    v1 = fmul_rn(lut_s[b0 & np.uint32(15)], s)
                    v2 = fmul_rn(lut_s[b1 >> np.uint32(4)], s)
                    v3 = fmul_rn(lut_s[b1 & np.uint32(15)], s)
                    if wide:
                        store_u32x4(out_u32, u << np.uint64(2), float_bits(v0), float_bits(v1), float_bits(v2),
                                    float_bits(v3))
                    else:
                        b2 = (word >> np.uint32(16)) & np.uint32(0xFF)
                        b3 = word >> np.uint32(24)
                        v4 = fmul_rn(lut_s[b2 >> np.uint32(4)], s)
                        v5 = fmul_rn(lut_s[b2 & np.uint32(15)], s)
                        v6 = fmul_rn(lut_s[b3 >> np.uint32(4)], s)
                        v7 = fmul_rn(lut_s[b3 & np.uint32(15)], s)
                        store_u32x4(out_u32, u << np.uint64(2), pack(v0, v1), pack(v2, v3),
                                    pack(v4, v5), pack(v6, v7))
                elif u == nunits:
                    # The tail: fewer weights than a unit, too few for a vector store.
                    i = first
                    while i < n:
                        byte = packed[i >> np.uint64(1)]
                        q = (byte & np.uint8(15)) if (i & np.uint64(1)) else (byte >> np.uint8(4))
                        s = scale_of(stats, absmax2, code2, off, i >> bshift, gshift)
                        store_one(out, i, fmul_rn(lut_s[q], s))
                        i += np.uint64(1)
    else:
        def kernel(packed, packed_u32, stats, absmax2, code2, offset, lut, out, out_u32, n, bshift, gshift):
            lut_s = cuda.shared.array(16, np.float32)
            lut_load(lut, lut_s)
            off = offset[0]
            j = np.uint64(cuda.blockIdx.x) * np.uint64(threads) + np.uint64(cuda.threadIdx.x)
            i = j << np.uint64(1)
            if i < n:
                byte = packed[j]
                s = scale_of(stats, absmax2, code2, off, i >> bshift, gshift)
                store_one(out, i, fmul_rn(lut_s[byte >> np.uint8(4)], s))
                if i + np.uint64(1) < n:
                    # Both weights of a byte share a block: blocksizes are even.
                    store_one(out, i + np.uint64(1), fmul_rn(lut_s[byte & np.uint8(15)], s))

    kernel.__name__ = f"nf4lab_dequant_{path}_{dtype}_{'nested' if nested else 'plain'}"
    if runtime.SIMULATOR:
        return cuda.jit(kernel), None
    sig = signature(dtype, nested)
    return cuda.jit(sig)(kernel), sig


def signature(dtype: str, nested: bool):
    from numba import types

    u8, u16, u32, f32, u64 = types.uint8, types.uint16, types.uint32, types.float32, types.uint64
    arr = lambda t: types.Array(t, 1, "C")  # noqa: E731
    stats = arr(u8) if nested else arr(f32)
    out = arr(u32) if dtype == "fp32" else arr(u16)
    return (arr(u8), arr(u32), stats, arr(f32), arr(f32), arr(f32), arr(f32), out, arr(u32), u64, u64, u64)


_KERNELS: dict = {}
_KERNELS_LOCK = threading.Lock()


def get_kernel(dtype: str, nested: bool, path: str):
    """The compiled kernel (and its signature) for one variant, compiled on first use only."""
    key = (dtype, bool(nested), path)
    k = _KERNELS.get(key)
    if k is None:
        with _KERNELS_LOCK:
            k = _KERNELS.get(key)
            if k is None:
                k = _KERNELS[key] = _build(dtype, bool(nested), path)
    return k


# ---------------------------------------------------------------- path and grid
def choose_path(packed_addr: int, out_addr: int) -> str:
    """``vector`` only where every 128-bit store and 32-bit load is aligned, else ``scalar``."""
    return "vector" if packed_addr % 4 == 0 and out_addr % 16 == 0 else "scalar"


def grid_size(n: int, path: str, dtype: str) -> int:
    if path == "vector":
        # One more unit than whole units, for the tail thread. Units: 8 weights, 4 for fp32.
        units = (n >> (2 if dtype == "fp32" else 3)) + 1
        return max(1, -(-units // (THREADS * WORDS_PER_THREAD)))
    return max(1, -(-((n + 1) >> 1) // THREADS))


def log2_exact(x: int, name: str) -> int:
    x = int(x)
    if x <= 0 or x & (x - 1):
        raise ValueError(f"{name} must be a power of two, got {x}")
    return x.bit_length() - 1


# ---------------------------------------------------------------- launch on device arrays
def address(arr) -> int:
    """Data address of a torch tensor, numba device array or simulator array."""
    if hasattr(arr, "data_ptr"):
        return int(arr.data_ptr())
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    host = arr
    while not isinstance(host, np.ndarray):  # simulator arrays wrap a numpy array
        host = host.__dict__.get("_ary", None) if hasattr(host, "__dict__") else None
        if host is None:
            raise TypeError(f"cannot find the data address of {type(arr).__name__}")
    return int(host.__array_interface__["data"][0])


def _u32_view(arr, nbytes_used: int):
    """A uint32 view of the first whole words of a byte/16-bit array (vector path only)."""
    words = nbytes_used // 4
    flat = arr.view(np.uint8)[: words * 4]
    return flat.view(np.uint32)


def launch_arrays(packed, stats, absmax2, code2, offset, lut, out, *, n: int, blocksize: int,
                  nested: bool, dtype: str, nested_blocksize: int = 256, stream=0, path: str | None = None) -> str:
    """Run the dequantization on numba device arrays (or simulator arrays) through numba's dispatcher.

    ``packed`` uint8, ``stats`` uint8 absmax_q (nested) or float32 absmax, ``offset`` a
    1-element float32 array, ``lut`` 16 float32 (see ``LUTS_CUDA``), ``out`` uint16 bits
    (bf16/fp16) or uint32 bits (fp32) with at least n elements. Returns the path taken.
    This is the tested reference launch; :func:`nf4lab.dequantize` uses :class:`LeanLauncher`
    on torch tensors where it can.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if n <= 0:
        return "none"
    bshift = log2_exact(blocksize, "blocksize")
    gshift = log2_exact(nested_blocksize, "state2.blocksize") if nested else 0
    if path is None:
        path = choose_path(address(packed), address(out))
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    kernel, _ = get_kernel(dtype, nested, path)
    if path == "vector":
        packed_u32 = _u32_view(packed, ((n >> 3) * 4))
        out_u32 = _u32_view(out, n * (4 if dtype == "fp32" else 2) // 16 * 16)
    else:
        packed_u32 = _u32_view(packed, 0)
        out_u32 = _u32_view(out, 0)
    kernel[grid_size(n, path, dtype), THREADS, stream](
        packed, packed_u32, stats, absmax2, code2, offset, lut, out, out_u32,
        np.uint64(n), np.uint64(bshift), np.uint64(gshift))
    return path


# ---------------------------------------------------------------- lean launch (GPU only)
_PLACEHOLDER = 1 << 40  # the shape the dequantization kernels never read


class ParamLayout:
    """numba's kernel parameter block for a signature, derived from its argument types, for launching a
    compiled kernel with ``cuLaunchKernel`` from raw pointers.

    numba flattens each argument into kernel parameters: an array of ``ndim`` dimensions into meminfo, parent,
    nitems, itemsize, data, shape[0..ndim), strides[0..ndim) (8 bytes each), a scalar into one parameter
    of its own size. Each parameter sits at its natural alignment, as the CUDA ABI lays out the block.
    An array argument is given to :meth:`pack_into` as ``(data pointer, element count)`` (C-contiguous,
    1-D: its shape and strides follow), a scalar as its value."""

    def __init__(self, argtypes):
        import struct

        from numba import types

        fmt, off = ["<"], 0
        self.offsets = []     # byte offset of each kernel parameter: cuLaunchKernel gets a pointer to each
        self.data = []        # per array argument: its data pointer's 8-byte slot
        self.scalars = []     # per scalar argument: its slot (8-byte scalars) or byte offset // 8
        self.kinds = []       # per argument: ("array", itemsize) or ("scalar", struct code)

        def put(code, size):
            nonlocal off
            pad = -off % size
            if pad:
                fmt.append(f"{pad}x")
            off += pad
            self.offsets.append(off)
            fmt.append(code)
            off += size

        for t in argtypes:
            if isinstance(t, types.Array):
                if t.ndim != 1 or t.layout != "C":
                    raise TypeError(f"ParamLayout: only 1-D C-contiguous arrays, got {t}")
                for _ in range(7):          # meminfo, parent, nitems, itemsize, data, shape[0], strides[0]
                    put("q", 8)
                self.data.append(self.offsets[-3] // 8)
                self.kinds.append(("array", t.dtype.bitwidth // 8))
            elif isinstance(t, types.Float):
                code = {32: "f", 64: "d"}[t.bitwidth]
                put(code, t.bitwidth // 8)
                self.scalars.append(self.offsets[-1] // 8)
                self.kinds.append(("scalar", code))
            elif isinstance(t, types.Integer):
                code = {8: "b", 16: "h", 32: "i", 64: "q"}[t.bitwidth]
                code = code if t.signed else code.upper()
                put(code, t.bitwidth // 8)
                self.scalars.append(self.offsets[-1] // 8)
                self.kinds.append(("scalar", code))
            else:
                raise TypeError(f"ParamLayout: no layout for argument type {t}")
        if -off % 8:
            fmt.append(f"{-off % 8}x")
        self.struct = struct.Struct("".join(fmt))
        self.size = self.struct.size

    def values(self, *args) -> tuple:
        """The parameters' values, in order, for one launch's arguments."""
        if len(args) != len(self.kinds):
            raise TypeError(f"ParamLayout: {len(self.kinds)} arguments, got {len(args)}")
        vals = []
        for (kind, what), a in zip(self.kinds, args):
            if kind == "array":
                ptr, count = a
                vals += (0, 0, count, what, ptr, count, what)
            else:
                vals.append(a)
        return tuple(vals)

    def pack_into(self, buf, *args) -> None:
        """Write the whole parameter block of a launch with ``args`` into ``buf``."""
        self.struct.pack_into(buf, 0, *self.values(*args))


class ParamBlock:
    """A parameter block in memory of its own and the array of pointers to its parameters that
    ``cuLaunchKernel`` takes; ``view`` writes an 8-byte slot in place (a data pointer between launches,
    no repacking). cuLaunchKernel copies the parameters before it returns, so the block may be rewritten
    right after a launch."""

    __slots__ = ("layout", "buf", "params", "params_addr", "view")

    def __init__(self, layout: ParamLayout, *args):
        import ctypes

        self.layout = layout
        self.buf = ctypes.create_string_buffer(layout.size)
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_uint64 * len(layout.offsets))(*(base + o for o in layout.offsets))
        self.params_addr = ctypes.addressof(self.params)
        self.view = memoryview(self.buf).cast("B").cast("q")
        if args:
            layout.pack_into(self.buf, *args)


@functools.cache
def driver_launch():
    """``cuLaunchKernel`` as a plain C call (ctypes on the driver library): cuda.bindings' wrapper
    builds Python objects for the function, the stream and the parameters on every call, which
    costs several microseconds a launch at decode sizes. Returns ``f(func, grid, threads, stream,
    params, smem=0) -> CUresult as int``; cuda.bindings where the library cannot be opened. Every launcher
    that uses it is checked bit for bit against numba's own launch before it serves. Made on first
    use (there is no driver without a GPU), once per process."""
    import ctypes
    import os

    try:
        lib = ctypes.WinDLL("nvcuda.dll") if os.name == "nt" else ctypes.CDLL("libcuda.so.1")
        c_launch = lib.cuLaunchKernel
    except (OSError, AttributeError):
        from cuda.bindings import driver as cu

        def launch(func, grid, threads, stream, params, smem=0):
            err, = cu.cuLaunchKernel(func, grid, 1, 1, threads, 1, 1, smem, stream, params, 0)
            return int(err)

        return launch
    u = ctypes.c_uint
    c_launch.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    c_launch.restype = ctypes.c_int

    def launch(func, grid, threads, stream, params, smem=0):
        return c_launch(func, grid, 1, 1, threads, 1, 1, smem, stream, params, None)

    return launch


class LeanLauncher:
    """Launch one compiled dequantization kernel with ``cuLaunchKernel`` from raw pointers.

    numba's dispatcher costs tens of microseconds a launch (notebook 00 measures it) in type checks,
    argument wrapping and torch -> device array conversion. Here the parameter block (:class:`ParamBlock`, laid out
    from the kernel's signature) is built once; a call writes the 12 changing values into their
    slots (through a memoryview) and launches. A lock keeps two threads from interleaving their writes.
    """

    def __init__(self, dtype: str, nested: bool, path: str):
        kernel, sig = get_kernel(dtype, nested, path)
        compiled = kernel.overloads[sig] if sig in kernel.overloads else kernel.overloads[tuple(sig)]
        self._setup(int(compiled._codelibrary.get_cufunc().handle), driver_launch(), sig, path, dtype)

    def _setup(self, func: int, launch, sig, path: str, dtype: str) -> None:
        """Everything but the compiled kernel (tests build a launcher around a fake launch)."""
        self._launch, self._func = launch, func
        self.path, self.dtype = path, dtype
        layout = ParamLayout(sig)
        # Every array with the placeholder shape (the kernels never read one), pointers and scalars written per call.
        self._block = ParamBlock(layout, *([(0, _PLACEHOLDER)] * len(layout.data)), 0, 0, 0)
        self._params_addr = self._block.params_addr
        self._slots = np.frombuffer(self._block.buf, np.int64)   # the block's 8-byte slots, read-only use (lab/)
        self._data, self._scalars = layout.data, layout.scalars
        self._lock = threading.Lock()
        # Writes through a memoryview: a numpy item assignment costs about 0.1 us, twelve a launch.
        self._view = self._block.view

    def __call__(self, stream: int, grid: int, packed: int, stats: int, absmax2: int, code2: int,
                 offset: int, lut: int, out: int, n: int, bshift: int, gshift: int) -> None:
        d, c = self._data, self._scalars
        with self._lock:
            s = self._view
            s[d[0]] = packed
            s[d[1]] = packed
            s[d[2]] = stats
            s[d[3]] = absmax2
            s[d[4]] = code2
            s[d[5]] = offset
            s[d[6]] = lut
            s[d[7]] = out
            s[d[8]] = out
            s[c[0]] = n
            s[c[1]] = bshift
            s[c[2]] = gshift
            err = self._launch(self._func, grid, THREADS, stream, self._params_addr)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed: CUresult {err}")

    def grid(self, n: int) -> int:
        """The launch's grid for ``n`` weights (:func:`grid_size` for this launcher's path and dtype)."""
        return grid_size(n, self.path, self.dtype)


_LEAN: dict = {}


def lean_launcher(dtype: str, nested: bool, path: str) -> LeanLauncher:
    key = (dtype, bool(nested), path)
    ln = _LEAN.get(key)
    if ln is None:
        ln = _LEAN[key] = LeanLauncher(dtype, nested, path)
    return ln
