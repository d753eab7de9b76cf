"""The tensor-core GEMV with its step loop unrolled over two buffers ("PP"), a lab variant for issue
"Decode GEMV at the read bound". Not measured yet: time it with ``python -m lab.bench_gemv --variants TC "TC PP"``.

Why. In the shipped kernel (nf4lab.kernels.gemv, D = 1) each warp keeps two steps of weights in ``buf``: at the
top of each trip ``buf[0:24] = buf[24:48]`` moves the step fetched one trip ago into place, then ``fetch`` refills
``buf[24:48]``. The sm_90 SASS (ptxas 13.5, M = 1 bf16: 115 registers) shows the cost: 24 ``IMAD.MOV.U32``
reading the registers the last trip's ``LDG.E.NA.128`` wrote, so the warp stalls there until that step's bytes
have arrived, and only then issues the next step's loads (they overwrite the moved-from registers). At the wait a
warp has no load of its own in flight but the one it waits for. A deeper ring (D = 2, 3) cannot help: its moves
read the newest loads too (lab/README: D2, D3 lost 1-2 us). Here the two slots keep fixed registers: a trip
computes step c from one slot and then refills that slot with step c + 2W, so while it waits on step c + W (the
other slot) the loads of c + 2W are already out. No moves (24 fewer instructions per 4096 weights), the same
registers, the same results bit for bit (same products, same order of sums).

The step's loads and lookups are gemv.step_ops, shared with the shipped kernel; the loop and the step's compute
are gemv.make_kernel's, rearranged (tests/test_gemv.py checks both kernels give the same bits).
"""
from __future__ import annotations

import functools
import sys

import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)
from numba import cuda, float32, uint32, uint64  # noqa: E402  (module globals: the simulator swaps them in kernels)

from nf4lab import runtime
from nf4lab.kernels import gemv, ops
from nf4lab.kernels.gemv import FB, LUT, THREADS, W, code2_word, spare
from nf4lab.kernels.warp_ops import f32_from_bits, mma_bf16, mma_f16, prmt, shfl_xor_sync


@functools.cache
def make_kernel(is_bf16, M, base, nested=True, min_blocks=gemv.BLOCKS_PER_SM, slots=2, fetch_first=False):
    """gemv.make_kernel with the step loop unrolled over ``slots`` fixed buffers (see the module docstring).

    ``fetch_first=False`` (PP): a trip computes its slot, then refills it. ``fetch_first=True`` ("F<slots>"):
    a trip first refills the slot the previous trip computed, then computes its own, so ``slots - 1`` steps
    are in flight while it computes and no load waits behind the trip's mma."""
    assert 2 <= slots <= 4
    NT = (M + 1) // 2                 # n-tiles of 8 columns: 2 batch rows x 4 blocks each
    NACC, NCF = 2 * NT, 4 * NT
    WIDE = M > 1                      # where a lane's two 16-byte pieces lie (see gemv.step_ops)
    NB = slots * FB                   # slot i at FB * i
    PRE = slots - 1 if fetch_first else slots  # steps fetched before the loop
    mma = mma_bf16 if is_bf16 else mma_f16
    look, half_bits, fetch = gemv.step_ops(is_bf16, M, base, nested)

    @cuda.jit(device=True, inline="always")
    def step(buf, o, c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx, offset):
        """Step c of the current tile from buf[o:o + FB]: lookups, mmas, scales into acc."""
        if c < steps:
            for i in range(NCF):
                cf[i] = float32(0.0)
            xcol = uint32(c * uint32(256) + uint32(64) * q)   # lane q's 64 columns: block q of the step
            for h in range(2):                 # the lane's two 16-byte pieces, 8 mmas each
                if WIDE:                       # piece h: 32 columns at 128 h + 32 q, block 2 h + q // 2
                    xcol = uint32(c * uint32(256) + uint32(128 * h) + uint32(32) * q)
                    blk = uint32(2 * h) + (q >> uint32(1))
                else:
                    blk = q
                for i in range(8):
                    wa = buf[o + 4 * h + (i >> 1)]
                    wb = buf[o + 8 + 4 * h + (i >> 1)]
                    sel0 = uint32(0x5504 | ((2 * (i & 1)) << 4))
                    sel1 = uint32(0x5504 | ((2 * (i & 1) + 1) << 4))
                    A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                    A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                    A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                    A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                for nt in range(NT):
                    # B: lane (g, q) holds column g = 4 mm + b: x of batch row 2 nt + mm where b is its block
                    m = uint32(2 * nt) + (g >> uint32(2))
                    if (blk if WIDE else q) == (g & uint32(3)) and m < uint32(M) and xcol < k:
                        xi = uint64(m * kx + (xcol >> uint32(1)) + uint32(0 if WIDE else 16 * h))
                        for j in range(4):
                            xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = \
                                ops.load_u32x4(x_u32, xi + uint64(4 * j))
                    else:
                        for j in range(16):
                            xr[j] = uint32(0)
                    for i in range(8):
                        cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3] = mma(
                            A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3], xr[2 * i], xr[2 * i + 1],
                            cf[4 * nt], cf[4 * nt + 1], cf[4 * nt + 2], cf[4 * nt + 3])
            # lane q holds columns 2q, 2q+1: batch row 2 nt + q // 2, blocks 2 (q & 1), +1; rows g, g + 8
            if (q >> uint32(1)) < uint32(M):
                for i in range(4):
                    if nested:
                        s[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(buf[o + 16 + i])]),
                                                       f32_from_bits(buf[o + 20 + i])), offset)
                    else:
                        s[i] = f32_from_bits(buf[o + 20 + i])
                for nt in range(NT):
                    acc[2 * nt] += cf[4 * nt] * s[0] + cf[4 * nt + 1] * s[1]
                    acc[2 * nt + 1] += cf[4 * nt + 2] * s[2] + cf[4 * nt + 3] * s[3]

    @cuda.jit(device=True, inline="always")
    def trip(buf, o, prev, c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx, offset,
             packed_u32, absmax_q, absmax2, tp, cp, n, kw, tiles, ash):
        """Compute the step in slot ``o`` and put the next step's loads out: into ``prev`` (the slot the last
        trip computed) before the compute, or into ``o`` after it."""
        if fetch_first:
            fetch(buf, prev, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
        step(buf, o, c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx, offset)
        if not fetch_first:
            fetch(buf, o, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)

    @cuda.jit(launch_bounds=(THREADS, min_blocks))
    def gemv_tc(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        warp = tid >> uint32(5)
        g = lane >> uint32(2)
        q = lane & uint32(3)
        n = uint32(N)
        k = uint32(K)
        kw = k >> uint32(3)
        kx = k >> uint32(1)
        steps = (k + uint32(255)) >> uint32(8)
        tiles = (n + uint32(15)) >> uint32(4)
        ash = uint32(uint32(bs_shift) - uint32(3))
        grid = uint32(cuda.gridDim.x)
        buf = cuda.local.array(NB, uint32)
        # the first steps' loads go out before the table is built: slots 0 .. PRE - 1
        t = uint32(cuda.blockIdx.x)
        c = warp
        tp, cp = t, c
        for d in range(PRE):
            fetch(buf, FB * d, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
            cp = uint32(cp + uint32(W))
            if cp >= steps:
                cp = warp
                tp = uint32(tp + grid)
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        if nested:
            sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):    # the used half of each 256-byte row
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
        lane4 = lane << uint32(2)
        acc = cuda.local.array(NACC, float32)
        cf = cuda.local.array(NCF, float32)
        s = cuda.local.array(4, float32)
        A = cuda.local.array(32, uint32)
        xr = cuda.local.array(32, uint32)
        parity = uint32(0)
        slot = uint32(0)
        while t < tiles:
            for i in range(NACC):
                acc[i] = float32(0.0)
            while True:
                # one copy per slot, each with fixed registers: no ring moves (the offsets are constants)
                if slot == uint32(0):
                    trip(buf, 0, FB * (slots - 1), c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx,
                         offset, packed_u32, absmax_q, absmax2, tp, cp, n, kw, tiles, ash)
                elif slot == uint32(1):
                    trip(buf, FB, 0, c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx,
                         offset, packed_u32, absmax_q, absmax2, tp, cp, n, kw, tiles, ash)
                elif slots > 2 and slot == uint32(2):
                    trip(buf, 2 * FB, FB, c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx,
                         offset, packed_u32, absmax_q, absmax2, tp, cp, n, kw, tiles, ash)
                elif slots > 3:
                    trip(buf, 3 * FB, 2 * FB, c, steps, sm, x_u32, acc, cf, s, A, xr, g, q, lane4, k, kx,
                         offset, packed_u32, absmax_q, absmax2, tp, cp, n, kw, tiles, ash)
                slot = uint32(slot + uint32(1))
                if slot == uint32(slots):
                    slot = uint32(0)
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp = warp
                    tp = uint32(tp + grid)
                cn = uint32(c + uint32(W))
                tn = t
                if cn >= steps:
                    cn = warp
                    tn = uint32(t + grid)
                c = cn
                if tn != t:
                    break
            # the warps' partial sums of this tile meet in shared memory (lanes q, q ^ 1 hold the same batch row)
            base = uint32(parity * uint32(W * 16 * M) + warp * uint32(16 * M))
            for nt in range(NT):
                a0 = acc[2 * nt] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt], 1)
                a1 = acc[2 * nt + 1] + shfl_xor_sync(0xFFFFFFFF, acc[2 * nt + 1], 1)
                m = uint32(2 * nt) + (q >> uint32(1))
                if m < uint32(M) and (q & uint32(1)) == uint32(0):
                    sm[spare(base + m * uint32(16) + g)] = ops.float_bits(a0)
                    sm[spare(base + m * uint32(16) + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16 * M):
                first = uint32(parity * uint32(W * 16 * M) + tid)
                v = float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16 * M))])
                row = uint32(t * uint32(16) + (tid & uint32(15)))
                if row < n:
                    y[uint32((tid >> uint32(4)) * n + row)] = half_bits(v)
            parity ^= uint32(1)
            t = tn

    gemv_tc.__name__ = f"gemv_tc_{'f' if fetch_first else 'pp'}{slots}"  # (numba names the kernel from the function)
    return gemv_tc


def launch(g, blocks_per_sm=gemv.BLOCKS_PER_SM, slots=2, fetch_first=False):
    """Run the PP kernel (or another slot loop: see make_kernel) on GemvBuffers ``g`` (as gemv.launch, with the
    shipped grid)."""
    gemv.validate(g)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    base = gemv.probe_base() if runtime.ON_GPU else 0
    kern = gemv.prepare(make_kernel(g.dtype == "bf16", g.M, base, g.nested, blocks_per_sm, slots, fetch_first), args)
    grid = g.grid or min(-(-g.N // 16), blocks_per_sm * gemv.sms())
    kern[grid, THREADS, g.stream, gemv.SMEM](*args)


def main() -> int:
    """Offline, no GPU: registers, spills and SASS instructions per weight of the hottest loop, the slot loops
    beside the shipped kernel, for sm_90 (ptxas + cuobjdump, as lab/sass_gemv.py), and the scoreboards their
    weight loads write with the number of waits on them per loop (the loop holds one step per slot)."""
    import tempfile

    from lab import gemv_reports

    work = tempfile.mkdtemp()
    for dtype in ("bf16", "fp16"):
        for M in (1, 8):
            for label, kern, steps in (("shipped", gemv.make_kernel(dtype == "bf16", M, 0x400), 1),
                                       ("PP", make_kernel(dtype == "bf16", M, 0x400), 2),
                                       ("F3", make_kernel(dtype == "bf16", M, 0x400, True, 2, 3, True), 3)):
                stem = f"gemv_{label}_{dtype}_M{M}"
                r = gemv_reports.sass_report(kern, gemv.signature(), 128 * steps, stem, workdir=work)
                sb = gemv_reports.weight_load_waits(open(f"{work}/{stem}.sass").read())
                moves = sum(v for k, v in r["opcodes"].items() if "MOV" in k)
                print(f"{label:>7} {dtype} M={M}: {r['registers']} registers, {r['spill_bytes']} B spilled; hottest loop "
                      f"{r['loop_instructions']} SASS instructions for {steps} step(s) = {r['per_weight']:.2f} per "
                      f"weight, {moves} moves; weight loads on scoreboard(s) {sb['scoreboards']}, "
                      f"{sb['waits']} waits on them", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
