"""What dynamo's guards cost per linear layer of a compiled forward, at every call (CPU or GPU).

    python -m lab.guard_cost [--layers 224] [--repeats 300]

A compiled 4-bit decode step spent 2.6-2.9 ms of host time in the frame around the compiled forward against
0.65 ms for bf16 (H100, 2026-11-27, ``models --profile-steps``): dynamo re-checks its guards at every call,
and bitsandbytes' Linear4bit.forward leaves guards on five tensors (the weight, and through
``weight.quant_state`` its four statistics tensors) and on two Python objects per layer.

This compiles (backend "eager": the guards are dynamo's, whatever the backend) a loop over ``--layers``
layers of 64x64 and times the compiled entry's guard check alone (``guard_manager.check``), per variant:
bf16 ``nn.Linear``; bitsandbytes' ``Linear4bit`` as transformers makes it (NF4, nested statistics);
the same with ``lean_linear.prepare`` (nf4lab.compile_for_decode's forward); each with and without
``use_recursive_dict_tags_for_guards`` (compile_for_decode's guard setting). 224 layers: an 8B model's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)
from nf4lab.measure import results  # noqa: E402


def layers(kind, n, device):
    import torch
    import bitsandbytes as bnb

    from nf4lab.integrations import lean_linear

    torch.manual_seed(0)
    if kind == "bf16":
        return torch.nn.ModuleList([torch.nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)
                                    for _ in range(n)]).to(device)
    mods = []
    for _ in range(n):
        m = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4",
                              compress_statistics=True)
        m.weight = bnb.nn.Params4bit(torch.randn(64, 64, dtype=torch.bfloat16), requires_grad=False,
                                     quant_type="nf4", compress_statistics=True)
        m.weight = m.weight._quantize("cpu") if m.weight.quant_state is None else m.weight
        mods.append(m)
    mods = torch.nn.ModuleList(mods).to(device)
    if kind == "lean":
        lean_linear.prepare(mods)
    return mods


def guard_us(kind, tags, n, repeats, device) -> float:
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    mods = layers(kind, n, device)

    def step(x, mods):
        for m in mods:
            x = m(x)
        return x
    x = torch.randn(1, 64, dtype=torch.bfloat16, device=device)
    torch._dynamo.reset()
    with torch.no_grad(), torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=tags):
        torch.compile(step, fullgraph=True, backend="eager")(x, mods)
        gm = _debug_get_cache_entry_list(step.__code__)[0].guard_manager
        fl = {"x": x, "mods": mods}
        assert gm.check(fl)   # (grad mode is one of the guards: checked under no_grad, as compiled)
        for _ in range(5):
            gm.check(fl)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(repeats):
                gm.check(fl)
            best = min(best, (time.perf_counter() - t) / repeats)
    torch._dynamo.reset()
    return best * 1e6


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=300)
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    recs = []
    for kind in ("bf16", "bnb", "lean"):
        for tags in (False, True):
            us = guard_us(kind, tags, a.layers, a.repeats, device)
            recs.append({"kind": "guard_cost", "name": f"{kind}, dict tags {'on' if tags else 'off'}", "layer": kind,
                         "dict_tags": tags, "layers": a.layers, "guard_check_us": round(us, 1),
                         "per_layer_us": round(us / a.layers, 3)})
            print(f"{kind:5s} dict tags {'on ' if tags else 'off'}: {us:8.1f} us a call, "
                  f"{us / a.layers:6.3f} us a layer ({a.layers} layers, {device})")
    if device == "cpu":   # this machine's CPU is not the GPU host's: printed, not recorded
        return 0
    data = {"meta": results.meta(f"dynamo guard_manager.check of torch.compile(fullgraph, backend='eager') over "
                                 f"{a.layers} layers, best of 3 x {a.repeats} calls"), "records": recs}
    print("saved", results.save(data, "guard_cost"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
