"""nf4lab's torch custom ops: torch.compile(fullgraph=True) traces through nf4lab.dequantize, bit for bit.

CPU here (the same op serves CUDA tensors; the GPU run covers them, tools/gpu_bnb_tests.sh).
Backend ``aot_eager``: it traces with fake tensors and functionalizes like inductor does, without
compiling C++ on a shared 2-core machine; tracing is what can fail here (``fullgraph=True``
turns any graph break into an error).
"""
import numpy as np
import pytest
import torch

import nf4lab
from nf4lab.kernels import dequant
from nf4lab.integrations import torch_ops

F = pytest.importorskip("bitsandbytes.functional")

TD = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_VIEW = {2: torch.int16, 4: torch.int32}


def bits(t):
    t = t.contiguous().reshape(-1)
    return t.view(INT_VIEW[t.element_size()]).numpy()


def quantize(shape, dtype, bs, qt, nested, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g).to(TD[dtype])
    return F.quantize_4bit(w, blocksize=bs, quant_type=qt, compress_statistics=nested)


CASES = [((64, 96), "bf16", 64, "nf4", True), ((33, 64), "fp16", 128, "fp4", False),
         ((300,), "fp32", 64, "nf4", True), ((7, 18), "bf16", 32, "fp4", True), ((128, 64), "fp16", 128, "nf4", False)]


@pytest.mark.parametrize("shape,dtype,bs,qt,nested", CASES)
def test_compiled_dequantize_is_bit_exact(shape, dtype, bs, qt, nested):
    torch._dynamo.reset()
    packed, qs = quantize(shape, dtype, bs, qt, nested)
    eager = nf4lab.dequantize(packed, qs)
    compiled = torch.compile(lambda a, s: nf4lab.dequantize(a, s), fullgraph=True, backend="aot_eager")
    got = compiled(packed, qs)
    assert got.shape == eager.shape and got.dtype == eager.dtype
    assert np.array_equal(bits(got), bits(eager))
    # and the op really was in the graph: eager (not compiled) calls do not go through it
    out = torch.full(tuple(qs.shape), float("nan"), dtype=eager.dtype)
    torch.compile(lambda a, s, o: nf4lab.dequantize(a, s, out=o), fullgraph=True, backend="aot_eager")(packed, qs, out)
    assert np.array_equal(bits(out), bits(eager))


def test_compiled_one_row_input_is_transposed_like_eager():
    torch._dynamo.reset()
    packed, qs = quantize((24, 64), "bf16", 64, "nf4", True)
    row = packed.view(1, -1)
    eager = nf4lab.dequantize(row, qs)
    got = torch.compile(lambda a, s: nf4lab.dequantize(a, s), fullgraph=True, backend="aot_eager")(row, qs)
    assert got.shape == eager.shape == (64, 24)
    assert np.array_equal(bits(got), bits(eager))


def test_op_is_called_when_compiling(monkeypatch):
    """The launch must happen inside the op: count the op's calls during a compiled run."""
    torch._dynamo.reset()
    calls = []
    real = torch_ops._run
    monkeypatch.setattr(torch_ops, "_run", lambda *a: calls.append(1) or real(*a))
    packed, qs = quantize((16, 64), "fp16", 64, "nf4", True)
    torch.compile(lambda a, s: nf4lab.dequantize(a, s), fullgraph=True, backend="aot_eager")(packed, qs)
    assert calls, "the compiled graph did not run nf4lab::dequantize_4bit"


@pytest.mark.parametrize("shape,dtype,bs,qt,nested", CASES[:3])
def test_opcheck(shape, dtype, bs, qt, nested):
    """torch's own checks of a custom op: schema, fake implementation against the real one, aliasing."""
    packed, qs = quantize(shape, dtype, bs, qt, nested)
    args = dequant.op_args(dequant.plan(packed, qs, None))
    torch.library.opcheck(torch.ops.nf4lab.dequantize_4bit.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    out = torch.empty(tuple(qs.shape), dtype=qs.dtype)
    torch.library.opcheck(torch.ops.nf4lab.dequantize_4bit_out.default, (*args, out),
                          test_utils=("test_schema", "test_faketensor"))


def test_op_rejects_bad_input_like_dequantize():
    packed, qs = quantize((8, 64), "bf16", 64, "nf4", False)
    args = list(dequant.op_args(dequant.plan(packed, qs, None)))
    bad = list(args)
    bad[5] = 48  # blocksize
    with pytest.raises(ValueError, match="quant_state.blocksize"):
        torch.ops.nf4lab.dequantize_4bit(*bad)
    bad = list(args)
    bad[0] = packed.view(torch.int8)
    with pytest.raises(TypeError, match="A must be a uint8"):
        torch.ops.nf4lab.dequantize_4bit(*bad)
    bad = list(args)
    bad[1] = qs.absmax[:2]
    with pytest.raises(ValueError, match="absmax holds 2 values"):
        torch.ops.nf4lab.dequantize_4bit(*bad)
    with pytest.raises(ValueError, match="give all three"):
        torch.ops.nf4lab.dequantize_4bit(*args[:2], torch.ones(1), None, None, *args[5:])


def test_gemv_op_traces_and_matches_dequantize_matmul():
    torch._dynamo.reset()
    packed, qs = quantize((40, 128), "bf16", 64, "nf4", True)
    x = torch.randn(3, 128).to(torch.bfloat16)
    args = (packed, list(qs.shape), qs.absmax, qs.state2.absmax, qs.state2.code, qs.offset, qs.blocksize)
    eager = torch.ops.nf4lab.gemv_4bit(x, *args)
    w = nf4lab.dequantize(packed, qs)
    assert torch.equal(eager, torch.nn.functional.linear(x, w))  # CPU: dequantize + matmul, same ops
    got = torch.compile(lambda x: torch.ops.nf4lab.gemv_4bit(x, *args), fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, eager)
    with pytest.raises(ValueError, match="shape must be the weight"):
        torch.ops.nf4lab.gemv_4bit(x[:, :64], *args)


def test_dequantize_plan_traces_without_str_of_dtype():
    """The traced validation reads quant_state.dtype by dict lookup (dynamo cannot trace str(dtype)),
    and a wrong dtype is still rejected with the parameter named."""
    packed, qs = quantize((8, 64), "bf16", 64, "nf4", False)
    qs.dtype = torch.int32
    with pytest.raises(ValueError, match="quant_state.dtype"):
        nf4lab.dequantize(packed, qs)


def test_offset_value_is_read_once_and_again_after_an_inplace_change(monkeypatch):
    off = torch.tensor(0.25)
    assert torch_ops.offset_value(off) == 0.25
    reads = []
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: reads.append(1) or real_item(self))
    assert torch_ops.offset_value(off) == 0.25 and not reads  # cached: no device read (no sync)
    off.add_(1.0)
    assert torch_ops.offset_value(off) == 1.25 and len(reads) == 1  # modified in place: read again
    assert torch_ops.offset_value(torch.tensor(0.25)) == 0.25  # another tensor, even at a reused id


def test_gemv_lean_parameter_block_is_numbas_layout():
    """The parameter block the lean GEMV launch packs, slot by slot: per 1-D array (meminfo, parent,
    nitems, itemsize, data, shape[0], strides[0]); the float32 offset in the low 4 bytes of its slot;
    then N, K, bs_shift. A wrong slot would hand the kernel a wrong pointer; the GPU run's bit check
    against numba's own launch is the other half of this test."""
    from nf4lab.integrations.torch_ops import _GemvLean
    from nf4lab.kernels import fastkernel, gemv

    layout = fastkernel.ParamLayout(gemv.signature())
    ptrs, counts = (1000, 2000, 3000, 4000, 5000), (11, 12, 13, 14, 16)
    buf = bytearray(layout.size)
    layout.pack_into(buf, *_GemvLean.prefix(ptrs, counts, 0.25), (6000, 21), (7000, 22), 4096, 14336, 6)
    slots = np.frombuffer(bytes(buf), dtype=np.int64)
    assert len(slots) == 53
    arrays = list(zip(ptrs, counts, (4, 1, 4, 4, 4))) + [(6000, 21, 4), (7000, 22, 2)]
    for base, (ptr, count, size) in zip((0, 7, 14, 21, 28, 36, 43), arrays):
        assert slots[base:base + 7].tolist() == [0, 0, count, size, ptr, count, size]
    assert np.frombuffer(bytes(buf[35 * 8:36 * 8]), dtype=np.float32).tolist() == [0.25, 0.0]
    assert slots[50:].tolist() == [4096, 14336, 6]


def test_gemv_launch_block_writes_only_x_and_y_and_launches_the_whole_block():
    """A weight's parameter block at one batch size (torch_ops._Block): built once with every slot but x's and
    y's pointers, then each call writes those two. What cuLaunchKernel receives (the pointer array's targets)
    must be, byte for byte, the block that the layout packs with this call's pointers."""
    import ctypes
    import threading
    from types import SimpleNamespace

    from nf4lab.integrations.torch_ops import _Block, _GemvLean
    from nf4lab.kernels import fastkernel, gemv

    seen = []

    def fake_launch(func, grid, threads, stream, params, smem):
        ptrs = (ctypes.c_uint64 * 53).from_address(params)
        seen.append((func, grid, threads, stream, smem, b"".join(ctypes.string_at(p, 8) for p in ptrs)))
        return 0

    layout = fastkernel.ParamLayout(gemv.signature())
    lean = SimpleNamespace(_lock=threading.Lock(), _launch=fake_launch, _func=77, layout=layout)
    M, N, K = 3, 4096, 14336
    prefix = _GemvLean.prefix((1000, 2000, 3000, 4000, 5000), (11, 12, 13, 14, 16), -0.125)
    blk = _Block(lean, SimpleNamespace(prefix=prefix, N=N, K=K, bs_shift=6), M, 264, 65536)
    for xp, yp in ((0x7F0000001000, 0x7F0000002000), (0x7F0000003000, 0x7F0000004000)):
        blk(5, xp, yp)
        want = bytearray(layout.size)
        layout.pack_into(want, *prefix, (xp, M * K // 2), (yp, M * N), N, K, 6)
        assert seen[-1][:5] == (77, 264, 256, 5, 65536)
        assert seen[-1][5] == bytes(want)
