"""Outputs go stale with everything they come from: code cells, prose that states a number, and
the kernel cells of the notebooks that 07 and 08 load through nf4lab's loader."""
import json

import nbformat

from nf4lab.measure import nbclean


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    for kind, src in cells:
        nb.cells.append(nbformat.v4.new_code_cell(src) if kind == "code" else nbformat.v4.new_markdown_cell(src))
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="2891 GB/s\n")]
    return nb


def test_a_changed_number_in_prose_makes_outputs_stale():
    nb = _nb(("code", "print(run)"), ("markdown", "The kernel reaches 99% of the bound."), ("markdown", "Why."))
    nbclean.record(nb)
    assert nbclean.stale(nb) is None
    nb.cells[2].source = "Why, in other words."          # prose without a number: not a result
    assert nbclean.stale(nb) is None
    nb.cells[1].source = "The kernel reaches 97% of the bound."
    assert "markdown cell with a number" in nbclean.stale(nb)


def test_a_record_without_hash_version_hashes_code_only():
    nb = _nb(("code", "print(run)"), ("markdown", "99%"))
    nb.metadata["nf4lab"] = {"code_sha256": nbclean.code_hash(nb, 1)}
    nb.cells[1].source = "97%"
    assert nbclean.stale(nb) is None
    nb.cells[0].source = "print(run2)"
    assert "a code cell changed" in nbclean.stale(nb)


def test_a_loaded_notebooks_kernel_change_makes_outputs_stale(tmp_path, monkeypatch):
    from nf4lab.harness import versions

    def write(stem, src):
        nb = nbformat.v4.new_notebook()
        nb.cells.append(nbformat.v4.new_code_cell(src, metadata={"tags": ["kernel"]}))
        nb.cells.append(nbformat.v4.new_code_cell("print('not a kernel cell')"))
        (tmp_path / f"{stem}.ipynb").write_text(json.dumps(nb))

    write("01_naive", "VERSIONS = {'a': 1}")
    write("04_vector_loads", "VERSIONS = {'b': 2}")
    monkeypatch.setattr(versions, "NOTEBOOKS", tmp_path)
    summary = _nb(("code", "from nf4lab.harness import versions\nV = versions.load_all()"))
    one = _nb(("code", "from nf4lab.harness import versions\nV = versions.load('04_vector_loads')"))
    assert nbclean.loaded_notebooks(summary) == ["01_naive", "04_vector_loads"]
    assert nbclean.loaded_notebooks(one) == ["04_vector_loads"]
    for nb in (summary, one):
        nbclean.record(nb)
        assert nbclean.stale(nb) is None
    write("04_vector_loads", "VERSIONS = {'b': 3}")
    assert "loaded notebook" in nbclean.stale(summary) and "loaded notebook" in nbclean.stale(one)


def test_only_kernel_loads_count_and_the_profilers_do():
    """A results file loaded by name (Run.load("07_summary")) is no kernel dependency; the profiler's
    step_versions() runs the kernel cells of notebooks 01-06, as 08 does."""
    from nf4lab.harness import versions

    stems = {p.stem for p in versions.NOTEBOOKS.glob("0[1-6]_*.ipynb")}
    records = _nb(("code", "from nf4lab.harness import versions\nrun = bench.Run.load('07_summary')\n"
                           "x = bench.run_versions(V, case)"))
    assert nbclean.loaded_notebooks(records) == []
    profiler = _nb(("code", "todo = profiling.step_versions()"))
    assert set(nbclean.loaded_notebooks(profiler)) == stems


def test_a_link_target_states_no_result_but_its_text_does():
    nb = _nb(("code", "print(run)"), ("markdown", "Next: [02 · grid-stride loop](02_grid_stride.ipynb)"))
    nbclean.record(nb)
    nb.cells[1].source = "Next: [02 · grid-stride loop](../02_grid_stride.ipynb)"   # where the file is
    assert nbclean.stale(nb) is None
    nb.cells[1].source = "Next: [03 · packed stores](../02_grid_stride.ipynb)"
    assert "markdown cell with a number" in nbclean.stale(nb)


def test_the_build_carries_a_valid_record_over_to_the_current_hash(tmp_path):
    """A notebook executed under an older hash version keeps fresh outputs through a rebuild that changes
    only what the current version leaves out; a stale one stays stale."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("build_notebooks", Path(__file__).parent.parent / "tools" / "build_notebooks.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for valid in (True, False):
        old = _nb(("code", "print(run)"), ("markdown", "Next: [02](02_grid_stride.ipynb)"))
        old.metadata["nf4lab"] = {"code_sha256": nbclean.code_hash(old, 2) if valid else "0" * 64, "hash_version": 2}
        path = tmp_path / f"nb{valid}.ipynb"
        nbformat.write(old, path)
        new = _nb(("code", "print(run)"), ("markdown", "Next: [02](../02_grid_stride.ipynb)"))
        new.cells[0].outputs = []
        build.keep_outputs(new, path)
        assert new.cells[0].outputs and (nbclean.stale(new) is None) == valid
