import os

import numpy as np
import pytest

from nf4lab.harness import cases
from nf4lab.format import reference


def test_make_case_is_reproducible_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cases, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(cases, "COMMITTED_DIR", tmp_path / "none")
    a = cases.make_case((5, 77), "fp16", "heavy", seed=9)
    files = list(tmp_path.glob("*.npz"))
    assert [f.name for f in files] == [a.name + ".npz"]
    b = cases.make_case((5, 77), "fp16", "heavy", seed=9)  # from the cache
    c = cases.generate((5, 77), "fp16", "heavy", seed=9)   # regenerated
    for x in (b, c):
        assert np.array_equal(a.packed, x.packed) and np.array_equal(a.expected, x.expected)
        assert x.shape == (5, 77) and x.dtype == "fp16" and x.n == 385
    assert a.packed.size == 193 and a.nblocks == 7 and a.absmax2.size == 1 and a.code2.size == 256


def test_codes_distribution_uses_all_16_codes_in_every_block():
    case = cases.generate((4, 256), "bf16", "codes", seed=0)
    codes = reference.unpack_codes(case.packed, case.n).reshape(-1, 64)
    assert all(np.unique(row).size == 16 for row in codes)


def test_heavy_tails_span_orders_of_magnitude():
    case = cases.generate((64, 512), "fp32", "heavy", seed=0)
    w = np.abs(cases._weights((64, 512), "heavy", 0, 64).numpy()).reshape(-1, 64).max(axis=1)
    assert w.max() / w.min() > 100
    # Nested statistics quantize absmax - offset with 8 bits per group: small blocks next to
    # huge ones come back with a coarse, even negative, scale. bitsandbytes does this too,
    # and a bit-exact kernel must reproduce it.
    absmax = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
    assert (absmax < 0).any()


@pytest.mark.parametrize("kwargs, param", [
    (dict(shape=(0, 5)), "shape"), (dict(shape=(2, -1)), "shape"), (dict(shape=(1, 2, 3)), "shape"),
    (dict(shape="big"), "shape"), (dict(dtype="int8"), "dtype"), (dict(blocksize=48), "blocksize"),
    (dict(dist="uniformish"), "dist"), (dict(quant_type="int4"), "quant_type"), (dict(seed=-1), "seed"),
])
def test_bad_requests_name_the_parameter_and_write_nothing(kwargs, param, tmp_path, monkeypatch):
    monkeypatch.setattr(cases, "CACHE_DIR", tmp_path)
    args = dict(shape=(3, 5))
    args.update(kwargs)
    with pytest.raises(ValueError, match=param):
        cases.make_case(**args)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cases, "CACHE_DIR", tmp_path)
    case = cases.generate((3, 5), "bf16", "randn", 0)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(KeyboardInterrupt):
        cases._save_atomic(case, tmp_path / "x.npz")
    assert list(tmp_path.iterdir()) == []


def test_committed_cases_load_and_match_reference():
    found = sorted(cases.COMMITTED_DIR.glob("*.npz"))
    assert found, "small committed cases are expected under data/cases/"
    for p in found:
        case = cases._load(p)
        assert np.array_equal(reference.dequantize_case(case), case.expected), p.name


def test_quant_state_round_trip_through_bitsandbytes():
    import bitsandbytes.functional as F

    case = cases.generate((31, 67), "bf16", "heavy", seed=4)
    packed, qs = case.quant_state("cpu")
    out = F.dequantize_4bit(packed, qs)
    assert np.array_equal(out.reshape(-1).view(__import__("torch").int16).numpy().view(np.uint16), case.expected)


def test_heavy_fp16_weights_past_its_range_are_scaled_into_it(monkeypatch):
    """fp16's largest finite value is 65504. The 16384x16384 heavy case's tail reached 100153: in fp16 those weights
    were inf, bitsandbytes' offset inf and every output NaN, so that case compared NaN with NaN (notebook 06 printed
    "0 infinities" of an all-NaN output). Weights past half the range are scaled into it: finite, still near the top."""
    real = cases._weights
    monkeypatch.setattr(cases, "_weights", lambda *a: real(*a) * 1e3)   # this small case's tail then passes 65504
    assert float(real((31, 67), "heavy", 0, 64).abs().max()) * 1e3 > 65504
    out = cases.generate((31, 67), "fp16", "heavy", seed=0).expected.view(np.float16).astype(np.float64)
    assert np.isfinite(out).all() and np.abs(out).max() > 1e4
    bf = cases.generate((31, 67), "bf16", "heavy", seed=0)               # bf16's range holds it: not scaled
    w = real((31, 67), "heavy", 0, 64) * 1e3
    assert np.abs(reference.bits_to_f32(bf.expected, "bf16")).max() > 0.5 * float(w.abs().max())


def test_a_cached_case_with_nan_outputs_is_made_again(tmp_path, monkeypatch):
    """A cache written before the scaling above may hold the all-NaN case: make_case makes it again."""
    monkeypatch.setattr(cases, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(cases, "COMMITTED_DIR", tmp_path / "none")
    good = cases.make_case((5, 77), "fp16", "heavy", seed=9)
    bad = cases._load(tmp_path / f"{good.name}.npz")
    bad.expected = np.full_like(bad.expected, 0x7E00)                    # fp16 NaN everywhere
    cases._save_atomic(bad, tmp_path / f"{good.name}.npz")
    again = cases.make_case((5, 77), "fp16", "heavy", seed=9)
    assert np.array_equal(again.expected, good.expected)
