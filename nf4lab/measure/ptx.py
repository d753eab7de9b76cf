"""Show and check the PTX of a kernel, with or without a GPU.

``cuda.compile_ptx`` needs the real numba.cuda (NVVM from the cu12/cu13 pip
extras), but in simulator mode ``numba.cuda`` *is* the simulator. So in that
mode the kernel's Python function (with the helpers and constants it uses) is
pickled by value with cloudpickle and compiled in a subprocess that runs with
``NF4LAB_MODE=compile``. The PTX is the same one a GPU session would get.
"""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys

from .. import arch, config
from .. import runtime

PTXAS_ENV = "NF4LAB_PTXAS"



def _kernel_fn(k):
    for attr in ("py_func", "fn"):
        f = getattr(k, attr, None)
        if f is not None:
            return f
    return k


def _rejit(fn, kwargs):
    from numba import cuda

    kwargs = dict(kwargs)
    if kwargs.get("device"):
        # Plain device functions need a GPU to compile; inlined ones do not.
        kwargs["inline"] = "always"
    return cuda.jit(**kwargs)(fn)


def _resolve(module, name):
    import importlib

    return getattr(importlib.import_module(module), name)


def _by_name() -> dict:
    """id -> (module, name) of the device ops that loaded nf4lab modules declare in DEVICE_OPS.

    In the simulator such a name holds a plain-Python twin whose device version the
    compile-mode subprocess gets under the same name: so these are pickled by name, not by value.
    """
    import sys

    found = {}
    for modname, mod in list(sys.modules.items()):
        if mod is not None and modname.startswith("nf4lab.") and mod.__name__ == modname:
            for name in getattr(mod, "DEVICE_OPS", ()):
                found[id(getattr(mod, name))] = (modname, name)
    return found


def _dumps(fn) -> bytes:
    import cloudpickle

    by_name = _by_name()

    class Pickler(cloudpickle.CloudPickler):
        def reducer_override(self, obj):
            if id(obj) in by_name:
                return _resolve, by_name[id(obj)]
            if type(obj).__name__ == "FakeCUDAKernel":
                kwargs = getattr(obj, "_nf4lab_jit_kwargs", None) or {"device": obj._device}
                return _rejit, (obj.fn, kwargs)
            return super().reducer_override(obj)

    import io

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
    return buf.getvalue()


_CHILD = r"""
import os, pickle, sys
os.environ["NF4LAB_MODE"] = "compile"
import nf4lab
from numba import cuda
fn, sig, cc, kwargs = pickle.loads(sys.stdin.buffer.read())
ptx, _ = cuda.compile_ptx(fn, sig, cc=cc, **kwargs)
sys.stdout.write(ptx)
"""


# Each is called as observer(kernel, sig, kwargs) before a compile: `python -m nf4lab ptx --all` notes
# this way which kernels a notebook compiles (nf4lab.measure.ptxall.Recorder).
OBSERVERS: list = []


def compile_ptx(kernel, sig, cc=None, **kwargs) -> str:
    """PTX of ``kernel`` (a @cuda.jit kernel or plain function) for signature ``sig``, with the options it was
    jitted with (launch bounds included).

    ``cc`` defaults to :func:`nf4lab.runtime.target_cc`: NF4LAB_ARCH, else the GPU in hand, else sm_90.
    """
    for observe in OBSERVERS:
        observe(kernel, sig, kwargs)
    cc = tuple(cc) if cc is not None else runtime.target_cc()
    fn = _kernel_fn(kernel)
    jit_kwargs = dict(getattr(kernel, "_nf4lab_jit_kwargs", {}) or {})
    bounds = jit_kwargs.get("launch_bounds") or (getattr(kernel, "targetoptions", None) or {}).get("launch_bounds")
    if bounds:   # the kernel's launch bounds (.maxntid/.minnctapersm) belong in its PTX
        jit_kwargs["launch_bounds"] = bounds
    for key in ("lineinfo", "fastmath", "debug", "opt", "launch_bounds"):
        if key in jit_kwargs and key not in kwargs:
            kwargs[key] = jit_kwargs[key]
    if not runtime.SIMULATOR:
        from numba import cuda

        ptx, _ = cuda.compile_ptx(fn, sig, cc=cc, **kwargs)
        return ptx
    payload = _dumps((fn, sig, cc, kwargs))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, NF4LAB_MODE="compile", NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True, env=env,
                          timeout=600)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError("PTX compilation failed:\n" + "\n".join(err[-25:]))
    return proc.stdout.decode()


def find_ptxas() -> str:
    """ptxas from the nvidia-cuda-nvcc wheel installed beside numba-cuda's NVVM (or NF4LAB_PTXAS).

    Not the one on PATH: a system CUDA older than the NVVM wheel rejects its PTX ``.version``."""
    forced = config.ptxas()
    if forced:
        if not os.access(forced, os.X_OK):
            raise FileNotFoundError(f"{PTXAS_ENV}={forced!r} is not an executable ptxas")
        return forced
    from importlib import metadata

    for dist in ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12"):
        try:
            files = metadata.distribution(dist).files or []
        except metadata.PackageNotFoundError:
            continue
        for f in files:
            if f.name == "ptxas" and f.parent.name == "bin":
                path = str(f.locate())
                if os.access(path, os.X_OK):
                    return path
    raise FileNotFoundError(
        "ptxas not found: install the CUDA wheel that matches numba-cuda's NVVM, e.g. "
        "pip install -e \".[cu13]\" (brings nvidia-cuda-nvcc with the same version as nvidia-nvvm), "
        f"or point {PTXAS_ENV} at a ptxas at least as new as that NVVM")


def resources(kernel, sig, ptx: str, cc) -> str:
    """A kernel's registers and spills: on a GPU the driver's build (a GPU image may have no ptxas), else what
    ``ptxas -v`` reports for ``ptx`` assembled for ``cc``."""
    if runtime.ON_GPU:
        k = kernel.compile(sig)
        return f"{k.regs_per_thread} registers, {k.local_mem_per_thread} bytes of local memory (spills) per thread"
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([find_ptxas(), f"-arch={arch.name(cc)}", "-v", "-o", os.devnull, f.name],
                             capture_output=True, text=True).stderr
    return "ptxas: " + "; ".join(ln.split(":")[-1].strip() for ln in out.splitlines() if "Used" in ln or "spill" in ln)


def instructions(ptx: str) -> list[str]:
    """The instruction lines of a PTX listing (no directives, labels or comments)."""
    out = []
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "{", "}", "$")) or s.endswith(":"):
            continue
        out.append(s)
    return out


def grep(ptx: str, pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [s for s in instructions(ptx) if rx.search(s)]


def count(ptx: str, pattern: str) -> int:
    return len(grep(ptx, pattern))


def reads_grid_size(ptx: str) -> bool:
    """Whether the PTX adds the grid's size in threads, ``cuda.gridsize(1)``, unchanged to a register: the step of a
    grid-stride loop that spans the grid. The size is the product of the threads per block (``%ntid.x``) and the
    blocks of the grid (``%nctaid.x``), followed through ``mov`` and ``cvt``; the step is an ``add`` of that product
    and another register (or a ``mad`` of the two and a register). A stride of ``gridDim.x`` alone, or times a
    constant, multiplies nothing by the other; one derived from the product (halved, less one) is never added as
    it is."""
    origin = {"%ntid.x": "%ntid.x", "%nctaid.x": "%nctaid.x"}
    size = set()   # registers holding the product itself

    def reg(r):
        return r.startswith("%")

    for ins in instructions(ptx):
        op, _, rest = ins.partition(" ")
        regs = [r.strip().rstrip(";") for r in rest.split(",")]
        if len(regs) < 2:
            continue
        dst, srcs = regs[0], regs[1:]
        both = {"%ntid.x", "%nctaid.x"} <= {origin.get(r) for r in srcs[:2]}
        if op.startswith(("mov.", "cvt.")):
            if srcs[0] in size:
                size.add(dst)
            elif origin.get(srcs[0]):
                origin[dst] = origin[srcs[0]]
        elif op.startswith("mul.") and not op.startswith("mul.hi") and both:
            size.add(dst)
        elif op.startswith("mad.") and not op.startswith("mad.hi") and both and len(srcs) > 2 and reg(srcs[2]):
            return True
        elif op.startswith("add.") and len(srcs) == 2 and all(map(reg, srcs)) and (srcs[0] in size) != (srcs[1] in size):
            return True
    return False


def summary(ptx: str) -> dict:
    """Counts of the instruction kinds the series talks about."""
    pats = {
        "ld.global (any)": r"^ld\.global",
        "ld.global.v4": r"^ld\.global(\.nc)?(\.L[12]::\w+)*\.v4",   # cache hints too (the GEMV's streaming loads)
        "ld.global.u8": r"^ld\.global(\.nc)?\.u8",
        "st.global (any)": r"^st\.global",
        "st.global.u16": r"^st\.global\.(u16|b16)",
        "st.global.u32": r"^st\.global\.(u32|b32)",
        "st.global.v4": r"^st\.global\.v4",
        "ld.shared": r"^ld\.shared",
        "ld.const": r"^ld\.const",
        "ld.local": r"^ld\.local",
        "fma": r"^fma\.",
        "mul.rn.f32": r"^mul\.rn\.f32",
        "cvt.rn.bf16x2": r"^cvt\.rn\.bf16x2",
        "cvt.rn.f16x2": r"^cvt\.rn\.f16x2",
        "float64": r"\.f64",
        "64-bit division": r"^(div|rem)\.(s|u)64",
    }
    return {k: count(ptx, p) for k, p in pats.items()}


def show(ptx: str, patterns=None, limit: int = 12) -> None:
    """Print the instruction counts and, for each pattern, the first matching lines."""
    s = summary(ptx)
    print("  ".join(f"{k}: {v}" for k, v in s.items() if v))
    for p in patterns or []:
        lines = grep(ptx, p)
        print(f"\n{p!r}: {len(lines)} line(s)")
        for line in lines[:limit]:
            print("   ", line)


# Instructions that exist only from sm_80, and what stands for each in code compiled for sm_75
# (nf4lab.device.ops' second paths): bf16 rounded in integers tests for NaN, packed fp16 converts twice.
SM80_ONLY = {r"cvt\.rn\.bf16x2": r"^setp\.nan\.f32", r"cvt\.rn\.bf16": r"^setp\.nan\.f32",
             r"cvt\.rn\.f16x2": r"^cvt\.rn\.f16\.f32"}


def target(ptx: str) -> tuple[int, int] | None:
    """The architecture a PTX listing was compiled for (its ``.target sm_XX``)."""
    m = re.search(r"^\s*\.target\s+sm_(\d)(\d+)", ptx, re.M)
    return (int(m.group(1)), int(m.group(2))) if m else None


def sm75_paths(ptx: str) -> bool:
    """Whether this PTX was compiled with the sm_75 code paths (an sm_75 target, or NF4LAB_ARCH=sm_75)."""
    cc = target(ptx)
    return cc is not None and not arch.has_cvt_bf16(cc)


def for_target(ptx: str, pattern: str) -> str:
    """``pattern``, or what stands for its sm_80 instruction when ``ptx`` has the sm_75 paths."""
    if sm75_paths(ptx):
        for only, instead in SM80_ONLY.items():
            if only in pattern:
                return instead
    return pattern


def check(ptx: str, *, present=(), absent=()) -> None:
    """Assert that each pattern in ``present`` occurs and none in ``absent`` does.

    In code compiled with the sm_75 paths a pattern for an sm_80-only conversion is checked as
    the instructions that replace it there (``SM80_ONLY``), and a line says so.
    """
    swapped = {p: for_target(ptx, p) for p in present}
    for p, q in swapped.items():
        if p != q:
            print(f"({p!r} exists from sm_80; this {arch.name(target(ptx))} code has {q!r} instead)")
    present = list(swapped.values())
    missing = [p for p in present if not grep(ptx, p)]
    found = {p: grep(ptx, p)[:3] for p in absent if grep(ptx, p)}
    msgs = []
    if missing:
        msgs.append("expected in the PTX but missing: " + ", ".join(map(repr, missing)))
    for p, lines in found.items():
        msgs.append(f"must not be in the PTX: {p!r}, found e.g. " + " | ".join(lines))
    if msgs:
        raise AssertionError("\n".join(msgs))
