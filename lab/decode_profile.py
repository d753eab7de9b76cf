"""Where a compiled 4-bit decode step spends its GPU time: bitsandbytes against nf4lab (GPU only).

    python -m lab.decode_profile [--layers 4] [--tokens 8] [--mode reduce-overhead|default|eager]

The model benchmark (``python -m nf4lab models``) found nf4lab's compiled decode no faster than
bitsandbytes' although nf4lab's GEMV kernel alone is faster at the model's shapes. This
script answers why. It builds the Llama-shaped NF4 model of the benchmark (fewer layers), compiles
its decode step for each side (bitsandbytes forced compileable; nf4lab through
``nf4lab.compile_for_decode``), and for each:

- counts dynamo's graph breaks and inductor's CUDA-graph skips (a skipped graph puts every op's
  Python launch cost back into each token);
- profiles a few decode tokens with torch.profiler and lists the CUDA kernels by total time,
  so one sees whether nf4lab's GEMV runs at all, how often, and what it costs against
  bitsandbytes' ``kgemm_4bit_inference``.

``--mode eager`` compiles nothing and adds a cProfile of one generate: where the host time of an
eager decode goes (eager decode is bound by it). ``--mode default`` compiles without CUDA graphs, which makes every kernel visible to the profiler
(graph replays may show only as one launch). Writes data/results/<gpu>/decode_profile.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402  (first: decides GPU or simulator)
from nf4lab.integrations import bnb_backend  # noqa: E402
from nf4lab.measure import models, results  # noqa: E402


def top_kernels(prof, limit=15) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.key and not e.key.startswith(("cuda", "aten::", "Memcpy", "Memset")):
            rows.append({"kernel": e.key[:120], "calls": e.count, "total_us": round(t, 1)})
    return sorted(rows, key=lambda r: -r["total_us"])[:limit]


def eager_breakdown(gen) -> dict:
    """Eager decode is bound by host time: how much of one generate is spent inside nf4lab's GEMV call
    (torch_ops.gemv_call, wall time summed over its calls), and what the generate takes with Python's
    garbage collector off."""
    import gc

    from nf4lab.integrations import torch_ops

    spent = [0.0, 0]
    inner = torch_ops.gemv_call

    def timed_launch(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    torch_ops.gemv_call = timed_launch
    try:
        wall = gen()
    finally:
        torch_ops.gemv_call = inner
    gc.disable()
    try:
        no_gc = min(gen() for _ in range(3))
    finally:
        gc.enable()
    out = {"generate_timed_s": round(wall, 4), "gemv_call_s": round(spent[0], 4), "gemv_calls": spent[1],
           "generate_no_gc_s": round(no_gc, 4)}
    print("eager breakdown:", out)
    return out


def profile_variant(name, model, s, prompt, mode, tokens) -> dict:
    import torch
    from torch._dynamo.utils import counters
    from transformers import CompileConfig, StaticCache

    counters.clear()
    bnb_backend.calls.clear()   # the ops served in this variant's calls only
    cache = StaticCache(config=model.config, max_cache_len=s.prompt_len + tokens + 1)
    kw = models.greedy_kw(prompt)
    if mode != "eager":
        kw.update(compile_config=CompileConfig(fullgraph=True, mode=mode), past_key_values=cache)

    def gen():
        if mode != "eager":
            cache.reset()
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    first = gen()           # compiles (and records the CUDA graphs)
    wall = min(gen() for _ in range(3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        gen()
    rec = {"kind": "profile", "name": name, "mode": mode, "tokens": tokens, "first_generate_s": round(first, 2),
           "generate_s": round(wall, 4), "graph_breaks": sum(counters["graph_break"].values()),
           "cudagraph_skips": dict(counters["inductor"]).get("cudagraph_skips", 0),
           "served": {f"{op}/{by}": n for (op, by), n in bnb_backend.calls.items()},
           "top_kernels": top_kernels(prof)}
    if mode == "eager":
        rec.update(eager_breakdown(gen))
        import cProfile
        import io
        import pstats

        cp = cProfile.Profile()
        cp.enable()
        gen()
        cp.disable()
        buf = io.StringIO()
        pstats.Stats(cp, stream=buf).sort_stats("tottime").print_stats(20)
        rec["host_profile"] = buf.getvalue()
    print(f"\n== {name} ({mode}): {tokens} tokens in {wall * 1e3:.1f} ms; graph breaks {rec['graph_breaks']}, "
          f"cudagraph skips {rec['cudagraph_skips']}; served {rec['served']}")
    for r in rec["top_kernels"]:
        print(f"  {r['total_us']:10.1f} us  {r['calls']:6d}x  {r['kernel']}")
    print(rec.get("host_profile", ""))
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--mode", default="reduce-overhead", choices=("reduce-overhead", "default", "eager"))
    args = ap.parse_args(argv)
    if not nf4lab.ON_GPU:
        print("decode_profile: no CUDA GPU here", file=sys.stderr)
        return 2
    import torch

    s = models.Settings(layers=args.layers, new_tokens=args.tokens)
    bf16 = models.build_bf16(s)
    nf4 = models.build_nf4(bf16, s)
    del bf16
    models._free()
    prompt = torch.randint(2, s.vocab, (1, s.prompt_len), generator=torch.Generator().manual_seed(1)).to("cuda")
    recs = []
    nf4lab.uninstall()
    eager = args.mode == "eager"
    with models.forced_compileable(nf4):
        recs.append(profile_variant("bitsandbytes NF4" + ("" if eager else ", compiled (forced)"), nf4, s, prompt,
                                    args.mode, args.tokens))
    models._reset_compiled(nf4)
    nf4lab.install() if eager else nf4lab.compile_for_decode(nf4)
    try:
        recs.append(profile_variant("nf4lab NF4" + ("" if eager else ", compiled"), nf4, s, prompt, args.mode,
                                    args.tokens))
    finally:
        nf4lab.uninstall()
    data = {"meta": results.meta(f"torch.profiler over one generate of {args.tokens} tokens after a compiling "
                                 f"call and 3 timed calls; {args.layers} layers; compile mode {args.mode}"),
            "records": recs}
    print("saved", results.save(data, f"decode_profile_{args.mode}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
