"""The fused GEMV's benchmark (09, sections 1, 7, 8) against bitsandbytes' ``matmul_4bit``; its table and plot."""
import dataclasses, itertools, math, time  # noqa: E401

from .. import runtime
from ..kernels.gemv import LLM_SHAPES, buffers_from_torch
from ..format import reference
from ..harness.gemv_check import tolerance
from . import bench, results
from .figures import finish
from .bench import COPY  # the copy ceiling's record name: one spelling, bench's

FUSED = "fused NF4 gemv (numba)"  # every record of our kernels: f"{FUSED} [{variant}]" (kernel_name)
# Record names, as recorded. matmul_4bit without grad is bitsandbytes' gemm_4bit op at every M: its fused kernel
# up to M = 4, then that or dequantize + F.linear as a per-GPU heuristic picks (_gemm_4bit_use_custom_cuda).
BNB_GEMV = "bitsandbytes matmul_4bit gemv (M=1)"
BNB_GEMM = "bitsandbytes matmul_4bit gemm_4bit (M>1)"
BNB_DQ_MM = "bitsandbytes dequantize_4bit + torch.matmul gemv"
COPY_BYTES = 1 << 30  # the copy ceiling: a 1 GiB copy (512 MiB read + 512 MiB written), far beyond L2


def weight_bytes(N, K, blocksize=64) -> int:
    """Bytes a GEMV must read for the weight: packed codes + absmax_q + absmax2 + code2 (x, y not counted)."""
    nblocks = -(-N * K // blocksize)
    return -(-N * K // 2) + nblocks + 4 * -(-nblocks // reference.NESTED_BLOCKSIZE) + 1024


def unfused_bytes(N, K, itemsize=2, blocksize=64) -> int:
    """Dequantize then multiply: read the packed weight, write W in 16 bits, read it again."""
    return weight_bytes(N, K, blocksize) + 2 * itemsize * N * K


def kernel_name(variant: str) -> str:
    return f"{FUSED} [{variant}]"


def bnb_name(M: int) -> str:
    return BNB_GEMV if M == 1 else BNB_GEMM


def default_kernel(run) -> str:
    """Name of the kernel record a run shows: the first variant timed (``run``: a Run, or a results file's dict)."""
    return (run["meta"] if isinstance(run, dict) else run.meta).get("default_kernel") or kernel_name("auto")


def find_record(run, name, shape, dtype, M=1):
    return next((r for r in run.records if r["name"] == name and list(r["shape"]) == list(shape)
                 and r["dtype"] == dtype and r.get("M", 1) == M), None)


def _quantize_gpu(N, K, dtype, seed=0, M=1):
    import bitsandbytes.functional as F
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = reference.torch_dtype(dtype)
    w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    return packed, qs, torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)


def _gpu_check(y, y64, tol, name):
    err = (y.double().reshape(y64.shape) - y64).abs()
    return {"name": name, "ok": not bool((~(err <= tol)).any()), "worst_ratio": float((err / tol).max()),
            "max_err": float(err.max())}


def benchmark(launch, shapes=LLM_SHAPES, dtypes=("bf16", "fp16"), ms=(1,), progress=print):
    """Fused kernel(s) vs bitsandbytes' ``matmul_4bit`` on the same data (GPU only), every output checked against
    float64 first: a bench.Run per shape, dtype and M (``ms``). ``launch``: ``launch(g)`` or {variant: launch}, the first
    the default. Each timing cycles through weight copies totalling > 4x L2: every launch reads DRAM, as in decoding."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    bench._require_gpu()
    launches = dict(launch) if isinstance(launch, dict) else {"default": launch}
    first, names = next(iter(launches)), {key: kernel_name(key) for key in launches}
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2 so each "
                    "launch reads them from DRAM; effective bandwidth = weight bytes (packed + absmax_q + "
                    "absmax2 + code2) / time")
    l2, t0, ceil = runtime.device_info().get("l2_bytes") or (50 << 20), time.time(), bench.ceilings(COPY_BYTES)
    run.meta.update(copy_ceiling_bytes=COPY_BYTES, checks=[], default_kernel=names[first], variants=list(launches),
                    batch_sizes=list(ms))
    for (N, K), dtype, M in itertools.product(shapes, dtypes, ms):
        t_start, nb, keys = time.time(), weight_bytes(N, K), list(launches)
        copies = max(2, math.ceil(4 * l2 / nb))
        data = [_quantize_gpu(N, K, dtype, seed=i, M=M) for i in range(copies)]
        x, y = data[0][2], torch.empty(M, N, dtype=data[0][2].dtype, device="cuda")  # one x for all copies
        bufs = [buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                   q.blocksize, y) for p, q, _ in data]
        q0 = data[0][1]  # copy 0 checked against float64 (bitsandbytes' float32 weights), ours and bitsandbytes'
        q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
        w64 = F.dequantize_4bit(data[0][0], q32).double()
        y64, tol = x.double() @ w64.T, tolerance(x.double(), w64, dtype)
        yb = bnb.matmul_4bit(x, data[0][0].t(), quant_state=data[0][1])
        checks = {}
        for key in keys:
            launches[key](bufs[0])  # the first launch compiles (a launch may size its grid from the kernel)
            y.fill_(float("nan"))
            launches[key](bufs[0])
            torch.cuda.synchronize()
            checks[key] = dict(_gpu_check(y, y64, tol, names[key]), shape=[N, K], dtype=dtype, M=M,
                               max_abs_diff_vs_bnb=float((y.float() - yb.float().reshape(y.shape)).abs().max()))
        chk = checks[keys[0]]
        chk_b = dict(_gpu_check(yb, y64, tol, bnb_name(M)), shape=[N, K], dtype=dtype, M=M,
                     max_abs_diff_vs_bnb=chk["max_abs_diff_vs_bnb"])
        run.meta["checks"] += [*checks.values(), chk_b]
        del y64, tol, w64
        for kind, name, call, ok in (  # call(i, stream): one launch on copy i of the weight
                ("baseline", bnb_name(M), lambda i, s: bnb.matmul_4bit(x, data[i][0].t(), quant_state=data[i][1]),
                 chk_b["ok"]),
                ("baseline", BNB_DQ_MM, lambda i, s: torch.matmul(x, F.dequantize_4bit(*data[i][:2]).t()), None),
                *(("kernel", names[k], lambda i, s, fn=launches[k]: fn(dataclasses.replace(bufs[i], stream=s)),
                   checks[k]["ok"]) for k in keys)):
            turn = itertools.cycle(range(copies))  # each launch takes the next copy, from copy 0
            t = bench.gpu_time_ms(lambda stream: call(next(turn), stream), launches=max(bench.LAUNCHES, copies))
            run.add(bench._record(kind, name, (N, K), dtype, t, nb, bit_exact=None, within_tol=ok,
                                  copies=copies, fits_l2=False, M=M))
        if not any(r["kind"] == "ceiling" and r["shape"] == [N, K] and r["dtype"] == dtype for r in run.records):
            run.add([dict(c, shape=[N, K], dtype=dtype) for c in ceil])
        if progress:  # wall-clock seconds of this whole step, not a kernel time (those are in the records)
            others = "".join(f"; {k} {'ok' if checks[k]['ok'] else 'OUTSIDE TOLERANCE'}" for k in keys[1:])
            progress(f"{N}x{K} {dtype} M={M}: {time.time() - t_start:.1f} s wall clock ({copies} weight copies); "
                     f"{names[keys[0]]} within tolerance: {chk['ok']} (worst {chk['worst_ratio']:.2g}), bnb: "
                     f"{chk_b['ok']} (worst {chk_b['worst_ratio']:.2g}), max |ours - bnb| = "
                     f"{chk['max_abs_diff_vs_bnb']:.3g}{others}")
        del data, bufs  # the weight copies
        torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    run.finalize()
    for r in run.records:  # speedup relative to bitsandbytes' matmul_4bit at the same shape, dtype and M
        if r["kind"] != "ceiling" and r.get("ms"):
            b = find_record(run, bnb_name(r.get("M", 1)), r["shape"], r["dtype"], r.get("M", 1))
            r["speedup_vs_bnb"] = b["ms"] / r["ms"] if b and b.get("ms") else None
    return run


def summary(run, bound=None) -> str:
    """Per shape, dtype and M: the default kernel against bitsandbytes' matmul_4bit (us, x bnb), the copy ceiling
    and ``bound`` (a run with "bound" records: a kernel only reading the weight), and both's tolerance verdicts."""
    ours, copy = default_kernel(run), next((r for r in run.records if r["name"] == COPY), None)
    ok = {(c["name"], tuple(c["shape"]), c["dtype"], c.get("M", 1)): c["ok"] for c in run.meta.get("checks", [])}
    lines = [f"{'W (N x K)':>11} {'dtype':>5} {'M':>2} {'ours us':>8} {'bnb us':>7} {'x bnb':>6} {'% copy':>7} "
             f"{'% of read':>9}  within tolerance (ours, bnb)"]
    for r in (r for r in run.records if r["name"] == ours):
        M, key = r.get("M", 1), (tuple(r["shape"]), r["dtype"], r.get("M", 1))
        b = find_record(run, bnb_name(M), r["shape"], r["dtype"], M)
        rb = bound and next((q for q in bound.records if q["kind"] == "bound" and q["shape"] == r["shape"]), None)
        lines.append(f"{'x'.join(map(str, r['shape'])):>11} {r['dtype']:>5} {M:>2} {r['ms'] * 1e3:8.1f} "
                     f"{b['ms'] * 1e3 if b else float('nan'):7.1f} {b['ms'] / r['ms'] if b else float('nan'):6.2f} "
                     + (f"{100 * r['gbps'] / copy['gbps']:6.0f}% " if copy else f"{'-':>7} ")
                     + (f"{100 * rb['ms'] / r['ms']:8.0f}%  " if rb else f"{'-':>9}  ")
                     + f"{ok.get((ours, *key))}, {ok.get((bnb_name(M), *key))}")
    if copy:   # the divisor of "% copy", which the plot's legend shows too
        lines.append(f"% copy: against the {COPY_BYTES >> 30} GiB device copy timed with these rows, {copy['gbps']:.0f} GB/s")
    return "\n".join(lines)


def plot(run, batch=False):
    """Effective weight bandwidth (weight bytes / time) per shape and dtype: bars at batch 1 (ours, matmul_4bit,
    dequantize + matmul) or, ``batch``, bf16 lines against M (ours solid, matmul_4bit dashed); the copy ceiling red."""
    import matplotlib.pyplot as plt

    ours, recs = default_kernel(run), [r for r in run.records if r["kind"] in ("kernel", "baseline")]
    keys = list(dict.fromkeys((tuple(r["shape"]), r["dtype"]) for r in recs if not batch or r["dtype"] == "bf16"))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    if batch:
        for i, (shape, dtype) in enumerate(keys):
            for names, style, who in (((ours,), "-o", "ours"), ((BNB_GEMV, BNB_GEMM), "--s", "bitsandbytes matmul_4bit")):
                pts = sorted((r.get("M", 1), r["gbps"]) for r in recs
                             if tuple(r["shape"]) == shape and r["dtype"] == dtype and r["name"] in names)
                if pts:   # bf16 only: fp16's lines lie on them (the table has both)
                    ax.plot(*zip(*pts), style, color=f"C{i % 10}", label=f"{shape[0]}x{shape[1]} {dtype}: {who}")
        ms = sorted({r.get("M", 1) for r in recs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.set_xlabel("batch M (rows of x); bf16 (fp16 in the table above)")
    else:
        for j, name in enumerate([BNB_DQ_MM, BNB_GEMV, ours]):
            pts = [(i + (j - 1) * 0.27, r["gbps"]) for i, k in enumerate(keys) if (r := find_record(run, name, *k))]
            if pts:
                ax.bar(*zip(*pts), 0.27, label=name + (" (default)" if name == ours else ""))
        label = "read bound (same run)"   # where the run has one: no bar can pass it
        for i, k in enumerate(keys):
            if rb := next((r for r in run.records if r["kind"] == "bound" and tuple(r["shape"]) == k[0]), None):
                ax.hlines(rb["gbps"], i - 0.45, i + 0.45, color="black", lw=1.5, label=label)
                label = None
        ax.set_xticks(range(len(keys)), [f"{s[0]}x{s[1]}\n{d}" for s, d in keys], fontsize=8)
        ax.set_xlabel("W shape (N out x K in), activation dtype; batch 1")
    copy = next((r for r in run.records if r["name"] == COPY), None)
    if copy:
        ax.axhline(copy["gbps"], color="tab:red", ls="--", lw=1, label=f"copy ceiling {copy['gbps']:.0f} GB/s")
    ax.set(ylabel="effective weight bandwidth, GB/s", ylim=(0, None),
           title=f"Fused NF4 GEMV: weight bytes read per second ({run.meta.get('gpu', '?')}, {run.meta.get('date', '?')})")
    finish(fig, run.meta, legend_from=ax)
    return ax
