"""Where a QLoRA step's time goes, bitsandbytes' kernels against nf4lab installed (GPU only).

The model benchmark's QLoRA step (``nf4lab.measure.models``: Llama-8B shape, NF4, LoRA r=16 on the seven
projections, gradient checkpointing) is profiled once per backend with torch.profiler after warm-up steps:
wall time, the GPU's busy time (sum of kernel times), and the ops and kernels that take the most.
If the wall time is far above the GPU time the step is host-bound, and a backend's host cost per call
decides it.

    python -m lab.qlora_profile [--layers 32] [--cprofile]
"""
import argparse
import time


import nf4lab  # noqa: E402
from nf4lab.measure import models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--cprofile", action="store_true", help="cProfile one step per backend instead (host time)")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    s = models.Settings.full()
    s.layers = a.layers
    bf16 = models.build_bf16(s)
    nf4 = models.build_nf4(bf16, s)
    del bf16
    models._free()
    model = models.make_peft(nf4, s)
    ids = models.qlora_batch(s)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def switch_to(backend):
        """bitsandbytes' kernels or nf4lab installed, then two warm-up steps."""
        nf4lab.uninstall()
        if backend == "nf4lab":
            assert nf4lab.install()
        for _ in range(2):
            step()
        torch.cuda.synchronize()

    if a.cprofile:
        import cProfile
        import pstats

        for backend in ("bitsandbytes", "nf4lab"):
            switch_to(backend)
            prof = cProfile.Profile()
            t = time.perf_counter()
            prof.enable()
            step()
            torch.cuda.synchronize()
            prof.disable()
            print(f"\n=== cProfile, {backend}: one step, {(time.perf_counter() - t) * 1e3:.0f} ms")
            st = pstats.Stats(prof)
            st.sort_stats("tottime").print_stats(18)
            st.sort_stats("cumulative").print_stats("nf4lab|bitsandbytes", 25)
        nf4lab.uninstall()
        return
    for backend in ("bitsandbytes", "nf4lab", "bitsandbytes", "nf4lab"):
        switch_to(backend)
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t) * 1e3)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) * 1e3
        ev = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in ev if e.device_type.name == "CUDA")
        print(f"\n=== {backend}: wall {sorted(walls)} ms unprofiled; profiled {wall:.1f} ms, "
              f"GPU kernels {gpu_us / 1e3:.1f} ms")
        print(ev.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))
        print(ev.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    nf4lab.uninstall()


if __name__ == "__main__":
    main()
