"""The tensor-core GEMV's tuning knobs: the shipped kernel (nf4lab.kernels.gemv) with other launch choices.

``launch(g, blocks_per_sm, D, carveout)`` runs ``gemv.make_kernel`` with ``D`` steps of loads in flight
ahead of the one computed and launch bounds for ``blocks_per_sm`` 256-thread blocks per SM (the grid follows),
optionally asking the driver for the largest shared-memory carveout. The defaults (2 blocks, D = 1, the
driver's carveout) are what ships; lab/bench_gemv.py times the others as "TC B<blocks> D<D>" and
"TC B2 D1 carve". What each measured is in lab/README.md. Two variants that lost are gone from the code
(git has them): x loaded for both pieces at a step's start, and a table address with an add per lookup.
"""
from __future__ import annotations

import nf4lab  # noqa: F401  (first: decides GPU or simulator)
from nf4lab.kernels import gemv


def _max_carveout(kern):
    """Ask for the largest shared-memory carveout: the driver's default left room for 2 blocks of 64 KB."""
    if getattr(kern, "_nf4lab_carveout", False):
        return
    from numba.cuda.cudadrv.driver import binding, driver

    f = next(iter(kern.overloads.values()))._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    driver.cuKernelSetAttribute(attr, 100, f.handle, f.device.id)
    kern._nf4lab_carveout = True


def kernel(is_bf16, M, blocks_per_sm=gemv.BLOCKS_PER_SM, D=1, xslot=True, nested=True, words=True, full=False, G=gemv.W):
    return gemv.make_kernel(is_bf16, M, gemv.probe_base(), nested, D, max(blocks_per_sm, 1), xslot, words, full, G)


def launch(g, blocks_per_sm=gemv.BLOCKS_PER_SM, D=1, carveout=False, xslot=True, words=True, G=gemv.W):
    """``words``: the statistics as one word per lane where gemv.words_apply (False: byte by byte everywhere); ``G``:
    warps a tile (W // G tiles a block at once, each group with its own barrier; M = 1 only)."""
    gemv.validate(g)
    if G != gemv.W and (g.M != 1 or gemv.W % G):
        raise ValueError(f"G={G}: groups of warps take M = 1 and a divisor of {gemv.W}")
    args = (g.packed_u32, g.absmax_q, g.absmax2, g.code2, g.lut, g.offset, g.x_u32, g.y, g.N, g.K, g.bs_shift)
    nbytes = gemv.SMEM
    words = words and gemv.words_apply(g.nested, g.bs_shift, g.K, gemv.address(g.absmax_q))
    full = gemv.full_apply(words, g.M, g.K, G)   # as gemv.launch decides, for G warps a tile
    kern = gemv.prepare(kernel(g.dtype == "bf16", g.M, blocks_per_sm, D, xslot, g.nested, words, full, G), args, nbytes)
    if carveout:
        _max_carveout(kern)
    grid = g.grid or min(-(-g.N // 16), blocks_per_sm * gemv.sms())
    kern[grid, gemv.THREADS, g.stream, nbytes](*args)
