"""Machinery for the fused NF4 GEMV capstone (notebook 09): data, float64 reference, tolerance, timing.

The kernel itself lives in the notebook. This module gives it:

- ``make_gemv_case(N, K, dtype, M=1)`` -> :class:`GemvCase`: an NF4 weight W of shape (N, K)
  quantized by bitsandbytes (nested absmax, blocksize 64), activations x of shape (M, K) in
  bf16/fp16, the float32 weights bitsandbytes dequantizes to, and the float64 reference
  ``y64 = x @ W.T``.
- ``tolerance(x, w, dtype)`` and ``check(y, gc)``: a fused kernel sums K products in float32 in
  its own order, so it cannot be bit-exact with anything; it must be within a bound derived from
  the summation length (see :func:`tolerance`).
- ``make_gemv_buffers(gc)`` -> :class:`GemvBuffers`, what a notebook ``launch(g)`` receives.
- ``f32_from_bits`` / ``f16_to_f32``: two device ops (with plain-Python twins) the kernel needs to
  turn bf16/fp16 activation bits into float32; ``lds_pair(tab, byte_offset)``: two float32 from a
  64-bit shared-memory table entry addressed in bytes (one ``ld.shared.v2.f32``);
  ``load_stream_u32x4``: a 128-bit read-only load that does not allocate in L1
  (``ld.global.nc.L1::no_allocate.v4.u32``, for weights read once); ``bar_sync(id, nthreads)``: a named
  barrier for a subset of a block's warps (``bar.sync id, nthreads``).
- ``validate(g, max_m)``: every check a launch makes before it launches (dtypes, sizes, 16-byte alignment,
  batch size), raising TypeError/ValueError that name the parameter.
- GPU only: ``benchmark(launches, shapes, dtypes, ms)`` times the fused kernel(s), bitsandbytes'
  ``matmul_4bit`` (its fused 4-bit GEMV at M=1; dequantize + matmul for M>1) and ``dequantize_4bit`` +
  ``torch.matmul`` on the same data in one run, with the copy ceiling, using :mod:`nf4lab.bench`'s
  CUDA-graph timing.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import math
import os
import re
import shutil
import subprocess

import numpy as np

from . import reference, runtime

LLM_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))  # (N, K) = W.shape
EPS32 = float(np.finfo(np.float32).eps)        # 2^-23
UNIT_OUT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}  # unit roundoff of the output
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
NAME = "09_fused_gemv"


# ---------------------------------------------------------------- device ops with twins
def _py_f32_from_bits(u):
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def _py_f16_to_f32(u):
    return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))


def _build_device_ops():
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def f32_from_bits(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(v, ir.FloatType())

        return sig, codegen

    @intrinsic
    def f16_to_f32(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            h = builder.trunc(v, ir.IntType(16))
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(16)]), "cvt.f32.f16 $0, $1;", "=f,h")
            return builder.call(asm, [h])

        return sig, codegen

    def shared_ptr(context, builder, sig, args, elem):
        """Pointer to ``elem`` at byte offset args[1] (uint32) of the shared array args[0]: the array's data
        pointer cast back to the shared window, plus the offset (no index scaling, no 64-bit index math)."""
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        base = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        base = builder.addrspacecast(base, ir.PointerType(ir.IntType(8), 3))
        o = context.cast(builder, args[1], sig.args[1], types.uint32)
        p = builder.gep(base, [builder.zext(o, ir.IntType(64))])
        return builder.bitcast(p, ir.PointerType(elem, 3))

    @intrinsic
    def lds_pair(typingctx, tab, off):
        """Two float32 at byte offset ``off`` (uint32, a multiple of 8) of a shared array: one ld.shared.v2.f32.

        The offset is already in bytes, so no index is widened to 64 bits or scaled per access."""
        if not (isinstance(tab, types.Array) and tab.ndim == 1):
            return None
        sig = types.UniTuple(types.float32, 2)(tab, types.uint32)

        def codegen(context, builder, sig, args):
            v = builder.load(shared_ptr(context, builder, sig, args, ir.VectorType(ir.FloatType(), 2)), align=8)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_element(v, ir.Constant(ir.IntType(32), i)) for i in (0, 1)])

        return sig, codegen

    @intrinsic
    def lds_u32(typingctx, tab, off):
        """32 bits at byte offset ``off`` (uint32, a multiple of 4) of a shared array: one ld.shared.u32."""
        if not (isinstance(tab, types.Array) and tab.ndim == 1):
            return None
        sig = types.uint32(tab, types.uint32)

        def codegen(context, builder, sig, args):
            return builder.load(shared_ptr(context, builder, sig, args, ir.IntType(32)), align=4)

        return sig, codegen

    @intrinsic
    def load_stream_u32x4(typingctx, arr, i):
        """128 bits at uint32 element ``i`` (a multiple of 4) of a 16-byte aligned array, read-only and not
        kept in L1: ``ld.global.nc.L1::no_allocate.v4.u32`` (SASS LDG.E.NA.128.CONSTANT). For data read
        once (the packed weights), so that L1 keeps what is reused (x, the scales)."""
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.ndim == 1):
            return None
        sig = types.UniTuple(types.uint32, 4)(arr, i)

        def codegen(context, builder, sig, args):
            from numba.cuda import cgutils

            ary = context.make_array(sig.args[0])(context, builder, args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]], wraparound=False)
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            i32 = ir.IntType(32)
            ret = ir.LiteralStructType([i32] * 4)
            asm = ir.InlineAsm(ir.FunctionType(ret, [ir.IntType(64)]),
                               "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
            v = builder.call(asm, [addr])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(v, k) for k in range(4)])

        return sig, codegen

    @intrinsic
    def bar_sync(typingctx, barrier, nthreads):
        """``bar.sync barrier, nthreads``: wait until ``nthreads`` threads (whole warps) reached barrier
        ``barrier`` (1..15; 0 is __syncthreads). Orders shared-memory accesses like __syncthreads."""
        sig = types.void(types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            a = context.cast(builder, args[0], sig.args[0], types.uint32)
            b = context.cast(builder, args[1], sig.args[1], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.IntType(32)]),
                               "bar.sync $0, $1;", "r,r,~{memory}", side_effect=True)
            builder.call(asm, [a, b])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def prmt(typingctx, a, b, sel):
        """``prmt.b32 d, a, b, sel``: byte k of d is byte (sel >> 4k) & 7 of the 8 bytes b:a (a = bytes 0-3),
        or its sign replicated when bit 3 of that nibble is set. One PRMT; a constant ``sel`` becomes an
        immediate."""
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, types.uint32) for v, t in zip(args, sig.args)]
            i32 = ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32] * 3), "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen

    from numba import cuda as _cu

    @_cu.jit(device=True, inline="always")
    def shfl_idx(v, src):
        """``shfl.sync.idx.b32`` over the full warp: ``v`` of lane ``src & 31`` (PTX uses only the low 5 bits of
        the lane index with clamp 0x1f, so ``src`` needs no masking). numba's own shuffle: LLVM knows it is
        convergent (an inline-asm one made ptxas wrap every shuffle in WARPSYNC.COLLECTIVE)."""
        return _cu.shfl_sync(0xFFFFFFFF, v, src)

    return f32_from_bits, f16_to_f32, lds_pair, load_stream_u32x4, bar_sync, prmt, shfl_idx, lds_u32


def _py_prmt(a, b, sel):
    pool = (int(a) & 0xFFFFFFFF) | ((int(b) & 0xFFFFFFFF) << 32)
    out = 0
    for k in range(4):
        s = (int(sel) >> (4 * k)) & 0xF
        byte = (pool >> (8 * (s & 7))) & 0xFF
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * k)
    return np.uint32(out)


def _py_lds_pair(tab, off):
    t = np.asarray(tab)
    p = int(t.view(np.uint64)[int(off) >> 3]) if t.dtype.itemsize != 8 else int(t[int(off) >> 3])
    return _py_f32_from_bits(p & 0xFFFFFFFF), _py_f32_from_bits(p >> 32)


def _py_lds_u32(tab, off):
    return np.uint32(np.asarray(tab).view(np.uint32)[int(off) >> 2])


class _Warp:
    def __init__(self, n):
        import threading

        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.vals = [None] * n


_WARPS: dict = {}


def _py_warp_exchange(value, source, name):
    """The simulator has no warp shuffles: exchange through a per-warp barrier. Every lane posts ``value``
    and gets the value of lane ``source(lane)``, or its own where that lane is past the warp's end.

    Every lane of the warp must call it (as on the GPU with a full mask); a lane that
    returned early makes the others wait, and after 60 s the barrier raises.
    """
    import threading

    t = threading.current_thread()
    bd = t._manager._block_dim
    nthreads = int(np.prod(bd))
    lane, w = t.thread_id % 32, t.thread_id // 32
    n = min(32, nthreads - 32 * w)
    key = (id(t._manager), tuple(t.blockIdx), w, n)
    warp = _WARPS.get(key)
    if warp is None:
        warp = _WARPS.setdefault(key, _Warp(n))
    warp.vals[lane] = value
    try:
        warp.barrier.wait()
        src = source(lane)
        out = warp.vals[src] if src < n else value
        warp.barrier.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"{name}: not every lane of the warp reached the shuffle (a lane returned early or "
                           "took another branch); on a GPU that is undefined behaviour") from None
    return type(value)(out) if isinstance(value, np.generic) else out


def _py_shfl_down_sync(mask, value, delta):
    return _py_warp_exchange(value, lambda lane: lane + int(delta), "shfl_down_sync")


def _py_shfl_idx(value, src):
    """shfl.sync.idx: the value of lane src & 31 of this warp."""
    return np.float32(_py_warp_exchange(value, lambda lane: int(src) & 31, "shfl_idx"))


_BARRIERS: dict = {}


def _py_bar_sync(barrier, nthreads):
    """The simulator has no named barriers: a threading.Barrier per (block, barrier id)."""
    import threading

    t = threading.current_thread()
    key = (id(t._manager), tuple(t.blockIdx), int(barrier))
    b = _BARRIERS.get(key)
    if b is None:
        b = _BARRIERS.setdefault(key, threading.Barrier(int(nthreads), timeout=60))
    if b.parties != int(nthreads):
        raise RuntimeError(f"bar_sync({barrier}, {nthreads}): the barrier was used with {b.parties} threads")
    try:
        b.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"bar_sync({barrier}, {nthreads}): not every thread arrived (on a GPU: a hang "
                           "or undefined behaviour)") from None


def _py_load_stream_u32x4(arr, i):
    from . import ops

    return ops._py_load_u32x4(arr, i)


# nf4lab.ptx pickles these by name, so that the PTX subprocess (compile mode) gets the device versions.
DEVICE_OPS = ("f32_from_bits", "f16_to_f32", "lds_pair", "shfl_down_sync", "load_stream_u32x4", "bar_sync", "prmt",
              "shfl_idx", "lds_u32")

if runtime.SIMULATOR:
    f32_from_bits, f16_to_f32, lds_pair = _py_f32_from_bits, _py_f16_to_f32, _py_lds_pair
    load_stream_u32x4, bar_sync, prmt, shfl_idx = _py_load_stream_u32x4, _py_bar_sync, _py_prmt, _py_shfl_idx
    lds_u32 = _py_lds_u32
    shfl_down_sync = _py_shfl_down_sync
else:
    f32_from_bits, f16_to_f32, lds_pair, load_stream_u32x4, bar_sync, prmt, shfl_idx, lds_u32 = _build_device_ops()
    from numba import cuda as _cuda

    shfl_down_sync = _cuda.shfl_down_sync




def with_dynamic_shared(kern, args, nbytes):
    """``kern`` ready to launch on ``args`` with ``nbytes`` of dynamic shared memory.

    Static and dynamic shared memory together beyond 48 KB per block (an H100 gives a block up to 227 KB) need
    the kernel's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES raised first, which numba does not do: so the
    kernel is compiled for these argument types (``specialize``, cached by numba) and the attribute set on
    it once. The simulator has no such limit: ``kern`` itself."""
    if runtime.SIMULATOR or nbytes == 0:
        return kern
    spec = kern.specialize(*args)
    if getattr(spec, "_nf4lab_dynamic_smem", 0) < nbytes:
        from numba.cuda.cudadrv.driver import binding, driver

        f = next(iter(spec.overloads.values()))._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), f.handle, f.device.id)
        spec._nf4lab_dynamic_smem = nbytes
    return spec


# ---------------------------------------------------------------- Nsight Compute summary (tools/profile_gemv.py)
NCU_METRICS = {  # name in the record: ncu metric
    "time_us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "pipe_pct": "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed",
    "pipe_wavefronts": "l1tex__data_pipe_lsu_wavefronts.sum",
    "shared_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_elapsed",
    "warps_per_sm": "sm__warps_active.avg.per_cycle_active",
    "registers": "launch__registers_per_thread",
    "local_loads": "smsp__inst_executed_op_local_ld.sum",
    "sm_hz": "sm__cycles_elapsed.avg.per_second",
}


def ncu_summary(kernel: dict, N: int, K: int) -> dict:
    """One profile's record (a kernel of nf4lab.profiling.parse_csv): NCU_METRICS by their short names, the
    time in us, and the data pipe's wavefronts per 1000 weights (all, and those of shared-memory instructions)."""
    m = kernel["metrics"]
    rec = {k: (m.get(v) or {}).get("value") for k, v in NCU_METRICS.items()}
    rec = {k: (v if isinstance(v, float) else None) for k, v in rec.items()}
    if rec["time_us"] is not None:
        rec["time_us"] /= 1e3  # ncu reports ns
    for k in ("pipe", "shared"):
        v = rec[f"{k}_wavefronts"]
        rec[f"{k}_per_1k_weights"] = v / (N * K / 1000) if v is not None else None
    return rec


def ncu_table(run: dict) -> str:
    """The recorded profiles as a text table."""
    cols = (("time_us", "us", 6, ".1f"), ("dram_pct", "DRAM %", 7, ".1f"), ("pipe_pct", "pipe %", 7, ".1f"),
            ("pipe_per_1k_weights", "pipe/1k w", 10, ".1f"), ("shared_per_1k_weights", "shared/1k w", 12, ".1f"),
            ("issue_pct", "issue %", 8, ".1f"), ("warps_per_sm", "warps/SM", 9, ".1f"), ("registers", "regs", 5, ".0f"))
    lines = [f"{'W (N x K)':>11}  {'variant':<22}" + "".join(f" {h:>{w}}" for _, h, w, _ in cols)]
    for r in run["rows"]:
        m = r["metrics"]
        lines.append(f"{r['shape']:>11}  {r['variant']:<22}" + "".join(
            f" {format(m[k], f) if m.get(k) is not None else '-':>{w}}" for k, _, w, f in cols))
    return "\n".join(lines)


def pipe_ceiling_gbps(metrics: dict, N: int, K: int, sms: int) -> float:
    """Weight bandwidth (GB/s, bytes of :func:`weight_bytes`) at which the SM's load/store data pipe, one
    wavefront per cycle, would be 100% busy with the wavefronts per weight that a profile measured."""
    weights_per_s = sms * metrics["sm_hz"] / (metrics["pipe_per_1k_weights"] / 1000)
    return weights_per_s * weight_bytes(N, K) / (N * K) / 1e9


def read_bound_table(bound, gemv_run=None) -> str:
    """tools/gemv_read_bound.py's run (a bench.Run) as text: per shape the read-only bound in us and GB/s, as a
    share of that run's copy ceiling, and, from a GEMV benchmark run, the default kernel (bf16, M=1) against it."""
    copy = max((r["gbps"] for r in bound.records if r["name"] == COPY), default=None)
    lines = [f"{'W (N x K)':>11} {'read us':>8} {'read GB/s':>10} {'% copy':>7} {'GEMV us':>8} {'GEMV / read':>12}"
             f"  best read config"]
    for r in bound.records:
        if r["kind"] != "bound":
            continue
        ours = None
        if gemv_run is not None:
            name = default_kernel(gemv_run)
            ours = next((q for q in gemv_run.records if q["name"] == name and q["shape"] == r["shape"]
                         and q["dtype"] == "bf16" and q.get("M", 1) == 1), None)
        lines.append(f"{'x'.join(map(str, r['shape'])):>11} {r['ms'] * 1e3:8.1f} {r['gbps']:10.0f} "
                     f"{(100 * r['gbps'] / copy if copy else float('nan')):6.0f}% "
                     f"{(ours['ms'] * 1e3 if ours else float('nan')):8.1f} "
                     f"{(100 * r['ms'] / ours['ms'] if ours else float('nan')):11.0f}%  {r.get('config', '')}")
    if copy:
        lines.append(f"(copy ceiling {copy:.0f} GB/s in the same run; 'GEMV / read': the GEMV's speed as a share "
                     "of the pure read's)")
    return "\n".join(lines)


def load_ncu(gpu: str | None = None) -> dict | None:
    """The recorded profiles of tools/profile_gemv.py --save (data/ncu/<gpu>/09_fused_gemv.json), or None."""
    import json

    from . import results

    base = results.ROOT / "data" / "ncu"
    found = sorted(base.glob(f"*/{NAME}.json"))
    if gpu:
        found = [p for p in found if p.parent.name == results.gpu_slug(gpu)]
    return json.loads(found[0].read_text()) if found else None


# ---------------------------------------------------------------- SASS, offline
SASS_PTX_VERSION = "9.0"  # the highest PTX ISA version CUDA 13.0's ptxas accepts


def find_tool(name):
    path = shutil.which(name)
    if path:
        return path
    import site

    for d in site.getsitepackages() + [site.getusersitepackages()]:
        hits = glob.glob(os.path.join(d, "nvidia", "*", "bin", name))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"{name} not found (CUDA toolkit, or pip install nvidia-cuda-{name})")


def sass_of(ptx: str, workdir, stem: str, arch="sm_90"):
    """(ptxas -v text, SASS text) of a PTX string."""
    ptx = re.sub(r"^\.version \d+\.\d+", f".version {SASS_PTX_VERSION}", ptx, flags=re.M)
    p = workdir / f"{stem}.ptx"
    p.write_text(ptx)
    cubin = workdir / f"{stem}.cubin"
    info = subprocess.run([find_tool("ptxas"), f"-arch={arch}", "-v", str(p), "-o", str(cubin)],
                          capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    (workdir / f"{stem}.sass").write_text(sass)
    return info, sass


def hottest_loop(sass: str):
    """Instructions (text) of the largest innermost loop: from a backward branch's target to the branch."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    where = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in where:
            s = where[int(m.group(1), 16)]
            loops.append((i - s + 1, s, i))
    # innermost loops (no other loop inside), the largest of them
    inner = [lp for lp in loops if not any(o is not lp and lp[1] <= o[1] and o[2] <= lp[2] for o in loops)]
    if not inner:
        return []
    _, s, e = max(inner)
    return [t for _, t in ins[s:e + 1]]


def opcode(text):
    return re.sub(r"^@!?U?P[T\d]+\s+", "", text).split()[0]


def jit_option(kernel, name):
    """An option a kernel was jitted with (``launch_bounds``, ...): on a GPU from the dispatcher's target
    options, in the simulator from what nf4lab's patched ``cuda.jit`` remembered; None if not given."""
    opts = getattr(kernel, "_nf4lab_jit_kwargs", None)
    if opts is None:
        opts = getattr(kernel, "targetoptions", None) or {}
    return opts.get(name)


def kernel_ptx(kernel, sig) -> str:
    """PTX of a kernel with the launch bounds it was jitted with (``.maxntid``/``.minnctapersm``), which
    :func:`nf4lab.compile_ptx` alone would drop; works in the simulator and without a GPU."""
    from . import ptx as _ptx

    bounds = jit_option(kernel, "launch_bounds")
    return _ptx.compile_ptx(kernel, sig, **({"launch_bounds": bounds} if bounds else {}))


def sass_report(kernel, sig, weights_per_trip, stem="kernel", workdir=None, ptx=None):
    """ptxas registers/spills/smem and the SASS of the hottest (innermost) loop, per weight.

    Needs ptxas and cuobjdump (the CUDA toolkit, or pip install nvidia-cuda-cuobjdump); raises
    FileNotFoundError without them."""
    import tempfile
    from pathlib import Path

    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp())
    workdir.mkdir(parents=True, exist_ok=True)
    if ptx is None:
        ptx = kernel_ptx(kernel, sig)
    info, sass = sass_of(ptx, workdir, stem)
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores", info)
    smem = re.search(r"(\d+) bytes smem", info)
    loop = hottest_loop(sass)
    ops = collections.Counter(opcode(t) for t in loop)
    return dict(registers=int(regs.group(1)) if regs else None, spill_bytes=int(spill.group(1)) if spill else None,
                smem_bytes=int(smem.group(1)) if smem else None, loop_instructions=len(loop),
                weights_per_trip=weights_per_trip, per_weight=len(loop) / weights_per_trip,
                opcodes=dict(ops.most_common()))



SASS_REPORT = "data/sass/09_fused_gemv.json"  # tools/sass_gemv.py --save writes it (relative to the repository)


def ptxas_version() -> str:
    out = subprocess.run([find_tool("ptxas"), "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def load_sass_report():
    """The offline SASS report recorded by ``tools/sass_gemv.py --save`` ({"meta", "rows"}), or None."""
    import json

    from .results import ROOT

    path = ROOT / SASS_REPORT
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data["path"] = SASS_REPORT
    return data


def sass_table(report, dtype="bf16", m=1) -> str:
    rows = [r for r in report["rows"] if r["dtype"] == dtype and r.get("m", 1) == m]
    out = [f"{'variant':<26} {'registers':>9} {'spilled B':>9} {'warps/SM':>8} {'SASS/weight':>11}"]
    for r in rows:
        out.append(f"{r['variant']:<26} {r['registers']:>9} {r['spill_bytes'] or 0:>9} {r.get('warps_per_sm') or '-':>8} "
                   f"{r['per_weight']:>11.2f}")
    return "\n".join(out)


# ---------------------------------------------------------------- data and reference
@dataclasses.dataclass
class GemvCase:
    N: int
    K: int
    M: int
    dtype: str
    blocksize: int
    packed: np.ndarray      # uint8, N*K/2, high nibble first, flat index row*K + col
    absmax_q: np.ndarray    # uint8 per block
    absmax2: np.ndarray     # float32 per 256 blocks
    code2: np.ndarray       # float32[256]
    offset: np.float32
    lut: np.ndarray         # float32[16]
    x_bits: np.ndarray      # uint16 (M, K): the activations as bf16/fp16 bits
    x: np.ndarray           # float32 (M, K): the same values
    w: np.ndarray           # float32 (N, K): what bitsandbytes dequantizes to before the output cast
    y64: np.ndarray         # float64 (M, N): x @ w.T in float64
    tol: np.ndarray         # float64 (M, N): allowed |y - y64|
    case: object = None     # the nf4lab.cases.Case it was made from

    @property
    def shape(self):
        return (self.N, self.K)

    def __repr__(self):
        return (f"GemvCase(W {self.N}x{self.K} NF4 ({self.packed.size:,} packed bytes, {self.absmax_q.size} blocks, "
                f"{self.absmax2.size} groups), x {self.M}x{self.K} {self.dtype})")

    def bnb_tensors(self, device="cpu"):
        """(W_packed, quant_state, x) as bitsandbytes takes them."""
        import torch

        packed, qs = self.case.quant_state(device)
        x = torch.from_numpy(self.x_bits.view(np.int16).copy()).view(getattr(torch, TORCH_DTYPE[self.dtype]))
        return packed, qs, x.to(device)


def make_x(M, K, dtype, seed=0, dist="randn") -> tuple[np.ndarray, np.ndarray]:
    """Activations rounded to the dtype: standard normal, or "heavy" (Student t with 2 degrees of freedom
    plus a few outlier columns 100x larger, as LLM activations have). Returns (bits uint16, float32 values)."""
    rng = np.random.default_rng(1000 + seed)
    if dist == "randn":
        xf = rng.standard_normal((M, K)).astype(np.float32)
    elif dist == "heavy":
        xf = rng.standard_t(2.0, (M, K))
        xf[:, rng.choice(K, size=max(1, K // 64), replace=False)] *= 100.0
        xf = np.clip(xf, -3e4, 3e4).astype(np.float32)  # inside the fp16 range
    else:
        raise ValueError(f"x_dist must be 'randn' or 'heavy', got {dist!r}")
    bits = reference.f32_to_bits(xf, dtype).reshape(M, K)
    return bits, reference.bits_to_f32(bits, dtype).reshape(M, K)


def reference_y64(x, w) -> np.ndarray:
    """y = x @ w.T in float64: the value every float32 summation order approximates."""
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64).T


def tolerance(x, w, dtype, c: float = 1.0) -> np.ndarray:
    """Allowed |y - y64| for a float32 dot product of length K rounded to ``dtype``.

    Any float32 summation of K products (any order, FMA or not) is within
    gamma_K * sum|x_k w_k| of the exact value, gamma_K ~= K * u32 (u32 = 2^-24, Higham's bound).
    We allow c * K * eps32 (eps32 = 2 u32) to cover the extra rounding of multiplying a
    partial sum by the block scale. Rounding the result to bf16/fp16 adds u_out * |y|.
    """
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    K = x.shape[-1]
    s = np.abs(x) @ np.abs(w).T
    acc = c * K * EPS32 * s
    u = UNIT_OUT[dtype]
    return (1 + u) * acc + u * np.abs(reference_y64(x, w)) + np.finfo(np.float32).tiny


def make_gemv_case(N, K, dtype="bf16", M=1, dist="randn", seed=0, blocksize=64, x_dist="randn") -> GemvCase:
    """W (N, K) quantized by bitsandbytes (through nf4lab.cases, cached; ``dist`` as there: "heavy" is
    Student t weights), x (M, K) (``x_dist``: see :func:`make_x`), reference and tolerance."""
    from .cases import make_case

    if dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be bf16 or fp16, got {dtype!r}")
    case = make_case((N, K), dtype=dtype, dist=dist, seed=seed, blocksize=blocksize)
    absmax = reference.block_absmax(case.absmax_q, case.absmax2, case.code2, case.offset)
    w = reference.dequantize_f32(case.packed, absmax, case.n, blocksize).reshape(N, K)
    x_bits, x = make_x(M, K, dtype, seed, x_dist)
    return GemvCase(N=N, K=K, M=M, dtype=dtype, blocksize=blocksize, packed=case.packed,
                    absmax_q=case.absmax_q, absmax2=case.absmax2, code2=case.code2,
                    offset=np.float32(case.offset), lut=case.lut.copy(), x_bits=x_bits, x=x, w=w,
                    y64=reference_y64(x, w), tol=tolerance(x, w, dtype), case=case)


def to_f32(y, dtype) -> np.ndarray:
    """Output (numpy bits / floats, numba device array or torch tensor) as float32 values."""
    if hasattr(y, "copy_to_host"):
        y = y.copy_to_host()
    if type(y).__module__.startswith("torch"):
        y = y.detach().float().cpu().numpy()
    y = np.asarray(y)
    if y.dtype.kind in "ui":
        return reference.bits_to_f32(y.astype(np.uint16), dtype).reshape(y.shape)
    return y.astype(np.float32)


@dataclasses.dataclass
class GemvReport:
    name: str
    ok: bool
    max_err: float
    worst_ratio: float       # max |y - y64| / tol (<= 1 passes)
    n_bad: int
    n: int
    first_bad: list

    def __bool__(self):
        return self.ok

    def __str__(self):
        head = (f"{self.name}: {'within' if self.ok else 'OUTSIDE'} the float32 tolerance "
                f"({self.n:,} outputs, max |y - y64| = {self.max_err:.3g}, worst error/tolerance = "
                f"{self.worst_ratio:.3g})")
        if self.ok:
            return head
        lines = [head, f"  {self.n_bad:,} outputs outside; first ones (m, n, y, y64, tol):"]
        lines += [f"    {m:>3} {n:>6} {y:>12.6g} {r:>12.6g} {t:>10.3g}" for m, n, y, r, t in self.first_bad]
        return "\n".join(lines)


class GemvError(AssertionError):
    pass


def compare(y, gc: GemvCase, name="kernel", M=None) -> GemvReport:
    M = gc.M if M is None else M
    yv = to_f32(y, gc.dtype).reshape(-1)[: M * gc.N].reshape(M, gc.N).astype(np.float64)
    ref, tol = gc.y64[:M], gc.tol[:M]
    err = np.abs(yv - ref)
    bad = ~(err <= tol)  # NaN counts as bad
    idx = np.argwhere(bad)[:8]
    first = [(int(m), int(n), float(yv[m, n]), float(ref[m, n]), float(tol[m, n])) for m, n in idx]
    ratio = float(np.nanmax(np.where(np.isfinite(err), err / tol, np.inf))) if err.size else 0.0
    return GemvReport(name, not bad.any(), float(np.nanmax(err)) if err.size else 0.0, ratio,
                      int(bad.sum()), yv.size, first)


def check(y, gc: GemvCase, name="kernel", raise_on_error=True, M=None) -> GemvReport:
    """Compare an output with the float64 reference; raise :class:`GemvError` if outside the tolerance."""
    rep = compare(y, gc, name, M)
    if not rep.ok and raise_on_error:
        raise GemvError(str(rep))
    return rep


def bnb_output(gc: GemvCase, device="cpu"):
    """bitsandbytes.matmul_4bit(x, W.t(), quant_state) on the case (CPU in the simulator)."""
    import bitsandbytes as bnb
    import torch

    packed, qs, x = gc.bnb_tensors(device)
    with torch.no_grad():
        return bnb.matmul_4bit(x, packed.t(), quant_state=qs)


# ---------------------------------------------------------------- device buffers
@dataclasses.dataclass
class GemvBuffers:
    packed_u32: object      # uint32 view of the packed codes (16-byte aligned)
    absmax_q: object
    absmax2: object
    code2: object
    lut: object
    offset: np.float32
    x_u32: object           # uint32 view of x bits (M, K) flattened: x[m, 2j] low half of word m*K/2 + j
    y: object               # uint16 (M * N) output bits
    N: int
    K: int
    M: int
    bs_shift: int           # log2(blocksize)
    dtype: str
    stream: object = 0
    grid: int | None = None  # a launch may honour it instead of its own grid (tests: the grid-stride loop)

    def result(self):
        from numba import cuda

        cuda.synchronize()
        return self.y.copy_to_host()


def _check_layout(N, K, blocksize):
    if K % 64:
        raise ValueError(f"K={K}: the fused kernel needs K a multiple of 64 (each lane takes 64 consecutive "
                         "columns, one absmax block, of a row; bitsandbytes itself falls back to "
                         "dequantize+matmul unless K is a multiple of the blocksize)")
    if blocksize < 64 or blocksize & (blocksize - 1):
        raise ValueError(f"blocksize {blocksize}: a power of two >= 64 is needed (64 columns share one scale)")


MAX_M = 8  # batch rows of x the fused kernels take (each weight byte is still read once)


def _address(arr) -> int:
    """Device address of a numba device array (or of the host array behind a simulator array)."""
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    from . import ops

    return int(ops._host_array(arr).__array_interface__["data"][0])


def _ceil_div(a, b):
    return -(-a // b)


# (parameter, dtype, elements needed as a function of N, K, M and the blocksize, read with 128-bit loads)
_PARAMS = (
    ("packed_u32", np.uint32, lambda N, K, M, bs: _ceil_div(N * K, 8), True),
    ("absmax_q", np.uint8, lambda N, K, M, bs: _ceil_div(N * K, bs), False),
    ("absmax2", np.float32, lambda N, K, M, bs: _ceil_div(_ceil_div(N * K, bs), reference.NESTED_BLOCKSIZE), False),
    ("code2", np.float32, lambda N, K, M, bs: 256, False),
    ("lut", np.float32, lambda N, K, M, bs: 16, False),
    ("x_u32", np.uint32, lambda N, K, M, bs: M * K // 2, True),
    ("y", np.uint16, lambda N, K, M, bs: M * N, False),
)


def validate(g, max_m: int = MAX_M) -> None:
    """Everything a launch checks before it launches, so that bad input raises here, naming the parameter,
    instead of reading out of bounds or faulting on a misaligned 128-bit load (a sticky error that kills the
    CUDA context). TypeError for a wrong dtype, ValueError for a wrong size, batch or alignment."""
    if g.dtype not in TORCH_DTYPE:
        raise ValueError(f"dtype must be 'bf16' or 'fp16', got {g.dtype!r}")
    for name in ("N", "K", "M", "bs_shift"):
        v = getattr(g, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 1 <= g.M <= max_m:
        raise ValueError(f"M={g.M}: this kernel takes 1 to {max_m} rows of x (batch), got {g.M}")
    if g.N < 1:
        raise ValueError(f"N={g.N}: W needs at least one row")
    if not 6 <= g.bs_shift <= 12:
        raise ValueError(f"bs_shift={g.bs_shift}: the blocksize 2**bs_shift must be 64..4096")
    _check_layout(g.N, g.K, 1 << g.bs_shift)
    if g.N * g.K // 8 >= 1 << 32:
        raise ValueError(f"N*K={g.N * g.K}: word indices must fit in 32 bits (N*K < 2**35)")
    if not isinstance(g.offset, (float, np.floating)):
        raise TypeError(f"offset must be a float32 scalar, got {type(g.offset).__name__}")
    for name, dt, need, aligned in _PARAMS:
        arr = getattr(g, name)
        if arr is None or not hasattr(arr, "dtype") or not hasattr(arr, "shape"):
            raise TypeError(f"{name} must be a device array, got {type(arr).__name__}")
        if np.dtype(arr.dtype) != np.dtype(dt):
            raise TypeError(f"{name} must have dtype {np.dtype(dt).name}, got {np.dtype(arr.dtype).name}")
        if len(arr.shape) != 1:
            raise ValueError(f"{name} must be 1-D (flattened), got shape {tuple(arr.shape)}")
        n = need(g.N, g.K, g.M, 1 << g.bs_shift)
        if arr.shape[0] < n:
            raise ValueError(f"{name} has {arr.shape[0]} elements; N={g.N}, K={g.K}, M={g.M} need {n}")
        if aligned and _address(arr) % 16:
            raise ValueError(f"{name} is not 16-byte aligned (address {_address(arr):#x}): the kernel reads it "
                             "with 128-bit loads, and a misaligned one kills the CUDA context")


def make_gemv_buffers(gc: GemvCase) -> GemvBuffers:
    from numba import cuda

    _check_layout(gc.N, gc.K, gc.blocksize)
    packed = np.zeros(-(-gc.packed.size // 16) * 16, np.uint8)
    packed[: gc.packed.size] = gc.packed
    xb = np.ascontiguousarray(gc.x_bits.reshape(-1)).view(np.uint32)
    y = np.full(gc.M * gc.N, 0x7FBF, np.uint16)  # poison: a NaN no kernel writes
    return GemvBuffers(
        packed_u32=cuda.to_device(packed).view(np.uint32), absmax_q=cuda.to_device(gc.absmax_q),
        absmax2=cuda.to_device(gc.absmax2), code2=cuda.to_device(gc.code2), lut=cuda.to_device(gc.lut),
        offset=np.float32(gc.offset), x_u32=cuda.to_device(xb), y=cuda.to_device(y),
        N=gc.N, K=gc.K, M=gc.M, bs_shift=int(gc.blocksize).bit_length() - 1, dtype=gc.dtype)


def buffers_from_torch(packed, qs, x, y) -> GemvBuffers:
    """Zero-copy GemvBuffers over torch CUDA tensors (bitsandbytes' own QuantState), for timing."""
    import torch
    from numba import cuda

    N, K = qs.shape
    _check_layout(N, K, qs.blocksize)
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]
    assert packed.data_ptr() % 16 == 0 and x.data_ptr() % 16 == 0
    arr = lambda t: cuda.as_cuda_array(t.reshape(-1))  # noqa: E731
    return GemvBuffers(
        packed_u32=arr(packed.reshape(-1).view(torch.int32)).view(np.uint32), absmax_q=arr(qs.absmax),
        absmax2=arr(qs.state2.absmax.float()), code2=arr(qs.state2.code.float()), lut=arr(qs.code.float()),
        offset=np.float32(qs.offset.item()), x_u32=arr(x.reshape(-1).view(torch.int32)).view(np.uint32),
        y=arr(y.reshape(-1).view(torch.int16)).view(np.uint16), N=N, K=K, M=x.numel() // K,
        bs_shift=int(qs.blocksize).bit_length() - 1, dtype=dtype)


# ---------------------------------------------------------------- bytes and timing
def weight_bytes(N, K, blocksize=64) -> int:
    """Bytes a GEMV must read for the weight: packed codes + absmax_q + absmax2 + code2 (x, y not counted)."""
    n = N * K
    nblocks = -(-n // blocksize)
    return -(-n // 2) + nblocks + 4 * -(-nblocks // reference.NESTED_BLOCKSIZE) + 1024


def unfused_bytes(N, K, itemsize=2, blocksize=64) -> int:
    """Dequantize then multiply: read the packed weight, write W in 16 bits, read it again."""
    return weight_bytes(N, K, blocksize) + 2 * itemsize * N * K


FUSED = "fused NF4 gemv (numba)"  # every record of our kernels: f"{FUSED} [{variant}]" (kernel_name)
BNB_GEMV = "bitsandbytes matmul_4bit gemv (M=1)"
BNB_MATMUL = "bitsandbytes matmul_4bit gemv (M>1: dequantize + matmul)"
BNB_DQ_MM = "bitsandbytes dequantize_4bit + torch.matmul gemv"
NAME_BATCH = NAME + "_batch"
COPY_BYTES = 1 << 30  # the copy ceiling: a 1 GiB copy (512 MiB read + 512 MiB written), far beyond L2
from .bench import COPY  # noqa: E402  (the copy ceiling's record name: one spelling, nf4lab.bench's)


def kernel_name(variant: str) -> str:
    return f"{FUSED} [{variant}]"


def bnb_name(M: int) -> str:
    """bitsandbytes' matmul_4bit runs its GEMV kernel only for one row of x; for more it dequantizes + matmuls."""
    return BNB_GEMV if M == 1 else BNB_MATMUL


def default_kernel(run) -> str:
    """Name of the kernel record a run's plots show: the first variant timed, or, in runs made before the
    streaming redesign (no "default_kernel" in meta), the first version recorded as plain FUSED."""
    return run.meta.get("default_kernel") or FUSED


def describe_kernels(run) -> str:
    if "default_kernel" not in run.meta:
        return (f"this run predates the streaming kernel: '{FUSED}' there is the first version (nf4lab.gemv_v1), "
                "with its grid policies in brackets")
    return (f"default: '{run.meta['default_kernel']}'; variants timed: " + ", ".join(run.meta.get("variants", [])))


def _quantize_gpu(N, K, dtype, seed=0, M=1):
    import bitsandbytes.functional as F
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = getattr(torch, TORCH_DTYPE[dtype])
    w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    packed, qs = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    x = torch.randn(M, K, generator=g, device="cuda", dtype=torch.float32).to(t)
    return packed, qs, x


def _gpu_reference(packed, qs, x):
    """(y64, tol) on the GPU: bitsandbytes' float32 weights, float64 products and sums."""
    import bitsandbytes.functional as F
    import torch

    qs32 = qs.__class__(absmax=qs.absmax, shape=qs.shape, code=qs.code, blocksize=qs.blocksize,
                        quant_type=qs.quant_type, dtype=torch.float32, offset=qs.offset, state2=qs.state2)
    w = F.dequantize_4bit(packed, qs32).double()
    xd = x.double()
    y64 = xd @ w.T
    K = x.shape[-1]
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[x.dtype]
    u = UNIT_OUT[dtype]
    acc = K * EPS32 * (xd.abs() @ w.abs().T)
    tol = (1 + u) * acc + u * y64.abs() + np.finfo(np.float32).tiny
    del w
    return y64, tol


def _gpu_check(y, y64, tol, name):
    err = (y.double().reshape(y64.shape) - y64).abs()
    bad = ~(err <= tol)
    ratio = float((err / tol).max())
    return {"name": name, "ok": not bool(bad.any()), "worst_ratio": ratio, "max_err": float(err.max())}


def benchmark(launch, shapes=LLM_SHAPES, dtypes=("bf16", "fp16"), ms=(1,), *, variant_dtypes=None,
              deadline=None, progress=print):
    """Fused kernel(s) vs bitsandbytes on the same data, in one run (GPU only).

    ``launch``: a launch function (``launch(g)``, ``g`` a :class:`GemvBuffers`, on ``g.stream``) or a dict
    {variant: launch} timed side by side, each recorded as ``kernel_name(variant)``; the first is the
    default (``run.meta["default_kernel"]``). ``ms``: batch sizes (rows of x); for M > 1 bitsandbytes'
    ``matmul_4bit`` dequantizes and multiplies (:data:`BNB_MATMUL`). ``variant_dtypes``: dtypes on which
    the variants after the first are timed (default: all). ``deadline``: a ``time.time()`` after which no
    new (shape, dtype, M) is started (``meta["incomplete"]`` says so), to keep a GPU session in budget.
    To keep repeated launches from reading the weights out of L2 (50 MB on an H100), every timed function
    cycles through enough copies of the weight to exceed 4x the L2 size, as a decoding step does (each
    layer's weights are read once per token). Every output is checked against a float64 reference first.
    Returns a :class:`nf4lab.bench.Run` (records: ceilings, baselines, kernels, each with its "M").
    """
    import time

    from . import bench
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    import torch

    bench._require_gpu()
    launches = dict(launch) if isinstance(launch, dict) else {"default": launch}
    first = next(iter(launches))
    names = {key: kernel_name(key) for key in launches}
    run = bench.Run(method=bench.METHOD + "; weights cycled over copies totalling > 4x L2 so each "
                    "launch reads them from DRAM; effective bandwidth = weight bytes (packed + absmax_q + "
                    "absmax2 + code2) / time")
    l2 = runtime.device_info().get("l2_bytes") or (50 << 20)
    t0 = time.time()
    ceil = bench.ceilings(COPY_BYTES)
    run.meta.update(copy_ceiling_bytes=COPY_BYTES, checks=[], default_kernel=names[first], variants=list(launches),
                    batch_sizes=list(ms), incomplete=False)
    for N, K in shapes:
        for dtype in dtypes:
            for M in ms:
                if deadline is not None and time.time() > deadline:
                    run.meta["incomplete"] = True
                    if progress:
                        progress(f"deadline reached: {N}x{K} {dtype} M={M} and later skipped")
                    continue
                keys = [k for k in launches if k == first or variant_dtypes is None or dtype in variant_dtypes]
                _bench_one(run, launches, keys, names, N, K, dtype, M, l2, ceil, bnb, F, torch, bench, progress)
    run.meta["seconds"] = round(time.time() - t0, 1)
    run.finalize()
    for r in run.records:  # speedup relative to bitsandbytes' matmul_4bit at the same shape, dtype and M
        if r["kind"] == "ceiling" or not r.get("ms"):
            continue
        b = next((q for q in run.records if q["name"] == bnb_name(r.get("M", 1)) and q["shape"] == r["shape"]
                  and q["dtype"] == r["dtype"] and q.get("M", 1) == r.get("M", 1)), None)
        r["speedup_vs_bnb"] = b["ms"] / r["ms"] if b and b.get("ms") else None
    return run


def _bench_one(run, launches, keys, names, N, K, dtype, M, l2, ceil, bnb, F, torch, bench, progress):
    import time

    t_start = time.time()
    nb = weight_bytes(N, K)
    copies = max(2, math.ceil(4 * l2 / nb))
    data = [_quantize_gpu(N, K, dtype, seed=i, M=M) for i in range(copies)]
    x = data[0][2]
    data = [(p, q, x) for p, q, _ in data]
    y = torch.empty(M, N, dtype=x.dtype, device="cuda")
    bufs = [buffers_from_torch(p, q, x, y) for p, q, _ in data]
    # correctness on copy 0, against float64, for ours and bitsandbytes
    y64, tol = _gpu_reference(*data[0])
    bufs[0].stream = 0
    yb = bnb.matmul_4bit(x, data[0][0].t(), quant_state=data[0][1])
    chk_b = _gpu_check(yb, y64, tol, bnb_name(M))
    checks = {}
    for key in keys:
        fn = launches[key]
        fn(bufs[0])  # the first launch compiles (a launch may size its grid from the compiled kernel)
        y.fill_(float("nan"))
        fn(bufs[0])
        torch.cuda.synchronize()
        checks[key] = _gpu_check(y, y64, tol, names[key])
        diff = float((y.float() - yb.float().reshape(y.shape)).abs().max())
        checks[key].update(shape=[N, K], dtype=dtype, M=M, max_abs_diff_vs_bnb=diff)
        run.meta["checks"].append(checks[key])
    chk = checks[keys[0]]
    chk_b.update(shape=[N, K], dtype=dtype, M=M, max_abs_diff_vs_bnb=chk["max_abs_diff_vs_bnb"])
    run.meta["checks"].append(chk_b)
    del y64, tol
    state = {"i": 0}

    def nxt():
        i = state["i"]
        state["i"] = (i + 1) % copies
        return i

    def make_ours(fn):
        def ours(stream):
            g = bufs[nxt()]
            g.stream = stream
            fn(g)

        return ours

    def bnb_mm(stream):
        p, q, xx = data[nxt()]
        bnb.matmul_4bit(xx, p.t(), quant_state=q)

    def bnb_dq_mm(stream):
        p, q, xx = data[nxt()]
        torch.matmul(xx, F.dequantize_4bit(p, q).t())

    for kind, name, fn, ok in (("baseline", bnb_name(M), bnb_mm, chk_b["ok"]),
                               ("baseline", BNB_DQ_MM, bnb_dq_mm, None),
                               *(("kernel", names[key], make_ours(launches[key]), checks[key]["ok"])
                                 for key in keys)):
        state["i"] = 0
        t = bench.gpu_time_ms(fn, launches=max(bench.LAUNCHES, copies))
        rec = bench._record(kind, name, (N, K), dtype, t, nb, bit_exact=None, within_tol=ok,
                            copies=copies, fits_l2=False, M=M)
        run.add(rec)
    if not any(r["kind"] == "ceiling" and r["shape"] == [N, K] and r["dtype"] == dtype for r in run.records):
        for c in ceil:
            run.add(dict(c, shape=[N, K], dtype=dtype))
    if progress:
        progress(f"{N}x{K} {dtype} M={M}: {time.time() - t_start:.0f} s ({copies} weight copies); "
                 f"{names[keys[0]]} within tolerance: {chk['ok']} (worst {chk['worst_ratio']:.2g}), "
                 f"bnb: {chk_b['ok']} (worst {chk_b['worst_ratio']:.2g}), "
                 f"max |ours - bnb| = {chk['max_abs_diff_vs_bnb']:.3g}; "
                 + ", ".join(f"{k} {'ok' if checks[k]['ok'] else 'OUTSIDE TOLERANCE'}" for k in keys[1:]))
    data.clear()  # the closures above keep the lists, not the tensors
    bufs.clear()
    torch.cuda.empty_cache()


def table(run) -> str:
    rows = [f"{'shape NxK':>12} {'dtype':>5} {'M':>2}  {'version':<64} {'us':>8} {'GB/s':>7} {'%copy':>6} {'x bnb':>6}"]
    for r in run.records:
        if r["kind"] == "ceiling" and r["name"] != COPY:
            continue
        f = (lambda v, fmt: "-" if v is None else format(v, fmt))
        m = "" if r["kind"] == "ceiling" else str(r.get("M", 1))
        rows.append(f"{'x'.join(map(str, r['shape'])):>12} {r['dtype'] or '':>5} {m:>2}  {r['name'][:64]:<64} "
                    f"{f(r['ms'] and r['ms'] * 1e3, '.1f'):>8} {f(r['gbps'], '.0f'):>7} "
                    f"{f(r.get('pct_copy'), '.0f'):>6} {f(r.get('speedup_vs_bnb'), '.2f'):>6}")
    return "\n".join(rows)


def _footer(fig, run):
    from . import results

    if run.meta:
        fig.text(0.01, 0.005, "measured on " + results.label(run.meta) + "\n" + run.meta.get("method", "")[:160],
                 fontsize=7, color="0.35", va="bottom")


def plot(run, ax=None):
    """Effective weight bandwidth per shape (batch 1): bitsandbytes, dequantize+matmul, the first version
    (if the run has it) and the default kernel, against the copy ceiling."""
    import matplotlib.pyplot as plt

    recs = [r for r in run.records if r["kind"] in ("kernel", "baseline") and r.get("M", 1) == 1]
    keys = []
    for r in recs:
        k = (tuple(r["shape"]), r["dtype"])
        if k not in keys:
            keys.append(k)
    ours = default_kernel(run)
    names = [BNB_DQ_MM, BNB_GEMV]
    colors = {BNB_DQ_MM: "tab:gray", BNB_GEMV: "tab:green", kernel_name("v1"): "tab:blue", ours: "tab:orange"}
    if ours != FUSED and any(r["name"] == kernel_name("v1") for r in recs):
        names.append(kernel_name("v1"))
    names.append(ours)
    labels = {ours: ours + (" = first version" if ours == FUSED else " (default)")}
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs, ys = [], []
        for i, k in enumerate(keys):
            r = next((q for q in recs if q["name"] == name and tuple(q["shape"]) == k[0] and q["dtype"] == k[1]), None)
            if r:
                xs.append(i + (j - (len(names) - 1) / 2) * width)
                ys.append(r["gbps"])
        ax.bar(xs, ys, width, label=labels.get(name, name), color=colors.get(name))
    copy = next((r for r in run.records if r["name"] == COPY), None)
    if copy:
        ax.axhline(copy["gbps"], color="tab:red", ls="--", label=f"copy ceiling {copy['gbps']:.0f} GB/s")
        ax.axhline(0.85 * copy["gbps"], color="tab:red", ls=":", lw=1, label="85% of the copy ceiling")
    ax.set_xticks(range(len(keys)), [f"{k[0][0]}x{k[0][1]}\n{k[1]}" for k in keys], fontsize=8)
    ax.set_ylabel("effective weight bandwidth, GB/s")
    ax.set_xlabel("W shape (N out x K in), activation dtype; batch 1")
    ax.set_title("NF4 GEMV at decode time: weight bytes read per second")
    ax.legend(fontsize=8, loc="lower right")
    if fig is not None:
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        _footer(fig, run)
    return ax


def plot_batch(run, ax=None):
    """Effective weight bandwidth against the batch M, per shape and dtype: our default kernel (solid) and
    bitsandbytes' matmul_4bit (dashed), from a recorded run; nothing is drawn for what was not measured."""
    import matplotlib.pyplot as plt

    ours = default_kernel(run)
    recs = [r for r in run.records if r["kind"] in ("kernel", "baseline")]
    keys = []
    for r in recs:
        k = (tuple(r["shape"]), r["dtype"])
        if k not in keys:
            keys.append(k)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.8))
    for i, k in enumerate(keys):
        color = f"C{i % 10}"
        for name, style in ((ours, "-o"), ("bnb", "--s")):
            pts = sorted((r.get("M", 1), r["gbps"]) for r in recs
                         if tuple(r["shape"]) == k[0] and r["dtype"] == k[1]
                         and (r["name"] == ours if name == ours else r["name"] in (BNB_GEMV, BNB_MATMUL)))
            if pts:
                ax.plot([m for m, _ in pts], [v for _, v in pts], style, color=color,
                        label=f"{k[0][0]}x{k[0][1]} {k[1]}: " + ("ours" if name == ours else "bitsandbytes matmul_4bit"))
    copy = next((r for r in run.records if r["name"] == COPY), None)
    if copy:
        ax.axhline(copy["gbps"], color="tab:red", ls="--", lw=1, label=f"copy ceiling {copy['gbps']:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ms = sorted({r.get("M", 1) for r in recs})
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.minorticks_off()
    ax.set_xlabel("batch M (rows of x)")
    ax.set_ylabel("effective weight bandwidth, GB/s")
    ax.set_title("NF4 GEMV with a small batch: each weight byte read once")
    ax.legend(fontsize=7, loc="upper right")
    if fig is not None:
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        _footer(fig, run)
    return ax
