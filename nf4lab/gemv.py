"""Machinery for the fused NF4 GEMV capstone (notebook 09): data, float64 reference, tolerance, timing.

The kernel itself lives in the notebook. This module gives it:

- ``make_gemv_case(N, K, dtype, M=1)`` -> :class:`GemvCase`: an NF4 weight W of shape (N, K)
  quantized by bitsandbytes (nested absmax, blocksize 64), activations x of shape (M, K) in
  bf16/fp16, the float32 weights bitsandbytes dequantizes to, and the float64 reference
  ``y64 = x @ W.T``.
- ``tolerance(x, w, dtype)`` and ``check(y, gc)``: a fused kernel sums K products in float32 in
  its own order, so it cannot be bit-exact with anything; it must be within a bound derived from
  the summation length (see :func:`tolerance`).
- ``make_gemv_buffers(gc)`` -> :class:`GemvBuffers`, what a notebook ``launch(g)`` receives.
- ``f32_from_bits`` / ``f16_to_f32``: two device ops (with plain-Python twins) the kernel needs to
  turn bf16/fp16 activation bits into float32; ``lds_pair(tab, byte_offset)``: two float32 from a
  64-bit shared-memory table entry addressed in bytes (one ``ld.shared.v2.f32``).
- GPU only: ``benchmark(launch, shapes, dtypes)`` times the fused kernel, bitsandbytes'
  ``matmul_4bit`` (its fused 4-bit GEMV) and ``dequantize_4bit`` + ``torch.matmul`` on the same
  data in one run, with the copy ceiling, using :mod:`nf4lab.bench`'s CUDA-graph timing.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import math
import os
import re
import shutil
import subprocess

import numpy as np

from . import reference, runtime

LLM_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))  # (N, K) = W.shape
EPS32 = float(np.finfo(np.float32).eps)        # 2^-23
UNIT_OUT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}  # unit roundoff of the output
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
NAME = "09_fused_gemv"


# ---------------------------------------------------------------- device ops with twins
def _py_f32_from_bits(u):
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def _py_f16_to_f32(u):
    return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))


def _build_device_ops():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f32_from_bits(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(v, ir.FloatType())

        return sig, codegen

    @intrinsic
    def f16_to_f32(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            h = builder.trunc(v, ir.IntType(16))
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(16)]), "cvt.f32.f16 $0, $1;", "=f,h")
            return builder.call(asm, [h])

        return sig, codegen

    @intrinsic
    def lds_pair(typingctx, tab, off):
        """Two float32 at byte offset ``off`` (uint32, a multiple of 8) of a shared array: one ld.shared.v2.f32.

        The offset is already in bytes, so no index is widened to 64 bits or scaled per access."""
        if not (isinstance(tab, types.Array) and tab.ndim == 1 and tab.dtype.bitwidth == 64):
            return None
        sig = types.UniTuple(types.float32, 2)(tab, types.uint32)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
            base = builder.addrspacecast(base, ir.PointerType(ir.IntType(8), 3))  # the shared window
            o = context.cast(builder, args[1], sig.args[1], types.uint32)
            p = builder.gep(base, [builder.zext(o, ir.IntType(64))])
            v2 = ir.VectorType(ir.FloatType(), 2)
            v = builder.load(builder.bitcast(p, ir.PointerType(v2, 3)), align=8)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_element(v, ir.Constant(ir.IntType(32), i)) for i in (0, 1)])

        return sig, codegen

    return f32_from_bits, f16_to_f32, lds_pair


def _py_lds_pair(tab, off):
    p = int(tab[int(off) >> 3])
    return _py_f32_from_bits(p & 0xFFFFFFFF), _py_f32_from_bits(p >> 32)


class _Warp:
    def __init__(self, n):
        import threading

        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.vals = [None] * n


_WARPS: dict = {}


def _py_shfl_down_sync(mask, value, delta):
    """The simulator has no warp shuffles: exchange through a per-warp barrier.

    Every lane of the warp must call it (as on the GPU with a full mask); a lane that
    returned early makes the others wait, and after 60 s the barrier raises.
    """
    import threading

    t = threading.current_thread()
    bd = t._manager._block_dim
    nthreads = int(np.prod(bd))
    lane, w = t.thread_id % 32, t.thread_id // 32
    n = min(32, nthreads - 32 * w)
    key = (id(t._manager), tuple(t.blockIdx), w, n)
    warp = _WARPS.get(key)
    if warp is None:
        warp = _WARPS.setdefault(key, _Warp(n))
    warp.vals[lane] = value
    try:
        warp.barrier.wait()
        src = lane + int(delta)
        out = warp.vals[src] if src < n else value
        warp.barrier.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError("shfl_down_sync: not every lane of the warp reached the shuffle (a lane "
                           "returned early or took another branch); on a GPU that is undefined behaviour") from None
    return type(value)(out) if isinstance(value, np.generic) else out


# nf4lab.ptx pickles these by name, so that the PTX subprocess (compile mode) gets the device versions.
DEVICE_OPS = ("f32_from_bits", "f16_to_f32", "lds_pair", "shfl_down_sync")

if runtime.SIMULATOR:
    f32_from_bits, f16_to_f32, lds_pair = _py_f32_from_bits, _py_f16_to_f32, _py_lds_pair
    shfl_down_sync = _py_shfl_down_sync
else:
    f32_from_bits, f16_to_f32, lds_pair = _build_device_ops()
    from numba import cuda as _cuda

    shfl_down_sync = _cuda.shfl_down_sync


# ---------------------------------------------------------------- SASS, offline
SASS_PTX_VERSION = "9.0"  # the highest PTX ISA version CUDA 13.0's ptxas accepts


def find_tool(name):
    path = shutil.which(name)
    if path:
        return path
    import site

    for d in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(d, "nvidia", "*", "bin", name))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"{name} not found (CUDA toolkit, or pip install nvidia-cuda-{name})")


def sass_of(ptx: str, workdir, stem: str, arch="sm_90"):
    """(ptxas -v text, SASS text) of a PTX string."""
    ptx = re.sub(r"^\.version \d+\.\d+", f".version {SASS_PTX_VERSION}", ptx, flags=re.M)
    p = workdir / f"{stem}.ptx"
    p.write_text(ptx)
    cubin = workdir / f"{stem}.cubin"
    info = subprocess.run([find_tool("ptxas"), f"-arch={arch}", "-v", str(p), "-o", str(cubin)],
                          capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    (workdir / f"{stem}.sass").write_text(sass)
    return info, sass


def hottest_loop(sass: str):
    """Instructions (text) of the largest innermost loop: from a backward branch's target to the branch."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    where = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in where:
            s = where[int(m.group(1), 16)]
            loops.append((i - s + 1, s, i))
    # innermost loops (no other loop inside), the largest of them
    inner = [lp for lp in loops if not any(o is not lp and lp[1] <= o[1] and o[2] <= lp[2] for o in loops)]
    if not inner:
        return []
    _, s, e = max(inner)
    return [t for _, t in ins[s:e + 1]]


def opcode(text):
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0]


def sass_report(kernel, sig, weights_per_trip, stem="kernel", workdir=None, ptx=None):
    """ptxas registers/spills/smem and the SASS of the hottest (innermost) loop, per weight.

    Needs ptxas and cuobjdump (the CUDA toolkit, or pip install nvidia-cuda-cuobjdump); raises
    FileNotFoundError without them."""
    import tempfile
    from pathlib import Path

    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp())
    workdir.mkdir(parents=True, exist_ok=True)
    from . import ptx as _ptx

    if ptx is None:
        ptx = _ptx.compile_ptx(kernel, sig)
    info, sass = sass_of(ptx, workdir, stem)
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    smem = re.search(r"(\d+) bytes smem", info)
    loop = hottest_loop(sass)
    ops = collections.Counter(opcode(t) for t in loop)
    return dict(registers=int(regs.group(1)) if regs else None, spill_bytes=int(spill.group(1)) if spill else None,
                smem_bytes=int(smem.group(1)) if smem else None, loop_instructions=len(loop),
                weights_per_trip=weights_per_trip, per_weight=len(loop) / weights_per_trip,
                opcodes=dict(ops.most_common()))



# ---------------------------------------------------------------- data and reference
@dataclasses.dataclass
class GemvCase:
    N: int
    K: int
    M: int
    dtype: str
    blocksize: int
    packed: np.ndarray      # uint8, N*K/2, high nibble first, flat index row*K + col
    absmax_q: np.ndarray    # uint8 per block
    absmax2: np.ndarray     # float32 per 256 blocks
    code2: np.ndarray       # float32[256]
    offset: np.float32
    lut: np.ndarray         # float32[16]
    x_bits: np.ndarray      # uint16 (M, K): the activations as bf16/fp16 bits
    x: np.ndarray           # float32 (M, K): the same values
    w: np.ndarray           # float32 (N, K): what bitsandbytes dequantizes to before the output cast
    y64: np.ndarray         # float64 (M, N): x @ w.T in float64
    tol: np.ndarray         # float64 (M, N): allowed |y - y64|
    case: object = None     # the nf4lab.cases.Case it was made from

    @property
    def shape(self):
        return (self.N, self.K)

    def __repr__(self):
        return (f"GemvCase(W {self.N}x{self.K} NF4 ({self.packed.size:,} packed bytes, {self.absmax_q.size} blocks, "
                f"{self.absmax2.size} groups), x {self.M}x{self.K} {self.dtype})")

    def bnb_tensors(self, device="cpu"):
        """(W_packed, quant_state, x) as bitsandbytes takes them."""
        import torch

        packed, qs = self.case.quant_state(device)
        x = torch.from_numpy(self.x_bits.view(np.int16).copy()).view(getattr(torch, TORCH_DTYPE[self.dtype]))
        return packed, qs, x.to(device)


def make_x(M, K, dtype, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Activations: standard normal, rounded to the dtype. Returns (bits uint16, float32 values)."""
    rng = np.random.default_rng(1000 + seed)
    xf = rng.standard_normal((M, K)).astype(np.float32)
    bits = reference.f32_to_bits(xf, dtype).reshape(M, K)
    return bits, reference.bits_to_f32(bits, dtype).reshape(M, K)


def reference_y64(x, w) -> np.ndarray:
    """y = x @ w.T in float64: the value every float32 summation order approximates."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def tolerance(x, w, dtype, c: float = 1.0) -> np.ndarray:
    """Allowed |y - y64| for a float32 dot product of length K rounded to ``dtype``.

    Any float32 summation of K products (any order, FMA or not) is within
    gamma_K * sum|x_k w_k| of the exact value, gamma_K ~= K * u32 (u32 = 2^-24, Higham's bound).
    We allow c * K * eps32 (eps32 = 2 u32) to cover the extra rounding of multiplying a
    partial sum by the block scale. Rounding the result to bf16/fp16 adds u_out * |y|.
    """
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    K = x.shape[-1]
    s = np.abs(x) @ np.abs(w).T
    acc = c * K * EPS32 * s
    u = UNIT_OUT[dtype]
    return (1 + u) * acc + u * np.abs(reference_y64(x, w)) + np.finfo(np.float32).tiny


def make_gemv_case(N, K, dtype="bf16", M=1, dist="randn", seed=0, blocksize=64) -> GemvCase:
    """W (N, K) quantized by bitsandbytes (through nf4lab.cases, cached), x (M, K), reference and tolerance."""
    from .cases import make_case

    if dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be bf16 or fp16, got {dtype!r}")
    case = make_case((N, K), dtype=dtype, dist=dist, seed=seed, blocksize=blocksize)
    absmax = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
    w = reference.dequantize_f32(case.packed, absmax, case.n, blocksize).reshape(N, K)
    x_bits, x = make_x(M, K, dtype, seed)
    return GemvCase(N=N, K=K, M=M, dtype=dtype, blocksize=blocksize, packed=case.packed,
                    absmax_q=case.absmax_q, absmax2=case.absmax2, code2=case.code2,
                    offset=np.float32(case.offset), lut=case.lut.copy(), x_bits=x_bits, x=x, w=w,
                    y64=reference_y64(x, w), tol=tolerance(x, w, dtype), case=case)


def to_f32(y, dtype) -> np.ndarray:
    """Output (numpy bits / floats, numba device array or torch tensor) as float32 values."""
    if hasattr(y, "copy_to_host"):
        y = y.copy_to_host()
    if type(y).__module__.startswith("torch"):
        y = y.detach().float().cpu().numpy()
    y = np.asarray(y)
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

    def __bool__(self):
        return self.ok

    def __str__(self):
        head = (f"{self.name}: {'within' if self.ok else 'OUTSIDE'} the float32 tolerance "
                f"({self.n:,} outputs, max |y - y64| = {self.max_err:.3g}, worst error/tolerance = "
                f"{self.worst_ratio:.3g})")
        if self.ok:
            return head
        lines = [head, f"  {self.n_bad:,} outputs outside; first ones (m, n, y, y64, tol):"]
        lines += [f"    {m:>3} {n:>6} {y:>12.6g} {r:>12.6g} {t:>10.3g}" for m, n, y, r, t in self.first_bad]
        return "\n".join(lines)


class GemvError(AssertionError):
    pass


def compare(y, gc: GemvCase, name="kernel", M=None) -> GemvReport:
    M = gc.M if M is None else M
    yv = to_f32(y, gc.dtype).reshape(-1)[: M * gc.N].reshape(M, gc.N).astype(np.float64)
    ref, tol = gc.y64[:M], gc.tol[:M]
    err = np.abs(yv - ref)
    bad = ~(err <= tol)  # NaN counts as bad
    idx = np.argwhere(bad)[:8]
    first = [(int(m), int(n), float(yv[m, n]), float(ref[m, n]), float(tol[m, n])) for m, n in idx]
    ratio = float(np.nanmax(np.where(np.isfinite(err), err / tol, np.inf))) if err.size else 0.0
    return GemvReport(name, not bad.any(), float(np.nanmax(err)) if err.size else 0.0, ratio,
                      int(bad.sum()), yv.size, first)


def check(y, gc: GemvCase, name="kernel", raise_on_error=True, M=None) -> GemvReport:
    """Compare an output with the float64 reference; raise :class:`GemvError` if outside the tolerance."""
    rep = compare(y, gc, name, M)
    if not rep.ok and raise_on_error:
        raise GemvError(str(rep))
    return rep


def bnb_output(gc: GemvCase, device="cpu"):
    """bitsandbytes.matmul_4bit(x, W.t(), quant_state) on the case (CPU in the simulator)."""
    import bitsandbytes as bnb
    import torch

    packed, qs, x = gc.bnb_tensors(device)
    with torch.no_grad():
        return bnb.matmul_4bit(x, packed.t(), quant_state=qs)


# ---------------------------------------------------------------- device buffers
@dataclasses.dataclass
class GemvBuffers:
    packed_u32: object      # uint32 view of the packed codes (16-byte aligned)
    absmax_q: object
    absmax2: object
    code2: object
    lut: object
    offset: np.float32
    x_u32: object           # uint32 view of x bits (M, K) flattened: x[m, 2j] low half of word m*K/2 + j
    y: object               # uint16 (M * N) output bits
    N: int
    K: int
    M: int
    bs_shift: int           # log2(blocksize)
    dtype: str
    stream: object = 0
    grid: int | None = None  # a launch may honour it instead of its own grid (tests: the grid-stride loop)

    def result(self):
        from numba import cuda

        cuda.synchronize()
        return self.y.copy_to_host()


def _check_layout(N, K, blocksize):
    if K % 64:
        raise ValueError(f"K={K}: the fused kernel needs K a multiple of 64 (each lane takes 64 consecutive "
                         "columns, one absmax block, of a row; bitsandbytes itself falls back to "
                         "dequantize+matmul unless K is a multiple of the blocksize)")
    if blocksize < 64 or blocksize & (blocksize - 1):
        raise ValueError(f"blocksize {blocksize}: a power of two >= 64 is needed (64 columns share one scale)")


def make_gemv_buffers(gc: GemvCase) -> GemvBuffers:
    from numba import cuda

    _check_layout(gc.N, gc.K, gc.blocksize)
    packed = np.zeros(-(-gc.packed.size // 16) * 16, np.uint8)
    packed[: gc.packed.size] = gc.packed
    xb = np.ascontiguousarray(gc.x_bits.reshape(-1)).view(np.uint32)
    y = np.full(gc.M * gc.N, 0x7FBF, np.uint16)  # poison: a NaN no kernel writes
    return GemvBuffers(
        packed_u32=cuda.to_device(packed).view(np.uint32), absmax_q=cuda.to_device(gc.absmax_q),
        absmax2=cuda.to_device(gc.absmax2), code2=cuda.to_device(gc.code2), lut=cuda.to_device(gc.lut),
        offset=np.float32(gc.offset), x_u32=cuda.to_device(xb), y=cuda.to_device(y),
        N=gc.N, K=gc.K, M=gc.M, bs_shift=int(gc.blocksize).bit_length() - 1, dtype=gc.dtype)


def buffers_from_torch(packed, qs, x, y) -> GemvBuffers:
    """Zero-copy GemvBuffers over torch CUDA tensors (bitsandbytes' own QuantState), for timing."""
    import torch
    from numba import cuda

    N, K = qs.shape
    _check_layout(N, K, qs.blocksize)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]
    assert packed.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0
    arr = lambda t: cuda.as_cuda_array(t.reshape(-1))  # noqa: E731
    return GemvBuffers(
        packed_u32=arr(packed.reshape(-1).view(torch.int32)).view(np.uint32), absmax_q=arr(qs.absmax),
        absmax2=arr(qs.state2.absmax.float()), code2=arr(qs.state2.code.float()), lut=arr(qs.code.float()),
        offset=np.float32(qs.offset.item()), x_u32=arr(x.reshape(-1).view(torch.int32)).view(np.uint32),
        y=arr(y.reshape(-1).view(torch.int16)).view(np.uint16), N=N, K=K, M=x.numel() // K,
        bs_shift=int(qs.blocksize).bit_length() - 1, dtype=dtype)


# ---------------------------------------------------------------- bytes and timing
def weight_bytes(N, K, blocksize=64) -> int:
    """Bytes a GEMV must read for the weight: packed codes + absmax_q + absmax2 + code2 (x, y not counted)."""
    n = N * K
    nblocks = -(-n // blocksize)
    return -(-n // 2) + nblocks + 4 * -(-nblocks // reference.NESTED_BLOCKSIZE) + 1024


def unfused_bytes(N, K, itemsize=2, blocksize=64) -> int:
    """Dequantize then multiply: read the packed weight, write W in 16 bits, read it again."""
    return weight_bytes(N, K, blocksize) + 2 * itemsize * N * K


FUSED = "fused NF4 gemv (numba)"
BNB_GEMV = "bitsandbytes matmul_4bit gemv (M=1)"
BNB_DQ_MM = "bitsandbytes dequantize_4bit + torch.matmul gemv"
COPY_BYTES = 1 << 30  # the copy ceiling: a 1 GiB copy (512 MiB read + 512 MiB written), far beyond L2


def _quantize_gpu(N, K, dtype, seed=0):
    import bitsandbytes.functional as F
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = getattr(torch, TORCH_DTYPE[dtype])
    w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    x = torch.randn(1, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    return packed, qs, x


def _gpu_reference(packed, qs, x):
    """(y64, tol) on the GPU: bitsandbytes' float32 weights, float64 products and sums."""
    import bitsandbytes.functional as F
    import torch

    qs32 = qs.__class__(absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize,
                        quant_type=qs.quant_type, dtype=torch.float32, offset=qs.offset, state2=qs.state2)
    w = F.dequantize_4bit(packed, qs32).double()
    xd = x.double()
    y64 = xd @ w.T
    K = x.shape[-1]
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]
    u = UNIT_OUT[dtype]
    acc = K * EPS32 * (xd.abs() @ w.abs().T)
    tol = (1 + u) * acc + u * y64.abs() + np.finfo(np.float32).tiny
    del w
    return y64, tol


def _gpu_check(y, y64, tol, name):
    err = (y.double() - y64).abs()
    bad = ~(err <= tol)
    ratio = float((err / tol).max())
    return {"name": name, "ok": not bool(bad.any()), "worst_ratio": ratio, "max_err": float(err.max())}


def benchmark(launch, shapes=LLM_SHAPES, dtypes=("bf16", "fp16"), *, progress=print):
    """Fused kernel vs bitsandbytes (gemv, dequantize+matmul) on the same data, in one run (GPU only).

    ``launch(g)`` is the notebook's launch function (``g`` a :class:`GemvBuffers`, launch on
    ``g.stream``), or a dict {name: launch} of variants measured side by side: the first is
    recorded as :data:`FUSED`, the others as ``f"{FUSED} [{name}]"``. To keep repeated launches from reading the weights out of L2 (50 MB on an H100),
    every timed function cycles through enough copies of the weight to exceed 4x the L2 size, as a
    decoding step does (each layer's weights are read once per token).
    Returns a :class:`nf4lab.bench.Run` (records: ceilings, baselines, kernel) with correctness info.
    """
    from . import bench
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    bench._require_gpu()
    launches = dict(launch) if isinstance(launch, dict) else {"": launch}
    names = {key: FUSED if i == 0 else f"{FUSED} [{key}]" for i, key in enumerate(launches)}
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2 so each "
                    "launch reads them from DRAM; effective bandwidth = weight bytes (packed + absmax_q + "
                    "absmax2 + code2) / time")
    l2 = runtime.device_info().get("l2_bytes") or (50 << 20)
    ceil = bench.ceilings(COPY_BYTES)
    run.meta["copy_ceiling_bytes"] = COPY_BYTES
    run.meta["checks"] = []
    for N, K in shapes:
        for dtype in dtypes:
            nb = weight_bytes(N, K)
            copies = max(2, math.ceil(4 * l2 / nb))
            data = [_quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]
            x = data[0][2]
            data = [(p, q, x) for p, q, _ in data]
            y = torch.empty(1, N, dtype=x.dtype, device="cuda")
            bufs = [buffers_from_torch(p, q, x, y) for p, q, _ in data]
            # correctness on copy 0, against float64, for ours and bitsandbytes
            y64, tol = _gpu_reference(*data[0])
            bufs[0].stream = 0
            yb = bnb.matmul_4bit(x, data[0][0].t(), quant_state=data[0][1])
            chk_b = _gpu_check(yb, y64, tol, BNB_GEMV)
            checks = {}
            for key, fn in launches.items():
                fn(bufs[0])  # the first launch compiles (a launch may size its grid from the compiled kernel)
                y.fill_(float("nan"))
                fn(bufs[0])
                torch.cuda.synchronize()
                checks[key] = _gpu_check(y, y64, tol, names[key])
                diff = float((y.float() - yb.float()).abs().max())
                checks[key].update(shape=[N, K], dtype=dtype, max_abs_diff_vs_bnb=diff)
                run.meta["checks"].append(checks[key])
            chk = checks[next(iter(launches))]
            chk_b.update(shape=[N, K], dtype=dtype, max_abs_diff_vs_bnb=chk["max_abs_diff_vs_bnb"])
            run.meta["checks"].append(chk_b)
            diff = chk["max_abs_diff_vs_bnb"]
            del y64, tol
            state = {"i": 0}

            def nxt():
                i = state["i"]
                state["i"] = (i + 1) % copies
                return i

            def make_ours(fn):
                def ours(stream):
                    g = bufs[nxt()]
                    g.stream = stream
                    fn(g)

                return ours

            def bnb_gemv(stream):
                p, q, xx = data[nxt()]
                bnb.matmul_4bit(xx, p.t(), quant_state=q)

            def bnb_dq_mm(stream):
                p, q, xx = data[nxt()]
                torch.matmul(xx, F.dequantize_4bit(p, q).t())

            for kind, name, fn, ok in (("baseline", BNB_GEMV, bnb_gemv, chk_b["ok"]),
                                       ("baseline", BNB_DQ_MM, bnb_dq_mm, None),
                                       *(("kernel", names[key], make_ours(f), checks[key]["ok"])
                                         for key, f in launches.items())):
                state["i"] = 0
                t = bench.gpu_time_ms(fn, launches=max(bench.LAUNCHES, copies))
                rec = bench._record(kind, name, (N, K), dtype, t, nb, bit_exact=None, within_tol=ok,
                                    copies=copies, fits_l2=False)
                run.add(rec)
            for c in ceil:
                run.add(dict(c, shape=[N, K], dtype=dtype))
            if progress:
                progress(f"{N}x{K} {dtype}: done ({copies} weight copies); fused within tolerance: {chk['ok']} "
                         f"(worst {chk['worst_ratio']:.2g}), bnb: {chk_b['ok']} (worst {chk_b['worst_ratio']:.2g}), "
                         f"max |ours - bnb| = {diff:.3g}")
            del data, bufs
            torch.cuda.empty_cache()
    # speedup relative to bitsandbytes' gemv (not its dequantize_4bit, which bench.Run.finalize uses)
    run.finalize()
    for r in run.records:
        same = [q for q in run.records if q["shape"] == r["shape"] and q["dtype"] == r["dtype"]]
        b = next((q for q in same if q["name"] == BNB_GEMV), None)
        if r["kind"] != "ceiling" and b and r.get("ms"):
            r["speedup_vs_bnb"] = b["ms"] / r["ms"]
    return run


def table(run) -> str:
    rows = [f"{'shape NxK':>12} {'dtype':>5}  {'version':<50} {'us':>8} {'GB/s':>7} {'%copy':>6} {'x bnb':>6}"]
    for r in run.records:
        if r["kind"] == "ceiling" and r["name"] != "device copy (read + write)":
            continue
        f = (lambda v, fmt: "-" if v is None else format(v, fmt))
        rows.append(f"{'x'.join(map(str, r['shape'])):>12} {r['dtype'] or '':>5}  {r['name'][:50]:<50} "
                    f"{f(r['ms'] and r['ms'] * 1e3, '.1f'):>8} {f(r['gbps'], '.0f'):>7} "
                    f"{f(r.get('pct_copy'), '.0f'):>6} {f(r.get('speedup_vs_bnb'), '.2f'):>6}")
    return "\n".join(rows)


def plot(run, ax=None):
    """Effective weight bandwidth per shape: bitsandbytes, dequantize+matmul and the fused kernel vs the copy ceiling."""
    import matplotlib.pyplot as plt

    from . import results

    recs = [r for r in run.records if r["kind"] in ("kernel", "baseline")]
    keys = []
    for r in recs:
        k = (tuple(r["shape"]), r["dtype"])
        if k not in keys:
            keys.append(k)
    names = [BNB_DQ_MM, BNB_GEMV, FUSED]
    colors = {BNB_DQ_MM: "tab:gray", BNB_GEMV: "tab:green", FUSED: "tab:orange"}
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs, ys = [], []
        for i, k in enumerate(keys):
            r = next((q for q in recs if q["name"] == name and tuple(q["shape"]) == k[0] and q["dtype"] == k[1]), None)
            if r:
                xs.append(i + (j - 1) * width)
                ys.append(r["gbps"])
        ax.bar(xs, ys, width, label=name, color=colors[name])
    copy = next((r for r in run.records if r["name"] == "device copy (read + write)"), None)
    if copy:
        ax.axhline(copy["gbps"], color="tab:red", ls="--", label=f"copy ceiling {copy['gbps']:.0f} GB/s")
        ax.axhline(0.85 * copy["gbps"], color="tab:red", ls=":", lw=1, label="85% of the copy ceiling")
    ax.set_xticks(range(len(keys)), [f"{k[0][0]}x{k[0][1]}\n{k[1]}" for k in keys], fontsize=8)
    ax.set_ylabel("effective weight bandwidth, GB/s")
    ax.set_xlabel("W shape (N out x K in), activation dtype; batch 1")
    ax.set_title("NF4 GEMV at decode time: weight bytes read per second")
    ax.legend(fontsize=8, loc="lower right")
    if fig is not None:
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        if run.meta:
            fig.text(0.01, 0.005, "measured on " + results.label(run.meta) + "\n" + run.meta.get("method", "")[:160],
                     fontsize=7, color="0.35", va="bottom")
    return ax
