"""A kernel loaded from its notebook (harness.versions) must hash as it did when its own notebook recorded it:
records of one kernel in two notebooks are then recognisably the same kernel (provenance.source_hash)."""
import json

import pytest

from nf4lab.harness import versions
from nf4lab.measure import provenance, results


def _own_records():
    out = []
    for gpu in [results.default_gpu()] if results.default_gpu() else []:   # the book's last run: current sources
        for stem in ("01_naive", "02_grid_stride", "03_packed_u32"):
            path = results.RESULTS_DIR / gpu / f"{stem}.json"
            if path.exists():
                run = json.loads(path.read_text())
                out += [(stem, r["name"], r["source_sha256"]) for r in run["records"]
                        if r["kind"] == "kernel" and r["name"][:2] == stem[:2] and r.get("source_sha256")]
    return out


def test_a_loaded_kernel_has_its_source_and_the_hash_its_notebook_recorded():
    mod = versions.load_module("01_naive")
    launch = next(iter(mod.VERSIONS.values()))
    assert "def " in provenance._source(launch)   # the text, not the bytecode fallback
    own = _own_records()
    if not own:
        pytest.skip("no recorded run of 01-03")
    loaded = {}
    for stem, name, recorded in own:
        fns = loaded.setdefault(stem, versions.load(stem))
        assert provenance.source_hash(fns[name]) == recorded, (stem, name)
