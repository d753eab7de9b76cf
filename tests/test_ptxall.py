"""python -m nf4lab ptx --all: kernels found, compiled per architecture, assembled by ptxas, failures fail.

The whole series is run by CI itself (.ci/run); these tests use small kernel files of their own.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from nf4lab.measure import ptxall
from nf4lab.__main__ import ROOT, main

# An exercise in the notebooks' format: a kernel outside the solution regions, an exercise kernel
# whose student version differs, and a kernel with an instruction that exists from sm_80 only.
SOURCE = textwrap.dedent('''
    # %% [markdown]
    # # A test notebook

    # %%
    import numpy as np
    import nf4lab
    from llvmlite import ir
    from numba import cuda, types, uint64
    from numba.core.extending import intrinsic

    from nf4lab.device import ops


    @cuda.jit
    def scale(x, out, s, n):
        i = uint64(cuda.grid(1))
        if i < uint64(n):
            out[i] = ops.to_bf16_bits(x[i] * s)


    x = cuda.to_device(np.arange(8, dtype=np.float32))
    out = cuda.device_array(8, dtype=np.uint16)
    scale[1, 32](x, out, np.float32(2), 8)
    scale[1, 32](x, cuda.device_array(8, dtype=np.uint32), np.float32(2), 8)

    # %%
    ### BEGIN SOLUTION
    @cuda.jit
    def exercise(x, out, n):
        i = uint64(cuda.grid(1))
        if i < uint64(n):
            out[i] = ops.to_bf16_bits(x[i])
    ### STUDENT
    @cuda.jit
    def exercise(x, out, n):
        i = uint64(cuda.grid(1))
        if i < uint64(n):
            out[i] = 0
    ### END SOLUTION


    exercise[1, 32](x, out, 8)

    # %%
    @intrinsic
    def cvt_bf16x2(typingctx, hi, lo):
        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f"), args)
        return types.uint32(types.float32, types.float32), codegen


    @cuda.jit
    def packs_bf16x2(x, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = cvt_bf16x2(x[2 * i], x[2 * i + 1])


    # Never launched (the simulator cannot run an intrinsic): found through compile_ptx.
    nf4lab.compile_ptx(packs_bf16x2, (types.float32[::1], types.uint32[::1]))
''')


def _ptx(*args, env=None):
    return subprocess.run([sys.executable, "-m", "nf4lab", "ptx", *args], capture_output=True, text=True,
                          cwd=str(ROOT), env=dict(os.environ, **(env or {})), timeout=900)


@pytest.fixture(scope="module")
def run_source(tmp_path_factory):
    d = tmp_path_factory.mktemp("ptxall")
    src = d / "mini_nb.py"
    src.write_text(SOURCE)
    out = d / "result.json"
    p = _ptx("--all", "--only", str(src), "--arch", "sm_75", "--arch", "sm_90", "--json", str(out))
    return p, json.loads(out.read_text()) if out.exists() else None


def test_an_sm80_instruction_fails_for_sm75_and_the_exit_status_says_so(run_source):
    p, res = run_source
    assert res is not None, p.stderr
    rows = {r["kernel"]: r["results"] for r in res["rows"]}
    bad = rows["mini_nb packs_bf16x2"]
    assert bad["sm_90"] is None, bad
    assert "bf16x2" in bad["sm_75"] and "sm_80" in bad["sm_75"], bad
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL mini_nb packs_bf16x2 [sm_75]" in p.stderr
    table = p.stdout.splitlines()
    assert table[0].split() == ["kernel", "sm_75", "sm_90"]
    assert any(line.split()[-2:] == ["FAIL", "ok"] for line in table if "packs_bf16x2" in line)


def test_every_launched_signature_and_the_student_kernels_are_found(run_source):
    p, res = run_source
    rows = {r["kernel"]: r["results"] for r in res["rows"]}
    # Two launches with different output arrays: two signatures, told apart in the label.
    assert "mini_nb scale (f32[:], u16[:], f32, i64)" in rows, sorted(rows)
    assert "mini_nb scale (f32[:], u32[:], f32, i64)" in rows, sorted(rows)
    # The exercise kernel in both versions; the kernels outside solution regions only once.
    assert "mini_nb exercise" in rows and "mini_nb student exercise" in rows, sorted(rows)
    assert not any(k.startswith("mini_nb student scale") for k in rows), sorted(rows)
    for k, r in rows.items():
        if "packs_bf16x2" not in k:
            assert r == {"sm_75": None, "sm_90": None}, (k, r)
    # PTX from numba-cuda's NVVM carries an ISA version the wheel's ptxas accepts (sm_90 assembled).
    assert all(r["ptx_version"] for r in res["rows"])


@pytest.mark.parametrize("argv, msg", [
    (["--all", "--arch", "sm_70"], "sm_75, sm_80, sm_86, sm_89, sm_90"),
    (["--arch", "sm_80"], "--all"),
    (["--all", "--jobs", "0"], "--jobs"),
])
def test_usage_errors_exit_2_and_name_the_option(argv, msg, capsys):
    assert main(["ptx", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_a_missing_ptxas_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv(ptxall.PTXAS_ENV, str(tmp_path / "nowhere" / "ptxas"))
    with pytest.raises(FileNotFoundError, match=ptxall.PTXAS_ENV):
        ptxall.find_ptxas()


def test_ptxas_comes_from_the_wheel_beside_nvvm():
    from importlib import metadata

    path = ptxall.find_ptxas()
    nvvm = metadata.version("nvidia-nvvm") if _has("nvidia-nvvm") else None
    if nvvm:
        # Same CUDA release as NVVM: e.g. nvidia-nvvm 13.5.37 and ptxas V13.5.37.
        assert ptxall.ptxas_version(path) == f"ptxas V{nvvm}", (path, nvvm)


def _has(dist):
    from importlib import metadata

    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


LOWER_ONCE = r"""
import os, re, sys, tempfile
os.environ["NF4LAB_MODE"] = "compile"
import nf4lab
from numba import cuda, types, uint64
from nf4lab.device import ops
from nf4lab.measure import ptxall

def kern(x, out, out16, n):
    i = uint64(cuda.grid(1))
    if i < uint64(n):
        out[i] = ops.pack_bf16x2(x[2 * i], x[2 * i + 1])
        out16[i] = ops.to_f16_bits(x[i])

sig = (types.float32[::1], types.uint32[::1], types.uint16[::1], types.int64)
ccs = [(7, 5), (8, 0), (9, 0)]
d = tempfile.mkdtemp()
[entry] = ptxall._compile_jobs([("kern", kern, sig, {})], ccs, d)
assert entry["error"] is None, entry
for cc in ccs:
    once = open(entry["ptx"]["sm_%d%d" % cc]).read()
    alone, _ = cuda.compile_ptx(kern, sig, cc=cc)
    # Mangled names differ (a compile counter, and an ABI tag that hashes the flags): all else is equal.
    same = lambda ptx: re.sub(r"_ZN\w+", "NAME", ptx)
    assert same(once) == same(alone), cc
    assert ("cvt.rn.bf16x2.f32" in once) == (cc >= (8, 0)), cc
print("same")
"""


def test_lowering_once_gives_the_ptx_compile_ptx_gives_for_each_arch():
    env = dict(os.environ, NF4LAB_MODE="compile", NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-c", LOWER_ONCE], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "same" in p.stdout, p.stderr[-3000:]


def test_readme_block_round_trip(tmp_path):
    report = ptxall.Report(["sm_75", "sm_90"], [ptxall.Row("01 k", {"sm_75": None, "sm_90": None}, "9.5"),
                                                ptxall.Row("package x", {"sm_75": "error", "sm_90": None}, "9.5")],
                           [], 1.0, "ptxas V13.5.37")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{ptxall.BEGIN}\nold\n{ptxall.END}\nrest\n")
    assert not ptxall.update_readme(report, check=True, path=readme)
    assert "old" in readme.read_text()
    assert not ptxall.update_readme(report, path=readme)
    assert ptxall.update_readme(report, check=True, path=readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n")
    assert "| 01 | 1 | ok | ok |" in text and "| package | 1 | 1 FAIL | ok |" in text


def test_student_variant_is_compiled_only_where_it_can_add_a_kernel(tmp_path):
    """The student run is skipped only where no student-only line defines or decorates a function (no
    kernel can start there); the exercise notebooks with student kernels keep it."""
    from nf4lab.measure import ptxall

    cell = "# %%\nimport numpy as np\n### BEGIN SOLUTION\nx = 1\n### STUDENT\n{}\n### END SOLUTION\n"
    plain, kernel = tmp_path / "a.py", tmp_path / "b.py"
    plain.write_text(cell.format("x = None  # TODO"))
    kernel.write_text(cell.format("@cuda.jit\ndef k(a):\n    pass"))
    assert not ptxall.student_defines_functions(str(plain))
    assert ptxall.student_defines_functions(str(kernel))
    picked = {nb for nb, v in ptxall.sources() if v == "student"}
    assert {"01", "03", "04"} <= picked  # their student variants add exercise kernels (README's table)
