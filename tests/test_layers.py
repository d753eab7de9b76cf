"""nf4lab's layers only point down (import-linter's contract in pyproject.toml), and no module hides one
module system inside another: no import hook, no module-level __getattr__ answering for other modules,
no globals() writes, no exec outside the one notebook-kernel loader."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nf4lab"
LOADER = PACKAGE / "harness" / "versions.py"   # reads a notebook's tagged kernel cells and runs them as they are
# A module __getattr__ that makes its OWN names on demand (lean_linear: the Lean* classes pickle looks up) is fine;
# one that answers for another module's names is an alias layer.
OWN_GETATTR = {PACKAGE / "integrations" / "lean_linear.py"}


def _lint_imports():
    exe = Path(sys.executable).with_name("lint-imports")
    return str(exe) if exe.exists() else shutil.which("lint-imports")


def test_layer_contract_holds():
    exe = _lint_imports()
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]' brings lint-imports)")
    p = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout, p.stdout[-2000:]


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def _code(path):
    """A module's text without comments (docstrings may mention what they explain)."""
    return "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())


def test_no_import_hook_and_no_globals_writes():
    for path in _sources():
        code = _code(path)
        assert "meta_path" not in code, f"{path}: an import hook"
        assert not re.search(r"globals\(\)\s*(\[|\.update\()", code), f"{path}: writes globals()"
        if path not in OWN_GETATTR:
            assert not re.search(r"^def __getattr__\(", code, re.M), f"{path}: a module __getattr__"


def test_exec_only_in_the_notebook_kernel_loader():
    for path in _sources():
        if path == LOADER:
            continue
        code = _code(path)
        # A child process's script (a string) may say exec; Python code here may not call it.
        calls = [m for m in re.finditer(r"(?<![\w.\"'])exec\(", code)]
        assert not calls, f"{path}: exec( outside {LOADER.relative_to(ROOT)}"


def test_no_module_inside_the_package_imports_the_package_top():
    """``import nf4lab`` inside nf4lab reaches every layer through __init__: an upward import in disguise.
    (Scripts that child processes run, kept as strings, and the CLI may.)"""
    for path in _sources():
        if path.name == "__main__.py" or path == PACKAGE / "__init__.py":
            continue
        lines = [ln for ln in path.read_text().splitlines() if re.match(r"\s*(import nf4lab\s*$|from nf4lab import)", ln)]
        # the child scripts of ptx and ptxall are module-level strings: their lines start at column 0
        lines = [ln for ln in lines if ln.startswith(" ")]
        assert not lines, f"{path}: {lines}"


def test_every_environment_variable_is_read_in_config_and_documented():
    from nf4lab import config

    for path in _sources():
        if path == PACKAGE / "config.py":
            continue
        code = _code(path)
        reads = re.findall(r"environ(?:\.get\(\s*[\"'](NF4LAB_\w+)|\[\s*[\"'](NF4LAB_\w+)[\"']\s*\](?!\s*=))", code)
        assert not reads, f"{path}: reads {reads} itself; nf4lab.config reads the environment"
    doc = (ROOT / "docs" / "DEVELOPING.md").read_text()
    block = doc.split("<!-- config:begin")[1].split("-->", 1)[1].split("<!-- config:end -->")[0].strip()
    assert block == config.markdown_table(), "docs/DEVELOPING.md's table differs from nf4lab.config.VARIABLES"
