"""SASS of the notebook 09 GEMV kernel without a GPU: registers and instructions per weight.

Compiles the kernel cells of notebooks/src/09_fused_gemv.py to PTX (NVVM, works in the simulator),
assembles it for sm_90 with ptxas (the PTX ``.version`` line is lowered to what the installed ptxas
accepts), disassembles with cuobjdump and counts the instructions of the kernel's hottest loop (the
largest backward branch), per weight: loop instructions / weights one lane handles per trip.

    python tools/sass_gemv.py                 # bf16 and fp16
    python tools/sass_gemv.py --dtypes bf16 --keep /tmp/sass   # also keep .ptx/.cubin/.sass

Needs ptxas (CUDA toolkit) and cuobjdump (the toolkit's, or ``pip install nvidia-cuda-cuobjdump``).
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import nf4lab  # noqa: E402  (first: decides GPU or simulator)

PTX_VERSION = "9.0"  # the highest PTX ISA version CUDA 13.0's ptxas accepts


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


def sass_of(ptx: str, workdir: Path, stem: str, arch="sm_90"):
    """(ptxas -v text, SASS text) of a PTX string."""
    ptx = re.sub(r"^\.version \d+\.\d+", f".version {PTX_VERSION}", ptx, flags=re.M)
    p = workdir / f"{stem}.ptx"
    p.write_text(ptx)
    cubin = workdir / f"{stem}.cubin"
    info = subprocess.run([find_tool("ptxas"), f"-arch={arch}", "-v", str(p), "-o", str(cubin)],
                          capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    (workdir / f"{stem}.sass").write_text(sass)
    return info, sass


def hottest_loop(sass: str):
    """Instructions (text) of the largest innermost loop: from a backward branch's target to the branch."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    where = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in where:
            s = where[int(m.group(1), 16)]
            loops.append((i - s + 1, s, i))
    # innermost loops (no other loop inside), the largest of them
    inner = [lp for lp in loops if not any(o is not lp and lp[1] <= o[1] and o[2] <= lp[2] for o in loops)]
    if not inner:
        return []
    _, s, e = max(inner)
    return [t for _, t in ins[s:e + 1]]


def opcode(text):
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0]


def report(kernel, sig, weights_per_trip, stem, workdir):
    ptx = nf4lab.compile_ptx(kernel, sig)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp16"])
    ap.add_argument("--keep", help="folder to keep the .ptx/.cubin/.sass files in")
    ap.add_argument("--src", default=str(ROOT / "notebooks" / "src" / "09_fused_gemv.py"))
    args = ap.parse_args(argv)
    import bench_gemv

    mod = bench_gemv.load_kernel(Path(args.src))
    wpt = getattr(mod, "ROWS", 1) * getattr(mod, "LANE_COLS", 32)
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp())
    workdir.mkdir(parents=True, exist_ok=True)
    for dtype in args.dtypes:
        r = report(mod.GEMV[dtype], mod.SIG, wpt, f"gemv_{dtype}", workdir)
        print(f"{dtype}: {r['registers']} registers, {r['spill_bytes']} B spilled, {r['smem_bytes']} B static smem; "
              f"hottest loop {r['loop_instructions']} SASS instructions for {wpt} weights per lane = "
              f"{r['per_weight']:.2f} per weight")
        print("   ", " ".join(f"{k}:{v}" for k, v in r["opcodes"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
