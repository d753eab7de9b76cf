"""Bit-for-bit verification that explains what went wrong.

``verify(actual, case)`` compares raw bit patterns, not values within a tolerance:
an output is right only if every bit matches bitsandbytes. On a mismatch it raises
:class:`VerificationError` whose message says how many elements differ, shows the
first ones, the largest absolute and ULP differences, and a hint where the pattern
points at a known mistake (nibble order, FMA contraction, truncation, a missing
tail, a wrong block or group index, writing past the end).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..format import reference

POISON = {"bf16": 0x7FBF, "fp16": 0x7DFF, "fp32": 0x7FBFBFBF}  # quiet NaNs no kernel produces


class VerificationError(AssertionError):
    """A kernel's output is not bit-exact. The message teaches."""

    def __init__(self, report: "Report"):
        self.report = report
        super().__init__(str(report))


@dataclasses.dataclass
class Report:
    name: str
    dtype: str
    n: int
    n_diff: int
    first: list            # (index, expected value, actual value, expected bits, actual bits)
    max_abs: float
    max_ulp: int
    hints: list
    guard_written: int = 0
    n_nan: int = 0         # NaNs in the reference: where both are NaN, bit-exact says nothing about the values

    @property
    def ok(self) -> bool:
        return self.n_diff == 0 and self.guard_written == 0

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            nan = f", {self.n_nan:,} of them NaN in bitsandbytes' output" if self.n_nan else ""
            return f"{self.name}: bit-exact with bitsandbytes ({self.n:,} {self.dtype} values{nan})"
        w = 2 * reference.ITEMSIZE[self.dtype]
        lines = [f"{self.name}: NOT bit-exact with bitsandbytes"]
        if self.n_diff:
            lines.append(f"  {self.n_diff:,} of {self.n:,} elements differ ({100 * self.n_diff / self.n:.3g}%); "
                         f"largest difference {self.max_abs:.6g} absolute, {self.max_ulp} ulp")
            lines.append(f"  {'index':>10}  {'expected':>14}  {'actual':>14}   bits expected/actual")
            for i, e, a, eb, ab in self.first:
                lines.append(f"  {i:>10}  {e:>14.7g}  {a:>14.7g}   0x{eb:0{w}x} / 0x{ab:0{w}x}")
        if self.guard_written:
            lines.append(f"  {self.guard_written} element(s) past the end of the output were written")
        for h in self.hints:
            lines.append(f"  hint: {h}")
        return "\n".join(lines)


def to_bits(x, dtype: str) -> np.ndarray:
    """Raw bits of an output given as numpy array, numba device array or torch tensor."""
    if hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    elif type(x).__module__.startswith("torch"):
        x = x.detach()
        ints = {1: "uint8", 2: "int16", 4: "int32"}[x.element_size()]
        import torch

        x = x.contiguous().reshape(-1).view(getattr(torch, ints)).cpu().numpy()
    x = np.asarray(x).reshape(-1)
    bits_t = reference.BITS_DTYPE[dtype]
    if x.dtype.kind == "f":
        if x.dtype.itemsize != np.dtype(bits_t).itemsize:
            if dtype == "fp16" and x.dtype == np.float32:
                raise TypeError("got float32 values for an fp16 output; pass the raw fp16 output")
            raise TypeError(f"output of dtype {x.dtype} cannot hold {dtype} values")
        return x.view(bits_t)
    if x.dtype.itemsize == np.dtype(bits_t).itemsize:
        return x.view(bits_t)
    if x.dtype.itemsize * 2 == np.dtype(bits_t).itemsize or x.dtype.itemsize == 4:
        return np.ascontiguousarray(x).view(bits_t)
    raise TypeError(f"cannot read {dtype} bits from an array of {x.dtype}")


def _ulp_distance(a_bits, b_bits, dtype):
    width = 8 * reference.ITEMSIZE[dtype]
    sign = np.uint64(1) << np.uint64(width - 1)
    a = a_bits.astype(np.uint64)
    b = b_bits.astype(np.uint64)
    # Map sign-magnitude patterns onto a monotone integer line.
    a_ord = np.where(a & sign, sign - (a & (sign - np.uint64(1))), sign + a).astype(np.int64)
    b_ord = np.where(b & sign, sign - (b & (sign - np.uint64(1))), sign + b).astype(np.int64)
    return np.abs(a_ord - b_ord)


# Differences this small come from rounding, not indexing: a scale rounded once (FMA) instead of twice is
# off by an ulp, and lut[q] * scale then by up to two.
ROUNDING_ULPS = 2


def _hints(idx, exp_bits, act_bits, exp_f, act_f, ulp, n, dtype, blocksize):
    hints = []
    poison = POISON[dtype]
    unwritten = act_bits[idx] == poison
    if unwritten.any():
        where = idx[unwritten]
        if unwritten.all() and idx.size == n:
            hints.append(f"nothing was written: all {n:,} elements still hold the poison value (was the kernel "
                         "launched, with a grid of at least one block, and do its threads reach the stores?)")
        elif where.min() >= n - 2 * max(blocksize, 64) or (n - where.min()) < 4096 and unwritten.all():
            hints.append(f"{unwritten.sum():,} elements were never written, from index {where.min()}: the tail "
                         "(the last partial chunk) is skipped; handle the remainder that does not fill a "
                         "whole vector or thread")
        else:
            hints.append(f"{unwritten.sum():,} elements were never written (they still hold the poison value): "
                         "the grid is too small, a thread returns early, or the loop bound is off")
    written = ~unwritten
    if not written.any():
        return hints
    iw = idx[written]
    # Nibble order: swapped pairs match each other (pairs of equal values do not show up).
    even = iw[(iw % 2 == 0) & (iw + 1 < n)]
    if even.size and np.mean((act_bits[even] == exp_bits[even + 1]) &
                             (act_bits[even + 1] == exp_bits[even])) > 0.9:
        # Names the symptom and where the rule is, not the fix: exercises (01, 06) ask for the fix.
        hints.append("every pair is swapped: out[2i] and out[2i+1] hold each other's values. Which nibble "
                     "of a byte goes to the lower address? (notebook 00, section 2)")
    elif (iw % 2 == 0).all() or (iw % 2 == 1).all():
        hints.append("only every second element is wrong: look at how the two nibbles of a byte are split "
                     "(high nibble first) and where the second one is stored")
    u = ulp[written]
    if u.max() <= ROUNDING_ULPS:
        toward_zero = np.abs(act_f[iw]) < np.abs(exp_f[iw])
        if u.max() == 1 and toward_zero.all() and dtype != "fp32":
            hints.append("all differences are 1 ulp toward zero: the float32 -> 16-bit conversion truncates; "
                         "round to nearest even (add 0x7FFF + lsb before the shift, or cvt.rn)")
        else:
            hints.append(f"differences of at most {u.max()} ulp: the compiler probably fused a*b+c into one FMA (fma.rn.f32), "
                         "which rounds once where bitsandbytes rounds twice; use fmul_rn/fadd_rn from "
                         "nf4lab.device.ops, and check the rounding mode of the conversion")
    blocks = np.unique(iw // blocksize)
    nblocks = -(-n // blocksize)
    group = blocksize * reference.NESTED_BLOCKSIZE
    first_bad = int(iw.min())
    if u.max() > ROUNDING_ULPS and 0 < first_bad and first_bad % group == 0:
        hints.append(f"right up to index {first_bad}, the start of absmax2 group {first_bad // group}, wrong "
                     f"from there: the group index should be block // 256 ({group} weights per group)")
    elif u.max() > ROUNDING_ULPS and blocks.size < nblocks:
        hints.append(f"{blocks.size} of {nblocks} blocks are wrong, the others right: a block's scale comes from "
                     "the wrong block; check block = weight_index // blocksize (byte_index // (blocksize // 2)) "
                     "and the absmax_q / absmax2 indices")
    ratio_ok = (exp_f[iw] != 0) & np.isfinite(act_f[iw])
    if ratio_ok.sum() > 8 and u.max() > 1:
        r = act_f[iw][ratio_ok] / exp_f[iw][ratio_ok]
        if np.allclose(r, r[0], rtol=1e-2) and abs(r[0] - 1) > 1e-2:
            hints.append(f"actual / expected is about {r[0]:.4g} everywhere: a scale factor is wrong "
                         "(forgot the offset, or code2/absmax2 mixed up)")
    if np.isnan(act_f[iw]).any():
        hints.append("NaN in the output: a LUT index out of range or an uninitialised value")
    return hints


# A NaN's bits: exponent all ones, mantissa not zero, i.e. the magnitude bits above +inf's.
_ABS_INF = {"bf16": (0x7FFF, 0x7F80), "fp16": (0x7FFF, 0x7C00), "fp32": (0x7FFFFFFF, 0x7F800000)}


def nan_count(bits, dtype: str) -> int:
    """NaNs among raw output bits, counted on the bits (no float copy of the array)."""
    mask, inf = _ABS_INF[dtype]
    b = np.asarray(bits)
    return int(np.count_nonzero((b & b.dtype.type(mask)) > b.dtype.type(inf)))


def compare(actual, expected_bits, dtype: str, *, n: int | None = None, blocksize: int = 64,
            name: str = "kernel", show: int = 8) -> Report:
    """Compare an output with expected bits; ``actual`` may be longer than n (a guard region)."""
    exp = np.asarray(expected_bits).reshape(-1)
    n = exp.size if n is None else n
    act_all = to_bits(actual, dtype)
    if act_all.size < n:
        raise ValueError(f"output has {act_all.size} elements, expected {n}")
    act = act_all[:n]
    guard = act_all[n:]
    guard_written = int((guard != POISON[dtype]).sum()) if guard.size else 0
    diff = np.flatnonzero(act != exp)
    hints = []
    if guard_written:
        hints.append("the kernel wrote past the end of the output: a bounds check is missing "
                     "(or a vector store runs over the last partial chunk)")
    if diff.size == 0:   # the values are needed only to explain a difference
        return Report(name, dtype, n, 0, [], 0.0, 0, hints, guard_written, nan_count(exp, dtype))
    exp_f = reference.bits_to_f32(exp, dtype)
    act_f = reference.bits_to_f32(act, dtype)
    ulp = _ulp_distance(act[diff], exp[diff], dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        absdiff = np.abs(act_f[diff].astype(np.float64) - exp_f[diff].astype(np.float64))
    max_abs = float(np.nanmax(absdiff)) if np.isfinite(absdiff).any() else float("nan")
    first = [(int(i), float(exp_f[i]), float(act_f[i]), int(exp[i]), int(act[i])) for i in diff[:show]]
    hints += _hints(diff, exp, act, exp_f, act_f, ulp, n, dtype, blocksize)
    return Report(name, dtype, n, int(diff.size), first, max_abs, int(ulp.max()), hints, guard_written)


def verify(actual, case, *, name: str = "kernel", raise_on_error: bool = True) -> Report:
    """Check a kernel output against ``case.expected`` bit for bit.

    ``actual`` is a numpy array, numba device array or torch tensor holding the raw
    output (uint16 / bf16 / fp16 / uint32 / fp32). It may extend past n elements:
    that region (the guard) must still hold the poison value from :func:`poisoned_output`.
    Raises :class:`VerificationError` (with the explanation) unless ``raise_on_error`` is False.
    """
    if actual is None or not (hasattr(actual, "__array_interface__") or hasattr(actual, "__cuda_array_interface__")
                              or hasattr(actual, "__array__")):
        raise TypeError(f"verify(actual, case): actual must be the kernel's output array (numpy, numba device "
                        f"array or torch tensor), got {type(actual).__name__}")
    if not hasattr(case, "expected"):
        raise TypeError(f"verify(actual, case): case must be a Case from nf4lab.make_case(), got {type(case).__name__}")
    report = compare(actual, case.expected, case.dtype, n=case.n, blocksize=case.blocksize, name=name)
    if not report.ok and raise_on_error:
        raise VerificationError(report)
    return report


GUARD = 64  # elements of poison after the end, to catch out-of-bounds writes


def poisoned_output(n: int, dtype: str, guard: int = GUARD) -> np.ndarray:
    """Host buffer of n + guard elements filled with a NaN pattern no kernel writes.

    Lengths are rounded up so the buffer is a whole number of 16-byte vectors.
    """
    t = reference.BITS_DTYPE[dtype]
    per16 = 16 // np.dtype(t).itemsize
    total = -(-(n + guard) // per16) * per16
    return np.full(total, POISON[dtype], dtype=t)
