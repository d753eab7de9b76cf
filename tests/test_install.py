"""nf4lab.install(): bitsandbytes' ops served by nf4lab, fall-through, exact restore, torch.compile.

No GPU here, so install() itself must change nothing; the mechanism it uses (our kernels in a
torch Library of our own, on one dispatch key of bitsandbytes' ops) is exercised on the CPU key
through ``bnb_backend._register``, with recording fallbacks. The GPU run (tools/gpu_bnb_tests.sh)
runs bitsandbytes' own test suite with install() on CUDA.
"""
import numpy as np
import pytest
import torch

import nf4lab
from nf4lab import bnb_backend, torch_ops

F = pytest.importorskip("bitsandbytes.functional")
bnb = pytest.importorskip("bitsandbytes")


def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()]).numpy()


def quantize(shape, dtype=torch.bfloat16, bs=64, qt="nf4", nested=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.quantize_4bit(torch.randn(shape, generator=g).to(dtype), blocksize=bs, quant_type=qt,
                           compress_statistics=nested)


@pytest.fixture
def on_cpu_key(monkeypatch):
    """Our kernels registered for bitsandbytes' ops on the CPU key; yields (ours, fallback) call lists."""
    ours, fell = [], []
    real = torch_ops._run
    monkeypatch.setattr(torch_ops, "_run", lambda *a: ours.append(1) or real(*a))

    def fallback(name):
        def f(*args):
            fell.append(name)
            A, absmax, bs, qt, shape, dtype = args[:6]
            res = nf4lab.dequantize(A.contiguous().view(torch.uint8).reshape(-1),
                                    F.QuantState(absmax=absmax.contiguous(), shape=torch.Size(shape), blocksize=bs,
                                                 quant_type=qt, dtype=dtype))
            if name.endswith(".out"):
                args[6].copy_(res)
                return None
            return res
        return f

    bnb_backend._register("CPU", {n: fallback(n) for n in ("dequantize_4bit", "dequantize_4bit.out")},
                          ["dequantize_4bit", "dequantize_4bit.out"])
    try:
        yield ours, fell
    finally:
        bnb_backend.uninstall()


def test_install_without_gpu_changes_nothing():
    packed, qs = quantize((16, 96))
    before = bits(F.dequantize_4bit(packed, qs))
    assert nf4lab.install() is False and not nf4lab.installed()
    assert nf4lab.install() is False  # twice: harmless
    with nf4lab.installed_in() as ok:
        assert ok is False
    assert np.array_equal(bits(F.dequantize_4bit(packed, qs)), before)


def test_install_rejects_bad_argument():
    with pytest.raises(TypeError, match="compile must be a bool"):
        nf4lab.install(compile="yes")


def test_compile_for_decode_rejects_a_model_without_bnb_4bit():
    with pytest.raises(TypeError, match="bitsandbytes 4-bit quantization_config"):
        nf4lab.compile_for_decode(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("shape,bs", [((128, 96), 64), ((128, 64), 128), ((33, 64), 64)])
def test_registered_kernel_serves_bitsandbytes_then_uninstall_restores(on_cpu_key, shape, bs):
    ours, fell = on_cpu_key
    packed, qs = quantize(shape, bs=bs)
    got = F.dequantize_4bit(packed, qs)  # bitsandbytes' Python, through the dispatcher, to nf4lab
    assert ours and not fell
    assert np.array_equal(bits(got), bits(nf4lab.dequantize(packed, qs)))
    out = torch.empty(shape, dtype=torch.bfloat16)
    F.dequantize_4bit(packed, qs, out=out)
    assert np.array_equal(bits(out), bits(got)) and not fell
    bnb_backend.uninstall()
    n = len(ours)
    restored = F.dequantize_4bit(packed, qs)
    assert len(ours) == n, "after uninstall() bitsandbytes' own kernel must run"
    # bitsandbytes' own CPU kernel again: the same result as in a process that never installed
    # (on an AVX-512 CPU it differs from nf4lab where a block crosses a row: test_dequantize).
    from bitsandbytes.backends.cpu import ops as cpu_ops  # noqa: F401
    assert restored.shape == got.shape


def test_what_nf4lab_does_not_take_falls_through(on_cpu_key):
    ours, fell = on_cpu_key
    packed, qs = quantize((16, 64), nested=False)
    absmax = torch.stack([qs.absmax, qs.absmax], 1)[:, 0]  # non-contiguous statistics
    torch.ops.bitsandbytes.dequantize_4bit(packed, absmax, 64, "nf4", [16, 64], torch.bfloat16)
    assert fell == ["dequantize_4bit"] and not ours
    storage = packed.reshape(-1).view(torch.bfloat16)  # another quant_storage
    torch.ops.bitsandbytes.dequantize_4bit(storage, qs.absmax, 64, "nf4", [16, 64], torch.bfloat16)
    assert fell == ["dequantize_4bit"] * 2 and not ours


def test_linear4bit_forward_backward_compiled_through_installed_ops(on_cpu_key):
    """Linear4bit with grad: matmul_4bit -> MatMul4Bit -> F.dequantize_4bit -> our kernel, forward
    and backward, under torch.compile(fullgraph=True); bit-exact with nf4lab's own dequantize."""
    ours, fell = on_cpu_key
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = bnb.nn.Linear4bit(64, 32, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(lin.weight.data.clone(), requires_grad=False, quant_type="nf4")
    if not lin.weight.bnb_quantized:  # Params4bit quantizes when moved to a device; on CPU, by hand
        lin.weight._quantize("cpu")
    x = torch.randn(4, 64, requires_grad=True)
    w = nf4lab.dequantize(lin.weight.data, lin.weight.quant_state).float()
    f = torch.compile(lin, fullgraph=True, backend="aot_eager")
    y = f(x)
    y.sum().backward()
    assert ours and not fell
    assert torch.equal(y, torch.nn.functional.linear(x.detach(), w))
    assert torch.equal(x.grad, torch.ones(4, 32) @ w)


def test_uninstall_is_harmless_when_not_installed():
    bnb_backend.uninstall()
    bnb_backend.uninstall()
    assert not nf4lab.installed()
