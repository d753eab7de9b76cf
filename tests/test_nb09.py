"""Notebook 09 teaches the shipped tensor-core GEMV: its kernel cells compile to the same PTX as
nf4lab.kernels.gemv.make_kernel at its defaults, and its source stays a lesson's size."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import nf4lab  # noqa: F401  (first: may switch numba to the simulator)
from nf4lab import arch
from nf4lab.kernels import gemv
from nf4lab.measure.ptx import compile_ptx

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src" / "09_fused_gemv.py"


def _norm_ptx(p):
    """PTX without names and comments (numba numbers its shared arrays per process), the operands of
    commutative min.u32 sorted (as tests/test_gemv.py compares the lab's kernels)."""
    p = re.sub(r"//.*", "", re.sub(r"_cudapy_smem_\d+", "SMEM", re.sub(r"_Z\w+", "NAME", p)))
    p = re.sub(r"(min\.u32\s+%r\d+), (%r\d+), (%r\d+)", lambda m: m.group(1) + ", " + ", ".join(sorted(m.group(2, 3))), p)
    return [line.rstrip() for line in p.splitlines() if line.strip()]


PAIRS = [("bf16", 1, False, 8), ("fp16", 1, False, 8), ("bf16", 1, True, 8), ("fp16", 1, True, 8), ("bf16", 1, True, 2),
         ("fp16", 1, True, 4), ("bf16", 8, False, 8), ("fp16", 8, False, 8)]


@pytest.fixture(scope="module")
def ptx_pairs():
    """{(dtype, M): (the notebook's PTX, the shipped kernel's PTX)}, all compiled in one process in compile mode:
    in the simulator every compile_ptx call starts a process of its own, about 15 s each before NVVM starts."""
    import json
    import os
    import subprocess
    import sys

    from nf4lab.harness import versions

    cc = nf4lab.runtime.target_cc()
    code = "\n".join([
        "import json, nf4lab",
        f"import {versions.__name__} as versions, {gemv.__name__} as gemv",
        f"from {compile_ptx.__module__} import compile_ptx",
        "nb09 = versions.load_module('09_fused_gemv')",
        f"base, out = gemv.default_base({cc!r}), []",
        f"for dtype, M, full, G in {PAIRS!r}:",
        f"    out.append([compile_ptx(make(dtype == 'bf16', M, base, full=full, G=G), gemv.signature(), cc={cc!r})",
        "                for make in (nb09.make_kernel, gemv.make_kernel)])",
        "print(json.dumps(out))"])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1200, cwd=ROOT,
                       env=dict(os.environ, NF4LAB_MODE="compile", NUMBA_ENABLE_CUDASIM="0"))
    assert p.returncode == 0, p.stderr[-4000:]
    return dict(zip(PAIRS, json.loads(p.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("dtype,M,full,G", PAIRS)
def test_notebook_kernel_is_the_shipped_kernel(ptx_pairs, dtype, M, full, G):
    """The kernel the notebook builds cell by cell is the package's at its defaults (D=1, min_blocks=2,
    nested=True), with and without the per-step test (``full``), with groups of G warps a tile, instruction for instruction, so the recorded times
    it prints are its own."""
    ours, shipped = ptx_pairs[(dtype, M, full, G)]
    assert re.search(r"\.maxntid 256, 1, 1\s+\.minnctapersm 2", shipped), "the launch bounds are part of the kernel"
    assert _norm_ptx(ours) == _norm_ptx(shipped)


def _cells(text):
    """(kind, lines) of each cell of a percent-format source; kind: "markdown", "code" or "kernel"."""
    out = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            out.append(("markdown" if "[markdown]" in line else "kernel" if '"kernel"' in line else "code", []))
        elif out:
            out[-1][1].append(line)
    return out


def test_source_is_a_lesson_size():
    text = SRC.read_text()
    assert len(text.splitlines()) <= 455   # (450 until the statistics word shipped: its load, shuffles and fallback)
    for kind, lines in _cells(text):
        if kind != "markdown":
            n = sum(1 for ln in lines if ln.strip())
            assert n <= 120, f"a code cell of {n} non-blank lines: {lines[:2]}"


def test_notebook_has_no_lab_knobs():
    """The lesson's kernel cells carry none of the lab's lost experiments (ring, xring, D): the appendix names
    them, the kernel does not; and the kernel is read in at most four cells."""
    cells = _cells(SRC.read_text())
    assert 1 <= sum(kind == "kernel" for kind, _ in cells) <= 4
    code = "\n".join("\n".join(lines) for kind, lines in cells if kind == "kernel")
    for word in ("ring", "xring", "RING", "cp.async", "min_blocks", "D=1"):
        assert not re.search(rf"\b{re.escape(word)}\b", code), word


@pytest.mark.slow
def test_notebook_runs_on_a_t4s_code_paths(monkeypatch, notebook_twins):
    """With NF4LAB_ARCH=sm_75 (a T4's paths, forced; the notebook's kernel inherits the variable) 09's solution
    runs top to bottom: the evidence cell shows fp16's m16n8k8 mmas, the checks pass and the exercise is graded.
    (Its student twin runs once, in tests/test_gemv.py.)"""
    monkeypatch.setenv(arch.ENV, "sm_75")
    text, _ = notebook_twins("09_fused_gemv", student=False)
    assert "sm_75" in text and "within the float32 tolerance" in text and "PASSED: exercise" in text
    assert "m16n8k8" in text and "m16n8k16" not in text
