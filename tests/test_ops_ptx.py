"""Device ops: the Python twins equal the reference, and the device versions emit the intended PTX."""
import numpy as np
import pytest
from numba import cuda, float32, uint64

import nf4lab
from nf4lab import arch
from nf4lab.device import ops
from nf4lab.measure import ptx
from nf4lab.format import reference


def test_twins_round_like_the_reference():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(3000) * np.exp(rng.uniform(-20, 20, 3000))).astype(np.float32)
    bf = np.array([int(ops.bf16_bits_py(v)) for v in x], np.uint16)
    assert np.array_equal(bf, reference.f32_to_bf16_bits(x))
    f16 = np.array([int(ops.f16_bits_py(v)) for v in x], np.uint16)
    assert np.array_equal(f16, reference.f32_to_bits(x, "fp16"))


@pytest.mark.skipif(not nf4lab.SIMULATOR, reason="twins are what the simulator runs")
def test_twin_pack_order_and_fused_free_arithmetic():
    lo, hi = np.float32(1.0), np.float32(-2.0)
    packed = int(ops.pack_bf16x2(lo, hi))
    assert packed & 0xFFFF == 0x3F80 and packed >> 16 == 0xC000
    a, b, c = np.float32(1.1), np.float32(3.3), np.float32(-3.63)
    assert ops.fadd_rn(ops.fmul_rn(a, b), c) == np.float32(np.float32(a * b) + c)


@pytest.mark.skipif(not nf4lab.SIMULATOR, reason="the simulator twin checks alignment")
def test_misaligned_vector_access_is_refused_in_the_simulator():
    buf = cuda.to_device(np.zeros(16, np.uint32))

    @cuda.jit
    def k(a, i):
        x, y, z, w = ops.load_u32x4(a, i)
        ops.store_u32x4(a, i, x, y, z, w)

    k[1, 1](buf, 4)  # aligned: fine
    with pytest.raises(RuntimeError, match="misaligned"):
        k[1, 1](buf, 2)
    with pytest.raises(IndexError):
        k[1, 1](buf, 16)


@cuda.jit
def _probe(packed_u32, out_u32, out16, absmax2, n):
    i = uint64(cuda.grid(1))
    if i < n:
        a, b, c, d = ops.load_u32x4(packed_u32, i * uint64(4))
        s = ops.fadd_rn(ops.fmul_rn(absmax2[0], absmax2[1]), absmax2[2])
        x = ops.pack_bf16x2(float32(a) * s, float32(b))
        y = ops.pack_f16x2(float32(c), float32(d))
        ops.store_u32x4(out_u32, i * uint64(4), x, y, ops.float_bits(s), d)
        out16[i] = ops.to_bf16_bits(s) + ops.to_f16_bits(s)


SIG = "(uint32[::1], uint32[::1], uint16[::1], float32[::1], uint64)"


@pytest.fixture(scope="module")
def probe_ptx():
    return nf4lab.compile_ptx(_probe, SIG)


def test_ptx_has_the_vector_accesses_and_conversions(probe_ptx):
    s = ptx.summary(probe_ptx)
    assert s["ld.global.v4"] == 1 and s["st.global.v4"] == 1
    assert s["fma"] == 0 and s["mul.rn.f32"] == 1
    if arch.has_cvt_bf16(nf4lab.runtime.target_cc()):
        assert s["cvt.rn.bf16x2"] == 1 and s["cvt.rn.f16x2"] == 1
        ptx.check(probe_ptx, present=[r"^add\.rn\.f32", r"cvt\.rn\.bf16\.f32", r"cvt\.rn\.f16\.f32"], absent=[r"^fma"])
    else:  # the T4's paths (NF4LAB_ARCH=sm_75): bf16 rounded in integers, f16x2 as two scalar conversions
        assert s["cvt.rn.bf16x2"] == 0 and s["cvt.rn.f16x2"] == 0
        ptx.check(probe_ptx, present=[r"^add\.rn\.f32", r"cvt\.rn\.f16\.f32"], absent=[r"^fma", r"cvt\.rn\.bf16"])


def test_plain_multiply_add_is_contracted_to_fma():
    """The reason ops.fmul_rn/fadd_rn exist: numba fuses a * b + c."""
    @cuda.jit
    def k(x, out):
        out[0] = x[0] * x[1] + x[2]

    p = nf4lab.compile_ptx(k, "(float32[::1], float32[::1])")
    assert ptx.count(p, r"^fma\.rn\.f32") == 1


def test_check_reports_missing_and_forbidden(probe_ptx):
    with pytest.raises(AssertionError, match="missing"):
        ptx.check(probe_ptx, present=[r"^ld\.shared"])
    with pytest.raises(AssertionError, match="must not"):
        ptx.check(probe_ptx, absent=[r"^st\.global\.v4"])


def test_device_helper_and_constants_travel_to_the_compiler():
    lut = tuple(float32(v) for v in reference.NF4_LUT)

    @cuda.jit(device=True, inline="always")
    def scale(a, b, c):
        return ops.fadd_rn(ops.fmul_rn(a, b), c)

    @cuda.jit
    def k(x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = scale(x[0], x[1], x[2]) * lut[i & 15]

    p = nf4lab.compile_ptx(k, "(float32[::1], float32[::1])")
    assert ptx.count(p, r"^mul\.rn\.f32") == 1 and ptx.count(p, r"^fma") == 0


def test_compile_errors_are_reported():
    @cuda.jit
    def broken(x):
        x[0] = undefined_name  # noqa: F821

    with pytest.raises(Exception, match="undefined_name|NameError|Untyped"):
        nf4lab.compile_ptx(broken, "(float32[::1],)")


@pytest.mark.parametrize("store, hint", [(ops.store_u32x4, False), (ops.store_u32x4_cs, True)])
def test_ops_held_in_variables_compile_to_themselves(store, hint):
    """A kernel may hold an op in a closure variable (as nf4lab.kernels.fastkernel does) instead of
    naming ops.store_u32x4: the PTX must still show that op's own store, not a sibling's."""
    @cuda.jit
    def k(out_u32):
        store(out_u32, uint64(0), 1, 2, 3, 4)

    p = nf4lab.compile_ptx(k, "(uint32[::1],)")
    assert ptx.count(p, r"^st\.global\.cs\.v4") == (1 if hint else 0)
    assert ptx.count(p, r"^st\.global(\.cs)?\.v4\.(u32|b32)") == 1


def test_no_two_device_ops_share_a_twin():
    """compile_ptx finds device ops by the identity of their simulator twins: aliases are ambiguous."""
    import collections

    from nf4lab.device import warp_ops

    seen = collections.defaultdict(list)
    for mod in (ops, warp_ops):
        for name in mod.DEVICE_OPS:
            seen[id(getattr(mod, name))].append(f"{mod.__name__}.{name}")
    assert [v for v in seen.values() if len(v) > 1] == []


def test_ptx_summary_counts_16_byte_loads_with_cache_hints():
    """09's PTX evidence printed 'ld.global.v4: 2' for a step of 4 weight loads: the summary missed the GEMV's
    streaming loads, which carry an L1 cache hint (ld.global.nc.L1::no_allocate.v4)."""
    from nf4lab.measure import ptx

    code = "\n".join(["ld.global.nc.L1::no_allocate.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];",
                      "ld.global.nc.v4.u32 {%r5, %r6, %r7, %r8}, [%rd2];", "ld.global.v4.u32 {%r9, %r10, %r11, %r12}, [%rd3];",
                      "ld.global.nc.L1::evict_last.L2::256B.v4.u32 {%r1, %r2, %r3, %r4}, [%rd4];", "ld.global.u32 %r13, [%rd5];"])
    s = ptx.summary(code)
    assert s["ld.global.v4"] == 4 and s["ld.global (any)"] == 5


def _stride_kernel(stride):
    @cuda.jit
    def k(a, n):
        i = uint64(cuda.grid(1))
        if stride == "gridsize":
            s = uint64(cuda.gridsize(1))
        elif stride == "gridDim*blockDim":
            s = uint64(cuda.gridDim.x * cuda.blockDim.x)
        elif stride == "u64 product":
            s = uint64(cuda.blockDim.x) * uint64(cuda.gridDim.x)
        elif stride == "gridDim":
            s = uint64(cuda.gridDim.x)
        elif stride == "gridDim*64":
            s = uint64(cuda.gridDim.x * 64)
        elif stride == "gridsize // 2":
            s = uint64(cuda.gridsize(1)) // uint64(2)
        elif stride == "gridsize - 1":
            s = uint64(cuda.gridsize(1)) - uint64(1)
        else:
            s = uint64(cuda.blockDim.x)
        while i < n:
            a[i] = float32(1.0)
            i += s
    return k


def _signed_stride_kernel():
    @cuda.jit
    def k(a, n):   # no uint64: LLVM may unroll with a trip count of its own (a division on sm_75)
        i = cuda.grid(1)
        while i < n:
            a[i] = float32(1.0)
            i += cuda.gridsize(1)
    return k


@pytest.mark.parametrize("cc", [(7, 5), (8, 0), (9, 0)])
@pytest.mark.parametrize("stride, spans", [("gridsize", True), ("gridDim*blockDim", True), ("u64 product", True),
                                           ("signed", True), ("gridDim", False), ("gridDim*64", False),
                                           ("blockDim", False), ("gridsize // 2", False), ("gridsize - 1", False)])
def test_reads_grid_size_tells_a_grid_wide_stride_from_a_smaller_one(stride, spans, cc):
    # 02's exercise 1: a stride smaller than the grid writes the same bits with repeated work; only the PTX shows it.
    # Each of the wrong ones reads %nctaid.x or %ntid.x too, and the last two their product: what counts is that
    # the product, unchanged, is what the loop adds to its index.
    kernel = _signed_stride_kernel() if stride == "signed" else _stride_kernel(stride)
    text = nf4lab.compile_ptx(kernel, "(float32[::1], int64)" if stride == "signed" else "(float32[::1], uint64)", cc=cc)
    assert ptx.reads_grid_size(text) is spans
