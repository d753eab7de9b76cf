"""Where a compiled 4-bit decode step's GPU time goes between kernels: idle gaps per kernel (GPU only).

    python -m lab.decode_gaps [--layers 32] [--tokens 16]

The model benchmark's ``compiled_interleaved`` run found a decode step of the same wall time for
bitsandbytes and nf4lab (H100, 2026-11-27 04:34: 8.43 against 8.44 ms, GPU span of the compiled call
7.46 against 7.36 ms), although torch.profiler gave nf4lab's step 1.5 ms less kernel time (3.2 against
4.7 ms, ``decode_profile.py``). So inside nf4lab's CUDA graph the GPU idles between kernels. One
suspect: nf4lab's GEMV asks for 64 KB of shared memory per block, two blocks per SM, and every other
kernel of the step for little or none; an SM that changes its L1/shared-memory split between two
kernels must drain first.

What it found first (H100, 2026-11-27 04:36, ``decode_gaps_2026-11-27_0436.json``, run as ``--shared-graphs``
does now): all three NF4 models replayed bitsandbytes' GEMV (``gemm_4bit_simt``) in their decode graphs, nf4lab
installed or not. Two models of one class share one compiled function in dynamo, and its CUDA graphs; so the
interleaved compiled timing gives each model a class of its own (``models.own_classes``) and checks that
nf4lab's graphs were recorded with nf4lab's ops.

On four models in one process (bf16, and three NF4 twins: bitsandbytes' kernels, nf4lab's, and
nf4lab's with the context's cache preference set to shared memory while it records and runs its graphs),
this prints the interleaved compiled decode (models.compiled_interleaved_time) and, from one profiled
generate per model, each decode step's kernel time, its span on the GPU, and the idle time before each
kernel, summed by kernel name.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402  (first: decides GPU or simulator)
from nf4lab.measure import models, results  # noqa: E402

STEP_GAP_US = 300.0   # an idle time longer than this separates two decode steps (host time between them)


def kernel_events(trace_path) -> list:
    ev = json.loads(Path(trace_path).read_text())["traceEvents"]
    ks = [e for e in ev if e.get("cat") == "kernel" and "dur" in e]
    return sorted(ks, key=lambda e: e["ts"])


def gaps(kernels) -> dict:
    """Split the kernels into steps at idle times > STEP_GAP_US; keep the decode steps (the most common kernel
    count); per step: kernel time, span, idle; per kernel name: calls, time and idle before it, per step."""
    steps, cur = [], []
    for k in kernels:
        if cur and k["ts"] - (cur[-1]["ts"] + cur[-1]["dur"]) > STEP_GAP_US:
            steps.append(cur)
            cur = []
        cur.append(k)
    if cur:
        steps.append(cur)
    if not steps:
        return {}
    n = Counter(len(s) for s in steps).most_common(1)[0][0]
    dec = [s for s in steps if len(s) == n]
    by = defaultdict(lambda: [0, 0.0, 0.0])
    busy, span = [], []
    for s in dec:
        busy.append(sum(k["dur"] for k in s))
        span.append(s[-1]["ts"] + s[-1]["dur"] - s[0]["ts"])
        for prev, k in zip([None] + s[:-1], s):
            r = by[k["name"][:70]]
            r[0] += 1
            r[1] += k["dur"]
            if prev is not None:
                r[2] += max(0.0, k["ts"] - (prev["ts"] + prev["dur"]))
    ns = len(dec)
    rows = sorted(({"kernel": name, "calls": c // ns, "us": round(t / ns, 1), "idle_before_us": round(g / ns, 1)}
                   for name, (c, t, g) in by.items()), key=lambda r: -r["idle_before_us"])
    return {"decode_steps": ns, "kernels_per_step": n, "busy_us": round(statistics.median(busy), 1),
            "span_us": round(statistics.median(span), 1),
            "idle_us": round(statistics.median(sp - b for sp, b in zip(span, busy)), 1), "by_kernel": rows[:10]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--shared-graphs", action="store_true",
                    help="leave the models one class (one compiled function for all: how the 04:36 run found "
                         "nf4lab's model replaying bitsandbytes' kernels)")
    args = ap.parse_args(argv)
    if not nf4lab.ON_GPU:
        print("decode_gaps: no CUDA GPU here", file=sys.stderr)
        return 2
    import contextlib

    import torch
    from cuda.bindings import driver as cu
    from transformers import CompileConfig, StaticCache

    s = models.Settings(layers=args.layers, new_tokens=args.tokens, compiled_rounds=2)
    bf16 = models.build_bf16(s)
    m = {"bf16": bf16, "bnb": models.build_nf4(bf16, s), "nf4lab": models.build_nf4(bf16, s),
         "nf4lab_prefer_shared": models.build_nf4(bf16, s)}
    prompt = torch.randint(2, s.vocab, (1, s.prompt_len), generator=torch.Generator().manual_seed(1)).to("cuda")

    def cache_pref(shared: bool):
        c = cu.CUfunc_cache.CU_FUNC_CACHE_PREFER_SHARED if shared else cu.CUfunc_cache.CU_FUNC_CACHE_PREFER_NONE
        (err,) = cu.cuCtxSetCacheConfig(c)
        assert int(err) == 0, err

    def ours(shared):
        def go():
            cache_pref(shared)
            nf4lab.compile_for_decode(m["nf4lab_prefer_shared" if shared else "nf4lab"])
        return go

    def plain():
        cache_pref(False)
        nf4lab.uninstall()

    switch = {"bf16": plain, "bnb": plain, "nf4lab": ours(False), "nf4lab_prefer_shared": ours(True)}
    recs = []
    with contextlib.ExitStack() as stack:
        for v in ("bnb", "nf4lab", "nf4lab_prefer_shared"):
            stack.enter_context(models.forced_compileable(m[v]))
        if not args.shared_graphs:
            stack.enter_context(models.own_classes(m))
        timed = models.compiled_interleaved_time(
            m, s, prompt, switch, served=models.nf4lab_op_calls)
        for v, r in timed.items():
            print(f"{v:22s} {r['tok_s']:6.1f} tok/s  step {r.get('step_ms', 0):.2f} ms  GPU span of the call "
                  f"{r.get('gpu_span_ms', 0):.2f} ms  host in the call {r.get('host_in_call_ms', 0):.2f} ms; nf4lab "
                  f"op calls: {r['served_first_generate']} recording, {r['served_per_generate']} timed")
        cc = CompileConfig(fullgraph=True, mode="reduce-overhead")
        for v, model in m.items():
            switch[v]()
            cache = StaticCache(config=model.config, max_cache_len=s.prompt_len + s.new_tokens)
            kw = models.greedy_kw(prompt, compile_config=cc, past_key_values=cache)
            model.generate(prompt, max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens, **kw)
            cache.reset()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                model.generate(prompt, max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens, **kw)
                torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as tmp:
                p = Path(tmp) / "trace.json"
                prof.export_chrome_trace(str(p))
                g = gaps(kernel_events(p))
            rec = {"kind": "decode_gaps", "name": v, **{k: x for k, x in timed[v].items() if not k.endswith("_all")},
                   **g}
            recs.append(rec)
            print(f"\n== {v}: {g.get('decode_steps')} decode steps of {g.get('kernels_per_step')} kernels; a step: "
                  f"kernels {g.get('busy_us')} us, span {g.get('span_us')} us, idle {g.get('idle_us')} us")
            for r in g.get("by_kernel", []):
                print(f"   idle before {r['idle_before_us']:8.1f} us  time {r['us']:8.1f} us  {r['calls']:4d}x  {r['kernel']}")
    plain()
    data = {"meta": results.meta(f"lab/decode_gaps.py: {args.layers} layers, one profiled generate of {args.tokens} "
                                 "tokens per model after the interleaved timing (2 rounds); kernels from torch.profiler "
                                 f"(CUPTI), steps split at idle > {STEP_GAP_US:.0f} us"), "records": recs}
    print("saved", results.save(data, "decode_gaps"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
