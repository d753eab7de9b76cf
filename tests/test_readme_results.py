"""The front page and the generated results pages: the README stays a front page, and every record whose
kernel is no longer the shipped one is labelled as such by tools/readme_results.py."""
import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("readme_results", ROOT / "tools" / "readme_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; run logs belong in docs/results.md"


@pytest.mark.parametrize("name, kernel", [("07_summary", "dequant"), ("dequantize", "dequant"),
                                          ("exactness_sm75", "dequant"), ("09_gemv_tc", "gemv"),
                                          ("models_compiled_ab_3", "gemv"), ("launch_cost", "dequant")])
def test_a_record_older_than_the_shipped_kernel_is_labelled(name, kernel):
    tool = _tool()
    first = tool.SHIPPED[kernel][2]
    before = {"date": "2026-01-01 00:00 UTC"}
    assert tool.earlier(name, before) == "recorded 2026-01-01 00:00 UTC with an earlier kernel"
    assert tool.stamp(name, before).startswith("recorded 2026-01-01")
    newest = max(v[2] for v in tool.SHIPPED.values())
    assert tool.earlier(name, {"date": newest}) == "" and tool.stamp(name, {"date": newest}) == newest
    assert first <= newest


def test_an_end_to_end_record_older_than_the_host_path_is_labelled():
    """nf4lab.dequantize end to end times the host path too: a record of the shipped kernel made before the host
    path changed says so; a GPU-time record of the same date does not (the host path is not in its time)."""
    tool = _tool()
    kernel, host = tool.SHIPPED["dequant"][2], tool.SHIPPED["dequant_host"][2]
    assert kernel < host
    assert tool.earlier("dequantize", {"date": kernel}) == f"recorded {kernel} with an earlier host path"
    assert tool.earlier("07_summary", {"date": kernel}) == ""
    assert tool.earlier("dequantize", {"date": host}) == ""


def test_a_bound_that_runs_no_shipped_kernel_is_not_labelled():
    tool = _tool()
    assert tool.earlier("09_read_bound", {"date": "2026-01-01 00:00 UTC"}) == ""


def test_the_shipping_commits_exist_and_follow_their_first_runs():
    tool = _tool()
    for what, commit, first in tool.SHIPPED.values():
        p = subprocess.run(["git", "-C", str(ROOT), "show", "-s", "--format=%cd", "--date=format-local:%Y-%m-%d %H:%M UTC",
                            commit], capture_output=True, text=True, env={"TZ": "UTC", "PATH": "/usr/bin:/bin"})
        if p.returncode != 0:
            pytest.skip(f"git history without {commit} (a shallow clone)")
        assert first <= p.stdout.strip(), f"{what}: its first run {first} is after the commit that shipped it"


DOCS = ["README.md", "docs/DEVELOPING.md", "docs/instructors.md", "docs/results.md", "docs/package.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_repository_path_a_doc_names_exists(doc):
    """A path in backticks under one of the repository's folders, or a relative link, must exist (placeholders
    such as <gpu> or NN_topic aside): a reader who follows it must find the file."""
    import re

    path = ROOT / doc
    if not path.exists():
        pytest.skip(f"{doc} does not exist")
    text = path.read_text()
    named = set(re.findall(r"`((?:nf4lab|tools|lab|tests|notebooks|data|docs|\.ci)/[A-Za-z0-9_./\-]*)`", text))
    text = re.sub(r"`[^`]*`", "", text)   # links only outside code: `kernel[grid, block](args)` is no link
    named |= set(re.findall(r"`((?:nf4lab|tools|lab|tests|notebooks|data|docs|\.ci)/[A-Za-z0-9_./\-]*)`", text))
    linked = {t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t and not t.startswith("mailto:")}
    # folders made on demand and ignored by git (data/cache/) exist on a user's machine, not in a clone
    ignored = {ln.strip().lstrip("/") for ln in (ROOT / ".gitignore").read_text().splitlines() if ln.strip()}
    missing = [p for p in sorted(named) if "NN" not in p and p not in ignored and not (ROOT / p).exists()]
    missing += [t for t in sorted(linked) if not (path.parent / t).exists()]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_a_notebook_label_names_a_record_of_a_replaced_kernel(tmp_path, monkeypatch):
    """Without a GPU the notebooks print a recorded GPU's runs through results.label: a run older than the shipped
    kernel it measured says so there too (09 on a laptop showed an H100 GEMV record of a replaced kernel unlabelled),
    and the name load() keeps in memory is not written back by save()."""
    import json

    from nf4lab.measure import results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path / "data" / "results")
    meta = {"gpu": "Some GPU", "date": "2026-01-01 00:00 UTC", "run": "abc"}
    path = results.save({"meta": meta, "records": []}, "09_fused_gemv_notebook", gpu="Some GPU")
    data = results.load("09_fused_gemv_notebook", "Some GPU")
    assert data is not None, path
    assert "with an earlier kernel, not the shipped one" in results.label(data["meta"])
    results.save(data, "09_fused_gemv_notebook", gpu="Some GPU")
    assert "record" not in json.loads(path.read_text())["meta"]
    assert "earlier kernel" not in results.label({**meta, "record": "09_read_bound"})   # a bound runs no shipped kernel
    newest = max(v[2] for v in results.SHIPPED.values())
    assert "earlier kernel" not in results.label({**meta, "date": newest, "record": "09_fused_gemv_notebook"})
