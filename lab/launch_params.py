"""What one ``cuLaunchKernel`` of nf4lab's dequantize kernel costs on the host, and whether its 66 parameters
are the reason (GPU only; prints, saves nothing).

numba hands a kernel each 1-D array as 7 eight-byte values (meminfo, parent, nitems, itemsize, data, shape,
stride), so nf4lab.dequantize's kernel takes 66 parameters; ``fastkernel.LeanLauncher`` passes them as an
array of 66 pointers (``kernelParams``) and tools/bench_launch.py measured that call at 8.5-11.5 us. Timed
here, each case 100 calls then a synchronize, 20 rounds taken in turn, median host time per call:

- ``kernelParams``: the launcher's own call to the driver (66 pointers);
- ``extra buffer``: the same 528 bytes handed as one buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``), checked
  to give the same output bits first;
- a numba kernel with one int64 parameter, through ``kernelParams``;
- the whole ``LeanLauncher`` call, and a tiny torch op (``add_``) for scale.

    python -m lab.launch_params
"""
from __future__ import annotations

import ctypes
import statistics
import sys

import nf4lab  # noqa: E402  (first: decides GPU or simulator)


def main() -> int:
    if not nf4lab.ON_GPU:
        print("needs a CUDA GPU")
        return 2
    import numpy as np
    import torch
    from numba import cuda

    from nf4lab.kernels import fastkernel as fk
    from nf4lab.format import reference
    from tools.bench_launch import loop_us

    n = 1 << 18
    g = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randint(0, 256, (n // 2,), dtype=torch.uint8, device="cuda", generator=g)
    absmax = torch.rand(n // 64, device="cuda", generator=g) + 0.5
    lut = torch.tensor(reference.NF4_LUT, dtype=torch.float32, device="cuda")
    out_a = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    out_b = torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
    ln = fk.lean_launcher("bf16", False, "vector")
    stream = torch.cuda.current_stream().cuda_stream
    grid = ln.grid(n)
    st = absmax.data_ptr()
    ln(stream, grid, packed.data_ptr(), st, st, st, st, lut.data_ptr(), out_a.data_ptr(), n, 6, 0)

    lib = ctypes.CDLL("libcuda.so.1")
    launch = lib.cuLaunchKernel
    u = ctypes.c_uint
    launch.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    launch.restype = ctypes.c_int

    # the same slots, with out_b as the output, handed as one buffer
    slots = ln._slots.copy()
    for i in (ln._data[7], ln._data[8]):
        slots[i] = out_b.data_ptr()
    size = ctypes.c_size_t(slots.nbytes)
    extra = (ctypes.c_void_p * 5)(1, slots.ctypes.data, 2, ctypes.addressof(size), 0)
    extra_addr = ctypes.addressof(extra)
    err = launch(ln._func, grid, 1, 1, fk.THREADS, 1, 1, 0, stream, None, extra_addr)
    torch.cuda.synchronize()
    same = err == 0 and torch.equal(out_a.view(torch.int16), out_b.view(torch.int16))
    print(f"extra-buffer launch: CUresult {err}, same bits as kernelParams: {same}")
    if not same:
        return 1

    @cuda.jit("void(int64)")
    def one_param(k):
        if k == -1:
            pass

    f1 = int(one_param.overloads[one_param.signatures[0]]._codelibrary.get_cufunc().handle)
    v1 = np.zeros(1, np.int64)
    p1 = np.array([v1.ctypes.data], np.uint64)
    tiny = torch.zeros(1, device="cuda")

    func, params = ln._func, ln._params_addr
    cases = {
        "kernelParams (66 pointers): driver call": lambda: launch(func, grid, 1, 1, fk.THREADS, 1, 1, 0, stream, params, None),
        "extra buffer (528 bytes): driver call": lambda: launch(func, grid, 1, 1, fk.THREADS, 1, 1, 0, stream, None, extra_addr),
        "numba kernel with 1 parameter: driver call": lambda: launch(f1, 1, 1, 1, 32, 1, 1, 0, stream, p1.ctypes.data, None),
        "LeanLauncher call (slots + driver call)": lambda: ln(stream, grid, packed.data_ptr(), st, st, st, st, lut.data_ptr(),
                                                             out_a.data_ptr(), n, 6, 0),
        "torch tiny add_ (for scale)": lambda: tiny.add_(1),
    }
    times = {k: [] for k in cases}
    for _ in range(20):
        for name, fn in cases.items():
            times[name].append(loop_us(fn, 100, torch)[0])
    print(nf4lab.describe())
    for name, ts in times.items():
        print(f"  {name:<46} host {statistics.median(ts):6.2f} us per call (min {min(ts):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
