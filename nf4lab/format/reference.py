"""NF4/FP4 dequantization in numpy, bit for bit what bitsandbytes computes.

This is the spec kernels are checked against when bitsandbytes is not at hand.
bitsandbytes (quant_type="nf4", compress_statistics=True) computes, per weight::

    absmax[b] = float32(code2[absmax_q[b]] * absmax2[b // 256])   # rounded once
    absmax[b] = float32(absmax[b] + offset)                        # rounded again
    w[i]      = float32(LUT[q[i]] * absmax[i // blocksize])        # rounded again
    out[i]    = round_to_nearest_even(w[i] -> bf16 | fp16 | fp32)

with ``q[2j] = packed[j] >> 4`` and ``q[2j+1] = packed[j] & 15`` (high nibble first).
numpy float32 arithmetic rounds every operation to nearest even, exactly like the
separately rounded GPU instructions (and unlike a fused multiply-add).
"""
from __future__ import annotations

import numpy as np

# bitsandbytes.functional.get_4bit_type("nf4"), already normalised to [-1, 1].
NF4_LUT = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=np.float32)

# get_4bit_type("fp4") divided by its max (12). Code 8 is "-0" in bitsandbytes' list,
# which Python reads as integer 0, so the CPU table holds +0.0 there (see FP4_LUT_CUDA).
FP4_LUT = (np.array([0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0,
                     0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0], dtype=np.float32)
           / np.float32(12.0)).astype(np.float32)

LUTS = {"nf4": NF4_LUT, "fp4": FP4_LUT}

# bitsandbytes' CUDA kernel decodes fp4 with a sign bit applied to the magnitude, so code 8
# comes out as -0.0 there: same table, one signed zero apart.
FP4_LUT_CUDA = FP4_LUT.copy()
FP4_LUT_CUDA[8] = np.float32(-0.0)
LUTS_CUDA = {"nf4": NF4_LUT, "fp4": FP4_LUT_CUDA}


def lut_for(quant_type: str, device: str = "cpu") -> np.ndarray:
    """The 16-entry table bitsandbytes uses for ``quant_type`` on ``device`` ("cpu" or "cuda...")."""
    if quant_type not in LUTS:
        raise ValueError(f"quant_type must be one of {QUANT_TYPES}, got {quant_type!r}")
    return (LUTS_CUDA if str(device).startswith("cuda") else LUTS)[quant_type]

DTYPES = ("bf16", "fp16", "fp32")
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
BITS_DTYPE = {"bf16": np.uint16, "fp16": np.uint16, "fp32": np.uint32}
# The one dtype map: the names the package uses, torch's names for them (torch itself is imported only
# when a torch dtype is asked for: this module must import without torch).
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_BY_TORCH: dict = {}  # torch.dtype -> "bf16" | "fp16" | "fp32", filled on first use
_TO_TORCH: dict = {}  # "bf16" | "fp16" | "fp32" -> torch.dtype


def _fill_torch() -> None:
    import torch

    for name, attr in TORCH_NAMES.items():
        _TO_TORCH[name] = getattr(torch, attr)
        _BY_TORCH[getattr(torch, attr)] = name


def torch_dtype(name: str):
    """The torch dtype of "bf16", "fp16" or "fp32"."""
    if not _TO_TORCH:
        _fill_torch()
    if name not in _TO_TORCH:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    return _TO_TORCH[name]


def dtype_names() -> dict:
    """torch dtype -> "bf16" | "fp16" | "fp32": a plain dict (a lookup in it is what torch.compile traces;
    ``str(dtype)`` it does not)."""
    if not _BY_TORCH:
        _fill_torch()
    return _BY_TORCH


def dtype_name(tdtype):
    """"bf16", "fp16" or "fp32" for a torch dtype; None for any other value."""
    return dtype_names().get(tdtype)
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
QUANT_TYPES = ("nf4", "fp4")
NESTED_BLOCKSIZE = 256  # blocks per absmax2 group: bitsandbytes' compress_statistics


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (what torch's .to(bfloat16) does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def f32_to_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    if dtype == "fp16":
        with np.errstate(over="ignore"):  # overflow to inf is the right answer, as in torch
            return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)
    if dtype == "fp32":
        return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def bits_to_f32(bits: np.ndarray, dtype: str) -> np.ndarray:
    bits = np.asarray(bits)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if dtype == "fp16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    if dtype == "fp32":
        return bits.astype(np.uint32).view(np.float32)
    raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def unpack_codes(packed: np.ndarray, n: int) -> np.ndarray:
    """The n 4-bit codes in order: high nibble of each byte first."""
    packed = np.asarray(packed, dtype=np.uint8).reshape(-1)
    codes = np.empty(2 * packed.size, dtype=np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 0x0F
    return codes[:n]


def block_absmax(absmax_q, absmax2, code2, offset, nested_blocksize=NESTED_BLOCKSIZE) -> np.ndarray:
    """The float32 scale of each block: code2[q] * absmax2[group], rounded, + offset, rounded."""
    absmax_q = np.asarray(absmax_q).reshape(-1)
    groups = np.arange(absmax_q.size) // nested_blocksize
    scaled = np.asarray(code2, np.float32)[absmax_q] * np.asarray(absmax2, np.float32)[groups]
    return (scaled.astype(np.float32) + np.float32(offset)).astype(np.float32)


def dequantize_f32(packed, absmax, n, blocksize, quant_type="nf4", device="cpu") -> np.ndarray:
    """float32 weights from packed codes and per-block float32 absmax."""
    lut = lut_for(quant_type, device)
    codes = unpack_codes(packed, n)
    scale = np.asarray(absmax, np.float32)[np.arange(n) // blocksize]
    return lut[codes] * scale


def dequantize_bits(packed, absmax_q, absmax2, code2, offset, n, blocksize, dtype,
                    quant_type="nf4", device="cpu") -> np.ndarray:
    """Bit patterns (uint16 for bf16/fp16, uint32 for fp32) of bitsandbytes' dequantize_4bit."""
    absmax = block_absmax(absmax_q, absmax2, code2, offset)
    return f32_to_bits(dequantize_f32(packed, absmax, n, blocksize, quant_type, device), dtype)


def dequantize_case(case) -> np.ndarray:
    """The reference bits for a :class:`nf4lab.harness.cases.Case` (with the table of the device bnb ran on)."""
    return dequantize_bits(case.packed, case.absmax_q, case.absmax2, case.code2, case.offset,
                           case.n, case.blocksize, case.dtype, case.quant_type, case.device)
