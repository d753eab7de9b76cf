"""The fused NF4 GEMV of notebook 09, ``y = x @ W.T`` for 1 to 8 rows of x, W (N, K) in bitsandbytes' NF4
(``launch``), its float64 check (``make_gemv_case``, ``check``) and its benchmark beside bitsandbytes.

A code byte costs one PRMT (its table address) and one 32-bit shared load, whose result (the byte's two NF4
values as a bf16x2/f16x2 pair) is an ``mma.sync`` A-fragment register as it stands; the tensor core sums in
float32. Notebook 09 builds the same kernel cell by cell (tests/test_nb09.py pins both to one PTX). Below sm_80
(a T4) fp16 runs as two m16n8k8, bf16 on the FP32 units (:mod:`.warp_ops`); everything fits a T4's 64 KB.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from ..lesson import cases, reference
from ..measure import bench, results
from ..measure.bench import COPY  # the copy ceiling's record name: one spelling, bench's
from . import arch, ops
from .fastkernel import address
from .warp_ops import (_lookup_at, default_base, f32_from_bits, load_stream_u32x4, lookup, mma_bf16,  # noqa: F401
                       mma_f16, prmt, probe_base, shfl_xor_sync, table_lookup)
from numba import cuda, float32, types, uint32, uint64  # noqa: E402  (globals the simulator swaps in kernels)

LLM_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))  # (N, K) = W.shape
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
NAME = "09_fused_gemv"
MAX_M = 8                       # batch rows of x the kernel takes (each weight byte is still read once)
THREADS, W = 256, 8             # threads and warps per block
BLOCKS_PER_SM = 2               # 64 KB of shared memory and <= 128 registers each: measured best (lab/gemv_mma.py)
# The table: entry e of lane l at word (e << 6) | l; words 32..63 of each 256-byte row are spare and hold the
# 16 values (row 8), code2 (rows 0..7: code2_word) and the warps' partial sums (rows 128..255: spare).
LUT = (8 << 6) | 32             # value i at word LUT + i
SMEM = 4 * 256 * 64             # dynamic shared memory of every launch: the whole table
FB = 24                         # words per step in a lane's buffer: 16 code words, 4 absmax codes, 4 absmax2


@cuda.jit(device=True, inline="always")
def code2_word(c):  # code2[c], c < 256: bank c & 31, as in a flat array
    return c + (c & uint32(0xE0)) + uint32(32)


@cuda.jit(device=True, inline="always")
def spare(i):  # partial sum i < 2048 (2 tiles x W warps x 16 rows x M): words 32..47 of rows 128..255
    return ((i >> uint32(4)) << uint32(6)) | uint32((128 << 6) | 32) | (i & uint32(15))


@functools.cache
def step_ops(is_bf16, M, base, nested=True):
    """(look, half_bits, fetch): the table lookup, the output conversion, a step's loads (lab/gemv_pp.py too)."""
    WIDE = M > 1                      # where a lane's two 16-byte pieces lie (see fetch)
    look = table_lookup(base)

    @cuda.jit(device=True, inline="always")
    def half_bits(v):
        return uint32(ops.to_bf16_bits(v)) if is_bf16 else uint32(ops.to_f16_bits(v))

    @cuda.jit(device=True, inline="always")
    def put(buf, i, packed_u32, w):
        buf[i], buf[i + 1], buf[i + 2], buf[i + 3] = load_stream_u32x4(packed_u32, uint64(w))

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, packed_u32, absmax_q, absmax2, t, c, g, q, n, kw, tiles, steps, ash):
        """Step c of row tile t into buf[o:o+24]: lane q's pieces of rows g, g + 8 (M = 1: columns 64q..; a batch:
        32q.. and 128 + 32q.., whole 32-byte sectors per row) and the statistics of its C columns (clamped)."""
        tt, cc = min(t, uint32(tiles - uint32(1))), min(c, uint32(steps - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
        if WIDE:
            wq0 = min(uint32(cc * uint32(32) + uint32(4) * q), uint32(kw - uint32(4)))
            wq1 = min(uint32(cc * uint32(32) + uint32(16) + uint32(4) * q), uint32(kw - uint32(4)))
            put(buf, o, packed_u32, r0 * kw + wq0)
            put(buf, o + 4, packed_u32, r0 * kw + wq1)
            put(buf, o + 8, packed_u32, r1 * kw + wq0)
            put(buf, o + 12, packed_u32, r1 * kw + wq1)
        else:
            wq = min(uint32(cc * uint32(32) + uint32(8) * q), uint32(kw - uint32(8)))   # lane q's first word
            w0, w1 = uint32(r0 * kw + wq), uint32(r1 * kw + wq)
            put(buf, o, packed_u32, w0)
            put(buf, o + 4, packed_u32, w0 + uint32(4))
            put(buf, o + 8, packed_u32, w1)
            put(buf, o + 12, packed_u32, w1 + uint32(4))
        if (q >> uint32(1)) < uint32(M):
            wb = cc * uint32(32) + uint32(16) * (q & uint32(1))
            for i in range(4):
                r = r0 if i < 2 else r1
                blk = uint32(r * kw + min(uint32(wb + uint32(8 * (i % 2))), uint32(kw - uint32(8)))) >> ash
                if nested:
                    buf[o + 16 + i] = uint32(absmax_q[blk])
                buf[o + 20 + i] = ops.float_bits(absmax2[blk >> uint32(8)] if nested else absmax2[blk])

    return look, half_bits, fetch


@functools.cache
def make_kernel(is_bf16, M, base, nested=True, D=1, min_blocks=BLOCKS_PER_SM):
    """The kernel for a dtype, batch M (1..8), table base (``probe_base()``) and kind of statistics; ``D`` (steps
    of loads in flight ahead) and ``min_blocks`` (blocks per SM) are lab/gemv_mma.py's knobs."""
    NT, WIDE = (M + 1) // 2, M > 1    # n-tiles of 8 columns (2 batch rows x 4 blocks); where a lane's pieces lie
    NACC, NCF, NB = 2 * NT, 4 * NT, FB * (D + 1)
    mma = mma_bf16 if is_bf16 else mma_f16
    look, half_bits, fetch = step_ops(is_bf16, M, base, nested)

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_tc(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw, kx = k >> uint32(3), k >> uint32(1)
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        ash, grid = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x)
        buf = cuda.local.array(NB, uint32)
        t, c = uint32(cuda.blockIdx.x), warp
        tp, cp = t, c                  # the step whose loads go out next: the first D before the table is built
        for d in range(D):
            fetch(buf, FB * (d + 1), packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            cp = uint32(cp + uint32(W))
            if cp >= steps:
                cp, tp = warp, uint32(tp + grid)
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        if nested:
            sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):    # the used half of each 256-byte row
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
        lane4, parity = lane << uint32(2), uint32(0)
        acc, cf, s = cuda.local.array(NACC, float32), cuda.local.array(NCF, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        while t < tiles:
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:
                for i in range(FB * D):
                    buf[i] = buf[i + FB]
                fetch(buf, FB * D, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp, tp = warp, uint32(tp + grid)
                cn = uint32(c + uint32(W))
                tn = t
                if cn >= steps:
                    cn, tn = warp, uint32(t + grid)
                if c < steps:
                    for i in range(NCF):
                        cf[i] = float32(0.0)
                    xcol = uint32(c * uint32(256) + uint32(64) * q)   # lane q's 64 columns: block q of the step
                    for h in range(2):                 # the lane's two 16-byte pieces, 8 mmas each
                        if WIDE:                       # piece h: 32 columns at 128 h + 32 q, block 2 h + q // 2
                            xcol = uint32(c * uint32(256) + uint32(128 * h) + uint32(32) * q)
                            blk = uint32(2 * h) + (q >> uint32(1))
                        else:
                            blk = q
                        for i in range(8):
                            wa, wb = buf[4 * h + (i >> 1)], buf[8 + 4 * h + (i >> 1)]
                            sel0, sel1 = uint32(0x5504 | (2 * (i & 1)) << 4), uint32(0x5504 | (2 * (i & 1) + 1) << 4)
                            A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                            A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                            A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                            A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                        for nt in range(NT):
                            # B: lane (g, q) holds column g = 4 mm + b: x of batch row 2 nt + mm where b is its block
                            m = uint32(2 * nt) + (g >> uint32(2))
                            if (blk if WIDE else q) == (g & uint32(3)) and m < uint32(M) and xcol < k:
                                xi = uint64(m * kx + (xcol >> uint32(1)) + uint32(0 if WIDE else 16 * h))
                                for j in range(4):
                                    xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = \
                                        ops.load_u32x4(x_u32, xi + uint64(4 * j))
                            else:
                                for j in range(16):
                                    xr[j] = uint32(0)
                            for i in range(8):
                                cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3] = mma(
                                    A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3], xr[2 * i], xr[2 * i + 1],
                                    cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3])
                    # lane q holds columns 2q, 2q+1: batch row 2 nt + q // 2, blocks 2 (q & 1), +1; rows g, g + 8
                    if (q >> uint32(1)) < uint32(M):
                        for i in range(4):
                            s[i] = (ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(buf[16 + i])]),
                                                            f32_from_bits(buf[20 + i])), offset)
                                    if nested else f32_from_bits(buf[20 + i]))
                        for nt in range(NT):
                            acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                            acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
                c = cn
                if tn != t:
                    break
            # the warps' partial sums of this tile meet in shared memory (lanes q, q ^ 1 hold the same batch row)
            base = uint32(parity * uint32(W * 16 * M) + warp * uint32(16 * M))
            for nt in range(NT):
                a0 = acc[2 * nt] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt], 1)
                a1 = acc[2 * nt + 1] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt + 1], 1)
                m = uint32(2 * nt) + (q >> uint32(1))
                if m < uint32(M) and (q & uint32(1)) == uint32(0):
                    sm[spare(base + m * uint32(16) + g)] = ops.float_bits(a0)
                    sm[spare(base + m * uint32(16) + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16 * M):
                first, v = uint32(parity * uint32(W * 16 * M) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16 * M))])
                row = uint32(t * uint32(16) + (tid & uint32(15)))
                if row < n:
                    y[uint32((tid >> uint32(4)) * n + row)] = half_bits(v)
            parity, t = parity ^ uint32(1), tn

    return gemv_tc


_SMS: dict = {}  # per device: device_info asks the driver for much more, tens of microseconds a launch


def sms():
    """The GPU's SM count (the simulator plans for an H100)."""
    dev = cuda.get_current_device().id if runtime.ON_GPU else None
    if dev not in _SMS:
        _SMS[dev] = runtime.device_info().get("sms") or 132
    return _SMS[dev]


def kernel(dtype, M=1, nested=True):
    """The shipped kernel for a dtype, batch and kind of statistics (compiled at its first launch)."""
    return make_kernel(dtype == "bf16", M, probe_base() if runtime.ON_GPU else default_base(arch.target_cc()), nested)


def grid_size(N) -> int:
    """Persistent blocks: one per 16-row tile, up to BLOCKS_PER_SM per SM."""
    return min(-(-N // 16), BLOCKS_PER_SM * sms())


def prepare(kern, args, nbytes=SMEM):
    """Let ``kern`` use ``nbytes`` of dynamic shared memory with ``args``: past 48 KB, an attribute numba won't set."""
    if runtime.SIMULATOR:
        return kern
    argtypes = tuple(kern.typeof_pyval(a) for a in args)
    done = kern.__dict__.setdefault("_nf4lab_dynamic_smem", {})
    if done.get(argtypes, 0) < nbytes:
        from numba.cuda.cudadrv.driver import binding, driver

        f = kern.compile(argtypes)._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), f.handle, f.device.id)
        done[argtypes] = nbytes
    return kern


def launch(g):
    """Run the fused GEMV on a :class:`GemvBuffers` on g.stream (``g.grid``, if set, replaces grid_size)."""
    validate(g)  # raises before anything is launched
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    prepare(kernel(g.dtype, g.M, g.nested), args)[g.grid or grid_size(g.N), THREADS, g.stream, SMEM](*args)


def signature():
    """The kernel's argument types, for PTX and SASS."""
    u32, f32, i64 = types.uint32[::1], types.float32[::1], types.int64
    return u32, types.uint8[::1], f32, f32, f32, types.float32, u32, types.uint16[::1], i64, i64, i64


@dataclasses.dataclass
class GemvBuffers:
    packed_u32: object      # uint32 view of the packed codes (16-byte aligned)
    absmax_q: object
    absmax2: object         # nested=False: one float32 absmax per block (absmax_q, code2, offset unused)
    code2: object
    lut: object
    offset: np.float32
    x_u32: object           # uint32 view of x's bits (M, K) flattened: x[m, 2j] low half of word m*K/2 + j
    y: object               # uint16 (M * N) output bits
    N: int
    K: int
    M: int
    bs_shift: int           # log2(blocksize)
    dtype: str
    stream: object = 0
    grid: int | None = None  # replaces grid_size (tests: the grid-stride loop)
    nested: bool = True

    def result(self):
        cuda.synchronize()
        return self.y.copy_to_host()


def validate(g) -> None:
    """Raise on bad input, naming the parameter, before a launch reads out of bounds or kills the CUDA context."""
    if g.dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be 'bf16' or 'fp16', got {g.dtype!r}")
    for name in ("N", "K", "M", "bs_shift"):
        if isinstance(getattr(g, name), bool) or not isinstance(getattr(g, name), (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(getattr(g, name)).__name__}")
    if not 1 <= g.M <= MAX_M:
        raise ValueError(f"M={g.M}: this kernel takes 1 to {MAX_M} rows of x (batch), got {g.M}")
    if g.N < 1:
        raise ValueError(f"N={g.N}: W needs at least one row")
    if not 6 <= g.bs_shift <= 12:
        raise ValueError(f"blocksize {2 ** g.bs_shift}: a power of two in 64..4096 is needed (bs_shift={g.bs_shift})")
    if g.K % 64:
        raise ValueError(f"K={g.K}: the fused kernel needs K a multiple of 64 (a lane takes 64 consecutive columns "
                         "of a row, one absmax block)")
    if g.N * g.K // 8 >= 1 << 32:
        raise ValueError(f"N*K={g.N * g.K}: word indices must fit in 32 bits (N*K < 2**35)")
    if not isinstance(g.offset, (float, np.floating)):
        raise TypeError(f"offset must be a float32 scalar, got {type(g.offset).__name__}")
    blocks = -(-g.N * g.K // (1 << g.bs_shift))
    need = {"packed_u32": (np.uint32, -(-g.N * g.K // 8)), "absmax_q": (np.uint8, blocks if g.nested else 0),
            "absmax2": (np.float32, -(-blocks // reference.NESTED_BLOCKSIZE) if g.nested else blocks),
            "code2": (np.float32, 256 if g.nested else 0), "lut": (np.float32, 16),
            "x_u32": (np.uint32, g.M * g.K // 2), "y": (np.uint16, g.M * g.N)}
    for name, (dt, n) in need.items():
        arr = getattr(g, name)
        if arr is None or not hasattr(arr, "dtype") or not hasattr(arr, "shape"):
            raise TypeError(f"{name} must be a device array, got {type(arr).__name__}")
        if np.dtype(arr.dtype) != np.dtype(dt):
            raise TypeError(f"{name} must have dtype {np.dtype(dt).name}, got {np.dtype(arr.dtype).name}")
        if len(arr.shape) != 1:
            raise ValueError(f"{name} must be 1-D (flattened), got shape {tuple(arr.shape)}")
        if arr.shape[0] < n:
            raise ValueError(f"{name} has {arr.shape[0]} elements; N={g.N}, K={g.K}, M={g.M} need {n}")
        if name in ("packed_u32", "x_u32") and address(arr) % 16:
            raise ValueError(f"{name} is not 16-byte aligned (address {address(arr):#x}): read with 128-bit loads")


def make_gemv_buffers(gc) -> GemvBuffers:
    """Device buffers of a :class:`GemvCase` (the output poisoned with NaN)."""
    packed = np.pad(gc.packed, (0, -gc.packed.size % 16))  # whole 16-byte vectors
    return GemvBuffers(
        packed_u32=cuda.to_device(packed).view(np.uint32), absmax_q=cuda.to_device(gc.absmax_q),
        absmax2=cuda.to_device(gc.absmax2), code2=cuda.to_device(gc.code2), lut=cuda.to_device(gc.lut),
        offset=np.float32(gc.offset), x_u32=cuda.to_device(np.ascontiguousarray(gc.x_bits).reshape(-1).view(np.uint32)),
        y=cuda.to_device(np.full(gc.M * gc.N, 0x7FBF, np.uint16)),  # poisoned: a NaN no kernel writes
        N=gc.N, K=gc.K, M=gc.M, bs_shift=int(gc.blocksize).bit_length() - 1, dtype=gc.dtype, nested=gc.nested)


_LUT = {}  # per device: the 16 NF4 values


def buffers_from_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, y, stream=0) -> GemvBuffers:
    """Zero-copy GemvBuffers over torch CUDA tensors: x (M, K), y (M, N), W (N, K) = ``shape`` in NF4 with nested
    statistics (a QuantState's absmax, state2.absmax, state2.code, offset and blocksize)."""
    import torch

    dev = x.device.index or 0
    if dev not in _LUT:
        _LUT[dev] = cuda.to_device(reference.NF4_LUT.astype(np.float32))
    arr = lambda t, dt=None: cuda.as_cuda_array(t.reshape(-1).view(dt) if dt else t.reshape(-1))  # noqa: E731
    N, K = shape
    return GemvBuffers(packed_u32=arr(packed, torch.int32).view(np.uint32), absmax_q=arr(absmax_q),
                       absmax2=arr(absmax2), code2=arr(code2), lut=_LUT[dev], offset=np.float32(offset),
                       x_u32=arr(x, torch.int32).view(np.uint32), y=arr(y, torch.int16).view(np.uint16), N=int(N),
                       K=int(K), M=x.numel() // K, bs_shift=int(blocksize).bit_length() - 1,
                       dtype={torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype], stream=stream)


def launch_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, out):
    """y = x @ W.T into ``out`` on torch's current stream (the tensors as :func:`buffers_from_torch` takes them)."""
    import torch

    stream = cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream)
    launch(buffers_from_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, out, stream))


# ---------------------------------------------------------------- the float64 check (notebook 09, section 4)
EPS32 = float(np.finfo(np.float32).eps)        # 2^-23
UNIT_OUT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}  # unit roundoff of the output


@dataclasses.dataclass(repr=False)
class GemvCase:
    N: int
    K: int
    M: int
    dtype: str
    blocksize: int
    packed: np.ndarray      # uint8, N*K/2, high nibble first, flat index row*K + col
    absmax_q: np.ndarray    # uint8 per block
    absmax2: np.ndarray     # float32 per 256 blocks (nested=False: per block; absmax_q, code2 unused)
    code2: np.ndarray       # float32[256]
    offset: np.float32
    lut: np.ndarray         # float32[16]
    x_bits: np.ndarray      # uint16 (M, K): the activations as bf16/fp16 bits
    x: np.ndarray           # float32 (M, K): the same values
    w: np.ndarray           # float32 (N, K): what bitsandbytes dequantizes to before the output cast
    y64: np.ndarray         # float64 (M, N): x @ w.T in float64
    case: object = None     # the nf4lab.lesson.cases.Case it was made from
    nested: bool = True


def tolerance(x, w, dtype, table=False):
    """Allowed |y - y64| for a float32 dot product of length K rounded to ``dtype`` (x, w numpy or torch). Any float32
    sum of K products, in any order, is within about K * u32 * sum|x_k w_k| of the exact one (Higham); K * eps32
    (twice that) also covers the block scale's product, and rounding to the dtype adds u * |y|. ``table``: the NF4
    values rounded to the dtype (mma takes bf16/fp16), each off by a factor 1 +- u at most: u * sum|x w| more."""
    x, w = (x.double(), w.double()) if hasattr(x, "double") else (np.asarray(x, np.float64), np.asarray(w, np.float64))
    s, u = abs(x) @ abs(w).T, UNIT_OUT[dtype]
    return (1 + u) * (x.shape[-1] * EPS32 * s) + u * abs(x @ w.T) + np.finfo(np.float32).tiny + (u * s if table else 0)


def make_gemv_case(N, K, dtype="bf16", M=1, dist="randn", seed=0, blocksize=64, x_dist="randn",
                   nested=True) -> GemvCase:
    """W (N, K) quantized by bitsandbytes (nf4lab.lesson.cases, cached; ``dist`` as there), x (M, K) rounded to the
    dtype (``x_dist``: "randn", or "heavy": Student t with 2 degrees of freedom plus a few outlier columns 100x
    larger, as LLM activations have) and y64. ``nested=False``: each block's absmax as one float32."""
    if x_dist not in ("randn", "heavy"):
        raise ValueError(f"x_dist must be 'randn' or 'heavy', got {x_dist!r}")
    case = cases.make_case((N, K), dtype=dtype, dist=dist, seed=seed, blocksize=blocksize)
    absmax = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
    w = reference.dequantize_f32(case.packed, absmax, case.n, blocksize).reshape(N, K)
    rng = np.random.default_rng(1000 + seed)
    xf = rng.standard_normal((M, K)) if x_dist == "randn" else rng.standard_t(2.0, (M, K))
    if x_dist == "heavy":
        xf[:, rng.choice(K, size=max(1, K // 64), replace=False)] *= 100.0
        xf = np.clip(xf, -3e4, 3e4)  # inside the fp16 range
    x_bits = reference.f32_to_bits(xf.astype(np.float32), dtype).reshape(M, K)
    x = reference.bits_to_f32(x_bits, dtype).reshape(M, K)
    stats = (dict(absmax_q=case.absmax_q, absmax2=case.absmax2, code2=case.code2) if nested else
             dict(absmax_q=np.zeros(1, np.uint8), absmax2=np.asarray(absmax, np.float32), code2=np.zeros(1, np.float32)))
    return GemvCase(N=N, K=K, M=M, dtype=dtype, blocksize=blocksize, packed=case.packed, nested=nested, **stats,
                    offset=np.float32(case.offset), lut=case.lut.copy(), x_bits=x_bits, x=x, w=w,
                    y64=x.astype(np.float64) @ w.astype(np.float64).T, case=case)


def to_f32(y, dtype) -> np.ndarray:
    """Output (numpy bits / floats, numba device array or torch tensor) as float32 values."""
    y = y.copy_to_host() if hasattr(y, "copy_to_host") else y
    y = np.asarray(y.detach().float().cpu() if type(y).__module__.startswith("torch") else y)
    if y.dtype.kind in "ui":
        return reference.bits_to_f32(y.astype(np.uint16), dtype).reshape(y.shape)
    return y.astype(np.float32)


@dataclasses.dataclass
class GemvReport:
    name: str
    ok: bool
    max_err: float
    worst_ratio: float       # max |y - y64| / tol (<= 1 passes)
    n_bad: int
    n: int
    first_bad: list

    def __str__(self):
        head = (f"{self.name}: {'within' if self.ok else 'OUTSIDE'} the float32 tolerance ({self.n:,} outputs, "
                f"max |y - y64| = {self.max_err:.3g}, worst error/tolerance = {self.worst_ratio:.3g})")
        if self.ok:
            return head
        return "\n".join([head, f"  {self.n_bad:,} outputs outside; first ones (m, n, y, y64, tol):"]
                         + [f"    {m:>3} {n:>6} {y:>12.6g} {r:>12.6g} {t:>10.3g}" for m, n, y, r, t in self.first_bad])


class GemvError(AssertionError):
    pass


def compare(y, gc: GemvCase, name="kernel", rounded_table=False) -> GemvReport:
    """``y`` against the float64 reference; ``rounded_table``: the kernel's table holds the NF4 values in the
    dtype, as the tensor-core GEMV's does (see :func:`tolerance`)."""
    yv = to_f32(y, gc.dtype).reshape(-1)[: gc.M * gc.N].reshape(gc.M, gc.N).astype(np.float64)
    tol = tolerance(gc.x, gc.w, gc.dtype, table=rounded_table)
    err = np.abs(yv - gc.y64)
    bad = ~(err <= tol)  # NaN counts as bad
    first = [(int(m), int(n), float(yv[m, n]), float(gc.y64[m, n]), float(tol[m, n])) for m, n in np.argwhere(bad)[:8]]
    ratio = float(np.nanmax(np.where(np.isfinite(err), err / tol, np.inf)))
    return GemvReport(name, not bad.any(), float(np.nanmax(err)), ratio, int(bad.sum()), yv.size, first)


def check(y, gc: GemvCase, name="kernel", rounded_table=False) -> GemvReport:
    """:func:`compare`, raising :class:`GemvError` if outside the tolerance."""
    rep = compare(y, gc, name, rounded_table)
    if not rep.ok:
        raise GemvError(str(rep))
    return rep


def bnb_output(gc: GemvCase, device="cpu"):
    """bitsandbytes.matmul_4bit(x, W.t(), quant_state) on the case (CPU in the simulator)."""
    import bitsandbytes as bnb
    import torch

    packed, qs = gc.case.quant_state(device)
    x = torch.from_numpy(gc.x_bits.view(np.int16).copy()).view(getattr(torch, TORCH_DTYPE[gc.dtype])).to(device)
    with torch.no_grad():
        return bnb.matmul_4bit(x, packed.t(), quant_state=qs)


def check_exercise(launch_fn, name="exercise: warp reduction", rounded_table=False, shape=(16, 128)) -> bool:
    """Grade a GEMV launch function on a small case (``shape``: (N, K)) against the float64 reference and print
    the verdict; ``rounded_table`` as for :func:`compare`."""
    g = make_gemv_buffers(gc := make_gemv_case(*shape, "bf16", seed=3))
    try:
        launch_fn(g)
        rep = compare(g.result(), gc, name=name, rounded_table=rounded_table)
    except Exception as exc:  # a broken kernel must not stop the notebook
        print(f"NOT PASSED: the kernel raised {type(exc).__name__}: {exc}")
        return False
    print(("PASSED: " if rep.ok else "NOT PASSED (not solved yet): ") + str(rep))
    return rep.ok


# ---------------------------------------------------------------- the benchmark (notebook 09, sections 1, 5, 6)
FUSED = "fused NF4 gemv (numba)"  # every record of our kernels: f"{FUSED} [{variant}]" (kernel_name)
# Record names, as recorded. matmul_4bit without grad is bitsandbytes' gemm_4bit op at every M: its fused kernel
# up to M = 4, then that or dequantize + F.linear as a per-GPU heuristic picks (_gemm_4bit_use_custom_cuda).
BNB_GEMV = "bitsandbytes matmul_4bit gemv (M=1)"
BNB_GEMM = "bitsandbytes matmul_4bit gemm_4bit (M>1)"
BNB_DQ_MM = "bitsandbytes dequantize_4bit + torch.matmul gemv"
COPY_BYTES = 1 << 30  # the copy ceiling: a 1 GiB copy (512 MiB read + 512 MiB written), far beyond L2


def weight_bytes(N, K, blocksize=64) -> int:
    """Bytes a GEMV must read for the weight: packed codes + absmax_q + absmax2 + code2 (x, y not counted)."""
    nblocks = -(-N * K // blocksize)
    return -(-N * K // 2) + nblocks + 4 * -(-nblocks // reference.NESTED_BLOCKSIZE) + 1024


def unfused_bytes(N, K, itemsize=2, blocksize=64) -> int:
    """Dequantize then multiply: read the packed weight, write W in 16 bits, read it again."""
    return weight_bytes(N, K, blocksize) + 2 * itemsize * N * K


def kernel_name(variant: str) -> str:
    return f"{FUSED} [{variant}]"


def bnb_name(M: int) -> str:
    return BNB_GEMV if M == 1 else BNB_GEMM


def default_kernel(run) -> str:
    """Name of the kernel record a run shows: the first variant timed (``run``: a Run, or a results file's dict)."""
    return (run["meta"] if isinstance(run, dict) else run.meta).get("default_kernel") or kernel_name("auto")


def find_record(run, name, shape, dtype, M=1):
    return next((r for r in run.records if r["name"] == name and list(r["shape"]) == list(shape)
                 and r["dtype"] == dtype and r.get("M", 1) == M), None)


def _quantize_gpu(N, K, dtype, seed=0, M=1):
    import bitsandbytes.functional as F
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = getattr(torch, TORCH_DTYPE[dtype])
    w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    return packed, qs, torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)


def _gpu_reference(packed, qs, x):
    """(y64, tol) on the GPU: bitsandbytes' float32 weights, float64 products and sums."""
    import bitsandbytes.functional as F
    import torch

    qs32 = qs.__class__(absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize,
                        quant_type=qs.quant_type, dtype=torch.float32, offset=qs.offset, state2=qs.state2)
    w, xd = F.dequantize_4bit(packed, qs32).double(), x.double()
    return xd @ w.T, tolerance(xd, w, {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype])


def _gpu_check(y, y64, tol, name):
    err = (y.double().reshape(y64.shape) - y64).abs()
    return {"name": name, "ok": not bool((~(err <= tol)).any()), "worst_ratio": float((err / tol).max()),
            "max_err": float(err.max())}


def benchmark(launch, shapes=LLM_SHAPES, dtypes=("bf16", "fp16"), ms=(1,), progress=print):
    """Fused kernel(s) vs bitsandbytes' ``matmul_4bit`` on the same data (GPU only): a Run (nf4lab.measure.bench) of
    ceilings, baselines and kernels per shape, dtype and batch size M (``ms``), every output checked against float64
    first. ``launch``: ``launch(g)`` or {variant: launch} (records ``kernel_name(variant)``, the first the default).
    Each timed function cycles through weight copies totalling > 4x L2, so every launch reads DRAM, as in decoding."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    bench._require_gpu()
    launches = dict(launch) if isinstance(launch, dict) else {"default": launch}
    first, names = next(iter(launches)), {key: kernel_name(key) for key in launches}
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2 so each "
                    "launch reads them from DRAM; effective bandwidth = weight bytes (packed + absmax_q + "
                    "absmax2 + code2) / time")
    l2, t0, ceil = runtime.device_info().get("l2_bytes") or (50 << 20), time.time(), bench.ceilings(COPY_BYTES)
    run.meta.update(copy_ceiling_bytes=COPY_BYTES, checks=[], default_kernel=names[first], variants=list(launches),
                    batch_sizes=list(ms))
    for (N, K), dtype, M in itertools.product(shapes, dtypes, ms):
        t_start, nb, keys = time.time(), weight_bytes(N, K), list(launches)
        copies = max(2, math.ceil(4 * l2 / nb))
        data = [_quantize_gpu(N, K, dtype, seed=i, M=M) for i in range(copies)]
        x, y = data[0][2], torch.empty(M, N, dtype=data[0][2].dtype, device="cuda")  # one x for all copies
        bufs = [buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                   q.blocksize, y) for p, q, _ in data]
        y64, tol = _gpu_reference(*data[0])  # copy 0 checked against float64, ours and bitsandbytes'
        yb = bnb.matmul_4bit(x, data[0][0].t(), quant_state=data[0][1])
        checks = {}
        for key in keys:
            launches[key](bufs[0])  # the first launch compiles (a launch may size its grid from the kernel)
            y.fill_(float("nan"))
            launches[key](bufs[0])
            torch.cuda.synchronize()
            checks[key] = dict(_gpu_check(y, y64, tol, names[key]), shape=[N, K], dtype=dtype, M=M,
                               max_abs_diff_vs_bnb=float((y.float() - yb.float().reshape(y.shape)).abs().max()))
        chk = checks[keys[0]]
        chk_b = dict(_gpu_check(yb, y64, tol, bnb_name(M)), shape=[N, K], dtype=dtype, M=M,
                     max_abs_diff_vs_bnb=chk["max_abs_diff_vs_bnb"])
        run.meta["checks"] += [*checks.values(), chk_b]
        del y64, tol
        for kind, name, call, ok in (  # call(i, stream): one launch on copy i of the weight
                ("baseline", bnb_name(M), lambda i, s: bnb.matmul_4bit(x, data[i][0].t(), quant_state=data[i][1]),
                 chk_b["ok"]),
                ("baseline", BNB_DQ_MM, lambda i, s: torch.matmul(x, F.dequantize_4bit(*data[i][:2]).t()), None),
                *(("kernel", names[k], lambda i, s, fn=launches[k]: fn(dataclasses.replace(bufs[i], stream=s)),
                   checks[k]["ok"]) for k in keys)):
            turn = itertools.cycle(range(copies))  # each launch takes the next copy, from copy 0
            t = bench.gpu_time_ms(lambda stream: call(next(turn), stream), launches=max(bench.LAUNCHES, copies))
            run.add(bench._record(kind, name, (N, K), dtype, t, nb, bit_exact=None, within_tol=ok,
                                  copies=copies, fits_l2=False, M=M))
        if not any(r["kind"] == "ceiling" and r["shape"] == [N, K] and r["dtype"] == dtype for r in run.records):
            run.add([dict(c, shape=[N, K], dtype=dtype) for c in ceil])
        if progress:  # wall-clock seconds of this whole step, not a kernel time (those are in the records)
            others = "".join(f"; {k} {'ok' if checks[k]['ok'] else 'OUTSIDE TOLERANCE'}" for k in keys[1:])
            progress(f"{N}x{K} {dtype} M={M}: {time.time() - t_start:.1f} s wall clock ({copies} weight copies); "
                     f"{names[keys[0]]} within tolerance: {chk['ok']} (worst {chk['worst_ratio']:.2g}), bnb: "
                     f"{chk_b['ok']} (worst {chk_b['worst_ratio']:.2g}), max |ours - bnb| = "
                     f"{chk['max_abs_diff_vs_bnb']:.3g}{others}")
        del data, bufs  # the weight copies
        torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    run.finalize()
    for r in run.records:  # speedup relative to bitsandbytes' matmul_4bit at the same shape, dtype and M
        if r["kind"] != "ceiling" and r.get("ms"):
            b = find_record(run, bnb_name(r.get("M", 1)), r["shape"], r["dtype"], r.get("M", 1))
            r["speedup_vs_bnb"] = b["ms"] / r["ms"] if b and b.get("ms") else None
    return run


def summary(run, bound=None) -> str:
    """Per shape, dtype and M: the default kernel against bitsandbytes' matmul_4bit (us, x bnb), the copy ceiling
    and ``bound`` (lab/gemv_read_bound.py's run: only reads the weight bytes), and both's tolerance verdicts."""
    ours, copy = default_kernel(run), next((r for r in run.records if r["name"] == COPY), None)
    ok = {(c["name"], tuple(c["shape"]), c["dtype"], c.get("M", 1)): c["ok"] for c in run.meta.get("checks", [])}
    lines = [f"{'W (N x K)':>11} {'dtype':>5} {'M':>2} {'ours us':>8} {'bnb us':>7} {'x bnb':>6} {'% copy':>7} "
             f"{'% of read':>9}  within tolerance (ours, bnb)"]
    for r in (r for r in run.records if r["name"] == ours):
        M, key = r.get("M", 1), (tuple(r["shape"]), r["dtype"], r.get("M", 1))
        b = find_record(run, bnb_name(M), r["shape"], r["dtype"], M)
        rb = bound and next((q for q in bound.records if q["kind"] == "bound" and q["shape"] == r["shape"]), None)
        lines.append(f"{'x'.join(map(str, r['shape'])):>11} {r['dtype']:>5} {M:>2} {r['ms'] * 1e3:8.1f} "
                     f"{b['ms'] * 1e3 if b else float('nan'):7.1f} {b['ms'] / r['ms'] if b else float('nan'):6.2f} "
                     + (f"{100 * r['gbps'] / copy['gbps']:6.0f}% " if copy else f"{'-':>7} ")
                     + (f"{100 * rb['ms'] / r['ms']:8.0f}%  " if rb else f"{'-':>9}  ")
                     + f"{ok.get((ours, *key))}, {ok.get((bnb_name(M), *key))}")
    return "\n".join(lines)


def plot(run, batch=False):
    """Effective weight bandwidth (weight bytes / time) per shape and dtype: bars at batch 1 (ours, matmul_4bit,
    dequantize + matmul) or, ``batch``, lines against M (ours solid, matmul_4bit dashed); the copy ceiling red."""
    import matplotlib.pyplot as plt

    ours, recs = default_kernel(run), [r for r in run.records if r["kind"] in ("kernel", "baseline")]
    keys = list(dict.fromkeys((tuple(r["shape"]), r["dtype"]) for r in recs))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    if batch:
        for i, (shape, dtype) in enumerate(keys):
            for names, style, who in (((ours,), "-o", "ours"), ((BNB_GEMV, BNB_GEMM), "--s", "bitsandbytes matmul_4bit")):
                pts = sorted((r.get("M", 1), r["gbps"]) for r in recs
                             if tuple(r["shape"]) == shape and r["dtype"] == dtype and r["name"] in names)
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{i % 10}", label=f"{shape[0]}x{shape[1]} {dtype}: {who}")
        ms = sorted({r.get("M", 1) for r in recs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.set_xlabel("batch M (rows of x)")
    else:
        for j, name in enumerate([BNB_DQ_MM, BNB_GEMV, ours]):
            pts = [(i + (j - 1) * 0.27, r["gbps"]) for i, k in enumerate(keys) if (r := find_record(run, name, *k))]
            if pts:
                ax.bar(*zip(*pts), 0.27, label=name + (" (default)" if name == ours else ""))
        ax.set_xticks(range(len(keys)), [f"{s[0]}x{s[1]}\n{d}" for s, d in keys], fontsize=8)
        ax.set_xlabel("W shape (N out x K in), activation dtype; batch 1")
    copy = next((r for r in run.records if r["name"] == COPY), None)
    if copy:
        ax.axhline(copy["gbps"], color="tab:red", ls="--", lw=1, label=f"copy ceiling {copy['gbps']:.0f} GB/s")
    ax.set(ylabel="effective weight bandwidth, GB/s", title="Fused NF4 GEMV: weight bytes read per second")
    ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.text(0.01, 0.005, "measured on " + results.label(run.meta), fontsize=7, color="0.35", va="bottom")
    return ax
