"""The proof on a real model: a Llama-3-8B-shaped transformers model, decode and QLoRA, bitsandbytes vs nf4lab.

    python -m nf4lab models --quick          # smoke test of every code path (4 layers, 16 tokens), about 4 min
    python -m nf4lab models                  # the benchmark (32 layers, 64 tokens), about 11 min on an H100 (2026-11-27:
                                             # 399 s without compiled_interleaved, which took 184-237 s)
    python -m nf4lab models --only bnb_eager nf4lab_eager
    python -m nf4lab models --cpu-smoke      # no GPU: a tiny 2-layer Llama on CPU, every path that CPU allows

The model: ``LlamaConfig`` with Llama-3-8B's shapes (32 layers, hidden 4096, MLP 14336, 32 heads,
8 KV heads; vocabulary 32000), RANDOM weights (transformers' own init, seeded; nothing is
downloaded), built in bf16 directly on the GPU. Its NF4 twin is made the way a user makes one:
``LlamaForCausalLM.from_pretrained(None, config=cfg, state_dict=<the bf16 model's tensors>,
quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16))``: transformers'
bitsandbytes quantizer replaces the Linear layers with ``bnb.nn.Linear4bit`` and quantizes each
weight as it loads (its real loading path, with the checkpoint handed over in memory instead of
read from disk). bnb and nf4lab variants run on that ONE quantized model: ``nf4lab.install()``
only changes which kernel bitsandbytes' torch ops dispatch to, so both see the same bytes.

Variants (``--only`` picks some; names below):

    bf16_eager           generate(), DynamicCache, no compile
    bf16_compiled        generate() with a StaticCache and CompileConfig(fullgraph=True, mode="reduce-overhead")
    bnb_eager            the NF4 model as transformers runs it (bitsandbytes' kernels)
    bnb_compiled_forced  as bf16_compiled; transformers refuses to compile bnb-4bit models
                         (its quantizer says is_compileable=False): the flag is FORCED here, as in the issue
    nf4lab_eager         the NF4 model with nf4lab.install()
    nf4lab_compiled      nf4lab.compile_for_decode(model), then as bf16_compiled
    eager_interleaved    bnb_eager and nf4lab_eager once more, in this process, their generates interleaved
                         (ABBA, ``eager_rounds`` rounds after a warm-up): eager decode is bound by the host,
                         and a host whose speed drifts between two child processes moved their ratio
    compiled_interleaved bf16_compiled, bnb_compiled_forced and nf4lab_compiled once more, and
                         bnb_compiled_lean (bitsandbytes' kernels under the Linear4bit forward and guard setting
                         that compile_for_decode gives nf4lab: what the kernels alone change), in one process on
                         four models (the bf16 one and three NF4 twins of it, each compiled and graph-captured
                         by its own generate), their generates interleaved (ABCD DCBA, ``compiled_rounds``
                         rounds after two warm-ups), each model under the guard setting that is faster for it
                         (dynamo's dict-tag guards for bf16 and the lean-forward models, torch's default for
                         bitsandbytes as forced). Also per decode step: the step's wall time, the host time
                         inside the compiled call, and its GPU span (CUDA events around the call)
    qlora_bnb            one QLoRA step (peft: prepare_model_for_kbit_training + LoRA r=16 on the seven
    qlora_nf4lab         projections, AdamW on the LoRA params), bitsandbytes' kernels / nf4lab installed

Decode timing: greedy, batch 1, a random prompt. A first generate warms up (compiles, captures the
CUDA graphs); then ``T_N`` = one generate of N new tokens and ``T_1`` = generate of 1 new token
(prefill + first token, median of 3). decode tok/s = (N - 1) / (T_N - T_1); end-to-end tok/s = N / T_N;
compile_s = first generate - T_N. Compiled variants reuse one StaticCache object (reset between
calls), so the timed call neither recompiles nor re-records CUDA graphs. Inductor's FX-graph and
AOT-autograd caches are off for the run (every compiled variant compiles in full; the nf4lab and
bnb graphs are identical, the ops differ only below the dispatcher); Triton's kernel cache stays on.

Agreement (reported, never asserted: the GEMV sums in its own order): for pairs in the same mode,
the first step where the greedy tokens differ and the logit margin (top1 - top2) of each side at
that step; then a teacher-forced run (a logits processor forces a fixed random token sequence, the
raw logits are recorded) and per step max |a - b| and max |a - b| / max |a|. The first step's logits
come from the prefill (eager in every variant); the others from the decode step of that mode.

Results: ``data/results/<gpu>/models.json`` (``models_quick.json`` with --quick), also copied to $OUT
when set; ``models_table(gpu)`` renders the markdown table.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

DECODE = ["bf16_eager", "bf16_compiled", "bnb_eager", "bnb_compiled_forced", "nf4lab_eager", "nf4lab_compiled"]
QLORA = ["qlora_bnb", "qlora_nf4lab"]
EAGER_AB = "eager_interleaved"  # bnb_eager and nf4lab_eager again, generate by generate in one process
COMPILED_ABC = "compiled_interleaved"  # the three compiled variants again, generate by generate in one process
VARIANTS = DECODE + [COMPILED_ABC, EAGER_AB] + QLORA
LABELS = {
    "bf16_eager": "bf16, eager",
    "bf16_compiled": "bf16, static cache + compiled",
    "bnb_eager": "bitsandbytes NF4, eager",
    "bnb_compiled_forced": "bitsandbytes NF4, compiled (forced)",
    "nf4lab_eager": "nf4lab NF4, eager",
    "nf4lab_compiled": "nf4lab NF4, compiled",
    "bnb_compiled_lean": "bitsandbytes NF4, compiled (forced), lean Linear4bit forward",
    EAGER_AB: "eager decode, bitsandbytes and nf4lab interleaved",
    COMPILED_ABC: "compiled decode, bf16, bitsandbytes and nf4lab interleaved",
    "qlora_bnb": "QLoRA step, bitsandbytes",
    "qlora_nf4lab": "QLoRA step, nf4lab",
}
# Pairs compared token by token and logit by logit (same mode; the last two: references).
PAIRS = [("bnb_eager", "nf4lab_eager"), ("bnb_compiled_forced", "nf4lab_compiled"),
         ("bf16_eager", "bf16_compiled"), ("bnb_eager", "bnb_compiled_forced"),
         ("nf4lab_eager", "nf4lab_compiled"), ("bf16_eager", "bnb_eager")]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclasses.dataclass
class Settings:
    layers: int = 32
    hidden: int = 4096
    mlp: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 32000
    prompt_len: int = 16
    new_tokens: int = 64
    t1_repeats: int = 3
    qlora_batch: int = 2
    qlora_seq: int = 512
    qlora_warmup: int = 2
    qlora_steps: int = 8
    eager_rounds: int = 4
    compiled_rounds: int = 4
    profile_steps: bool = False     # compiled_interleaved: one more generate per model under cProfile (host_profile)
    skip_guards: bool = False       # compiled_interleaved: after the warm-up, torch.compiler.set_stance(
                                    # skip_guard_eval_unsafe=True) for every model alike
    lora_r: int = 16
    seed: int = 0
    device: str = "cuda"
    compile_on_cpu: bool = False

    @classmethod
    def full(cls):
        return cls()

    @classmethod
    def quick(cls):
        return cls(layers=4, new_tokens=16, qlora_warmup=1, qlora_steps=2, eager_rounds=1, compiled_rounds=1)

    @classmethod
    def cpu_smoke(cls):
        return cls(layers=2, hidden=128, mlp=256, heads=4, kv_heads=2, vocab=512, prompt_len=8, new_tokens=8,
                   t1_repeats=1, qlora_batch=2, qlora_seq=32, qlora_warmup=1, qlora_steps=2, eager_rounds=1, compiled_rounds=1,
                   lora_r=4, device="cpu")


# ---------------------------------------------------------------- comparison logic (pure numpy, tested on CPU)
def first_divergence(a, b) -> int | None:
    """Index of the first position where two token sequences differ (a length difference counts at
    the shorter one's end), or None when they are equal."""
    a, b = list(a), list(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if int(x) != int(y):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def margin(row) -> float:
    """top1 - top2 of one step's logits (NaN for fewer than two entries)."""
    import numpy as np

    row = np.asarray(row, dtype=np.float64).ravel()
    if row.size < 2:
        return float("nan")
    top = np.partition(row, row.size - 2)[-2:]
    return float(top[1] - top[0])


def compare_free(tokens_a, logits_a, tokens_b, logits_b) -> dict:
    """Greedy runs of two variants: where they part and how close to a tie each was there."""
    step = first_divergence(tokens_a, tokens_b)
    out = {"steps": int(min(len(tokens_a), len(tokens_b))), "first_divergence": step,
           "identical": step is None}
    if step is not None and step < min(len(logits_a), len(logits_b)):
        out.update(token_a=int(tokens_a[step]), token_b=int(tokens_b[step]),
                   margin_a=margin(logits_a[step]), margin_b=margin(logits_b[step]))
    return out


def compare_forced(logits_a, logits_b, steps: int | None = None) -> dict:
    """Teacher-forced logits of two variants, step by step: max |a-b| and max |a-b| / max |a|."""
    import numpy as np

    a = np.asarray(logits_a, dtype=np.float64)
    b = np.asarray(logits_b, dtype=np.float64)
    n = min(len(a), len(b)) if steps is None else min(len(a), len(b), steps)
    a, b = a[:n].reshape(n, a[0].size if len(a) else 0), b[:n].reshape(n, b[0].size if len(b) else 0)
    diff = np.abs(a - b).max(axis=1) if n else np.zeros(0)
    scale = np.abs(a).max(axis=1) if n else np.zeros(0)
    rel = np.divide(diff, scale, out=np.full_like(diff, np.nan), where=scale > 0)
    agree = (a.argmax(axis=1) == b.argmax(axis=1)) if n else np.zeros(0, bool)
    return {"steps": int(n), "max_abs": float(diff.max()) if n else None, "max_rel": float(np.nanmax(rel)) if n else None,
            "per_step_abs": [float(x) for x in diff], "per_step_rel": [float(x) for x in rel],
            "argmax_agree": int(agree.sum()), "bitwise_equal_steps": int((diff == 0).sum())}


def agreement_records(runs: dict) -> list:
    """One record per PAIRS entry whose two variants both produced tokens and logits."""
    recs = []
    for a, b in PAIRS:
        ra, rb = runs.get(a), runs.get(b)
        if not ra or not rb or ra.get("tokens") is None or rb.get("tokens") is None:
            continue
        rec = {"kind": "agreement", "name": f"{LABELS[a]} vs {LABELS[b]}", "a": a, "b": b,
               "free": compare_free(ra["tokens"], ra["logits"], rb["tokens"], rb["logits"])}
        if ra.get("forced_logits") is not None and rb.get("forced_logits") is not None:
            rec["forced"] = compare_forced(ra["forced_logits"], rb["forced_logits"])
        recs.append(rec)
    return recs


# ---------------------------------------------------------------- models
def bnb_config():
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def llama_config(s: Settings):
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=s.layers, hidden_size=s.hidden, intermediate_size=s.mlp,
                       num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, vocab_size=s.vocab,
                       max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0)


def build_bf16(s: Settings):
    """Random-init bf16 Llama (transformers' init, seeded), made directly on ``s.device``."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(s.seed)
    with torch.device(s.device):
        model = LlamaForCausalLM._from_config(llama_config(s), dtype=torch.bfloat16)
    return model.eval()


def build_nf4(bf16_model, s: Settings):
    """The bf16 model's weights through transformers' bitsandbytes 4-bit loading path (in memory)."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    sd = {k: v.detach() for k, v in bf16_model.state_dict().items()}
    model = LlamaForCausalLM.from_pretrained(None, config=bf16_model.config, state_dict=sd,
                                             quantization_config=bnb_config(), dtype=torch.bfloat16,
                                             device_map={"": s.device})
    del sd
    return model.eval()


def _free():
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _reset_compiled(model):
    import torch

    for attr in ("_compiled_call", "_last_compile_config"):
        if hasattr(model, attr):
            delattr(model, attr)
    torch.compiler.reset()
    _free()


@contextlib.contextmanager
def forced_compileable(model):
    """transformers' bnb-4bit quantizer says is_compileable=False; swap that one object's class for a
    subclass that says True (as the issue forced it), and put it back after."""
    q = model.hf_quantizer
    cls = type(q)
    q.__class__ = type(f"Forced{cls.__name__}", (cls,), {"is_compileable": property(lambda self: True)})
    try:
        yield model
    finally:
        q.__class__ = cls


# ---------------------------------------------------------------- decode
def greedy_kw(prompt, **extra) -> dict:
    """generate()'s keywords for every decode here: greedy, no stop token (every run makes exactly the tokens asked
    for), the whole prompt attended; ``extra`` adds to them."""
    import torch

    return dict(do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0, eos_token_id=None, **extra)


def _sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class _Forcer:
    """A logits processor that forces ``seq[i]`` at new-token step i (teacher forcing through generate)."""

    def __init__(self, prompt_len, seq):
        self.prompt_len, self.seq = prompt_len, list(seq)

    def __call__(self, input_ids, scores):
        import torch

        i = input_ids.shape[1] - self.prompt_len
        out = torch.full_like(scores, float("-inf"))
        out[:, self.seq[i]] = 0.0
        return out


def run_decode(model, s: Settings, prompt, forced_seq, compiled: bool) -> dict:
    """Warm-up generate, timed generates, a teacher-forced generate; tokens and raw logits of both."""
    import torch
    from transformers import CompileConfig, LogitsProcessorList, StaticCache

    kw = greedy_kw(prompt, return_dict_in_generate=True, output_logits=True)
    cache = None
    if compiled:
        cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
        if s.device == "cpu":
            cc._compile_all_devices = True
        kw["compile_config"] = cc
        cache = StaticCache(config=model.config, max_cache_len=s.prompt_len + s.new_tokens)

    def gen(n, **extra):
        if cache is not None:
            cache.reset()
            extra["past_key_values"] = cache
        _sync(s.device)
        t = time.perf_counter()
        # generate runs under no_grad itself; not inference_mode: the StaticCache's tensors are made
        # during the first call and zeroed between calls, which inference tensors do not allow.
        out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw, **extra)
        _sync(s.device)
        return out, time.perf_counter() - t

    _, first = gen(s.new_tokens)
    out, t_n = gen(s.new_tokens)
    t_1 = sorted(gen(1)[1] for _ in range(s.t1_repeats))[s.t1_repeats // 2]
    forced, _ = gen(s.new_tokens, logits_processor=LogitsProcessorList([_Forcer(s.prompt_len, forced_seq)]))
    tokens = out.sequences[0, s.prompt_len:].tolist()
    assert forced.sequences[0, s.prompt_len:].tolist() == list(forced_seq), "teacher forcing did not hold"
    n = s.new_tokens
    return {"tokens": tokens, "logits": torch.stack(out.logits).float().cpu().reshape(n, -1).numpy(),
            "forced_logits": torch.stack(forced.logits).float().cpu().reshape(n, -1).numpy(),
            "first_generate_s": first, "generate_s": t_n, "prefill_s": t_1,
            "compile_s": (first - t_n) if compiled else None,
            "tok_s": (n - 1) / (t_n - t_1) if n > 1 and t_n > t_1 else None, "e2e_tok_s": n / t_n}


def _interleaved_tok_s(t_n: list, t_1: list, new_tokens: int) -> dict:
    """tok/s = (N - 1) / (median T_N - median T_1) over the rounds, and per round from that round's pair."""
    import statistics

    n1 = new_tokens - 1
    a, b = statistics.median(t_n), statistics.median(t_1)
    return {"tok_s": n1 / (a - b) if n1 > 0 and a > b else None,
            "tok_s_rounds": [n1 / (x - y) if n1 > 0 and x > y else None for x, y in zip(t_n, t_1)],
            "t_n_all": t_n, "t_1_all": t_1}


def eager_interleaved_time(model, s: Settings, prompt, backends: dict) -> dict:
    """Eager decode tok/s per backend, the backends interleaved on one model (ABBA by round).

    ``backends`` maps a variant to a function that switches to it. A round gives each backend one
    generate of N new tokens (T_N) and one of 1 (T_1, prefill and first token); round 0 warms up.
    tok/s = (N - 1) / (median T_N - median T_1), and per round from that round's pair.
    """
    kw = greedy_kw(prompt)
    names = list(backends)
    t_n = {v: [] for v in names}
    t_1 = {v: [] for v in names}
    for i in range(s.eager_rounds + 1):
        for v in (names if i % 2 == 0 else names[::-1]):
            backends[v]()
            for n, store in ((s.new_tokens, t_n), (1, t_1)):
                _sync(s.device)
                t = time.perf_counter()
                model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw)
                _sync(s.device)
                if i:
                    store[v].append(time.perf_counter() - t)
    return {v: _interleaved_tok_s(t_n[v], t_1[v], s.new_tokens) for v in names}


class _StepProbe:
    """Times each call of a model's compiled decode step inside generate (when ``on``): the host clock at the
    call's start and end and, on CUDA, events recorded on the current stream before and after it.

    transformers' generate takes the compiled step from ``model.get_compiled_call``; the probe wraps what
    that returns. Off, the wrapper only forwards the call.
    """

    def __init__(self, model, cuda: bool):
        self.on, self.cuda, self.host, self.events = False, cuda, [], []
        self.profiler, self.profiled = None, 0   # host_profile's cProfile and the calls it has seen
        inner = model.get_compiled_call

        def get_compiled_call(*a, **k):
            f = inner(*a, **k)

            def step(*args, **kwargs):
                if self.profiler is not None:   # host time only: the calls under cProfile, not timed
                    self.profiled += 1
                    return self.profiler.runcall(f, *args, **kwargs)
                if not self.on:
                    return f(*args, **kwargs)
                import torch

                e = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if self.cuda else None
                t0 = time.perf_counter()
                if e:
                    e[0].record()
                out = f(*args, **kwargs)
                if e:
                    e[1].record()
                self.host.append((t0, time.perf_counter()))
                self.events.append(e)
                return out

            return step

        model.get_compiled_call = get_compiled_call

    def host_profile(self, top=15) -> list:
        """The functions with the most host time inside the compiled call, per decode step, from the calls made
        while ``profiler`` was set (then cleared): [{fn, ncalls, tottime_ms, cumtime_ms}] by tottime."""
        import pstats

        steps, prof = self.profiled, self.profiler
        self.profiler, self.profiled = None, 0
        if not steps:   # no compiled call was made (a model transformers would not compile)
            return []
        st = pstats.Stats(prof).stats   # {(file, line, name): (cc, nc, tt, ct, callers)}
        rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:top]
        return [{"fn": f"{Path(fn).name}:{line}({name})", "ncalls": round(nc / steps, 1),
                 "tottime_ms": round(tt * 1e3 / steps, 4), "cumtime_ms": round(ct * 1e3 / steps, 4)}
                for (fn, line, name), (cc, nc, tt, ct, _) in rows]

    def take(self) -> dict:
        """Median step interval, host time in the call and GPU span (ms) of the calls since the last take."""
        import statistics

        host, ev = self.host, self.events
        self.host, self.events = [], []
        if len(host) < 2:
            return {"steps_probed": len(host)}
        gaps = [(b[0] - a[0]) * 1e3 for a, b in zip(host, host[1:])]
        # the host time of the calls that start those intervals: each is within its interval, so its median is
        # within theirs (over all calls, the last one's time has no interval and could tip the median past it)
        out = {"steps_probed": len(host), "step_ms": statistics.median(gaps),
               "host_in_call_ms": statistics.median((b - a) * 1e3 for a, b in host[:-1])}
        if all(ev):
            out["gpu_span_ms"] = statistics.median(a.elapsed_time(b) for a, b in ev)
        return out


@contextlib.contextmanager
def own_classes(models_: dict):
    """Give each model a subclass of its own for the block (and its class back after).

    dynamo keys a compiled forward on the code and guards on the module's type and structure, not on the
    object: two models of one class share one compiled function, and with it one tree of CUDA graphs.
    Measured (H100, 2026-11-27 04:36, lab/decode_gaps.py): of three NF4 twins compiled in one process, the one
    with nf4lab installed replayed bitsandbytes' GEMV kernels at every decode step. A type of its own
    gives each model its own compiled function, graphs and kernels.
    """
    before = {v: type(m) for v, m in models_.items()}
    for v, m in models_.items():
        m.__class__ = type(f"{before[v].__name__}_{v}", (before[v],), {})
    try:
        yield models_
    finally:
        for v, m in models_.items():
            m.__class__ = before[v]


def compiled_interleaved_time(models_: dict, s: Settings, prompt, switch: dict, served=None, dict_tags=None) -> dict:
    """Compiled decode tok/s of several models in one process, their generates interleaved (ABC CBA by round).

    ``models_`` maps a variant to its own model (each is compiled and its CUDA graphs recorded by its own
    first generate, with its own StaticCache); ``switch`` maps a variant to a function called before each
    of its generates (which backend serves the 4-bit ops, and the quantizer's compile flag). Two warm-up
    generates each; then per round one generate of N new tokens (T_N) and one of 1 (T_1) per variant, and
    tok/s = (N - 1) / (median T_N - median T_1) as in run_decode, and per round. A last round with the step
    probe on gives step_ms (median interval between decode steps), host_in_call_ms and gpu_span_ms.
    ``served``: a function returning a count of the Python-side 4-bit op calls, sampled over the first generate
    (which records the graphs: a model whose 4-bit ops the count follows must show more there than the prefill's
    count of a later generate, else its decode graphs hold someone else's kernels) and per timed generate (a
    replayed CUDA graph runs none: a count that grows by more than the prefill's says a graph re-recorded).
    ``dict_tags``: per variant, dynamo's ``use_recursive_dict_tags_for_guards`` for its generates (it is read when
    a model's guards are built; each model gets its own: it halves bf16's guards, cuts nf4lab's lean layers' by 5x,
    and makes bitsandbytes' own Linear4bit guards 1.7x slower, lab/guard_cost.py). Default: torch's setting.
    Call it inside :func:`own_classes` (each model compiled on its own).
    """
    import torch
    from transformers import CompileConfig, StaticCache

    served = served or (lambda: 0)
    cuda = str(s.device).startswith("cuda")
    cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
    if not cuda:
        cc._compile_all_devices = True
    kw = greedy_kw(prompt, compile_config=cc)
    names = list(models_)
    caches = {v: StaticCache(config=m.config, max_cache_len=s.prompt_len + s.new_tokens) for v, m in models_.items()}
    probes = {v: _StepProbe(m, cuda) for v, m in models_.items()}

    tags = {v: (dict_tags or {}).get(v, torch._dynamo.config.use_recursive_dict_tags_for_guards) for v in models_}

    def gen(v, n):
        with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=tags[v]):
            switch[v]()
            caches[v].reset()
            _sync(s.device)
            t = time.perf_counter()
            models_[v].generate(prompt, max_new_tokens=n, min_new_tokens=n, past_key_values=caches[v], **kw)
            _sync(s.device)
            return time.perf_counter() - t

    from torch._dynamo.utils import counters

    first, non_static, served_first = {}, {}, {}
    for v in names:   # the first generate compiles and records the CUDA graphs
        c0, f0 = counters["inductor"]["cudagraph_recorded_non_static_inputs"], served()
        first[v] = gen(v, s.new_tokens)
        non_static[v] = counters["inductor"]["cudagraph_recorded_non_static_inputs"] - c0
        served_first[v] = served() - f0
    for v in names:
        gen(v, s.new_tokens)
    stance = contextlib.nullcontext()
    if s.skip_guards:  # every graph is recorded now: only the guards that tell the models' entries apart still run
        stance = torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
    t_n = {v: [] for v in names}
    t_1 = {v: [] for v in names}
    grew = {v: [] for v in names}
    steps = {}
    with stance:
        for i in range(s.compiled_rounds):
            for v in (names if i % 2 == 0 else names[::-1]):
                c0 = served()
                t_n[v].append(gen(v, s.new_tokens))
                grew[v].append(served() - c0)
                t_1[v].append(gen(v, 1))
        for v in names:
            probes[v].on = True
            gen(v, s.new_tokens)
            probes[v].on = False
            steps[v] = probes[v].take()
        if s.profile_steps:
            import cProfile

            for v in names:
                probes[v].profiler = cProfile.Profile()
                gen(v, s.new_tokens)
                steps[v]["host_profile"] = probes[v].host_profile()
    return {v: {**_interleaved_tok_s(t_n[v], t_1[v], s.new_tokens), "first_generate_s": first[v],
                "served_first_generate": served_first[v], "served_per_generate": grew[v],
                "graph_non_static_inputs": non_static[v], "guard_dict_tags": tags[v], **steps[v]} for v in names}


def nf4lab_op_calls() -> int:
    """How many of bitsandbytes' 4-bit op calls nf4lab's kernels have served so far (its Python ran)."""
    from ..integrations import bnb_backend

    return sum(n for (op, by), n in bnb_backend.calls.items() if by.startswith("nf4lab"))


def _compiled_abc(bf16, nf4_bnb, nf4_ours, nf4_lean, s: Settings, prompt, log, t_start) -> list:
    """compiled_interleaved on four models; nf4_bnb, nf4_ours and nf4_lean are NF4 twins of one bf16 model."""
    import torch

    from ..integrations import bnb_backend, lean_linear

    log(f"[{time.perf_counter() - t_start:6.1f} s] {COMPILED_ABC}: bf16, bitsandbytes (as forced and lean) and "
        "nf4lab compiled, generate by generate ...")
    base = {"kind": "decode_interleaved", "mode": "compiled", "rounds": s.compiled_rounds,
            "guards": "skip_guard_eval_unsafe" if s.skip_guards else "default",
            "new_tokens": s.new_tokens, "batch": 1, "prompt_len": s.prompt_len}

    def use_nf4lab():
        bnb_backend.compile_for_decode(nf4_ours)
        if not bnb_backend.installed() and s.device != "cpu":   # on CPU (the smoke test) bitsandbytes serves all
            raise RuntimeError("nf4lab.install() returned False")

    models_ = {"bf16_compiled": bf16, "bnb_compiled_forced": nf4_bnb, "bnb_compiled_lean": nf4_lean,
               "nf4lab_compiled": nf4_ours}
    switch = {"bf16_compiled": bnb_backend.uninstall, "bnb_compiled_forced": bnb_backend.uninstall,
              "bnb_compiled_lean": bnb_backend.uninstall, "nf4lab_compiled": use_nf4lab}
    try:
        # each model under the guard setting that is faster for it (lab/guard_cost.py): bitsandbytes as forced
        # keeps torch's default, as a user who forces the flag gets it
        tags = {"bf16_compiled": True, "bnb_compiled_forced": False, "bnb_compiled_lean": True, "nf4lab_compiled": True}
        with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=False), forced_compileable(nf4_bnb), \
                forced_compileable(nf4_lean), own_classes(models_):
            bnb_backend.prepare_for_compile(nf4_lean)   # (its flag setting is undone by the patch)
            got = compiled_interleaved_time(models_, s, prompt, switch, served=nf4lab_op_calls, dict_tags=tags)
        r = got["nf4lab_compiled"]
        if s.device != "cpu" and r["served_first_generate"] <= max(r["served_per_generate"], default=0):
            raise RuntimeError(f"nf4lab's decode graphs were not recorded with nf4lab's ops: {r['served_first_generate']} "
                               f"nf4lab op calls in the recording generate, {r['served_per_generate']} in the timed ones")
    except Exception as exc:
        return [dict(base, name=LABELS[COMPILED_ABC], variant=COMPILED_ABC, error=_err(exc))]
    finally:
        bnb_backend.uninstall()
        for m in models_.values():
            lean_linear.restore(m)
            _reset_compiled(m)
    recs = []
    for v, r in got.items():
        recs.append(dict(base, name=LABELS[v], variant=v, **r))
        log(f"    {v}: {_fmt(r['tok_s'], '.1f')} tok/s; a step {_fmt(r.get('step_ms'), '.2f')} ms, "
            f"GPU span {_fmt(r.get('gpu_span_ms'), '.2f')} ms, host in the call {_fmt(r.get('host_in_call_ms'), '.2f')} ms")
        for h in r.get("host_profile", ()):
            log(f"      {h['tottime_ms']:8.4f} ms own, {h['cumtime_ms']:8.4f} ms with callees, {h['ncalls']:7.1f} calls a "
                f"step: {h['fn']}")
    return recs


def _eager_ab(nf4, s: Settings, prompt, log, t_start) -> list:
    from ..integrations import bnb_backend

    def use_nf4lab():
        if not bnb_backend.install():
            raise RuntimeError("nf4lab.install() returned False")

    log(f"[{time.perf_counter() - t_start:6.1f} s] {EAGER_AB}: bnb_eager and nf4lab_eager, generate by generate ...")
    base = {"kind": "decode_interleaved", "mode": "eager", "rounds": s.eager_rounds, "new_tokens": s.new_tokens,
            "batch": 1, "prompt_len": s.prompt_len}
    try:
        got = eager_interleaved_time(nf4, s, prompt, {"bnb_eager": bnb_backend.uninstall, "nf4lab_eager": use_nf4lab})
        got["nf4lab_eager"]["op_calls_per_generate"] = _op_calls(nf4, s, prompt, use_nf4lab)
    except Exception as exc:
        return [dict(base, name=LABELS[EAGER_AB], variant=EAGER_AB, error=_err(exc))]
    finally:
        bnb_backend.uninstall()
    recs = []
    for v, r in got.items():
        recs.append(dict(base, name=LABELS[v], variant=v, **r))
        log(f"    {v}: {_fmt(r['tok_s'], '.1f')} tok/s" + (f"; op calls in one generate: {r['op_calls_per_generate']}"
                                                           if r.get("op_calls_per_generate") else ""))
    return recs


def _op_calls(model, s: Settings, prompt, switch) -> dict:
    """bitsandbytes' 4-bit op calls in one eager generate of N tokens, by op and by who served them (nf4lab's
    kernels or bitsandbytes' after nf4lab's checks): a decode whose calls fall through to bitsandbytes pays both."""
    from ..integrations import bnb_backend

    switch()
    c0 = dict(bnb_backend.calls)
    model.generate(prompt, max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens, **greedy_kw(prompt))
    return {f"{op} by {who}": n - c0.get((op, who), 0) for (op, who), n in bnb_backend.calls.items()
            if n != c0.get((op, who), 0)}


# ---------------------------------------------------------------- QLoRA
def make_peft(nf4_model, s: Settings):
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(nf4_model, use_gradient_checkpointing=True,
                                            gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=s.lora_r, lora_alpha=2 * s.lora_r, lora_dropout=0.0,
                                             target_modules=LORA_TARGETS, task_type="CAUSAL_LM"))
    model.train()
    return model


def qlora_batch(s: Settings):
    import torch

    g = torch.Generator().manual_seed(s.seed + 2)
    return torch.randint(2, s.vocab, (s.qlora_batch, s.qlora_seq), generator=g).to(s.device)


def qlora_grads(model, ids) -> tuple:
    """Loss and LoRA gradients of one forward+backward (no step): the same state under both backends."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad
             and p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def qlora_time(model, ids, s: Settings, backends: dict) -> dict:
    """Median ms of a QLoRA step (forward, backward, AdamW) per backend, the backends interleaved.

    ``backends`` maps a variant to a function that switches to it. Every step of one variant is
    followed by a step of the other, on the same model and optimizer, in ABBA order: a drift of the
    machine (clocks, allocator, other tenants) lands on both alike. Sequential blocks of steps did not
    give that: in the H100's models.json of 2026-11-24 one block spread over 548-737 ms, the other
    over 637-827 ms.
    """
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    names = list(backends)
    times = {v: [] for v in names}
    losses = {v: [] for v in names}
    for i in range(s.qlora_warmup + s.qlora_steps):
        for v in (names if i % 2 == 0 else names[::-1]):
            backends[v]()
            _sync(s.device)
            t = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(s.device)
            if i >= s.qlora_warmup:
                times[v].append((time.perf_counter() - t) * 1e3)
            losses[v].append(float(loss.detach()))
    del opt
    n_params = int(sum(p.numel() for p in params))
    return {v: {"ms": sorted(times[v])[len(times[v]) // 2], "ms_all": times[v], "losses": losses[v],
                "trainable_params": n_params} for v in names}


# ---------------------------------------------------------------- the run
def _versions() -> dict:
    from importlib import metadata

    out = {}
    for p in ("transformers", "accelerate", "peft", "bitsandbytes", "torch", "numba-cuda", "numpy"):
        try:
            out[p] = metadata.version(p)
        except Exception:
            out[p] = None
    return out


def _err(exc) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return f"{type(exc).__name__}: {str(exc).strip()[:2000]}\n" + "".join(tb[-3:])[-2000:]


class _Records(list):
    """The run's records; each one added is also written to $OUT/models_partial.json (when $OUT is
    set), so that a run killed half way (time limit, a dead CUDA context) still says how far it got."""

    def _dump(self):
        out = os.environ.get("OUT")
        if out:
            try:
                Path(out).mkdir(parents=True, exist_ok=True)
                (Path(out) / "models_partial.json").write_text(json.dumps(list(self), indent=1, default=str))
            except OSError:
                pass

    def append(self, rec):
        super().append(rec)
        self._dump()

    def __iadd__(self, recs):
        super().extend(recs)
        self._dump()
        return self


def _served_ops():
    try:
        from ..integrations import bnb_backend

        return list(bnb_backend._state.get("ops", ()))
    except Exception:
        return None


def _child_argv(s: Settings, variant: str, dump: Path) -> list:
    """The command that runs one decode variant alone, with these settings, dumping its record and logits."""
    argv = [sys.executable, "-m", "nf4lab", "models", "--only", variant, "--no-save", "--one-process",
            "--dump", str(dump), "--layers", str(s.layers), "--new-tokens", str(s.new_tokens)]
    if s.device == "cpu":  # the CPU smoke settings (a decode variant needs only the model's shape and tokens)
        argv += ["--cpu-smoke"] + (["--cpu-compile"] if s.compile_on_cpu else [])
    return argv


def _run_isolated(s: Settings, variant: str, log, t_start):
    """One decode variant in a child process: (its record, its run with logits), or (an error record, None).
    A child starts from a clean process, so no variant inherits another's compiled graphs, CUDA-graph pools or
    allocator state: in one process the order of the variants moved the compiled results by up to 1.3x (and
    two models of one class share dynamo's compiled forward and its CUDA graphs: see own_classes)."""
    import subprocess
    import tempfile

    import torch

    log(f"[{time.perf_counter() - t_start:6.1f} s] {variant} (own process) ...")
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "run.pt"
        p = subprocess.run(_child_argv(s, variant, dump), capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("    ")]
        for ln in lines:
            log(ln)
        if p.returncode != 0 or not dump.exists():
            err = (p.stderr.strip().splitlines() or ["no output"])[-1]
            log(f"    FAILED in its process: {err}")
            return {"kind": "decode", "name": LABELS[variant], "variant": variant, "error": err}, None
        got = torch.load(dump, weights_only=False)
    return got["record"], got["run"]


def run(s: Settings, only=None, log=print, isolate=False, dump=None) -> dict:
    """The selected variants; returns {"meta", "records"} (not yet saved). ``isolate``: each decode variant in
    a child process of its own (QLoRA stays here); ``dump``: write the decode record and raw run (logits) of
    the single selected decode variant to that path, for the parent of an isolated run."""
    import torch

    from ..integrations import bnb_backend
    from ..integrations import lean_linear

    t_start = time.perf_counter()
    # Nothing is downloaded: random weights, the config in code (the GPU machines have no network).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    want = [v for v in VARIANTS if not only or v in only]
    if not want:
        raise ValueError(f"--only {only} selects none of {VARIANTS}")
    try:  # every compiled variant compiles in full (see the module docstring)
        import torch._functorch.config as fconf
        import torch._inductor.config as iconf

        iconf.fx_graph_cache = False
        fconf.enable_autograd_cache = False
    except Exception:
        pass

    g = torch.Generator().manual_seed(s.seed + 1)
    prompt = torch.randint(2, s.vocab, (1, s.prompt_len), generator=g).to(s.device)
    forced_seq = torch.randint(2, s.vocab, (s.new_tokens,), generator=g).tolist()

    records, runs, phases = _Records(), {}, {}
    if isolate:
        for v in [v for v in DECODE if v in want]:
            rec, r = _run_isolated(s, v, log, t_start)
            records.append(rec)
            if r is not None:
                runs[v] = r
        want = [v for v in want if v not in DECODE]

    def phase(name, t0):
        phases[name] = round(time.perf_counter() - t0, 2)

    def decode(variant, model, compiled):
        log(f"[{time.perf_counter() - t_start:6.1f} s] {variant} ...")
        rec = {"kind": "decode", "name": LABELS[variant], "variant": variant, "compiled": compiled,
               "forced": variant == "bnb_compiled_forced", "new_tokens": s.new_tokens, "batch": 1,
               "prompt_len": s.prompt_len}
        if variant.startswith("nf4lab"):
            rec["nf4lab_ops"] = _served_ops()
        try:
            r = run_decode(model, s, prompt, forced_seq, compiled)
            runs[variant] = r
            rec.update({k: v for k, v in r.items() if k not in ("logits", "forced_logits")})
            rec["tokens"] = r["tokens"]
            log(f"    decode {_fmt(r['tok_s'], '.1f')} tok/s, e2e {r['e2e_tok_s']:.1f} tok/s"
                + (f", compile {r['compile_s']:.1f} s" if compiled else ""))
        except Exception as exc:
            rec["error"] = _err(exc)
            log(f"    FAILED: {rec['error'].splitlines()[0]}")
        finally:
            if compiled:
                _reset_compiled(model)
        records.append(rec)

    def nf4lab_on(compiled_model=None):
        if compiled_model is not None:
            bnb_backend.compile_for_decode(compiled_model)
            ok = bnb_backend.installed()
        else:
            ok = bnb_backend.install()
        if not ok:
            raise RuntimeError("nf4lab.install() returned False (no usable CUDA GPU, or the simulator): "
                               "nothing would run on nf4lab's kernels")

    bf16 = nf4 = None
    try:
        t0 = time.perf_counter()
        bf16 = build_bf16(s)
        phase("build_bf16_s", t0)
        for v, comp in (("bf16_eager", False), ("bf16_compiled", True)):
            if v in want:
                decode(v, bf16, comp)
        need_nf4 = any(v in want for v in DECODE[2:] + QLORA + [EAGER_AB, COMPILED_ABC])
        if need_nf4:
            t0 = time.perf_counter()
            nf4 = build_nf4(bf16, s)
            phase("build_nf4_s", t0)
        if COMPILED_ABC in want:
            twin, twin2 = build_nf4(bf16, s), build_nf4(bf16, s)
            try:
                records += _compiled_abc(bf16, nf4, twin, twin2, s, prompt, log, t_start)
            finally:
                del twin, twin2
                _free()
        del bf16
        bf16 = None
        _free()
        if nf4 is not None:
            bnb_backend.uninstall()
            if "bnb_eager" in want:
                decode("bnb_eager", nf4, False)
            if "bnb_compiled_forced" in want:
                with forced_compileable(nf4):
                    decode("bnb_compiled_forced", nf4, True)
            for v, comp in (("nf4lab_eager", False), ("nf4lab_compiled", True)):
                if v not in want:
                    continue
                try:
                    nf4lab_on(nf4 if comp else None)
                except Exception as exc:
                    records.append({"kind": "decode", "name": LABELS[v], "variant": v, "compiled": comp,
                                    "error": _err(exc)})
                    log(f"[{time.perf_counter() - t_start:6.1f} s] {v} FAILED: {exc}")
                    continue
                decode(v, nf4, comp)
            bnb_backend.uninstall()  # also gives the quantizer its class back
            lean_linear.restore(nf4)  # the eager and QLoRA runs below: Linear4bit as transformers made it
            if EAGER_AB in want:
                records += _eager_ab(nf4, s, prompt, log, t_start)
            if any(v in want for v in QLORA):
                records += _qlora(nf4, s, want, log, t_start)
    finally:
        bnb_backend.uninstall()
        del bf16, nf4
        _free()

    if dump is not None:
        decs = [r for r in records if r.get("kind") == "decode"]
        torch.save({"record": decs[0] if decs else None, "run": next(iter(runs.values()), None)}, dump)
    for rec in agreement_records(runs):
        records.append(rec)
    phases["total_s"] = round(time.perf_counter() - t_start, 2)
    meta = _meta(s, phases)
    meta["isolated"] = bool(isolate)
    if isolate:
        meta["method"] += "; each decode variant in a child process of its own"
    log(f"[{phases['total_s']:6.1f} s] done")
    return {"meta": meta, "records": list(records)}


def _qlora(nf4, s: Settings, want, log, t_start) -> list:
    from ..integrations import bnb_backend

    recs = []
    log(f"[{time.perf_counter() - t_start:6.1f} s] QLoRA: peft ...")
    try:
        model = make_peft(nf4, s)
    except Exception as exc:
        return [{"kind": "qlora", "name": LABELS[v], "variant": v, "error": _err(exc)} for v in QLORA if v in want]
    ids = qlora_batch(s)
    base = {"kind": "qlora", "batch": s.qlora_batch, "seq": s.qlora_seq, "lora_r": s.lora_r,
            "targets": LORA_TARGETS, "gradient_checkpointing": "use_reentrant=False",
            "steps_timed": s.qlora_steps, "warmup": s.qlora_warmup}
    # Same state (LoRA B = 0, no step yet) under both backends: loss and LoRA gradients.
    grads = {}
    for v in QLORA:
        if v not in want:
            continue
        try:
            if v == "qlora_nf4lab" and not bnb_backend.install():
                raise RuntimeError("nf4lab.install() returned False")
            if v == "qlora_bnb":
                bnb_backend.uninstall()
            grads[v] = qlora_grads(model, ids)
        except Exception as exc:
            grads[v] = exc
        finally:
            bnb_backend.uninstall()
    def use_nf4lab():
        if not bnb_backend.install():
            raise RuntimeError("nf4lab.install() returned False")

    switch = {"qlora_bnb": bnb_backend.uninstall, "qlora_nf4lab": use_nf4lab}
    run_ = [v for v in QLORA if v in want and not isinstance(grads.get(v), Exception)]
    log(f"[{time.perf_counter() - t_start:6.1f} s] {', '.join(run_)}, interleaved step by step ...")
    timed, err = {}, None
    served = None
    try:
        if "qlora_nf4lab" in run_:
            use_nf4lab()
            served = _served_ops()
        if run_:
            timed = qlora_time(model, ids, s, {v: switch[v] for v in run_})
    except Exception as exc:
        err = _err(exc)
        log(f"    FAILED: {err.splitlines()[0]}")
    finally:
        bnb_backend.uninstall()
    for v in QLORA:
        if v not in want:
            continue
        rec = dict(base, name=LABELS[v], variant=v, interleaved=len(run_) > 1)
        if v == "qlora_nf4lab":
            rec["nf4lab_ops"] = served
        if isinstance(grads.get(v), Exception):
            rec["error"] = _err(grads[v])
        elif err:
            rec["error"] = err
        else:
            rec["loss_at_start"] = grads[v][0]
            rec.update(timed[v])
            log(f"    {v}: {rec['ms']:.1f} ms/step")
        recs.append(rec)
    a, b = grads.get("qlora_bnb"), grads.get("qlora_nf4lab")
    if isinstance(a, tuple) and isinstance(b, tuple):
        diffs = [float((a[1][k] - b[1][k]).abs().max()) for k in a[1] if k in b[1]]
        scale = max((float(t.abs().max()) for t in a[1].values()), default=0.0)
        recs.append({"kind": "qlora_agreement", "name": "QLoRA loss and LoRA grads, bitsandbytes vs nf4lab "
                     "(same state, before any step)", "loss_bnb": a[0], "loss_nf4lab": b[0],
                     "loss_equal": a[0] == b[0], "grad_tensors": len(diffs),
                     "grad_max_abs": max(diffs, default=None), "grad_max_abs_ref": scale,
                     "grad_tensors_bitwise_equal": sum(d == 0 for d in diffs)})
    del model
    _free()
    return recs


def _meta(s: Settings, phases) -> dict:
    from . import results
    from .. import runtime

    method = ("greedy decode, batch 1, random prompt: decode tok/s = (N-1)/(T_N - T_1) with T_N one generate "
              "of N new tokens and T_1 the median generate of 1 new token, after a warm-up generate "
              "(compile_s = warm-up - T_N); QLoRA: median ms of forward+backward+AdamW step after warm-up; "
              "random-weight Llama, NF4 via transformers' bitsandbytes quantizer (from_pretrained, "
              "state_dict in memory)")
    if runtime.ON_GPU:
        meta = results.meta(method)
    else:
        import datetime as _dt

        meta = {"gpu": None, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "method": method}
    meta["versions"] = _versions()
    meta["settings"] = dataclasses.asdict(s)
    meta["model"] = (f"Llama, {s.layers} layers, hidden {s.hidden}, MLP {s.mlp}, {s.heads} heads, "
                     f"{s.kv_heads} KV heads, vocabulary {s.vocab}, random weights (seed {s.seed})")
    meta["quantization"] = ("BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
                            "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)")
    meta["phases"] = phases
    try:
        import torch

        if torch.cuda.is_available():
            meta["max_memory_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    except Exception:
        pass
    return meta


# ---------------------------------------------------------------- tables and files
def _fmt(x, fmt):
    return "" if x is None else format(x, fmt)


def table(data: dict) -> str:
    """Markdown: decode tok/s and compile time, QLoRA ms/step, agreement."""
    recs = data["records"]
    meta = data["meta"]
    lines = [f"{meta.get('model')}; {meta.get('gpu')}, {meta.get('date')}; "
             + ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items() if v), ""]
    dec = [r for r in recs if r["kind"] == "decode"]
    if dec:
        ref = {r["variant"]: r.get("tok_s") for r in dec}
        lines += [f"| decode, batch 1, {meta['settings']['new_tokens']} new tokens | tok/s | end-to-end tok/s | "
                  "compile s | x bitsandbytes (same mode) |", "| --- | ---: | ---: | ---: | ---: |"]
        for r in dec:
            if r.get("error"):
                lines.append(f"| {r['name']} | failed: {r['error'].splitlines()[0][:80]} | | | |")
                continue
            base = ref.get("bnb_compiled_forced" if r.get("compiled") else "bnb_eager")
            x = r["tok_s"] / base if r["variant"].startswith("nf4lab") and base and r.get("tok_s") else None
            lines.append(f"| {r['name']} | {_fmt(r.get('tok_s'), '.1f')} | {_fmt(r.get('e2e_tok_s'), '.1f')} | "
                         f"{_fmt(r.get('compile_s'), '.0f')} | {_fmt(x, '.2f')} |")
    for line in interleaved_lines(recs):
        lines += ["", line]
    ql = [r for r in recs if r["kind"] == "qlora"]
    if ql:
        q0 = ql[0]
        lines += ["", f"| QLoRA step, batch {q0['batch']} x {q0['seq']}, LoRA r={q0['lora_r']} on 7 projections | "
                  "ms/step | x bitsandbytes |", "| --- | ---: | ---: |"]
        bms = next((r.get("ms") for r in ql if r["variant"] == "qlora_bnb"), None)
        for r in ql:
            if r.get("error"):
                lines.append(f"| {r['name']} | failed: {r['error'].splitlines()[0][:80]} | |")
                continue
            x = bms / r["ms"] if bms and r["variant"] == "qlora_nf4lab" else None
            lines.append(f"| {r['name']} | {r['ms']:.1f} | {_fmt(x, '.2f')} |")
    ag = [r for r in recs if r["kind"] == "agreement"]
    if ag:
        lines += ["", "| agreement | greedy tokens: first diverging step (margin a / b) | teacher-forced: max abs "
                  "logit diff | max rel | argmax agrees |", "| --- | --- | ---: | ---: | ---: |"]
        for r in ag:
            f = r["free"]
            if f["identical"]:
                div = f"identical ({f['steps']} steps)"
            else:
                div = (f"step {f['first_divergence']} of {f['steps']} ({_fmt(f.get('margin_a'), '.3g')} / "
                       f"{_fmt(f.get('margin_b'), '.3g')})")
            fo = r.get("forced") or {}
            lines.append(f"| {r['name']} | {div} | {_fmt(fo.get('max_abs'), '.3g')} | {_fmt(fo.get('max_rel'), '.2g')} | "
                         f"{fo.get('argmax_agree', '')}/{fo.get('steps', '')} |")
    qa = [r for r in recs if r["kind"] == "qlora_agreement"]
    for r in qa:
        lines += ["", f"{r['name']}: loss {r['loss_bnb']:.6g} vs {r['loss_nf4lab']:.6g} "
                  f"({'equal' if r['loss_equal'] else 'different'}); LoRA grads max abs diff "
                  f"{_fmt(r['grad_max_abs'], '.3g')} (largest grad {_fmt(r['grad_max_abs_ref'], '.3g')}), "
                  f"{r['grad_tensors_bitwise_equal']} of {r['grad_tensors']} tensors bitwise equal."]
    return "\n".join(lines)


def eager_interleaved_line(recs) -> str:
    """One sentence on the interleaved eager decode records, or '' where the run has none."""
    ab = {r["variant"]: r for r in recs if r.get("kind") == "decode_interleaved" and r.get("mode") != "compiled"}
    if not ab:
        return ""
    r0 = next(iter(ab.values()))
    if r0.get("error"):
        return f"Eager decode, interleaved: failed: {r0['error'].splitlines()[0][:80]}"
    b, o = ab.get("bnb_eager", {}).get("tok_s"), ab.get("nf4lab_eager", {}).get("tok_s")
    span = (lambda r: ", ".join(_fmt(x, ".1f") for x in r.get("tok_s_rounds", [])))
    x = f" ({o / b:.2f}x)" if b and o else ""
    return (f"Eager decode, bitsandbytes and nf4lab interleaved generate by generate in one process "
            f"({r0['rounds']} rounds): bitsandbytes {_fmt(b, '.1f')} tok/s [{span(ab.get('bnb_eager', {}))}], "
            f"nf4lab {_fmt(o, '.1f')} tok/s [{span(ab.get('nf4lab_eager', {}))}]{x}.")


def interleaved_lines(recs) -> list:
    """The interleaved runs' sentences (compiled, then eager) that ``recs`` has records for."""
    return [x for x in (compiled_interleaved_line(recs), eager_interleaved_line(recs)) if x]


def compiled_interleaved_line(recs) -> str:
    """The interleaved compiled decode records as a few sentences, or '' where the run has none."""
    ab = {r["variant"]: r for r in recs if r.get("kind") == "decode_interleaved" and r.get("mode") == "compiled"}
    if not ab:
        return ""
    r0 = next(iter(ab.values()))
    if r0.get("error"):
        return f"Compiled decode, interleaved: failed: {r0['error'].splitlines()[0][:80]}"
    span = (lambda r: ", ".join(_fmt(x, ".1f") for x in r.get("tok_s_rounds", [])))
    names = {"bf16_compiled": "bf16", "bnb_compiled_forced": "bitsandbytes",
             "bnb_compiled_lean": "bitsandbytes with the lean forward", "nf4lab_compiled": "nf4lab"}
    parts = [f"{names.get(v, v)} {_fmt(r.get('tok_s'), '.1f')} tok/s [{span(r)}]" for v, r in ab.items()]
    b, o = ab.get("bnb_compiled_forced", {}).get("tok_s"), ab.get("nf4lab_compiled", {}).get("tok_s")
    f = ab.get("bf16_compiled", {}).get("tok_s")
    lean = ab.get("bnb_compiled_lean", {}).get("tok_s")
    x = ((f" nf4lab: {o / b:.2f}x bitsandbytes" if b and o else "") + (f", {o / f:.2f}x bf16" if f and o else "")
         + (f", {o / lean:.2f}x bitsandbytes with the same lean forward (the kernels alone)" if lean and o else ""))
    steps = [f"{names.get(v, v)} {_fmt(r.get('step_ms'), '.2f')} / {_fmt(r.get('gpu_span_ms'), '.2f')} / "
             f"{_fmt(r.get('host_in_call_ms'), '.2f')}" for v, r in ab.items() if r.get("step_ms")]
    guards = (", dynamo's guards skipped after the warm-up for all (set_stance skip_guard_eval_unsafe)"
              if r0.get("guards") == "skip_guard_eval_unsafe" else "")
    on = [names.get(v, v) for v, r in ab.items() if r.get("guard_dict_tags")]
    if r0.get("guard_dict_tags") is not None:   # recorded per model since the lean forward came
        guards += (", dynamo's dict-tag guards for " + ", ".join(on) if on else ", dynamo's default guards for all")
        guards += ", its default guards for the others" if on and len(on) < len(ab) else ""
    out = (f"Compiled decode, the {len(ab)} models in one process, generate by generate ({r0['rounds']} rounds{guards}): "
           + "; ".join(parts) + "." + (x + "." if x else ""))
    if steps:
        out += (" One decode step, ms (wall / GPU span of the compiled call / host time in the call): "
                + "; ".join(steps) + ".")
    return out


def models_table(gpu: str | None = None, name: str = "models") -> str:
    """The recorded run's markdown table (for tools/readme_results.py), or '' when none is recorded."""
    from . import results

    data = results.load(name, gpu)
    if data is None:
        return ""
    return table(data) + f"\n\nSource: `{data['path']}`."


def save(data: dict, name: str) -> Path:
    from . import results

    path = results.save(data, name)
    out = os.environ.get("OUT")
    if out:
        dst = Path(out) / "data" / "results" / path.parent.name / path.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(path.read_text())
    return path


# ---------------------------------------------------------------- command line
def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="4 layers, 16 tokens, fewer QLoRA steps: a smoke test")
    p.add_argument("--only", nargs="*", choices=VARIANTS, help="variants to run (default: all)")
    p.add_argument("--cpu-smoke", action="store_true", help="no GPU: a tiny 2-layer Llama on CPU")
    p.add_argument("--cpu-compile", action="store_true", help="with --cpu-smoke: also the compiled variants")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--new-tokens", type=int, help="override the number of new tokens")
    p.add_argument("--rounds", type=int, help="override the rounds of the interleaved runs (eager and compiled)")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--profile-steps", action="store_true",
                   help="compiled_interleaved: one more generate per model with cProfile inside the compiled call (where "
                        "its host time goes, per decode step: host_profile in the records)")
    p.add_argument("--skip-guards", action="store_true",
                   help="compiled_interleaved: after the warm-up generates, torch.compiler.set_stance("
                        "skip_guard_eval_unsafe=True) for every model alike (dynamo then runs only the guards "
                        "that choose between compiled entries)")
    p.add_argument("--name", help="results file name (default models, or models_quick with --quick); a run of "
                   "some variants (--only) under its own name leaves models.json whole")
    p.add_argument("--one-process", action="store_true",
                   help="every variant in this process (default on a GPU: each decode variant in its own)")
    p.add_argument("--dump", help=argparse.SUPPRESS)   # a child of an isolated run: where to write its run


def main(args) -> int:
    from .. import runtime

    if args.cpu_smoke:
        s = Settings.cpu_smoke()
        s.compile_on_cpu = bool(args.cpu_compile)
    elif not runtime.ON_GPU:
        print(f"nf4lab models: no usable CUDA GPU here ({runtime.REASON}); use --cpu-smoke for the CPU code "
              "paths.", file=sys.stderr)
        return 2
    else:
        s = Settings.quick() if args.quick else Settings.full()
    if args.layers:
        s.layers = args.layers
    if args.new_tokens:
        s.new_tokens = args.new_tokens
    if args.rounds:
        s.eager_rounds = s.compiled_rounds = args.rounds
    s.profile_steps, s.skip_guards = args.profile_steps, args.skip_guards
    only = args.only
    if args.cpu_smoke and not args.cpu_compile:
        only = [v for v in (only or VARIANTS)
                if v not in ("bf16_compiled", "bnb_compiled_forced", "nf4lab_compiled", COMPILED_ABC)]
    isolate = not (args.one_process or args.cpu_smoke)
    data = run(s, only=only, isolate=isolate, dump=Path(args.dump) if args.dump else None)
    print()
    print(table(data))
    print(f"\nphases (s): {data['meta']['phases']}; peak GPU memory: {data['meta'].get('max_memory_allocated_gb')} GB")
    bad = [r["variant"] for r in data["records"] if r.get("error")]
    if args.cpu_smoke and not args.dump:   # a child (--dump) leaves the recording to its parent
        out = Path(__file__).resolve().parents[2] / "build" / "models_cpu_smoke.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(data, indent=1, default=str) + "\n")
        print(f"\nresults (CPU smoke, not a measurement): {out}")
    elif not args.no_save:
        path = save(data, args.name or ("models_quick" if args.quick else "models"))
        print(f"\nresults: {path}")
    if bad:
        print("failed: " + ", ".join(bad), file=sys.stderr)
    return 1 if bad and not args.cpu_smoke else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m nf4lab.measure.models")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
