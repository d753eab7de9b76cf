"""The shipped tensor-core GEMV (nf4lab.kernels.gemv, M = 1) with only its last, partial round of tiles split.

At K = 4096 the shipped kernel's time follows the largest tile count per block (14336x4096: 896 tiles on 264
blocks, the last round on 104; lab/README "Three leads timed on the H200"); a stream-K split of all the work lost
(a10a699): its loop cost even where nothing was split, and its global round trips came last. Here the whole rounds
keep the shipped loop and tile order, and only the last round's L steps are shared out, block b taking [b L / G,
(b + 1) L / G) in tile order FIRST, so that its part's chain (row sums to a global slot, a release atomic per row;
the last to count in sums the parts in block order, whatever the arrival order, writes y and zeroes the counter)
overlaps its whole tiles.

    NUMBA_ENABLE_CUDASIM=1 python -m lab.gemv_splitlast --check   # simulator: reference, shipped bits, counters
    python -m lab.gemv_splitlast --bench                          # GPU: both kernels -> 09_gemv_splitlast.json
    python -m lab.gemv_splitlast --sass                           # offline: ptxas registers and spills, sm_90
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

if __name__ == "__main__" and "--sass" in sys.argv:   # real numba.cuda without a GPU: the intrinsics below compile
    os.environ["NF4LAB_MODE"] = "compile"
import nf4lab  # first: decides GPU or simulator
from nf4lab.kernels import gemv
from nf4lab.kernels.gemv import LUT, code2_word, spare, step_ops
from nf4lab.device import ops
from nf4lab.device.warp_ops import f32_from_bits, mma_bf16, mma_f16, prmt, shfl_idx, shfl_xor_sync, syncwarp, x_slot_ops
from numba import cuda, float32, types, uint32

# numba's threadfence is fence.sc.gpu, which also invalidates the SM's L1 (CCTL.IVALL), where both blocks' x and
# statistics live: the parts count in with a release atomic instead (MEMBAR.ALL.GPU, no invalidation), and only
# the last to count in pays an acquire fence.
if nf4lab.SIMULATOR:   # its blocks run one after another
    def count_in(arr, i):
        old, arr[i] = arr[i], arr[i] + uint32(1)
        return old

    def fence_acquire():
        pass
else:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    @intrinsic
    def count_in(typingctx, arr, i):   # atom.release.gpu.add.u32 of 1 at arr[i]: the old count
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [idx], wraparound=False)
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.IntType(64)]), "atom.release.gpu.add.u32 $0, [$1], 1;",
                               "=r,l,~{memory}", side_effect=True)
            return builder.call(asm, [builder.ptrtoint(ptr, ir.IntType(64))])

        return types.uint32(arr, i), codegen

    @intrinsic
    def fence_acquire(typingctx):
        def codegen(context, builder, sig, args):
            builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "fence.acq_rel.gpu;", "~{memory}",
                                      side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen


W, THREADS, NAME = gemv.W, gemv.THREADS, "09_gemv_splitlast"
SHAPES = [(4096, 4096, "bf16"), (4096, 14336, "bf16"), (14336, 4096, "bf16"), (8192, 28672, "bf16"),
          (12672, 4096, "bf16"), (14336, 4096, "fp16")]


@functools.cache
def make_splitlast(is_bf16, base):
    SW, NB = gemv.FBW, 2 * gemv.FBW
    mma = mma_bf16 if is_bf16 else mma_f16
    look, half_bits, fetch = step_ops(is_bf16, 1, base, True, True)
    x_quad, x_stash, x_read = x_slot_ops(base)

    @cuda.jit(device=True, inline="always")
    def advance(t, c, left, steps, da, dr, b, warp, grid):
        """The warp's next step: while ``left`` split steps remain, W further in tile order (W = da steps + dr: no
        division in the loop), then the whole tiles b, b + grid, ... at steps warp, warp + W, ... as shipped."""
        if left > uint32(0):
            left, c, t = uint32(left - uint32(1)), uint32(c + dr), uint32(t + da)
            if c >= steps:
                c, t = uint32(c - steps), uint32(t + uint32(1))
            if left == uint32(0):
                t, c = b, warp
        else:
            c = uint32(c + uint32(W))
            if c >= steps:
                c, t = warp, uint32(t + grid)
        return t, c, left

    @cuda.jit(launch_bounds=(THREADS, gemv.BLOCKS_PER_SM))
    def gemv_sl(packed_u32, absmax_q, absmax2, code2, lut, offset, x_u32, y, N, K, bs_shift, ws, cnt):
        sm = cuda.shared.array(0, uint32)
        tid = uint32(cuda.threadIdx.x)
        lane, warp = tid & uint32(31), tid >> uint32(5)
        g, q = lane >> uint32(2), lane & uint32(3)
        n, k = uint32(N), uint32(K)
        kw = k >> uint32(3)
        steps, tiles = uint32((k + uint32(255)) >> uint32(8)), uint32((n + uint32(15)) >> uint32(4))
        ash, grid, b = uint32(uint32(bs_shift) - uint32(3)), uint32(cuda.gridDim.x), uint32(cuda.blockIdx.x)
        tl = uint32((tiles // grid) * grid)          # the last round's first tile
        L = uint32((tiles - tl) * steps)             # its steps, shared out over all blocks (launch: G L < 2^32)
        lo, hi = uint32(b * L // grid), uint32((b + uint32(1)) * L // grid)
        u, da, dr = uint32(lo + warp), uint32(W) // steps, uint32(W) % steps
        left = uint32((hi - u + uint32(W - 1)) // uint32(W)) if u < hi else uint32(0)   # the warp's split steps
        t, c = (uint32(tl + u // steps), uint32(u % steps)) if u < hi else (b, warp)
        tp, cp, lp = t, c, left                       # the step whose loads go out next
        buf, xq = cuda.local.array(NB, uint32), cuda.local.array(4, uint32)
        xok = x_quad(xq, x_u32, cp, lane, k)
        fetch(buf, SW, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
        tp, cp, lp = advance(tp, cp, lp, steps, da, dr, b, warp, grid)
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
        cf, s4 = cuda.local.array(4, float32), cuda.local.array(4, float32)
        A, xr = cuda.local.array(32, uint32), cuda.local.array(32, uint32)
        for j in range(16):
            xr[j] = uint32(0)
        x_stash(sm, xq, xok, warp, lane)
        syncwarp()
        split = lo < hi
        t1 = uint32(tl + lo // steps)
        t2 = uint32(tl + (hi - uint32(1)) // steps) if split else t1
        st = t1 if split else b                       # the tile this block sums next: its split part's, then whole
        while split or st < tl:
            acc0, acc1 = float32(0.0), float32(0.0)
            while t == st:
                for i in range(SW):
                    buf[i] = buf[i + SW]
                fetch(buf, SW, packed_u32, absmax_q, absmax2, tp, cp, g, q, n, kw, tiles, steps, ash)
                xok = x_quad(xq, x_u32, min(cp, uint32(steps - uint32(1))), lane, k)
                tp, cp, lp = advance(tp, cp, lp, steps, da, dr, b, warp, grid)
                if c < steps:
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
                            x_read(xr, sm, warp, q, h)
                        for i in range(8):
                            cf[0], cf[1], cf[2], cf[3] = mma(A[4 * i], A[4 * i + 1], A[4 * i + 2], A[4 * i + 3],
                                                             xr[2 * i], xr[2 * i + 1], cf[0], cf[1], cf[2], cf[3])
                    raw = buf[16]
                    wg, wg8 = shfl_idx(raw, g), shfl_idx(raw, g + uint32(8))
                    ag, ag8 = shfl_idx(raw, g + uint32(16)), shfl_idx(raw, g + uint32(24))
                    sh = uint32(16) * (q & uint32(1))
                    if q < uint32(2):
                        for i in range(4):
                            code = ((wg if i < 2 else wg8) >> (sh + uint32(8 * (i % 2)))) & uint32(0xFF)
                            a2 = ag if i < 2 else ag8
                            s4[i] = ops.fadd_rn(ops.fmul_rn(f32_from_bits(sm[code2_word(code)]), f32_from_bits(a2)), offset)
                        acc0 += cf[0] * s4[0] + cf[1] * s4[1]
                        acc1 += cf[2] * s4[2] + cf[3] * s4[3]
                syncwarp()
                x_stash(sm, xq, xok, warp, lane)
                syncwarp()
                t, c, left = advance(t, c, left, steps, da, dr, b, warp, grid)
            bs = uint32(parity * uint32(W * 16) + warp * uint32(16))
            a0 = acc0 + shfl_xor_sync(0xFFFFFFFF, acc0, 1)
            a1 = acc1 + shfl_xor_sync(0xFFFFFFFF, acc1, 1)
            if q == uint32(0):
                sm[spare(bs + g)] = ops.float_bits(a0)
                sm[spare(bs + g + uint32(8))] = ops.float_bits(a1)
            cuda.syncthreads()
            if tid < uint32(16):
                first, v = uint32(parity * uint32(W * 16) + tid), float32(0.0)
                for w in range(W):
                    v += f32_from_bits(sm[spare(first + uint32(w * 16))])
                row = uint32(st * uint32(16) + tid)
                if split:   # this block's part of last-round tile j: slot st - t1 (0 or 1) of its two, then count in
                    j = uint32(st - tl)
                    ws[b * uint32(32) + (st - t1) * uint32(16) + tid] = v
                    old = count_in(cnt, j * uint32(16) + tid)
                    fb = uint32(((j * steps + uint32(1)) * grid - uint32(1)) // L)   # the blocks whose part meets j
                    lb = uint32(((j + uint32(1)) * steps * grid - uint32(1)) // L)
                    parts, bb = uint32(0), fb
                    while bb <= lb:                   # where L < G some blocks in between have no steps at all
                        parts += uint32(bb * L // grid < (bb + uint32(1)) * L // grid)
                        bb += uint32(1)
                    if old == parts - uint32(1):     # the last to count in sums the parts in block order
                        fence_acquire()
                        v, bb = float32(0.0), fb
                        while bb <= lb:
                            blo = uint32(bb * L // grid)
                            if blo < (bb + uint32(1)) * L // grid:
                                v += ws[bb * uint32(32) + (j - blo // steps) * uint32(16) + tid]
                            bb += uint32(1)
                        if row < n:
                            y[row] = half_bits(v)
                        cnt[j * uint32(16) + tid] = uint32(0)   # zero again for the next launch (graph replays)
                elif row < n:
                    y[row] = half_bits(v)
            parity = parity ^ uint32(1)
            if split:
                split, st = st < t2, (uint32(st + uint32(1)) if st < t2 else b)
            else:
                st = uint32(st + grid)

    return gemv_sl


_WORK = {}   # (device, grid, shape): the slots and the per-row counters, allocated once, zero between launches


def workspace(N, K, grid):
    key = (cuda.get_current_device().id if nf4lab.ON_GPU else None, grid, N, K)
    if key not in _WORK:
        tiles = -(-N // 16)
        _WORK[key] = (cuda.to_device(np.zeros(32 * grid, np.float32)), cuda.to_device(np.zeros(16 * tiles, np.uint32)))
    return _WORK[key]


def launch(g):
    """The split-last kernel on GemvBuffers g: M = 1, nested statistics read as words (gemv.words_apply)."""
    gemv.validate(g)
    if g.M != 1 or not gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q)):
        raise ValueError("lab split-last: M = 1, nested statistics with blocksize 64 and K % 256 == 0 only")
    tiles = -(-g.N // 16)
    grid = min(g.grid or gemv.grid_size(g.N), tiles)   # at least one whole round: whole tiles lie below the split
    assert grid * (tiles % grid) * (g.K // 256) < 2 ** 32
    ws, cnt = workspace(g.N, g.K, grid)
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift, ws, cnt)
    kern = gemv.prepare(make_splitlast(g.dtype == "bf16", gemv.probe_base()), args)
    kern[grid, THREADS, g.stream, gemv.SMEM](*args)


def check() -> int:
    """Simulator, 3 blocks: a whole round, then 2 split tiles (a block's part in both, rows past N; launched twice:
    the counters' reset) or 1 (a block with no part): float64 check, the shipped kernel's bits, counters at zero."""
    from nf4lab.harness import gemv_check

    bad = 0
    for N, K, dtype, G, times in ((75, 768, "bf16", 3, 2), (52, 512, "fp16", 3, 1)):
        t0 = time.time()
        gc = gemv_check.make_gemv_case(N, K, dtype, seed=5)
        g = dataclasses.replace(gemv.make_gemv_buffers(gc), grid=G)
        gemv.launch(g)
        ref = g.result().copy()
        split_rows = np.arange(N) >= (-(-N // 16) // G) * G * 16
        for i in range(times):
            g.y.copy_to_device(np.full(N, 0x7FBF, np.uint16))
            launch(g)
            y = g.result().copy()
            rep = gemv_check.compare(y, gc, name=f"{N}x{K} {dtype} grid {G} launch {i + 1}", rounded_table=True)
            zero = not workspace(N, K, G)[1].copy_to_host().any()
            same = np.array_equal(y, ref)
            print(f"{rep}\n  counters back at zero: {zero}; bits equal the shipped kernel's: {same} (whole-round "
                  f"rows {np.array_equal(y[~split_rows], ref[~split_rows])}, split rows "
                  f"{int((y[split_rows] == ref[split_rows]).sum())} of {int(split_rows.sum())})", flush=True)
            bad += (not rep.ok) + (not zero) + (not np.array_equal(y[~split_rows], ref[~split_rows]))
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    print("PASSED" if not bad else f"FAILED: {bad} checks")
    return 1 if bad else 0


def bench() -> int:
    """GPU: the shipped and the split-last kernel at SHAPES, M = 1, CUDA-graph GPU time over weight copies totalling
    > 4x L2 (lab/gemv_peers.py's way), timed twice in turn (A B A B), each output checked against float64 first."""
    if not nf4lab.ON_GPU:
        print("no CUDA GPU: nothing to measure (the simulator's timings mean nothing)")
        return 2
    import bitsandbytes.functional as F
    import torch

    from lab.gemv_peers import copies_for, cycled
    from nf4lab.measure import bench as nbench, gemv_bench

    t0, log, bad = time.time(), [], 0

    def say(s):
        log.append(s := f"[{time.time() - t0:5.1f} s] {s}")
        print(s, flush=True)

    say(nf4lab.describe())
    run = nbench.Run(method=nbench.METHOD + "; weights cycled over copies totalling > 4x L2; both kernels in one process")
    run.meta.update(checks=[], default_kernel=gemv_bench.kernel_name("TC"))
    for N, K, dtype in SHAPES:
        nb, grid = gemv_bench.weight_bytes(N, K), gemv.grid_size(N)
        copies = copies_for(nb, nf4lab.device_info().get("l2_bytes") or (50 << 20))
        data = [gemv_bench._quantize_gpu(N, K, dtype, seed=i) for i in range(copies)]
        q0, x, outs, calls, times = data[0][1], data[0][2], {}, {}, {}
        q32 = F.QuantState(q0.absmax, q0.shape, q0.code, q0.blocksize, "nf4", torch.float32, q0.offset, q0.state2)
        w64 = F.dequantize_4bit(data[0][0], q32).double()
        y64, tol = x.double() @ w64.T, gemv_bench.tolerance(x.double(), w64, dtype)
        for name, fn in (("TC", gemv.launch), ("TC split-last", launch)):
            y = torch.empty(1, N, dtype=x.dtype, device="cuda")
            bufs = [gemv.buffers_from_torch(x, p, q.shape, q.absmax, q.state2.absmax, q.state2.code, q.offset.item(),
                                            q.blocksize, y) for p, q, _ in data]
            fn(bufs[0])  # the first launch compiles
            y.fill_(float("nan"))
            fn(bufs[0])
            torch.cuda.synchronize()
            outs[name] = y.clone()
            run.meta["checks"].append(dict(gemv_bench._gpu_check(y, y64, tol, gemv_bench.kernel_name(name)),
                                           shape=[N, K], dtype=dtype, M=1))
            calls[name] = (lambda i, s, fn=fn, bufs=bufs: fn(dataclasses.replace(bufs[i], stream=s)))
        for name in [*calls, *calls]:
            times.setdefault(name, []).append(cycled(calls[name], copies))
        line = f"{N}x{K} {dtype} grid {grid}:"
        for (name, ts), chk in zip(times.items(), run.meta["checks"][-2:]):
            extra = {} if name == "TC" else {   # the counters after every graph replay: back at zero
                "bits_equal_shipped": bool(torch.equal(outs[name].view(torch.int16), outs["TC"].view(torch.int16))),
                "counters_zero": not workspace(N, K, grid)[1].copy_to_host().any()}
            bad += (not chk["ok"]) + (extra.get("counters_zero") is False)
            run.add(nbench._record("kernel", chk["name"], (N, K), dtype, ts[0], nb, within_tol=chk["ok"], copies=copies,
                                   fits_l2=False, M=1, grid=grid, ms_again=ts[1]["ms"], **extra))
            line += (f" {name} {ts[0]['ms'] * 1e3:.2f} / {ts[1]['ms'] * 1e3:.2f} us (within tolerance {chk['ok']}, "
                     f"worst {chk['worst_ratio']:.2g}" + "".join(f", {k} {v}" for k, v in extra.items()) + ");")
        say(line)
        del data, w64, y64, tol
        torch.cuda.empty_cache()
    run.meta["seconds"] = round(time.time() - t0, 1)
    path = run.save(NAME)
    say(f"saved {path}; outside tolerance or counters left non-zero: {bad}")
    path.with_suffix(".log").write_text("\n".join(log) + "\n")
    if os.environ.get("OUT"):   # the device tool brings back files <= 2 folders down
        os.makedirs(dst := os.path.join(os.environ["OUT"], path.parent.name), exist_ok=True)
        for p in (path, path.with_suffix(".log")):
            shutil.copy(p, dst)
    return 1 if bad else 0


def sass() -> int:
    """Offline (compile mode: no GPU): ptxas -v for sm_90 of the split-last and the shipped kernel, M = 1."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    from lab.gemv_reports import SASS_PTX_VERSION, find_tool
    from nf4lab.measure.ptx import compile_ptx

    for dtype in ("bf16", "fp16"):
        for name, kern, sig in (("TC", gemv.make_kernel(dtype == "bf16", 1, 0x400, True, words=True), gemv.signature()),
                                ("TC split-last", make_splitlast(dtype == "bf16", 0x400),
                                 gemv.signature() + (types.float32[::1], types.uint32[::1]))):
            ptx = compile_ptx(kern, sig, cc=(9, 0))
            with tempfile.TemporaryDirectory() as d:
                Path(d, "k.ptx").write_text(re.sub(r"^\.version \d+\.\d+", f".version {SASS_PTX_VERSION}", ptx,
                                                   flags=re.MULTILINE))
                info = subprocess.run([find_tool("ptxas"), "-arch=sm_90", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                                      capture_output=True, text=True, check=True).stderr
            got = {k: re.search(rf"(\d+) {k}", info).group(1)
                   for k in ("registers", "bytes stack frame", "bytes spill stores")}
            bounds = " ".join(re.findall(r"[.](?:maxntid|minnctapersm) [0-9, ]+", ptx))
            print(f"{name:<14} {dtype}: " + ", ".join(f"{v} {k}" for k, v in got.items()) + f" ({bounds})", flush=True)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    for m in ("check", "bench", "sass"):
        mode.add_argument(f"--{m}", action="store_true")
    args = ap.parse_args()
    sys.exit(check() if args.check else bench() if args.bench else sass())
