"""Reports of the GEMV lab: Nsight Compute summaries (lab/profile_gemv.py), offline SASS (lab/sass_gemv.py and
the variants' ``main``) and the all-records table of a benchmark run (lab/bench_gemv.py).

Imported as ``lab.gemv_reports`` by the scripts that print these reports.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess

from nf4lab.measure.gemv_bench import COPY
from nf4lab.measure.ptx import compile_ptx


# ---------------------------------------------------------------- Nsight Compute summary (lab/profile_gemv.py)
NCU_METRICS = {  # name in the record: ncu metric
    "time_us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "pipe_pct": "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
    "pipe_wavefronts": "l1tex__data_pipe_lsu_wavefronts.sum",
    "shared_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_elapsed",
    "warps_per_sm": "sm__warps_active.avg.per_cycle_active",
    "registers": "launch__registers_per_thread",
    "local_loads": "smsp__inst_executed_op_local_ld.sum",
    "sm_hz": "sm__cycles_elapsed.avg.per_second",
}


def ncu_summary(kernel: dict, N: int, K: int) -> dict:
    """One profile's record (a kernel of nf4lab.measure.profiling.parse_csv): NCU_METRICS by their short names, the
    time in us, and the data pipe's wavefronts per 1000 weights (all, and those of shared-memory instructions)."""
    m = kernel["metrics"]
    rec = {k: (m.get(v) or {}).get("value") for k, v in NCU_METRICS.items()}
    rec = {k: (v if isinstance(v, float) else None) for k, v in rec.items()}
    if rec["time_us"] is not None:
        rec["time_us"] /= 1e3  # ncu reports ns
    for k in ("pipe", "shared"):
        v = rec[f"{k}_wavefronts"]
        rec[f"{k}_per_1k_weights"] = v / (N * K / 1000) if v is not None else None
    return rec


def ncu_table(run: dict) -> str:
    """The recorded profiles as a text table."""
    cols = (("time_us", "us", 6, ".1f"), ("dram_pct", "DRAM %", 7, ".1f"), ("pipe_pct", "pipe %", 7, ".1f"),
            ("pipe_per_1k_weights", "pipe/1k w", 10, ".1f"), ("shared_per_1k_weights", "shared/1k w", 12, ".1f"),
            ("issue_pct", "issue %", 8, ".1f"), ("warps_per_sm", "warps/SM", 9, ".1f"), ("registers", "regs", 5, ".0f"))
    lines = [f"{'W (N x K)':>11}  {'variant':<22}" + "".join(f" {h:>{w}}" for _, h, w, _ in cols)]
    for r in run["rows"]:
        m = r["metrics"]
        lines.append(f"{r['shape']:>11}  {r['variant']:<22}" + "".join(
            f" {format(m[k], f) if m.get(k) is not None else '-':>{w}}" for k, _, w, f in cols))
    return "\n".join(lines)


# ---------------------------------------------------------------- SASS, offline
SASS_PTX_VERSION = "9.0"  # the highest PTX ISA version CUDA 13.0's ptxas accepts


def find_tool(name):
    path = shutil.which(name)
    if path:
        return path
    import site

    for d in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(d, "nvidia", "*", "bin", name))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"{name} not found (CUDA toolkit, or pip install nvidia-cuda-{name})")


def sass_of(ptx: str, workdir, stem: str, arch="sm_90"):
    """(ptxas -v text, SASS text) of a PTX string."""
    ptx = re.sub(r"^\.version \d+\.\d+", f".version {SASS_PTX_VERSION}", ptx, flags=re.M)
    p = workdir / f"{stem}.ptx"
    p.write_text(ptx)
    cubin = workdir / f"{stem}.cubin"
    info = subprocess.run([find_tool("ptxas"), f"-arch={arch}", "-v", str(p), "-o", str(cubin)],
                          capture_output=True, text=True, check=True).stderr
    env = dict(os.environ)
    try:  # the wheel's cuobjdump finds nvdisasm (pip install nvidia-cuda-nvdisasm) only when told where
        env.setdefault("NVDISASM_PATH", os.path.dirname(find_tool("nvdisasm")))
    except FileNotFoundError:
        pass
    sass = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True, env=env).stdout
    (workdir / f"{stem}.sass").write_text(sass)
    return info, sass


_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")  # cuobjdump: /*addr*/ text ;


def _instructions(sass: str):
    """[(address, text)] of every instruction of a cuobjdump -sass listing."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in map(_INSTRUCTION.match, sass.splitlines()) if m]


def _hottest_span(ins):
    """(first, last) indices into ``ins`` of the largest innermost loop (a backward branch's target to the
    branch), or None where there is no loop."""
    where = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in where:
            s = where[int(m.group(1), 16)]
            loops.append((i - s + 1, s, i))
    # innermost loops (no other loop inside), the largest of them
    inner = [lp for lp in loops if not any(o is not lp and lp[1] <= o[1] and o[2] <= lp[2] for o in loops)]
    return max(inner)[1:] if inner else None


def hottest_loop(sass: str):
    """Instructions (text) of the largest innermost loop: from a backward branch's target to the branch."""
    ins = _instructions(sass)
    span = _hottest_span(ins)
    return [t for _, t in ins[span[0]:span[1] + 1]] if span else []


def opcode(text):
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0]


def sass_report(kernel, sig, weights_per_trip, stem="kernel", workdir=None, ptx=None):
    """ptxas registers/spills/smem and the SASS of the hottest (innermost) loop, per weight.

    Needs ptxas and cuobjdump (the CUDA toolkit, or pip install nvidia-cuda-cuobjdump); raises
    FileNotFoundError without them."""
    import tempfile
    from pathlib import Path

    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp())
    workdir.mkdir(parents=True, exist_ok=True)
    if ptx is None:
        ptx = compile_ptx(kernel, sig)
    info, sass = sass_of(ptx, workdir, stem)
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    smem = re.search(r"(\d+) bytes smem", info)
    loop = hottest_loop(sass)
    ops = collections.Counter(opcode(t) for t in loop)
    return dict(registers=int(regs.group(1)) if regs else None, spill_bytes=int(spill.group(1)) if spill else None,
                smem_bytes=int(smem.group(1)) if smem else None, loop_instructions=len(loop),
                weights_per_trip=weights_per_trip, per_weight=len(loop) / weights_per_trip,
                opcodes=dict(ops.most_common()))


SASS_REPORT = "data/sass/09_fused_gemv.json"  # lab/sass_gemv.py --save writes it (relative to the repository)


def ptxas_version() -> str:
    out = subprocess.run([find_tool("ptxas"), "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def table(run) -> str:
    rows = [f"{'shape NxK':>12} {'dtype':>5} {'M':>2}  {'version':<64} {'us':>8} {'GB/s':>7} {'%copy':>6} {'x bnb':>6}"]
    for r in run.records:
        if r["kind"] == "ceiling" and r["name"] != COPY:
            continue
        f = (lambda v, fmt: "-" if v is None else format(v, fmt))
        m = "" if r["kind"] == "ceiling" else str(r.get("M", 1))
        rows.append(f"{'x'.join(map(str, r['shape'])):>12} {r['dtype'] or '':>5} {m:>2}  {r['name'][:64]:<64} "
                    f"{f(r['ms'] and r['ms'] * 1e3, '.1f'):>8} {f(r['gbps'], '.0f'):>7} "
                    f"{f(r.get('pct_copy'), '.0f'):>6} {f(r.get('speedup_vs_bnb'), '.2f'):>6}")
    return "\n".join(rows)

