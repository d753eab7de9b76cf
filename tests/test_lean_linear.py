"""The lean Linear4bit forward (nf4lab.integrations.lean_linear): same bits as bitsandbytes' forward, falls back
where it does not mirror it, follows weight changes, and leaves dynamo no guard on quant_state."""
import contextlib
import copy

import pytest
import torch

import nf4lab
from nf4lab import runtime
from nf4lab.integrations import lean_linear

bnb = pytest.importorskip("bitsandbytes")


DEVICES = ["cpu"] + (["cuda", "cuda+nf4lab"] if runtime.ON_GPU else [])


def layer(n_out, n_in, *, nested=True, bias=False, dtype=torch.bfloat16, bs=64, qt="nf4", seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    m = bnb.nn.Linear4bit(n_in, n_out, bias=bias, compute_dtype=dtype, quant_type=qt,
                          compress_statistics=nested)
    w = torch.randn(n_out, n_in, generator=g) * torch.rand(n_out, 1, generator=g) * 3   # rows of other scales
    m.weight = bnb.nn.Params4bit(w.to(dtype), requires_grad=False, quant_type=qt, compress_statistics=nested,
                                 blocksize=bs)
    m.weight = m.weight._quantize("cpu") if m.weight.quant_state is None else m.weight
    if bias:
        m.bias = torch.nn.Parameter(torch.randn(n_out, generator=g).to(dtype), requires_grad=False)
    m.support_avx512bf16_for_cpu = False   # bitsandbytes' own forward would repack for AVX-512 BF16 CPUs
    return m.to(device.split("+")[0])


def twin(m):
    """A second module on the same weight and statistics, with bitsandbytes' own class."""
    t = bnb.nn.Linear4bit(m.in_features, m.out_features, bias=m.bias is not None, compute_dtype=m.compute_dtype,
                          quant_type=m.weight.quant_type)
    t.weight, t.bias, t.support_avx512bf16_for_cpu = m.weight, m.bias, False
    return t


class Spy:
    """Counts calls of bitsandbytes' own Linear4bit.forward (the fallback)."""

    def __init__(self, monkeypatch):
        self.n, real = 0, bnb.nn.Linear4bit.forward

        def f(mod, x):
            self.n += 1
            return real(mod, x)
        monkeypatch.setattr(bnb.nn.Linear4bit, "forward", f)


def bits(t):
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("qt", ["nf4", "fp4"])
@pytest.mark.parametrize("device", DEVICES)
def test_same_bits_as_bitsandbytes_and_no_fallback(monkeypatch, nested, dtype, bias, qt, device):
    """On CUDA with nf4lab installed both sides run nf4lab's gemm_4bit: the forward around it must match."""
    m = layer(72, 192, nested=nested, bias=bias, dtype=dtype, bs=64 if nested else 128, qt=qt, device=device)
    ref = twin(m)
    x = torch.randn(3, 5, 192).to(dtype).to(device.split("+")[0])
    with torch.no_grad(), nf4lab.installed_in() if "nf4lab" in device else contextlib.nullcontext():
        want = [ref(x[:, :1]), ref(x)]
        assert lean_linear.prepare(m) == 1 and type(m).__name__ == "LeanLinear4bit"
        spy = Spy(monkeypatch)
        got = [m(x[:, :1]), m(x)]
    assert spy.n == 0, "the lean forward fell back to bitsandbytes' forward"
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(bits(g), bits(w))


def test_falls_back_where_bitsandbytes_differs(monkeypatch):
    m = layer(64, 128)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    spy = Spy(monkeypatch)
    lean_linear.prepare(m)
    m.compute_type_is_set = False               # bitsandbytes' forward sets the compute type on first use
    with torch.no_grad():
        m(x)
    assert spy.n == 1 and m.compute_type_is_set
    with torch.no_grad():
        m(x), m(x[:0])                           # lean, then an empty input (fallback)
    assert spy.n == 2
    xg = x.clone().requires_grad_(True)          # gradients needed: bitsandbytes' autograd path
    m(xg).float().sum().backward()
    assert spy.n == 3 and xg.grad is not None
    m.support_avx512bf16_for_cpu = True          # an AVX-512 BF16 CPU: bitsandbytes repacks the weight
    m.eval()
    with torch.no_grad():
        try:
            m(x)
        except Exception:   # a CPU or build without that path may refuse: only the hand-over matters here
            pass
    assert spy.n == 4


def test_snapshot_follows_a_new_weight_and_restore_undoes():
    m, other = layer(64, 128, seed=1), layer(64, 128, seed=2)
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        m(x), other(x)
        lean_linear.prepare(m)
        m.weight = other.weight                  # assignment takes a new snapshot
        assert m._nf4lab_absmax8 is other.weight.quant_state.absmax
        assert torch.equal(bits(m(x)), bits(other(x)))
        m.weight = bnb.nn.Params4bit(torch.zeros(4, 4), requires_grad=False)   # not quantized: no snapshot
        assert m._nf4lab_lean is False
    assert lean_linear.restore(m) == 1 and type(m) is bnb.nn.Linear4bit and "_nf4lab_lean" not in m.__dict__


def test_to_takes_a_new_snapshot(monkeypatch):
    """.to() may give the weight a new quant_state (bitsandbytes moves it with the weight): the snapshot follows."""
    m = layer(64, 128)
    lean_linear.prepare(m)
    old = m.weight.quant_state
    moved = copy.deepcopy(old)   # new tensors, as a move to another device gives
    assert moved.absmax is not old.absmax
    monkeypatch.setattr(bnb.nn.Params4bit, "to", lambda self, *a, **k: (setattr(self, "quant_state", moved), self)[1])
    m.to("cpu")
    assert m.weight.quant_state is moved and m._nf4lab_absmax8 is moved.absmax and m._nf4lab_lean


def test_a_prepared_model_pickles_and_loads_in_a_fresh_process(tmp_path):
    """torch.save(model) of a prepared model: the lean class is found by name where prepare() never ran."""
    import os
    import subprocess
    import sys

    m = layer(64, 128)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    lean_linear.prepare(m)
    with torch.no_grad():
        want = m(x)
    torch.save({"m": m, "x": x, "want": want}, tmp_path / "m.pt")
    code = "\n".join([
        "import sys, torch",
        "d = torch.load(sys.argv[1], weights_only=False)",
        "m = d['m']",
        "assert type(m).__name__ == 'LeanLinear4bit' and m._nf4lab_lean, type(m)",
        "with torch.no_grad():",
        "    y = m(d['x'])",
        "assert torch.equal(y.view(torch.int16), d['want'].view(torch.int16))",
        "print('ok')"])
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.pt")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NF4LAB_MODE": "sim"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def guard_sources(mgr, out):
    out.append((mgr.get_source(), mgr.is_tag_safe_root() if hasattr(mgr, "is_tag_safe_root") else False))
    for c in mgr.get_child_managers():
        if c is not None:
            guard_sources(c, out)
    if hasattr(mgr, "get_key_value_managers"):
        for km, vm in mgr.get_key_value_managers().values():
            for c in (km, vm):
                if c is not None:
                    guard_sources(c, out)
    return out


@pytest.mark.parametrize("lean", [False, True])
def test_compiled_guards_skip_quant_state(lean):
    """bitsandbytes' forward leaves guards on every quant_state tensor; the lean one none, and each lean
    layer can be checked by dict tags (the test fails on the unprepared model)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    mods = torch.nn.ModuleList([layer(64, 64, seed=i) for i in range(3)])
    x = torch.randn(1, 64, dtype=torch.bfloat16)

    def step(x, mods):
        for m in mods:
            x = m(x)
        return x
    with torch.no_grad():
        want = step(x, mods)
        if lean:
            lean_linear.prepare(mods)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
            got = torch.compile(step, fullgraph=True, backend="eager")(x, mods)
    assert torch.equal(bits(got), bits(want))
    root = _debug_get_cache_entry_list(step.__code__)[0].guard_manager.root
    srcs = guard_sources(root, [])
    on_qs = [s for s, _ in srcs if "quant_state" in s]
    roots = [s for s, r in srcs if r]
    if lean:
        # the whole list as one root (torch 2.13), or its layers one by one: no guard left under a root
        assert not on_qs and roots and all(r.startswith("L['mods']") for r in roots), (on_qs, roots)
    else:
        assert len(on_qs) >= 3 * 5 and not roots
    torch._dynamo.reset()


@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU (nf4lab not in GPU mode)")
def test_gpu_compiled_reduce_overhead_lean_layers_have_eager_bits():
    """compile_for_decode's setting on CUDA: lean layers, dict-tag guards, nf4lab installed, inductor with CUDA
    graphs; the replayed output has the bits of the same layers run eagerly."""
    from nf4lab.integrations import bnb_backend

    mods = torch.nn.ModuleList([layer(256, 256, seed=i, device="cuda") for i in range(4)])
    x = torch.randn(1, 256, dtype=torch.bfloat16, device="cuda")

    def step(x, mods):
        for m in mods:
            x = m(x)
        return x
    with nf4lab.installed_in(), torch.no_grad(), torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        want = step(x, mods)
        assert bnb_backend.prepare_for_compile(mods) == 4
        torch._dynamo.reset()
        f = torch.compile(step, fullgraph=True, mode="reduce-overhead")
        got = [f(x, mods).clone() for _ in range(4)]
    torch._dynamo.reset()
    for g in got:
        assert torch.equal(bits(g), bits(want))
