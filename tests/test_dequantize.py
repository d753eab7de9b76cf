"""nf4lab.dequantize against bitsandbytes, bit for bit; the CUDA kernels in the simulator; bad input.

Bits are compared as integers (np.array_equal on int views), never with a tolerance.
"""
import math

import numpy as np
import pytest
import torch

import nf4lab
from nf4lab.kernels import dequant, fastkernel as fk
from nf4lab.lesson import reference as R

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
    i // 2 for even i, the low one for odd i; then rounded to the output dtype (numpy: RNE)."""
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
    want16 = formula_numpy(fp16[0].numpy(), fp16[1].absmax.numpy(), bs, n, lut, np.float16)
    got16 = nf4lab.dequantize(*fp16).numpy().reshape(-1)
    assert np.array_equal(np.abs(got16).view(np.int16), np.abs(want16).view(np.int16))
    if dequant.bnb_cpu_path(shape, bs) == "avx512":
        theirs = F.dequantize_4bit(packed, qs).numpy().reshape(-1)
        # If this fails, bitsandbytes fixed its AVX-512 indexing: update README "Drop-in" and dequant.py.
        assert not np.array_equal(theirs, want), "bitsandbytes' AVX-512 path now gives the format's values"
        rows_ok = np.array_equal(theirs[: shape[-1]], want[: shape[-1]])
        assert rows_ok, "row 0 is indexed the same way by both (its blocks start at 0)"
