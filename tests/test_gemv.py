"""The fused-GEMV machinery (nf4lab.kernels.gemv) and notebook 09 run headless in the simulator."""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

import nf4lab  # noqa: F401  (first: may switch numba to the simulator)
from nf4lab.kernels import gemv
from nf4lab.harness import gemv_check
from nf4lab.measure import gemv_bench
from nf4lab.measure.ptx import compile_ptx
from nf4lab.format import reference
from numba import cuda, float32  # noqa: E402  (after nf4lab)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gc():
    return gemv_check.make_gemv_case(40, 192, "bf16", seed=2)


def test_case_matches_bitsandbytes_dequantization(gc):
    # w is bitsandbytes' own float32 dequantization: rounded to bf16 it is dequantize_4bit's output, bit for bit
    assert np.array_equal(reference.f32_to_bits(gc.w.reshape(-1), "bf16"), gc.case.expected)
    assert gc.x.shape == (1, 192) and gc.y64.shape == (1, 40)
    assert np.allclose(gc.y64, gc.x.astype(np.float64) @ gc.w.astype(np.float64).T)


def test_float32_sum_passes_and_bf16_rounding_is_within(gc):
    y32 = (gc.x @ gc.w.T).astype(np.float32)
    assert gemv_check.check(y32, gc).ok
    bits = reference.f32_to_bits(y32.reshape(-1), "bf16")
    assert gemv_check.check(bits, gc).ok
    # a reversed summation order passes too: order is not a bug
    rev = np.zeros(gc.N, np.float32)
    for k in range(gc.K - 1, -1, -1):
        rev = (rev + gc.x[0, k] * gc.w[:, k]).astype(np.float32)
    assert gemv_check.check(rev, gc).ok


@pytest.mark.parametrize("bug", ["nibbles swapped", "no offset", "missing lane", "wrong group", "truncated"])
def test_planted_bugs_fail_the_tolerance(gc, bug):
    absmax = reference.block_absmax(gc.absmax_q, gc.absmax2, gc.code2, gc.offset)
    codes = reference.unpack_codes(gc.packed, gc.N * gc.K)
    scale = np.repeat(absmax, 64)
    if bug == "nibbles swapped":
        w = gc.lut[codes.reshape(-1, 2)[:, ::-1].reshape(-1)] * scale
    elif bug == "no offset":
        w = gc.lut[codes] * np.repeat(absmax - gc.offset, 64)
    elif bug == "missing lane":
        w = gc.w.reshape(-1).copy().reshape(gc.N, gc.K)
        w[:, 32:64] = 0
    elif bug == "wrong group":
        w = gc.lut[codes] * np.repeat(np.roll(absmax, 1), 64)
    elif bug == "truncated":  # the output cut to bf16 by dropping bits instead of rounding: near 1 ulp
        y = (gc.x @ gc.w.T).astype(np.float32)
        t = (y.view(np.uint32) & 0xFFFF0000).view(np.float32)
        y_bad = t * np.float32(1 - 2 ** -7)  # and a relative error of 2^-7, twice the bf16 unit
        assert not gemv_check.compare(y_bad, gc).ok
        return
    y = (gc.x @ w.reshape(gc.N, gc.K).T).astype(np.float32)
    rep = gemv_check.compare(y, gc, name=bug)
    assert not rep.ok and rep.worst_ratio > 10, str(rep)
    with pytest.raises(gemv_check.GemvError):
        gemv_check.check(y, gc)


def test_tolerance_grows_with_k():
    x = np.ones((1, 1024), np.float32)
    w = np.ones((1, 1024), np.float32)
    t_short = gemv_check.tolerance(x[:, :64], w[:, :64], "fp16")
    t_long = gemv_check.tolerance(x, w, "fp16")
    # K * eps32 * sum|xw| grows like K^2 here; the output rounding like K
    assert t_long[0, 0] > 16 * t_short[0, 0]


def test_bitsandbytes_cpu_output_is_close(gc):
    yb = gemv_check.bnb_output(gc)
    rep = gemv_check.compare(yb, gc)
    # bitsandbytes rounds each weight to bf16 before multiplying: close, not always inside the float32 bound
    assert rep.worst_ratio < 20


def test_simulator_shuffle_twin():
    from nf4lab.kernels.gemv import shfl_xor_sync

    @cuda.jit
    def k(out):
        v = float32(cuda.threadIdx.x)
        v += shfl_xor_sync(0xFFFFFFFF, v, 16)
        v += shfl_xor_sync(0xFFFFFFFF, v, 8)
        v += shfl_xor_sync(0xFFFFFFFF, v, 4)
        v += shfl_xor_sync(0xFFFFFFFF, v, 2)
        v += shfl_xor_sync(0xFFFFFFFF, v, 1)
        if cuda.threadIdx.x % 32 == 0:
            out[cuda.threadIdx.x // 32] = v

    out = cuda.to_device(np.zeros(2, np.float32))
    k[1, 64](out)
    assert list(out.copy_to_host()) == [sum(range(32)), sum(range(32, 64))]


def test_layout_is_checked():
    def g(**kw):
        return types.SimpleNamespace(**{**dict(dtype="bf16", N=4, K=128, M=1, bs_shift=6, offset=np.float32(0)), **kw})

    with pytest.raises(ValueError, match="N\\*K"):
        gemv.validate(g(N=1 << 20, K=1 << 15))
    with pytest.raises(ValueError, match="multiple of 64"):
        gemv.validate(g(K=96))
    with pytest.raises(ValueError, match="blocksize 32"):
        gemv.validate(g(bs_shift=5))


def test_weight_bytes():
    assert gemv_bench.weight_bytes(4096, 4096) == 4096 * 4096 // 2 + 4096 * 64 + 4 * 1024 + 1024
    assert gemv_bench.unfused_bytes(2, 64) - gemv_bench.weight_bytes(2, 64) == 4 * 128


@pytest.mark.slow
def test_notebook_runs_in_the_simulator(notebook_twins):
    solution, student = notebook_twins("09_fused_gemv")
    assert "within the float32 tolerance" in solution
    assert "PASSED: exercise" in solution and "NOT PASSED" not in solution
    assert "NOT PASSED (not solved yet)" in student


def _case_buffers(N, K, dtype, M=1, seed=5, **kw):
    gc = gemv_check.make_gemv_case(N, K, dtype, M=M, seed=seed, **kw)
    return gc, gemv.make_gemv_buffers(gc)


# The shipped kernel (its mma, PRMT and table lookups have plain-Python twins, so the simulator runs it too) on
# small adversarial shapes (K a multiple of 64, as validate requires): K past a 256-column step by 64, 128
# and 192 columns, K below one step, K = 2048 + 64, rows past N, odd N, every batch M = 1..8, both dtypes, heavy
# tails, blocksize 128, all 16 codes, plain statistics, the persistent grid's later rounds (grid 1).
# (N, K, dtype, M, grid, case options)
CASES = [
    (20, 320, "bf16", 1, None, {}),
    (7, 192, "fp16", 3, None, {}),
    (11, 256, "bf16", 1, None, {"dist": "heavy", "x_dist": "heavy"}),
    (17, 576, "fp16", 8, None, {}),
    (6, 384, "bf16", 2, None, {"blocksize": 128}),
    (33, 448, "fp16", 1, 1, {"dist": "codes"}),        # one block for 3 tiles: the partial-sum double buffer flips
    (20, 320, "bf16", 1, None, {"nested": False}),     # plain statistics: one float32 absmax per block
    (9, 704, "fp16", 3, None, {"nested": False, "blocksize": 128, "dist": "heavy"}),
    (6, 2112, "bf16", 1, None, {}),                    # K = 2048 + 64: one lane's block in a row's last step
    (5, 64, "fp16", 1, None, {}),                      # K = one block
    (40, 128, "bf16", 2, 1, {"x_dist": "heavy"}),      # three tiles in one block, a batch
] + [(5, 128, ("bf16", "fp16")[m % 2], m, None, {}) for m in (4, 5, 6, 7)]


@pytest.mark.parametrize("N,K,dtype,M,grid,opts", CASES,
                         ids=[f"{c[0]}x{c[1]}-{c[2]}-M{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_kernel_within_tolerance(N, K, dtype, M, grid, opts):
    gc, g = _case_buffers(N, K, dtype, M=M, **opts)
    g.grid = grid
    gemv.launch(g)
    assert gemv_check.check(g.result(), gc, name=f"{N}x{K} {dtype} M={M} grid {grid} {opts}", rounded_table=True).ok


@pytest.mark.parametrize("N,K,dtype,M,grid,opts", [(33, 512, "fp16", 1, 1, {"dist": "codes"}),
                                                     (9, 768, "bf16", 3, None, {"dist": "heavy", "x_dist": "heavy"})])
def test_statistics_word_gives_the_byte_loads_bits(N, K, dtype, M, grid, opts):
    """The shipped kernel's statistics as one word per lane a step (lanes 0-15 a row's 4 absmax codes, 16-31 its
    absmax2, shuffled to the lanes that scale) and the byte-wise loads it keeps for other shapes hand the same
    values to the same arithmetic: the same bits, on a block that does 3 tiles (all 16 codes) and on a batch."""
    from nf4lab.kernels.fastkernel import address

    gc, g = _case_buffers(N, K, dtype, M=M, **opts)
    g.grid = grid
    assert gemv.words_apply(g.nested, g.bs_shift, g.K, address(g.absmax_q))
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    out = []
    for words in (True, False):
        g.y.copy_to_device(np.full(M * N, 0x7FBF, np.uint16))
        gemv.prepare(gemv.kernel(dtype, M, True, words), args)[g.grid or gemv.grid_size(N), gemv.THREADS, 0,
                                                                 gemv.SMEM](*args)
        out.append(g.result().copy())
    assert np.array_equal(out[0], out[1])
    assert gemv_check.check(out[0], gc, rounded_table=True).ok


def test_statistics_word_applies_only_where_a_step_is_whole_blocks_at_a_word():
    ok = gemv.words_apply
    assert ok(True, 6, 4096, 0x1000) and ok(True, 6, 256, 4)
    assert not ok(False, 6, 4096, 0x1000)      # plain statistics: float32 absmax per block
    assert not ok(True, 7, 4096, 0x1000)       # blocksize 128: 2 blocks a step
    assert not ok(True, 6, 4096 + 64, 0x1000)  # K not a multiple of 256: partial steps
    assert not ok(True, 6, 4096, 0x1002)       # absmax codes not 4-byte aligned: a 32-bit load would fault


def test_tensor_core_tolerance_is_needed_and_explained():
    """The table rounding is real (the fp32-table tolerance fails on a heavy-tailed case) and is all there is:
    against a float64 reference built from the bf16-rounded table the error is output rounding only."""
    from nf4lab.device import ops
    from nf4lab.format import reference

    gc, g = _case_buffers(11, 256, "bf16", dist="heavy", x_dist="heavy")
    gemv.launch(g)
    y = gemv_check.to_f32(g.result(), "bf16").reshape(1, -1).astype(np.float64)
    assert not gemv_check.compare(y.astype(np.float32), gc).ok
    lut_b = np.array([np.uint32(int(ops.bf16_bits_py(v)) << 16).view(np.float32) for v in gc.lut], np.float64)
    codes = np.stack([gc.packed >> 4, gc.packed & 15], -1).reshape(-1)[: gc.N * gc.K]
    absmax = reference.block_absmax(gc.absmax_q, gc.absmax2, gc.code2, gc.offset).astype(np.float64)
    ref = gc.x.astype(np.float64) @ (lut_b[codes] * np.repeat(absmax, gc.blocksize)[: gc.N * gc.K]).reshape(gc.N, gc.K).T
    s = np.abs(gc.x.astype(np.float64)) @ np.abs(gc.w.astype(np.float64)).T
    assert (np.abs(y - ref) <= gemv_check.UNIT_OUT["bf16"] * np.abs(ref) + 1e-4 * s).all()


def test_prmt_twin_and_table_offsets():
    """The simulator's byte-permute twin follows PTX's prmt on the selectors the kernel uses (bytes 0-7 of the two
    sources), and the four selectors of the table lookup give (byte j << 8) | lane8 for every byte of a word."""
    from nf4lab.device.warp_ops import _py_prmt

    a, b = 0x89ABCDEF, 0x01234567
    assert _py_prmt(a, b, 0x3210) == a and _py_prmt(a, b, 0x7654) == b
    assert _py_prmt(a, b, 0x0123) == 0xEFCDAB89 and _py_prmt(a, b, 0x4444) == 0x67676767
    for w in (0x00000000, 0xFFFFFFFF, 0x12A5F07C):
        for lane in (0, 17, 31):
            for j, sel in enumerate((0x5504, 0x5514, 0x5524, 0x5534)):
                assert _py_prmt(w, lane << 3, sel) == (((w >> (8 * j)) & 0xFF) << 8) | (lane << 3)


@pytest.mark.parametrize("cc", [(9, 0), (7, 5)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_ptx(cc, dtype):
    """sm_80+: 16 mma and 64 table lookups per step, no local memory, the base in the loads' immediate. sm_75 (a
    T4): fp16 as 32 m16n8k8 mmas, bf16 without mma (shuffles and FMAs), never a trap."""
    import nf4lab.measure.ptx  # noqa: F401

    ptx = nf4lab.measure.ptx.compile_ptx(gemv.kernel(dtype), gemv.signature(), cc=cc, launch_bounds=(256, 2))
    check, count = nf4lab.measure.ptx.check, nf4lab.measure.ptx.count
    check(ptx, present=[r"^prmt\.b32", r"^ld\.shared\.u32 %r\d+, \[%r\d+\+\d+\]"], absent=[r"\.f64", r"^trap"])
    if cc >= (8, 0) or dtype == "fp16":
        assert count(ptx, r"^prmt\.b32") == 64
        check(ptx, present=[], absent=[r"^ld\.local", r"^st\.local"])
    if cc >= (8, 0):
        check(ptx, present=[rf"^mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{dict(bf16='bf16', fp16='f16')[dtype]}"],
              absent=[r"^ld\.local", r"^st\.local"])
        assert count(ptx, r"^mma\.sync") == 16
    elif dtype == "fp16":
        assert count(ptx, r"^mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.f16\.f16\.f32") == 32
    else:  # the soft mma is long: NVVM leaves the loop over a step's two pieces rolled (32 prmt, local memory)
        assert count(ptx, r"^mma\.sync") == 0 and count(ptx, r"^shfl\.sync\.idx") - 4 in (8 * 16, 16 * 16)
    if cc >= (8, 0) or dtype == "fp16":   # the statistics word: its 4 shuffles, no byte loads of absmax codes
        assert count(ptx, r"^shfl\.sync\.idx") == 4 and count(ptx, r"^ld\.global\.u8") == 0


def test_nf4lab_arch_caps_the_mma(monkeypatch):
    """NF4LAB_ARCH=sm_75 compiles the T4's paths for any GPU, the mma's included, so that a run on an H100
    tests them: PTX for sm_90 then holds fp16's m16n8k8 and no mma at all for bf16."""
    import nf4lab.measure.ptx
    from nf4lab import arch

    monkeypatch.setenv(arch.ENV, "sm_75")                    # for the PTX subprocess of the simulator's runs
    for dtype, present in (("fp16", r"^mma\.sync\.aligned\.m16n8k8"), ("bf16", r"^shfl\.sync\.idx")):
        kern = gemv.make_kernel.__wrapped__(dtype == "bf16", 1, 0x400)   # a fresh dispatcher: nothing compiled before
        ptx = nf4lab.measure.ptx.compile_ptx(kern, gemv.signature(), cc=(9, 0), launch_bounds=(256, 2))
        nf4lab.measure.ptx.check(ptx, present=[present], absent=[r"^mma\.sync\.aligned\.m16n8k16"])


def test_shared_memory_fits_a_t4():
    """64 KB per block is a T4's (sm_75) limit: the table takes it all, everything else sits in its spare words
    (columns 32..63 of each 256-byte row), which the table's lanes 0..31 never touch."""
    assert gemv.SMEM == 64 * 1024
    used = {(e << 6) | lane for e in range(256) for lane in range(32)}
    code2 = {c + (c & 0xE0) + 32 for c in range(256)}
    xslots = {(r << 6) | 32 | w for r in range(16, 16 + 4 * gemv.W) for w in range(32)}   # warp_ops.x_slot_ops
    spare = {((i >> 4) << 6) | (128 << 6) | 32 | (i & 15) for i in range(2 * gemv.W * 16 * gemv.MAX_M)}
    parts = [used, code2, xslots, spare]
    assert max(set().union(*parts)) < gemv.SMEM // 4 and sum(map(len, parts)) == len(set().union(*parts))
    assert {w % 32 for w in code2} == set(range(32))   # data-dependent lookups: 32 banks, as a flat array's


def test_grid(monkeypatch):
    monkeypatch.setattr(nf4lab.runtime, "device_info", lambda: {"sms": 132})
    gemv._sm_count.cache_clear()
    try:
        assert gemv.grid_size(4096) == 256 and gemv.grid_size(14336) == 2 * 132 and gemv.grid_size(20) == 2
        assert gemv.grid_size(14336, sm_count=100) == 200   # another GPU's SM count, as lab/gemv_steps.py asks
    finally:
        gemv._sm_count.cache_clear()


def test_warps_a_tile_where_rounds_are_fewest(monkeypatch):
    """G warps a tile: fewer than W only where the grid's warps then take the tiles in no more time, and then the
    fewest (14336 rows: 896 tiles fill 264 blocks of 4 pairs of warps once, G = 2; 8192 rows: G = 4); never at M > 1."""
    monkeypatch.setattr(nf4lab.runtime, "device_info", lambda: {"sms": 132})
    gemv._sm_count.cache_clear()
    try:
        picks = {N: gemv.warps_a_tile(N, 1, gemv.grid_size(N)) for N in (1024, 4096, 8192, 14336, 128256)}
        assert picks == {1024: 8, 4096: 8, 8192: 4, 14336: 2, 128256: 8}
        assert gemv.warps_a_tile(14336, 2, gemv.grid_size(14336)) == gemv.W
        assert (gemv.warps_a_tile(256, 1, 2), gemv.warps_a_tile(192, 1, 2), gemv.warps_a_tile(40, 1, 1)) == (2, 4, 8)
    finally:
        gemv._sm_count.cache_clear()


@pytest.mark.parametrize("N,K,dtype,grid,G", [(256, 1024, "bf16", 2, 2), (192, 1024, "fp16", 2, 4)])
def test_shipped_launch_with_fewer_warps_a_tile(N, K, dtype, grid, G):
    """gemv.launch where warps_a_tile picks G < W (every group has a step: the "full" loop), as at 14336x4096."""
    gc, g = _case_buffers(N, K, dtype, dist="heavy")
    g.grid = grid
    assert gemv.warps_a_tile(N, 1, grid) == G and gemv.full_apply(True, 1, K, G)
    gemv.launch(g)
    assert gemv_check.check(g.result(), gc, rounded_table=True).ok


@pytest.mark.parametrize("N,K,dtype,G", [(40, 1024, "bf16", 2), (100, 512, "fp16", 4)])
def test_groups_of_warps_a_tile_sum_right(N, K, dtype, G):
    """lab's G knob: W // G tiles a block at once, each group of G warps with its own named barrier; one group idle
    (40 rows: 3 tiles for 4 groups) or groups with unequal tile counts (7 tiles for 2 groups) must still meet."""
    from lab import gemv_mma

    gc, g = _case_buffers(N, K, dtype, dist="heavy" if G == 2 else "codes")
    g.grid = 1
    gemv_mma.launch(g, G=G)
    assert gemv_check.check(g.result(), gc, rounded_table=True).ok


def test_read_bound_line_sets_the_read_bound_against_the_same_runs_copy_speed():
    """09's section 1 predicts times at copy speed; the line under section 7's table says, per shape, what share of
    the same run's copy speed a kernel that only reads the weight reaches (where it is far below 100%, that
    prediction does not hold for any kernel that reads the weight)."""
    from nf4lab.measure import bench

    run = bench.Run(meta={"gpu": "Test GPU"}, records=[
        {"kind": "ceiling", "name": bench.COPY, "shape": [4096, 4096], "dtype": "bf16", "gbps": 4000.0, "ms": 0.25},
        {"kind": "bound", "name": "read-only stream of the weight bytes", "shape": [4096, 4096], "dtype": "bf16",
         "gbps": 2000.0, "ms": 0.0037},
        {"kind": "bound", "name": "read-only stream of the weight bytes", "shape": [8192, 28672], "dtype": "bf16",
         "gbps": 3800.0, "ms": 0.030}])
    line = bench.read_bound_line(run)
    assert "4096x4096 3.7 us, 50% of" in line and "8192x28672 30.0 us, 95% of" in line and "4000 GB/s" in line, line
    assert bench.read_bound_line(bench.Run(meta={}, records=[])) == ""
