"""The shipped tensor-core GEMV (nf4lab.kernels.gemv, M = 1, word statistics) with a shorter step loop, same bits.

ac003c4's split-last kernel lost 1.9-2.3 us (~15%) where its extra code never ran: 386 SASS instructions a step
against 342, 113 registers against 95 (lab/README "Splitting only the last round lost too"). These builds go the
other way, to time whether fewer instructions a step buy time back. Each keeps the shipped step's values into the
same mma in the same order and the same float32 operations in the same order; only bookkeeping changes:

- ``pp``: the loop unrolled by two with the step's 17 words in two alternating halves of the buffer, so the ring's
  ``buf[i] = buf[i + SW]`` moves disappear (a flag says which half holds the tile's first step);
- ``lean``: what a step recomputes for nothing, computed once: the fetch tile's row bases (clamped, as the shipped
  fetch clamps them) only when the tile changes; no clamp of the word column (K % 256 == 0 here, so lane q's last
  word of any step is <= kw - 1) and no past-K test for x (always in range for the same reason); ``c < steps`` is
  ``warp < steps`` (a warp's steps are warp, warp + 8, ... < steps, or only ``warp`` when warp >= steps); the x
  slot's addresses once per lane: piece 0's four reads are one register plus immediates (4 b + 4 j < 32 words: no
  wrap), piece 1's the same XOR 64 bytes (adding 16 words mod 32 flips that bit).

    NUMBA_ENABLE_CUDASIM=1 python -m lab.gemv_lean --check   # simulator: the shipped kernel's bits, small cases
    python -m lab.gemv_lean --sass                           # offline: registers, spills, step-loop opcodes, sm_90
    python -m lab.gemv_lean --bench                          # GPU: shipped vs variants -> 09_gemv_lean.json
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import re
import shutil
import sys
import time

if __name__ == "__main__" and "--sass" in sys.argv:   # real numba.cuda without a GPU: the intrinsics compile
    os.environ["NF4LAB_MODE"] = "compile"
import nf4lab  # noqa: E402  (first: decides GPU or simulator)
from nf4lab.kernels import gemv  # noqa: E402
from nf4lab.kernels.gemv import LUT, code2_word, spare, step_ops  # noqa: E402
from nf4lab.device import ops  # noqa: E402
from nf4lab.device.warp_ops import (f32_from_bits, load_stream_u32x4, load_u32_of_bytes, mma_bf16, mma_f16,  # noqa: E402
                                    prmt, shfl_idx, shfl_xor_sync, syncwarp, table_vec4, x_slot_ops)
from numba import cuda, float32, uint32, uint64  # noqa: E402

W, THREADS, SW, NAME = gemv.W, gemv.THREADS, gemv.FBW, "09_gemv_lean"
VARIANTS = {"TC pp": (True, False), "TC lean": (False, True), "TC pp lean": (True, True)}   # name: (pp, lean)
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672), (12672, 4096)]
T, C, TP, CP, RB0, RB1, SROW, OK = range(8)   # the loop's integer state, in a local array (registers after SROA)


@functools.cache
def make_lean(is_bf16, base, pp=True, lean=True):
    mma, NB = mma_bf16 if is_bf16 else mma_f16, 2 * SW
    look, half_bits, fetch = step_ops(is_bf16, 1, base, True, True)
    x_quad, x_stash, x_read = x_slot_ops(base)
    load4, store4 = table_vec4(base)

    @cuda.jit(device=True, inline="always")
    def bases(st, tp, g, q, lane, n, kw, tiles):   # the fetch tile's rows, clamped in bounds as gemv's fetch does
        tt = min(tp, uint32(tiles - uint32(1)))
        r0 = min(uint32(tt * uint32(16) + g), uint32(n - uint32(1)))
        r1 = min(uint32(tt * uint32(16) + g + uint32(8)), uint32(n - uint32(1)))
        rs = min(uint32(tt * uint32(16) + (lane & uint32(15))), uint32(n - uint32(1)))
        st[RB0], st[RB1] = uint32(r0 * kw + uint32(8) * q), uint32(r1 * kw + uint32(8) * q)
        st[SROW] = uint32(rs * (kw >> uint32(3)))

    @cuda.jit(device=True, inline="always")
    def load(buf, NX, st, xq, packed_u32, absmax_q, absmax2, x_u32, g, q, lane, n, k, kw, tiles, steps, ash):
        """The loads of step (st[TP], st[CP]) into buf[NX:NX + SW] and xq."""
        if lean:
            cc = min(st[CP], uint32(steps - uint32(1)))
            w0, w1 = uint32(st[RB0] + cc * uint32(32)), uint32(st[RB1] + cc * uint32(32))
            buf[NX], buf[NX + 1], buf[NX + 2], buf[NX + 3] = load_stream_u32x4(packed_u32, uint64(w0))
            buf[NX + 4], buf[NX + 5], buf[NX + 6], buf[NX + 7] = load_stream_u32x4(packed_u32, uint64(w0 + uint32(4)))
            buf[NX + 8], buf[NX + 9], buf[NX + 10], buf[NX + 11] = load_stream_u32x4(packed_u32, uint64(w1))
            buf[NX + 12], buf[NX + 13], buf[NX + 14], buf[NX + 15] = load_stream_u32x4(packed_u32, uint64(w1 + uint32(4)))
            blk = uint32(st[SROW] + cc * uint32(4))
            if lane < uint32(16):
                buf[NX + 16] = load_u32_of_bytes(absmax_q, blk)
            else:
                buf[NX + 16] = ops.float_bits(absmax2[blk >> uint32(8)])
            xq[0], xq[1], xq[2], xq[3] = ops.load_u32x4(x_u32, uint64(cc * uint32(128) + uint32(4) * lane))
        else:
            fetch(buf, NX, packed_u32, absmax_q, absmax2, st[TP], st[CP], g, q, n, kw, tiles, steps, ash)
            st[OK] = uint32(x_quad(xq, x_u32, min(st[CP], uint32(steps - uint32(1))), lane, k))

    @cuda.jit(device=True, inline="always")
    def advance(st, warp, steps, grid, g, q, lane, n, kw, tiles):
        cp, tp = uint32(st[CP] + uint32(W)), st[TP]
        if cp >= steps:
            cp, tp = warp, uint32(tp + grid)
            if lean:
                bases(st, tp, g, q, lane, n, kw, tiles)
        st[CP], st[TP] = cp, tp

    @cuda.jit(device=True, inline="always")
    def step(buf, O, NX, st, acc, xq, A, xr, cf, s, sm, packed_u32, absmax_q, absmax2, x_u32, offset, who, dims, active):
        """One step of the shipped loop: compute from buf[O:O + SW], load the next into buf[NX:]; True at a tile's end
        (``who``, ``dims``: tuples, as a call of 30 or more arguments is one numba cannot inline)."""
        g, q, lane, lane4, warp, xa, xs = who
        n, k, kw, tiles, steps, ash, grid = dims
        load(buf, NX, st, xq, packed_u32, absmax_q, absmax2, x_u32, g, q, lane, n, k, kw, tiles, steps, ash)
        t, c = st[T], st[C]
        end, cn, tn = False, c, t
        if lean:
            end = st[TP] != t
            st[T] = st[TP]
        else:
            cn, tn = uint32(c + uint32(W)), t
            if cn >= steps:
                cn, tn = warp, uint32(t + grid)
        advance(st, warp, steps, grid, g, q, lane, n, kw, tiles)
        if active if lean else c < steps:
            for i in range(4):
                cf[i] = float32(0.0)
            for h in range(2):
                for i in range(8):
                    wa, wb = buf[O + 4 * h + (i >> 1)], buf[O + 8 + 4 * h + (i >> 1)]
                    sel0, sel1 = uint32(0x5504 | (2 * (i & 1)) << 4), uint32(0x5504 | (2 * (i & 1) + 1) << 4)
                    A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                    A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                    A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                    A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                if g == q:
                    if lean:
                        for j in range(4):
                            xr[4 * j], xr[4 * j + 1], xr[4 * j + 2], xr[4 * j + 3] = load4(
                                sm, uint32(xa + uint32(16 * j)) ^ uint32(64 * h))
                    else:
                        x_read(xr, sm, warp, q, h)
                for i in range(8):
                    cf[0], cf[1], cf[2], cf[3] = mma(A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3],
                                                     xr[2 * i], xr[2 * i + 1], cf[0], cf[1], cf[2], cf[3])
            raw = buf[O + 16]
            wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
            ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
            sh = uint32(16) * (q & uint32(1))
            if q < uint32(2):
                for i in range(4):
                    code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                    a2 = ag if i < 2 else ag8
                    s[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]), f32_from_bits(a2)), offset)
                acc[0] += cf[0] * s[0] + cf[1] * s[1]
                acc[1] += cf[2] * s[2] + cf[3] * s[3]
        syncwarp()   # the next step's x into the slot, once every lane has read this step's
        if lean:
            store4(sm, xs, xq[0], xq[1], xq[2], xq[3])
        else:
            x_stash(sm, xq, st[OK] != uint32(0), warp, lane)
        syncwarp()
        if lean:
            return end
        st[C], st[T] = cn, tn
        return tn != t

    @cuda.jit(launch_bounds=(THREADS, gemv.BLOCKS_PER_SM))
    def gemv_lean(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw = k >> uint32(3)
        steps, tiles = uint32((k + uint32(255)) >> uint32(8)), uint32((n + uint32(15)) >> uint32(4))
        ash, grid = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x)
        buf, xq, st = cuda.local.array(NB, uint32), cuda.local.array(4, uint32), cuda.local.array(8, uint32)
        st[T], st[C] = uint32(cuda.blockIdx.x), warp
        st[TP], st[CP] = st[T], warp
        # x slot words of this lane (as x_slot_ops' ``at``): its stash, and block q's word 0 (the reading lanes)
        xs = (((uint32(16) + uint32(4) * warp + (lane >> uint32(3))) << uint32(6)) + uint32(32)
              + ((uint32(4) * (lane & uint32(7)) + uint32(4) * (lane >> uint32(3))) & uint32(31))) << uint32(2)
        xa = (((uint32(16) + uint32(4) * warp + q) << uint32(6)) + uint32(32) + uint32(4) * q) << uint32(2)
        active = warp < steps
        if lean:
            bases(st, st[TP], g, q, lane, n, kw, tiles)
        ph = uint32(0)                  # the half of buf holding the current step (the ring: always buf[SW:])
        load(buf, 0 if pp else SW, st, xq, packed_u32, absmax_q, absmax2, x_u32, g, q, lane, n, k, kw, tiles, steps, ash)
        advance(st, warp, steps, grid, g, q, lane, n, kw, tiles)
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        for j in range(32 * 256 // THREADS):
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        cuda.syncthreads()
        lane4, parity = lane << uint32(2), uint32(0)
        who, dims = (g, q, lane, lane4, warp, xa, xs), (n, k, kw, tiles, steps, ash, grid)
        acc, cf, s = cuda.local.array(2, float32), cuda.local.array(4, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        for j in range(16):
            xr[j] = uint32(0)
        if lean:
            store4(sm, xs, xq[0], xq[1], xq[2], xq[3])
        else:
            x_stash(sm, xq, st[OK] != uint32(0), warp, lane)
        syncwarp()
        while st[T] < tiles:
            t = st[T]
            acc[0], acc[1] = float32(0.0), float32(0.0)
            while True:
                if pp:
                    if ph == uint32(0):
                        if step(buf, 0, SW, st, acc, xq, A, xr, cf, s, sm, packed_u32, absmax_q, absmax2, x_u32,
                                offset, who, dims, active):
                            ph = uint32(1)
                            break
                    ph = uint32(0)
                    if step(buf, SW, 0, st, acc, xq, A, xr, cf, s, sm, packed_u32, absmax_q, absmax2, x_u32,
                            offset, who, dims, active):
                        break
                else:
                    for i in range(SW):
                        buf[i] = buf[i + SW]
                    if step(buf, 0, SW, st, acc, xq, A, xr, cf, s, sm, packed_u32, absmax_q, absmax2, x_u32,
                            offset, who, dims, active):
                        break
            # the warps' partial sums of tile t meet in shared memory, as shipped (M = 1)
            bs = uint32(parity * uint32(W * 16) + warp * uint32(16))
            a0 = acc[0] + shfl_xor_sync(0xFFFFFFFF, acc[0], 1)
            a1 = acc[1] + shfl_xor_sync(0xFFFFFFFF, acc[1], 1)
            if q == uint32(0):
                sm[spare(bs + g)] = ops.float_bits(a0)
                sm[spare(bs + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16):
                first, v = uint32(parity * uint32(W * 16) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16))])
                row = uint32(t * uint32(16) + tid)
                if row < n:
                    y[row] = half_bits(v)
            parity = parity ^ uint32(1)

    return gemv_lean


def launch(g, variant="TC pp lean"):
    """A variant on GemvBuffers g: M = 1, nested statistics read as words (gemv.words_apply) only."""
    gemv.validate(g)
    if g.M != 1 or not gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)):
        raise ValueError("lab gemv_lean: M = 1, nested statistics with blocksize 64 and K % 256 == 0 only")
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    kern = gemv.prepare(make_lean(g.dtype == "bf16", gemv.probe_base(), *VARIANTS[variant]), args)
    kern[g.grid or gemv.grid_size(g.N), THREADS, g.stream, gemv.SMEM](*args)


def check() -> int:
    """Simulator: every variant against the shipped kernel's bits (several tiles a block, odd N, warps past K)."""
    import numpy as np
    from nf4lab.harness import gemv_check

    bad, t0 = 0, time.time()
    for N, K, dtype, G in ((37, 512, "bf16", 2), (45, 1024, "fp16", 1)):
        gc = gemv_check.make_gemv_case(N, K, dtype, seed=7)
        g = dataclasses.replace(gemv.make_gemv_buffers(gc), grid=G)
        gemv.launch(g)
        ref = g.result().copy()
        for name in VARIANTS:
            g.y.copy_to_device(np.full(N, 0x7FBF, np.uint16))
            launch(g, name)
            y = g.result().copy()
            same = np.array_equal(y, ref)
            ok = gemv_check.compare(y, gc, name=name, rounded_table=True).ok
            print(f"{N}x{K} {dtype} grid {G} {name}: shipped bits {same}, within tolerance {ok} "
                  f"({time.time() - t0:.0f} s)", flush=True)
            bad += (not same) + (not ok)
    print("PASSED" if not bad else f"FAILED: {bad} checks")
    return 1 if bad else 0


def sass() -> int:
    """Offline, sm_90: registers, spills and the step loop's SASS by opcode class (per step: pp loops hold two)."""
    import tempfile
    from pathlib import Path

    from lab import gemv_reports as R
    from nf4lab.measure.ptx import compile_ptx

    def cls(op):
        op = R.opcode(op)
        for c in ("HMMA", "LDG", "LDS", "STS", "SHFL", "MOV", "PRMT", "ISETP", "BRA", "SEL", "VIMNMX", "LOP3", "SHF",
                  "LEA", "LDC", "BSSY", "BSYNC"):
            if c in op:
                return c
        return op.split(".")[0] if op.split(".")[0] in ("IMAD", "IADD3", "VIADD", "FFMA", "FMUL", "FADD", "NOP") \
            else "other"

    d = Path(tempfile.mkdtemp())
    for dtype in ("bf16", "fp16"):
        rows = {"TC": (gemv.make_kernel(dtype == "bf16", 1, 0x400, True, words=True), 1)}
        rows.update({n: (make_lean(dtype == "bf16", 0x400, *v), 2 if v[0] else 1) for n, v in VARIANTS.items()})
        table = {}
        for name, (kern, per) in rows.items():
            info, text = R.sass_of(compile_ptx(kern, gemv.signature(), cc=(9, 0)), d, name.replace(" ", "_") + dtype)
            loop = R.hottest_loop(text)
            got = collections.Counter(cls(t) for t in loop)
            regs, spill = re.search(r"Used (\d+) registers", info).group(1), re.search(r"(\d+) bytes spill st", info).group(1)
            print(f"{name:<11} {dtype}: {regs} registers, {spill} B spilled; step loop {len(loop)} instructions for "
                  f"{per} step(s) = {len(loop) / per:.1f} a step", flush=True)
            table[name] = {c: v / per for c, v in got.items()}
        keys = sorted({c for v in table.values() for c in v}, key=lambda c: -table["TC"].get(c, 0))
        print(f"  per step {'':<6}" + "".join(f"{n:>11}" for n in table))
        for c in keys + ["total"]:
            print(f"  {c:<15}" + "".join(f"{(sum(v.values()) if c == 'total' else v.get(c, 0)):>11.1f}"
                                          for v in table.values()))
    return 0


def bench() -> int:
    """GPU: the shipped kernel and every variant at SHAPES, bf16 M = 1, CUDA-graph GPU time over weight copies
    totalling > 4x L2, timed twice in turn (A B A B) in one process, each output checked once against float64."""
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure (the simulator's timings mean nothing)")
        return 2
    import bitsandbytes.functional as F
    import torch

    from lab.gemv_peers import copies_for, cycled
    from nf4lab.measure import bench as nbench, gemv_bench

    t0, log, bad, dtype = time.time(), [], 0, "bf16"

    def say(s):
        log.append(s := f"[{time.time() - t0:5.1f} s] {s}")
        print(s, flush=True)

    say(nf4lab.describe())
    run = nbench.Run(method=nbench.METHOD + "; weights cycled over copies totalling > 4x L2; all kernels in one process")
    run.meta.update(checks=[], default_kernel=gemv_bench.kernel_name("TC"))
    fns = {"TC": gemv.launch, **{n: functools.partial(launch, variant=n) for n in VARIANTS}}
    for N, K in SHAPES:
        nb, grid = gemv_bench.weight_bytes(N, K), gemv.grid_size(N)
        copies = copies_for(nb, nf4lab.device_info().get("l2_bytes") or (50 << 20))
        data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]
        q0, x, outs, calls, times, checks = data[0][1], data[0][2], {}, {}, {}, {}
        q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
        w64 = F.dequantize_4bit(data[0][0], q32).double()
        y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
        for name, fn in fns.items():
            y = torch.empty(1, N, dtype=x.dtype, device="cuda")
            bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                            q.blocksize, y) for p, q, _ in data]
            fn(bufs[0])  # the first launch compiles
            y.fill_(float("nan"))
            fn(bufs[0])
            torch.cuda.synchronize()
            outs[name] = y.clone()
            checks[name] = dict(gemv_bench._gpu_check(y, y64, tol, gemv_bench.kernel_name(name)), shape=[N, K],
                                dtype=dtype, M=1)
            run.meta["checks"].append(checks[name])
            calls[name] = (lambda i, s, fn=fn, bufs=bufs: fn(dataclasses.replace(bufs[i], stream=s)))
        for name in [*calls, *calls]:
            times.setdefault(name, []).append(cycled(calls[name], copies))
        line = f"{N}x{K} {dtype} grid {grid}:"
        for name, ts in times.items():
            chk = checks[name]
            extra = {} if name == "TC" else {
                "bits_equal_shipped": bool(torch.equal(outs[name].view(torch.int16), outs["TC"].view(torch.int16)))}
            bad += (not chk["ok"]) + (extra.get("bits_equal_shipped") is False)
            run.add(nbench._record("kernel", chk["name"], (N, K), dtype, ts[0], nb, within_tol=chk["ok"], copies=copies,
                                   fits_l2=False, M=1, grid=grid, ms_again=ts[1]["ms"], **extra))
            line += (f" {name} {ts[0]['ms'] * 1e3:.2f} / {ts[1]['ms'] * 1e3:.2f} us (ok {chk['ok']}"
                     + "".join(f", {k} {v}" for k, v in extra.items()) + ");")
        say(line)
        del data, w64, y64, tol
        torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    path = run.save(NAME)
    say(f"saved {path}; outside tolerance or bits unlike the shipped kernel's: {bad}")
    path.with_suffix(".log").write_text("\n".join(log) + "\n")
    if os.environ.get("OUT"):   # the device tool brings back files <= 2 folders down
        os.makedirs(dst := os.path.join(os.environ["OUT"], path.parent.name), exist_ok=True)
        for p in (path, path.with_suffix(".log")):
            shutil.copy(p, dst)
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    for m in ("check", "bench", "sass"):
        mode.add_argument(f"--{m}", action="store_true")
    args = ap.parse_args()
    sys.exit(check() if args.check else bench() if args.bench else sass())
