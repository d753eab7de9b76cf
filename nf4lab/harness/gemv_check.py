"""The fused GEMV's float64 check (09, section 6): a case with exact ``y64``, the float32 tolerance, the verdicts."""
import dataclasses

import numpy as np

from . import cases
from ..format import reference
from ..kernels.gemv import make_gemv_buffers

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
    case: object = None     # the nf4lab.harness.cases.Case it was made from
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
    """W (N, K) quantized by bitsandbytes (nf4lab.harness.cases, cached; ``dist`` as there), x (M, K) rounded to the
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
    """``y`` against float64; ``rounded_table``: the NF4 values in the dtype, as mma takes them (:func:`tolerance`)."""
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
    x = torch.from_numpy(gc.x_bits.view(np.int16).copy()).view(reference.torch_dtype(gc.dtype)).to(device)
    with torch.no_grad():
        return bnb.matmul_4bit(x, packed.t(), quant_state=qs)


def check_exercise(launch_fn, name="exercise: warp reduction", rounded_table=False, shape=(16, 128)) -> bool:
    """Grade a GEMV launch function on a small (N, K) = ``shape`` case against float64 and print the verdict."""
    g = make_gemv_buffers(gc := make_gemv_case(*shape, "bf16", seed=3))
    try:
        launch_fn(g)
        rep = compare(g.result(), gc, name=name, rounded_table=rounded_table)
    except Exception as exc:  # a broken kernel must not stop the notebook
        print(f"NOT PASSED: the kernel raised {type(exc).__name__}: {exc}")
        return False
    print(("PASSED: " if rep.ok else "NOT PASSED (not solved yet): ") + str(rep))
    return rep.ok
