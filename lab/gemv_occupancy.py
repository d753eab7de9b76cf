"""Registers, local memory and resident blocks per SM of the tensor-core GEMV's builds (GPU only).

For each build of ``gemv_mma.kernel`` (blocks per SM asked in its launch bounds, steps in flight, statistics
as words or bytes) at M = 1 and 8: ptxas' registers and local (spill) bytes per thread, and how many
256-thread blocks with the 64 KB table the driver says fit an SM (cuOccupancyMaxActiveBlocksPerMultiprocessor),
before and after asking for the largest shared-memory carveout. Prints one line per build.

    python -m lab.gemv_occupancy
"""
from __future__ import annotations



import nf4lab  # noqa: E402,F401  (first: decides GPU or simulator)
from nf4lab.kernels import gemv  # noqa: E402
from lab import gemv_mma  # noqa: E402


def occupancy(func) -> int:
    from numba.cuda.cudadrv.driver import driver

    return int(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(func.handle, gemv.THREADS, gemv.SMEM))


def main():
    from numba import cuda
    from numba.cuda.cudadrv.driver import binding, driver

    if not nf4lab.runtime.ON_GPU:
        raise SystemExit("gemv_occupancy.py needs a GPU")
    print(cuda.get_current_device().name, "SMs", gemv.sms())
    sig = gemv.signature()
    for M in (1, 8):
        for bps, D, words in ((2, 1, True), (2, 1, False), (3, 1, True), (3, 0, True), (3, 2, True),
                              (3, 1, False), (4, 1, True)):
            kern = gemv_mma.kernel(True, M, bps, D, words=words)
            kern.compile(sig)
            ov = kern.overloads[sig]
            regs, local = ov.regs_per_thread, ov.local_mem_per_thread
            f = ov._codelibrary.get_cufunc()
            attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            driver.cuKernelSetAttribute(attr, gemv.SMEM, f.handle, f.device.id)
            before = occupancy(f)
            gemv_mma._max_carveout(kern)
            after = occupancy(f)
            print(f"M={M} B{bps} D{D} {'words' if words else 'bytes'}: {regs} registers, {local} B local, "
                  f"{before} blocks/SM ({after} with the largest carveout)")


if __name__ == "__main__":
    main()
