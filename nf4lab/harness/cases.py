"""Test cases made by bitsandbytes itself, cached under data/.

A :class:`Case` holds what a dequantization kernel reads (packed codes, the nested
absmax statistics) and what bitsandbytes' own ``dequantize_4bit`` returned for them,
as raw bit patterns. Cases are reproducible from (shape, dtype, dist, seed, blocksize,
quant_type) and cached as .npz: small ones are committed under data/cases/, the rest
land in data/cache/ (git-ignored). Files are written to a temporary name and renamed,
so an interrupted run never leaves half a file behind.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from .. import config
from ..format import reference
from ..format.reference import BLOCKSIZES, DTYPES, QUANT_TYPES

ROOT = Path(__file__).resolve().parents[2]
COMMITTED_DIR = ROOT / "data" / "cases"
CACHE_DIR = Path(config.cache_dir(ROOT / "data" / "cache"))

DISTS = {
    "randn": "standard normal weights",
    "heavy": "Student-t (3 degrees of freedom) times a log-normal per-row scale: outliers and "
             "blocks whose absmax spans orders of magnitude",
    "codes": "every block holds all 16 NF4 levels (4 times each in a 64-block), shuffled, "
             "times a random block scale: every code is exercised everywhere",
    "llm": "normal weights with a few large outlier columns, like real LLM linear layers",
}

@dataclasses.dataclass
class Case:
    name: str
    shape: tuple
    dtype: str              # output dtype: bf16 | fp16 | fp32
    dist: str
    seed: int
    blocksize: int
    quant_type: str
    packed: np.ndarray      # uint8, ceil(n/2) bytes, high nibble first
    absmax_q: np.ndarray    # uint8, one per block (nested statistics)
    absmax2: np.ndarray     # float32, one per group of 256 blocks
    code2: np.ndarray       # float32[256], the 8-bit code of the nested quantization
    offset: np.float32      # added to every block's absmax
    expected: np.ndarray    # bitsandbytes' dequantize_4bit output, raw bits (uint16 / uint32)
    device: str = "cpu"     # where bitsandbytes ran

    @property
    def n(self) -> int:
        return int(math.prod(self.shape))

    @property
    def nblocks(self) -> int:
        return self.absmax_q.size

    @property
    def itemsize(self) -> int:
        return reference.ITEMSIZE[self.dtype]

    @property
    def lut(self) -> np.ndarray:
        """The table bitsandbytes used for this case (fp4 differs at code 8 between CPU and CUDA)."""
        return reference.lut_for(self.quant_type, self.device)

    def expected_f32(self) -> np.ndarray:
        return reference.bits_to_f32(self.expected, self.dtype)

    def quant_state(self, device="cpu"):
        """The case as a bitsandbytes QuantState (and packed tensor) on ``device``."""
        import torch
        from bitsandbytes.functional import QuantState

        state2 = QuantState(absmax=torch.from_numpy(self.absmax2).to(device),
                            code=torch.from_numpy(self.code2).to(device),
                            blocksize=reference.NESTED_BLOCKSIZE, dtype=torch.float32)
        qs = QuantState(absmax=torch.from_numpy(self.absmax_q).to(device), shape=torch.Size(self.shape),
                        code=torch.from_numpy(self.lut.copy()).to(device), blocksize=self.blocksize,
                        quant_type=self.quant_type, dtype=reference.torch_dtype(self.dtype),
                        offset=torch.tensor(float(self.offset), device=device), state2=state2)
        packed = torch.from_numpy(self.packed).to(device).reshape(-1, 1)
        return packed, qs

    def __repr__(self) -> str:
        return (f"Case({self.name}: {self.n:,} weights, {self.nblocks:,} quantization blocks, "
                f"{self.absmax2.size} groups, out {self.dtype}, bitsandbytes on {self.device})")


def _validate(shape, dtype, dist, seed, blocksize, quant_type) -> tuple:
    if isinstance(shape, int):
        shape = (shape,)
    if isinstance(shape, str):
        raise ValueError(f"shape must be a tuple of positive ints, got {shape!r}")
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a tuple of positive ints, got {shape!r}") from None
    if not shape or len(shape) > 2 or any(s < 1 for s in shape):
        raise ValueError(f"shape must be 1 or 2 positive ints (rows, cols), got {shape!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dist not in DISTS:
        raise ValueError(f"dist must be one of {tuple(DISTS)}, got {dist!r}")
    if blocksize not in BLOCKSIZES:
        raise ValueError(f"blocksize must be one of {BLOCKSIZES}, got {blocksize!r}")
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {quant_type!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return shape, dtype, dist, int(seed), blocksize, quant_type


def case_name(shape, dtype="bf16", dist="randn", seed=0, blocksize=64, quant_type="nf4") -> str:
    dims = "x".join(str(s) for s in shape)
    return f"{quant_type}_{dims}_{dtype}_{dist}_b{blocksize}_s{seed}"


def _weights(shape, dist, seed, blocksize):
    import torch

    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dist == "randn":
        w = torch.randn(n, generator=g)
    elif dist == "heavy":
        t = torch.distributions.StudentT(3.0)
        torch.manual_seed(seed)
        w = t.sample((n,))
        rows = shape[0] if len(shape) == 2 else 1
        row_scale = torch.exp(2.0 * torch.randn(rows, generator=g))
        w = (w.reshape(rows, -1) * row_scale[:, None]).reshape(-1)
    elif dist == "codes":
        nblocks = -(-n // blocksize)
        levels = torch.from_numpy(reference.NF4_LUT).repeat(-(-blocksize // 16))[:blocksize]
        keys = torch.rand(nblocks, blocksize, generator=g)
        perm = keys.argsort(dim=1)
        blocks = levels[perm] * torch.exp(torch.randn(nblocks, 1, generator=g))
        w = blocks.reshape(-1)[:n]
    elif dist == "llm":
        rows = shape[0] if len(shape) == 2 else 1
        w = 0.02 * torch.randn(rows, n // rows, generator=g)
        cols = w.shape[1]
        k = max(1, cols // 512)
        idx = torch.randperm(cols, generator=g)[:k]
        w[:, idx] *= 50.0
        w = w.reshape(-1)
    return w.reshape(shape)


def _bnb_device(device):
    if device is not None:
        return device
    from .. import runtime

    return "cuda" if runtime.ON_GPU else "cpu"


def generate(shape, dtype="bf16", dist="randn", seed=0, blocksize=64, quant_type="nf4",
             device=None) -> Case:
    """Quantize fresh weights with bitsandbytes and record its dequantize_4bit output."""
    shape, dtype, dist, seed, blocksize, quant_type = _validate(shape, dtype, dist, seed, blocksize, quant_type)
    import torch
    import bitsandbytes.functional as F

    device = _bnb_device(device)
    tdtype = reference.torch_dtype(dtype)
    w = _weights(shape, dist, seed, blocksize)
    top, peak = torch.finfo(tdtype).max / 2, float(w.abs().max())   # half: room for the scale's 8-bit rounding
    if peak > top:
        # fp16 (65504): a heavy tail past it is inf in fp16, bitsandbytes' offset inf and every output NaN
        w = w * (top / peak)
    w = w.to(tdtype).to(device)
    packed, qs = F.quantize_4bit(w, blocksize=blocksize, quant_type=quant_type, compress_statistics=True)
    out = F.dequantize_4bit(packed, qs)
    bits_dtype = reference.BITS_DTYPE[dtype]
    expected = out.reshape(-1).contiguous().view(getattr(torch, {2: "int16", 4: "int32"}[out.element_size()]))
    return Case(
        name=case_name(shape, dtype, dist, seed, blocksize, quant_type),
        shape=shape, dtype=dtype, dist=dist, seed=seed, blocksize=blocksize, quant_type=quant_type,
        packed=packed.reshape(-1).cpu().numpy().astype(np.uint8),
        absmax_q=qs.absmax.cpu().numpy().astype(np.uint8),
        absmax2=qs.state2.absmax.float().cpu().numpy(),
        code2=qs.state2.code.float().cpu().numpy(),
        offset=np.float32(qs.offset.item()),
        expected=expected.cpu().numpy().view(bits_dtype).copy(),
        device=str(device),
    )


def _save_atomic(case: Case, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp.npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, packed=case.packed, absmax_q=case.absmax_q, absmax2=case.absmax2,
                     code2=case.code2, offset=np.float32(case.offset), expected=case.expected,
                     meta=np.array([case.name, case.dtype, case.dist, str(case.seed), str(case.blocksize),
                                    case.quant_type, case.device, "x".join(map(str, case.shape))]))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load(path: Path) -> Case:
    with np.load(path) as z:
        name, dtype, dist, seed, blocksize, quant_type, device, dims = (str(x) for x in z["meta"])
        return Case(name=name, shape=tuple(int(s) for s in dims.split("x")), dtype=dtype, dist=dist,
                    seed=int(seed), blocksize=int(blocksize), quant_type=quant_type,
                    packed=z["packed"], absmax_q=z["absmax_q"], absmax2=z["absmax2"], code2=z["code2"],
                    offset=np.float32(z["offset"]), expected=z["expected"], device=device)


def _outputs_are_numbers(case: Case) -> bool:
    """False for a case cached before generate() scaled weights into fp16's range: its outputs were all NaN."""
    return case.dtype != "fp16" or not np.isnan(case.expected.view(np.float16)).any()   # no copy: a view


def case_path(name: str) -> Path | None:
    for d in (COMMITTED_DIR, CACHE_DIR):
        p = d / f"{name}.npz"
        if p.exists():
            return p
    return None


def make_case(shape=None, dtype="bf16", dist="randn", seed=0, blocksize=64, quant_type="nf4", *,
              cache=True, device=None) -> Case:
    """A case of ``shape`` (default: :func:`nf4lab.runtime.default_shape`), from the cache if there.

    Raises ValueError naming the parameter for an impossible request, before anything
    is generated or written.
    """
    from .. import runtime

    if shape is None:
        shape = runtime.default_shape()
    shape, dtype, dist, seed, blocksize, quant_type = _validate(shape, dtype, dist, seed, blocksize, quant_type)
    name = case_name(shape, dtype, dist, seed, blocksize, quant_type)
    if cache:
        found = case_path(name)
        if found is not None and _outputs_are_numbers(case := _load(found)):
            return case
    case = generate(shape, dtype, dist, seed, blocksize, quant_type, device=device)
    if cache:
        _save_atomic(case, CACHE_DIR / f"{name}.npz")
    return case


def commit_case(case: Case) -> Path:
    """Store a (small) case under data/cases/, where git tracks it."""
    path = COMMITTED_DIR / f"{case.name}.npz"
    _save_atomic(case, path)
    return path


def edge_shapes() -> list[tuple]:
    """Sizes that break sloppy kernels: odd counts, partial blocks, partial groups, tiny."""
    return [(1, 1), (3, 5), (1, 63), (7, 33), (1, 64), (1, 65), (31, 67), (129, 127),
            (2, 16383), (1, 16385), (130, 129)]
