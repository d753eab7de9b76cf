"""Why notebook 06's kernel stops at 96.6% of the traffic-matched bound at 4096x14336 on the H200
(99% at 16384x16384 and 8192x28672), and which change closes the gap (issue 13).

    python -m lab.wall_small_shapes              # H200/H100: writes data/results/<gpu>/wall_small_shapes.json
    python -m lab.wall_small_shapes --small-only # 4096x14336 only (about half the time)
    python -m lab.wall_small_shapes --tiny       # no GPU: every variant bit for bit in the simulator (~2 min)
    NF4LAB_MODE=compile python -m lab.wall_small_shapes --ptx   # no GPU: compile all; registers, SASS order

The working hypothesis (nothing here is measured yet). The gap does not scale with the work
(launch_shapes.json, H200, 06 at 128 x 2 against the bound at 128 x 2: 1.3 / 0.7 / 0.5 us at
4096x14336 / 16384^2 / 8192x28672, where a bandwidth loss of 3.4% would be 5.7 us at 16384^2), so it
is a per-launch cost: the launch's ramp (every resident block starts at once, nothing hides its
first wait) and its drain (the last blocks finish alone), where too few bytes are in flight and each
block's dependent chain is exposed. In 06's SASS a block does, one after the other: LDG lut -> STS ->
BAR.SYNC -> LDG word + LDG absmax_q (DRAM) -> LDG code2[absmax_q] -> convert -> STG unit 0 -> LDG
absmax_q, code2 of unit 1 (they cannot move above unit 0's store) -> STG unit 1: three to four
dependent memory steps where the bound has one (LDG word + absmax_q -> STG). Under load an L2 round
trip costs a good part of a microsecond. 128 x 4 (more bytes in flight) did not help (96.7%): the
steady state is not what is short. (lab/README's lut_order moved the LUT after the loads but kept the
dependent code2 load before the barrier: 96-97% for 06, no gain; HC and S below remove that step too.)

Variants (each verified bit for bit against bitsandbytes before it is timed, edge shapes too):
  06 TxU           notebook 06's kernel cell as it is, at T threads x U units (module attributes)
  H TxU            "hoisted": every global load of the block first (words, absmax_q, absmax2, the
                   thread's LUT entry), then the dependent code2 loads, then STS + one barrier,
                   then convert and store. Chain: DRAM -> code2 -> barrier -> stores.
  HC TxU           H with code2 (256 floats) also copied to shared memory by the block, its loads
                   issued with the data: DRAM -> barrier -> LDS -> stores (one dependent step).
  S TxU            H with the LUT in registers, looked up with shfl.sync (lane i holds entry i & 15):
                   no shared memory, no barrier.
  P TxU kxSM       persistent, balanced grid-stride (grid = tiles / ceil(tiles / (k * SMs))), LUT
                   and code2 in shared memory once per block, the next tile's loads issued before
                   the current tile's stores.
  drop-in ...      nf4lab.dequantize on bitsandbytes' tensors (lean launch), as shipped and with an
                   H / HC / S kernel put in fastkernel's place (same signature, same grid).
  diag: ...        the bound kernel plus 06's LUT prologue (LDG, STS, BAR before the loads), and the
                   bound plus a dependent code2[absmax_q] load: not verified (garbage output), they
                   show what each piece of 06's chain costs on its own.

Timing is bench.gpu_time_ms (CUDA graph of 20 launches, median of 15 replays), repeated in
``--rounds`` interleaved rounds (each round times every variant and the bound again); the record
keeps the median over rounds and each round's ms. % of bound: against the median bound of the run.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import nf4lab  # noqa: E402  (first: decides GPU or simulator before numba.cuda is imported)
import numpy as np  # noqa: E402
from numba import cuda, float32, int32, uint32, uint64  # noqa: E402

from nf4lab import runtime  # noqa: E402
from nf4lab.kernels import dequant, fastkernel  # noqa: E402
from nf4lab.device import ops
from nf4lab.lesson import GROUP_SHIFT  # noqa: E402
from nf4lab.harness import versions
from nf4lab.harness.buffers import SIM_EDGE_SHAPES, make_buffers, run_and_verify  # noqa: E402
from nf4lab.measure import bench, results  # noqa: E402
from nf4lab.format import bytemodel

NAME = "wall_small_shapes"
SMALL = (4096, 14336)
BIG = [(16384, 16384), (8192, 28672)]
NIB = uint32(15)
U3, U4, U8, U16, U24 = uint64(3), uint32(4), uint32(8), uint32(16), uint32(24)
FULL = uint32(0xFFFFFFFF)
DEVICE = "cuda"    # where the drop-in's torch tensors live
TINY_GRID = None   # --tiny: persistent kernels get this many blocks, so that they really loop
# Notebook 06's kernel arguments (its sig("bf16")): lab kernels are compiled for them up front on a GPU.
NB_SIG = ("void(uint8[::1], uint32[::1], float32[::1], uint8[::1], float32[::1], float32[::1], float32, "
          "uint16[::1], uint32[::1], uint64, uint64)")


# ------------------------------------------------------------------ lab kernels
@functools.lru_cache(maxsize=None)
def make_kernels(T: int, U: int, mode: str, dtype: str = "bf16", persistent: bool = False, lb: int = 0):
    """(nb_kernel, fast_kernel_fn): one body, two argument lists.

    nb_kernel: notebook 06's arguments (lut, absmax_q, ..., offset float32, n, log2_bs), compiled for
    NB_SIG at once on a GPU (lazily elsewhere).
    fast_kernel_fn: the plain function with fastkernel's arguments (stats, absmax2, code2,
    offset[1], lut, ..., n, bshift, gshift), for cuda.jit(fastkernel.signature(...)).
    mode: "H" (shared LUT), "HC" (shared LUT and code2), "S" (LUT by shuffle; shared code2 never).
    lb: launch bounds (T threads, at least lb blocks per SM): ptxas keeps the registers that low.
    """
    assert dtype in ("bf16", "fp16") and mode in ("H", "HC", "S")
    assert T % 32 == 0 and (T & (T - 1)) == 0 and U >= 1
    pack2 = ops.pack_bf16x2 if dtype == "bf16" else ops.pack_f16x2
    bits1 = ops.to_bf16_bits if dtype == "bf16" else ops.to_f16_bits
    fmul_rn, fadd_rn, store = ops.fmul_rn, ops.fadd_rn, ops.store_u32x4
    C2S = mode == "HC" or persistent          # code2 in shared memory
    SHFL = mode == "S" and not persistent and not runtime.SIMULATOR   # the simulator has no shfl
    BARRIER = not SHFL or C2S
    TU = uint64(T * U)
    C2N = max(1, 256 // T)                    # code2 entries each thread copies

    # The lookups: a shuffle, or the shared table (the simulator's stand-in for S reads the table too).
    if SHFL:
        @cuda.jit(device=True, inline="always")
        def look(table, entry, q):
            return cuda.shfl_sync(FULL, entry, int32(q))
    else:
        @cuda.jit(device=True, inline="always")
        def look(table, entry, q):
            return table[q]

    @cuda.jit(device=True, inline="always")
    def convert(table, entry, w, s):
        """One packed word -> its 8 weights as 4 words of two 16-bit values, high nibble first."""
        a = fmul_rn(look(table, entry, (w >> U4) & NIB), s)
        b = fmul_rn(look(table, entry, w & NIB), s)
        c = fmul_rn(look(table, entry, (w >> uint32(12)) & NIB), s)
        d = fmul_rn(look(table, entry, (w >> U8) & NIB), s)
        e = fmul_rn(look(table, entry, (w >> uint32(20)) & NIB), s)
        f = fmul_rn(look(table, entry, (w >> U16) & NIB), s)
        g = fmul_rn(look(table, entry, w >> uint32(28)), s)
        h = fmul_rn(look(table, entry, (w >> U24) & NIB), s)
        return pack2(a, b), pack2(c, d), pack2(e, f), pack2(g, h)

    @cuda.jit(device=True, inline="always")
    def tail(table, lut, packed, absmax_q, absmax2, code2, off, out, first, n, log2_bs, gshift):
        """The weights past the last whole unit, one at a time (one thread; global LUT under S)."""
        i = first
        while i < n:
            byte = uint32(packed[i >> uint64(1)])
            q = (byte >> U4) if (i & uint64(1)) == uint64(0) else (byte & NIB)
            blk = i >> log2_bs
            s = fadd_rn(fmul_rn(code2[absmax_q[blk]], absmax2[blk >> gshift]), off)
            v = lut[q] if SHFL else table[q]
            out[i] = bits1(fmul_rn(v, s))
            i += uint64(1)

    @cuda.jit(device=True, inline="always")
    def body(table, c2s, packed, packed_u32, lut, absmax_q, absmax2, code2, off, out, out_u32, n, log2_bs,
             gshift):
        tid = cuda.threadIdx.x
        nunits = n >> U3
        base = uint64(cuda.blockIdx.x) * TU + uint64(tid)
        words = cuda.local.array(U, uint32)
        qs = cuda.local.array(U, uint32)
        gs = cuda.local.array(U, float32)
        scales = cuda.local.array(U, float32)
        c2v = cuda.local.array(C2N, float32)
        for k in range(U):                    # 1. every DRAM load of the block, back to back
            u = base + uint64(k * T)
            words[k] = uint32(0)
            qs[k] = uint32(0)
            gs[k] = float32(0)
            if u < nunits:
                blk = (u << U3) >> log2_bs
                words[k] = packed_u32[u]
                qs[k] = uint32(absmax_q[blk])
                gs[k] = absmax2[blk >> gshift]
        entry = lut[tid & 15]                 # 2. the small tables (L1/L2), in flight with the data
        if C2S:
            for j in range(C2N):
                i = tid + j * T
                if i < 256:
                    c2v[j] = code2[i]
        if not C2S:                           # 3. the dependent code2 loads, before the barrier
            for k in range(U):
                scales[k] = fadd_rn(fmul_rn(code2[qs[k]], gs[k]), off)
        if not SHFL:
            if tid < 16:
                table[tid] = entry
        if C2S:
            for j in range(C2N):
                i = tid + j * T
                if i < 256:
                    c2s[i] = c2v[j]
        if BARRIER:
            cuda.syncthreads()
        if C2S:
            for k in range(U):
                scales[k] = fadd_rn(fmul_rn(c2s[qs[k]], gs[k]), off)
        for k in range(U):                    # 4. convert and store (every lane: shuffles need all)
            u = base + uint64(k * T)
            o0, o1, o2, o3 = convert(table, entry, words[k], scales[k])
            if u < nunits:
                store(out_u32, u << uint64(2), o0, o1, o2, o3)
            elif u == nunits:
                tail(table, lut, packed, absmax_q, absmax2, code2, off, out, u << U3, n, log2_bs, gshift)

    @cuda.jit(device=True, inline="always")
    def pbody(table, c2s, packed, packed_u32, lut, absmax_q, absmax2, code2, off, out, out_u32, n, log2_bs,
              gshift):
        """Persistent: tiles blockIdx, blockIdx + gridDim, ...; the next tile's loads before this one's stores."""
        tid = cuda.threadIdx.x
        nunits = n >> U3
        ntiles = (nunits + TU) // TU          # units + 1 (the tail thread), rounded up: TU is a power of 2
        step = uint64(cuda.gridDim.x)
        tile = uint64(cuda.blockIdx.x)
        words = cuda.local.array(U, uint32)
        qs = cuda.local.array(U, uint32)
        gs = cuda.local.array(U, float32)
        nwords = cuda.local.array(U, uint32)
        nqs = cuda.local.array(U, uint32)
        ngs = cuda.local.array(U, float32)
        c2v = cuda.local.array(C2N, float32)
        base = tile * TU + uint64(tid)
        for k in range(U):
            u = base + uint64(k * T)
            words[k] = uint32(0)
            qs[k] = uint32(0)
            gs[k] = float32(0)
            if u < nunits:
                blk = (u << U3) >> log2_bs
                words[k] = packed_u32[u]
                qs[k] = uint32(absmax_q[blk])
                gs[k] = absmax2[blk >> gshift]
        entry = lut[tid & 15]
        for j in range(C2N):
            i = tid + j * T
            if i < 256:
                c2v[j] = code2[i]
        if tid < 16:
            table[tid] = entry
        for j in range(C2N):
            i = tid + j * T
            if i < 256:
                c2s[i] = c2v[j]
        cuda.syncthreads()
        while tile < ntiles:
            nbase = (tile + step) * TU + uint64(tid)
            for k in range(U):                # the next tile's loads, before this tile's stores
                u = nbase + uint64(k * T)
                nwords[k] = uint32(0)
                nqs[k] = uint32(0)
                ngs[k] = float32(0)
                if u < nunits:
                    blk = (u << U3) >> log2_bs
                    nwords[k] = packed_u32[u]
                    nqs[k] = uint32(absmax_q[blk])
                    ngs[k] = absmax2[blk >> gshift]
            for k in range(U):
                u = base + uint64(k * T)
                s = fadd_rn(fmul_rn(c2s[qs[k]], gs[k]), off)
                o0, o1, o2, o3 = convert(table, entry, words[k], s)
                if u < nunits:
                    store(out_u32, u << uint64(2), o0, o1, o2, o3)
                elif u == nunits:
                    tail(table, lut, packed, absmax_q, absmax2, code2, off, out, u << U3, n, log2_bs, gshift)
            for k in range(U):
                words[k] = nwords[k]
                qs[k] = nqs[k]
                gs[k] = ngs[k]
            tile += step
            base = nbase

    run = pbody if persistent else body
    gconst = uint64(GROUP_SHIFT)

    def nb_kernel(packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs):
        table = cuda.shared.array(16, float32)
        c2s = cuda.shared.array(256, float32)
        run(table, c2s, packed, packed_u32, lut, absmax_q, absmax2, code2, offset, out, out_u32, n, log2_bs,
            gconst)

    def fast_kernel(packed, packed_u32, stats, absmax2, code2, offset, lut, out, out_u32, n, bshift, gshift):
        table = cuda.shared.array(16, float32)
        c2s = cuda.shared.array(256, float32)
        off = offset[0]
        run(table, c2s, packed, packed_u32, lut, stats, absmax2, code2, off, out, out_u32, n, bshift, gshift)

    tag = f"{mode}{'p' if persistent else ''}_{T}x{U}_{dtype}"
    nb_kernel.__name__ = f"lab_wall_nb_{tag}"
    fast_kernel.__name__ = f"lab_wall_fast_{tag}"
    opts = {"launch_bounds": (T, lb)} if lb and not runtime.SIMULATOR else {}
    if runtime.ON_GPU:     # compiled now: registers and occupancy are known before the first launch
        return cuda.jit(NB_SIG, **opts)(nb_kernel), fast_kernel
    return cuda.jit(**opts)(nb_kernel), fast_kernel


def sms() -> int:
    return nf4lab.device_info().get("sms") or 1


def grid_for(n: int, T: int, U: int, per_sm: int = 0) -> int:
    tiles = -(-((n >> 3) + 1) // (T * U))
    if not per_sm:
        return max(1, tiles)
    g = TINY_GRID or per_sm * sms()
    rounds = -(-tiles // g)
    return max(1, -(-tiles // rounds))        # balanced: every block does `rounds` tiles or one fewer


def regs(kernel):
    try:
        return int(kernel.get_regs_per_thread())
    except Exception:
        return None


def blocks_per_sm(kernel, T):
    """Resident blocks per SM (the driver's occupancy calculator) of a compiled one-overload kernel."""
    try:
        return int(next(iter(kernel.overloads.values())).max_cooperative_grid_blocks(T)) // sms()
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def lab_variant(T, U, mode, dtype="bf16", per_sm=0, lb=0):
    """launch(b) for notebook buffers; .kernel, .grid(n), .regs() and .bps() for the record. A persistent
    grid has per_sm blocks per SM, or as many as are resident at once where fewer fit (blocks_per_sm)."""
    k, _ = make_kernels(T, U, mode, dtype, persistent=bool(per_sm), lb=lb)
    if per_sm and runtime.ON_GPU:
        per_sm = min(per_sm, blocks_per_sm(k, T) or per_sm)

    def launch(b):
        if b.dtype != dtype or fastkernel.address(b.out_u32) % 16 or fastkernel.address(b.packed_u32) % 4:
            raise ValueError("lab kernel: wrong dtype or misaligned buffers")
        k[grid_for(b.n, T, U, per_sm), T, b.stream](
            b.packed, b.packed_u32, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset, b.out, b.out_u32,
            np.uint64(b.n), np.uint64(b.blocksize.bit_length() - 1))

    launch.kernel = k
    launch.bps = lambda: blocks_per_sm(k, T)
    launch.regs = lambda: regs(k)
    launch.grid = lambda n: grid_for(n, T, U, per_sm)
    return launch


@functools.lru_cache(maxsize=None)
def nb06(T, U):
    """Notebook 06's kernel cell as a module, its launch shape set before it compiles (tools/launch_shapes.py)."""
    mod = versions.load_module("06_output_dtypes")
    mod.THREADS, mod.UNITS = T, U
    mod.KERNELS = {d: mod.make_kernel(d) for d in mod.OUT_KINDS}
    launch = mod.launch
    launch.kernel = mod.KERNELS["bf16"]
    launch.bps = lambda: blocks_per_sm(mod.KERNELS["bf16"], T)
    launch.regs = lambda: regs(mod.KERNELS["bf16"])
    launch.grid = lambda n: grid_for(n, T, U)
    return launch


# ------------------------------------------------------------------ diagnostics (bound + one piece of 06)
@functools.lru_cache(maxsize=None)
def make_diag(kind: str, T: int = 128, U: int = 2):
    """The bound kernel (bench._bound_kernel, 16-bit output) plus 06's LUT prologue ("lut") or plus a
    dependent code2[absmax_q] load folded into the stored bits ("code2")."""
    LUT, CODE2 = kind == "lut", kind == "code2"
    store = ops.store_u32x4

    @cuda.jit
    def diag(packed_u32, absmax_q, code2, lut, out_u32, nunits):
        tid = cuda.threadIdx.x
        table = cuda.shared.array(16, float32)
        if LUT:
            if tid < 16:
                table[tid] = lut[tid]
            cuda.syncthreads()
        base = uint64(cuda.blockIdx.x) * uint64(T * U) + uint64(tid)
        words = cuda.local.array(U, uint32)
        qs = cuda.local.array(U, uint32)
        for k in range(U):
            u = base + uint64(k * T)
            words[k] = uint32(0)
            qs[k] = uint32(0)
            if u < nunits:
                words[k] = packed_u32[u]
                qs[k] = uint32(absmax_q[u >> uint64(3)])
        for k in range(U):
            u = base + uint64(k * T)
            if u < nunits:
                w = words[k] ^ qs[k]
                if CODE2:
                    w ^= ops.float_bits(code2[qs[k]])
                if LUT:
                    w ^= ops.float_bits(table[w & NIB])
                store(out_u32, u << uint64(2), w, w ^ uint32(1), w ^ uint32(2), w ^ uint32(3))

    def launch(b):
        nunits = b.n >> 3
        diag[max(1, -(-nunits // (T * U))), T, b.stream](b.packed_u32, b.absmax_q, b.code2, b.lut, b.out_u32,
                                                         np.uint64(nunits))

    launch.no_verify = True
    launch.kernel = diag
    launch.bps = lambda: blocks_per_sm(diag, T)
    launch.regs = lambda: regs(diag)
    launch.grid = lambda n: max(1, -(-(n >> 3) // (T * U)))
    return launch


# ------------------------------------------------------------------ drop-in: nf4lab.dequantize with a lab kernel
class DropIn:
    """Put a lab kernel (fastkernel's arguments) in nf4lab.dequantize's place, with its launch shape."""

    def __init__(self, T, U, mode, dtype="bf16"):
        self.T, self.U, self.mode, self.dtype = T, U, mode, dtype
        self.key = (dtype, True, "vector")
        self._kernel = None

    def kernel(self):
        if self._kernel is None:
            _, fn = make_kernels(self.T, self.U, self.mode, self.dtype)
            if runtime.SIMULATOR:
                self._kernel = (cuda.jit(fn), None)
            else:
                sig = fastkernel.signature(self.dtype, True)
                self._kernel = (cuda.jit(sig)(fn), sig)
        return self._kernel

    def __enter__(self):
        self.saved = (fastkernel.THREADS, fastkernel.WORDS_PER_THREAD, fastkernel._KERNELS.get(self.key),
                      fastkernel._LEAN.get(self.key), dict(dequant._lean_ready))
        fastkernel.THREADS, fastkernel.WORDS_PER_THREAD = self.T, self.U
        fastkernel._KERNELS[self.key] = self.kernel()
        fastkernel._LEAN.pop(self.key, None)
        dequant._lean_ready.pop(self.key, None)      # the lean launcher is checked against numba's again
        return self

    def __exit__(self, *exc):
        threads, units, kernel, lean, checked = self.saved
        fastkernel.THREADS, fastkernel.WORDS_PER_THREAD = threads, units
        for table, value in ((fastkernel._KERNELS, kernel), (fastkernel._LEAN, lean)):
            if value is None:
                table.pop(self.key, None)            # built as shipped on next use
            else:
                table[self.key] = value
        dequant._lean_ready.clear()                  # the shipped launchers again, not the variant's
        dequant._lean_ready.update(checked)
        return False

    def regs(self):
        return regs(self.kernel()[0])


def verify_launch_arrays(case, name):
    """fastkernel.launch_arrays (numba's dispatcher, whatever kernel fastkernel holds) on one case."""
    b = make_buffers(case)
    b.reset_output()
    offset = cuda.to_device(np.array([case.offset], dtype=np.float32))
    lut = cuda.to_device(fastkernel.LUTS_CUDA[case.quant_type].copy())
    fastkernel.launch_arrays(b.packed, b.absmax_q, b.absmax2, b.code2, offset, lut, b.out, n=case.n,
                             blocksize=case.blocksize, nested=True, dtype=case.dtype, path="vector")
    return nf4lab.verify(b.result(), case, name=name)


@functools.lru_cache(maxsize=None)
def dropin(T, U, mode, dtype="bf16"):
    return DropIn(T, U, mode, dtype)


class DropInTimer:
    """nf4lab.dequantize on one case's bitsandbytes tensors, out= preallocated (bench.time_dequantize's
    way), the tensors made once per case and shared by every drop-in variant and round."""

    def __init__(self, case):
        import torch

        self.case = case
        self.packed, self.qs = case.quant_state(DEVICE)
        self.out = torch.empty(case.shape, dtype=self.qs.dtype, device=DEVICE)

    def _call(self):
        nf4lab.dequantize(self.packed, self.qs, out=self.out)

    def record(self, name, d=None) -> dict:
        """Verified bit for bit (raises otherwise), then timed; ``d``: a DropIn, None for as shipped."""
        c = self.case
        with (d if d is not None else _Nothing()):
            if d is not None:
                verify_launch_arrays(c, name)          # numba's dispatcher path, then the lean one below
            self.out.fill_(0)
            self._call()
            if not nf4lab.compare(self.out, c.expected, c.dtype, n=c.n, blocksize=c.blocksize).ok:
                raise nf4lab.VerificationError(f"{name}: nf4lab.dequantize not bit-exact with bitsandbytes")
            t = bench.gpu_time_ms(lambda s: self._call())
            k = d.kernel()[0] if d is not None else fastkernel.get_kernel(c.dtype, True, "vector")[0]
            rec = bench._record("kernel", name, c.shape, c.dtype, t,
                                bytemodel.bytes_moved(c.n, c.dtype, c.blocksize), bit_exact=True)
            rec.update(regs=regs(k), threads=fastkernel.THREADS, units=fastkernel.WORDS_PER_THREAD,
                       blocks_per_sm=blocks_per_sm(k, fastkernel.THREADS),
                       grid=fastkernel.grid_size(c.n, "vector", c.dtype))
        return rec

    def ms(self, d=None) -> float:
        with (d if d is not None else _Nothing()):
            return bench.gpu_time_ms(lambda s: self._call())["ms"]


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------ the variants
def variants(small: bool, focus: bool = False) -> dict:
    """name -> launch(b) (notebook buffers) or DropIn / "shipped" (nf4lab.dequantize). ``focus``: the candidates
    for shipping (HC at 128 and 256 threads, as 06's kernel and as nf4lab.dequantize) beside today's, at every shape."""
    if focus:
        return {"06 128x2 (as shipped)": nb06(128, 2), "06 256x2": nb06(256, 2),
                "HC 128x2": lab_variant(128, 2, "HC"), "HC 256x2": lab_variant(256, 2, "HC"),
                "drop-in nf4lab.dequantize (shipped)": "shipped",
                "drop-in HC 128x2": dropin(128, 2, "HC"), "drop-in HC 256x2": dropin(256, 2, "HC")}
    v = {"06 128x2 (as shipped)": nb06(128, 2)}
    if small:
        v.update({"06 128x4": nb06(128, 4), "06 64x4": nb06(64, 4), "06 256x2": nb06(256, 2)})
    v.update({"H 128x2": lab_variant(128, 2, "H"),
              "HC 128x2": lab_variant(128, 2, "HC"),
              "S 128x2": lab_variant(128, 2, "S")})
    if small:
        v.update({"HC 128x4": lab_variant(128, 4, "HC"), "HC 128x4 lb16": lab_variant(128, 4, "HC", lb=16),
                  "HC 64x4 lb32": lab_variant(64, 4, "HC", lb=32), "HC 256x2": lab_variant(256, 2, "HC"),
                  "S 128x4 lb16": lab_variant(128, 4, "S", lb=16),
                  "P 128x2 16/SM": lab_variant(128, 2, "HC", per_sm=16),
                  "P 128x4 8/SM": lab_variant(128, 4, "HC", per_sm=8),
                  "P 128x2 8/SM": lab_variant(128, 2, "HC", per_sm=8),
                  "diag: bound + 06 LUT prologue": make_diag("lut"),
                  "diag: bound + code2[absmax_q]": make_diag("code2")})
    v["drop-in nf4lab.dequantize (shipped)"] = "shipped"
    v["drop-in H 128x2"] = dropin(128, 2, "H")
    v["drop-in HC 128x2"] = dropin(128, 2, "HC")
    v["drop-in S 128x2"] = dropin(128, 2, "S")
    return v


# ------------------------------------------------------------------ GPU run
def measure_one(name, launch, case, b, verify_after=True) -> dict:
    """bench.measure_kernel without the host timing, and with the check after the timing optional
    (at the big shapes each check copies and compares half a gigabyte)."""
    verified = not getattr(launch, "no_verify", False)
    if verified:
        run_and_verify(launch, case, name=name, buffers=b)

    def fn(stream):
        b.stream = stream
        launch(b)

    timing = bench.gpu_time_ms(fn)
    b.stream = 0
    if verified and verify_after:
        run_and_verify(launch, case, name=name, buffers=b)
    return bench._record("kernel" if verified else "bound", name, case.shape, case.dtype, timing,
                         bytemodel.bytes_moved(case.n, case.dtype, case.blocksize),
                         bit_exact=True if verified else None)


def measure(vs: dict, case, rounds: int, log, verify_after=True) -> list[dict]:
    """Every variant verified and timed in round 1, timed again in each later round (order reversed
    every other round); the bound (bench.bound: best of bench.SHAPES) timed in every round."""
    n, nbytes = case.n, bytemodel.bytes_moved(case.n, case.dtype, case.blocksize)
    b = make_buffers(case)
    timer = DropInTimer(case)
    recs: dict = {}
    ceil = bench.ceilings(nbytes, case.shape, case.dtype, n=n)   # copy, fill, the bound, spec peak
    bound_rec = next(r for r in ceil if r["name"] == bench.BOUND)
    bound_ms = [bound_rec["ms"]]
    for rnd in range(rounds):
        names = list(vs) if rnd % 2 == 0 else list(reversed(vs))   # drift does not favour one end
        if rnd:
            bound_ms.append(bench.bound(n, case.dtype, case.shape)["ms"])
        for name in names:
            v = vs[name]
            t0 = time.time()
            d = None if isinstance(v, str) else v
            if rnd == 0:                  # verify (and compile) once, then time
                if isinstance(v, (DropIn, str)):
                    rec = timer.record(name, d)
                else:
                    rec = measure_one(name, v, case, b, verify_after=verify_after)
                    rec.update(regs=v.regs(), grid=v.grid(n), blocks_per_sm=v.bps())
                rec["rounds_ms"] = [rec["ms"]]
                recs[name] = rec
            elif isinstance(v, (DropIn, str)):
                recs[name]["rounds_ms"].append(timer.ms(d))
            else:
                def fn(stream, v=v):
                    b.stream = stream
                    v(b)
                recs[name]["rounds_ms"].append(bench.gpu_time_ms(fn)["ms"])
                b.stream = 0
            log(f"  round {rnd + 1} {name}: {recs[name]['rounds_ms'][-1] * 1e3:.2f} us ({time.time() - t0:.1f} s)")
    log(f"  bound rounds: {' '.join(f'{x * 1e3:.2f}' for x in bound_ms)} us")
    out = [r for r in ceil if r["name"] != bench.BOUND]
    bound_rec = dict(bound_rec, rounds_ms=bound_ms, ms=float(statistics.median(bound_ms)))
    bound_rec["gbps"] = bytemodel.gbps(nbytes, bound_rec["ms"])
    out.append(bound_rec)
    for rec in recs.values():
        rec["ms"] = float(statistics.median(rec["rounds_ms"]))
        rec["gbps"] = bytemodel.gbps(nbytes, rec["ms"])
        out.append(rec)
    del b, timer
    return out


def table(run) -> str:
    rows = [f"{'variant':<38} {'shape':>11} {'us':>7} {'GB/s':>6} {'%bound':>7} {'rounds us':>22} {'regs':>4} "
            f"{'blk/SM':>6} {'grid':>6}"]
    for r in run.records:
        if r["kind"] not in ("kernel", "bound") or r.get("ms") is None:
            continue
        shape = "x".join(map(str, r["shape"]))
        pb = r.get("pct_bound")
        rr = " ".join(f"{x * 1e3:.2f}" for x in r.get("rounds_ms", []))
        rows.append(f"{r['name'][:38]:<38} {shape:>11} {r['ms'] * 1e3:7.2f} {r['gbps']:6.0f} "
                    f"{'' if pb is None else format(pb, '.1f'):>7} {rr:>22} {r.get('regs') or '':>4} "
                    f"{r.get('blocks_per_sm') or '':>6} {r.get('grid') or '':>6}")
    return "\n".join(rows)


def gpu_main(args) -> int:
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:6.1f} s] {msg}", flush=True)

    log(runtime.describe())
    run = bench.Run()
    run.meta["script"] = "lab/wall_small_shapes.py"
    run.meta["rounds"] = {"small": args.rounds, "big": args.big_rounds}
    run.meta["variants"] = {
        "06 TxU": "notebook 06's kernel cell, THREADS x UNITS set as module attributes",
        "H": "all global loads first (words, absmax_q, absmax2, LUT entry), code2 loads, STS, one barrier, stores",
        "HC": "H with code2 copied to shared memory too (its loads issued with the data)",
        "S": "H with the LUT in registers, looked up by shfl.sync: no shared memory, no barrier",
        "P TxU k/SM": "persistent balanced grid-stride, LUT and code2 in shared memory once, next tile's loads "
                      "before this tile's stores",
        "lbN": "launch bounds (T, N): at most 65536 / (N T) registers",
        "drop-in": "nf4lab.dequantize (lean launch) with the lab kernel in fastkernel's place",
        "diag": "the bound kernel plus one piece of 06's chain (not verified)"}
    shapes = [SMALL] + ([] if args.small_only else BIG)
    if not args.no_edges:    # the lab kernels at the tails and partial blocks, bit for bit, before any timing
        vs = {k: v for k, v in variants(True).items() if not getattr(v, "no_verify", False)}
        for shape in nf4lab.edge_shapes():
            case = nf4lab.make_case(shape, "bf16")
            for name, v in vs.items():
                if isinstance(v, DropIn):
                    with v:
                        verify_launch_arrays(case, f"{name} {shape}")
                elif callable(v):
                    run_and_verify(v, case, name=f"{name} {shape}")
        log(f"edge shapes: {len(nf4lab.edge_shapes())} shapes x {len(vs)} variants bit-exact")
    for shape in shapes:
        small = shape == SMALL
        case = nf4lab.make_case(shape, "bf16")
        log(f"{shape}: case ready")
        run.add(measure(variants(small, args.focus), case, args.rounds if small else args.big_rounds, log, verify_after=small))
        run.finalize()
        path = run.save(NAME + ("_focus" if args.focus else ""))     # after each shape: a run stopped at the time limit keeps what finished
        log(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    print(table(run))
    print(f"measured on {results.label(run.meta)}; {time.time() - t_start:.0f} s")
    return 0


# ------------------------------------------------------------------ no GPU: the simulator
def tiny_main(args) -> int:
    """Every variant bit for bit in the simulator (no timing): small shapes, persistent grids that loop."""
    global TINY_GRID
    if not runtime.SIMULATOR:
        print("--tiny runs in the simulator: NF4LAB_MODE=sim python -m lab.wall_small_shapes --tiny",
              file=sys.stderr)
        return 2
    TINY_GRID = 2
    t0 = time.time()
    vs = variants(True)
    shapes = [(130, 129, "randn")] + [(*s, "randn") for s in SIM_EDGE_SHAPES] + [(31, 67, "heavy"), (31, 67, "codes")]
    for dtype in ("bf16", "fp16"):
        for r, c, dist in shapes:
            shape = (r, c)
            case = nf4lab.make_case(shape, dtype, dist=dist)
            for name, v in vs.items():
                if v == "shipped" or getattr(v, "no_verify", False):
                    continue
                if dtype != "bf16" and not isinstance(v, DropIn):
                    continue                        # the lab's notebook-style launches are bf16 only
                if isinstance(v, DropIn):
                    d = dropin(v.T, v.U, v.mode, dtype)
                    with d:
                        verify_launch_arrays(case, f"{name} {dtype} {shape} {dist}")
                else:
                    run_and_verify(v, case, name=f"{name} {shape} {dist}")
        print(f"{dtype}: {len(shapes)} shapes bit-exact ({time.time() - t0:.0f} s)")
    # One more, where every lab kernel's tiles really loop and the grid is more than one block.
    case = nf4lab.make_case((64, 1029), "bf16")
    for name, v in vs.items():
        if callable(v) and not getattr(v, "no_verify", False):
            run_and_verify(v, case, name=f"{name} (64, 1029)")
    # The diagnostics only have to run.
    b = make_buffers(case)
    for name, v in vs.items():
        if getattr(v, "no_verify", False):
            v(b)
    print(f"simulator: every variant bit-exact with bitsandbytes, diagnostics ran ({time.time() - t0:.0f} s)")
    return 0


# ------------------------------------------------------------------ no GPU: PTX (and SASS where ptxas is)


def ptx_main(args) -> int:
    """Compile every kernel for sm_90 (NF4LAB_MODE=compile): the typing a GPU run would do, and with
    ptxas on PATH registers per thread and the order of global loads, barrier and first store in SASS."""
    import os
    import re
    import shutil
    import subprocess
    import tempfile

    if runtime.SIMULATOR:
        print("--ptx needs real numba.cuda: NF4LAB_MODE=compile python -m lab.wall_small_shapes --ptx",
              file=sys.stderr)
        return 2
    ptxas = shutil.which("ptxas")
    cuobjdump = shutil.which("cuobjdump") or str(Path(sys.executable).parent.parent / "lib" /
                                                 f"python{sys.version_info[0]}.{sys.version_info[1]}" /
                                                 "site-packages/nvidia/cu13/bin/cuobjdump")
    kernels = {}
    for name, v in variants(True).items():
        if isinstance(v, DropIn):
            _, fn = make_kernels(v.T, v.U, v.mode, v.dtype)
            kernels[name] = (fn, fastkernel.signature(v.dtype, True), None)
    for name, v in variants(True).items():
        if callable(v) and not getattr(v, "no_verify", False) and not isinstance(v, DropIn):
            kernels[name] = (v.kernel.py_func, NB_SIG, v.kernel.targetoptions.get("launch_bounds"))
    for kind in ("lut", "code2"):
        kernels[f"diag {kind}"] = (make_diag(kind).kernel.py_func,
                                   "(uint32[::1], uint8[::1], float32[::1], float32[::1], uint32[::1], uint64)", None)
    tmp = Path(tempfile.mkdtemp(prefix="wall_ptx_"))
    for name, (fn, sig, bounds) in kernels.items():
        ptx, _ = cuda.compile_ptx(fn, sig.removeprefix("void") if isinstance(sig, str) else sig, cc=(9, 0),
                                  launch_bounds=bounds)
        bad = [p for p in (r"^\s*ld\.local", r"^\s*st\.local", r"^\s*fma\.", r"\.f64\b")
               if re.search(p, ptx, re.M)]
        line = f"{name:<36} PTX ok" + (f", UNWANTED {bad}" if bad else "")
        if ptxas:
            f = tmp / (re.sub(r"\W+", "_", name) + ".ptx")
            f.write_text(re.sub(r"^\.version .*$", ".version 8.8", ptx, flags=re.M))   # what ptxas 12.8+ reads
            cub = f.with_suffix(".cubin")
            r = subprocess.run([ptxas, "-arch=sm_90", "-v", str(f), "-o", str(cub)], capture_output=True, text=True)
            m = re.search(r"Used (\d+) registers", r.stderr)
            sp = re.search(r"(\d+) bytes spill stores", r.stderr)
            line += (f", {m.group(1) if m else '?'} registers, {sp.group(1) if sp else '?'} B spilled"
                     if r.returncode == 0 else f", ptxas failed: {r.stderr[-300:]}")
            if r.returncode == 0 and os.path.exists(cuobjdump):
                sass = subprocess.run([cuobjdump, "-sass", str(cub)], capture_output=True, text=True).stdout
                pat = r"\b(LDG\.E[.\w]*|BAR\.SYNC[.\w]*|STG\.E\.128|SHFL\.IDX|LDS[.\w]*)\b"
                seq = [m.group(1) for m in re.finditer(pat, sass)]
                seq = seq[:seq.index("STG.E.128") + 1] if "STG.E.128" in seq else seq
                short = [x.split(".")[0] + ("." + x.split(".")[-1] if x.startswith("LDG") else "") for x in seq]
                line += f"\n    SASS order up to the first 16-byte store: {' '.join(short)}"
        print(line)
    print(f"files in {tmp}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="no GPU: verify every variant in the simulator")
    ap.add_argument("--small-only", action="store_true", help="4096x14336 only")
    ap.add_argument("--focus", action="store_true", help="only the shipping candidates (HC 128x2, 256x2), every shape")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds at 4096x14336 (default 3)")
    ap.add_argument("--big-rounds", type=int, default=2, help="timing rounds at the big shapes (default 2)")
    ap.add_argument("--no-edges", action="store_true", help="skip the edge-shape verification")
    ap.add_argument("--ptx", action="store_true", help="no GPU: compile every kernel (NF4LAB_MODE=compile)")
    args = ap.parse_args(argv)
    if args.tiny:
        return tiny_main(args)
    if args.ptx:
        return ptx_main(args)
    if not runtime.ON_GPU:
        print("wall_small_shapes: no CUDA GPU here (--tiny verifies the variants in the simulator)", file=sys.stderr)
        return 2
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
