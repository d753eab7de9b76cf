"""The numpy reference equals bitsandbytes bit for bit: it is the spec kernels are held to."""
import numpy as np
import pytest
import torch
import bitsandbytes.functional as F

from nf4lab.format import reference
from nf4lab.harness.cases import generate


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("dist", ["randn", "heavy", "codes", "llm"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 33), (1, 65), (129, 127), (2, 16385)])
def test_reference_equals_bitsandbytes(dtype, dist, shape):
    case = generate(shape, dtype, dist, seed=3)
    bits = reference.dequantize_case(case)
    assert bits.dtype == case.expected.dtype
    assert np.array_equal(bits, case.expected)


@pytest.mark.parametrize("blocksize", [32, 128, 256, 1024, 4096])
def test_reference_other_blocksizes(blocksize):
    case = generate((37, 301), "bf16", "heavy", seed=5, blocksize=blocksize)
    assert np.array_equal(reference.dequantize_case(case), case.expected)


def test_reference_fp4_cpu_table():
    case = generate((33, 65), "fp32", "randn", seed=2, quant_type="fp4")
    assert np.array_equal(reference.dequantize_case(case), case.expected)


def test_a_single_fma_would_not_be_bit_exact():
    """Why the reference rounds twice: fusing code2*absmax2 + offset changes outputs."""
    case = generate((130, 129), "bf16", "heavy", seed=1)
    q, g = case.absmax_q, np.arange(case.nblocks) // 256
    fused = (case.code2[q].astype(np.float64) * case.absmax2[g] + case.offset).astype(np.float32)
    two = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
    assert (fused != two).any(), "expected at least one block scale to differ when fused"


def test_bf16_rounding_matches_torch_including_ties_nan_inf():
    rng = np.random.default_rng(0)
    u = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    # ties: low 16 bits exactly 0x8000, both parities of bit 16
    u[:1000] = (u[:1000] & 0xFFFF0000) | 0x8000
    x = u.view(np.float32)
    x = np.concatenate([x, np.array([np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38], np.float32)])
    ours = reference.f32_to_bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(x)
    assert np.array_equal(ours[finite], theirs[finite])
    assert np.isnan(reference.bits_to_f32(ours[~finite], "bf16")).all()


def test_unpack_codes_high_nibble_first():
    assert reference.unpack_codes(np.array([0xA5, 0x3C], np.uint8), 3).tolist() == [0xA, 0x5, 0x3]


def test_nf4_table_is_bitsandbytes_table():
    import inspect

    src = inspect.getsource(F.get_4bit_type)
    for v in reference.NF4_LUT[1:-1]:
        assert repr(float(v))[:8] in src
