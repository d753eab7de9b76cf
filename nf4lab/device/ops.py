"""Device operations that numba does not spell directly, each with a plain-Python twin.

On a GPU (or when only compiling PTX) these are libdevice calls and small
``@intrinsic`` functions that emit exactly the instruction we want. In the
simulator, where intrinsics and libdevice do not run, the same names are
Python functions with the same results, bit for bit. Kernels import from here
and read the same in both modes.

- ``fmul_rn`` / ``fadd_rn``: float32 multiply/add that the compiler never fuses
  into an FMA. bitsandbytes rounds ``code2[q] * absmax2`` before adding the
  offset; an ``fma.rn.f32`` rounds once and differs by an ulp now and then.
- ``float_bits``: the bits of a float32 as uint32, for rounding by hand.
- ``to_bf16_bits`` / ``to_f16_bits``: float32 -> 16-bit pattern, round to nearest even.
- ``pack_bf16x2`` / ``pack_f16x2``: two float32 -> one uint32 holding two 16-bit
  values, ``lo`` in the low half (the lower address), with one ``cvt.rn.*x2`` instruction.

  The bf16 conversions and ``pack_f16x2`` need sm_80 for their one instruction. Each has a
  second path that NVVM picks when it compiles for an older GPU (see :mod:`nf4lab.arch`):
  bf16 rounds in integers, ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16`` with NaN -> 0x7FFF as
  ``cvt.rn.bf16.f32`` gives it; ``pack_f16x2`` converts twice with ``cvt.rn.f16.f32`` and packs.
  Both were checked equal to the sm_80 instruction over all 2^32 float32 inputs.
- ``store_u32x4_cs``: the same store with the streaming (evict-first) cache hint.
- ``load_u32x4`` / ``store_u32x4``: one 128-bit global access (``ld.global.v4.u32``).
  ``i`` counts uint32 elements and must be a multiple of 4 on an array whose data
  starts 16-byte aligned: a misaligned vector access is a sticky error that kills
  the CUDA context. The simulator twin checks both and raises instead.
"""
from __future__ import annotations

import numpy as np

from .. import arch, runtime

__all__ = ["fmul_rn", "fadd_rn", "float_bits", "to_bf16_bits", "to_f16_bits",
           "pack_bf16x2", "pack_f16x2", "load_u32x4", "store_u32x4", "store_u32x4_cs"]
# Names whose simulator twin nf4lab.measure.ptx must swap for the device version when compiling PTX.
DEVICE_OPS = tuple(__all__)


# ---------------------------------------------------------------- plain-Python twins
def _py_fmul_rn(a, b):
    return np.float32(np.float32(a) * np.float32(b))


def _py_fadd_rn(a, b):
    return np.float32(np.float32(a) + np.float32(b))


def _py_float_bits(x):
    return np.float32(x).view(np.uint32)


BF16_NAN = 0x7FFF  # what cvt.rn.bf16.f32 gives for every NaN (torch keeps the payload instead)


def bf16_bits_py(x):
    """float32 -> bf16 bits as the GPU rounds them: to nearest even, every NaN -> 0x7FFF."""
    u = int(np.float32(x).view(np.uint32))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(BF16_NAN)
    return np.uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


def f16_bits_py(x):
    return np.float16(np.float32(x)).view(np.uint16)


def _py_pack_bf16x2(lo, hi):
    return np.uint32(int(bf16_bits_py(lo)) | (int(bf16_bits_py(hi)) << 16))


def _py_pack_f16x2(lo, hi):
    return np.uint32(int(f16_bits_py(lo)) | (int(f16_bits_py(hi)) << 16))


def _host_array(arr):
    """The numpy array behind a simulator array (kernel argument or device array)."""
    while not isinstance(arr, np.ndarray):
        inner = arr.__dict__.get("_item") if "_item" in getattr(arr, "__dict__", {}) else None
        if inner is None:
            inner = arr.__dict__.get("_ary") if "_ary" in getattr(arr, "__dict__", {}) else None
        if inner is None:
            raise TypeError(f"128-bit access needs an array, got {type(arr).__name__}")
        arr = inner
    return arr


def _check_vector_access(arr, i):
    i = int(i)
    arr = _host_array(arr)
    base = arr.__array_interface__["data"][0]
    if arr.dtype.itemsize != 4:
        raise TypeError(f"128-bit access needs a uint32 array, got {arr.dtype}")
    if i % 4 or (base + 4 * i) % 16:
        raise RuntimeError(
            f"misaligned 128-bit access at element {i} (address {base + 4 * i:#x}): on a GPU this "
            "is a sticky error that kills the CUDA context")
    if i + 4 > arr.shape[0]:
        raise IndexError(f"128-bit access at element {i} runs past the end ({arr.shape[0]} elements)")


def _py_load_u32x4(arr, i):
    _check_vector_access(arr, i)
    i = int(i)
    return (np.uint32(arr[i]), np.uint32(arr[i + 1]), np.uint32(arr[i + 2]), np.uint32(arr[i + 3]))


def _py_store_u32x4(arr, i, a, b, c, d):
    _check_vector_access(arr, i)
    i = int(i)
    arr[i], arr[i + 1], arr[i + 2], arr[i + 3] = a, b, c, d


def _py_store_u32x4_cs(arr, i, a, b, c, d):
    # Its own function, not an alias of _py_store_u32x4: compile_ptx maps twins back to device
    # ops by identity, and an alias would turn a kernel's plain stores into streaming ones.
    _py_store_u32x4(arr, i, a, b, c, d)


# ---------------------------------------------------------------- device versions
# Built only where numba.cuda is real (a GPU, or compile mode): the simulator cannot run intrinsics.
if not runtime.SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils, libdevice
    from numba.cuda.extending import intrinsic

    v4 = ir.VectorType(ir.IntType(32), 4)
    i16, i32, f32 = ir.IntType(16), ir.IntType(32), ir.FloatType()

    def vec_ptr(context, builder, aryty, ary_val, idx):
        ary = context.make_array(aryty)(context, builder, ary_val)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)
        # Address space 1 (global) so that NVVM emits ld.global/st.global, not generic ld/st.
        gptr = builder.addrspacecast(ptr, ir.PointerType(ptr.type.pointee, 1))
        return builder.bitcast(gptr, ir.PointerType(v4, 1))

    @intrinsic
    def load_u32x4(typingctx, arr, i):
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.ndim == 1):
            return None
        sig = types.UniTuple(types.uint32, 4)(arr, i)

        def codegen(context, builder, sig, args):
            vec = builder.load(vec_ptr(context, builder, sig.args[0], args[0], args[1]), align=16)
            vals = [builder.extract_element(vec, ir.Constant(i32, k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def store_u32x4(typingctx, arr, i, a, b, c, d):
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.ndim == 1):
            return None
        sig = types.void(arr, i, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            vec = ir.Constant(v4, None)
            for k, v in enumerate(args[2:]):
                vec = builder.insert_element(vec, v, ir.Constant(i32, k))
            builder.store(vec, vec_ptr(context, builder, sig.args[0], args[0], args[1]), align=16)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def store_u32x4_cs(typingctx, arr, i, a, b, c, d):
        # st.global.cs: streaming (evict-first) store; the output is never read back by the kernel.
        if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.ndim == 1):
            return None
        sig = types.void(arr, i, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            ptr = vec_ptr(context, builder, sig.args[0], args[0], args[1])
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(64), i32, i32, i32, i32]),
                               "st.global.cs.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [addr] + list(args[2:]))
            return context.get_dummy_value()

        return sig, codegen

    def arch_at_least(builder, cc_number):
        """An i1 that is true where the kernel compiles for __CUDA_ARCH >= cc_number (e.g. 800).

        NVVM folds __nvvm_reflect to a constant for the target architecture and drops the other
        branch, so each GPU's code holds one path. NF4LAB_ARCH caps it: then the answer is a constant.
        """
        runtime.check_arch()
        cap = arch.level()
        if cap and cap < cc_number:
            return ir.Constant(ir.IntType(1), 0)
        mod = builder.module
        i8p = ir.IntType(8).as_pointer()
        reflect = cgutils.get_or_insert_function(mod, ir.FunctionType(i32, [i8p]), "__nvvm_reflect")
        text = bytearray(b"__CUDA_ARCH\0")
        gv = mod.globals.get("nf4lab.cuda_arch")
        if gv is None:
            gv = ir.GlobalVariable(mod, ir.ArrayType(ir.IntType(8), len(text)), "nf4lab.cuda_arch", addrspace=4)
            gv.initializer = ir.Constant(gv.type.pointee, text)
            gv.global_constant = True
            gv.linkage = "internal"
        ptr = builder.addrspacecast(builder.bitcast(gv, ir.IntType(8).as_pointer(4)), i8p)
        return builder.icmp_signed(">=", builder.call(reflect, [ptr]), ir.Constant(i32, cc_number))

    def by_arch(builder, cc_number, new_path, old_path):
        """new_path() where the target is at least cc_number, else old_path(); one value of either."""
        cond = arch_at_least(builder, cc_number)
        if isinstance(cond, ir.Constant):
            return new_path() if cond.constant else old_path()
        with builder.if_else(cond) as (then, otherwise):
            with then:
                a = new_path()
                a_bb = builder.basic_block
            with otherwise:
                b = old_path()
                b_bb = builder.basic_block
        phi = builder.phi(a.type)
        phi.add_incoming(a, a_bb)
        phi.add_incoming(b, b_bb)
        return phi

    def cvt_f16(builder, x):
        return builder.call(ir.InlineAsm(ir.FunctionType(i16, [f32]), "cvt.rn.f16.f32 $0, $1;", "=h,f"), [x])

    def bf16_by_integers(builder, x):
        """Round to nearest even in integer arithmetic; NaN -> 0x7FFF, as cvt.rn.bf16.f32 gives it."""
        u = builder.bitcast(x, i32)
        lsb = builder.and_(builder.lshr(u, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        r = builder.lshr(builder.add(builder.add(u, ir.Constant(i32, 0x7FFF)), lsb), ir.Constant(i32, 16))
        isnan = builder.fcmp_unordered("uno", x, x)
        return builder.trunc(builder.select(isnan, ir.Constant(i32, 0x7FFF), r), i16)

    def pack16(builder, lo, hi):
        """Two 16-bit patterns -> one uint32, lo in the low half (a mov.b32 {lo, hi} in PTX)."""
        return builder.or_(builder.zext(lo, i32), builder.shl(builder.zext(hi, i32), ir.Constant(i32, 16)))

    def cvt_pair(ptx, fallback):
        @intrinsic
        def pack(typingctx, lo, hi):
            sig = types.uint32(types.float32, types.float32)

            def codegen(context, builder, sig, args):
                lo_v = context.cast(builder, args[0], sig.args[0], types.float32)
                hi_v = context.cast(builder, args[1], sig.args[1], types.float32)
                asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), ptx, "=r,f,f")
                # cvt.rn.*x2 d, a, b puts a in the upper half: pass hi first.
                return by_arch(builder, 800, lambda: builder.call(asm, [hi_v, lo_v]),
                               lambda: pack16(builder, fallback(builder, lo_v), fallback(builder, hi_v)))

            return sig, codegen

        return pack

    def cvt_one(ptx, fallback=None):
        @intrinsic
        def conv(typingctx, x):
            sig = types.uint16(types.float32)

            def codegen(context, builder, sig, args):
                x_v = context.cast(builder, args[0], sig.args[0], types.float32)
                asm = ir.InlineAsm(ir.FunctionType(i16, [f32]), ptx, "=h,f")
                if fallback is None:
                    return builder.call(asm, [x_v])
                return by_arch(builder, 800, lambda: builder.call(asm, [x_v]), lambda: fallback(builder, x_v))

            return sig, codegen

        return conv

    @intrinsic
    def float_bits(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, sig, args):
            x_v = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.bitcast(x_v, i32)

        return sig, codegen

    fmul_rn, fadd_rn = libdevice.fmul_rn, libdevice.fadd_rn
    to_bf16_bits = cvt_one("cvt.rn.bf16.f32 $0, $1;", bf16_by_integers)
    to_f16_bits = cvt_one("cvt.rn.f16.f32 $0, $1;")     # sm_75 has this one
    pack_bf16x2 = cvt_pair("cvt.rn.bf16x2.f32 $0, $1, $2;", bf16_by_integers)
    pack_f16x2 = cvt_pair("cvt.rn.f16x2.f32 $0, $1, $2;", cvt_f16)
    # by_arch is for other modules' intrinsics (warp_ops' mma); it is not a device op itself.
else:
    fmul_rn, fadd_rn, float_bits = _py_fmul_rn, _py_fadd_rn, _py_float_bits
    to_bf16_bits, to_f16_bits = bf16_bits_py, f16_bits_py
    pack_bf16x2, pack_f16x2 = _py_pack_bf16x2, _py_pack_f16x2
    load_u32x4, store_u32x4 = _py_load_u32x4, _py_store_u32x4
    store_u32x4_cs = _py_store_u32x4_cs
