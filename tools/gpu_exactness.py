"""Bit-exactness on a CUDA GPU of every code path: run it as is and with NF4LAB_ARCH=sm_75.

    python tools/gpu_exactness.py                  # the paths this GPU compiles by default
    NF4LAB_ARCH=sm_75 python tools/gpu_exactness.py  # the T4's paths, on this GPU

1. The conversions themselves: ops.to_bf16_bits / pack_bf16x2 / to_f16_bits / pack_f16x2 on the
   GPU against their plain-Python twins, over 2^24 random float32 bit patterns and every special
   value class (zeros, subnormals, ties, the largest finite values, infinities, NaNs).
2. Every kernel version of notebooks 01-06 (the cells tagged ``kernel``), verified bit for bit
   against bitsandbytes on the full-size case, the edge shapes and the heavy/codes distributions
   (nf4lab.verify_versions; 06 for bf16, fp16 and fp32).
3. nf4lab.dequantize against bitsandbytes' CUDA kernel (tools/bench_dequantize.py's exactness
   matrix: nf4/fp4, nested or not, every blocksize, three dtypes, misaligned views, out=).

Writes data/results/<gpu>/exactness[_sm75].json; exits 1 on any mismatch.
"""
from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nf4lab  # noqa: E402  (before numba.cuda)
from nf4lab import arch  # noqa: E402
from nf4lab.measure import results
from nf4lab import runtime
from numba import cuda  # noqa: E402  (a module global: the simulator swaps it in kernels' globals)

STEP_NOTEBOOKS = ("01_naive", "02_grid_stride", "03_packed_u32", "04_vector_loads", "05_shared_lut",
                  "06_output_dtypes")


def special_floats():
    import numpy as np

    rng = np.random.default_rng(0)
    bits = [rng.integers(0, 2**32, size=1 << 24, dtype=np.uint64).astype(np.uint32)]
    for base in (0x00000000, 0x00800000, 0x3F800000, 0x477FE000, 0x7F7F0000, 0x7F800000, 0x7FC00000, 0x33000000):
        around = (np.arange(-4096, 4096, dtype=np.int64) + base) % 2**31
        bits += [around.astype(np.uint32), (around | 2**31).astype(np.uint32)]
    # bf16 ties (lower 16 bits exactly 0x8000) and fp16 ties at every exponent
    bits.append((rng.integers(0, 2**16, size=1 << 16, dtype=np.uint32) << 16) | np.uint32(0x8000))
    bits.append((rng.integers(0, 2**19, size=1 << 16, dtype=np.uint32) << 13) | np.uint32(0x1000))
    bits.append(np.array([0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF], dtype=np.uint32))
    return np.concatenate(bits).view(np.float32)


def check_conversions() -> dict:
    import numpy as np

    from nf4lab.device import ops

    @cuda.jit
    def convert(x, b1, f1, b2, f2, n):
        i = cuda.grid(1)
        if i < n:
            j = i ^ 1 if i ^ 1 < n else i
            b1[i] = ops.to_bf16_bits(x[i])
            f1[i] = ops.to_f16_bits(x[i])
            b2[i] = ops.pack_bf16x2(x[i], x[j])
            f2[i] = ops.pack_f16x2(x[i], x[j])

    x = special_floats()
    n = x.size
    outs = [cuda.device_array(n, np.uint16), cuda.device_array(n, np.uint16),
            cuda.device_array(n, np.uint32), cuda.device_array(n, np.uint32)]
    convert[(n + 255) // 256, 256](cuda.to_device(x), *outs, np.uint64(n))
    b1, f1, b2, f2 = (o.copy_to_host() for o in outs)
    u = x.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    want_b = np.where(nan, ops.BF16_NAN, ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)
    with np.errstate(over="ignore"):
        want_f = x.astype(np.float16).view(np.uint16)
    j = np.arange(n) ^ 1
    j[j >= n] = n - 1
    want_b2 = want_b.astype(np.uint32) | (want_b[j].astype(np.uint32) << 16)
    # fp16 NaN: the GPU gives its canonical NaN, numpy keeps the payload; there it must be a NaN, any NaN.
    def f16_mismatches(got, want, is_nan_input):
        got_nan = ((got & 0x7C00) == 0x7C00) & ((got & 0x3FF) != 0)
        return int(((got != want) & ~is_nan_input).sum() + (is_nan_input & ~got_nan).sum())

    res = {"inputs": int(n),
           "to_bf16_bits": int((b1 != want_b).sum()),
           "pack_bf16x2": int((b2 != want_b2).sum()),
           "to_f16_bits": f16_mismatches(f1, want_f, nan),
           "pack_f16x2": f16_mismatches((f2 & 0xFFFF).astype(np.uint16), want_f, nan)
           + f16_mismatches((f2 >> 16).astype(np.uint16), want_f[j], nan[j])}
    return res


def load_notebook_versions(stem):
    from nf4lab.harness import versions

    return versions.load(stem)


def check_notebooks() -> list[dict]:
    from nf4lab.harness.verification import VerificationError

    recs = []
    case = nf4lab.make_case()
    for stem in STEP_NOTEBOOKS:
        dtypes = ("bf16", "fp16", "fp32") if stem.startswith("06") else ("bf16",)
        try:
            vs = load_notebook_versions(stem)
            passed = nf4lab.verify_versions(vs, case, dtypes=dtypes, progress=False)
            for name, count in (passed or {}).items():
                recs.append({"kind": "exactness", "name": name, "notebook": stem, "cases": int(count),
                             "bit_exact": True})
        except VerificationError as exc:
            recs.append({"kind": "exactness", "name": stem, "notebook": stem, "bit_exact": False,
                         "error": str(exc)[:2000]})
        except Exception as exc:
            traceback.print_exc()
            recs.append({"kind": "exactness", "name": stem, "notebook": stem, "bit_exact": False,
                         "error": f"{type(exc).__name__}: {exc}"[:2000]})
    return recs


def check_dequantize() -> list[dict]:
    spec = importlib.util.spec_from_file_location("bench_dequantize", ROOT / "tools" / "bench_dequantize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [dict(r, name="nf4lab.dequantize " + r["name"]) for r in mod.exactness(quick=False)]


def main() -> int:
    if not runtime.ON_GPU:
        print("gpu_exactness: no CUDA GPU here", file=sys.stderr)
        return 2
    level = arch.name(arch.forced()) if arch.forced() else "none (the GPU's own paths)"
    print(f"{runtime.describe()}\nNF4LAB_ARCH: {level}")
    conv = check_conversions()
    print("conversions, mismatches per op:", conv)
    recs = [{"kind": "exactness", "name": f"ops.{k}", "inputs": conv["inputs"], "mismatches": v,
             "bit_exact": v == 0} for k, v in conv.items() if k != "inputs"]
    recs += check_notebooks()
    recs += check_dequantize()
    bad = [r for r in recs if not r["bit_exact"]]
    meta = dict(results.meta("bit for bit against the plain-Python twins, bitsandbytes' CUDA kernel "
                             "and verify_versions' cases"), nf4lab_arch=arch.name(arch.forced()) if arch.forced() else None)
    path = results.save({"meta": meta, "records": recs}, "exactness_sm75" if arch.forced() == (7, 5) else "exactness")
    print(f"{len(recs) - len(bad)} of {len(recs)} checks bit-exact; saved {path.relative_to(ROOT)}")
    for r in bad[:20]:
        print("NOT EXACT:", r["name"], r.get("shape", ""), r.get("dtype", ""), (r.get("error") or "")[:300])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
