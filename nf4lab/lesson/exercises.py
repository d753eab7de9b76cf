"""Grade an exercise: run a student's launch function on prepared cases, bit for bit.

    result = nf4lab.check(launch, name="ex 3.2: coalesced stores", min_pct_copy=80)

``check`` runs ``launch(b)`` (``b`` a :class:`nf4lab.harness.buffers.Buffers`) on every
shape of ``shapes`` (by default the edge sizes of :func:`default_shapes`: one
weight, odd counts, a partial block, exactly one block, and a tensor that spans
two absmax2 groups and ends in a partial block), smallest first, and compares
the output with bitsandbytes bit for bit. It stops at the first wrong shape and
prints a one-line verdict followed by the teaching message of
:mod:`nf4lab.harness.verification` (what differs, and a hint where the pattern points at
a known mistake).

``check`` never raises because of the student's kernel: a wrong result, an
exception raised while the kernel compiles (numba typing errors) or runs, or a
CUDA error is reported in the result, which is falsy when the exercise is not
solved. Bad arguments to ``check`` itself raise ValueError.

Speed: with ``min_pct_copy`` given, on a GPU the kernel is also timed on the
full-size case (16384x16384) with :mod:`nf4lab.measure.bench`, together with the copy
ceiling measured in the same run, and must reach that share of it. In the
simulator only correctness is checked, and the result says so.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
import time
import traceback

from numba import cuda, uint32

from .. import runtime

# Kept for code that imported it: the shapes check used before default_shapes().
DEFAULT_SHAPES = ((3, 5), (1, 65), (7, 33), (31, 67), (130, 129))

# Edge sizes every check runs (simulator and GPU), smallest first. (130, 129) is
# 16,770 weights: two absmax2 groups at blocksize 64 (16,384 weights each), ending
# in a partial block of 2 weights; about 3 s in the simulator for a per-byte kernel.
SIM_SHAPES = ((1, 1), (3, 5), (1, 63), (1, 64), (1, 65), (7, 33), (130, 129))

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def default_shapes(blocksize: int = 64, on_gpu: bool | None = None) -> tuple:
    """The shapes ``check`` uses unless told otherwise.

    Simulator: :data:`SIM_SHAPES` (kept small: a one-line kernel took 0.7-1.4 s per 4096 threads there,
    2 cores, 2026-11-30, and ours do more per thread). GPU: the same plus a tensor spanning three absmax2 groups at this
    blocksize with an odd tail, and a rectangular one of a few million weights.
    """
    on_gpu = runtime.ON_GPU if on_gpu is None else on_gpu
    if not on_gpu:
        return SIM_SHAPES
    group = 256 * blocksize  # weights per absmax2 group
    return SIM_SHAPES + ((1, 2 * group + 3), (1023, 4097))


@dataclasses.dataclass
class CheckResult:
    """What :func:`check` found. Falsy unless the exercise is solved."""

    name: str
    passed: bool
    messages: list
    pct_copy: float | None = None
    verdict: str = ""
    failed_shape: tuple | None = None
    report: object = None          # nf4lab.harness.verification.Report of the failing shape, if any
    error: str | None = None       # the kernel's exception, summarised
    simulator: bool = False
    seconds: float = 0.0
    _printed: bool = dataclasses.field(default=False, repr=False, compare=False)

    def __bool__(self):
        return self.passed

    def __str__(self):
        return "\n".join([self.verdict or f"{'PASSED' if self.passed else 'NOT PASSED'}: {self.name}"]
                         + ["  " + line for m in self.messages for line in str(m).splitlines()])

    def _repr_pretty_(self, p, cycle):
        # check() printed the whole message already: echo only the verdict.
        p.text(self.verdict if self._printed else str(self))


def _validate(launch, name, dtype, blocksize, quant_type, shapes, dist, min_pct_copy):
    from ..harness.cases import _validate as validate_case

    if not callable(launch):
        raise ValueError(f"launch must be a function launch(b) that launches your kernel, got {launch!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if isinstance(shapes, (str, bytes)) or not hasattr(shapes, "__iter__"):
        raise ValueError(f"shapes must be a list of shapes like [(3, 5), (130, 129)], got {shapes!r}")
    # Each shape with the case parameters goes through the same checks as make_case, so that an
    # exercise cannot ask for a case that make_case would refuse.
    out = [validate_case(s, dtype, dist, 0, blocksize, quant_type)[0] for s in shapes]
    if not out:
        raise ValueError("shapes is empty: give at least one shape")
    if min_pct_copy is not None:
        if isinstance(min_pct_copy, bool) or not isinstance(min_pct_copy, (int, float)) \
                or not math.isfinite(min_pct_copy) or not 0 < min_pct_copy <= 150:
            raise ValueError(f"min_pct_copy is a percentage of the copy ceiling in (0, 150], got {min_pct_copy!r}")
    return sorted(out, key=math.prod)


# ----------------------------------------------------------------- exceptions
def _student_frame(tb):
    """The innermost traceback frame that is not numba, nf4lab or the standard library."""
    skip = (os.sep + "numba", os.sep + "nf4lab" + os.sep, "threading.py", os.sep + "site-packages" + os.sep,
            os.sep + "llvmlite")
    found = None
    for fs in traceback.extract_tb(tb):
        if not any(s in fs.filename for s in skip):
            found = fs
    return found


def _hints_for(text: str) -> list[str]:
    hints = []
    low = text.lower()
    if "float64" in low:
        hints.append("a float64 appeared: Python float literals are float64 in numba; wrap constants and "
                     "LUT entries in float32(...)")
    if "int64" in low and "uint64" in low:
        hints.append("signed and unsigned integers are mixed (numba then promotes both to float64): make "
                     "indices uint64 on both sides, e.g. uint64(cuda.grid(1))")
    if "misaligned" in low:
        hints.append("a 128-bit access needs an index that is a multiple of 4 uint32 elements (16 bytes); on "
                     "a GPU this error kills the CUDA context: restart the Jupyter kernel after fixing it")
    if "illegal address" in low or "illegal_address" in low:
        hints.append("the kernel read or wrote outside an array: check the bounds test and the index "
                     "arithmetic; the CUDA context is dead, restart the Jupyter kernel")
    if "out of bounds" in low and "tid=" in low:
        hints.append("a thread indexed past the end of an array: is there a bounds check (if i < n) before "
                     "the access, and is the last partial vector handled with narrower accesses?")
    if "unsupported array index type" in low or ("getitem" in low and "float" in low):
        hints.append("array indices must be integers: use >> and & (or //) on integers, not /")
    return hints


def describe_exception(exc: BaseException) -> list[str]:
    """A few lines that say what went wrong in the student's code (numba errors trimmed)."""
    text = _ANSI.sub("", str(exc))
    kind = type(exc).__name__
    lines = [l.rstrip() for l in text.splitlines()]
    if type(exc).__module__.startswith("numba"):
        # Typing/lowering errors: keep the first statement of the problem and the source location.
        body = [l for l in lines if l.strip() and not l.startswith("Failed in ")
                and not l.strip().startswith(("There are", "- Of which", "- Resolution failure",
                                              "During: resolving", "This error may have been",
                                              "Overload", "Operator Overload", "With argument",
                                              "No match", "* ("))]
        head = body[:3]
        loc = []
        for i, l in enumerate(lines):
            if l.startswith("File ") and ", line " in l:
                loc = [l.strip()] + [x for x in lines[i + 1:i + 5] if x.strip() and "<source elided>" not in x]
        out = [f"{kind} while numba compiled the kernel:"] + ["  " + l.strip() for l in head]
        if loc:
            out += ["  at " + loc[0]] + ["    " + l for l in loc[1:]]
        else:
            out.append("  (numba names no line: look in the kernel for the operation and the types "
                       "after '>>>')")
        fs = _student_frame(exc.__traceback__)
        if fs is not None:
            out.append(f"  compiled for the launch at {os.path.basename(fs.filename)}, line {fs.lineno}, "
                       f"in {fs.name}: {(fs.line or '').strip()}")
        # Hints from the statement of the problem only: numba's list of candidate
        # signatures mentions float64 and int64 whatever the kernel did.
        text = "\n".join(head + loc)
    else:
        msg = [l for l in lines if l.strip()][:3] or [""]
        out = [f"{kind}: {msg[0]}"] + ["  " + l for l in msg[1:]]
        fs = _student_frame(exc.__traceback__)
        if fs is not None:
            out.append(f"  at {os.path.basename(fs.filename)}, line {fs.lineno}, in {fs.name}: "
                       f"{(fs.line or '').strip()}")
    return out + [f"hint: {h}" for h in _hints_for(text + " " + kind)]


class _ThreadErrors:
    """Collect exceptions that die inside simulator threads (numba's simulator sometimes
    cannot re-raise them, e.g. numpy's ufunc errors, and only prints them)."""

    def __enter__(self):
        self.errors = []
        self._old = threading.excepthook

        def hook(args):
            e = args.exc_value
            # The simulator failed while re-wrapping the kernel's exception: report the original.
            if e is not None and e.__context__ is not None and "simulator" in "".join(
                    traceback.format_tb(e.__traceback__)):
                e = e.__context__
            self.errors.append(e)

        threading.excepthook = hook
        return self

    def __exit__(self, *exc):
        threading.excepthook = self._old
        return False


def _is_sticky(exc) -> bool:
    text = str(exc).upper()
    return any(k in text for k in ("CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_ILLEGAL_ADDRESS",
                                   "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                                   "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_UNKNOWN"))


def _run_one(launch, case, label):
    """Launch on fresh poisoned buffers. Returns (report, error_lines, sticky)."""
    from numba import cuda

    from ..harness.buffers import make_buffers, quiet_small_grids
    from ..harness.verification import verify

    b = make_buffers(case)
    b.reset_output()
    with _ThreadErrors() as te, quiet_small_grids():
        try:
            launch(b)
            cuda.synchronize()
        except NotImplementedError as exc:
            return None, [f"not solved yet: {exc or 'NotImplementedError'} (write the missing code, then run "
                          "this cell again)"], False
        except Exception as exc:  # the student's kernel failed: report it, never crash the notebook
            return None, describe_exception(exc), _is_sticky(exc)
    if te.errors:
        return None, describe_exception(te.errors[0]), False
    try:
        out = b.result()
    except Exception as exc:  # an asynchronous CUDA error surfaces at the copy back
        return None, describe_exception(exc), _is_sticky(exc)
    return verify(out, case, name=label, raise_on_error=False), None, False


# ----------------------------------------------------------------- the checker
def check(launch, *, name="exercise", dtype="bf16", blocksize=64, quant_type="nf4", shapes=None,
          dist="codes", min_pct_copy=None, verbose=True, seed=1) -> CheckResult:
    """Grade ``launch(b)``: bit-exact on every shape, and on a GPU fast enough.

    Parameters
    ----------
    launch: ``launch(b)`` launching the student's kernel on ``b.stream`` (see nf4lab.harness.buffers).
    name: what the verdict calls the exercise.
    dtype, blocksize, quant_type: the case parameters (output bf16/fp16/fp32, 64..4096, nf4/fp4).
    shapes: shapes to verify, smallest first; default :func:`default_shapes` (edge sizes).
    dist: weight distribution of the cases (default "codes": every code in every block).
    min_pct_copy: on a GPU, the speed the exercise asks for, in % of the device-copy
        bandwidth measured in the same run, on the 16384x16384 case. Ignored (and said so)
        in the simulator.
    verbose: print the verdict and messages (default True).
    seed: seed of the cases.

    Returns a :class:`CheckResult`, falsy unless the exercise passed. Raises ValueError
    for bad arguments, never for a wrong or crashing kernel.
    """
    from ..harness.cases import make_case

    if shapes is None:
        shapes = default_shapes(blocksize)
    shapes = _validate(launch, name, dtype, blocksize, quant_type, shapes, dist, min_pct_copy)
    t0 = time.perf_counter()
    sim = not runtime.ON_GPU
    # Cases first: a failure here (bitsandbytes missing, ...) is not the student's.
    cases = [make_case(s, dtype=dtype, dist=dist, seed=seed, blocksize=blocksize, quant_type=quant_type)
             for s in shapes]
    params = f"{dtype}, blocksize {blocksize}, {quant_type}"
    msgs, passed = [], True
    res = CheckResult(name, False, msgs, simulator=sim)
    for case in cases:
        dims = "x".join(map(str, case.shape))
        report, err, sticky = _run_one(launch, case, f"{name} on {dims}")
        if err is not None:
            passed = False
            res.failed_shape, res.error = case.shape, "\n".join(err)
            res.verdict = f"NOT PASSED: {name}: the kernel failed on {dims} ({case.n:,} weights, {params})"
            msgs.extend(err)
            if sticky:
                msgs.append("the CUDA context is now unusable: fix the kernel, then restart the Jupyter "
                            "kernel (Kernel > Restart) and run the notebook's cells again")
            break
        if not report.ok:
            passed = False
            res.failed_shape, res.report = case.shape, report
            what = (f"{report.n_diff:,} of {report.n:,} elements differ" if report.n_diff
                    else f"{report.guard_written} element(s) written past the end")
            res.verdict = f"NOT PASSED: {name}: not bit-exact on {dims} ({what}; {params})"
            msgs.append(str(report))
            if case is not cases[-1]:
                msgs.append(f"(stopped at the first wrong shape; {len(cases) - cases.index(case) - 1} larger "
                            "shape(s) not run)")
            break
    if passed:
        shown = ", ".join("x".join(map(str, c.shape)) for c in cases)
        msgs.append(f"bit-exact with bitsandbytes on {len(cases)} shapes ({shown}), {params}")
    pct = None
    speed = ""
    if passed and min_pct_copy is not None:
        if sim:
            speed = f"; correctness only (simulator): the speed threshold of {min_pct_copy:g}% of copy is " \
                    "checked on a GPU"
            msgs.append(f"correctness only (simulator): the speed threshold of {min_pct_copy:g}% of copy "
                        "is checked on a GPU")
        else:
            try:
                pct, line = _speed(launch, name, dtype, blocksize, quant_type)
            except Exception as exc:
                passed = False
                err = describe_exception(exc)
                res.error = "\n".join(err)
                msgs.append("the speed measurement on the 16384x16384 case failed:")
                msgs.extend(err)
                speed = "; speed measurement failed"
            else:
                ok = pct >= min_pct_copy
                msgs.append(f"{line}: {pct:.0f}% of the copy ceiling, needed {min_pct_copy:g}%"
                            + ("" if ok else ": correct but not fast enough yet"))
                speed = f"; {pct:.0f}% of copy (needed {min_pct_copy:g}%)"
                if not ok:
                    passed = False
                    res.verdict = f"NOT PASSED: {name}: bit-exact but {pct:.0f}% of copy, needs {min_pct_copy:g}%"
    elif passed and sim:
        speed = "; simulator: correctness only"
    if passed:
        res.verdict = f"PASSED: {name}: bit-exact on {len(cases)} shapes{speed}"
    res.passed = passed
    res.pct_copy = pct
    res.seconds = time.perf_counter() - t0
    if sim and res.seconds > 20:
        msgs.append(f"(the simulator took {res.seconds:.0f} s: a launch with many more threads than weights "
                    "or bytes is slow there)")
    if verbose:
        print(res)
        res._printed = True
    return res


def _speed(launch, name, dtype, blocksize, quant_type):
    """% of the copy ceiling on the default (16384x16384) case, copy measured in the same run."""
    from ..measure import bench
    from ..format import bytemodel
    from ..harness.cases import make_case

    case = make_case(dtype=dtype, blocksize=blocksize, quant_type=quant_type)
    run = bench.Run().add(bench.ceilings(bytemodel.bytes_moved(case.n, dtype, blocksize), case.shape, dtype))
    rec = bench.measure_kernel(name, launch, case, host=False)
    run.add(rec).finalize()
    r = run.get(name)
    copy = run.get(bench.COPY)
    line = (f"speed on {'x'.join(map(str, case.shape))}: {r['ms'] * 1e3:.0f} us, {r['gbps']:.0f} GB/s "
            f"(copy {copy['gbps']:.0f} GB/s)")
    return r["pct_copy"], line


def _student_ptx(res, kernel, sig, name):
    """The PTX of a student's bit-exact ``kernel`` for ``sig``, for a grader to read its design; None, with ``res``
    marked not passed and why, where it does not compile (the grader never raises because of the kernel)."""
    from ..measure import ptx

    try:
        return ptx.compile_ptx(kernel, sig)
    except Exception as exc:
        res.passed = False
        res.error = "\n".join(describe_exception(exc))
        res.verdict = f"NOT PASSED: {name}: bit-exact, but its PTX could not be compiled for {sig}"
        res.messages.extend(describe_exception(exc))
        return None


def _check_launching(kernel, launch, seen=None, **kw):
    """:func:`check` of ``launch``, watching whether it launches ``kernel`` (``kernel[grid, block, ...]``): a grader
    reads the PTX of the kernel it is given, so that must be the kernel the launch function runs. Returns the result
    and the launch configurations of ``kernel`` seen (``(grid, block, ...)`` as written in the brackets), appended
    to ``seen`` where one is given (so that a wrapped ``launch`` can tell which launches each shape made)."""
    seen = [] if seen is None else seen
    cls = type(kernel)
    own = "__getitem__" in vars(cls)
    configure = getattr(cls, "__getitem__", None)
    if configure is None:               # not a kernel: the PTX reading says so
        return check(launch, **kw), []

    def spy(self, config):
        if self is kernel:
            seen.append(config)
        return configure(self, config)

    try:
        cls.__getitem__ = spy
    except TypeError:                   # a built-in type (str, list, ndarray ...): not a kernel either
        return check(launch, **kw), []
    try:
        res = check(launch, **kw)
    finally:
        if own:
            cls.__getitem__ = configure
        else:
            del cls.__getitem__
    return res, seen


def _refuse_unlaunched(res, kernel, name, launched, why="") -> bool:
    """Mark ``res`` not passed where ``launched`` (from :func:`_check_launching`) holds no launch of ``kernel``: its
    bits came from another kernel than the one the grader reads. True where it did; ``why`` ends the message."""
    if launched is None or launched:
        return False
    res.passed = False
    res.verdict = f"NOT PASSED: {name}: bit-exact, but not by the kernel the check reads"
    res.messages.append(f"the launch function never launched {getattr(kernel, '__name__', kernel)!s}{why}")
    return True


def _read_design(res, kernel, sig, name, requirements, verdict, ok, launched=None):
    """Where ``res`` is bit-exact, read the design from ``kernel``'s PTX for ``sig``: ``requirements(text)`` gives
    (what is missing, whether it holds) pairs. Any that fails marks ``res`` not passed, its verdict (if it was
    PASSED) ``verdict`` and its message what is missing; else ``ok`` (a string, or a function of the PTX text).
    ``launched`` (from :func:`_check_launching`): none marks ``res`` not passed, since the bits came from another
    kernel."""
    if _refuse_unlaunched(res, kernel, name, launched, ", the kernel passed to the check: the check reads that "
                          "kernel's PTX, so launch that one"):
        return
    text = _student_ptx(res, kernel, sig, name)
    if text is None:
        return
    missing = [what for what, holds in requirements(text) if not holds]
    if missing:
        res.passed = False
        if res.verdict.startswith("PASSED"):
            res.verdict = f"NOT PASSED: {name}: bit-exact, but {verdict}"
        res.messages.append("the kernel's PTX has " + "; ".join(missing))
    else:
        res.messages.append(ok(text) if callable(ok) else ok)


def _watching_stores(launch, on_store):
    """``launch``, with every 16-byte store (``ops.store_u32x4``) its kernel makes in the simulator passed to
    ``on_store(b, i)`` first (``i``: the out_u32 index): the simulator's kernel looks the function up at each call,
    so a wrapper sees where each store lands, which neither the bits nor the PTX show. On a GPU the store is an
    instruction: ``launch`` runs as it is."""
    from ..device import ops

    def watched(b):
        if runtime.ON_GPU:
            return launch(b)
        store = ops.store_u32x4

        def spy(arr, i, *words):
            on_store(b, i)
            store(arr, i, *words)

        ops.store_u32x4 = spy
        try:
            launch(b)
        finally:
            ops.store_u32x4 = store
    return watched


def _threads(dim) -> int:
    """Threads in a launch dimension written as an int or a tuple."""
    return math.prod(dim) if isinstance(dim, tuple) else int(dim)


def check_block_size(launch, kernel, threads, *, name="exercise: block size", shapes=None, verbose=True) -> CheckResult:
    """Grade a launch exercise (notebook 02's exercise 2): ``launch`` bit-exact on ``shapes``; every launch of
    ``kernel`` it makes with ``threads`` threads a block (the bits alone cannot tell a launch at another block size:
    ``launch_128 = launch`` would pass them); and on each shape a grid sized as 02 sizes one: the resident threads
    (:func:`nf4lab.lesson.sm_count` x :func:`nf4lab.lesson.blocks_per_sm` x ``threads``), fewer only where the
    bytes need fewer, and no more than the bytes need in blocks of ``threads`` or of twice it (02's ``launch``
    runs 256). A grid-stride loop is right with any grid, so only this tells a grid sized for another block size
    or none. In the simulator, whose resident blocks per SM do not depend on the block size, up to twice those
    resident threads also pass (02's hint, twice the resident blocks of 256, gives that there). Only whether the
    threads hold is printed, never the right grid. On a GPU, where no shape has more bytes than the resident
    threads, one that does is added, so that the cap is graded. Falsy unless all hold; never raises because of the
    student's launch."""
    from .. import lesson

    shapes = _validate(launch, name, "bf16", 64, "nf4", default_shapes() if shapes is None else shapes, "codes", None)
    resident = lesson.sm_count() * lesson.blocks_per_sm(threads) * threads
    most = resident * (1 if runtime.ON_GPU else 2)
    if runtime.ON_GPU and all((math.prod(s) + 1) // 2 <= resident for s in shapes):
        shapes = list(shapes) + [(-(-4 * resident // 4097), 4097)]   # twice the resident threads in bytes
    seen, totals = [], []   # the kernel's launch configurations; per shape (dims, bytes, threads launched in all)

    def tagged(b):
        first = len(seen)
        try:
            return launch(b)
        finally:
            totals.append(("x".join(map(str, b.case.shape)), int(b.nbytes),
                           sum(_threads(c[0]) * _threads(c[1]) for c in seen[first:])))

    def sized(nbytes, total):
        """Whether ``total`` threads are a grid sized as 02 sizes one for ``nbytes`` bytes."""
        least = min(resident, -(-nbytes // threads) * threads)
        return least <= total <= max(least, min(most, -(-nbytes // (2 * threads)) * 2 * threads))

    res, launched = _check_launching(kernel, tagged, seen, name=name, shapes=shapes, verbose=False)
    if res:
        sizes = sorted({_threads(c[1]) for c in launched if len(c) > 1})
        if _refuse_unlaunched(res, kernel, name, launched):
            pass
        elif sizes != [threads]:
            res.passed = False
            res.verdict = f"NOT PASSED: {name}: bit-exact, but not at {threads} threads a block"
            res.messages.append(f"launched with {', '.join(map(str, sizes))} threads a block")
        else:
            wrong = [dims for dims, nbytes, total in totals if not sized(nbytes, total)]
            if wrong:
                res.passed = False
                res.verdict = (f"NOT PASSED: {name}: bit-exact at {threads} threads a block, but not the threads "
                               f"in all that `launch`'s sizing gives at {threads} threads a block")
                res.messages.append(f"launch: {threads} threads a block; the grid: not the threads in all that "
                                    f"`launch`'s sizing gives at that block size (SMs x resident blocks of {threads} "
                                    f"threads, no more blocks than the bytes need) on {', '.join(wrong)}")
            else:
                res.messages.append(f"launch: {threads} threads a block; the grid: the threads in all that "
                                    f"`launch`'s sizing gives at {threads} threads a block, on every shape")
    if verbose:
        print(res)
        res._printed = True
    return res


def check_while_loop(launch, kernel, sig, *, name="exercise 1: while loop", shapes=None,
                     verbose=True) -> CheckResult:
    """Grade notebook 02's exercise 1: ``launch`` bit-exact on ``shapes`` (with the grid it launches); ``kernel`` (02's arguments: packed, lut,
    absmax_q, absmax2, code2, offset, out, n, nbytes) also bit-exact on a grid of 2 blocks of 64 threads, where
    every thread loops on the larger shapes; and its PTX (compiled for ``sig``) with no division (``div``/``rem``,
    the goal: no trip count) and a stride of the grid's threads (``cuda.gridsize(1)``: a smaller stride writes
    the same bits with repeated work, which no check of the bits sees). One verdict line for all of it; falsy
    unless all hold; never raises because of the student's kernel."""
    from ..measure import ptx

    shapes = tuple(default_shapes() if shapes is None else shapes)   # two checks read them
    res, launched = _check_launching(kernel, launch, name=name, shapes=shapes, verbose=False)
    if res and not _refuse_unlaunched(res, kernel, name, launched):
        small = check(lambda b: kernel[2, 64, b.stream](b.packed, b.lut, b.absmax_q, b.absmax2, b.code2, b.offset,
                                                        b.out, b.n, b.nbytes),
                      name=f"{name}, 2 blocks of 64 threads", shapes=shapes, verbose=False)
        if not small:
            res.passed = False
            res.verdict = (f"NOT PASSED: {name}: bit-exact as your launch function launches it, not on 2 blocks of 64 "
                           "threads")
            res.messages.extend(["on a grid of 2 blocks of 64 threads (every thread loops), with 02's arguments "
                                 "(packed, lut, absmax_q, absmax2, code2, offset, out, n, nbytes):"]
                                + str(small).splitlines())
        else:
            res.messages.append("bit-exact on a grid of 2 blocks of 64 threads too (every thread loops)")
            text = _student_ptx(res, kernel, sig, name)
            if text is not None:
                n_div = ptx.count(text, r"^(div|rem)\.")
                wrong, hints = [], []
                if n_div:
                    wrong.append(f"{n_div} division(s) (div/rem)")
                    hints.append("a loop that needs no trip count has no division: keep 02's uint64 indices (i, "
                                 "stride, nbytes); to unroll a loop of signed ones a compiler may compute a count of "
                                 "its own, with a division (seen in sm_75 code)")
                if not ptx.reads_grid_size(text):
                    wrong.append("a stride that is not the grid's size in threads")
                    hints.append("the stride is cuda.gridsize(1): cuda.gridDim.x counts blocks, not threads")
                if wrong:
                    res.passed = False
                    res.verdict = f"NOT PASSED: {name}: bit-exact, but its PTX has " + " and ".join(wrong)
                    res.messages.extend(hints)
                else:
                    res.messages.append("PTX: no division, and the stride is the grid's threads (cuda.gridsize(1))")
    if verbose:
        print(res)
        res._printed = True
    return res


# Notebook 03's exercise 1: shapes with every remainder of n mod 4 (n = 1, 2, 15, 64, 65, 66, 231), so that
# every end a 64-bit store of four weights can meet (none, 1, 2 or 3 weights left) is run.
U64_SHAPES = ((1, 1), (1, 2), (3, 5), (1, 64), (1, 65), (1, 66), (7, 33))


def check_fp4_prediction(launch, predicted, *, shapes, name="exercise 3: your fp4 prediction",
                         verbose=True) -> CheckResult:
    """Grade notebook 03's exercise 3: ``predicted`` (True or False) says whether ``launch``, unchanged, is bit-exact
    on FP4 cases. The kernel is checked on fp4 cases of ``shapes``; the exercise passes when the prediction matches
    what the check found, whichever it is. Then one more question (kept here so that the notebook's cell does not
    hint at the answer before the student predicts). Falsy unless the prediction holds."""
    if not isinstance(predicted, bool):
        raise ValueError(f"predicted must be True or False (your prediction), got {predicted!r}")
    bits = check(launch, name="the kernel on fp4 cases", quant_type="fp4", shapes=shapes, verbose=False)
    exact = bool(bits)
    found = "bit-exact on fp4" if exact else "not bit-exact on fp4"
    right = exact == predicted
    messages = [f"the kernel, unchanged, is {found} ({'as you predicted' if right else 'you predicted the opposite'})"]
    if not exact:
        messages += str(bits).splitlines()[1:4]   # the check's first lines on what differs
    if not right:
        messages.append("where does the kernel take its 16 values from?")
    messages.append("Then think: what would you have to change if a kernel had the NF4 table baked in as constants?")
    res = CheckResult(name=name, passed=right, messages=messages, simulator=bits.simulator, seconds=bits.seconds,
                      verdict=f"{'PASSED' if right else 'NOT PASSED'}: {name}")
    if verbose:
        print(res)
        res._printed = True
    return res


def check_u64_store(launch, kernel, sig, *, name="exercise 1: 64-bit stores", verbose=True) -> CheckResult:
    """Grade notebook 03's exercise 1: ``launch`` bit-exact on :data:`U64_SHAPES`, and the PTX of ``kernel``
    (compiled for ``sig``) has a 64-bit global store: a kernel that gets the bits right with narrower stores
    only has not done the exercise. Falsy unless both hold; never raises because of the student's kernel."""
    from ..measure import ptx

    res, launched = _check_launching(kernel, launch, name=name, shapes=U64_SHAPES, verbose=False)
    if res:
        wide = r"^st\.global\.(u64|b64|s64)\s"
        _read_design(res, kernel, sig, name, lambda text: [
            ("no st.global.u64: wherever four weights are left, store them as one 64-bit word through out_u64",
             ptx.count(text, wide) > 0)], "the PTX has no 64-bit store",
            lambda text: f"PTX: {ptx.count(text, wide)} 64-bit store instruction(s) (st.global.u64)", launched)
    if verbose:
        print(res)
        res._printed = True
    return res


# Notebook 04's exercise 1: from one weight to 4,129 (130 chunks of 32 weights: two blocks of 128 threads, the second
# with two lanes of a warp, so a warp placed in its block instead of the grid is caught), with partial chunks and a
# last word of fewer than 8 weights.
SHUFFLE_SHAPES = ((1, 1), (3, 5), (1, 65), (7, 33), (31, 67), (1, 4129))


def check_warp_shuffle(launch, kernel, sig, *, name="exercise 1: coalesced through warp shuffles",
                       min_pct_copy=None, verbose=True) -> CheckResult:
    """Grade notebook 04's exercise 1: ``launch`` bit-exact on :data:`SHUFFLE_SHAPES` (and, on a GPU, at least
    ``min_pct_copy`` % of the copy ceiling), and the PTX of ``kernel`` (compiled for ``sig``) has the design the
    exercise asks for: 16-byte global loads and stores, warp shuffles (``shfl.sync``) and no shared memory. A
    kernel that gets the bits right with version A's scattered stores has not done the exercise: on a GPU the speed
    target shows it; in the simulator the check also watches each warp's 16-byte stores, which must put the lanes of
    one store on consecutive 16-byte pieces (lane t at the store's first piece + t). Falsy unless all hold; never
    raises because of the student's kernel."""
    from ..measure import ptx

    pieces = {}   # simulator: (n, block, warp, the lane's k-th store) -> {lane: the 16-byte piece it wrote}
    counts = {}   # (n, block, thread) -> stores so far

    def lane_piece(b, i):
        t = threading.current_thread()   # the simulator's thread: its blockIdx and threadIdx (Dim3)
        if hasattr(t, "blockIdx") and hasattr(t, "threadIdx"):
            n, blk, tid = int(b.n), (t.blockIdx.x, t.blockIdx.y, t.blockIdx.z), int(t.threadIdx.x)
            k = counts[n, blk, tid] = counts.get((n, blk, tid), -1) + 1
            pieces.setdefault((n, blk, tid // 32, k), {})[tid % 32] = int(i) // 4

    res, launched = _check_launching(kernel, _watching_stores(launch, lane_piece), name=name, shapes=SHUFFLE_SHAPES, min_pct_copy=min_pct_copy,
                                     verbose=False)
    if res.error is None and res.report is None:     # bit-exact (fast enough or not): read the design
        _read_design(res, kernel, sig, name, lambda text: [
            ("no 16-byte load (ld.global.v4)", ptx.count(text, r"^ld\.global(\.nc)?\.v4") > 0),
            ("no 16-byte store (st.global.v4)", ptx.count(text, r"^st\.global\.v4") > 0),
            ("no warp shuffle (shfl.sync)", ptx.count(text, r"^shfl\.sync") > 0),
            ("shared memory (ld.shared/st.shared): the exchange should stay in registers",
             ptx.count(text, r"^(ld|st)\.shared") == 0)], "the PTX is not the design asked for",
            "PTX: 16-byte loads and stores, warp shuffles, no shared memory", launched)
    if res and not runtime.ON_GPU:
        if not pieces:
            res.messages.append("simulator: no 16-byte store through ops.store_u32x4 seen, so where the lanes "
                                "store is not checked")
        elif any(len({piece - lane for lane, piece in lanes.items()}) > 1 for lanes in pieces.values()):
            res.passed = False
            res.verdict = f"NOT PASSED: {name}: bit-exact, but the warps' 16-byte stores are still scattered"
            res.messages.append("simulator: in one warp store, lane t should write the piece after lane t - 1's "
                                "(512 contiguous bytes a warp store); yours leave gaps between lanes")
        else:
            res.messages.append("simulator: each warp store's lanes write consecutive 16-byte pieces")
    if verbose:
        print(res)
        res._printed = True
    return res


# Notebook 04's exercise 2: ends of the last chunk with whole words, whole pairs and a single weight left (n mod 32:
# 1, 2, 15, 14, 1, 7, 29), so that each of the three store widths it asks for is run.
LAST_VECTOR_SHAPES = ((1, 1), (1, 2), (3, 5), (1, 46), (1, 65), (7, 33), (31, 67))


def check_last_vector(launch, kernel, sig, *, name="exercise 2: the last vector", verbose=True) -> CheckResult:
    """Grade notebook 04's exercise 2: ``launch`` bit-exact on :data:`LAST_VECTOR_SHAPES` (nothing written past
    n: the guard is checked), and the PTX of ``kernel`` (compiled for ``sig``) has 16-byte and 32-bit global
    stores: the last chunk is written with the widest store that fits each piece. A kernel that writes the
    whole last chunk one weight at a time (version A's tail) is right but has not done the exercise. The PTX
    cannot show which chunk a store writes: in the simulator the check also watches where the 16-byte stores
    land and wants one for each whole word of the last chunk; on a GPU that part is the student's to check.
    Falsy unless all hold; never raises because of the student's kernel."""
    from ..measure import ptx

    wide = {}   # simulator: the shape's n -> the out_u32 indices its 16-byte stores wrote
    res, launched = _check_launching(kernel, _watching_stores(launch, lambda b, i: wide.setdefault(int(b.n), set())
                                                              .add(int(i))), name=name, shapes=LAST_VECTOR_SHAPES, verbose=False)
    if res:
        _read_design(res, kernel, sig, name, lambda text: [
            ("no 16-byte store (st.global.v4): each whole word of 8 weights, in the last chunk too, is one "
             "16-byte store", ptx.count(text, r"^st\.global\.v4") > 0),
            ("no 32-bit store (st.global.u32): in the last word, each whole pair of weights is one 32-bit "
             "store, as in 03", ptx.count(text, r"^st\.global\.(u32|b32)\s") > 0)],
            "not with the widest stores that fit", "PTX: 16-byte and 32-bit stores present" + (
                "; which chunk each 16-byte store writes is not checked on a GPU (the simulator checks it)"
                if runtime.ON_GPU else ""), launched)
    if res and not runtime.ON_GPU:   # the simulator watched every launch
        short = []   # shapes whose last chunk has whole words not written by one 16-byte store each
        for rows, cols in LAST_VECTOR_SHAPES:
            n = rows * cols
            last = (n - 1) // 32 * 32                                  # the last chunk's first weight
            want = {(last + 8 * k) // 2 for k in range((n - last) // 8)}   # 2 bf16 weights a uint32
            if {i for i in wide.get(n, ()) if 2 * i >= last} != want:
                words = (n - last) // 8
                short.append(f"{rows}x{cols} ({words} whole word{'s' if words > 1 else ''} in its last chunk)")
        if short:
            res.passed = False
            res.verdict = f"NOT PASSED: {name}: bit-exact, but not with the widest stores that fit"
            res.messages.append("simulator: in the last chunk, each whole word of 8 weights is one 16-byte store; "
                                "not so at " + ", ".join(short))
        else:
            res.messages.append("simulator: in the last chunk's whole words, one 16-byte store each")
    if verbose:
        print(res)
        res._printed = True
    return res


# Notebook 06's exercise: fp16 cases with whole words and a tail, one-row and multi-row shapes.
FP16_SHAPES = ((3, 5), (1, 65), (7, 33))


#: A 32-bit register packed from two 16-bit ones: how sm_75 code joins two halves rounded by cvt.rn.f16.f32.
HALVES_PACKED = r"^mov\.b32\s+%r\d+,\s*\{%rs\d+,\s*%rs\d+\}"


def fp16_pair_design(text: str) -> list:
    """What :func:`check_fp16_path` reads in a kernel's PTX: (what is missing, whether it holds) pairs. Code for
    sm_80 or newer rounds its pairs with ``cvt.rn.f16x2.f32`` and carries no ``cvt.rn.bf16x2``. For sm_75 (a T4,
    or ``NF4LAB_ARCH=sm_75``) neither exists: ``ops.pack_f16x2`` is two ``cvt.rn.f16.f32`` and a 32-bit pack, and
    bf16 is rounded in integers, whose NaN test is ``setp.nan.f32`` (:data:`nf4lab.measure.ptx.SM80_ONLY`), so
    there those stand in: two halves joined into one register (:data:`HALVES_PACKED`), not a kernel's odd tail's
    ``cvt.rn.f16.f32`` alone. Two ``ops.to_f16_bits`` packed by hand compile to the same sm_75 code as
    ``ops.pack_f16x2``, and pass there."""
    from ..measure import ptx

    f16, bf16 = ptx.for_target(text, r"^cvt\.rn\.f16x2\.f32"), ptx.for_target(text, r"^cvt\.rn\.bf16x2")
    if not ptx.sm75_paths(text):
        return [("no fp16 pair conversion (cvt.rn.f16x2.f32)", ptx.count(text, f16) > 0),
                ("a bf16 pair conversion (cvt.rn.bf16x2): the pairs go out as bf16 bits", ptx.count(text, bf16) == 0)]
    return [("no fp16 pair (cvt.rn.f16.f32 and a 32-bit pack of two halves, what stands for cvt.rn.f16x2.f32 in "
             "sm_75 code; an odd tail's cvt.rn.f16.f32 alone is not a pair)",
             ptx.count(text, f16) > 0 and ptx.count(text, HALVES_PACKED) > 0),
            ("a NaN test (setp.nan.f32): in sm_75 code that is bf16 rounded in integers, so the pairs go out as "
             "bf16 bits", ptx.count(text, bf16) == 0)]


def check_fp16_path(launch, kernel, sig, *, name="exercise: fp16 path", verbose=True) -> CheckResult:
    """Grade notebook 06's exercise: ``launch`` bit-exact on fp16 cases of :data:`FP16_SHAPES`, by ``kernel`` (the
    launch must run it), whose PTX (compiled for ``sig`` and the default target) rounds its pairs to fp16 and
    carries no bf16 rounding: :func:`fp16_pair_design` says what that reads for each target. Falsy unless all
    hold; never raises because of the student's kernel."""
    from ..measure import ptx

    def ok(text):
        if ptx.sm75_paths(text):
            return ("PTX, sm_75 paths (cvt.rn.f16x2.f32 exists from sm_80): the pairs are rounded by cvt.rn.f16.f32 "
                    "and packed, and nothing is rounded to bf16")
        return "PTX: the pairs are rounded by cvt.rn.f16x2.f32"

    res, launched = _check_launching(kernel, launch, name=name, dtype="fp16", shapes=FP16_SHAPES, verbose=False)
    if res:
        _read_design(res, kernel, sig, name, fp16_pair_design, "its PTX does not round its pairs to fp16", ok,
                     launched)
    if verbose:
        print(res)
        res._printed = True
    return res


# Notebook 05's exercise: fp4 cases with a partial quantization block, one-row and multi-row shapes.
CONST_TABLE_SHAPES = ((3, 5), (1, 65), (7, 33))


def check_const_table(launch, kernel, sig, *, name="exercise: fp4 in constant memory", quant_type="fp4",
                      verbose=True) -> CheckResult:
    """Grade notebook 05's exercise: ``launch`` bit-exact on ``quant_type`` cases of :data:`CONST_TABLE_SHAPES`,
    and the PTX of ``kernel`` (compiled for ``sig``) reads its table from constant memory (``ld.const.f32``),
    not from shared memory or by selects. Section 2's shared-memory kernel serves fp4 bit-exactly too, but it
    is not the exercise. Falsy unless both hold; never raises because of the student's kernel."""
    from ..measure import ptx

    res, launched = _check_launching(kernel, launch, name=name, quant_type=quant_type, shapes=CONST_TABLE_SHAPES,
                                     verbose=False)
    if res:
        _read_design(res, kernel, sig, name, lambda text: [
            ("no constant-memory lookup (ld.const.f32): the table goes in constant memory "
             "(cuda.const.array_like)", ptx.count(text, r"^ld\.const\.f32") > 0),
            ("table lookups in shared memory (ld.shared.f32): that is section 2's shared-memory kernel",
             ptx.count(text, r"^ld\.shared\.f32") == 0),
            ("lookups by selects (selp.f32): that is the register table", ptx.count(text, r"^selp\.f32") == 0)],
            "its table is not in constant memory", "PTX: the lookups are ld.const.f32 (constant memory)", launched)
    if verbose:
        print(res)
        res._printed = True
    return res


def _registers_kernel(fragments):
    """A kernel writing each lane's six registers as ``fragments(w, xt, g, q)`` gives them (a module-level ``cuda``:
    the simulator swaps it in a kernel's globals)."""
    @cuda.jit
    def registers(w, xt, out):
        lane = cuda.threadIdx.x
        a0, a1, a2, a3, b0, b1 = fragments(w, xt, uint32(lane) >> uint32(2), uint32(lane) & uint32(3))
        out[lane, 0], out[lane, 1], out[lane, 2], out[lane, 3], out[lane, 4], out[lane, 5] = a0, a1, a2, a3, b0, b1

    return registers


def check_one_mma(one_mma, fragments=None, seed=9) -> bool:
    """Grade notebook 09's exercise: ``one_mma[1, 32](w, xt, y)`` must give Y = W @ X (16 x 16 by 16 x 8) bit for bit.
    W and X are small integers, so every sum is exact in float32; both go in as bf16 pairs in uint32 words
    (``w[8 r + j]``: W's row r, columns 2j and 2j + 1; ``xt[8 n + j]``: X's column n, rows 2j and 2j + 1).
    Y cannot show a k order that A and B share (a sum does not care which columns are called k), so with
    ``fragments`` (the device function ``one_mma`` calls) each lane's six registers are also compared with the
    PTX ISA's m16n8k16 layout, which the exercise asks for."""
    import numpy as np

    Wm = np.random.default_rng(seed).integers(-8, 9, (16, 16))
    X = np.random.default_rng(seed + 1).integers(-8, 9, (16, 8))

    def words(a):   # bf16 bits (exact for small integers), two a word, the lower index in the low half
        return cuda.to_device((a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).reshape(-1).view(np.uint32))

    y = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    w, xt = words(Wm), words(X.T.copy())
    one_mma[1, 32](w, xt, y)
    bad = np.argwhere((got := y.copy_to_host()) != (want := (Wm @ X).astype(np.float32)))
    if len(bad):
        print(f"NOT PASSED (not solved yet): {len(bad)} of 128 outputs differ; first Y[{bad[0][0]}, {bad[0][1]}] = "
              f"{got[tuple(bad[0])]}, W @ X gives {want[tuple(bad[0])]}")
        return False
    if fragments is None:
        print("PASSED: exercise: one mma by hand, Y = W @ X bit for bit")
        return True

    regs = cuda.to_device(np.zeros((32, 6), np.uint32))
    _registers_kernel(fragments)[1, 32](w, xt, regs)
    hw, hx = w.copy_to_host(), xt.copy_to_host()
    # the PTX ISA's m16n8k16 layout: lane 4g + q holds A's rows g, g + 8 at columns 2q, 2q + 1 (a0, a1) and
    # 2q + 8, 2q + 9 (a2, a3), and B's column g at rows 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1)
    ptx = np.array([[hw[8 * g + q], hw[8 * (g + 8) + q], hw[8 * g + q + 4], hw[8 * (g + 8) + q + 4],
                     hx[8 * g + q], hx[8 * g + q + 4]] for g in range(8) for q in range(4)], np.uint32)
    off = np.argwhere(regs.copy_to_host() != ptx)
    if len(off):
        lane, i = off[0]
        print(f"NOT PASSED: Y = W @ X bit for bit, but {len(off)} of 192 registers are not where the PTX ISA's "
              f"m16n8k16 layout puts them (first: lane {lane}, g = {lane >> 2}, q = {lane & 3}, "
              f"{('a0', 'a1', 'a2', 'a3', 'b0', 'b1')[i]}): your k order differs from section 2's, and A and B agree on "
              "it, so the sum hides it")
        return False
    print("PASSED: exercise: one mma by hand, Y = W @ X bit for bit, every register where the PTX layout puts it")
    return True


def _last_writer(prog, i, operands):
    """The last instruction before ``i`` that writes a register ``i`` reads, or None (by address order only)."""
    reads = operands(prog[i]["sass"])[2]
    return next((j for j in range(i - 1, -1, -1) if operands(prog[j]["sass"])[1] & reads), None)


def walk_to_load(prog, start, operands, steps=6) -> list:
    """Notebook 08: indices from ``start`` back through the last writer of a register each reads, until a load
    (``LDG``, ``LDS``, ``LDC``, ``LD.``) or ``steps`` writers."""
    chain = [start]
    while len(chain) <= steps and (j := _last_writer(prog, chain[-1], operands)) is not None:
        chain.append(j)
        if operands(prog[j]["sass"])[0].startswith(("LDG", "LDS", "LDC", "LD.")):
            break
    return chain


def check_hot_spot(hot_spot, prog, operands) -> bool:
    """Grade notebook 08's exercise on an ncu source listing ``prog`` (dicts with ``sass``, ``samples``, ``line``):
    ``hot_spot(prog)`` gives {"hot": an instruction with the most samples, "line": its Python line,
    "waits_for": the last instruction before it that writes a register it reads, or None}."""
    got, problems = hot_spot(prog), []
    if not isinstance(got, dict) or not {"hot", "line", "waits_for"} <= set(got):
        problems.append("hot_spot returns a dict with the keys 'hot', 'line' and 'waits_for'")
    else:
        hot, j = got["hot"], got["waits_for"]
        if not (isinstance(hot, int) and 0 <= hot < len(prog) and prog[hot]["samples"] == max(x["samples"] for x in prog)):
            problems.append("'hot' is the index of an instruction with the most samples (issued ones included)")
        else:
            if got["line"] != prog[hot]["line"]:
                problems.append("'line' is the Python line of instruction 'hot' (its \"line\")")
            if j != _last_writer(prog, hot, operands):
                problems.append("'waits_for' is the last instruction before 'hot' that writes a register 'hot' reads")
    for p in problems:
        print(f"  {p}")
    print("PASSED: exercise: the hot spot of a source page" if not problems else
          f"NOT PASSED (not solved yet): {len(problems)} of the answer's parts")
    return not problems


# Where notebook 08's walk can end, and what each end means (the notebook prints the one its page gave). The walk
# follows registers by address order only, so a load it ends at is where one chain of writers ends, not necessarily
# where the hot instruction's operand came from: the loads' texts say so.
CHAIN_ENDS = {
    "global load": "a load from global memory (LDG); if this is the path the operand took: the warps wait for L2 "
                   "or DRAM (an L1TEX result: long_scoreboard)",
    "shared-memory load": "a load from shared memory (LDS); if this is the path the operand took: an MIO result "
                          "(short_scoreboard), not DRAM",
    "constant load": "a load from the constant bank (LDC): a kernel parameter or a constant",
    "special register": "a special register (S2R: the thread or block index, or a clock): there is no "
                        "memory load in the chain",
    "no writer": "nothing earlier writes a register it reads: its inputs are uniform registers (UR...) or "
                 "constants, which the walk does not follow",
    "steps": "no load within the walk's steps: a chain of arithmetic (often an address) longer than the walk "
             "follows; the hot instruction's stall reasons say what it waited for",
}


def chain_end(prog, chain, operands) -> str:
    """Notebook 08: which key of CHAIN_ENDS a walk of ``walk_to_load`` ended at (``chain``: its indices,
    the hot instruction first)."""
    if len(chain) > 1:
        op = operands(prog[chain[-1]]["sass"])[0]
        for prefixes, kind in ((("LDG", "LD."), "global load"), (("LDS",), "shared-memory load"),
                               (("LDC", "ULDC"), "constant load"), (("S2R", "CS2R", "S2UR"), "special register")):
            if op.startswith(prefixes):
                return kind
    return "steps" if _last_writer(prog, chain[-1], operands) is not None else "no writer"


# Stall reasons of a source page's instruction, in two groups: the warp waits for an operand of the instruction
# (a scoreboard, or a fixed-latency result), or its operands are ready and the issue is held (another warp picked,
# a busy pipe, the dispatcher). Other reasons (queues, barriers, ...) are in neither.
OPERAND_WAITS = ("long_scoreboard", "short_scoreboard", "wait")
READY_WAITS = ("not_selected", "math_pipe_throttle", "dispatch_stall")
# Instructions that compute or use an address themselves: a writer of their register that computes an address is
# the expected one, not a sign of a reused register.
_ADDRESS_OPS = ("IMAD.WIDE", "LEA", "LD", "ST", "RED", "ATOM")


def show_hot_spot(prog, hot, operands, what, steps=6):
    """Notebook 08, once its exercise passes: for a listing ``prog`` (``program``'s dicts) and the index ``hot`` of its
    hottest instruction, print the instruction with its share of the listing's samples, its stall samples by reason
    split into waits for an operand and ready warps, the chain of writers ``walk_to_load`` finds behind it, a warning
    where the chain's first step looks like a reused register, and where the chain ends."""
    ins = prog[hot]
    total = sum(x["samples"] for x in prog) or 1.0
    print(f"\n{what}, hottest: {ins['sass']} (line {ins['line']}: {(ins.get('source') or '')[:60]}), "
          f"{ins['samples'] / total:.1%} of the page's samples, issued ones included")
    stalls = ins.get("stalls", {})
    top = sorted(stalls.items(), key=lambda x: -x[1])[:3]
    print("  its stall samples by reason: " + (", ".join(f"{r} {v:.0f}" for r, v in top) or "not on this page"))
    if sum(stalls.values()):
        share = lambda keep: sum(v for r, v in stalls.items() if keep(r)) / sum(stalls.values())
        print(f"  of them: {share(lambda r: r in OPERAND_WAITS):.0%} waits for an operand ({', '.join(OPERAND_WAITS)}), "
              f"{share(lambda r: r in READY_WAITS):.0%} ready warps or a busy pipe ({', '.join(READY_WAITS)}), "
              f"{share(lambda r: r not in OPERAND_WAITS + READY_WAITS):.0%} other reasons")
    op = operands(ins["sass"])[0]
    if op.startswith(("LD", "ST", "ULDC")):
        print("  it is itself a memory instruction: its samples are waits to issue it (the reasons above say for "
              "what); the walk follows the last-written of its source registers, address or data: for a store, "
              "its data's writer may be another chain")
    chain = walk_to_load(prog, hot, operands, steps)
    for j in chain[1:]:
        print(f"  waits for {prog[j]['sass']:<44} line {prog[j]['line']}: {(prog[j].get('source') or '')[:60]}")
    end = chain_end(prog, chain, operands)
    print(f"  the walk ends at: {end}: {CHAIN_ENDS[end]}")
    if len(chain) > 1 and not op.startswith(_ADDRESS_OPS) and operands(prog[chain[1]]["sass"])[0].startswith("IMAD.WIDE"):
        print("  but the first writer found computes an address (IMAD.WIDE: an index times the element size), while "
              "the hot instruction uses the register as data: the walk may have followed another use of the same "
              "register, not the value the hot instruction read")


def _own_share_want(sweep, name, shape, dtype="bf16"):
    """Notebook 07's grader: the share the student's ``own_share`` must give at one shape of ``sweep`` (private,
    and its formula not spelled out here, since the student imports this module). None where the run lacks a
    record or the version is not slower than the copy (no time beyond it to share)."""
    from ..measure.bench import BOUND, COPY

    k, b, c = (sweep.get(n, shape=shape, dtype=dtype) for n in (name, BOUND, COPY))
    if not (k and b and c and k.get("gbps") and b.get("gbps") and c.get("gbps")) or k["gbps"] >= c["gbps"]:
        return None
    return (1 / k["gbps"] - 1 / b["gbps"]) / (1 / k["gbps"] - 1 / c["gbps"])


def own_share_span(sweep, name, shape, dtype="bf16") -> tuple:
    """Notebook 07, after its exercise: the lowest and highest own share that the three records' p10 and p90 ends
    (``spread_ms``) allow at one shape, so that two shapes whose spans overlap are not ranked; the highest is
    ``math.inf`` where a copy's end reaches a kernel's end (the share has no upper end there). Kept here, not in
    the notebook, because it computes the exercise's answer."""
    from ..measure.bench import BOUND, COPY

    t, b, c = ((r := sweep.get(n, shape=shape, dtype=dtype)).get("spread_ms") or [r["ms"]] * 2
               for n in (name, BOUND, COPY))
    ends = [(x - y) / (x - z) for x in t for y in b for z in c if x > z]
    if len(ends) < len(t) * len(b) * len(c):   # the copy's slow end reaches the kernel's fast end: no upper end
        return (min(ends, default=-math.inf), math.inf)
    return (min(ends), max(ends))


def graded_shapes(sweep, name, dtype="bf16") -> list:
    """The shapes of ``sweep`` where notebook 07's exercise is graded (``name`` slower than the copy there)."""
    shapes = dict.fromkeys(tuple(r["shape"]) for r in sweep.records if r["name"] == name and r["dtype"] == dtype)
    return [s for s in shapes if _own_share_want(sweep, name, s, dtype) is not None]


def check_own_share(own_share, sweep, name, dtype="bf16") -> bool:
    """Grade notebook 07's exercise: ``own_share(sweep, shape)`` at every shape of ``sweep`` where
    ``_own_share_want`` is defined, within a relative 1e-6 (times or GB/s give the same share)."""
    graded, bad = 0, []
    for shape in graded_shapes(sweep, name, dtype):
        want = _own_share_want(sweep, name, shape, dtype)
        graded += 1
        try:
            got = own_share(sweep, shape)
        except Exception as exc:   # a student's error is reported, not raised
            got = f"{type(exc).__name__}: {exc}"
        if not (isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-12)):
            bad.append((shape, got, want))
    for shape, got, want in bad[:3]:
        print(f"  {'x'.join(map(str, shape))}: yours {got}, the records give {want:.4f}")
    ok = graded > 0 and not bad
    print(f"PASSED: exercise: the kernel's own share of its time beyond a copy, at {graded} shapes" if ok else
          "NOT PASSED (not solved yet): " + (f"{len(bad)} of {graded} shapes" if graded else "no shape to grade"))
    return ok
