"""Nsight Compute (ncu) from Python: build the command, run it, parse its CSV into a small table.

    cmd = ncu_command(["python", "my_script.py"])          # the ncu command line
    text = run_ncu(cmd)                                    # raises NcuUnavailable when it cannot run
    kernels = parse_csv(text)                              # one dict per profiled kernel
    print(table({"my version": summarize(kernels)}))

``profile_version(notebook, version)`` profiles one kernel version of a step notebook
on the 16384x16384 case (a driver process launched under ncu: warm-up launches, then
exactly one profiled launch between cudaProfilerStart/Stop), with line info on so that
stalls map to source lines. ``tools/profile_all.py`` runs it for every version and
stores the CSVs under ``data/ncu/<gpu>/``; ``load_recorded()`` reads them back, for the
many machines where ncu is missing or refused (cloud GPUs usually deny the counters:
ERR_NVGPUCTRPERM).

Parsing follows ncu's documented CSV output (``--csv``):

- ``--page raw``: a header row ``"ID","Process ID","Process Name","Host Name","Kernel Name",
  ...`` followed by one column per metric (raw names such as
  ``dram__throughput.avg.pct_of_peak_sustained_elapsed``), a second row holding the units
  (its ID field is empty), then one row per profiled kernel.
- ``--page details``: one row per metric with the columns ``"ID",...,"Kernel Name",...,
  "Section Name","Metric Name","Metric Unit","Metric Value"`` (newer versions append
  rule columns); metric names there are display names ("DRAM Throughput").

Numbers may carry thousands separators ("1,234.5"); ``==PROF==``/``==WARNING==`` lines and
the profiled program's own output may be mixed in, and are skipped. pandas is not needed.
"""
from __future__ import annotations

import csv
import functools
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .. import config

ROOT = Path(__file__).resolve().parents[2]
NCU_DIR = ROOT / "data" / "ncu"
FIXTURE = ROOT / "tests" / "fixtures" / "ncu_raw_fixture.csv"

# The smallest set of sections that yields the table (each costs replay passes).
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats", "WarpStateStats",
            "SourceCounters")
# Named explicitly so that they are in the raw page whatever the sections contain.
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
)

# ---------------------------------------------------------------- finding and running ncu


class NcuUnavailable(RuntimeError):
    """ncu could not profile here. ``reason``: missing | permission | unsupported | timeout | failed."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


def find_ncu() -> str | None:
    """Path of the ncu executable: $NCU, PATH, then the usual CUDA / Nsight Compute folders."""
    env = os.environ.get("NCU")
    if env and os.path.isfile(env) and os.access(env, os.X_OK):
        return env
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                    "/usr/local/NVIDIA-Nsight-Compute*/ncu"):
        for p in sorted(glob.glob(pattern), reverse=True):
            if os.access(p, os.X_OK):
                return p
    return None


def ncu_command(target: list, *, ncu: str = "ncu", sections=SECTIONS, metrics=METRICS, page: str = "raw",
                kernel_regex: str | None = None, launch_skip: int = 0, launch_count: int | None = None,
                profile_from_start: bool = False, export: str | None = None, csv_output: bool = True,
                clock_control: str = "none", extra=()) -> list:
    """The ncu command line that profiles ``target`` (a list: program and arguments).

    By default only the launches between cudaProfilerStart and cudaProfilerStop are
    profiled (``profile_from_start=False``; numba: ``cuda.profile_start()``), so that
    warm-up and compilation launches are skipped without counting them. Alternatively
    ``kernel_regex`` + ``launch_skip`` + ``launch_count`` pick launches by name.
    ``clock_control="none"`` keeps the GPU's normal clocks, as the benchmarks ran.
    """
    if page not in ("raw", "details"):
        raise ValueError(f"page must be 'raw' or 'details', got {page!r}")
    cmd = [ncu, "--target-processes", "all", "--clock-control", clock_control]
    if not profile_from_start:
        cmd += ["--profile-from-start", "off"]
    for s in sections:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    if kernel_regex:
        cmd += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip:
        cmd += ["--launch-skip", str(int(launch_skip))]
    if launch_count:
        cmd += ["--launch-count", str(int(launch_count))]
    if export:
        cmd += ["--export", str(export), "--force-overwrite"]
    elif csv_output:
        cmd += ["--csv", "--page", page, "--print-units", "base"]
    return cmd + list(extra) + [str(t) for t in target]


def shell_lines(cmd: list, tail: str = "") -> str:
    """A command line (a list, as ``ncu_command`` builds it) as a reader types it in a terminal: one option, or the
    target program from its ``python`` on, a line; a comma-separated value (the ``--metrics`` list) one item a line;
    lines continued with backslashes; ``tail`` (a redirection such as ``"> my.csv"``) after the last token."""
    parts, cur = [], [str(cmd[0])]
    for tok in map(str, cmd[1:]):
        if tok.startswith("--") or tok == "python":
            parts.append(" ".join(cur))
            cur = []
        cur.append(tok)
    text = " \\\n    ".join(parts + [" ".join(cur + ([tail] if tail else []))])
    return text.replace(",", ",\\\n      ")


def full_warps_register_limit(kernel: dict | None) -> float | None:
    """Registers per thread that still let every warp slot of an SM fill: the SM's register file over its thread
    limit, both as ncu records them with a profiled kernel (``device__attribute_*``); None where they are missing."""
    m = (kernel or {}).get("metrics") or {}
    regs, threads = (m.get(f"device__attribute_max_{k}_per_multiprocessor", {}).get("value")
                     for k in ("registers", "threads"))
    return regs / threads if regs and threads else None


def import_command(report: str, *, ncu: str = "ncu", page: str = "raw", extra=()) -> list:
    """Read a saved report (.ncu-rep) back as CSV."""
    cmd = [ncu, "--import", str(report), "--csv", "--page", page]
    if page in ("raw", "details"):
        cmd += ["--print-units", "base"]
    return cmd + list(extra)


_PERMISSION = ("ERR_NVGPUCTRPERM", "does not have permission", "permission denied")
_UNSUPPORTED = ("LibraryNotLoaded", "Failed to initialize the profiler", "not supported on this",
                "Device not supported", "No supported GPU", "Profiling is not supported")


def classify_failure(output: str, returncode: int) -> NcuUnavailable | None:
    """Turn ncu's output into an NcuUnavailable, or None if it looks like it worked."""
    low = output.lower()
    if any(k.lower() in low for k in _PERMISSION):
        return NcuUnavailable("permission", "ncu was refused access to the GPU performance counters "
                              "(ERR_NVGPUCTRPERM): an administrator must allow it (root, CAP_PERFMON or "
                              "NVreg_RestrictProfilingToAdminUsers=0); most cloud GPUs do not")
    if any(k.lower() in low for k in _UNSUPPORTED):
        line = next((l for l in output.splitlines() if "==ERROR==" in l), output.strip()[:200])
        return NcuUnavailable("unsupported", f"ncu cannot profile on this machine: {line.strip()}")
    if "no kernels were profiled" in low:
        return NcuUnavailable("failed", "ncu ran but profiled no kernel (did the program launch any between "
                              "cudaProfilerStart and cudaProfilerStop?)")
    errors = [l.strip() for l in output.splitlines() if "==ERROR==" in l]
    if returncode != 0 or errors:
        tail = errors[:3] or output.strip().splitlines()[-3:]
        if "application returned an error" in low:
            # The profiled program failed: its own last words (a Python exception) say why.
            app = [l.strip() for l in output.splitlines() if l.strip() and not l.startswith("==")]
            tail += ["program: " + " / ".join(app[-2:])] if app else []
        return NcuUnavailable("failed", f"ncu failed (exit status {returncode}): " + " | ".join(tail))
    return None


def run_ncu(cmd: list, *, timeout: float = 600, env: dict | None = None, cwd=None) -> str:
    """Run an ncu command line and return its stdout; raise NcuUnavailable when it cannot profile."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    except FileNotFoundError:
        raise NcuUnavailable("missing", f"{cmd[0]} not found: Nsight Compute is not installed here "
                             "(it comes with the CUDA toolkit)") from None
    except PermissionError as exc:
        raise NcuUnavailable("permission", f"cannot execute {cmd[0]}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise NcuUnavailable("timeout", f"ncu did not finish within {timeout:.0f} s") from None
    fail = classify_failure(p.stdout + "\n" + p.stderr, p.returncode)
    if fail is not None:
        raise fail
    return p.stdout


# ---------------------------------------------------------------- parsing


def to_number(text):
    """'1,234.5' -> 1234.5, '42' -> 42.0; 'n/a', '' and non-numbers -> None."""
    if text is None:
        return None
    s = str(text).strip().replace(",", "")
    if s.endswith("%"):
        s = s[:-1]
    try:
        return float(s)
    except ValueError:
        return None


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header row on, lines that start with a quote."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"') or l.startswith("ID,")), None)
    if start is None:
        return []
    keep = [lines[start]] + [l for l in lines[start + 1:] if l.startswith('"') or re.match(r"^\d+,", l)]
    return list(csv.reader(io.StringIO("\n".join(keep))))


_KEYS = {"ID": "id", "Kernel Name": "kernel", "Block Size": "block", "Grid Size": "grid", "Device": "device",
         "CC": "cc", "Process Name": "process", "Stream": "stream"}


def parse_csv(text: str) -> list[dict]:
    """Kernels in an ncu CSV (raw or details page), in order.

    Each kernel: ``{"id", "kernel", "block", "grid", ..., "metrics": {name: {"value", "unit",
    "section"}}}`` where ``value`` is a float when the text is a number, else the text.
    """
    rows = _csv_rows(text)
    if not rows:
        return []
    header = [h.strip() for h in rows[0]]
    kernels: dict = {}
    order = []

    def kernel_for(rec):
        kid = rec.get("ID", "")
        if kid not in kernels:
            k = {v: rec.get(h, "") for h, v in _KEYS.items()}
            k["metrics"] = {}
            kernels[kid] = k
            order.append(kid)
        return kernels[kid]

    if "Metric Name" in header:  # details page: one row per metric
        for r in rows[1:]:
            rec = dict(zip(header, r))
            if not rec.get("Metric Name"):
                continue
            k = kernel_for(rec)
            raw = rec.get("Metric Value", "")
            num = to_number(raw)
            entry = {"value": raw if num is None else num, "unit": rec.get("Metric Unit", ""),
                     "section": rec.get("Section Name", "")}
            # Display names repeat across sections ("Memory Throughput" is % in Speed Of Light,
            # byte/s in Memory Workload Analysis): the first keeps the plain name.
            key = rec["Metric Name"]
            if key in k["metrics"]:
                key = f"{entry['section']}: {key}"
            k["metrics"][key] = entry
    else:  # raw page: one column per metric, a units row, one row per kernel
        units = {}
        for r in rows[1:]:
            rec = dict(zip(header, r))
            if not rec.get("ID", "").strip():
                units = rec
                continue
            k = kernel_for(rec)
            for h in header:
                if h in _KEYS or h in ("Process ID", "Host Name", "Context"):
                    continue
                raw = rec.get(h, "")
                num = to_number(raw)
                k["metrics"][h] = {"value": raw if num is None else num, "unit": units.get(h, ""),
                                   "section": ""}
    return [kernels[i] for i in order]


_TIME_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
            "s": 1e6, "second": 1e6}
_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12, "kib": 1024,
          "mib": 2**20, "gib": 2**30}

# (field, raw metric names, details-page names)
_FIELDS = {
    "duration_us": (["gpu__time_duration.sum", "gpu__time_duration.avg"], ["Duration"]),
    "dram_pct": (["dram__throughput.avg.pct_of_peak_sustained_elapsed",
                  "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"], ["DRAM Throughput"]),
    "memory_pct": (["gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"], ["Memory Throughput"]),
    "sm_pct": (["sm__throughput.avg.pct_of_peak_sustained_elapsed"], ["Compute (SM) Throughput"]),
    "achieved_occupancy": (["sm__warps_active.avg.pct_of_peak_sustained_active"], ["Achieved Occupancy"]),
    "theoretical_occupancy": (["sm__maximum_warps_per_active_cycle_pct"], ["Theoretical Occupancy"]),
    "registers": (["launch__registers_per_thread"], ["Registers Per Thread"]),
    "block_size": (["launch__block_size"], ["Block Size"]),
    "grid_size": (["launch__grid_size"], ["Grid Size"]),
    "waves_per_sm": (["launch__waves_per_multiprocessor"], ["Waves Per SM"]),
    "dram_read_bytes": (["dram__bytes_read.sum"], []),
    "dram_write_bytes": (["dram__bytes_write.sum"], []),
    "ld_sectors": (["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"], []),
    "ld_requests": (["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"], []),
    "st_sectors": (["l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"], []),
    "st_requests": (["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"], []),
    "cycles_per_issue": (["smsp__average_warp_latency_per_inst_issued.ratio"], ["Warp Cycles Per Issued Instruction"]),
}

_STALL_FAMILIES = (  # (regex, what the number means), most useful first
    (re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$"), "cycles per issued instruction"),
    (re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+?)\.ratio$"), "cycles per issued instruction"),
    (re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+?)$"), "samples"),
    (re.compile(r"^smsp__warp_issue_stalled_(\w+?)_per_warp_active\.pct$"), "% of active warp cycles"),
)


def _value(metrics: dict, names: list):
    for n in names:
        m = metrics.get(n)
        if m is not None and isinstance(m["value"], float):
            return m["value"], m.get("unit", "")
    return None, ""


# What a warp waits for in each state, after the "Warp Stall Reasons" of Nsight Compute's Profiling
# Guide (the names are the metrics' and the source page's); notebook 07 prints these beside its
# profile table, notebook 08 explains the ones that matter here in a table of its own.
STALL_MEANINGS = {
    "long_scoreboard": "a result of an L1TEX operation (global or local memory): a load not back yet",
    "short_scoreboard": "a result of an MIO operation other than L1TEX (shared memory, special math, ...)",
    "lg_throttle": "room in the queue of local/global memory instructions",
    "mio_throttle": "room in the MIO queue (memory input/output: shared memory, special math, dynamic branches)",
    "math_pipe_throttle": "a busy arithmetic pipe",
    "not_selected": "nothing: it was ready, but the scheduler issued another warp",
    "barrier": "the other warps of its block at a barrier (cuda.syncthreads())",
    "wait": "a fixed-latency dependency (plain arithmetic)",
    "drain": "its memory instructions to complete, after its last instruction (EXIT)",
    "dispatch_stall": "the dispatcher, which held back an instruction it had picked (a conflict or event)",
    "branch_resolving": "a branch target to be computed",
    "no_instruction": "its turn to fetch an instruction, or an instruction cache miss",
    "imc_miss": "a miss of the immediate-constant cache",
    "membar": "a memory barrier",
    "tex_throttle": "room in the queue of texture instructions",
    "sleeping": "all its threads blocked, yielded or asleep (nanosleep)",
    "misc": "a miscellaneous hardware reason",
    "gmma": "resources of a warpgroup matrix multiply (wgmma, sm_90)",
}
# The source page (ncu --page source) names the same states in its per-instruction columns "stall_<short>".
SOURCE_STALLS = {"long_sb": "long_scoreboard", "short_sb": "short_scoreboard", "lg": "lg_throttle",
                 "mio": "mio_throttle", "math": "math_pipe_throttle", "imc": "imc_miss", "no_inst": "no_instruction",
                 "sleep": "sleeping", "tex": "tex_throttle", "dispatch": "dispatch_stall"}


def stall_legend(reasons) -> list[str]:
    """One line per stall reason (in the order given, each once): its name and what the warp waits for."""
    seen = list(dict.fromkeys(reasons))
    width = max([len(r) for r in seen] + [0])
    return [f"{r:<{width}}  waits for {STALL_MEANINGS.get(r, '(not described here: see the Profiling Guide)')}"
            for r in seen]


def stall_reasons(metrics: dict) -> tuple[list, str]:
    """[(reason, value), ...] largest first (issuing, 'selected', left out) and what the values mean."""
    for rx, meaning in _STALL_FAMILIES:
        found = []
        for name, m in metrics.items():
            g = rx.match(name)
            if g and isinstance(m["value"], float) and not g.group(1).endswith("not_issued"):
                reason = g.group(1)
                if reason in ("selected",):
                    continue
                found.append((reason, m["value"]))
        if found:
            return sorted(found, key=lambda x: -x[1]), meaning
    return [], ""


def summarize(kernel: dict) -> dict:
    """The numbers of the table for one profiled kernel (None where ncu did not give them)."""
    met = kernel.get("metrics", {})
    out = {"kernel": kernel.get("kernel", ""), "id": kernel.get("id")}
    for field, (raw, details) in _FIELDS.items():
        v, unit = _value(met, raw + details)
        if v is not None and field == "duration_us":
            v = v * _TIME_US.get(unit.strip().lower(), 1e-3)  # ncu's base unit for time is ns
        elif v is not None and field.endswith("_bytes"):
            v = v * _BYTES.get(unit.strip().lower(), 1)
        out[field] = v
    for k in ("ld", "st"):
        s, r = out.pop(f"{k}_sectors"), out.pop(f"{k}_requests")
        out[f"{k}_sectors_per_request"] = s / r if s is not None and r else None
    stalls, meaning = stall_reasons(met)
    out["stalls"] = stalls
    out["stall_unit"] = meaning
    if out["block_size"] is None and kernel.get("block"):
        out["block_size"] = to_number(kernel["block"].strip("()").split(",")[0])
    return out


def main_kernel(kernels: list) -> dict | None:
    """The kernel that matters when a launch ran several: the longest."""
    if not kernels:
        return None
    return max(kernels, key=lambda k: summarize(k)["duration_us"] or 0.0)


# ---------------------------------------------------------------- tables

_COLUMNS = [  # (header, field, format)
    ("time us", "duration_us", "{:.0f}"),
    ("DRAM %", "dram_pct", "{:.0f}"),
    ("mem %", "memory_pct", "{:.0f}"),
    ("SM %", "sm_pct", "{:.0f}"),
    ("occ. %", "achieved_occupancy", "{:.0f}"),
    ("theo. %", "theoretical_occupancy", "{:.0f}"),
    ("regs", "registers", "{:.0f}"),
    ("ld sec/req", "ld_sectors_per_request", "{:.1f}"),
    ("st sec/req", "st_sectors_per_request", "{:.1f}"),
]


def rows(summaries: dict) -> list[dict]:
    """Tidy rows (list of dicts), one per version: what a DataFrame would hold."""
    out = []
    for name, s in summaries.items():
        if s is None:
            continue
        r = {"version": name, **{k: v for k, v in s.items() if k not in ("stalls",)}}
        r["top_stalls"] = ", ".join(f"{reason} {val:.1f}" for reason, val in s["stalls"][:3])
        out.append(r)
    return out


def table(summaries: dict, *, width: int | None = None) -> str:
    """A fixed-width text table of summaries (name -> summarize(...)), versions as rows; the name column is
    as wide as the longest name (so a marker such as "(live)" at its end stays readable)."""
    width = width or max([len("version")] + [len(str(k)) for k in summaries])
    head = f"{'version':<{width}} " + " ".join(f"{h:>10}" for h, _, _ in _COLUMNS) + "  top stalls"
    lines = [head, "-" * len(head)]
    for r in rows(summaries):
        cells = []
        for _, field, fmt in _COLUMNS:
            v = r.get(field)
            cells.append(f"{'-' if v is None else fmt.format(v):>10}")
        lines.append(f"{r['version'][:width]:<{width}} " + " ".join(cells) + f"  {r['top_stalls']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- recorded profiles


def recorded_gpus() -> list[str]:
    if not NCU_DIR.exists():
        return []
    return sorted(d.name for d in NCU_DIR.iterdir() if d.is_dir() and any(d.glob("*.csv")))


def load_recorded(gpu: str | None = None) -> dict | None:
    """Profiles committed under data/ncu/<gpu>/ (index.json + one raw CSV per version).

    Returns ``{"gpu", "meta", "versions": {name: {"file", "kernels", "summary", ...}}, "dir", "dates"}``
    (``dates``: the days the versions were profiled, each version's own date or the run's)
    or None when nothing is recorded. ``gpu`` defaults to results.default_gpu() (the GPU in hand,
    the recorded GPU whose notebooks ran last, or $NF4LAB_RESULTS_GPU) when it has profiles, else the folder
    with the most files: compare ``gpu`` with results.current_gpu() before calling them this machine's.
    """
    gpus = recorded_gpus()
    if not gpus:
        return None
    if gpu is None:
        from . import results

        want = results.default_gpu()
        gpu = want if want in gpus else max(gpus, key=lambda g: len(list((NCU_DIR / g).glob("*.csv"))))
    d = NCU_DIR / gpu
    index = json.loads((d / "index.json").read_text()) if (d / "index.json").exists() else {}
    entries = index.get("versions") or [{"name": p.stem, "file": p.name} for p in sorted(d.glob("*.csv"))
                                        if not p.name.endswith(".source.csv")]
    versions = {}
    for e in entries:
        p = d / e["file"]
        if not p.exists():
            continue
        kernels = parse_csv(p.read_text())
        k = main_kernel(kernels)
        versions[e["name"]] = {**e, "path": str(p.relative_to(ROOT)), "kernels": kernels,
                               "summary": summarize(k) if k else None}
    _mark_changed_sources(versions)
    meta = index.get("meta", {})
    dates = sorted({v.get("date") or meta.get("date") for v in versions.values()} - {None})
    return {"gpu": gpu, "meta": meta, "versions": versions, "dir": str(d.relative_to(ROOT)), "dates": dates}


@functools.cache
def source_hashes(notebook: str) -> dict | None:
    """{version: provenance.source_hash(its launch)} for one step notebook as it is now: the hash that
    tools/profile_all.py stores beside each profile (``source_sha256``), so that a profile whose kernel the
    notebook has since changed is found by comparison, not by a note kept by hand. None when the notebook's
    kernel cells do not load here (nothing is then known about its kernels)."""
    import tempfile

    from . import provenance

    try:
        with tempfile.TemporaryDirectory(prefix="nf4lab_src_") as tmp:
            return {n: provenance.source_hash(f) for n, f in load_versions_with_source(notebook, Path(tmp)).items()}
    except Exception:
        return None


def _mark_changed_sources(versions: dict) -> None:
    """Give ``earlier_kernel`` to each recorded profile whose stored ``source_sha256`` differs from its
    notebook's kernel now (profiles recorded before hashes were stored keep index.json's own notes)."""
    for name, v in versions.items():
        want, nb = v.get("source_sha256"), v.get("notebook")
        if not want or not nb or v.get("earlier_kernel") or nb == "demo":
            continue
        hashes = source_hashes(nb)
        if hashes is None:
            continue
        now = hashes.get(name)
        if now is None:
            v["earlier_kernel"] = f"its notebook ({nb}) no longer defines this version"
        elif now != want:
            v["earlier_kernel"] = f"{nb}'s kernel source changed since (profiled {want}, now {now})"


def row_label(name: str, entry: dict, meta: dict | None = None) -> str:
    """A recorded profile's row name: the version, the date it was profiled, and whether the kernel profiled is
    the one its notebook teaches now (index.json marks a replaced one ``earlier_kernel``)."""
    date = (entry.get("date") or (meta or {}).get("date") or "undated").removesuffix(" UTC")
    return f"{name} [{date}, {'EARLIER kernel' if entry.get('earlier_kernel') else 'kernel taught now'}]"


def earlier_kernel_lines(rec: dict, indent: str = "  ") -> list[str]:
    """One line per recorded profile whose kernel its notebook has since replaced (index.json's
    ``earlier_kernel``), naming the version, the date it was profiled and what changed: notebooks 07 and
    08 print them above their tables, so that no such row is read as the kernel taught now."""
    return [f"{indent}EARLIER kernel: {name}, profiled {v.get('date')}: {v['earlier_kernel']}"
            for name, v in (rec or {}).get("versions", {}).items() if v.get("earlier_kernel")]


def ceiling_record(gpu: str | None) -> dict | None:
    """The copy ceiling and the traffic-matched bound recorded for one GPU (a name or its folder under
    data/results/), at 16384x16384 bf16, from notebook 07's run, else notebook 00's; None when that GPU
    has neither. A profile's DRAM throughput may be set beside these only when both are of the same GPU.

    Returns ``{"gpu", "notebook", "date", "label", "copy_gbps", "bound_gbps", "spec_peak_gbps"}`` (``bound_gbps``
    None in a run recorded before the bound existed; ``spec_peak_gbps``, the datasheet's DRAM peak the run recorded,
    None where it has none)."""
    from . import results
    from .bench import BOUND, COPY, SPEC_PEAK

    if not gpu:
        return None
    for nb in ("07_summary", "00_ceiling"):
        data = results.load(nb, results.gpu_slug(gpu))
        if data is None:
            continue
        got = {r["name"]: r for r in data["records"] if r.get("dtype") == "bf16" and r.get("shape") == [16384, 16384]
               and r.get("gbps")}
        if COPY in got:
            return {"gpu": data["meta"].get("gpu"), "notebook": nb, "date": data["meta"].get("date"),
                    "label": results.label(data["meta"]), "copy_gbps": got[COPY]["gbps"],
                    "bound_gbps": (got.get(BOUND) or {}).get("gbps"),
                    "spec_peak_gbps": (got.get(SPEC_PEAK) or {}).get("gbps") or data["meta"].get("spec_peak_gbps")}
    return None


def where_to_look(gpu: str | None, names=()) -> str:
    """Where a notebook sends a student to explain a timing of ``gpu`` (a run's meta["gpu"]) of the versions ``names``
    with Nsight Compute: notebook 08's recorded profiles where they are of that GPU, else 08's live profile on it,
    which profiles one version per execution (the one 08's ``VERSION`` names), naming the GPU and date of the
    profiles that are recorded (another GPU's counters need not explain this one's times)."""
    from . import results

    slug = None if gpu is None else results.gpu_slug(gpu)
    prof = load_recorded(slug if slug in recorded_gpus() else None)
    have = prof is not None and all(n in prof["versions"] for n in names)
    if have and prof["gpu"] == slug:
        return f"08's profiles of this GPU ({', '.join(prof['dates'])}) are where to look"
    which = ", ".join(f'"{n}"' for n in names) or "these kernels"
    live = ("08's live profile on this GPU is where to look: it profiles one version per execution, the one named by "
            f"`VERSION` in its live-profile cell (section 1), so set `VERSION` to each of {which} in turn, running 08 "
            "once for each")
    if prof is None:
        return live + " (no profile is recorded)"
    return (f"{live}; the recorded profiles are of the {prof['meta'].get('gpu', prof['gpu'])} "
            f"({', '.join(prof['dates'])}), whose counters need not explain this GPU's times")


def load_fixture() -> dict:
    """The hand-made example CSV of the tests: the format, NOT a measurement."""
    kernels = parse_csv(FIXTURE.read_text())
    return {"gpu": "fixture (not a measurement)", "meta": {"note": "hand-made example of ncu's CSV format"},
            "versions": {f"EXAMPLE {chr(65 + i)} (invented numbers)": {"kernels": [k], "summary": summarize(k)}
                         for i, k in enumerate(kernels)}}


# ---------------------------------------------------------------- source-level stalls


def hottest(prog: list) -> dict | None:
    """The instruction of a SASS listing (dicts with "samples", one per instruction, as notebook 08's ``program``
    reads them from a source page) with the most stall samples: a copy of it, with "share", its share of the
    listing's samples, and "offset", its address minus the listing's first (the first of equals wins); None for an
    empty listing."""
    if not prog:
        return None
    top = max(prog, key=lambda x: x["samples"])
    total = sum(x["samples"] for x in prog)
    return {**top, "share": top["samples"] / total if total else 0.0,
            "offset": top.get("addr", 0) - min(x.get("addr", 0) for x in prog)}


def parse_source_csv(text: str, top: int = 8) -> list[dict]:
    """Source lines with the most warp-stall samples, from ``ncu --page source --csv``.

    With ``--print-source cuda,sass`` (what tools/profile_all.py exports) ncu writes two
    preamble rows ("File Path", "Function Name"), then a header ``"Line No","Source",
    "Address","Source","Warp Stall Sampling (All Samples)",...``: a row with a line number
    is a Python source line (its samples summed over its instructions), the rows below it
    without one are its SASS instructions. SASS-only output has no line column.
    Returns ``[{"line", "source", "samples", "pct", "sass", "sass_samples"}]`` largest first,
    or [] when the format is not recognised.
    """
    rdr = list(csv.reader(io.StringIO(text)))
    hi = next((i for i, r in enumerate(rdr) if "Source" in [c.strip() for c in r]
               and any("Warp Stall Sampling (All" in c for c in r)), None)
    if hi is None:
        return []
    header = [c.strip() for c in rdr[hi]]
    src_cols = [i for i, h in enumerate(header) if h == "Source"]
    line_col = next((i for i, h in enumerate(header) if h in ("Line No", "# Line", "Line")), None)
    samp_col = next(i for i, h in enumerate(header) if "Warp Stall Sampling (All" in h)
    sass_col = src_cols[1] if len(src_cols) > 1 else (src_cols[0] if line_col is None else None)
    lines: dict = {}
    cur = None
    for r in rdr[hi + 1:]:
        if len(r) <= samp_col:
            continue
        v = to_number(r[samp_col]) or 0.0
        if line_col is not None and r[line_col].strip():
            key = r[line_col].strip()
            cur = lines.setdefault(key, {"line": key, "source": r[src_cols[0]].strip(), "samples": 0.0,
                                         "sass": "", "sass_samples": 0.0})
            cur["samples"] = max(cur["samples"], v)
        elif sass_col is not None and r[sass_col].strip() not in ("", "..."):
            ins = r[sass_col].strip()
            if line_col is None:
                cur = lines.setdefault(ins + str(len(lines)), {"line": "", "source": ins, "samples": v,
                                                               "sass": ins, "sass_samples": v})
            elif cur is not None and v > cur["sass_samples"]:
                cur["sass"], cur["sass_samples"] = ins, v
    out = [o for o in lines.values() if o["samples"]]
    total = sum(o["samples"] for o in out) or 1.0
    for o in out:
        o["pct"] = 100 * o["samples"] / total
    return sorted(out, key=lambda o: -o["samples"])[:top]


# ---------------------------------------------------------------- profiling one version


def _synthetic_case(shape, dtype, blocksize=64):
    """Inputs with the right sizes and plausible values, for profiling without bitsandbytes."""
    import math

    import numpy as np

    from ..harness.cases import Case, case_name
    from ..format.reference import LUTS

    n = math.prod(shape)
    rng = np.random.default_rng(0)
    nblocks = -(-n // blocksize)
    return Case(name=case_name(shape, dtype, "synthetic", 0, blocksize, "nf4"), shape=tuple(shape), dtype=dtype,
                dist="synthetic", seed=0, blocksize=blocksize, quant_type="nf4",
                packed=rng.integers(0, 256, -(-n // 2), dtype=np.uint8),
                absmax_q=rng.integers(0, 256, nblocks, dtype=np.uint8),
                absmax2=rng.uniform(0.5, 2.0, -(-nblocks // 256)).astype(np.float32),
                code2=np.linspace(-1, 1, 256, dtype=np.float32), offset=np.float32(0.05),
                expected=np.zeros(0, dtype=np.uint16), device="synthetic")


def _lineinfo_on():
    """Make every later @cuda.jit default to lineinfo=True (numba-cuda has no environment
    variable for it): ncu can then map stalls to the Python source lines."""
    from numba import cuda

    if getattr(cuda.jit, "_nf4lab_lineinfo", False):
        return
    orig = cuda.jit

    def jit(*args, **kwargs):
        if not kwargs.get("debug"):
            kwargs.setdefault("lineinfo", True)
        return orig(*args, **kwargs)

    jit._nf4lab_lineinfo = True
    cuda.jit = jit


def notebook_versions(path) -> list[str]:
    """Version names a step notebook defines (executes its kernel cells, compiles nothing)."""
    from ..harness import versions as _versions

    return list(_versions.load(path))


def step_versions(first: int = 1, last: int = 6) -> list[tuple]:
    """[(notebook stem, version name)] defined by the step notebooks, in order; a notebook whose
    kernel cells fail to load is skipped with a message."""
    from ..harness import versions as _versions

    found = []
    for path in sorted(_versions.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if not first <= int(path.name[:2]) <= last:
            continue
        try:
            found += [(path.stem, n) for n in notebook_versions(path)]
        except Exception as exc:
            print(f"  ! {path.name}: its kernel cells failed to load ({type(exc).__name__}: {exc}); skipped")
    return found


def load_versions_with_source(notebook: str, srcdir: Path) -> dict:
    """VERSIONS of one notebook, with each kernel cell compiled from a real file under
    ``srcdir`` (so that line info points at text ncu can show)."""
    from ..harness import versions as _versions

    return dict(getattr(_versions.load_module(notebook, srcdir), "VERSIONS", {}))


DEMO = "demo: per-byte reference kernel"


def demo_versions() -> dict:
    """One small bit-exact kernel defined here, to check the profiling pipeline before
    any notebook defines versions."""
    from numba import cuda, uint64

    from ..device import ops

    @cuda.jit
    def dequant_demo_per_byte(packed, absmax_q, absmax2, code2, offset, lut, out, nbytes, n):
        i = uint64(cuda.grid(1))
        if i >= nbytes:
            return
        byte = packed[i]
        j = uint64(2) * i
        blk = j >> uint64(6)   # notebook 01's block_scale, both operations rounded
        scale = ops.fadd_rn(ops.fmul_rn(code2[absmax_q[blk]], absmax2[blk >> uint64(8)]), offset)
        out[j] = ops.to_bf16_bits(lut[byte >> 4] * scale)
        if j + uint64(1) < n:
            out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * scale)

    def launch(b):
        dequant_demo_per_byte[(b.nbytes + 255) // 256, 256, b.stream](
            b.packed, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut, b.out, b.nbytes, b.n)

    return {DEMO: launch}


def drive(notebook: str, version: str, *, shape=(16384, 16384), dtype="bf16", warmup: int = 3,
          srcdir: str | None = None, synthetic: bool = False) -> dict:
    """The program ncu runs: build the case and buffers, warm up, then launch the version once
    between cuda.profile_start() and cuda.profile_stop(). Returns facts for the index."""
    import tempfile

    if config.lineinfo():
        _lineinfo_on()
    from numba import cuda

    from ..harness.buffers import make_buffers

    if notebook == "demo":
        vs = demo_versions()
    else:
        vs = load_versions_with_source(notebook, Path(srcdir or tempfile.mkdtemp(prefix="nf4lab_src_")))
    if version not in vs:
        raise KeyError(f"{notebook} defines no version {version!r} (it has: {', '.join(vs) or 'none'})")
    v = vs[version]
    launch, case = v if isinstance(v, tuple) else (v, None)
    how = "given by the notebook"
    if case is None:
        case = None if synthetic else _try_case(shape, dtype)
        how = "bitsandbytes case"
        if case is None:
            case, how = _synthetic_case(shape, dtype), "synthetic inputs (bitsandbytes not available)"
    b = make_buffers(case)
    for _ in range(warmup):
        launch(b)
    cuda.synchronize()
    cuda.profile_start()
    launch(b)
    cuda.synchronize()
    cuda.profile_stop()
    return {"shape": list(case.shape), "dtype": case.dtype, "case": how}


def _try_case(shape, dtype):
    try:
        from ..harness.cases import make_case

        return make_case(tuple(shape), dtype=dtype)
    except Exception as exc:  # bitsandbytes missing or failing: profile on synthetic inputs
        print(f"nf4lab.measure.profiling: no bitsandbytes case ({type(exc).__name__}: {exc}); using synthetic inputs",
              file=sys.stderr)
        return None


def profile_version(notebook: str, version: str, outdir, *, ncu: str | None = None, shape=(16384, 16384),
                    dtype="bf16", timeout: float = 300, source: bool = True, synthetic: bool = False) -> dict:
    """Profile one version under ncu; write ``<outdir>/<slug>.csv`` (raw page), ``.details.csv``
    and, if ``source``, ``.source.csv``; return the parsed kernels and the files.

    Raises NcuUnavailable when ncu is missing, refused or fails.
    """
    ncu = ncu or find_ncu()
    if ncu is None:
        raise NcuUnavailable("missing", "ncu not found (not on PATH, not under /usr/local/cuda or "
                             "/opt/nvidia/nsight-compute); set $NCU to its path")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    slug = version_slug(version)
    rep = outdir / f"{slug}.ncu-rep"
    target = [sys.executable, "-m", "nf4lab.measure.profiling", "drive", "--notebook", notebook, "--version", version,
              "--shape", "x".join(map(str, shape)), "--dtype", dtype, "--srcdir", str(outdir / "src")]
    if synthetic:
        target.append("--synthetic")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    files = {}
    lineinfo = True
    try:
        run_ncu(ncu_command(target, ncu=ncu, export=str(rep)), timeout=timeout, env=env)
    except NcuUnavailable as exc:
        if exc.reason == "failed" and "application returned an error" in str(exc).lower():
            # numba-cuda 0.30 fails to compile some kernels with lineinfo=True (NVVM: "Symbol name
            # with unsupported characters"): profile without line info rather than not at all.
            lineinfo = False
            env["NF4LAB_LINEINFO"] = "0"
            run_ncu(ncu_command(target, ncu=ncu, export=str(rep)), timeout=timeout, env=env)
        elif exc.reason == "failed" and "metric" in str(exc).lower():
            # an ncu that does not know one of the named metrics: sections only
            run_ncu(ncu_command(target, ncu=ncu, export=str(rep), metrics=()), timeout=timeout, env=env)
        else:
            raise
    raw = run_ncu(import_command(rep, ncu=ncu, page="raw"), timeout=120)
    files["raw"] = outdir / f"{slug}.csv"
    files["raw"].write_text(raw)
    try:
        det = run_ncu(import_command(rep, ncu=ncu, page="details"), timeout=120)
        files["details"] = outdir / f"{slug}.details.csv"
        files["details"].write_text(det)
    except NcuUnavailable:
        pass
    if source:
        for extra in (["--print-source", "cuda,sass"], ["--print-source", "sass"], []):
            try:
                src = run_ncu(import_command(rep, ncu=ncu, page="source", extra=extra), timeout=120)
            except NcuUnavailable:
                continue
            if src.strip():
                files["source"] = outdir / f"{slug}.source.csv"
                files["source"].write_text(src)
                break
    kernels = parse_csv(raw)
    return {"kernels": kernels, "files": {k: str(v) for k, v in files.items()}, "report": str(rep),
            "lineinfo": lineinfo}


def version_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:80] or "version"


def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m nf4lab.measure.profiling")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drive", help="the program ncu profiles (one version, one profiled launch)")
    d.add_argument("--notebook", required=True, help="notebook stem, or 'demo'")
    d.add_argument("--version", required=True)
    d.add_argument("--shape", default="16384x16384")
    d.add_argument("--dtype", default="bf16")
    d.add_argument("--srcdir", default=None)
    d.add_argument("--synthetic", action="store_true")
    t = sub.add_parser("table", help="print the table of a CSV file")
    t.add_argument("csv", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "drive":
        info = drive(args.notebook, args.version, shape=tuple(int(s) for s in args.shape.split("x")),
                     dtype=args.dtype, srcdir=args.srcdir, synthetic=args.synthetic)
        print("nf4lab.measure.profiling.drive:", json.dumps(info))
        return 0
    print(table({Path(p).stem: summarize(main_kernel(parse_csv(Path(p).read_text())) or {}) for p in args.csv}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
