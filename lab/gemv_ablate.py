"""Where the shipped tensor-core GEMV's time goes: the same kernel with one stage left out (GPU; timing only).

The shipped kernel (nf4lab.kernels.gemv.make_kernel) is rebuilt with parts replaced by register work that
keeps every load alive but does not do the part's job, so the outputs are wrong and only the times mean
anything. lab/bench_gemv.py times them by name, beside the shipped kernel ("TC") in the same call:

- ``TC -lut``: each code byte's table lookup (a 32-bit shared load) returns its address word instead;
- ``TC -mma``: each ``mma.sync`` becomes an integer xor of its operands into the first accumulator;
- ``TC -x``: x's loads return their own index (no global load of x);
- combinations: ``TC -lut -mma``, ``TC -lut -x``, ``TC -mma -x``, ``TC -lut -mma -x`` (only the weight and
  statistics loads, their addressing and the block's reduction are left).

The time a variant saves is what that stage costs on the kernel's critical path, not its own length: stages
overlap, so the savings need not add up. What the runs measured is in lab/README.md.

    python lab/bench_gemv.py --shapes 4096x14336 14336x4096 8192x28672 --dtypes bf16 --ms 1 \\
        --variants TC 'TC -lut' 'TC -mma' 'TC -x' 'TC -lut -mma -x' --no-save
"""
from __future__ import annotations

import contextlib
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import nf4lab  # noqa: F401  (first: decides GPU or simulator)
from nf4lab.kernels import gemv, ops
from nf4lab.kernels.warp_ops import f32_from_bits
from numba import cuda, uint32

PARTS = ("lut", "mma", "x")
NAMES = ["TC " + " ".join(f"-{p}" for p in PARTS if p in combo) for combo in
         (("lut",), ("mma",), ("x",), ("lut", "mma"), ("lut", "x"), ("mma", "x"), ("lut", "mma", "x"))]


def _no_lut(base):
    @cuda.jit(device=True, inline="always")
    def look(tab, off):
        return uint32(off)

    return look


@cuda.jit(device=True, inline="always")
def _no_mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return c0 + f32_from_bits(a0 ^ a1 ^ a2 ^ a3 ^ b0 ^ b1), c1, c2, c3


@cuda.jit(device=True, inline="always")
def _no_x(x_u32, i):
    return uint32(i), uint32(i + 1), uint32(i + 2), uint32(i + 3)


@contextlib.contextmanager
def _patched(parts):
    """gemv's globals swapped for the left-out parts while a kernel is built and compiled."""
    saved = {k: getattr(gemv, k) for k in ("table_lookup", "step_ops", "mma_bf16", "mma_f16", "ops")}
    try:
        gemv.step_ops = saved["step_ops"].__wrapped__  # uncached: it must see the patched table_lookup
        if "lut" in parts:
            gemv.table_lookup = _no_lut
        if "mma" in parts:
            gemv.mma_bf16 = gemv.mma_f16 = _no_mma
        if "x" in parts:
            fake = types.ModuleType("ops_no_x")
            fake.__dict__.update(ops.__dict__)
            fake.load_u32x4 = _no_x
            fake.__name__ = "ops_no_x"
            gemv.ops = fake
        yield
    finally:
        for k, v in saved.items():
            setattr(gemv, k, v)


_KERNELS: dict = {}


def main() -> int:
    """Offline (no GPU: ptxas + cuobjdump, sm_90): registers and the hottest loop's SASS per ablation, M = 1 bf16,
    with the loads each one still issues, to show that a variant left the weight stream in place."""
    import tempfile

    from lab import gemv_reports

    work = tempfile.mkdtemp()
    for name in ["TC"] + NAMES:
        parts = tuple(name.split(" -")[1:])
        with _patched(parts):
            kern = gemv.make_kernel.__wrapped__(True, 1, 0x400, True)
            stem = name.replace(" ", "").replace("-", "_")
            r = gemv_reports.sass_report(kern, gemv.signature(), 128, stem, workdir=work)
        ops_ = r["opcodes"]
        count = lambda pre: sum(v for k, v in ops_.items() if k.startswith(pre))  # noqa: E731
        print(f"{name:<18} {r['registers']:>3} registers, {r['spill_bytes']} B spilled; hottest loop "
              f"{r['loop_instructions']} SASS ({r['per_weight']:.2f} per weight): LDG {count('LDG')}, "
              f"LDS {count('LDS')}, HMMA {count('HMMA')}", flush=True)
    return 0


def launch(g, parts):
    """Run the ablated kernel on GemvBuffers ``g`` (compiled on first use, with the parts swapped in)."""
    gemv.validate(g)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    key = (g.dtype, g.M, g.nested, parts)
    kern = _KERNELS.get(key)
    if kern is None:
        with _patched(parts):
            kern = gemv.make_kernel.__wrapped__(g.dtype == "bf16", g.M, gemv.probe_base(), g.nested)
            gemv.prepare(kern, args)  # compiles now, while the parts are swapped
        _KERNELS[key] = kern
    kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, gemv.SMEM](*args)


def variant_launches() -> dict:
    """{"TC -lut": launch, ...} for lab/bench_gemv.py."""
    return {name: (lambda g, p=tuple(name.split(" -")[1:]): launch(g, p)) for name in NAMES}


if __name__ == "__main__":
    sys.exit(main())
