"""nf4lab.measure.models: the CPU-testable logic of the model benchmark (comparisons, records, table).

The benchmark itself needs a GPU; the one end-to-end test here builds a tiny Llama on CPU and
runs the bf16 eager path, and skips cleanly where transformers is not installed (CI)."""
import json
import math

import numpy as np
import pytest

from nf4lab.measure import models


def test_first_divergence():
    assert models.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert models.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert models.first_divergence([9, 2], [1, 2]) == 0
    assert models.first_divergence([1, 2], [1, 2, 3]) == 2  # a length difference counts at the end
    assert models.first_divergence(np.array([4, 4]), [4, 4]) is None


def test_margin():
    assert models.margin([0.0, 3.0, 1.0, 2.5]) == pytest.approx(0.5)
    assert models.margin(np.array([[2.0, 2.0, -1.0]])) == 0.0  # a tie
    assert math.isnan(models.margin([1.0]))


def _logits(steps=5, vocab=11, seed=0):
    return np.random.default_rng(seed).standard_normal((steps, vocab)).astype(np.float32)


def test_compare_free_reports_step_and_both_margins():
    la = _logits()
    lb = la.copy()
    ta = la.argmax(1).tolist()
    # Make b pick its runner-up at step 3 (a near tie there), then go on differently.
    lb[3, ta[3]] -= 10.0
    tb = lb.argmax(1).tolist()
    r = models.compare_free(ta, la, tb, lb)
    assert r["first_divergence"] == 3 and not r["identical"] and r["steps"] == 5
    assert r["token_a"] == ta[3] and r["token_b"] == tb[3] != ta[3]
    assert r["margin_a"] == pytest.approx(models.margin(la[3]))
    assert r["margin_b"] == pytest.approx(models.margin(lb[3]))
    same = models.compare_free(ta, la, ta, la)
    assert same["identical"] and same["first_divergence"] is None and "margin_a" not in same


def test_compare_forced_abs_rel_and_argmax():
    la = _logits(4, 7)
    lb = la.copy()
    lb[1, 2] += 0.25
    lb[2] = -lb[2]  # argmax changes at step 2
    r = models.compare_forced(la, lb)
    assert r["steps"] == 4 and r["bitwise_equal_steps"] == 2
    assert r["per_step_abs"][0] == 0 and r["per_step_abs"][1] == pytest.approx(0.25)
    assert r["per_step_rel"][1] == pytest.approx(0.25 / np.abs(la[1]).max())
    assert r["max_abs"] == pytest.approx(2 * np.abs(la[2]).max())
    assert r["max_rel"] == pytest.approx(2.0)
    assert r["argmax_agree"] == 3
    assert models.compare_forced(la, lb, steps=2)["steps"] == 2
    assert models.compare_forced(la[:0], lb[:0])["max_abs"] is None


def _synthetic_run():
    la, lf = _logits(6, 13, 1), _logits(6, 13, 2)
    runs = {
        "bnb_eager": {"tokens": la.argmax(1).tolist(), "logits": la, "forced_logits": lf},
        "nf4lab_eager": {"tokens": la.argmax(1).tolist(), "logits": la, "forced_logits": lf + 1e-3},
        "bf16_eager": {"tokens": [0] * 6, "logits": la, "forced_logits": lf},
        "bnb_compiled_forced": {"tokens": None},  # failed: no pair with it
    }
    return runs


def test_agreement_records_pairs_and_format():
    recs = models.agreement_records(_synthetic_run())
    pairs = {(r["a"], r["b"]) for r in recs}
    assert pairs == {("bnb_eager", "nf4lab_eager"), ("bf16_eager", "bnb_eager")}
    r = next(r for r in recs if r["b"] == "nf4lab_eager")
    assert r["kind"] == "agreement" and r["free"]["identical"]
    assert r["forced"]["max_abs"] == pytest.approx(1e-3, rel=1e-3) and r["forced"]["argmax_agree"] == 6
    json.dumps(recs)  # records are plain JSON


def test_table_and_record_format():
    recs = [
        {"kind": "decode", "name": models.LABELS["bnb_eager"], "variant": "bnb_eager", "compiled": False,
         "tok_s": 20.0, "e2e_tok_s": 18.0, "compile_s": None},
        {"kind": "decode", "name": models.LABELS["nf4lab_eager"], "variant": "nf4lab_eager", "compiled": False,
         "tok_s": 30.0, "e2e_tok_s": 27.0, "compile_s": None},
        {"kind": "decode", "name": models.LABELS["nf4lab_compiled"], "variant": "nf4lab_compiled", "compiled": True,
         "error": "RuntimeError: boom\n  File x"},
        {"kind": "qlora", "name": models.LABELS["qlora_bnb"], "variant": "qlora_bnb", "ms": 300.0, "batch": 2,
         "seq": 512, "lora_r": 16},
        {"kind": "qlora", "name": models.LABELS["qlora_nf4lab"], "variant": "qlora_nf4lab", "ms": 250.0, "batch": 2,
         "seq": 512, "lora_r": 16},
        {"kind": "qlora_agreement", "name": "QLoRA", "loss_bnb": 10.5, "loss_nf4lab": 10.5, "loss_equal": True,
         "grad_tensors": 4, "grad_max_abs": 0.0, "grad_max_abs_ref": 1.0, "grad_tensors_bitwise_equal": 4},
    ] + models.agreement_records(_synthetic_run())
    data = {"meta": {"gpu": "Test GPU", "date": "2026-01-01 00:00 UTC", "model": "Llama, tiny",
                     "versions": {"torch": "x"}, "settings": {"new_tokens": 6}}, "records": recs}
    text = models.table(data)
    assert "| nf4lab NF4, eager | 30.0 | 27.0 |  | 1.50 |" in text
    assert "failed: RuntimeError: boom" in text
    assert "| QLoRA step, nf4lab | 250.0 | 1.20 |" in text
    assert "identical (6 steps)" in text and "Test GPU" in text
    json.dumps(data)


def test_forced_compileable_restores_class():
    class Quantizer:
        @property
        def is_compileable(self):
            return False

    class Model:
        hf_quantizer = Quantizer()

    m = Model()
    with models.forced_compileable(m):
        assert m.hf_quantizer.is_compileable is True
        assert isinstance(m.hf_quantizer, Quantizer)
    assert type(m.hf_quantizer) is Quantizer and m.hf_quantizer.is_compileable is False


def test_cli_wired():
    from nf4lab.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["models", "--help"])
    assert e.value.code == 0


def test_tiny_llama_every_eager_path_on_cpu(monkeypatch):
    """Every eager variant and the QLoRA step on a 2-layer Llama on CPU. Without a GPU install() does
    nothing, so it is faked here: the 'nf4lab' variants then run bitsandbytes' CPU kernels, and the
    plumbing must report them identical to the bitsandbytes variants, bit for bit."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    import nf4lab

    monkeypatch.setattr(nf4lab, "install", lambda compile=False: True, raising=False)
    s = models.Settings.cpu_smoke()
    s.new_tokens, s.prompt_len, s.qlora_seq, s.qlora_steps = 4, 4, 16, 1
    data = models.run(s, only=["bf16_eager", "bnb_eager", "nf4lab_eager", "eager_interleaved", "qlora_bnb",
                               "qlora_nf4lab"], log=lambda *a: None)
    by = {r.get("variant"): r for r in data["records"] if r["kind"] in ("decode", "qlora")}
    assert set(by) == {"bf16_eager", "bnb_eager", "nf4lab_eager", "qlora_bnb", "qlora_nf4lab"}
    for r in by.values():
        assert not r.get("error"), r.get("error")
    assert len(by["bnb_eager"]["tokens"]) == 4 and by["bnb_eager"]["e2e_tok_s"] > 0
    assert by["qlora_bnb"]["ms"] > 0 and by["qlora_bnb"]["trainable_params"] > 0
    ag = {(r["a"], r["b"]): r for r in data["records"] if r["kind"] == "agreement"}
    same = ag[("bnb_eager", "nf4lab_eager")]
    assert same["free"]["identical"] and same["forced"]["max_abs"] == 0
    assert ("bf16_eager", "bnb_eager") in ag
    (qa,) = [r for r in data["records"] if r["kind"] == "qlora_agreement"]
    assert qa["loss_equal"] and qa["grad_max_abs"] == 0
    assert data["meta"]["settings"]["layers"] == 2
    json.dumps(data, default=str)
    assert "QLoRA step, nf4lab" in models.table(data)
    ab = {r["variant"]: r for r in data["records"] if r["kind"] == "decode_interleaved"}
    assert set(ab) == {"bnb_eager", "nf4lab_eager"} and all(r["tok_s"] > 0 for r in ab.values())
    assert "interleaved generate by generate" in models.table(data)


def test_decode_variants_in_their_own_processes_on_cpu(monkeypatch):
    """On a GPU each decode variant runs in a child process (the variants' order in one process moved the
    compiled results by up to 1.3x). A child must decode what one process decodes, token for token, and hand
    its raw logits back for the agreement records (seen on the way, so that one child process does)."""
    pytest.importorskip("transformers")
    s = models.Settings.cpu_smoke()
    s.new_tokens = 4
    children, child = [], models._run_isolated
    monkeypatch.setattr(models, "_run_isolated", lambda *a: children.append(child(*a)) or children[-1])
    iso = models.run(s, only=["bf16_eager"], log=lambda *a: None, isolate=True)
    one = models.run(s, only=["bf16_eager"], log=lambda *a: None)
    (a,), (b,) = ([r for r in d["records"] if r["kind"] == "decode"] for d in (iso, one))
    assert not a.get("error"), a.get("error")
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) == 4
    assert iso["meta"]["isolated"] and not one["meta"]["isolated"]
    (rec, run), = children
    assert rec["tokens"] == b["tokens"] and run["logits"] is not None and run["forced_logits"] is not None


def test_qlora_steps_interleave_the_backends_abba():
    """The two QLoRA backends take turns step by step (ABBA), on one model and one optimizer, so a drift
    of the machine lands on both; each gets its own warm-up and timed steps."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, input_ids, labels):
            return type("Out", (), {"loss": (self.w * input_ids.float()).sum() ** 2})()

    order = []
    s = models.Settings.cpu_smoke()
    s.qlora_warmup, s.qlora_steps = 1, 3
    got = models.qlora_time(Tiny(), torch.ones(3), s, {"a": lambda: order.append("a"),
                                                         "b": lambda: order.append("b")})
    assert "".join(order) == "ab" + "ba" + "ab" + "ba"
    for v in "ab":
        assert len(got[v]["ms_all"]) == 3 and len(got[v]["losses"]) == 4
        assert got[v]["ms"] == sorted(got[v]["ms_all"])[1] and got[v]["trainable_params"] == 3
    # The optimizer steps between them: b's first loss already follows a's first step.
    assert got["b"]["losses"][0] < got["a"]["losses"][0]


class FakeClock:
    """Stands in for the ``time`` module of nf4lab.measure.models: its perf_counter moves only when a fake model
    spends time, so the timings the measurement computes are exact, however loaded the machine is."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def spend(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(models, "time", c)
    return c


def test_eager_decode_interleaves_the_backends_abba(clock):
    """The interleaved eager measurement: each round gives each backend a generate of N tokens and one of 1,
    in ABBA order after a warm-up round; tok/s comes from the medians, (N - 1) / (T_N - T_1), and a slower
    backend comes out slower."""
    import torch

    order, state = [], {"v": None}

    class Fake:
        def generate(self, prompt, max_new_tokens, min_new_tokens, **kw):
            order.append((state["v"], max_new_tokens))
            clock.spend(0.001 * max_new_tokens * (2 if state["v"] == "slow" else 1))

    s = models.Settings.cpu_smoke()
    s.eager_rounds, s.new_tokens = 3, 9
    switch = {v: (lambda v=v: state.update(v=v)) for v in ("fast", "slow")}
    got = models.eager_interleaved_time(Fake(), s, torch.ones(1, 4, dtype=torch.long), switch)
    firsts = "".join(v[0] for v, n in order if n == 9)
    assert firsts == "fs" + "sf" + "fs" + "sf"
    assert [n for _, n in order] == [9, 1] * 8
    for v in ("fast", "slow"):
        assert len(got[v]["t_n_all"]) == 3 and len(got[v]["tok_s_rounds"]) == 3
        a, b = sorted(got[v]["t_n_all"])[1], sorted(got[v]["t_1_all"])[1]
        assert got[v]["tok_s"] == pytest.approx(8 / (a - b))
    # 1 ms a token fast, 2 ms slow: T_N - T_1 = 8 and 16 ms for the 8 tokens after the first
    assert got["fast"]["tok_s"] == pytest.approx(1000) and got["slow"]["tok_s"] == pytest.approx(500)
    recs = [dict(kind="decode_interleaved", variant=k, rounds=3, **got[v])
            for k, v in (("bnb_eager", "fast"), ("nf4lab_eager", "slow"))]
    line = models.eager_interleaved_line(recs)
    assert "3 rounds" in line and f"({got['slow']['tok_s'] / got['fast']['tok_s']:.2f}x)" in line


def test_compiled_decode_interleaves_three_models_and_probes_each_step(clock):
    """The interleaved compiled measurement: three models, each its own cache; two warm-up generates each, then
    ABC CBA rounds of a generate of N tokens and one of 1; the probe times every call of the step that
    generate takes from get_compiled_call, and a slower step comes out slower, in tok/s and in step_ms."""
    pytest.importorskip("transformers")
    import torch

    order = []
    cfg = models.llama_config(models.Settings.cpu_smoke())

    class Fake:
        config = cfg

        def __init__(self, name, step_s):
            self.name, self.step_s = name, step_s

        def get_compiled_call(self, compile_config):
            return lambda: clock.spend(self.step_s)

        def generate(self, prompt, max_new_tokens, min_new_tokens, past_key_values=None, **kw):
            assert past_key_values is not None and kw["compile_config"].fullgraph
            order.append((self.name, max_new_tokens))
            step = self.get_compiled_call(kw["compile_config"])
            for _ in range(max_new_tokens - 1):   # the first token comes from the prefill
                step()

    s = models.Settings.cpu_smoke()
    s.compiled_rounds, s.new_tokens = 2, 6
    ms = {"a": Fake("a", 0.001), "b": Fake("b", 0.003), "c": Fake("c", 0.002)}
    counter = {"n": 0}
    got = models.compiled_interleaved_time(ms, s, torch.ones(1, 4, dtype=torch.long),
                                           {v: (lambda: None) for v in ms}, served=lambda: counter["n"])
    timed = [v for v, n in order[6:-3] if n == 6]
    assert [v for v, _ in order[:6]] == list("abcabc") and timed == list("abc") + list("cba")
    assert [n for _, n in order[6:-3]] == [6, 1] * 6 and order[-3:] == [("a", 6), ("b", 6), ("c", 6)]
    for v in ms:
        assert got[v]["steps_probed"] == 5 and got[v]["served_per_generate"] == [0, 0]
        assert len(got[v]["tok_s_rounds"]) == 2 and "gpu_span_ms" not in got[v]
    # each call of the step spends its step_s and nothing else does: steps 1, 3 and 2 ms, all of it in the call;
    # T_N - T_1 = 5 steps for the 5 tokens after the first
    for v, step_ms in (("a", 1.0), ("b", 3.0), ("c", 2.0)):
        assert got[v]["step_ms"] == pytest.approx(step_ms) and got[v]["host_in_call_ms"] == pytest.approx(step_ms)
        assert got[v]["tok_s"] == pytest.approx(1000 / step_ms)
    recs = [dict(kind="decode_interleaved", mode="compiled", variant=k, rounds=2, **got[v])
            for k, v in (("bf16_compiled", "c"), ("bnb_compiled_forced", "b"), ("nf4lab_compiled", "a"))]
    line = models.compiled_interleaved_line(recs)
    assert "2 rounds" in line and f"{got['a']['tok_s'] / got['b']['tok_s']:.2f}x bitsandbytes" in line
    assert models.eager_interleaved_line(recs) == ""   # compiled records are not the eager sentence's


def test_own_classes_gives_each_model_a_type_of_its_own_and_restores_it():
    """dynamo shares one compiled forward (and its CUDA graphs) between models of one class: the interleaved
    compiled timing gives each its own subclass for the block, and the class back after, also on an error."""
    class M:
        pass

    a, b = M(), M()
    with models.own_classes({"x": a, "y": b}):
        assert type(a) is not type(b) and isinstance(a, M) and isinstance(b, M)
        assert type(a).__mro__[1] is M and type(a).__name__ == "M_x"
    assert type(a) is M and type(b) is M
    with pytest.raises(ZeroDivisionError):
        with models.own_classes({"x": a}):
            1 / 0
    assert type(a) is M
