"""Grade an exercise: run a student's launch function on prepared cases, bit for bit.

``check(launch, ...)`` never raises because of the student's kernel: a wrong result,
an exception or a crash in the kernel is reported as a failed check with the
teaching message, and the returned :class:`CheckResult` is falsy. Bad arguments to
``check`` itself raise ValueError as usual.
"""
from __future__ import annotations

import dataclasses

from . import runtime

DEFAULT_SHAPES = ((3, 5), (1, 65), (7, 33), (31, 67), (130, 129))


@dataclasses.dataclass
class CheckResult:
    name: str
    passed: bool
    messages: list
    pct_copy: float | None = None

    def __bool__(self):
        return self.passed

    def __str__(self):
        head = f"{'PASSED' if self.passed else 'NOT PASSED'}: {self.name}"
        return "\n".join([head] + ["  " + m for m in self.messages])

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def check(launch, *, name="exercise", dtype="bf16", blocksize=64, quant_type="nf4", shapes=DEFAULT_SHAPES,
          dist="codes", min_pct_copy=None, verbose=True) -> CheckResult:
    """Run ``launch(b)`` on every shape in ``shapes`` and verify each output bit for bit.

    On a GPU, with ``min_pct_copy`` given, also time the kernel on the default
    (16384x16384) case and require that share of the copy ceiling measured in the same
    run. In the simulator only correctness is checked, and the result says so.
    """
    from .buffers import run_and_verify
    from .cases import make_case
    from .verification import VerificationError

    msgs = []
    passed = True
    for shape in shapes:
        case = make_case(shape, dtype=dtype, dist=dist, seed=1, blocksize=blocksize, quant_type=quant_type)
        try:
            run_and_verify(launch, case, name=f"{name} on {'x'.join(map(str, shape))}")
        except VerificationError as exc:
            msgs.append(str(exc.report))
            passed = False
            break
        except NotImplementedError as exc:
            msgs.append(f"not solved yet ({exc or 'NotImplementedError'})")
            passed = False
            break
        except Exception as exc:  # the student's kernel failed: report, do not crash the notebook
            msgs.append(f"the kernel raised {type(exc).__name__}: {exc}")
            passed = False
            break
    else:
        msgs.append(f"bit-exact on {len(shapes)} shapes ({', '.join('x'.join(map(str, s)) for s in shapes)}), "
                    f"{dtype}, blocksize {blocksize}, {quant_type}")
    pct = None
    if passed and min_pct_copy is not None:
        if runtime.ON_GPU:
            from . import bench

            case = make_case(dtype=dtype, blocksize=blocksize, quant_type=quant_type)
            run = bench.Run().add(bench.ceilings(bench.bytemodel.bytes_moved(case.n, dtype, blocksize),
                                                 case.shape, dtype))
            run.add(bench.measure_kernel(name, launch, case, host=False)).finalize()
            pct = run.get(name)["pct_copy"]
            ok = pct >= min_pct_copy
            msgs.append(f"speed: {pct:.0f}% of the copy ceiling (needed {min_pct_copy}%)")
            passed = passed and ok
        else:
            msgs.append(f"speed not checked: no GPU (simulator); on a GPU this exercise asks for "
                        f"{min_pct_copy}% of the copy ceiling")
    result = CheckResult(name, passed, msgs, pct)
    if verbose:
        print(result)
    return result
