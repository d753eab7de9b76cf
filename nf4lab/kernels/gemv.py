"""The fused NF4 GEMV of notebook 09, ``y = x @ W.T`` for 1 to 8 rows of x, W (N, K) in bitsandbytes' NF4 (``launch``,
``launch_torch``): the kernel and its launch. Its check is :mod:`nf4lab.harness.gemv_check`, its benchmark
:mod:`nf4lab.measure.gemv_bench`.

A code byte costs one PRMT (its table address) and one 32-bit shared load, whose result (the byte's two NF4
values as a bf16x2/f16x2 pair) is an ``mma.sync`` A-fragment register as it stands; the tensor core sums in
float32. At M = 1 x reaches the mma through a shared slot a step ahead (:func:`nf4lab.device.warp_ops.x_slot_ops`). A step's
statistics: one 32-bit load a lane, shuffled to the lanes that scale (:func:`words_apply`; else byte by byte).
Notebook 09 builds the same kernel cell by cell (tests/test_nb09.py pins both to one PTX). Below sm_80
(a T4) fp16 runs as two m16n8k8, bf16 on the FP32 units (:mod:`nf4lab.device.warp_ops`); everything fits a T4's 64 KB.
"""
import dataclasses
import functools

import numpy as np

from .. import runtime  # first: it may switch numba to the simulator
from ..format import reference
from ..device import ops
from ..device.gemv_loads import step1_ops, step_ops  # noqa: F401  (notebook 09 and the lab use them as gemv's)
from . import qweight
from .fastkernel import address
from ..device.warp_ops import (_lookup_at, bar_sync, default_base, f32_from_bits, load_stream_u32x4,  # noqa: F401
                       load_u32_of_bytes, lookup, mma_bf16, mma_f16, prmt, probe_base, shfl_idx, shfl_xor_sync, syncwarp,
                       table_lookup, table_vec4, x_slot_ops)
from numba import cuda, float32, types, uint32, uint64  # noqa: E402  (globals the simulator swaps in kernels)

LLM_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))  # (N, K) = W.shape
DTYPES = ("bf16", "fp16")        # the output dtypes the kernel writes
NAME = "09_fused_gemv"
MAX_M = 8                       # batch rows of x the kernel takes (each weight byte is still read once)
THREADS, W = 256, 8             # threads and warps per block
BLOCKS_PER_SM = 2               # 64 KB of shared memory and <= 128 registers each: measured best (lab/gemv_mma.py)
# The table: entry e of lane l at word (e << 6) | l; words 32..63 of each 256-byte row are spare and hold code2
# (rows 0..7: code2_word), the x slots (rows 16..47) and the warps' partial sums (rows 128..255: spare).
SMEM = 4 * 256 * 64             # dynamic shared memory of every launch: the whole table
FB = 24                         # words per step in a lane's buffer: 16 code words, 4 absmax codes, 4 absmax2
FBW = 17                        # the same with the statistics as one word (words_apply): 16 code words, 1 word


@cuda.jit(device=True, inline="always")
def code2_word(c):  # code2[c], c < 256: bank c & 31, as in a flat array
    return c + (c & uint32(0xE0)) + uint32(32)


@cuda.jit(device=True, inline="always")
def spare(i):  # partial sum i < 2048 (2 tiles x W warps x 16 rows x M): words 32..47 of rows 128..255
    return ((i >> uint32(4)) << uint32(6)) | uint32((128 << 6) | 32) | (i & uint32(15))


def words_apply(nested, bs_shift, K, absmax_ptr) -> bool:
    """Where a step's statistics come as one 32-bit word per lane: nested, blocksize 64, K a multiple of 256 (a
    step is 4 whole blocks of a row, at a word boundary), the absmax codes 4-byte aligned."""
    return bool(nested) and bs_shift == 6 and K % 256 == 0 and absmax_ptr % 4 == 0


def full_apply(words, M, K, warps=W) -> bool:
    """Where the M = 1 step loop may skip its test that a warp has a step: K >= 256 warps gives each of the ``warps``
    on a tile one."""
    return bool(words) and M == 1 and K >= 256 * warps


@functools.cache
def make_kernel(is_bf16, M, base, nested=True, D=1, min_blocks=BLOCKS_PER_SM, xslot=True, words=True, full=False, G=W):
    """The kernel for a dtype, batch M (1..8), table base (``probe_base()``) and kind of statistics; ``words``: the
    statistics as one word per lane a step (only where :func:`words_apply`); ``full``: every warp has a step (only where
    :func:`full_apply`), so the step loop does not test it; ``D`` (steps of loads in flight
    ahead), ``min_blocks`` (blocks per SM) and ``xslot`` (False: x from L1/L2 at each step, as M > 1 does) are
    lab/gemv_mma.py's knobs; ``G``: warps a tile (:func:`warps_a_tile`), W // G tiles a block at once, each group of
    G warps at its own barrier (M = 1)."""
    SPLIT, P = G < W, W // G
    NT, WIDE, WORDS = (M + 1) // 2, M > 1, words and nested  # n-tiles of 8 columns (2 batch rows x 4 blocks)
    SW = FBW if WORDS else FB         # words per step in a lane's buffer
    NACC, NCF, NB = 2 * NT, 4 * NT, SW * (D + 1)
    mma = mma_bf16 if is_bf16 else mma_f16
    look, half_bits, fetch = step_ops(is_bf16, M, base, nested, WORDS)
    XS = xslot and M == 1 and D == 1  # x through a shared slot per warp, a step ahead (warp_ops.x_slot_ops)
    LEAN = XS and WORDS               # K % 256 == 0: step1_ops' loads, rows every step, x untested
    slot_at, x_quad, x_put, x_get = x_slot_ops(base)
    rows, fetch1 = step1_ops()
    store4 = table_vec4(base)[1]

    @cuda.jit(device=True, inline="always")
    def load(buf, o, xq, rb, packed_u32, absmax_q, absmax2, x_u32, tp, cp, g, q, lane, n, k, kw, tiles, steps, ash):
        if LEAN:
            fetch1(buf, o, xq, packed_u32, absmax_q, absmax2, x_u32, rb, cp, lane, steps)
        else:
            fetch(buf, o, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            if XS:
                x_quad(xq, x_u32, min(cp, uint32(steps - uint32(1))), lane, k)

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_tc(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw, kx = k >> uint32(3), k >> uint32(1)
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        ash, grid = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x) * uint32(P)   # P groups a block
        buf = cuda.local.array(NB, uint32)
        t, c = uint32(cuda.blockIdx.x), warp
        if SPLIT:
            t, c = t * uint32(P) + warp // uint32(G), warp % uint32(G)
        c0 = c                         # a warp's first step of every tile
        tp, cp = t, c                  # the step whose loads go out next: the first D before the table is built
        xq, rb = cuda.local.array(4, uint32), cuda.local.array(3, uint32)   # step cp's x; LEAN: tile tp's rows
        xs, xa = slot_at(warp, lane)
        if LEAN:
            rows(rb, tp, g, q, lane, n, kw, tiles)
        for d in range(D):
            load(buf, SW * (d + 1), xq, rb, packed_u32, absmax_q, absmax2, x_u32, tp, cp, g, q, lane, n, k, kw, tiles,
                 steps, ash)
            cp = uint32(cp + uint32(G))
            if cp >= steps:
                cp, tp = c0, uint32(tp + grid)
                if LEAN:
                    rows(rb, tp, g, q, lane, n, kw, tiles)
        if nested:
            sm[code2_word(tid)] = ops.float_bits(code2[tid])
        # The used half of each row: 16-byte stores of four lanes' copies of entry e = p >> 3 (p = tid + 256 j), whose
        # halves lut[e >> 4] and lut[e & 15] come from lut itself, so no barrier and no read back come before them.
        hi = half_bits(lut[(tid >> uint32(3)) & uint32(15)]) << uint32(16)
        for j in range(32 * 256 // (4 * THREADS)):
            p, v = uint32(tid + uint32(THREADS * j)), half_bits(lut[(tid >> uint32(7)) + uint32(2 * j)]) | hi
            store4(sm, ((p >> uint32(3)) << uint32(8)) | ((p & uint32(7)) << uint32(4)), v, v, v, v)
        cuda.syncthreads()
        lane4, parity = lane << uint32(2), uint32(0)
        acc, cf, s = cuda.local.array(NACC, float32), cuda.local.array(NCF, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        if XS:  # lanes that hold no x keep zeros; the others' x arrives through the slot
            for j in range(16):
                xr[j] = uint32(0)
            x_put(sm, xs, xq)
            syncwarp()
        while t < tiles:
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:
                for i in range(SW * D):
                    buf[i] = buf[i + SW]
                load(buf, SW * D, xq, rb, packed_u32, absmax_q, absmax2, x_u32, tp, cp, g, q, lane, n, k, kw, tiles,
                     steps, ash)
                cn, tn = cp, tp            # D = 1: the step just fetched comes next
                if not LEAN:
                    cn, tn = uint32(c + uint32(G)), t
                    if cn >= steps:
                        cn, tn = c0, uint32(t + grid)
                cp = uint32(cp + uint32(G))
                if LEAN:   # the wrap to the next tile by selects and its rows every step: no branch (with `full`: 1.0-2.7% faster at 3 large shapes, up to 1.3% slower at 4096x4096; H200, 2026-11-29, lab/README.md)
                    wrap = cp >= steps
                    cp, tp = (c0 if wrap else cp), (uint32(tp + grid) if wrap else tp)
                    rows(rb, tp, g, q, lane, n, kw, tiles)
                elif cp >= steps:
                    cp, tp = c0, uint32(tp + grid)
                if (LEAN and full) or (c0 if LEAN else c) < steps:   # a warp's steps: c0, c0 + G, ... (or c0 alone)
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
                            if XS:
                                if g == q:
                                    x_get(xr, sm, xa, h)
                            elif (blk if WIDE else q) == (g & uint32(3)) and m < uint32(M) and xcol < k:
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
                    if WORDS:   # rows g and g + 8: their codes' word and absmax2 from the lanes that loaded them
                        raw = buf[16]
                        wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
                        ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
                        sh = uint32(16) * (q & uint32(1))
                    if (q >> uint32(1)) < uint32(M):
                        for i in range(4):
                            if WORDS:
                                code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                                a2 = ag if i < 2 else ag8
                            else:
                                code, a2 = buf[16 + i], buf[20 + i]
                            s[i] = (ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]), f32_from_bits(a2)),
                                                offset) if nested else f32_from_bits(a2))
                        for nt in range(NT):
                            acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                            acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]
                if XS:  # the next step's x into the slot, once every lane has read this step's
                    syncwarp()
                    x_put(sm, xs, xq)
                    syncwarp()
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
            if SPLIT:   # the group's barrier (id 1 + group), its threads' own index lt, its first warp's sums
                bar_sync(uint32(1) + warp // uint32(G), uint32(32 * G))
            else:
                cuda.syncthreads()
            lt, gb = (tid & uint32(32 * G - 1), (warp - c0) * uint32(16 * M)) if SPLIT else (tid, uint32(0))
            if lt < uint32(16 * M):
                first, v = uint32(parity * uint32(W * 16 * M) + gb + lt), float32(0.0)
                for w in range(G):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16 * M))])
                row = uint32(t * uint32(16) + (lt & uint32(15)))
                if row < n:
                    y[uint32((lt >> uint32(4)) * n + row)] = half_bits(v)
            parity, t = parity ^ uint32(1), tn

    return gemv_tc


@functools.cache
def _sm_count(dev):  # device_info asks the driver for much more: tens of microseconds, once per device
    return runtime.device_info().get("sms") or 132


def sms():
    """The GPU's SM count (the simulator plans for an H100)."""
    return _sm_count(cuda.get_current_device().id if runtime.ON_GPU else None)


def kernel(dtype, M=1, nested=True, words=True, full=False, G=W):
    """The shipped kernel for a dtype, batch and kind of statistics (compiled at its first launch); ``words`` only
    where :func:`words_apply`, ``full`` only where :func:`full_apply`, ``G`` as :func:`warps_a_tile` picks."""
    return make_kernel(dtype == "bf16", M, probe_base() if runtime.ON_GPU else default_base(runtime.target_cc()), nested,
                       words=words, full=full, G=G)


def grid_size(N, sm_count=None) -> int:
    """Persistent blocks: one per 16-row tile, up to BLOCKS_PER_SM per SM (of this GPU, or ``sm_count`` SMs)."""
    return min(-(-N // 16), BLOCKS_PER_SM * (sm_count or sms()))


def warps_a_tile(N, M, grid) -> int:
    """G, the warps that share a tile's K (M = 1; W at M > 1): the grid's warps take tiles in rounds of grid W // G
    tiles, a round a warp's K / G columns long, so G minimises rounds x W // G; on a tie the fewest warps a tile, whose
    partial sums are fewer and whose steps run longer (lab/README.md: G = 2 at 14336x4096 on an H200, -6%)."""
    if M != 1:
        return W
    tiles = -(-N // 16)
    return min((W // 4, W // 2, W), key=lambda G: (-(-tiles * G // (grid * W)) * (W // G), G))


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
    words, grid = words_apply(g.nested, g.bs_shift, g.K, address(g.absmax_q)), g.grid or grid_size(g.N)
    G = warps_a_tile(g.N, g.M, grid)
    kern = prepare(kernel(g.dtype, g.M, g.nested, words, full_apply(words, g.M, g.K, G), G), args)
    kern[grid, THREADS, g.stream, SMEM](*args)


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


def limits_problem(N, K, bs_shift):
    """The one statement of the fused kernel's weight limits: a line naming the parameter, or None (validate raises it)."""
    if N < 1:
        return f"N={N}: W needs at least one row"
    if not 6 <= bs_shift <= 12:
        return f"blocksize {2 ** bs_shift}: a power of two in 64..4096 is needed (bs_shift={bs_shift})"
    if K % 64:
        return f"K={K}: the fused kernel needs K a multiple of 64 (a lane takes 64 columns, one absmax block)"
    if N * K // 8 >= 1 << 32:
        return f"N*K={N * K}: word indices must fit in 32 bits (N*K < 2**35)"
    return None


def validate(g) -> None:
    """Raise on bad input, naming the parameter, before a launch reads out of bounds or kills the CUDA context."""
    if g.dtype not in DTYPES:
        raise ValueError(f"dtype must be 'bf16' or 'fp16', got {g.dtype!r}")
    for name in ("N", "K", "M", "bs_shift"):
        if isinstance(getattr(g, name), bool) or not isinstance(getattr(g, name), (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(getattr(g, name)).__name__}")
    if not 1 <= g.M <= MAX_M:
        raise ValueError(f"M={g.M}: this kernel takes 1 to {MAX_M} rows of x (batch), got {g.M}")
    if why := limits_problem(g.N, g.K, g.bs_shift):
        raise ValueError(why)
    if not isinstance(g.offset, (float, np.floating)):
        raise TypeError(f"offset must be a float32 scalar, got {type(g.offset).__name__}")
    s = qweight.sizes(g.N * g.K, 1 << g.bs_shift, g.nested, reference.NESTED_BLOCKSIZE)   # every entry point's
    need = {"packed_u32": (np.uint32, -(-s["A"] // 4)), "absmax_q": (np.uint8, s["absmax"] if g.nested else 0),
            "absmax2": (np.float32, s["absmax2"] if g.nested else s["absmax"]), "code2": (np.float32, s["code2"]),
            "lut": (np.float32, 16), "x_u32": (np.uint32, g.M * g.K // 2), "y": (np.uint16, g.M * g.N)}
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
                       dtype=reference.dtype_name(x.dtype), stream=stream)


def launch_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, out):
    """y = x @ W.T into ``out`` on torch's current stream (the tensors as :func:`buffers_from_torch` takes them)."""
    import torch

    stream = cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream)
    launch(buffers_from_torch(x, packed, shape, absmax_q, absmax2, code2, offset, blocksize, out, stream))

