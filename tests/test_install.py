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
from nf4lab.integrations import bnb_backend
from nf4lab.kernels import dequant, qweight
from nf4lab import runtime

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
    real = bnb_backend._run_checked
    monkeypatch.setattr(bnb_backend, "_run_checked", lambda *a: ours.append(1) or real(*a))

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


@pytest.mark.skipif(runtime.ON_GPU, reason="install() takes over bitsandbytes' CUDA ops where a GPU is")
def test_install_without_a_device_changes_nothing():
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


def test_compileable_mark_is_one_object_and_uninstall_removes_it():
    tq = pytest.importorskip("transformers.quantizers.quantizer_bnb_4bit")
    from transformers import BitsAndBytesConfig

    q, other = (tq.Bnb4BitHfQuantizer(BitsAndBytesConfig(load_in_4bit=True)) for _ in range(2))
    model = torch.nn.Module()
    model.hf_quantizer, model.layer = q, bnb.nn.Linear4bit(64, 64)
    # install() takes over bitsandbytes' CUDA ops only where a GPU is: without one the quantizer and the layers
    # stay as they were
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=False):   # (process-wide: put back after)
        assert nf4lab.compile_for_decode(model) is model and q.is_compileable is runtime.ON_GPU
        assert torch._dynamo.config.use_recursive_dict_tags_for_guards is runtime.ON_GPU
    assert (type(model.layer).__name__ == "LeanLinear4bit") is runtime.ON_GPU
    bnb_backend._mark_compileable(q)
    bnb_backend._mark_compileable(q)  # twice: one subclass, not two
    assert q.is_compileable is True and isinstance(q, tq.Bnb4BitHfQuantizer)
    assert type(q).__mro__[1] is tq.Bnb4BitHfQuantizer
    assert other.is_compileable is False and tq.Bnb4BitHfQuantizer(BitsAndBytesConfig(load_in_4bit=True)) \
        .is_compileable is False  # the class itself is untouched
    bnb_backend.uninstall()
    assert type(q) is tq.Bnb4BitHfQuantizer and q.is_compileable is False


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


@pytest.fixture
def strict_library_impl(monkeypatch):
    """torch's Library.impl as torch 2.11 has it: a key that a Python registration already holds
    (bitsandbytes registers its CUDA and CPU kernels from Python) is refused unless allow_override.
    Newer torch allows overriding by default, which once hid that install() failed on the GPU."""
    import torch

    real = torch.library.Library.impl

    def impl(self, op_name, fn, dispatch_key="", *, with_keyset=False, allow_override=False):
        key = f"{self.ns}/{op_name.split('::')[-1]}/{dispatch_key or self.dispatch_key}"
        if not allow_override and key in torch.library._impls:
            raise RuntimeError("This is not allowed since there's already a kernel registered from python "
                               f"overriding {op_name}'s behavior")
        return real(self, op_name, fn, dispatch_key, with_keyset=with_keyset, allow_override=True)

    monkeypatch.setattr(torch.library.Library, "impl", impl)


def test_register_overrides_bitsandbytes_python_registration_and_restores_its_record(strict_library_impl):
    import torch

    key = "bitsandbytes/dequantize_4bit/CPU"
    had = key in torch.library._impls
    packed, qs = quantize((16, 96))
    before = bits(F.dequantize_4bit(packed, qs))
    torch.library._impls.add(key)   # as bitsandbytes' own Python registration of a CPU kernel leaves it
    try:
        bnb_backend._register("CPU", {}, ["dequantize_4bit"])
        assert bnb_backend.installed()
        bnb_backend.uninstall()
        # torch's record of bitsandbytes' registration survives ours being destroyed
        assert key in torch.library._impls
        assert np.array_equal(bits(F.dequantize_4bit(packed, qs)), before)
    finally:
        bnb_backend.uninstall()
        if not had:
            torch.library._impls.discard(key)


def test_uninstall_is_harmless_when_not_installed():
    bnb_backend.uninstall()
    bnb_backend.uninstall()
    assert not nf4lab.installed()




# ---------------------------------------------------------------- GPU (skipped without one)
# Run by the lead: NF4LAB_MODE=gpu python -m pytest tests/test_install.py tests/test_torch_ops.py -k gpu
# (tools/gpu_bnb_tests.sh does it first). Dequantize: bits against bitsandbytes' own CUDA kernel, eager,
# compiled (inductor, fullgraph), in a captured CUDA graph and on a side stream. GEMV: within
# nf4lab.kernels.gemv's tolerance of a float64 product of bitsandbytes' float32 weights.
def gbits(t):
    t = t.contiguous().reshape(-1)
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()]).cpu().numpy()


TD = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
gpu = pytest.mark.skipif(not nf4lab.ON_GPU, reason="needs a CUDA GPU (nf4lab not in GPU mode)")


def gpu_quantize(shape, dtype="bf16", bs=64, qt="nf4", nested=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(shape, generator=g, device="cuda").to(TD[dtype])
    return F.quantize_4bit(w, blocksize=bs, quant_type=qt, compress_statistics=nested)


CASES = [((4096, 4096), "bf16", 64, "nf4", True), ((333, 96), "fp16", 128, "fp4", False),
         ((1000, 1000), "fp32", 32, "nf4", True), ((17, 130), "bf16", 4096, "fp4", True)]


@pytest.fixture
def clean():
    nf4lab.uninstall()
    torch._dynamo.reset()
    yield
    nf4lab.uninstall()


@gpu
@pytest.mark.parametrize("shape,dtype,bs,qt,nested", CASES)
def test_gpu_compiled_dequantize_bit_exact(shape, dtype, bs, qt, nested, clean):
    packed, qs = gpu_quantize(shape, dtype, bs, qt, nested)
    want = gbits(F.dequantize_4bit(packed, qs))
    f = torch.compile(lambda a, s: nf4lab.dequantize(a, s), fullgraph=True)
    assert np.array_equal(gbits(f(packed, qs)), want)
    # misaligned packed bytes: the scalar path, chosen inside the op at run time
    buf = torch.zeros(packed.numel() + 1, dtype=torch.uint8, device="cuda")
    buf[1:].copy_(packed.reshape(-1))
    shifted = buf[1:].view(packed.shape)
    assert np.array_equal(gbits(f(shifted, qs)), want)


@gpu
def test_gpu_cuda_graph_and_side_stream(clean):
    packed, qs = gpu_quantize((1024, 512))
    want = gbits(F.dequantize_4bit(packed, qs))
    out = torch.empty(tuple(qs.shape), dtype=qs.dtype, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nf4lab.dequantize(packed, qs, out=out)  # warm-up: compiles and self-checks outside capture
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        nf4lab.dequantize(packed, qs, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert np.array_equal(gbits(out), want)
    f = torch.compile(lambda a, q: nf4lab.dequantize(a, q), fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up runs, then recorded and replayed
        got = f(packed, qs)
    assert np.array_equal(gbits(got), want)


@gpu
def test_gpu_install_serves_bitsandbytes_and_uninstall_restores(clean):
    from nf4lab.integrations import bnb_backend

    packed, qs = gpu_quantize((4096, 1024), "bf16", 64, "nf4", True)
    want = gbits(F.dequantize_4bit(packed, qs))  # bitsandbytes' own CUDA kernel
    assert nf4lab.install() is True and nf4lab.install() is True and nf4lab.installed()
    before = bnb_backend.calls.get(("dequantize_4bit", "nf4lab"), 0)
    assert np.array_equal(gbits(F.dequantize_4bit(packed, qs)), want)
    assert bnb_backend.calls.get(("dequantize_4bit", "nf4lab"), 0) == before + 1
    compiled = torch.compile(lambda a, s: F.dequantize_4bit(a, s), fullgraph=True)
    assert np.array_equal(gbits(compiled(packed, qs)), want)
    nf4lab.uninstall()
    n = dict(bnb_backend.calls)
    assert np.array_equal(gbits(F.dequantize_4bit(packed, qs)), want)
    assert bnb_backend.calls == n, "after uninstall() nf4lab must not be called"


@gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_gpu_installed_dequantize_fast_path_has_bitsandbytes_bits(dtype, clean, monkeypatch):
    """install()'s dequantize_4bit, once its launcher and table exist, launches without a plan: every dtype,
    both kernel paths (an out= tensor 2 bytes off its 16-byte alignment takes the scalar one), odd sizes,
    fp4 and nf4; the same bits as bitsandbytes, and the general path is not taken."""
    from nf4lab.kernels import dequant as dq

    for shape, bs, qt in [((4096, 1024), 64, "nf4"), ((333, 97), 128, "fp4"), ((5, 7), 32, "nf4")]:
        packed, qs = gpu_quantize(shape, dtype, bs, qt, True)
        want = gbits(F.dequantize_4bit(packed, qs))
        n = qs.shape.numel()

        def odd_out():
            return torch.empty(n + 8, dtype=TD[dtype], device="cuda")[1:n + 1].view(qs.shape)

        with nf4lab.installed_in():
            assert np.array_equal(gbits(F.dequantize_4bit(packed, qs)), want)   # general path: makes both ready
            assert np.array_equal(gbits(F.dequantize_4bit(packed, qs, out=odd_out())), want)
            with monkeypatch.context() as m:
                m.setattr(dq, "plan_checked", lambda *a: pytest.fail("the general path was taken"))
                assert np.array_equal(gbits(F.dequantize_4bit(packed, qs)), want)
                assert np.array_equal(gbits(F.dequantize_4bit(packed, qs, out=odd_out())), want)


def _within_tolerance(y, packed, qs, x):
    """y against float64 on the GPU: bitsandbytes' float32 weights, float64 products and sums."""
    from bitsandbytes.functional import QuantState
    from nf4lab.harness.gemv_check import tolerance
    from nf4lab.measure.gemv_bench import _gpu_check

    qs32 = QuantState(absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize, quant_type=qs.quant_type,
                      dtype=torch.float32, offset=qs.offset, state2=qs.state2)
    w, xd = F.dequantize_4bit(packed, qs32).double(), x.reshape(-1, x.shape[-1]).double()
    y64 = xd @ w.T
    return _gpu_check(y, y64, tolerance(xd, w, {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]), "nf4lab")


@gpu
@pytest.mark.parametrize("M", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_installed_gemv_within_tolerance(M, dtype, clean):
    from nf4lab.integrations import bnb_backend, torch_ops

    N, K = 4096, 4096
    packed, qs = gpu_quantize((N, K), dtype)
    x = torch.randn(M, K, device="cuda").to(TD[dtype])
    with nf4lab.installed_in():
        assert "gemm_4bit" in bnb_backend._state["ops"], "gemv.launch_torch missing: GEMV not installed"
        before = bnb_backend.calls.get(("gemm_4bit", "nf4lab"), 0)
        for _ in range(3):  # first: numba's launch + the lean check; then the lean launcher
            with torch.no_grad():
                y = bnb.matmul_4bit(x, packed.t(), quant_state=qs)
        assert bnb_backend.calls.get(("gemm_4bit", "nf4lab"), 0) == before + 3
        r = _within_tolerance(y, packed, qs, x)
        assert r["ok"], r
        assert any(isinstance(v, torch_ops._GemvLean) for v in torch_ops._GEMV_LEAN.values()), \
            "the lean GEMV launcher was not taken (see the RuntimeWarning)"
        compiled = torch.compile(lambda x: bnb.matmul_4bit(x, packed.t(), quant_state=qs), fullgraph=True)
        with torch.no_grad():
            r = _within_tolerance(compiled(x), packed, qs, x)
        assert r["ok"], r


@gpu
@pytest.mark.parametrize("M", [1, 3])
def test_gpu_lean_gemv_reads_each_calls_x_and_writes_its_own_y(M):
    """Once a weight's launch block is cached, every call must bring its own x and y pointers into it: the same
    bits as numba's launch of the same kernel for x's at other addresses, on another stream too (a stale slot
    would give the first call's y or write over it). Fails if the block's x or y slot is not written per call."""
    from nf4lab.kernels import gemv
    from nf4lab.integrations import torch_ops

    N, K = 1024, 2048
    packed, qs = gpu_quantize((N, K), "bf16")
    args = (packed, qs.shape, qs.absmax, qs.state2.absmax, qs.state2.code, qs.offset, qs.blocksize)
    xs = [torch.randn(M, K, device="cuda").to(torch.bfloat16) for _ in range(4)]
    ys = []
    for i, x in enumerate(xs):
        s = torch.cuda.Stream() if i == 3 else torch.cuda.current_stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ys.append(torch_ops.gemv_call(x, *args))
        s.synchronize()
    w = torch_ops._weight(*args[:6], qs.blocksize)
    assert (M, torch.bfloat16) in w.launches, "the lean launch block was not taken (see the RuntimeWarning)"
    for x, y in zip(xs, ys):
        want = torch.empty_like(y)
        gemv.launch_torch(x, *args[:5], torch_ops.offset_value(qs.offset), qs.blocksize, want)
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    assert not torch.equal(ys[1], ys[2])


@gpu
def test_gpu_gemv_absmax_codes_off_a_word_take_the_byte_loads():
    """The statistics word is a 32-bit load: absmax codes at an address that is not a multiple of 4 must go to the
    byte-wise kernel (a misaligned load would kill the CUDA context), with the same bits, since both hand the same
    values to the same arithmetic; an aligned weight in the same process keeps the word kernel."""
    from nf4lab.integrations import torch_ops

    N, K = 512, 1024
    packed, qs = gpu_quantize((N, K), "bf16")
    spare = torch.empty(qs.absmax.numel() + 1, dtype=torch.uint8, device="cuda")
    odd = spare[1:]
    odd.copy_(qs.absmax)
    assert odd.data_ptr() % 4 and qs.absmax.data_ptr() % 4 == 0
    x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    rest = (qs.state2.absmax, qs.state2.code, qs.offset, qs.blocksize)
    ys = {}
    for name, a in (("aligned", qs.absmax), ("odd", odd)):
        for _ in range(3):   # numba's launch and the lean check, then the lean launcher
            ys[name] = torch_ops.gemv_call(x, packed, qs.shape, a, *rest)
        torch.cuda.synchronize()
        assert torch_ops._weight(packed, qs.shape, a, *rest).words == (name == "aligned")
    assert torch.equal(ys["aligned"].view(torch.int16), ys["odd"].view(torch.int16))


@gpu
def test_gpu_linear4bit_compiled_installed_forward_and_backward(clean):
    torch.manual_seed(0)
    lin = bnb.nn.Linear4bit(1024, 512, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    x1 = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    xg = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        ref1 = lin(x1)
    refg = lin(xg)
    refg.float().sum().backward()
    ref_grad = xg.grad.clone()
    xg.grad = None
    with nf4lab.installed_in():
        f = torch.compile(lin, fullgraph=True)
        with torch.no_grad():
            y1 = f(x1)
        yg = f(xg)
        yg.float().sum().backward()
    # Forward, 1 and 4 rows: nf4lab's fused GEMV serves gemm_4bit (M = 1..8) and sums in its own
    # order, so it is held to a tolerance against bitsandbytes' kernel, not to its bits.
    torch.testing.assert_close(y1, ref1, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(yg, refg, rtol=2e-2, atol=2e-2)
    # Backward: grad_x = grad_y @ W with W from dequantize_4bit, which is bit-exact, and grad_y is
    # all ones whatever y was; only inductor's order of the matmul may differ from eager.
    torch.testing.assert_close(xg.grad, ref_grad)


@gpu
@pytest.mark.parametrize("nested", [True, False])
def test_gpu_installed_gemm_past_the_gemv_has_bitsandbytes_bits(nested, clean):
    """A training step's gemm_4bit (M = 2048: bitsandbytes dequantizes and calls F.linear there): with
    install(), nf4lab's kernel dequantizes, and the product is bitsandbytes' to the bit, forward and backward."""
    from nf4lab.integrations import bnb_backend

    packed, qs = gpu_quantize((1024, 4096), "bf16", nested=nested)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2048, 4096, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()

    def step():
        y = bnb.matmul_4bit(x, packed.t(), quant_state=qs)
        y.float().square().sum().backward()
        grad, x.grad = x.grad, None
        return y.detach(), grad

    want = step()
    with nf4lab.installed_in():
        key = ("gemm_4bit", "nf4lab dequantize + linear")
        before = bnb_backend.calls.get(key, 0)
        got = [step() for _ in range(3)]  # first: checked and prepared; then the prepared launch
        assert bnb_backend.calls.get(key, 0) == before + 3, "gemm_4bit was not served by nf4lab's dequantize"
        assert any(w.ref() is qs.absmax and w.dq for w in qweight._KNOWN.values()), "the weight was not prepared"
    for run in got:
        for a, b in zip(run, want):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


_FRESH_REDUCE_OVERHEAD = """
import torch, nf4lab, bitsandbytes as bnb, bitsandbytes.functional as F
g = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(4096, 4096, generator=g, device="cuda").to(torch.bfloat16)
packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
x = torch.randn(1, 4096, generator=g, device="cuda").to(torch.bfloat16)
want_w = F.dequantize_4bit(packed, qs)
want_y = (x.double() @ want_w.double().t())
assert nf4lab.install()
f = torch.compile(lambda x: (bnb.matmul_4bit(x, packed.t(), quant_state=qs), F.dequantize_4bit(packed, qs)),
                  fullgraph=True, mode="reduce-overhead")
with torch.no_grad():
    for _ in range(4):  # warm-up inside cudagraph trees' pool, recording, replays
        y, w2 = f(x)
        y, w2 = y.clone(), w2.clone()
torch.cuda.synchronize()
assert torch.equal(w2.view(torch.int16), want_w.view(torch.int16)), "dequantize not bit-exact"
err = (y.double() - want_y).abs().max().item()
assert err < 0.05 * want_y.abs().max().item(), err
print("ok", err)
"""


@gpu
def test_gpu_reduce_overhead_first_call_inside_cudagraph_trees():
    """A process whose first nf4lab CUDA call happens inside torch.compile's CUDA-graph warm-up:
    every table nf4lab caches then must come from outside torch's graph pool, or cudagraph trees
    fail ("tensor(s) in the cudagraph pool not tracked as outputs"). A fresh process, so that no
    earlier test has filled the caches."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _FRESH_REDUCE_OVERHEAD], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@gpu
def test_gpu_bad_input_raises_before_launch(clean):
    packed, qs = gpu_quantize((64, 64))
    args = list(dequant.op_args(dequant.plan(packed, qs, None)))
    args[5] = 48
    with pytest.raises(ValueError, match="quant_state.blocksize"):
        torch.ops.nf4lab.dequantize_4bit(*args)
    torch.cuda.synchronize()  # the context is alive


@pytest.mark.parametrize("shape,bs,dtype", [((33, 96), 64, torch.bfloat16), ((300,), 128, torch.float32),
                                            ((7, 18), 32, torch.float16)])
def test_checked_plan_equals_the_validated_plan(shape, bs, dtype):
    """The installed CUDA kernel skips re-validation (its handles check came first): its plan must be
    the one nf4lab.dequantize's validation builds, field for field."""
    packed, qs = quantize(shape, dtype=dtype, bs=bs, nested=False)
    assert bnb_backend._dequantize_handles(packed, qs.absmax, bs, "nf4", list(shape), dtype)
    full = dequant.plan(packed, qs, None)
    fast = dequant.plan_checked(packed, qs.absmax, bs, "nf4", list(shape), dtype)
    for f in ("shape", "n", "nbytes", "dtype", "tdtype", "blocksize", "nested", "nblocks", "gsize", "quant_type"):
        assert getattr(fast, f) == getattr(full, f), f
    assert fast.w.absmax is full.w.absmax and fast.A is full.A


@pytest.mark.parametrize("nested", [True, False])
def test_gemm_4bit_where_bitsandbytes_dequantizes_is_nf4lab_dequantize_then_linear(nested):
    """Where bitsandbytes' gemm_4bit would dequantize and call F.linear (M past its fused kernels, as in a
    training step), nf4lab's kernel does the dequantization: the same bits as bitsandbytes' own fallback, bias
    included; where bitsandbytes would run its fused kernel, or the tensors are not nf4lab's to take
    (another quant_storage), the call is bitsandbytes'. Exercised on the CPU key."""
    N, K, M = 96, 128, 16
    packed, qs = quantize((N, K), nested=nested)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    bias = torch.randn(N, generator=g).to(torch.bfloat16)
    want = torch.nn.functional.linear(x, F.dequantize_4bit(packed, qs), bias)
    fell, dequantizes = [], {"yes": True}
    fallbacks = {"gemm_4bit": lambda *a: fell.append(a) or torch.zeros(M, N, dtype=x.dtype),
                 "gemm_4bit_dequantizes": lambda A, shapeB, bs: dequantizes["yes"]}
    if nested:
        stats = (qs.state2.absmax, qs.blocksize, qs.quant_type, bias, qs.absmax, qs.state2.code, qs.offset)
    else:
        stats = (qs.absmax, qs.blocksize, qs.quant_type, bias)
    bnb_backend._register("CPU", fallbacks, ["gemm_4bit"])
    try:
        key = ("gemm_4bit", "nf4lab dequantize + linear")
        before = bnb_backend.calls.get(key, 0)
        got = torch.ops.bitsandbytes.gemm_4bit(x, packed, list(qs.shape), *stats)
        assert np.array_equal(bits(got), bits(want)) and not fell
        assert bnb_backend.calls.get(key, 0) == before + 1
        torch.ops.bitsandbytes.gemm_4bit(x, packed.view(torch.int8), list(qs.shape), *stats)
        assert len(fell) == 1, "another quant_storage must go to bitsandbytes"
        dequantizes["yes"] = False
        torch.ops.bitsandbytes.gemm_4bit(x, packed, list(qs.shape), *stats)
        assert len(fell) == 2, "where bitsandbytes runs its fused kernel, the call must stay bitsandbytes'"
    finally:
        bnb_backend.uninstall()
