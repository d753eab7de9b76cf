"""The fused-GEMV machinery (nf4lab.gemv) and notebook 09 run headless in the simulator."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import nf4lab  # noqa: F401  (first: may switch numba to the simulator)
from nf4lab import gemv, reference
from numba import cuda, float32  # noqa: E402  (after nf4lab)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gc():
    return gemv.make_gemv_case(40, 192, "bf16", seed=2)


def test_case_matches_bitsandbytes_dequantization(gc):
    # w is bitsandbytes' own float32 dequantization: rounded to bf16 it is dequantize_4bit's output, bit for bit
    assert np.array_equal(reference.f32_to_bits(gc.w.reshape(-1), "bf16"), gc.case.expected)
    assert gc.x.shape == (1, 192) and gc.y64.shape == (1, 40)
    assert np.allclose(gc.y64, gc.x.astype(np.float64) @ gc.w.astype(np.float64).T)


def test_float32_sum_passes_and_bf16_rounding_is_within(gc):
    y32 = (gc.x @ gc.w.T).astype(np.float32)
    assert gemv.check(y32, gc).ok
    bits = reference.f32_to_bits(y32.reshape(-1), "bf16")
    assert gemv.check(bits, gc).ok
    # a reversed summation order passes too: order is not a bug
    rev = np.zeros(gc.N, np.float32)
    for k in range(gc.K - 1, -1, -1):
        rev = (rev + gc.x[0, k] * gc.w[:, k]).astype(np.float32)
    assert gemv.check(rev, gc).ok


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
        assert not gemv.compare(y_bad, gc).ok
        return
    y = (gc.x @ w.reshape(gc.N, gc.K).T).astype(np.float32)
    rep = gemv.compare(y, gc, name=bug)
    assert not rep.ok and rep.worst_ratio > 10, str(rep)
    with pytest.raises(gemv.GemvError):
        gemv.check(y, gc)


def test_tolerance_grows_with_k():
    x = np.ones((1, 1024), np.float32)
    w = np.ones((1, 1024), np.float32)
    t_short = gemv.tolerance(x[:, :64], w[:, :64], "fp16")
    t_long = gemv.tolerance(x, w, "fp16")
    # K * eps32 * sum|xw| grows like K^2 here; the output rounding like K
    assert t_long[0, 0] > 16 * t_short[0, 0]


def test_bitsandbytes_cpu_output_is_close(gc):
    yb = gemv.bnb_output(gc)
    rep = gemv.compare(yb, gc)
    # bitsandbytes rounds each weight to bf16 before multiplying: close, not always inside the float32 bound
    assert rep.worst_ratio < 20


def test_simulator_shuffle_twin():
    from nf4lab.gemv import shfl_down_sync

    @cuda.jit
    def k(out):
        v = float32(cuda.threadIdx.x)
        v += shfl_down_sync(0xFFFFFFFF, v, 16)
        v += shfl_down_sync(0xFFFFFFFF, v, 8)
        v += shfl_down_sync(0xFFFFFFFF, v, 4)
        v += shfl_down_sync(0xFFFFFFFF, v, 2)
        v += shfl_down_sync(0xFFFFFFFF, v, 1)
        if cuda.threadIdx.x % 32 == 0:
            out[cuda.threadIdx.x // 32] = v

    out = cuda.to_device(np.zeros(2, np.float32))
    k[1, 64](out)
    assert list(out.copy_to_host()) == [sum(range(32)), sum(range(32, 64))]


def test_layout_is_checked():
    with pytest.raises(ValueError, match="multiple of 64"):
        gemv._check_layout(4, 96, 64)
    with pytest.raises(ValueError, match="blocksize 32"):
        gemv._check_layout(4, 128, 32)


def test_weight_bytes():
    assert gemv.weight_bytes(4096, 4096) == 4096 * 4096 // 2 + 4096 * 64 + 4 * 1024 + 1024
    assert gemv.unfused_bytes(2, 64) - gemv.weight_bytes(2, 64) == 4 * 128


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["solutions/09_fused_gemv_SOLUTION.ipynb", "09_fused_gemv.ipynb"])
def test_notebook_runs_in_the_simulator(variant, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / variant, as_version=4)
    t0 = time.time()
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "within the float32 tolerance" in text
    if "SOLUTION" in variant:
        assert "PASSED: exercise" in text and "NOT PASSED" not in text
    else:
        assert "NOT PASSED (not solved yet)" in text
    assert time.time() - t0 < 120


def _load_kernel():
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import bench_gemv

    return bench_gemv.load_kernel()


@pytest.fixture(scope="module")
def nb09():
    return _load_kernel()


@pytest.mark.parametrize("N,K,dtype,grid", [(9, 128, "bf16", 1),       # one block loops over 3 groups (grid stride)
                                             (6, 2112, "fp16", None),  # K = 2048 + 64: a step with one lane
                                             (5, 64, "bf16", None)])   # rows past N, a single block column
def test_kernel_within_tolerance(nb09, N, K, dtype, grid):
    gc = gemv.make_gemv_case(N, K, dtype, seed=5)
    g = gemv.make_gemv_buffers(gc)
    g.grid = grid
    nb09.launch(g)
    assert gemv.check(g.result(), gc, name=f"{N}x{K} {dtype} grid {grid}").ok


def test_lds_pair_twin_reads_the_pair_table():
    lut = reference.NF4_LUT.astype(np.float32)
    tab = np.zeros(256 * 16, np.uint64)
    for i in range(tab.size):
        b = i // 16
        tab[i] = int(lut[b >> 4].view(np.uint32)) | (int(lut[b & 15].view(np.uint32)) << 32)
    for byte, copy in [(0x00, 0), (0x7A, 5), (0xFF, 15)]:
        lo, hi = gemv._py_lds_pair(tab, (byte << 7) | (copy << 3))
        assert lo == lut[byte >> 4] and hi == lut[byte & 15]


def test_ptx_byte_pair_reads(nb09):
    ptx = nf4lab.compile_ptx(nb09.GEMV["fp16"], nb09.SIG)
    assert nf4lab.ptx.count(ptx, r"^ld\.shared\.v2\.f32") == nb09.ROWS * 32
    nf4lab.ptx.check(ptx, absent=[r"^ld\.local", r"\.f64"])


def test_grid_size_policies(nb09, monkeypatch):
    class K:  # a compiled kernel as numba reports it: 168 registers, 33 KB shared memory
        overloads = {"sig": None}

        def get_regs_per_thread(self):
            return 168

        def get_shared_mem_per_block(self):
            return 33856

    monkeypatch.setattr(nf4lab, "device_info", lambda: {"sms": 132, "smem_per_sm": 233472, "max_threads_per_sm": 2048})
    k = K()
    assert nb09.resident_blocks(k) == 3  # 65536 // (168 * 32 * 4)
    groups = 8192 // nb09.ROWS
    assert nb09.grid_size(k, 8192, "full") == groups // nb09.WARPS
    assert nb09.grid_size(k, 8192, "resident") == 3 * 132
    bal = nb09.grid_size(k, 8192, "balanced")  # 2 rounds: every warp does 2 groups
    assert bal * nb09.WARPS * 2 >= groups and (bal - 1) * nb09.WARPS * 2 < groups
