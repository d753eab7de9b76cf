"""nf4lab.measure.profiling: the ncu command line, failure detection, and the CSV parser.

The parser is tested on hand-made fixtures in ncu's documented CSV format
(tests/fixtures/, invented values) and, once they are committed, on the real
CSVs measured by tools/profile_all.py under data/ncu/<gpu>/.
"""
import json
import re
import subprocess
import sys

import pytest

from nf4lab.measure import profiling as P

FIX = P.ROOT / "tests" / "fixtures"
RECORDED = sorted(p for p in P.NCU_DIR.glob("*/*.csv") if p.name.count(".") == 1) if P.NCU_DIR.exists() else []


def test_raw_page_parsed_into_kernels_with_units():
    ks = P.parse_csv((FIX / "ncu_raw_fixture.csv").read_text())
    assert [k["id"] for k in ks] == ["0", "1"]
    assert ks[0]["kernel"].startswith("example_kernel_a")
    m = ks[0]["metrics"]
    assert m["gpu__time_duration.sum"] == {"value": 1012345.5, "unit": "nsecond", "section": ""}
    assert m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"]["value"] == 16777216.0
    assert ks[1]["metrics"]["smsp__pcsamp_warps_issue_stalled_long_scoreboard"]["value"] == "n/a"


def test_summary_numbers():
    a, b = P.parse_csv((FIX / "ncu_raw_fixture.csv").read_text())
    s = P.summarize(a)
    assert s["duration_us"] == pytest.approx(1012.3455)
    assert s["dram_pct"] == 61.5 and s["achieved_occupancy"] == 87.3 and s["registers"] == 22
    assert s["ld_sectors_per_request"] == 4.0 and s["st_sectors_per_request"] == 4.0
    assert s["dram_read_bytes"] == 134250000
    assert s["stalls"][0] == ("long_scoreboard", 41.25)
    assert "selected" not in [r for r, _ in s["stalls"]]
    assert s["stall_unit"] == "cycles per issued instruction"
    t = P.summarize(b)
    assert t["st_sectors_per_request"] == 16.0 and t["ld_sectors_per_request"] == 4.0
    assert P.main_kernel([a, b]) is a  # the longest one


def test_details_page_parsed_by_display_names():
    ks = P.parse_csv((FIX / "ncu_details_fixture.csv").read_text())
    assert len(ks) == 1
    s = P.summarize(ks[0])
    assert s["dram_pct"] == 61.5 and s["achieved_occupancy"] == 87.3
    assert s["duration_us"] == pytest.approx(1012.35)  # unit "us"
    assert s["ld_sectors_per_request"] is None  # not on the details page
    assert s["block_size"] == 256


def test_table_and_rows():
    a, b = P.parse_csv((FIX / "ncu_raw_fixture.csv").read_text())
    text = P.table({"a": P.summarize(a), "b": P.summarize(b)})
    lines = text.splitlines()
    assert "DRAM %" in lines[0] and len(lines) == 4
    assert lines[3].split()[0] == "b" and "16.0" in lines[3] and "long_scoreboard" in lines[3]
    rows = P.rows({"a": P.summarize(a)})
    assert rows[0]["version"] == "a" and rows[0]["top_stalls"].startswith("long_scoreboard 41.2")


def test_noise_and_empty_input():
    assert P.parse_csv("") == []
    assert P.parse_csv("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n") == []
    assert P.to_number("1,234.5") == 1234.5 and P.to_number("n/a") is None and P.to_number("") is None


def test_command_line():
    cmd = P.ncu_command(["python", "x.py"], ncu="ncu", kernel_regex="dequant", launch_skip=3, launch_count=1)
    s = " ".join(cmd)
    for sec in ("SpeedOfLight", "MemoryWorkloadAnalysis", "Occupancy", "WarpStateStats", "SourceCounters"):
        assert f"--section {sec}" in s
    assert "--csv --page raw" in s and "--kernel-name regex:dequant" in s
    assert "--launch-skip 3 --launch-count 1" in s and "--profile-from-start off" in s
    assert cmd[-2:] == ["python", "x.py"]
    assert "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum" in s
    exp = P.ncu_command(["p"], export="r.ncu-rep")
    assert "--export" in exp and "--csv" not in exp
    with pytest.raises(ValueError):
        P.ncu_command(["p"], page="source")


def test_shell_lines_keep_every_token_of_the_command():
    """The terminal recipe notebook 08 prints is ncu_command's own list: every section and metric, in order."""
    cmd = P.ncu_command(["python", "my_script.py"], profile_from_start=True, kernel_regex="k", launch_skip=2,
                        launch_count=1)
    text = P.shell_lines(cmd, "> my.csv")
    assert text.endswith("python my_script.py > my.csv") and "--launch-skip 2" in text
    assert re.sub(r"\\\n\s*", "", text).split() == cmd + [">", "my.csv"]   # the line breaks add nothing
    assert all(f"--section {s}" in text for s in P.SECTIONS) and all(m in text for m in P.METRICS)


def test_full_warps_register_limit_reads_the_recorded_attributes():
    m = {"device__attribute_max_registers_per_multiprocessor": {"value": 65536.0},
         "device__attribute_max_threads_per_multiprocessor": {"value": 2048.0}}
    assert P.full_warps_register_limit({"metrics": m}) == 32
    assert P.full_warps_register_limit({"metrics": {}}) is None and P.full_warps_register_limit(None) is None


def test_failures_are_classified():
    perm = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    assert P.classify_failure(perm, 1).reason == "permission"
    assert P.classify_failure("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", 1).reason == \
        "unsupported"
    assert P.classify_failure("==WARNING== No kernels were profiled.", 0).reason == "failed"
    assert P.classify_failure("something broke", 3).reason == "failed"
    assert P.classify_failure('"ID","Process ID"\n"0","1"', 0) is None
    with pytest.raises(P.NcuUnavailable) as e:
        P.run_ncu(["/nonexistent/ncu-xyz", "--version"])
    assert e.value.reason == "missing"
    with pytest.raises(P.NcuUnavailable) as e:
        P.run_ncu([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5)
    assert e.value.reason == "timeout"
    with pytest.raises(P.NcuUnavailable) as e:
        P.run_ncu([sys.executable, "-c", f"print({perm!r}); raise SystemExit(1)"])
    assert e.value.reason == "permission"


def test_source_page_parser():
    text = ('"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"\n'
            '"0x10","LDG.E R2, [R4.64]","120","100"\n"0x20","STG.E [R6.64], R2","30","20"\n"0x30","EXIT","0","0"\n')
    top = P.parse_source_csv(text)
    assert [t["source"] for t in top] == ["LDG.E R2, [R4.64]", "STG.E [R6.64], R2"]
    assert top[0]["pct"] == pytest.approx(80.0)
    assert P.parse_source_csv("nothing here") == []


def test_fixture_is_labelled_not_a_measurement():
    fx = P.load_fixture()
    assert "not a measurement" in fx["gpu"]


def test_slug():
    assert P.version_slug("03: packed u32 stores (x2)") == "03_packed_u32_stores_x2"


@pytest.mark.skipif(not RECORDED, reason="no ncu CSVs recorded under data/ncu/ yet")
@pytest.mark.parametrize("path", RECORDED, ids=[p.parent.name + "/" + p.name for p in RECORDED])
def test_recorded_csvs_parse(path):
    ks = P.parse_csv(path.read_text())
    assert ks, f"{path} holds no kernel"
    s = P.summarize(P.main_kernel(ks))
    assert s["duration_us"] and s["duration_us"] > 0
    assert s["dram_pct"] is not None and 0 < s["dram_pct"] <= 100
    assert s["achieved_occupancy"] is not None
    assert s["ld_sectors_per_request"] is not None and s["st_sectors_per_request"] is not None
    assert s["stalls"], "no stall reasons parsed"


def test_load_recorded_is_none_without_profiles(monkeypatch, tmp_path):
    monkeypatch.setattr(P, "NCU_DIR", tmp_path / "ncu")
    assert P.recorded_gpus() == [] and P.load_recorded() is None
    (tmp_path / "ncu" / "Some GPU").mkdir(parents=True)   # a GPU's folder without CSVs is no profile either
    assert P.recorded_gpus() == [] and P.load_recorded() is None


@pytest.mark.skipif(not RECORDED, reason="no ncu CSVs recorded under data/ncu/ yet")
def test_load_recorded_matches_files():
    rec = P.load_recorded()
    assert rec["versions"] and all(v["summary"] for v in rec["versions"].values())


@pytest.mark.skipif(not RECORDED, reason="no ncu CSVs recorded under data/ncu/ yet")
def test_load_recorded_prefers_the_results_gpu_and_falls_back(monkeypatch):
    gpus = P.recorded_gpus()
    # The GPU whose results are shown (NF4LAB_RESULTS_GPU stands in for the GPU in hand) wins when
    # it has profiles; a GPU without any (an H200 today) gets another GPU's, named in rec["gpu"].
    monkeypatch.setenv("NF4LAB_RESULTS_GPU", gpus[0])
    assert P.load_recorded()["gpu"] == gpus[0]
    monkeypatch.setenv("NF4LAB_RESULTS_GPU", "Some GPU with no profiles")
    rec = P.load_recorded()
    assert rec["gpu"] in gpus and rec["versions"]


def test_module_cli_table_runs():
    out = subprocess.run([sys.executable, "-m", "nf4lab.measure.profiling", "table", str(FIX / "ncu_raw_fixture.csv")],
                         capture_output=True, text=True, timeout=120, cwd=P.ROOT)
    assert out.returncode == 0 and "DRAM %" in out.stdout


# Real ncu 2025.3.1 output of the demo kernel (per byte, synthetic inputs, 16384x16384) on an
# H100, written by `python tools/profile_all.py --demo --synthetic`: the format as ncu writes it.
REAL = FIX / "ncu_h100_demo"


def test_real_raw_page_from_h100():
    ks = P.parse_csv((REAL / "demo.csv").read_text())
    assert len(ks) == 1 and ks[0]["kernel"].startswith("dequant_demo_per_byte")
    s = P.summarize(ks[0])
    assert 100 < s["duration_us"] < 5000
    assert 0 < s["dram_pct"] < 100 and 0 < s["achieved_occupancy"] <= 100
    assert s["theoretical_occupancy"] == 100 and s["registers"] > 0 and s["block_size"] == 256
    # two 16-bit stores at stride 2 elements: each warp store instruction spans 4 sectors
    assert s["st_sectors_per_request"] == pytest.approx(4.0, abs=0.01)
    assert s["stall_unit"] == "cycles per issued instruction"
    assert s["stalls"][0][0] == "long_scoreboard"
    assert s["dram_read_bytes"] > 1e8 and s["dram_write_bytes"] > 5e8  # 128 MiB codes, 512 MiB out


def test_real_details_page_agrees_with_raw_page():
    raw = P.summarize(P.parse_csv((REAL / "demo.csv").read_text())[0])
    det = P.summarize(P.parse_csv((REAL / "demo.details.csv").read_text())[0])
    for f in ("duration_us", "dram_pct", "memory_pct", "achieved_occupancy", "registers",
              "ld_sectors_per_request", "st_sectors_per_request"):
        assert det[f] == pytest.approx(raw[f], rel=0.01), f


def test_real_source_page_maps_stalls_to_python_lines():
    top = P.parse_source_csv((REAL / "demo.source.csv").read_text())
    assert top and "scale = ops.fadd_rn" in top[0]["source"] and top[0]["line"].isdigit()
    assert sum(t["pct"] for t in top) <= 100.0 + 1e-9
    assert all(t["sass"] for t in top)


@pytest.mark.slow
def test_notebook_08_runs_and_never_presents_the_fixture_as_a_measurement(notebook_twins):
    """The notebook's simulator run; its exercise (waits_for) is graded on a recorded source page, so it
    fails on the student's stub and passes on the solution wherever a profile is recorded."""
    text, student = notebook_twins("08_profiling")
    if P.load_recorded() is None:
        assert "No profile recorded yet" in text and "NOT A MEASUREMENT" in text
    else:
        assert "recorded profiles: data/ncu/" in text and "NOT A MEASUREMENT" not in text
        assert "NOT PASSED" not in text, "a solution fails its own checker"
        assert "NOT PASSED" in student, "an unsolved exercise should fail its checker (cleanly)"


def test_a_failing_program_says_why():
    out = ("==PROF== Connected to process 1\nTraceback (most recent call last):\n  File x\n"
           "numba.cuda.cudadrv.nvvm.NvvmError: Failed to compile\n"
           "==ERROR== The application returned an error code (1).\n")
    exc = P.classify_failure(out, 1)
    assert exc.reason == "failed" and "NvvmError: Failed to compile" in str(exc)


def test_profile_version_retries_without_lineinfo(tmp_path, monkeypatch):
    """numba-cuda cannot compile some kernels with lineinfo: profile them without it."""
    calls = []

    def fake_run(cmd, *, timeout=600, env=None, cwd=None):
        if "--import" in cmd:
            return ""
        calls.append(dict(env or {}).get("NF4LAB_LINEINFO"))
        if calls[-1] != "0":
            raise P.NcuUnavailable("failed", "ncu failed (exit status 1): ==ERROR== The application returned "
                                   "an error code (1). | program: NvvmError")
        return ""

    monkeypatch.setattr(P, "run_ncu", fake_run)
    monkeypatch.setattr(P, "parse_csv", lambda text: [])
    res = P.profile_version("06_output_dtypes", "v", tmp_path, ncu="ncu", source=False)
    assert calls == [None, "0"] and res["lineinfo"] is False


def test_earlier_kernel_lines_name_each_replaced_profile():
    rec = {"versions": {"a": {"date": "2026-11-22 12:09 UTC"},
                        "b": {"date": "2026-11-22 14:05 UTC", "earlier_kernel": "replaced on 2026-11-26"}}}
    assert P.earlier_kernel_lines(rec) == ["  EARLIER kernel: b, profiled 2026-11-22 14:05 UTC: replaced on 2026-11-26"]
    assert P.earlier_kernel_lines(None) == [] and P.earlier_kernel_lines({"versions": {}}) == []


def test_stall_legend_explains_every_reason_the_parser_finds():
    lines = P.stall_legend(["long_scoreboard", "barrier", "long_scoreboard", "made_up"])
    assert len(lines) == 3 and lines[0].startswith("long_scoreboard") and "global" in lines[0]
    assert "not described here" in lines[2]
    assert set(P.SOURCE_STALLS.values()) <= set(P.STALL_MEANINGS)
    for path in RECORDED:   # every reason a recorded profile gives has its meaning
        s = P.summarize(P.main_kernel(P.parse_csv(path.read_text())))
        assert {r for r, _ in s["stalls"]} <= set(P.STALL_MEANINGS), path


def test_ceiling_record_is_the_named_gpus_own(monkeypatch, tmp_path):
    from nf4lab.measure import bench, results

    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "ROOT", tmp_path)
    assert P.ceiling_record("NVIDIA Fake 1") is None and P.ceiling_record(None) is None

    def rec(name, gbps):
        return {"name": name, "kind": "ceiling", "shape": [16384, 16384], "dtype": "bf16", "ms": 1.0, "gbps": gbps}

    results.save({"meta": {"gpu": "NVIDIA Fake 1", "date": "d0"}, "records": [rec(bench.COPY, 3000.0)]}, "00_ceiling")
    got = P.ceiling_record("NVIDIA Fake 1")
    assert got["notebook"] == "00_ceiling" and got["copy_gbps"] == 3000.0 and got["bound_gbps"] is None
    assert got["spec_peak_gbps"] is None   # a record without the datasheet's peak
    results.save({"meta": {"gpu": "NVIDIA Fake 1", "date": "d1"},
                  "records": [rec(bench.COPY, 3010.0), rec(bench.BOUND, 2900.0), rec(bench.SPEC_PEAK, 3350.0)]},
                 "07_summary")
    got = P.ceiling_record("NVIDIA_Fake_1")   # the folder's name works as well as the GPU's
    assert got["notebook"] == "07_summary" and got["bound_gbps"] == 2900.0 and got["date"] == "d1"
    assert got["spec_peak_gbps"] == 3350.0
    assert P.ceiling_record("NVIDIA Fake 2") is None


def test_where_to_look_names_another_gpus_profiles():
    """02 and 03 send a student to 08 to explain a timing: a profile recorded on another GPU is named as such (on an
    H200, 03's loss pointed to H100 profiles that show a gain), the same GPU's profiles are offered as they are."""
    from nf4lab.measure import profiling

    gpus = profiling.recorded_gpus()
    assert gpus, "no profile recorded under data/ncu"
    other = profiling.where_to_look("A GPU with no profiles")
    assert "live profile" in other and "the recorded profiles are of the" in other
    name = next(iter(profiling.load_recorded(gpus[0])["versions"]))
    same = profiling.where_to_look(gpus[0].replace("_", " "), [name])
    assert same.startswith("08's profiles of this GPU")
    assert "live profile" in profiling.where_to_look(gpus[0].replace("_", " "), ["a version never profiled"])


def test_where_to_look_tells_how_to_profile_each_kernel_live():
    """08 profiles one version per execution, the one its VERSION variable names: a pointer to 08's live profile
    says to set VERSION to each kernel named, and names them."""
    from pathlib import Path

    from nf4lab.measure import profiling

    src = (Path(__file__).resolve().parents[1] / "notebooks" / "src" / "08_profiling.py").read_text()
    assert re.search(r"^VERSION = ", src, re.M), "08 no longer selects its live profile by VERSION"
    names = ["01 naive (per byte)", "02 grid-stride (full occupancy)"]
    for text in (profiling.where_to_look("A GPU with no profiles", names),
                 profiling.where_to_look(profiling.recorded_gpus()[0].replace("_", " "), ["a version never profiled"])):
        assert "live profile" in text and "`VERSION`" in text and "one version per execution" in text
    text = profiling.where_to_look("A GPU with no profiles", names)
    assert all(n in text for n in names)


def test_hottest_is_the_most_sampled_instruction_with_its_share():
    prog = [{"addr": 0x100, "sass": "LDG.E R1, [R2.64]", "samples": 1.0, "line": "3"},
            {"addr": 0x110, "sass": "IADD3 R3, R1, R4", "samples": 3.0, "line": "4"},
            {"addr": 0x120, "sass": "STG.E [R2.64], R3", "samples": 0.0, "line": "5"}]
    hot = P.hottest(prog)
    assert hot["sass"] == "IADD3 R3, R1, R4" and hot["line"] == "4"
    assert hot["share"] == pytest.approx(0.75) and hot["offset"] == 0x10
    assert "share" not in prog[1] and P.hottest([]) is None


def _notebook_operands():
    """Notebook 08's own ``operands`` (registers written and read by a SASS instruction), from its source."""
    import collections
    import csv
    import re

    src = (P.ROOT / "notebooks" / "src" / "08_profiling.py").read_text()
    ns = {"profiling": P, "csv": csv, "re": re, "collections": collections}
    exec(src[src.index("NO_DEST = "):src.index("prog = program(source_page)")], ns)
    return ns["operands"]


def test_show_hot_spot_splits_the_stalls_and_flags_an_address_writer(capsys):
    """08's exercise, once solved, prints the hot instruction's share and the split of its stall reasons, and warns
    where the walk's first writer computes an address for an instruction that uses the register as data."""
    from nf4lab.lesson import exercises

    operands = _notebook_operands()

    def listing(rows):
        return [{"addr": 16 * k, "sass": sass, "samples": n, "line": str(k), "source": "src", "stalls": st}
                for k, (sass, n, st) in enumerate(rows)]

    data = listing([("LDG.E.U8 R25, desc[UR8][R24.64]", 1.0, {}), ("IMAD.WIDE.U32 R22, R25, 0x4, R22", 1.0, {}),
                    ("SHF.R.U32.HI R21, RZ, 0x10, R22", 8.0, {"long_scoreboard": 90.0, "not_selected": 10.0})])
    exercises.show_hot_spot(data, 2, operands, "page")
    out = capsys.readouterr().out
    assert "80.0% of the page's samples, issued ones included" in out and "90% waits for an operand" in out
    assert "10% ready warps or a busy pipe" in out and "the walk ends at: global load" in out
    assert "if this is the path the operand took" in out and "another use of the same register" in out
    address = listing([("LDG.E.U8 R25, desc[UR8][R24.64]", 1.0, {}), ("IMAD.WIDE.U32 R22, R25, 0x4, R22", 3.0,
                                                                       {"long_scoreboard": 5.0})])
    exercises.show_hot_spot(address, 1, operands, "page")
    assert "another use of the same register" not in capsys.readouterr().out   # an address from a loaded byte
    tid = listing([("S2R R8, SR_TID.X", 0.0, {}), ("SHF.R.S32.HI R9, RZ, 0x1f, R8", 4.0,
                                                   {"not_selected": 3.0, "math_pipe_throttle": 1.0})])
    exercises.show_hot_spot(tid, 1, operands, "page")
    out = capsys.readouterr().out
    assert "0% waits for an operand" in out and "100% ready warps or a busy pipe" in out
    assert "the walk ends at: special register" in out


def test_notebook_08_shows_no_recipe_of_its_exercise():
    """The student's notebook must not show, outside the exercise, the lines that answer it: the hottest
    instruction's index (a max over the samples) or the writer it waits for (the walk's first step)."""
    import nbformat

    nb = nbformat.read(P.ROOT / "notebooks" / "08_profiling.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for giveaway in ('["samples"])', "walk_to_load(", "_last_writer(", "chain[1]"):
        assert giveaway not in code, giveaway


def _planted(tmp_path, monkeypatch, entries):
    d = tmp_path / "Some_GPU"
    d.mkdir(exist_ok=True)
    (d / "a.csv").write_text("")
    (d / "index.json").write_text(json.dumps({"meta": {"date": "2026-11-29 15:00 UTC"}, "versions": entries}))
    monkeypatch.setattr(P, "NCU_DIR", tmp_path)
    monkeypatch.setattr(P, "ROOT", tmp_path)
    return P.load_recorded("Some_GPU")


def test_a_profile_whose_kernel_source_changed_is_labelled_earlier(tmp_path, monkeypatch):
    """The profiler stores each version's source hash (the one the notebooks' result records carry); a recorded
    profile whose hash is not the notebook's kernel now is an EARLIER kernel, with no note kept by hand."""
    name = "01 naive (per byte)"
    now = P.source_hashes("01_naive")[name]
    assert len(now) == 16
    rec = _planted(tmp_path, monkeypatch, [
        {"name": name, "notebook": "01_naive", "file": "a.csv", "source_sha256": now},
        {"name": "gone", "notebook": "01_naive", "file": "a.csv", "source_sha256": "0" * 16},
        {"name": "before hashes", "notebook": "01_naive", "file": "a.csv"}])
    v = rec["versions"]
    assert "earlier_kernel" not in v[name] and "kernel taught now" in P.row_label(name, v[name])
    assert "no longer defines" in v["gone"]["earlier_kernel"] and "EARLIER" in P.row_label("gone", v["gone"])
    assert "earlier_kernel" not in v["before hashes"]      # older profiles keep index.json's own notes
    assert len(P.earlier_kernel_lines(rec)) == 1

    changed = _planted(tmp_path, monkeypatch, [
        {"name": name, "notebook": "01_naive", "file": "a.csv", "source_sha256": "1" * 16}])["versions"][name]
    assert changed["earlier_kernel"] == f"01_naive's kernel source changed since (profiled {'1' * 16}, now {now})"


def test_a_notebook_whose_kernel_cells_do_not_load_marks_no_profile(tmp_path, monkeypatch):
    """When a notebook's kernel cells fail to load here, nothing is known about its kernels now: its profiles keep
    their label instead of being called versions the notebook no longer defines."""
    assert P.source_hashes("99_no_such_notebook") is None
    rec = _planted(tmp_path, monkeypatch, [{"name": "v", "notebook": "99_no_such_notebook", "file": "a.csv",
                                            "source_sha256": "2" * 16}])
    assert "earlier_kernel" not in rec["versions"]["v"]
