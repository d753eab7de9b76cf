"""Where the shipped tensor-core GEMV's time goes: the same kernel with one stage left out (GPU; timing only).

The shipped kernel (nf4lab.kernels.gemv.make_kernel) is rebuilt with parts replaced by register work that
keeps every load alive but does not do the part's job, so the outputs are wrong and only the times mean
anything. lab/bench_gemv.py times them by name, beside the shipped kernel ("TC") in the same call:

- ``TC -lut``: each code byte's table lookup (a 32-bit shared load) returns its address word instead;
- ``TC -mma``: each ``mma.sync`` becomes an integer xor of its operands into the first accumulator;
- ``TC -x``: x's loads return their own index (no global load of x);
- ``TC -stats``: no statistics loads (M = 1 only; the scales are then whatever the buffer held);
- ``... D0``, ``D2``, ``D3``: with 0 (each step's loads issued when it is computed), 2 or 3 steps of loads in
  flight ahead instead of 1;
- ``+l1``: the weight loads without ``L1::no_allocate`` (a real variant: same results when nothing else is
  left out); ``+wide``: the weight loads in the batch's layout at M = 1 (loads only: the compute then reads
  the wrong words);
- ``+xg``: on the former kernel, x loaded from L1/L2 at each step (``make_kernel(xslot=False)``). The logs of
  2026-11-27 before 01:55 UTC ran before x's shared slot shipped: there a plain name is this former kernel and
  ``+xs`` the slot's;
- all of them on the kernel with byte-wise statistics loads (``make_kernel(words=False)``), as they were recorded
  before the statistics word shipped;
- combinations: ``TC -lut -mma``, ``TC -lut -x``, ``TC -mma -x``, ``TC -lut -mma -x`` (only the weight and
  statistics loads, their addressing and the block's reduction are left).

The time a variant saves is what that stage costs on the kernel's critical path, not its own length: stages
overlap, so the savings need not add up. What the runs measured is in lab/README.md.

    python -m lab.bench_gemv --shapes 4096x14336 14336x4096 8192x28672 --dtypes bf16 --ms 1 \\
        --variants TC 'TC -lut' 'TC -mma' 'TC -x' 'TC -lut -mma -x' --no-save
"""
from __future__ import annotations

import contextlib
import sys
import types

import nf4lab  # noqa: F401  (first: decides GPU or simulator)
from nf4lab.kernels import gemv
from nf4lab.device import gemv_loads, ops
from nf4lab.device.warp_ops import f32_from_bits
from numba import cuda, uint32

PARTS = ("lut", "mma", "x", "stats")
NAMES = ["TC " + " ".join(f"-{p}" for p in PARTS if p in combo) for combo in
         (("lut",), ("mma",), ("x",), ("stats",), ("lut", "mma"), ("lut", "x"), ("mma", "x"), ("lut", "mma", "x"),
          ("lut", "mma", "x", "stats"))]
NAMES += [f"{n} D{d}" for n in ("TC -lut -mma -x", "TC -lut -mma -x -stats") for d in (0, 2, 3)]
NAMES += [f"TC +xg{n[2:]}" for n in NAMES[:9]]
NAMES += ["TC +l1", "TC -lut -mma -x +l1", "TC -lut -mma -x -stats +l1", "TC -lut -mma -x +wide",
          "TC -lut -mma -x +wide +l1"]



def parse(name):
    """"TC -lut -x D2" -> (("lut", "x"), 2): the parts left out and the steps of loads in flight ahead."""
    words = name.split()[1:]
    parts = tuple(w[1:] for w in words if w[0] in "-+")
    D = next((int(w[1:]) for w in words if w.startswith("D")), 1)
    return parts, D


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
    """gemv's globals, and those of its step loads (nf4lab.device.gemv_loads), swapped for the left-out parts while a
    kernel is built and compiled."""
    saved = {k: getattr(gemv, k) for k in ("table_lookup", "step_ops", "mma_bf16", "mma_f16", "ops",
                                           "load_stream_u32x4")}
    loads = {k: getattr(gemv_loads, k) for k in ("table_lookup", "ops", "load_stream_u32x4")}
    try:
        plain = saved["step_ops"].__wrapped__  # uncached: it must see the patched table_lookup
        # fetch's M: 0 skips the statistics loads (their guard is q // 2 < M) in M = 1's layout; 2 is the batch's
        # layout (M > 1: each lane's 16-byte pieces 64 bytes apart, whole 32-byte sectors per instruction)
        fm = 0 if "stats" in parts else 2 if "wide" in parts else None
        gemv.step_ops = (lambda b, M, base, nested=True, words=False: plain(b, fm if M == 1 else M, base, nested)) \
            if fm is not None else plain
        if "l1" in parts:
            gemv.load_stream_u32x4 = gemv_loads.load_stream_u32x4 = ops.load_u32x4
        if "lut" in parts:
            gemv.table_lookup = gemv_loads.table_lookup = _no_lut
        if "mma" in parts:
            gemv.mma_bf16 = gemv.mma_f16 = _no_mma
        if "x" in parts:
            fake = types.ModuleType("ops_no_x")
            fake.__dict__.update(ops.__dict__)
            fake.load_u32x4 = _no_x
            fake.__name__ = "ops_no_x"
            gemv.ops = gemv_loads.ops = fake
        yield
    finally:
        for k, v in saved.items():
            setattr(gemv, k, v)
        for k, v in loads.items():
            setattr(gemv_loads, k, v)


_KERNELS: dict = {}


def main() -> int:
    """Offline (no GPU: ptxas + cuobjdump, sm_90): registers and the hottest loop's SASS per ablation, M = 1 bf16,
    with the loads each one still issues, to show that a variant left the weight stream in place."""
    import tempfile

    from lab import gemv_reports

    work = tempfile.mkdtemp()
    for name in ["TC"] + NAMES:
        parts, D = parse(name)
        with _patched(parts):
            kern = gemv.make_kernel.__wrapped__(True, 1, 0x400, True, D, gemv.BLOCKS_PER_SM, "xg" not in parts, False)
            stem = name.replace(" ", "").replace("-", "_")
            r = gemv_reports.sass_report(kern, gemv.signature(), 128, stem, workdir=work)
        ops_ = r["opcodes"]
        count = lambda pre: sum(v for k, v in ops_.items() if k.startswith(pre))  # noqa: E731
        print(f"{name:<18} {r['registers']:>3} registers, {r['spill_bytes']} B spilled; hottest loop "
              f"{r['loop_instructions']} SASS ({r['per_weight']:.2f} per weight): LDG {count('LDG')}, "
              f"LDS {count('LDS')}, HMMA {count('HMMA')}", flush=True)
    return 0


def launch(g, parts, D=1):
    """Run the ablated kernel on GemvBuffers ``g`` (compiled on first use, with the parts swapped in)."""
    gemv.validate(g)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    key = (g.dtype, g.M, g.nested, parts, D)
    kern = _KERNELS.get(key)
    if kern is None:
        with _patched(parts):
            kern = gemv.make_kernel.__wrapped__(g.dtype == "bf16", g.M, gemv.probe_base(), g.nested, D,
                                                gemv.BLOCKS_PER_SM, "xg" not in parts, False)
            gemv.prepare(kern, args)  # compiles now, while the parts are swapped
        _KERNELS[key] = kern
    kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, gemv.SMEM](*args)


def variant_launches() -> dict:
    """{"TC -lut": launch, ...} for lab/bench_gemv.py."""
    return {name: (lambda g, pd=parse(name): launch(g, *pd)) for name in NAMES}


if __name__ == "__main__":
    sys.exit(main())
