"""One validation of a quantized weight (nf4lab.kernels.qweight), made once per weight and kept.

Every entry point answers bad tensors by the same rules: nf4lab.dequantize raises qweight.problem's line,
install()'s bitsandbytes ops hand the call back. A kept weight is not checked again, and a record never
outlives a change of its tensors."""
import gc

import bitsandbytes.functional as F
import pytest
import torch

import nf4lab
from nf4lab.integrations import bnb_backend, torch_ops
from nf4lab.kernels import qweight


def quantize(shape=(32, 128), nested=True, bs=64):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(shape, generator=g).to(torch.bfloat16)
    return F.quantize_4bit(w, blocksize=bs, compress_statistics=nested, quant_type="nf4")


def linear_args(packed, qs):
    """bitsandbytes' gemm_4bit order for dequant_linear: (packed, shape, absmax, blocksize, quant_type, bias,
    absmax_q, code2, offset)."""
    if qs.nested:
        return (packed, list(qs.shape), qs.state2.absmax, qs.blocksize, qs.quant_type, None, qs.absmax,
                qs.state2.code, qs.offset)
    return (packed, list(qs.shape), qs.absmax, qs.blocksize, qs.quant_type, None)


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = qweight.problem
    monkeypatch.setattr(qweight, "problem", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("nested", [True, False])
def test_a_weight_is_checked_once_then_found(counted, nested):
    packed, qs = quantize(nested=nested)
    x = torch.randn(4, 128).to(torch.bfloat16)
    args = linear_args(packed, qs)
    first = torch_ops.dequant_linear(x, *args)
    again = [torch_ops.dequant_linear(x, *args) for _ in range(3)]
    assert len(counted) == 1, f"checked {len(counted)} times"
    want = torch.nn.functional.linear(x, F.dequantize_4bit(packed, qs))
    for y in (first, *again):
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))


def test_a_changed_tensor_is_checked_again(counted):
    packed, qs = quantize(nested=True)
    x = torch.randn(2, 128).to(torch.bfloat16)
    args = linear_args(packed, qs)
    torch_ops.dequant_linear(x, *args)
    qs.offset.add_(0)        # in place: a new version of the offset
    torch_ops.dequant_linear(x, *args)
    assert len(counted) == 2
    other = packed.clone()   # the same statistics with other packed bytes
    torch_ops.dequant_linear(x, other, *args[1:])
    assert len(counted) == 3


def test_a_kept_weight_is_not_taken_through_another_dtype_view():
    packed, qs = quantize(nested=True)
    x = torch.randn(2, 128).to(torch.bfloat16)
    args = linear_args(packed, qs)
    assert torch_ops.dequant_linear(x, *args) is not None
    assert torch_ops.dequant_linear(x, packed.view(torch.int8), *args[1:]) is None


def test_a_kept_weight_is_not_taken_through_a_short_or_strided_view():
    """Views that start at the same address: the kept record must not stand in for the checks they fail."""
    packed, qs = quantize(nested=True)
    x = torch.randn(2, 128).to(torch.bfloat16)
    args = linear_args(packed, qs)
    assert torch_ops.dequant_linear(x, *args) is not None
    flat = packed.view(-1)
    assert torch_ops.dequant_linear(x, flat[:10], *args[1:]) is None
    strided = flat.as_strided((flat.numel() // 2,), (2,))
    assert torch_ops.dequant_linear(x, strided, *args[1:]) is None


def test_the_record_goes_with_its_statistics():
    packed, qs = quantize(nested=True)
    x = torch.randn(2, 128).to(torch.bfloat16)
    torch_ops.dequant_linear(x, *linear_args(packed, qs))
    key = id(qs.absmax)
    assert key in qweight._KNOWN
    del qs
    gc.collect()
    assert key not in qweight._KNOWN


BAD = {
    "absmax short": lambda p, s: (p, s.shape, s.blocksize, s.quant_type, s.absmax[:3]),
    "absmax dtype": lambda p, s: (p, s.shape, s.blocksize, s.quant_type, s.absmax.double()),
    "A dtype": lambda p, s: (p.view(torch.int8), s.shape, s.blocksize, s.quant_type, s.absmax),
    "A short": lambda p, s: (p[:10], s.shape, s.blocksize, s.quant_type, s.absmax),
    "blocksize": lambda p, s: (p, s.shape, 48, s.quant_type, s.absmax),
    "quant_type": lambda p, s: (p, s.shape, s.blocksize, "int4", s.absmax),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_every_entry_point_applies_the_same_rules(what):
    packed, qs = quantize(nested=False)
    A, shape, bs, qt, absmax = BAD[what](packed, qs)
    why = qweight.problem(A, shape, bs, qt, absmax, dtype=qs.dtype, nested=False)
    assert why is not None and why[0] in (TypeError, ValueError)
    state = F.QuantState(absmax=absmax, shape=shape, blocksize=bs, quant_type=qt, dtype=qs.dtype)
    with pytest.raises(why[0]) as err:
        nf4lab.dequantize(A, state)
    assert str(err.value) == why[1] and "\n" not in why[1]
    assert not bnb_backend._dequantize_handles(A, absmax, bs, qt, list(shape), qs.dtype)
    x = torch.randn(2, shape[1]).to(torch.bfloat16)
    assert torch_ops.dequant_linear(x, A, list(shape), absmax, bs, qt) is None
