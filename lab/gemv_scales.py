"""The shipped M = 1 GEMV with each tile's scales computed once by the block ("TC scales"), timed beside it.

The shipped step loads a statistics word a lane, shuffles 4 words to the 16 lanes that scale, and each of them
looks up 4 code2 values and computes its 4 scales (code2[c] x absmax2 + offset) every step. Here the block
computes all of a tile's scales once, one 16-block chunk of a row a thread (one 16-byte load of absmax codes, two
absmax2 loads, loaded a tile ahead), into one of two shared-memory buffers past the table (row pitch 4 B + 16 bytes:
the 16 lanes' reads hit distinct banks), published by the barrier that ends the previous tile; a step reads its 4
scales with 4 shared loads and no statistics load, shuffle or scale arithmetic. The same scales reach the same
arithmetic in the same order: the shipped kernel's bits. K % 1024 == 0 and K <= 16384 (one chunk a thread).

    NF4LAB_MODE=compile python -m lab.gemv_scales --sass     # offline: SASS a step (ptxas sm_90)
    python -m lab.gemv_scales --bench                        # GPU: A B A B at 4 shapes -> 09_gemv_scales.json
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shutil
import sys
import time

import numpy as np
from numba import cuda, float32, uint32, uint64

import nf4lab
from nf4lab.device import gemv_loads, ops
from nf4lab.device.warp_ops import (
    f32_from_bits,
    mma_bf16,
    mma_f16,
    prmt,
    shfl_xor_sync,
    syncwarp,
    table_lookup,
    x_slot_ops,
)
from nf4lab.kernels import gemv

NAME = "09_gemv_scales"
SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)]
SC = gemv.SMEM                   # the two scale buffers start after the table
MAX_K = 16384                    # 16 rows x K/64 blocks in chunks of 16: one chunk a thread


def pitch(K):                    # bytes a row of scales: 4 per 64-column block, + 16 against bank conflicts
    return 4 * (K // 64) + 16


def smem_bytes(K):
    return SC + 2 * 16 * pitch(K)


@functools.cache
def make_scales_kernel(is_bf16, base):
    """M = 1, nested statistics, blocksize 64, K % 1024 == 0, K <= MAX_K; ``base`` as in ``gemv.make_kernel``."""
    W, THREADS, LUT = gemv.W, gemv.THREADS, gemv.LUT
    mma = mma_bf16 if is_bf16 else mma_f16
    _, half_bits, _ = gemv.step_ops(is_bf16, 1, base, True, True)
    look = table_lookup(base)
    slot_at, _, x_put, x_get = x_slot_ops(base)
    rows, _ = gemv.step1_ops()
    put = gemv_loads._put_op()
    code2_word, spare = gemv.code2_word, gemv.spare

    @cuda.jit(device=True, inline="always")
    def fetch(buf, o, xq, packed_u32, x_u32, rb, cp, lane, steps):   # gemv.step1_ops' fetch1 without statistics
        cc = min(cp, uint32(steps - uint32(1)))
        w0, w1 = uint32(rb[0] + cc * uint32(32)), uint32(rb[1] + cc * uint32(32))
        put(buf, o, packed_u32, w0)
        put(buf, o + 4, packed_u32, w0 + uint32(4))
        put(buf, o + 8, packed_u32, w1)
        put(buf, o + 12, packed_u32, w1 + uint32(4))
        xq[0], xq[1], xq[2], xq[3] = ops.load_u32x4(x_u32, uint64(cc * uint32(128) + uint32(4) * lane))

    @cuda.jit(device=True, inline="always")
    def stat_load(st, absmax_q_u32, absmax2, tt, tid, n, nb, tiles):
        """Thread tid's chunk of tile tt's statistics: 16 absmax codes (blocks 16 j.. of row r) and the absmax2 of
        its first and last block, into st[0:6]; nothing past the tile's chunks or the last tile."""
        chunks = nb >> uint32(4)                      # 16-block chunks a row
        if tid < uint32(16) * chunks and tt < tiles:
            r = min(uint32(tt * uint32(16) + tid // chunks), uint32(n - uint32(1)))
            gb = uint32(r * nb + (tid % chunks) * uint32(16))
            st[0], st[1], st[2], st[3] = ops.load_u32x4(absmax_q_u32, uint64(gb >> uint32(2)))
            st[4] = ops.float_bits(absmax2[gb >> uint32(8)])
            st[5] = ops.float_bits(absmax2[(gb + uint32(15)) >> uint32(8)])

    @cuda.jit(device=True, inline="always")
    def stat_store(sm, st, buf_at, tid, nb, pw, offset):
        """Thread tid's 16 scales into the buffer at word buf_at (rows pw words apart)."""
        chunks = nb >> uint32(4)
        if tid < uint32(16) * chunks:
            r, j = tid // chunks, tid % chunks
            at = uint32(buf_at + r * pw + j * uint32(16))
            split = uint32(256) - ((r * nb + j * uint32(16)) & uint32(255))   # blocks before absmax2 changes
            for i in range(16):
                code = (st[i >> 2] >> uint32(8 * (i & 3))) & uint32(0xFF)
                a2 = st[4] if uint32(i) < split else st[5]
                sm[at + uint32(i)] = ops.float_bits(ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]),
                                                                             f32_from_bits(a2)), offset))

    @cuda.jit(launch_bounds=(THREADS, gemv.BLOCKS_PER_SM))
    def gemv_scales(packed_u32, absmax_q_u32, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw, nb = k >> uint32(3), k >> uint32(6)
        pw = uint32(nb + uint32(4))                    # words a row of scales
        steps, tiles = (k + uint32(255)) >> uint32(8), (n + uint32(15)) >> uint32(4)
        grid = uint32(cuda.gridDim.x)
        buf = cuda.local.array(32, uint32)
        st = cuda.local.array(6, uint32)
        t, c = uint32(cuda.blockIdx.x), warp
        tp, cp = t, c
        xq, rb = cuda.local.array(4, uint32), cuda.local.array(3, uint32)
        xs, xa = slot_at(warp, lane)
        stat_load(st, absmax_q_u32, absmax2, t, tid, n, nb, tiles)
        rows(rb, tp, g, q, lane, n, kw, tiles)
        fetch(buf, 16, xq, packed_u32, x_u32, rb, cp, lane, steps)
        cp = uint32(cp + uint32(W))
        if cp >= steps:
            cp, tp = warp, uint32(tp + grid)
            rows(rb, tp, g, q, lane, n, kw, tiles)
        if tid < uint32(16):
            sm[uint32(LUT) + tid] = half_bits(lut[tid])
        sm[code2_word(tid)] = ops.float_bits(code2[tid])
        cuda.syncthreads()
        sc0 = uint32(SC >> 2)
        for j in range(32 * 256 // THREADS):    # the used half of each 256-byte row
            i = uint32(tid + uint32(j * THREADS))
            e = i >> uint32(5)
            sm[(e << uint32(6)) | (i & uint32(31))] = sm[uint32(LUT) + (e >> uint32(4))] | (sm[uint32(LUT) + (e & uint32(15))] << uint32(16))
        stat_store(sm, st, sc0, tid, nb, pw, offset)   # the first tile's scales into buffer 0, after the table:
        cuda.syncthreads()                             # their loads' latency hides behind the table's fill
        lane4, parity = lane << uint32(2), uint32(0)
        acc, cf, s = cuda.local.array(2, float32), cuda.local.array(4, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        for j in range(16):
            xr[j] = uint32(0)
        x_put(sm, xs, xq)
        syncwarp()
        # lane (g, q < 2)'s scales: row g at word g pw + 4 c + 2 q (+1), row g + 8 at 8 pw further
        mine = uint32(g * pw + uint32(2) * q)
        while t < tiles:
            stat_load(st, absmax_q_u32, absmax2, uint32(t + grid), tid, n, nb, tiles)   # the next tile's, a tile ahead
            sbuf = uint32(sc0 + parity * uint32(16) * pw + mine)
            acc[0], acc[1] = float32(0.0), float32(0.0)
            pending = uint32(t + grid) < tiles          # the next tile's scales still to store
            while True:
                for i in range(16):
                    buf[i] = buf[i + 16]
                fetch(buf, 16, xq, packed_u32, x_u32, rb, cp, lane, steps)
                cn, tn = cp, tp
                cp = uint32(cp + uint32(W))
                if cp >= steps:
                    cp, tp = warp, uint32(tp + grid)
                    rows(rb, tp, g, q, lane, n, kw, tiles)
                if warp < steps:
                    for i in range(4):
                        cf[i] = float32(0.0)
                    for h in range(2):
                        for i in range(8):
                            wa, wb = buf[4 * h + (i >> 1)], buf[8 + 4 * h + (i >> 1)]
                            sel0, sel1 = uint32(0x5504 | (2 * (i & 1)) << 4), uint32(0x5504 | (2 * (i & 1) + 1) << 4)
                            A[4 * i] = look(sm, prmt(wa, lane4, sel0))
                            A[4 * i + 1] = look(sm, prmt(wb, lane4, sel0))
                            A[4 * i + 2] = look(sm, prmt(wa, lane4, sel1))
                            A[4 * i + 3] = look(sm, prmt(wb, lane4, sel1))
                        if g == q:
                            x_get(xr, sm, xa, h)
                        for i in range(8):
                            cf[0], cf[1], cf[2], cf[3] = mma(A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3],
                                                             xr[2 * i], xr[2 * i + 1], cf[0], cf[1], cf[2], cf[3])
                    if q < uint32(2):
                        at = uint32(sbuf + uint32(4) * c)
                        s[0], s[1] = f32_from_bits(sm[at]), f32_from_bits(sm[at + uint32(1)])
                        s[2], s[3] = f32_from_bits(sm[at + uint32(8) * pw]), f32_from_bits(sm[at + uint32(8) * pw + uint32(1)])
                        acc[0] += cf[0] * s[0] + cf[1] * s[1]
                        acc[1] += cf[2] * s[2] + cf[3] * s[3]
                if pending:   # after the tile's first step, off the barrier's path: the next tile's scales into
                    # the other buffer (its last readers passed the previous tile's barrier)
                    stat_store(sm, st, uint32(sc0 + (parity ^ uint32(1)) * uint32(16) * pw), tid, nb, pw, offset)
                    pending = False
                syncwarp()
                x_put(sm, xs, xq)
                syncwarp()
                c = cn
                if tn != t:
                    break
            base_ = uint32(parity * uint32(W * 16) + warp * uint32(16))
            a0 = acc[0] + shfl_xor_sync(0xFFFFFFFF, acc[0], 1)
            a1 = acc[1] + shfl_xor_sync(0xFFFFFFFF, acc[1], 1)
            if q == uint32(0):
                sm[spare(base_ + g)] = ops.float_bits(a0)
                sm[spare(base_ + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16):
                first, v = uint32(parity * uint32(W * 16) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16))])
                row = uint32(t * uint32(16) + tid)
                if row < n:
                    y[row] = half_bits(v)
            parity, t = parity ^ uint32(1), tn

    return gemv_scales


def prepare(kern, args, nbytes):
    """Dynamic shared memory past 48 KB (the driver's carveout)."""
    from numba.cuda.cudadrv.driver import binding, driver

    argtypes = tuple(kern.typeof_pyval(a) for a in args)
    done = kern.__dict__.setdefault("_smem_ready", set())
    if (argtypes, nbytes) not in done:
        f = kern.compile(argtypes)._codelibrary.get_cufunc()
        A = binding.CUfunction_attribute
        driver.cuKernelSetAttribute(A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes), f.handle, f.device.id)
        done.add((argtypes, nbytes))
    return kern


def applies(g) -> bool:
    return (g.M == 1 and g.K % 1024 == 0 and g.K <= MAX_K and g.bs_shift == 6
            and gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)))


def launcher():
    def launch(g):
        gemv.validate(g)
        if not applies(g):
            return gemv.launch(g)     # K past MAX_K (8192x28672) or not a multiple of 1024: the shipped kernel
        if gemv.address(g.absmax_q) % 16:
            raise ValueError("lab gemv_scales: absmax_q must be 16-byte aligned")
        aq = g.absmax_q.view(np.uint32)
        args = (g.packed_u32, aq, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
        kern = prepare(make_scales_kernel(g.dtype == "bf16", gemv.probe_base()), args, smem_bytes(g.K))
        kern[g.grid or gemv.grid_size(g.N), gemv.THREADS, g.stream, smem_bytes(g.K)](*args)

    return launch


VARIANTS = {"TC scales": ()}


def sass() -> int:
    """Offline (NF4LAB_MODE=compile): ptxas -v and the SASS instructions a step of each variant, sm_90."""
    import collections
    import re
    import tempfile
    from pathlib import Path

    from lab.gemv_reports import _instructions, opcode, sass_of

    def step_loop(sa):   # the loop with the most HMMA: from a backward branch's target to the branch
        ins, best = _instructions(sa), []
        for i, (a, t) in enumerate(ins):
            m = re.search(r"BRA (0x[0-9a-f]+)", t)
            if m and int(m.group(1), 16) <= a:
                j = next(j for j, (b, _) in enumerate(ins) if b >= int(m.group(1), 16))
                body = [x for _, x in ins[j:i + 1]]
                if sum("HMMA" in x for x in body) > sum("HMMA" in x for x in best):
                    best = body
        return best
    from nf4lab.measure import ptx as mptx

    work = Path(tempfile.mkdtemp())
    for name in ("TC", *VARIANTS):
        for dt in ("bf16",):
            k = (gemv.make_kernel(dt == "bf16", 1, 0x400, True) if name == "TC"
                 else make_scales_kernel(dt == "bf16", 0x400))
            sg = gemv.signature()
            if name != "TC":
                from numba import types
                sg = (sg[0], types.uint32[::1], *sg[2:])
            text = mptx.compile_ptx(k, sg, cc=(9, 0))
            info, sa = sass_of(text, work, name.replace(" ", "_"))
            print(f"{name} {dt}: {' '.join(l.strip() for l in info.splitlines() if 'registers' in l or 'spill' in l)}")
            step = step_loop(sa)
            ops_ = collections.Counter(opcode(t).split(".")[0] for t in step)
            print(f"    step loop: {len(step)} SASS, " + ", ".join(f"{k} {v}" for k, v in ops_.most_common(12)))
    return 0


def smoke(say) -> int:
    """GPU: each variant against the shipped kernel's bits on small cases that wrap the rings across tiles (partial
    last tile, 17 steps a tile so warp 0 takes 3 and the others 2, few blocks with several tiles each)."""
    from nf4lab.harness import gemv_check

    bad = 0
    for N, K, dtype, G in ((37, 2048, "bf16", 1), (300, 5120, "fp16", 3), (20, 1024, "bf16", 3), (45, 1024, "fp16", 1), (70, 16384, "bf16", 2), (1000, 4096, "bf16", 7), (64, 8192, "bf16", 2)):
        gc = gemv_check.make_gemv_case(N, K, dtype, seed=11)
        g = dataclasses.replace(gemv.make_gemv_buffers(gc), grid=G)
        gemv.launch(g)
        ref = g.result().copy()
        for name, v in list(VARIANTS.items())[:1]:   # only the copy has bits to compare
            g.y.copy_to_device(np.full(N, 0x7FBF, np.uint16))
            launcher()(g)
            same = np.array_equal(g.result(), ref)
            say(f"smoke {N}x{K} {dtype} grid {G} {name}: shipped bits {same}")
            bad += not same
    return bad


def bench() -> int:
    """GPU: the shipped kernel and the variant at SHAPES, M = 1, CUDA-graph GPU time over weight copies
    totalling > 4x L2, timed twice in turn (A B A B) in one process, the read bound in the same process; each output
    checked against float64 and bit-compared with the shipped kernel (bf16 and fp16)."""
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure")
        return 2
    import bitsandbytes.functional as F
    import torch

    import lab.gemv_read_bound as rb
    from lab.gemv_peers import READ_CONFIGS, copies_for, cycled, read_bound
    from nf4lab.measure import bench as nbench
    from nf4lab.measure import gemv_bench

    t0, log, bad = time.time(), [], 0

    def say(s):
        log.append(s := f"[{time.time() - t0:5.1f} s] {s}")
        print(s, flush=True)

    say(nf4lab.describe())
    bad = smoke(say)
    run = nbench.Run(method=nbench.METHOD + "; weights cycled over copies totalling > 4x L2; all kernels in one process")
    run.meta.update(checks=[], smoke_failures=bad, default_kernel=gemv_bench.kernel_name("TC"), max_k=MAX_K)
    readers = {u: rb.make_reader(u) for u in sorted({u for u, _ in READ_CONFIGS})}
    sms, l2 = gemv.sms(), nf4lab.device_info().get("l2_bytes") or (50 << 20)
    fns = {"TC": gemv.launch, **{name: launcher() for name in VARIANTS}}
    for N, K in SHAPES:
        bound = read_bound(N, K, sms, l2, readers, say)
        run.records.append(bound)
        nb, grid = gemv_bench.weight_bytes(N, K), gemv.grid_size(N)
        copies = copies_for(nb, l2)
        for dtype in ("bf16", "fp16"):
            data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]
            q0, x = data[0][1], data[0][2]
            q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
            w64 = F.dequantize_4bit(data[0][0], q32).double()
            y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
            outs, calls, times, checks = {}, {}, {}, {}
            for name, fn in fns.items():
                y = torch.empty(1, N, dtype=x.dtype, device="cuda")
                bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code,
                                                q.offset.item(), q.blocksize, y) for p, q, _ in data]
                try:
                    for b in bufs:      # compiles, and makes every tensor map before the graph capture
                        fn(b)
                    y.fill_(float("nan"))
                    fn(bufs[0])
                    torch.cuda.synchronize()
                except Exception as e:
                    say(f"{N}x{K} {dtype} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                    bad += 1
                    if "CUDA_ERROR" in str(e) or "trap" in str(e).lower():
                        raise
                    continue
                outs[name] = y.clone()
                checks[name] = dict(gemv_bench._gpu_check(y, y64, tol, gemv_bench.kernel_name(name)), shape=[N, K],
                                    dtype=dtype, M=1)
                run.meta["checks"].append(checks[name])
                calls[name] = (lambda i, s, fn=fn, bufs=bufs: fn(dataclasses.replace(bufs[i], stream=s)))
            if dtype == "bf16":
                for name in [*calls, *calls]:
                    times.setdefault(name, []).append(cycled(calls[name], copies))
            line = f"{N}x{K} {dtype} grid {grid} (read bound {bound['ms'] * 1e3:.2f} us):"
            for name in calls:
                chk = checks[name]
                extra = {} if name == "TC" else {
                    "bits_equal_shipped": bool(torch.equal(outs[name].view(torch.int16), outs["TC"].view(torch.int16)))}
                bad += (not chk["ok"]) + (extra.get("bits_equal_shipped") is False)
                if name in times:
                    ts = times[name]
                    run.add(nbench._record("kernel", chk["name"], (N, K), dtype, ts[0], nb, within_tol=chk["ok"],
                                           copies=copies, fits_l2=False, M=1, grid=grid, ms_again=ts[1]["ms"],
                                           pct_bound=100 * bound["ms"] / ts[0]["ms"], **extra))
                    line += f" {name} {ts[0]['ms'] * 1e3:.2f} / {ts[1]['ms'] * 1e3:.2f} us"
                    line += f" ({100 * bound['ms'] / ts[0]['ms']:.0f}% of bound)"
                else:
                    line += f" {name}"
                line += f" [ok {chk['ok']}" + "".join(f", {k} {v}" for k, v in extra.items()) + "];"
            say(line)
            del data, w64, y64, tol
            torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    path = run.save(NAME)
    say(f"saved {path}; outside tolerance, failed or bits unlike the shipped kernel's: {bad}")
    path.with_suffix(".log").write_text("\n".join(log) + "\n")
    if os.environ.get("OUT"):   # the device tool brings back files <= 2 folders down
        os.makedirs(dst := os.path.join(os.environ["OUT"], path.parent.name), exist_ok=True)
        for p in (path, path.with_suffix(".log")):
            shutil.copy(p, dst)
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    for m in ("sass", "bench"):
        mode.add_argument(f"--{m}", action="store_true")
    args = ap.parse_args()
    sys.exit(sass() if args.sass else bench())
