import numpy as np
import pytest

import nf4lab
import nf4lab.harness.verification
from nf4lab.format import reference
from nf4lab.harness.cases import generate
from nf4lab.harness.verification import POISON, VerificationError, compare, poisoned_output, verify


@pytest.fixture(scope="module")
def case():
    return generate((130, 129), "bf16", "codes", seed=1)


def test_exact_output_passes(case):
    r = verify(case.expected.copy(), case)
    assert r.ok and "bit-exact" in str(r)


def test_swapped_nibbles_are_named(case):
    bad = case.expected.copy()
    bad[0::2], bad[1::2] = case.expected[1::2][: bad[0::2].size], case.expected[0::2][: bad[1::2].size]
    bad[-1] = case.expected[-1]  # n is odd: the last element has no partner
    with pytest.raises(VerificationError) as e:
        verify(bad, case)
    msg = str(e.value)
    assert "each other's values" in msg and "elements differ" in msg


def test_one_ulp_points_at_fma(case):
    bad = case.expected.copy()
    bad[100:200:3] += 1
    r = verify(bad, case, raise_on_error=False)
    assert not r.ok and r.max_ulp == 1 and r.n_diff == 34
    assert any("FMA" in h for h in r.hints)
    assert "0x" in str(r) and "100" in str(r)  # first index and bit patterns shown


def test_truncation_is_named():
    case = generate((40, 64), "bf16", "randn", seed=2)
    f = reference.dequantize_f32(case.packed, reference.block_absmax(case.absmax_q, case.absmax2, case.code2,
                                                                     case.offset), case.n, 64)
    trunc = (f.view(np.uint32) >> 16).astype(np.uint16)
    r = verify(trunc, case, raise_on_error=False)
    assert not r.ok and any("truncates" in h for h in r.hints)


def test_unwritten_tail_and_guard_writes(case):
    buf = poisoned_output(case.n, "bf16")
    buf[: case.n - 7] = case.expected[: case.n - 7]
    r = verify(buf, case, raise_on_error=False)
    assert r.n_diff == 7 and any("tail" in h for h in r.hints)
    buf[: case.n] = case.expected
    assert verify(buf, case).ok
    buf[case.n + 2] = 0
    r = verify(buf, case, raise_on_error=False)
    assert not r.ok and r.guard_written == 1 and "past the end" in str(r)


def test_wrong_group_is_named():
    case = generate((2, 16384 + 320), "bf16", "randn", seed=6)
    bad = case.expected.copy()
    bad[16384:] = reference.f32_to_bf16_bits(reference.bits_to_f32(bad[16384:], "bf16") * np.float32(1.7))
    r = verify(bad, case, raise_on_error=False)
    assert not r.ok and any("group" in h for h in r.hints)


def test_poison_is_nan_and_not_a_real_output():
    for dt, p in POISON.items():
        assert np.isnan(reference.bits_to_f32(np.array([p]), dt)).all()


def test_accepts_torch_and_float_views(case):
    import torch

    t = torch.from_numpy(case.expected.view(np.int16).copy()).view(torch.bfloat16)
    assert verify(t, case).ok
    with pytest.raises(TypeError):
        compare(np.zeros(case.n, np.float64), case.expected, "bf16")


def _host_launch(skip_last_at=None):
    """A 'kernel' that writes bitsandbytes' answer from the host; optionally forgets the last
    weight whenever n is odd and at least skip_last_at (a tail bug only some shapes show)."""
    def launch(b):
        out = nf4lab.harness.verification.poisoned_output(b.n, b.dtype)
        out[: b.n] = b.case.expected
        if skip_last_at is not None and b.n % 2 and b.n >= skip_last_at:
            out[b.n - 1] = nf4lab.harness.verification.poisoned_output(1, b.dtype)[0]
        b.out.copy_to_device(out)
    return launch


def test_verify_versions_counts_every_case_of_every_version(case, capsys):
    passed = nf4lab.verify_versions({"a": _host_launch(), "b": _host_launch()}, case, dtypes=("bf16", "fp32"),
                                    shapes=[(1, 1), (3, 5)], dists=("codes",))
    assert passed == {"a": 8, "b": 8}   # 2 dtypes x (the main case + 2 shapes + 1 distribution)
    out = capsys.readouterr().out       # the main case's full report first, once per version and dtype
    shape = f"{case.shape[0]}x{case.shape[1]}"
    assert out.count(f"a [bf16 {shape} {case.dist}]") == 1 and out.count(f"b [fp32 {shape} {case.dist}]") == 1
    assert out.index(f"a [bf16 {shape}") < out.index("bit-exact: a (")


def test_verify_versions_stops_on_the_shape_that_breaks(case):
    with pytest.raises(nf4lab.VerificationError, match=r"tail \[bf16 31x67 randn\]"):
        nf4lab.verify_versions({"ok": _host_launch(), "tail": _host_launch(skip_last_at=100)}, case,
                               shapes=[(1, 1), (3, 5), (31, 67)], dists=())


def test_verify_versions_refuses_what_is_not_a_launch(case):
    with pytest.raises(TypeError, match="versions"):
        nf4lab.verify_versions({}, case)


def test_small_grid_warnings_are_silenced_while_verifying():
    import warnings

    import nf4lab.harness.buffers  # noqa: F401  (nf4lab first: it decides GPU or simulator)
    from numba.cuda.core.errors import NumbaPerformanceWarning  # numba-cuda's own class, what its launches raise

    from nf4lab.harness.buffers import quiet_small_grids

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_small_grids():
            warnings.warn("Grid size 1 will likely result in GPU under-utilization due to low occupancy.",
                          NumbaPerformanceWarning)
        warnings.warn("something else", NumbaPerformanceWarning)   # other warnings still show
    assert len(seen) == 1 and "something else" in str(seen[0].message)


def test_fma_in_fp32_is_not_called_a_wrong_block():
    """An FMA-contracted scale is off by an ulp in some blocks; in fp32 output that shows as 1-2 ulp
    differences in those blocks only, which once read as 'a block's scale comes from the wrong block'."""
    case = generate((64, 1024), "fp32", "randn", seed=3)
    q = case.absmax_q.astype(np.int64)
    groups = np.arange(q.size) >> 8
    a = case.code2[q].astype(np.float64) * case.absmax2[groups].astype(np.float64) + np.float64(case.offset)
    fused = a.astype(np.float32)                     # one rounding, as fma.rn.f32 gives
    out = reference.dequantize_f32(case.packed, fused, case.n, 64).view(np.uint32)
    r = verify(out, case, raise_on_error=False)
    assert not r.ok and r.max_ulp <= 2, r.max_ulp
    assert any("FMA" in h for h in r.hints), r.hints
    assert not any("wrong block" in h for h in r.hints), r.hints


def test_nan_in_the_reference_is_said_beside_bit_exact():
    """06's heavy fp16 case once had bitsandbytes' output all NaN: 'bit-exact' then compared NaN with NaN, and the
    report said nothing about it. It now counts them."""
    from nf4lab.harness.verification import compare

    exp = np.array([0x3C00, 0x7E00, 0x7E00, 0x0000], np.uint16)   # 1.0, NaN, NaN, 0.0 in fp16
    rep = compare(exp.copy(), exp, "fp16", name="k")
    assert rep.ok and rep.n_nan == 2
    assert "2 of them NaN" in str(rep)
    assert "NaN" not in str(compare(exp[[0, 3]].copy(), exp[[0, 3]], "fp16", name="k"))


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_nan_count_from_bits_matches_the_values(dtype):
    """compare() counts the reference's NaNs from their bits (no float copy of a 268M-element output on the pass
    path): for every 16-bit pattern, and fp32's patterns around each special value, the count is the float one."""
    from nf4lab.format import reference

    if dtype == "fp32":
        edges = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x00000000, 0x80000000], np.int64)
        bits = (edges[:, None] + np.arange(-3, 4)).reshape(-1).astype(np.uint32)
    else:
        bits = np.arange(1 << 16, dtype=np.uint16)
    want = int(np.isnan(reference.bits_to_f32(bits, dtype)).sum())
    assert nf4lab.harness.verification.nan_count(bits, dtype) == want
    rep = compare(bits, bits, dtype)
    assert rep.ok and rep.n_nan == want
