"""Device buffers for one case, laid out the way the series' kernels expect.

``Buffers`` is what a notebook's ``launch(b)`` function receives:

- ``b.packed`` (uint8) and ``b.packed_u32`` (the same memory as uint32): the packed
  codes, zero-padded to a whole number of 16-byte vectors and 16-byte aligned, so
  kernels may read whole words or vectors past the last real byte.
- ``b.absmax_q`` (uint8), ``b.absmax2`` (float32), ``b.code2`` (float32[256]),
  ``b.offset`` (float32), ``b.lut`` (float32[16]).
- ``b.out`` (uint16 bits for bf16/fp16, uint32 for fp32) and ``b.out_u32`` (same
  memory as uint32): n elements plus a poisoned guard region; writing past n is a bug
  that verification reports.
- ``b.n`` weights, ``b.nbytes`` = ceil(n/2) packed bytes, ``b.blocksize``, ``b.dtype``,
  ``b.stream`` (launch on it: the timing harness captures launches on its own stream).
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import numpy as np

from . import verification as _verify


@dataclasses.dataclass
class Buffers:
    case: object
    packed: object
    packed_u32: object
    absmax_q: object
    absmax2: object
    code2: object
    lut: object
    out: object
    out_u32: object
    offset: np.float32
    n: int
    nbytes: int
    blocksize: int
    dtype: str
    stream: object = 0

    def reset_output(self) -> None:
        """Poison the output again, so that a stale result cannot pass verification."""
        from numba import cuda

        self.out.copy_to_device(_verify.poisoned_output(self.n, self.dtype))

    def result(self) -> np.ndarray:
        from numba import cuda

        cuda.synchronize()
        return self.out.copy_to_host()


def _padded(a: np.ndarray, multiple: int) -> np.ndarray:
    size = max(multiple, -(-a.size // multiple) * multiple)
    out = np.zeros(size, dtype=a.dtype)
    out[: a.size] = a
    return out


def make_buffers(case) -> Buffers:
    """Copy a case to the device (or the simulator's stand-in) with a poisoned output."""
    from numba import cuda

    packed = cuda.to_device(_padded(case.packed, 16))
    out = cuda.to_device(_verify.poisoned_output(case.n, case.dtype))
    return Buffers(
        case=case,
        packed=packed,
        packed_u32=packed.view(np.uint32),
        absmax_q=cuda.to_device(_padded(case.absmax_q, 16)),
        absmax2=cuda.to_device(case.absmax2),
        code2=cuda.to_device(case.code2),
        lut=cuda.to_device(case.lut),
        out=out,
        out_u32=out.view(np.uint32),
        offset=np.float32(case.offset),
        n=case.n,
        nbytes=case.packed.size,
        blocksize=case.blocksize,
        dtype=case.dtype,
    )


def run_and_verify(launch, case, *, name: str = "kernel", buffers: Buffers | None = None):
    """Launch once on fresh poisoned buffers and verify bit for bit (raises on mismatch)."""
    b = buffers if buffers is not None else make_buffers(case)
    b.reset_output()
    with quiet_small_grids():
        launch(b)
    return _verify.verify(b.result(), case, name=name)


@contextlib.contextmanager
def quiet_small_grids():
    """Silence numba's "Grid size N will likely result in GPU under-utilization" while
    verifying: edge cases are tiny on purpose, and the warning would bury the result."""
    with warnings.catch_warnings():
        # By message: numba-cuda raises its own NumbaPerformanceWarning class, not numba's.
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU under-utilization")
        yield


# Edge shapes cheap enough for the simulator (about 0.3 s per 4096 threads): tiny, odd, one
# partial block either side of 64, a partial absmax2 group.
SIM_EDGE_SHAPES = [(1, 1), (3, 5), (1, 63), (1, 65), (7, 33), (31, 67)]
SIM_DIST_SHAPE = (31, 67)


def verify_versions(versions, case, *, dtypes=None, shapes=None, extra_shapes=(), dists=("heavy", "codes"),
                    progress=True):
    """Verify every version bit for bit on ``case``, on edge shapes and on other distributions.

    ``versions``: a dict name -> ``launch(b)`` (or one ``launch``). ``case``: the notebook's main
    case, verified first for each dtype, with verification's full report printed; the distributions
    are checked at its shape on a GPU, at a small odd shape in the simulator. ``dtypes``: output dtypes to check (default: the case's). ``shapes``: default
    :func:`nf4lab.edge_shapes` on a GPU, :data:`SIM_EDGE_SHAPES` in the simulator; ``extra_shapes`` are added to either.

    Stops at the first mismatch with verification's explanation (a ``VerificationError``);
    otherwise prints one line per version and returns the number of cases each one passed.
    """
    from tqdm.auto import tqdm

    from .. import runtime
    from .cases import edge_shapes, make_case

    if callable(versions):
        versions = {getattr(versions, "__name__", "kernel"): versions}
    if not isinstance(versions, dict) or not versions:
        raise TypeError("versions must be a launch function or a non-empty dict of name -> launch")
    dtypes = tuple(dtypes or (case.dtype,))
    shapes = list(shapes) if shapes is not None else (edge_shapes() if runtime.ON_GPU else SIM_EDGE_SHAPES)
    shapes += [s for s in extra_shapes if s not in shapes]
    dist_shape = case.shape if runtime.ON_GPU else SIM_DIST_SHAPE
    main = [(d, case.shape, case.dist) for d in dtypes]
    todo = main + [(d, s, "randn") for d in dtypes for s in shapes] + [(d, dist_shape, x) for d in dtypes for x in dists]
    passed = dict.fromkeys(versions, 0)
    for dtype, shape, dist in tqdm(todo, desc="verifying", disable=not progress or not runtime.ON_GPU):
        c = case if (shape, dist, dtype) == (case.shape, case.dist, case.dtype) else \
            make_case(shape, dtype=dtype, dist=dist)
        for name, launch in versions.items():
            report = run_and_verify(launch, c, name=f"{name} [{dtype} {shape[0]}x{shape[1]} {dist}]")
            if (dtype, shape, dist) in main:
                print(report)
            passed[name] += 1
    what = f"the main case, {len(shapes)} edge shapes" + (f" and the {'/'.join(dists)} distributions" if dists else "")
    for name, k in passed.items():
        print(f"bit-exact: {name} ({', '.join(dtypes)}; {what}: {k} cases)")
    return passed
