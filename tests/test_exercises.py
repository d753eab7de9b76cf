"""nf4lab.check grades: a right kernel passes, planted bugs fail with the hint that names them,
a crashing kernel is reported (not raised), bad arguments raise ValueError.

Tiny per-byte kernels, written here, run in the simulator (or on a GPU if there is one).
"""
import math

import numpy as np

import pytest

import nf4lab  # noqa: F401  (before numba.cuda: may switch on the simulator)
from nf4lab.lesson import block_scale, exercises
from nf4lab.device import ops
from numba import cuda, float32, uint16, uint32, uint64

SMALL = ((3, 5), (1, 65), (7, 33))


def _kernel(bug=None, where="param", table=None):
    """A per-byte NF4 kernel (one thread per packed byte), optionally with a planted bug. Its 16-entry table is the
    ``lut`` parameter (``where="param"``), that parameter copied to shared memory ("shared") or ``table`` in
    constant memory ("const")."""

    @cuda.jit
    def kernel(packed, absmax_q, absmax2, code2, offset, lut, out, nbytes, n):
        if where == "shared":
            t = cuda.shared.array(16, float32)
            if cuda.threadIdx.x < 16:
                t[cuda.threadIdx.x] = lut[cuda.threadIdx.x]
            cuda.syncthreads()
        elif where == "const":
            t = cuda.const.array_like(table)
        else:
            t = lut
        i = uint64(cuda.grid(1))
        if i >= nbytes:
            return
        byte = packed[i]
        j = uint64(2) * i
        scale = block_scale(absmax_q, absmax2, code2, offset, j >> uint64(6))
        hi = t[byte >> 4] * scale
        lo = t[byte & 15] * scale
        if bug == "nibbles":
            hi, lo = lo, hi
        if bug == "truncate":
            out[j] = uint16(ops.float_bits(hi) >> uint32(16))
            if j + uint64(1) < n:
                out[j + uint64(1)] = uint16(ops.float_bits(lo) >> uint32(16))
            return
        out[j] = ops.to_bf16_bits(hi)
        if bug == "unguarded" or j + uint64(1) < n:
            out[j + uint64(1)] = ops.to_bf16_bits(lo)

    return kernel


def _launch(kernel, b, nbytes=None, threads=128):
    kernel[(b.nbytes + threads - 1) // threads, threads, b.stream](
        b.packed, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut, b.out, b.nbytes if nbytes is None else nbytes, b.n)


def _make(bug=None):
    """A launch of the per-byte kernel, optionally with a planted bug."""
    kernel = _kernel(bug)

    def launch(b):
        # "tail": off by one, the odd last weight's byte is never handled
        _launch(kernel, b, b.n // 2 if bug == "tail" else None)

    return launch


def test_correct_kernel_passes_on_default_edge_shapes():
    res = nf4lab.check(_make(), name="per byte", verbose=False)
    assert res and res.passed
    assert res.verdict.startswith("PASSED: per byte: bit-exact on")
    assert len(exercises.default_shapes()) >= 5
    # the defaults include one weight, a partial block and two absmax2 groups
    shapes = exercises.default_shapes()
    assert (1, 1) in shapes and any(np.prod(s) > 2 * 256 * 64 // 2 for s in shapes)


def test_nibble_order_bug_fails_with_the_nibble_hint():
    res = nf4lab.check(_make("nibbles"), name="swapped", shapes=SMALL, verbose=False)
    assert not res
    assert res.verdict.startswith("NOT PASSED: swapped: not bit-exact on 3x5")
    assert "each other's values" in str(res)
    assert res.failed_shape == (3, 5)


def test_off_by_one_tail_fails_with_the_tail_hint():
    res = nf4lab.check(_make("tail"), name="tail", shapes=SMALL, verbose=False)
    assert not res
    assert "never written" in str(res) and "tail" in str(res)


def test_a_launch_that_writes_nothing_is_told_so_not_blamed_on_the_tail():
    res = nf4lab.check(lambda b: None, name="empty", shapes=((31, 67),), verbose=False)
    assert not res
    assert "nothing was written" in str(res) and "tail" not in str(res)


def test_truncating_conversion_fails_with_the_rounding_hint():
    res = nf4lab.check(_make("truncate"), name="trunc", shapes=SMALL, verbose=False)
    assert not res
    assert "truncates" in str(res) and "round to nearest even" in str(res)


SIG64 = ("(uint8[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, uint16[::1], uint32[::1], "
         "uint64[::1], int64, int64)")


def _u64(kind):
    """Notebook 03's exercise 1: four weights per thread, one 64-bit store. ``stub``: the starting point (a 64-bit
    store in every thread, whatever is left at the end); ``solution``: the end handled; ``narrow``: bit-exact
    with 32- and 16-bit stores only (no 64-bit store: must not pass)."""
    from nf4lab.lesson import BLOCK_SHIFT

    @cuda.jit
    def u64_store(packed, lut, absmax_q, absmax2, code2, offset, out, out_u32, out_u64, n, nbytes):
        t = uint64(cuda.grid(1))
        n = uint64(n)
        i = uint64(2) * t
        if i < uint64(nbytes):
            b0, b1 = packed[i], packed[i + uint64(1)]
            s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
            lo = ops.pack_bf16x2(lut[b0 >> 4] * s, lut[b0 & 15] * s)
            j = uint64(4) * t
            if kind == "stub" or (kind == "solution" and j + uint64(3) < n):
                hi = ops.pack_bf16x2(lut[b1 >> 4] * s, lut[b1 & 15] * s)
                out_u64[t] = uint64(lo) | (uint64(hi) << uint64(32))
            elif kind == "narrow" and j + uint64(3) < n:
                out_u32[uint64(2) * t] = lo
                out_u32[uint64(2) * t + uint64(1)] = ops.pack_bf16x2(lut[b1 >> 4] * s, lut[b1 & 15] * s)
            elif j + uint64(1) < n:
                out_u32[uint64(2) * t] = lo
                if j + uint64(2) < n:
                    out[j + uint64(2)] = ops.to_bf16_bits(lut[b1 >> 4] * s)
            else:
                out[j] = ops.to_bf16_bits(lut[b0 >> 4] * s)

    def launch(b):
        pairs = (b.nbytes + 1) // 2
        u64_store[(pairs + 127) // 128, 128, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                       b.out, b.out_u32, b.out.view(np.uint64), b.n, b.nbytes)

    return launch, u64_store


def test_u64_store_exercise_fails_on_the_stub_and_passes_on_the_solution():
    stub = exercises.check_u64_store(*_u64("stub"), SIG64, verbose=False)
    assert not stub and "past the end" in str(stub)
    solved = exercises.check_u64_store(*_u64("solution"), SIG64, verbose=False)
    assert solved, str(solved)
    assert "64-bit store instruction(s)" in str(solved)
    narrow = exercises.check_u64_store(*_u64("narrow"), SIG64, verbose=False)
    assert not narrow and "no 64-bit store" in narrow.verdict
    # every remainder of n mod 4 is run
    assert {(a * b) % 4 for a, b in exercises.U64_SHAPES} == {0, 1, 2, 3}


SIG04 = ("(uint8[::1], uint32[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, "
         "uint16[::1], uint32[::1], uint64, uint64)")


# Device pieces of notebook 04's exercise kernels below (both exercises' stubs and solutions use them).
@cuda.jit(device=True, inline="always")
def pair(byte, lut, s):   # one code byte -> its two weights as a bf16x2 word (high nibble first)
    return ops.pack_bf16x2(lut[(byte >> 4) & uint32(15)] * s, lut[byte & uint32(15)] * s)


@cuda.jit(device=True, inline="always")
def word4(w, lut, s):     # a code word (8 weights) -> the 4 words of its 16-byte store
    return pair(w, lut, s), pair(w >> 8, lut, s), pair(w >> 16, lut, s), pair(w >> 24, lut, s)


@cuda.jit(device=True, inline="always")
def tail(packed, lut, s, out, i, n):   # weights i..n-1 one 16-bit store at a time (version A's tail)
    while i < n:
        byte = uint32(packed[i >> 1])
        q = (byte >> 4) if (i & uint64(1)) == 0 else (byte & uint32(15))
        out[i] = ops.to_bf16_bits(lut[q] * s)
        i += uint64(1)


def _chunk_launch(kernel):
    """Notebook 04's launch for an exercise kernel with its signature (SIG04): one thread per 32-weight chunk."""
    def launch(b):
        chunks = (b.n + 31) // 32
        kernel[(chunks + 127) // 128, 128, b.stream](
            b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
            np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))

    return launch


def _shuffle(kind):
    """Notebook 04's exercise 1: a 16-byte load per thread (32 weights), 16-byte stores. ``stub``: the starting
    point, version A (each lane stores its own 64 bytes: bit-exact, no shuffle); ``solution``: every lane gets
    words t, t + 32, t + 64, t + 96 of its warp by shfl_idx and stores them (a warp's store: 512 contiguous
    bytes); ``blocklocal``: the solution with its warp's place counted in its block (``threadIdx.x``), not in the
    grid: right on one block, wrong from the second; ``selfshfl``: the starting point with one shuffle that changes
    nothing (each lane reads its own value), so that its PTX has the shuffle while its stores stay scattered."""
    from nf4lab.device.warp_ops import shfl_idx

    local = kind == "blocklocal"
    cheat = kind == "selfshfl"

    @cuda.jit
    def stub(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        c = uint64(cuda.grid(1))
        first = c << 5
        if cheat and shfl_idx(uint32(c & uint64(0xFFFF)), uint32(c & uint64(31))) != uint32(c & uint64(0xFFFF)):
            return                                   # never: every lane reads its own value
        if first >= n:
            return
        s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
        if first + uint64(32) <= n:
            w0, w1, w2, w3 = ops.load_u32x4(packed_u32, c << 2)
            o = c << 4
            a0, a1, a2, a3 = word4(w0, lut, s)
            ops.store_u32x4(out_u32, o, a0, a1, a2, a3)
            a0, a1, a2, a3 = word4(w1, lut, s)
            ops.store_u32x4(out_u32, o + uint64(4), a0, a1, a2, a3)
            a0, a1, a2, a3 = word4(w2, lut, s)
            ops.store_u32x4(out_u32, o + uint64(8), a0, a1, a2, a3)
            a0, a1, a2, a3 = word4(w3, lut, s)
            ops.store_u32x4(out_u32, o + uint64(12), a0, a1, a2, a3)
        else:
            tail(packed, lut, s, out, first, n)

    @cuda.jit
    def solution(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        c = uint64(cuda.grid(1))
        lane = c & uint64(31)
        w0 = w1 = w2 = w3 = uint32(0)
        if (c << 5) < n:
            w0, w1, w2, w3 = ops.load_u32x4(packed_u32, c << 2)
        base = uint64(cuda.threadIdx.x) if local else c
        warp_word0 = (base - lane) << 2
        for j in range(4):
            k = lane + (uint64(j) << 5)
            src = uint32(k >> 2)
            r = k & uint64(3)
            v0, v1, v2, v3 = shfl_idx(w0, src), shfl_idx(w1, src), shfl_idx(w2, src), shfl_idx(w3, src)
            v = v0 if r == 0 else v1 if r == 1 else v2 if r == 2 else v3
            word = warp_word0 + k
            first = word << 3
            if first < n:
                s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
                if first + uint64(8) <= n:
                    a0, a1, a2, a3 = word4(v, lut, s)
                    ops.store_u32x4(out_u32, word << 2, a0, a1, a2, a3)
                else:
                    tail(packed, lut, s, out, first, n)

    kernel = stub if kind in ("stub", "selfshfl") else solution

    return _chunk_launch(kernel), kernel


def test_warp_shuffle_exercise_fails_on_the_stub_and_passes_on_the_solution():
    stub = exercises.check_warp_shuffle(*_shuffle("stub"), SIG04, verbose=False)
    assert not stub and "no warp shuffle" in str(stub), str(stub)
    assert "bit-exact" in stub.verdict        # version A is right, only not the design asked for
    solved = exercises.check_warp_shuffle(*_shuffle("solution"), SIG04, verbose=False)
    assert solved, str(solved)
    assert "warp shuffles, no shared memory" in str(solved)


@pytest.mark.skipif(nf4lab.runtime.ON_GPU, reason="where each lane stores is seen in the simulator only")
def test_warp_shuffle_exercise_in_the_simulator_fails_on_scattered_stores_with_a_shuffle_added():
    res = exercises.check_warp_shuffle(*_shuffle("selfshfl"), SIG04, verbose=False)
    assert not res and "still scattered" in res.verdict, str(res)
    solved = exercises.check_warp_shuffle(*_shuffle("solution"), SIG04, verbose=False)
    assert solved and "consecutive 16-byte pieces" in str(solved), str(solved)


def test_warp_shuffle_exercise_fails_on_a_warp_placed_in_its_block_not_in_the_grid():
    # Every shape of one block passes it: the grader needs a shape of two blocks or more.
    assert max(-(-r * c // 32) for r, c in exercises.SHUFFLE_SHAPES) > 128
    local = exercises.check_warp_shuffle(*_shuffle("blocklocal"), SIG04, verbose=False)
    assert not local and local.report is not None, str(local)


def test_write_past_the_end_is_caught_by_the_guard():
    res = nf4lab.check(_make("unguarded"), name="guard", shapes=((3, 5),), verbose=False)
    assert not res
    assert "past the end" in str(res)


@pytest.mark.skipif(not nf4lab.SIMULATOR, reason="a GPU does not check bounds (the guard region does)")
def test_exception_in_the_kernel_is_reported_not_raised():
    @cuda.jit
    def crash(out, n):
        i = cuda.grid(1)
        out[i + 1000] = uint16(1)  # no bounds check, far out of range

    def launch(b):
        crash[1, 32, b.stream](b.out, b.n)

    res = nf4lab.check(launch, name="crash", shapes=((1, 1),), verbose=False)
    assert not res
    assert res.error and "NOT PASSED: crash: the kernel failed on 1x1" in res.verdict
    assert "IndexError" in res.error and "line" in res.error and "bounds check" in res.error


def test_wrong_launch_arguments_are_reported_not_raised():
    @cuda.jit
    def two_args(out, n):
        pass

    def launch(b):
        two_args[1, 32, b.stream](b.out)  # n is missing

    res = nf4lab.check(launch, name="args", shapes=((1, 1),), verbose=False)
    assert not res and res.error and "NOT PASSED: args: the kernel failed on 1x1" in res.verdict


def test_not_implemented_stub_fails_cleanly(capsys):
    def launch(b):
        raise NotImplementedError("write the kernel")

    res = nf4lab.check(launch, name="stub", shapes=((3, 5),))
    assert not res
    out = capsys.readouterr().out
    assert "NOT PASSED: stub" in out and "not solved yet" in out


def test_simulator_says_speed_is_not_checked():
    if not nf4lab.SIMULATOR:
        pytest.skip("simulator behaviour")
    res = nf4lab.check(_make(), name="fast?", shapes=((3, 5),), min_pct_copy=80, verbose=False)
    assert res
    assert "correctness only (simulator): the speed threshold of 80% of copy is checked on a GPU" in str(res)
    assert res.pct_copy is None


def test_numba_typing_error_is_summarised():
    from numba.core.errors import TypingError

    msg = ("Failed in cuda mode pipeline (step: nopython frontend)\n"
           "\x1b[1mNo implementation of function Function(<built-in function add>) found for signature:\n"
           " \n >>> add(uint16, float64)\n \nThere are 10 candidate implementations:\n"
           "  - Of which 8 did not match due to:\n  Overload of function 'add'\n\n"
           "During: typing of intrinsic-call at /tmp/x.py (7)\n\n"
           'File "../../tmp/x.py", line 7:\ndef k(out, n):\n    <source elided>\n    x = out[i] + 1.5\n    ^\n')
    lines = exercises.describe_exception(TypingError(msg))
    text = "\n".join(lines)
    assert lines[0].startswith("TypingError while numba compiled the kernel")
    assert "No implementation of function" in text and ">>> add(uint16, float64)" in text
    assert 'line 7' in text and "x = out[i] + 1.5" in text
    assert "float32(" in text  # the float64 hint
    assert "There are 10" not in text and "\x1b" not in text


@pytest.mark.parametrize("kwargs", [
    dict(dtype="bf17"), dict(blocksize=48), dict(quant_type="int4"), dict(dist="uniform"),
    dict(shapes=[]), dict(shapes=[(0, 5)]), dict(shapes=[(1, 2, 3)]), dict(shapes="3x5"),
    dict(min_pct_copy=0), dict(min_pct_copy=500), dict(min_pct_copy="80"), dict(name=""),
])
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        nf4lab.check(_make(), **kwargs)


def test_launch_must_be_callable():
    with pytest.raises(ValueError):
        nf4lab.check("launch")


def test_signature_stays_backward_compatible():
    import inspect

    params = inspect.signature(nf4lab.check).parameters
    for p in ("name", "dtype", "blocksize", "quant_type", "shapes", "dist", "min_pct_copy"):
        assert p in params and params[p].kind is inspect.Parameter.KEYWORD_ONLY


gpu = pytest.mark.skipif(not nf4lab.ON_GPU, reason="needs a CUDA GPU")


@gpu
def test_typing_error_is_reported_on_gpu():
    @cuda.jit
    def untypable(out, n):
        i = cuda.grid(1)
        out[i] = out[i] + "a"

    def launch(b):
        untypable[1, 32, b.stream](b.out, b.n)

    res = nf4lab.check(launch, name="typing", shapes=((3, 5),), verbose=False)
    assert not res and "while numba compiled the kernel" in res.error
    assert ">>> add(uint16" in res.error and "in launch" in res.error
    assert "hint: a float64" not in res.error and "hint: signed" not in res.error  # no false hints


@gpu
def test_speed_threshold_on_gpu():
    ok = nf4lab.check(_make(), name="slow enough", shapes=((3, 5),), min_pct_copy=1, verbose=False)
    assert ok and ok.pct_copy is not None and 1 <= ok.pct_copy < 150
    slow = nf4lab.check(_make(), name="too slow", shapes=((3, 5),), min_pct_copy=149, verbose=False)
    assert not slow and "not fast enough" in str(slow) and "of copy, needs 149%" in slow.verdict


def test_hot_spot_check_fails_on_the_stub_and_passes_the_walk(capsys):
    """Notebook 08's exercise, on a hand-made listing: registers written (first operand) and read (the rest)."""
    def operands(sass):
        op, _, rest = sass.partition(" ")
        regs = [r.strip() for r in rest.split(",")]
        return op, ({regs[0]} if not op.startswith("ST") else set()), set(regs[1:])

    prog = [{"sass": s, "samples": n, "line": str(k)} for k, (s, n) in
            enumerate([("LDG.E.U8 R1, R9", 1.0), ("IADD3 R2, R7", 0.0), ("IMAD.WIDE R3, R1, R8", 9.0), ("ST R0, R3", 2.0)])]
    assert exercises.check_hot_spot(lambda p: None, prog, operands) is False
    assert "NOT PASSED" in capsys.readouterr().out
    assert exercises.check_hot_spot(lambda p: {"hot": 2, "line": "2", "waits_for": 1}, prog, operands) is False
    assert exercises.check_hot_spot(lambda p: {"hot": 2, "line": "2", "waits_for": 0}, prog, operands) is True
    assert exercises.walk_to_load(prog, 2, operands) == [2, 0]


def test_chain_end_names_where_the_walk_stopped():
    """Notebook 08 prints which kind of instruction its walk ended at; the hand-made listings cover each kind."""
    def operands(sass):
        op, _, rest = sass.partition(" ")
        regs = [r.strip() for r in rest.split(",") if r.strip().startswith("R")]
        return op, ({regs[0]} if regs and not op.startswith("ST") else set()), set(regs[1:])

    def end(listing):
        prog = [{"sass": s, "samples": float(k == len(listing) - 1), "line": "1"} for k, s in enumerate(listing)]
        return exercises.chain_end(prog, exercises.walk_to_load(prog, len(prog) - 1, operands), operands)

    assert end(["LDG.E.U8 R1, R9", "IMAD.WIDE R3, R1, R8"]) == "global load"
    assert end(["LDS R1, R9", "IADD3 R3, R1, R8"]) == "shared-memory load"
    assert end(["LDC R1, c[0x0][0x28]", "IADD3 R3, R1, R8"]) == "constant load"
    assert end(["S2R R8, SR_TID.X", "SHF.R.S32.HI R9, RZ, 0x1f, R8"]) == "special register"
    assert end(["IADD3 R2, UR4", "ISETP.GE.U32.AND P0, R7"]) == "no writer"
    assert end([f"IADD3 R{k + 1}, R{k}" for k in range(10)]) == "steps"
    assert set(exercises.CHAIN_ENDS) == {"global load", "shared-memory load", "constant load", "special register",
                                         "no writer", "steps"}


def test_own_share_check_fails_on_the_stub_and_passes_on_times_or_rates(capsys):
    """Notebook 07's exercise on hand-made records: 1 ms copy, 1.05 ms bound, 1.1 ms kernel -> 0.5 of the
    kernel's time beyond the copy is beyond the bound; a shape where the kernel beats the copy is not graded."""
    from nf4lab.measure import bench

    def rec(name, shape, ms):
        return {"name": name, "kind": "kernel", "shape": list(shape), "dtype": "bf16", "ms": ms, "bytes": 1e6,
                "gbps": 1e6 / ms / 1e6}

    K = "06 best kernel"
    run = bench.Run(meta={}, records=[rec(bench.COPY, (4, 4), 1.0), rec(bench.BOUND, (4, 4), 1.05), rec(K, (4, 4), 1.1),
                                      rec(bench.COPY, (8, 8), 2.0), rec(bench.BOUND, (8, 8), 2.0), rec(K, (8, 8), 1.9)])
    run.finalize()
    assert exercises._own_share_want(run, K, (4, 4)) == pytest.approx(0.5)
    assert exercises._own_share_want(run, K, (8, 8)) is None
    assert exercises.graded_shapes(run, K) == [(4, 4)]
    assert exercises.check_own_share(lambda s, shape: None, run, K) is False
    assert "NOT PASSED" in capsys.readouterr().out

    def by_times(s, shape):
        k, b, c = (s.get(n, shape=shape)["ms"] for n in (K, bench.BOUND, bench.COPY))
        return (k - b) / (k - c)

    def by_percents(s, shape):
        k = s.get(K, shape=shape)
        return (100 - k["pct_bound"]) / (100 - k["pct_copy"])

    assert exercises.check_own_share(by_times, run, K) is True
    assert exercises.check_own_share(by_percents, run, K) is True
    assert "PASSED: exercise" in capsys.readouterr().out
    # the span over the p10/p90 ends: without spreads it is the median share twice; with them, its extremes
    assert exercises.own_share_span(run, K, (4, 4)) == pytest.approx((0.5, 0.5))
    run.get(K, shape=(4, 4))["spread_ms"] = [1.08, 1.12]
    lo, hi = exercises.own_share_span(run, K, (4, 4))
    assert lo == pytest.approx((1.08 - 1.05) / 0.08) and hi == pytest.approx((1.12 - 1.05) / 0.12)
    # where the copy's slow end reaches the kernel's fast end the share has no upper end: the span must say so
    # (dropping that corner printed a span of 70-78% beside a median of 81%, 07's solution on the H200)
    run.get(bench.COPY, shape=(4, 4))["spread_ms"] = [0.99, 1.09]
    lo, hi = exercises.own_share_span(run, K, (4, 4))
    assert lo <= exercises._own_share_want(run, K, (4, 4)) and hi == math.inf


def _last_vector(kind):
    """Notebook 04's exercise 2. ``stub``: every chunk, the last one too, written with four 16-byte stores (past
    n); ``scalar``: version A's fix, the whole last chunk one weight at a time (right, but not the exercise);
    ``solution``: a 16-byte store per whole word, a 32-bit store per whole pair, a 16-bit store for a single
    weight; ``pairs``: whole chunks as the solution, the whole last chunk in 32-bit pairs (its whole words too:
    bit-exact, with 16-byte and 32-bit stores in its PTX, but not the exercise)."""
    nib, one = uint32(15), uint64(1)

    @cuda.jit
    def stub(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        c = uint64(cuda.grid(1))
        first = c << 5
        if first >= n:
            return
        s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
        w0, w1, w2, w3 = ops.load_u32x4(packed_u32, c << 2)
        o = c << 4
        for k in range(4):
            w = w0 if k == 0 else w1 if k == 1 else w2 if k == 2 else w3
            a0, a1, a2, a3 = word4(w, lut, s)
            ops.store_u32x4(out_u32, o + (uint64(k) << uint64(2)), a0, a1, a2, a3)

    @cuda.jit
    def scalar(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        c = uint64(cuda.grid(1))
        first = c << 5
        if first >= n:
            return
        s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
        if first + uint64(32) <= n:
            w0, w1, w2, w3 = ops.load_u32x4(packed_u32, c << 2)
            o = c << 4
            for k in range(4):
                w = w0 if k == 0 else w1 if k == 1 else w2 if k == 2 else w3
                a0, a1, a2, a3 = word4(w, lut, s)
                ops.store_u32x4(out_u32, o + (uint64(k) << uint64(2)), a0, a1, a2, a3)
        else:
            tail(packed, lut, s, out, first, n)

    whole_chunk = kind == "pairs"   # a 16-byte store only where the whole chunk fits: its last chunk all in pairs

    @cuda.jit
    def solution(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        c = uint64(cuda.grid(1))
        first = c << 5
        if first >= n:
            return
        s = block_scale(absmax_q, absmax2, code2, offset, first >> log2_bs)
        w0, w1, w2, w3 = ops.load_u32x4(packed_u32, c << 2)
        o = c << 4
        for k in range(4):
            w = w0 if k == 0 else w1 if k == 1 else w2 if k == 2 else w3
            i = first + (uint64(k) << uint64(3))
            if (first + uint64(32) if whole_chunk else i + uint64(8)) <= n:
                a0, a1, a2, a3 = word4(w, lut, s)
                ops.store_u32x4(out_u32, o + (uint64(k) << uint64(2)), a0, a1, a2, a3)
            else:
                for p in range(4):
                    j = i + (uint64(p) << one)
                    if j + one < n:
                        out_u32[j >> one] = pair(w >> uint32(8 * p), lut, s)
                    elif j < n:
                        out[j] = ops.to_bf16_bits(lut[(w >> uint32(8 * p + 4)) & nib] * s)

    kernel = {"stub": stub, "scalar": scalar}.get(kind, solution)   # "solution" and "pairs" share a kernel

    return _chunk_launch(kernel), kernel


def test_last_vector_exercise_fails_on_the_stub_and_on_a_scalar_tail_and_passes_on_the_solution():
    stub = exercises.check_last_vector(*_last_vector("stub"), SIG04, verbose=False)
    assert not stub and "past the end" in str(stub), str(stub)
    scalar = exercises.check_last_vector(*_last_vector("scalar"), SIG04, verbose=False)
    assert not scalar and "no 32-bit store" in str(scalar), str(scalar)
    assert "bit-exact" in scalar.verdict
    solved = exercises.check_last_vector(*_last_vector("solution"), SIG04, verbose=False)
    assert solved, str(solved)
    assert "16-byte and 32-bit stores present" in str(solved)
    # whole words, whole pairs and a single weight are each left over in some shape's last chunk
    rest = {(a * b) % 32 for a, b in exercises.LAST_VECTOR_SHAPES}
    assert any(r >= 8 for r in rest) and any(r % 8 >= 2 for r in rest) and any(r % 2 for r in rest)


@pytest.mark.skipif(nf4lab.runtime.ON_GPU, reason="which chunk a store writes is seen in the simulator only")
def test_last_vector_exercise_in_the_simulator_fails_on_a_last_chunk_written_in_pairs():
    # Its PTX has the 16-byte stores (whole chunks) and the 32-bit ones (the tail), and its bits are right: only
    # where its 16-byte stores land shows that the last chunk's whole words are not 16-byte stores.
    launch, kernel = _last_vector("pairs")
    assert exercises.check(launch, shapes=exercises.LAST_VECTOR_SHAPES, verbose=False)
    res = exercises.check_last_vector(launch, kernel, SIG04, verbose=False)
    assert not res and "bit-exact" in res.verdict and "last chunk" in str(res), str(res)
    assert all(s in str(res) for s in ("3x5", "1x46", "31x67")) and "1x65 (" not in str(res), str(res)
    solved = exercises.check_last_vector(*_last_vector("solution"), SIG04, verbose=False)
    assert solved and "last chunk's whole words" in str(solved), str(solved)


def _fp4_table(where):
    """Notebook 05's exercise in small: the per-byte kernel with its 16-entry table ``where``: "constant" (fp4's
    table, the solution), "shared" (the launch's table copied to shared memory: bit-exact on fp4 too, not the
    exercise) or "nf4" (NF4's table in constant memory, the starting point). Returns (launch, kernel)."""
    from nf4lab.format.reference import lut_for

    def make(dev):
        if where == "shared":
            return _kernel(where="shared")
        return _kernel(where="const", table=lut_for("nf4" if where == "nf4" else "fp4", dev))

    # one kernel per table: bitsandbytes' CUDA and CPU fp4 tables differ in the sign of one zero; the cases are
    # made on the GPU where there is one
    kernel = make("cuda" if nf4lab.runtime.ON_GPU else "cpu")

    def launch(b):
        _launch(kernel, b)

    return launch, kernel


SIG_PER_BYTE = "(uint8[::1], uint8[::1], float32[::1], float32[::1], float32, float32[::1], uint16[::1], uint64, uint64)"


def test_const_table_exercise_fails_on_the_start_and_on_shared_memory_and_passes_on_constant_memory():
    start = exercises.check_const_table(*_fp4_table("nf4"), SIG_PER_BYTE, verbose=False)
    assert not start and start.report is not None, str(start)     # NF4's values on fp4 cases: wrong bits
    # bit-exact on fp4, so a bits-only check passes it; the table in shared memory is not the exercise
    assert exercises.check(_fp4_table("shared")[0], quant_type="fp4", shapes=exercises.CONST_TABLE_SHAPES,
                           verbose=False)
    shared = exercises.check_const_table(*_fp4_table("shared"), SIG_PER_BYTE, verbose=False)
    assert not shared and "ld.const.f32" in str(shared) and "bit-exact" in shared.verdict, str(shared)
    solved = exercises.check_const_table(*_fp4_table("constant"), SIG_PER_BYTE, verbose=False)
    assert solved, str(solved)
    assert "constant memory" in str(solved)


def test_design_graders_read_the_kernel_the_launch_runs():
    # Bit-exact through another kernel (section 2's shared-memory one) while the constant-memory kernel handed to
    # the grader is never launched: the PTX read would be of a kernel that made none of the bits.
    shared_launch, _ = _fp4_table("shared")
    _, const_kernel = _fp4_table("constant")
    res = exercises.check_const_table(shared_launch, const_kernel, SIG_PER_BYTE, verbose=False)
    assert not res and "never launched" in str(res) and "not by the kernel the check reads" in res.verdict, str(res)
    solved = exercises.check_u64_store(*_u64("solution"), SIG64, verbose=False)
    other = exercises.check_u64_store(_u64("solution")[0], _u64("narrow")[1], SIG64, verbose=False)
    assert solved and not other and "never launched" in str(other), str(other)


def _grid_stride_kernel():
    """Notebook 02's grid-stride per-byte kernel, in small."""
    @cuda.jit
    def kernel(packed, absmax_q, absmax2, code2, offset, lut, out, nbytes, n):
        for i in range(uint64(cuda.grid(1)), uint64(nbytes), uint64(cuda.gridsize(1))):
            byte = packed[i]
            j = uint64(2) * i
            scale = block_scale(absmax_q, absmax2, code2, offset, j >> uint64(6))
            out[j] = ops.to_bf16_bits(lut[byte >> 4] * scale)
            if j + uint64(1) < n:
                out[j + uint64(1)] = ops.to_bf16_bits(lut[byte & 15] * scale)

    return kernel


def _grid_stride_at(grid, threads=128, kernel=None):
    """Notebook 02's exercise 2 in small: ``kernel`` (a new grid-stride kernel if None) launched at ``threads`` a
    block with ``grid(nbytes)`` blocks (at least one). Returns (launch, kernel)."""
    kernel = _grid_stride_kernel() if kernel is None else kernel

    def launch(b):
        kernel[max(1, int(grid(b.nbytes))), threads, b.stream](b.packed, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                               b.lut, b.out, b.nbytes, b.n)
    return launch, kernel


def _grid_stride(share=1.0):
    """The grid-stride kernel launched with 128 threads a block and a grid of ``share`` times the solution's (02's
    sizing: SMs x resident blocks, no more blocks than the bytes need), and its 256-thread ``launch``. Returns
    (launch_128, launch, kernel)."""
    from nf4lab import lesson

    def sized(threads, share=1.0):
        return lambda nbytes: lesson.grid_for(nbytes, threads, lesson.blocks_per_sm(threads)) * share

    launch_128, kernel = _grid_stride_at(sized(128, share))
    launch, _ = _grid_stride_at(sized(256), 256, kernel)
    return launch_128, launch, kernel


# 31x67: 1,039 bytes, more than the simulator's resident threads at 128 a block: there the grid is capped.
GRID_SHAPES = ((3, 5), (1, 65), (31, 67))


def test_block_size_exercise_refuses_the_right_bits_at_another_block_size():
    launch_128, launch, kernel = _grid_stride()
    same = exercises.check_block_size(launch, kernel, 128, shapes=GRID_SHAPES, verbose=False)   # `launch_128 = launch`
    assert not same and "not at 128 threads a block" in same.verdict and "256" in str(same), str(same)
    solved = exercises.check_block_size(launch_128, kernel, 128, shapes=GRID_SHAPES, verbose=False)
    assert solved and "128 threads a block" in str(solved), str(solved)
    other = exercises.check_block_size(launch_128, _kernel(), 128, shapes=GRID_SHAPES, verbose=False)
    assert not other and "never launched" in str(other), str(other)


def test_block_size_exercise_refuses_half_the_threads_without_printing_the_grid():
    from nf4lab import lesson

    half, _, kernel = _grid_stride(share=0.5)   # the right bits (a grid-stride loop) and block size, half the grid
    res = exercises.check_block_size(half, kernel, 128, shapes=GRID_SHAPES, verbose=False)
    assert not res and res.report is None and "threads in all" in res.verdict, str(res)
    right = lesson.sm_count() * lesson.blocks_per_sm(128)   # the solution's grid where it is capped
    assert f"{right * 128:,}" not in str(res) and str(right * 128) not in str(res) and "grid of" not in str(res)
    launch_128, _, kernel = _grid_stride()
    solved = exercises.check_block_size(launch_128, kernel, 128, shapes=GRID_SHAPES, verbose=False)
    assert solved and "threads in all" in str(solved), str(solved)


def test_block_size_exercise_passes_every_sizing_the_exercise_allows():
    """02's hint (twice as many resident blocks of 128 as of 256) and `launch`'s own threads in blocks of 128 are
    right answers wherever the grader runs, the simulator included, whose resident blocks do not depend on the
    block size."""
    from nf4lab import lesson

    for grid in (lambda nbytes: lesson.grid_for(nbytes, 128, 2 * lesson.blocks_per_sm(256)),
                 lambda nbytes: 2 * lesson.grid_for(nbytes, 256, lesson.blocks_per_sm(256))):
        res = exercises.check_block_size(*_grid_stride_at(grid), 128, shapes=GRID_SHAPES, verbose=False)
        assert res, str(res)


def test_block_size_exercise_refuses_a_grid_larger_than_the_bytes_need():
    from nf4lab import lesson

    res = exercises.check_block_size(*_grid_stride_at(lambda nbytes: lesson.sm_count() * lesson.blocks_per_sm(128)),
                                     128, shapes=GRID_SHAPES, verbose=False)
    assert not res and "threads in all" in res.verdict and "3x5" in str(res), str(res)


def test_block_size_exercise_takes_one_dimensional_shapes():
    launch_128, _, kernel = _grid_stride()
    assert exercises.check_block_size(launch_128, kernel, 128, shapes=((5,), (2079,)), verbose=False)


def _fp16_pairs(pack):
    """Notebook 06's exercise in small: one thread per packed byte, its two fp16 weights stored as one 32-bit word
    rounded by ``pack`` (ops.pack_f16x2: the solution; ops.pack_bf16x2: the starting point), the last odd weight
    by ops.to_f16_bits. Returns (launch, kernel)."""

    @cuda.jit
    def kernel(packed, absmax_q, absmax2, code2, offset, lut, out, out_u32, nbytes, n):
        i = uint64(cuda.grid(1))
        if i >= nbytes:
            return
        byte = packed[i]
        j = uint64(2) * i
        s = block_scale(absmax_q, absmax2, code2, offset, j >> uint64(6))
        hi, lo = ops.fmul_rn(lut[byte >> 4], s), ops.fmul_rn(lut[byte & 15], s)
        if j + uint64(1) < n:
            out_u32[i] = pack(hi, lo)
        else:
            out[j] = ops.to_f16_bits(hi)

    def launch(b):
        kernel[(b.nbytes + 127) // 128, 128, b.stream](b.packed, b.absmax_q, b.absmax2, b.code2, b.offset, b.lut,
                                                       b.out, b.out_u32, b.nbytes, b.n)

    return launch, kernel


SIG_PAIRS = ("(uint8[::1], uint8[::1], float32[::1], float32[::1], float32, float32[::1], uint16[::1], uint32[::1], "
             "uint64, uint64)")


def test_fp16_exercise_fails_on_the_bf16_pairs_and_passes_on_fp16_pairs_it_launches():
    start = exercises.check_fp16_path(*_fp16_pairs(ops.pack_bf16x2), SIG_PAIRS, verbose=False)
    assert not start and start.report is not None, str(start)      # bf16 bits where fp16 is wanted
    solved = exercises.check_fp16_path(*_fp16_pairs(ops.pack_f16x2), SIG_PAIRS, verbose=False)
    assert solved and "cvt.rn.f16x2.f32" in str(solved), str(solved)
    # right bits from another kernel than the one handed to the grader: refused
    other = exercises.check_fp16_path(_fp16_pairs(ops.pack_f16x2)[0], _fp16_pairs(ops.pack_f16x2)[1], SIG_PAIRS,
                                      verbose=False)
    assert not other and "never launched" in str(other), str(other)


@pytest.mark.parametrize("forced", [None, "sm_75"])
def test_fp16_exercise_reads_the_pairs_in_the_target_s_instructions(forced, monkeypatch):
    """For sm_75 (a T4, or NF4LAB_ARCH=sm_75, which sets the compile target) ops.pack_f16x2 is two cvt.rn.f16.f32
    and a 32-bit pack, and bf16 is rounded in integers (its NaN test: setp.nan.f32): the fix passes there as on the
    default target, and the starting kernel (bf16 pairs) fails on both, by its bits and by its PTX."""
    from nf4lab.measure import ptx

    if forced is None:
        monkeypatch.delenv("NF4LAB_ARCH", raising=False)
    else:
        monkeypatch.setenv("NF4LAB_ARCH", forced)
        assert nf4lab.runtime.target_cc() == (7, 5)
    solved = exercises.check_fp16_path(*_fp16_pairs(ops.pack_f16x2), SIG_PAIRS, verbose=False)
    assert solved and "cvt.rn.f16x2.f32" in str(solved), str(solved)
    launch, kernel = _fp16_pairs(ops.pack_bf16x2)
    start = exercises.check_fp16_path(launch, kernel, SIG_PAIRS, verbose=False)
    assert not start and start.report is not None, str(start)
    text = nf4lab.compile_ptx(kernel, SIG_PAIRS)
    assert ptx.sm75_paths(text) == (forced == "sm_75" or nf4lab.runtime.target_cc() < (8, 0))
    missing = [what for what, holds in exercises.fp16_pair_design(text) if not holds]
    assert missing and missing[0].startswith("no fp16 pair"), (missing, text)   # not the tail's conversion
    fixed = nf4lab.compile_ptx(_fp16_pairs(ops.pack_f16x2)[1], SIG_PAIRS)
    assert all(holds for _, holds in exercises.fp16_pair_design(fixed))


def _one_mma(layout):
    """Notebook 09's exercise: ``fragments`` by ``layout``: "ptx" (the PTX ISA's m16n8k16 layout, the solution),
    "contiguous" (lane q takes k = 4q .. 4q + 3 in A and B alike: Y comes out right, the layout is not PTX's) or
    "zeros" (the starting point). Returns (one_mma, fragments)."""
    from nf4lab.device.warp_ops import mma_bf16

    @cuda.jit(device=True, inline="always")
    def fragments(w, xt, g, q):
        r0, r1 = g * uint32(8), (g + uint32(8)) * uint32(8)
        if layout == "ptx":
            return w[r0 + q], w[r1 + q], w[r0 + q + uint32(4)], w[r1 + q + uint32(4)], xt[r0 + q], xt[r0 + q + uint32(4)]
        if layout == "contiguous":
            k = uint32(2) * q
            return w[r0 + k], w[r1 + k], w[r0 + k + uint32(1)], w[r1 + k + uint32(1)], xt[r0 + k], xt[r0 + k + uint32(1)]
        return uint32(0), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0)

    @cuda.jit
    def one_mma(w, xt, y):
        g, q, z = uint32(cuda.threadIdx.x) >> uint32(2), uint32(cuda.threadIdx.x) & uint32(3), float32(0.0)
        a0, a1, a2, a3, b0, b1 = fragments(w, xt, g, q)
        y[g, 2 * q], y[g, 2 * q + 1], y[g + 8, 2 * q], y[g + 8, 2 * q + 1] = mma_bf16(a0, a1, a2, a3, b0, b1, z, z, z, z)

    return one_mma, fragments


def test_one_mma_exercise_checks_the_ptx_layout_not_only_y():
    # A k order that A and B share leaves Y unchanged: only the registers themselves show the PTX layout.
    assert not exercises.check_one_mma(*_one_mma("zeros"))
    contiguous = _one_mma("contiguous")
    assert exercises.check_one_mma(contiguous[0])                      # Y alone: right
    assert not exercises.check_one_mma(*contiguous)
    assert exercises.check_one_mma(*_one_mma("ptx"))


def test_fp4_prediction_exercise_grades_the_prediction_not_the_bits():
    # 03's exercise 3 asks whether the kernel, unchanged, is bit-exact on fp4. A kernel that reads the launch's table
    # is; one with NF4's table baked in is not. The grade is whether the prediction matches: a wrong prediction about
    # a bit-exact kernel must not print PASSED.
    reads_lut = _make()
    baked_nf4 = _fp4_table("nf4")[0]
    for launch, exact in ((reads_lut, True), (baked_nf4, False)):
        right = exercises.check_fp4_prediction(launch, exact, shapes=SMALL, verbose=False)
        assert right and right.verdict.startswith("PASSED"), str(right)
        wrong = exercises.check_fp4_prediction(launch, not exact, shapes=SMALL, verbose=False)
        assert not wrong and wrong.verdict.startswith("NOT PASSED"), str(wrong)
        assert ("bit-exact on fp4" if exact else "not bit-exact on fp4") in str(wrong), str(wrong)
    for bad in (None, "True", 1):
        with pytest.raises(ValueError, match="predicted"):
            exercises.check_fp4_prediction(reads_lut, bad, shapes=SMALL, verbose=False)


def _while_loop(kind):
    """Notebook 02's exercise 1, in 02's argument order: ``solution`` (a while loop, stride ``cuda.gridsize(1)``),
    ``range`` (02's range loop: a trip count, so a division), ``block_stride`` (a while loop with the stride of one
    block: the right bits with repeated work), ``once`` (one byte a thread: right only on a grid of a thread per byte), ``stub`` (the notebook's starting
    point). Returns (launch, kernel)."""
    from nf4lab.lesson import BLOCK_SHIFT

    @cuda.jit
    def while_kernel(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):
        n = uint64(n)
        nbytes = uint64(nbytes)
        start = uint64(cuda.grid(1))
        stride = uint64(cuda.blockDim.x) if kind == "block_stride" else uint64(cuda.gridsize(1))
        if kind == "range":
            for i in range(start, nbytes, stride):
                s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
                j = uint64(2) * i
                out[j] = ops.to_bf16_bits(lut[packed[i] >> 4] * s)
                if j + uint64(1) < n:
                    out[j + uint64(1)] = ops.to_bf16_bits(lut[packed[i] & 15] * s)
            return
        i = start
        while i < nbytes:
            s = block_scale(absmax_q, absmax2, code2, offset, i >> uint64(BLOCK_SHIFT))
            j = uint64(2) * i
            out[j] = ops.to_bf16_bits(lut[packed[i] >> 4] * s)
            if j + uint64(1) < n:
                out[j + uint64(1)] = ops.to_bf16_bits(lut[packed[i] & 15] * s)
            if kind == "once":
                break
            i += stride

    def launch(b):
        if kind == "stub":
            raise NotImplementedError("write dequant_while and launch it here")
        per_block = 128 if kind == "once" else 256   # "once": a thread per byte, so only a small grid shows it
        while_kernel[max(1, (b.nbytes + per_block - 1) // per_block), 128, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2,
                                                                      b.offset, b.out, b.n, b.nbytes)
    return launch, (None if kind == "stub" else while_kernel)


SIG02 = "(uint8[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, uint16[::1], int64, int64)"
WHILE_SHAPES = ((3, 5), (1, 65), (31, 67))


def test_while_loop_exercise_prints_one_verdict_for_the_bits_and_the_ptx():
    """02's exercise 1: the PTX's design (no division, the grid's stride) is part of the one verdict line, where a
    bare assertion after a PASSED line left that line standing and stopped the notebook."""
    stub = exercises.check_while_loop(*_while_loop("stub"), SIG02, shapes=WHILE_SHAPES, verbose=False)
    assert not stub and stub.verdict.startswith("NOT PASSED"), str(stub)
    solved = exercises.check_while_loop(*_while_loop("solution"), SIG02, shapes=WHILE_SHAPES, verbose=False)
    assert solved and solved.verdict.startswith("PASSED") and "no division" in str(solved), str(solved)
    ranged = exercises.check_while_loop(*_while_loop("range"), SIG02, shapes=WHILE_SHAPES, verbose=False)
    assert not ranged and ranged.verdict.startswith("NOT PASSED") and "division" in ranged.verdict, str(ranged)
    block = exercises.check_while_loop(*_while_loop("block_stride"), SIG02, shapes=WHILE_SHAPES, verbose=False)
    assert not block and "gridsize(1)" in str(block), str(block)
    assert str(block).count("PASSED") == 1 and str(ranged).count("PASSED") == 1
    once = exercises.check_while_loop(*_while_loop("once"), SIG02, shapes=WHILE_SHAPES, verbose=False)
    assert not once and "2 blocks of 64 threads" in once.verdict, str(once)


@pytest.mark.parametrize("kernel", ["dequant_while", [1, 2], {"a": 1}, np.zeros(3)])
def test_graders_give_a_verdict_for_a_kernel_that_is_a_container(kernel):
    """A grader never raises because of the student's objects: a str, list, dict or array where the kernel goes
    (their types refuse a new __getitem__) gets a NOT PASSED verdict."""
    launch, _ = _while_loop("solution")
    res = exercises.check_while_loop(launch, kernel, SIG02, shapes=WHILE_SHAPES[:1], verbose=False)
    assert not res and res.verdict.startswith("NOT PASSED"), str(res)


def test_while_loop_exercise_takes_its_shapes_once():
    """Shapes given as a generator serve both of the grader's launches (as 02 sizes the grid, and 2 blocks of 64)."""
    res = exercises.check_while_loop(*_while_loop("solution"), SIG02, shapes=(s for s in WHILE_SHAPES), verbose=False)
    assert res, str(res)
