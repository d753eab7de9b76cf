"""Harness pieces that work without a GPU: byte model, results files, refusal to fake timings, plots."""
import json
import subprocess
import sys

import pytest

import nf4lab
from nf4lab.measure import bench, results
from nf4lab.format import bytemodel


def test_byte_model_matches_the_definition():
    n = 16384 * 16384
    assert bytemodel.bytes_moved(n, "bf16") == n // 2 + n // 64 + 4 * (n // 16384) + 1024 + 2 * n
    assert bytemodel.bytes_moved(n, "fp32") - bytemodel.bytes_moved(n, "bf16") == 2 * n
    # odd counts round up: 3 weights = 2 packed bytes, one block, one group
    assert bytemodel.bytes_moved(3, "fp16") == 2 + 1 + 4 + 1024 + 6
    assert bytemodel.bytes_moved(128, "bf16", nested=False) == 64 + 4 * 2 + 256
    assert sum(bytemodel.breakdown(n).values()) == bytemodel.bytes_moved(n)
    assert bytemodel.gbps(1e9, 1.0) == pytest.approx(1000.0)


def test_finalize_relates_records_to_ceilings_and_bitsandbytes():
    rec = lambda kind, name, ms, gbps: {"kind": kind, "name": name, "shape": [4, 4], "dtype": "bf16",
                                        "ms": ms, "gbps": gbps}
    run = bench.Run(meta={"gpu": "Test GPU"}, records=[
        rec("ceiling", bench.COPY, 1.0, 3000.0), rec("ceiling", bench.FILL, 1.0, 3200.0),
        rec("baseline", bench.BNB_GPU, 0.3, 2000.0), rec("kernel", "06 best", 0.2, 3100.0)])
    run.finalize()
    k = run.get("06 best")
    assert k["pct_copy"] == pytest.approx(100 * 3100 / 3000)
    assert k["pct_fill"] == pytest.approx(100 * 3100 / 3200)
    assert k["speedup_vs_bnb"] == pytest.approx(1.5)
    assert "06 best" in run.table()
    assert "host time" not in run.table()


def test_table_says_which_rows_are_host_time():
    """A wall-clock row's ratios set host time against GPU-time records: the table says so under it."""
    recs = [{"kind": "ceiling", "name": bench.COPY, "shape": [4, 4], "dtype": "bf16", "ms": 1.0, "gbps": 3000.0},
            {"kind": "baseline", "name": bench.BNB_E2E, "shape": [4, 4], "dtype": "bf16", "ms": 1.2, "gbps": 2500.0,
             "timing": bench.WALL_CLOCK}]
    run = bench.Run(meta={"gpu": "Test GPU"}, records=recs)
    run.finalize()
    assert f"{bench.BNB_E2E}: ms is host time per call, not GPU time" in run.table()


def test_results_round_trip_and_format(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "ROOT", tmp_path)
    run = bench.Run(meta={"gpu": "NVIDIA Fake 1", "date": "2026-11-22"},
                    records=[{"kind": "kernel", "name": "k", "shape": [2, 3], "dtype": "fp16", "ms": 1.0,
                              "gbps": 2.0}])
    path = run.save("07_summary")
    assert path == tmp_path / "NVIDIA_Fake_1" / "07_summary.json"
    data = json.loads(path.read_text())
    assert set(data) == {"meta", "records"}
    r = data["records"][0]
    for key in ("kind", "name", "shape", "dtype", "ms", "gbps", "pct_copy", "pct_fill", "speedup_vs_bnb",
                "bit_exact"):
        assert key in r
    back = bench.Run.load("07_summary", "NVIDIA Fake 1")
    assert back.recorded and back.records[0]["name"] == "k"


# Records that are not a timed kernel: tools/bench_launch.py's per-call costs, nf4lab.measure.models' decode, QLoRA
# and agreement records, and the GEMV's tolerance checks, with the fields each must carry.
OTHER_KINDS = {"launch": ("name", "op", "host_us", "per_call_us"),
               "decode": ("name", "variant", "tok_s", "new_tokens"),
               "decode_interleaved": ("name", "variant", "mode", "rounds", "tok_s", "tok_s_rounds", "new_tokens"),
               "qlora": ("name", "variant", "ms"),
               "agreement": ("name", "a", "b", "free", "forced"),
               "qlora_agreement": ("name", "loss_equal"),
               "profile": ("name", "mode", "top_kernels"),
               "decode_gaps": ("name", "tok_s", "step_ms", "busy_us", "span_us", "idle_us"),   # lab/decode_gaps.py
               "check": ("name", "shape", "dtype", "M", "ok", "worst_ratio"),   # tools/gpu_gemv_paths.py
               "guard_cost": ("name", "layer", "dict_tags", "guard_check_us", "per_layer_us")}   # lab/guard_cost.py


def test_committed_results_have_the_documented_fields():
    found = list(results.RESULTS_DIR.glob("*/*.json"))
    for p in found:
        data = json.loads(p.read_text())
        for key in ("gpu", "driver", "clocks", "date", "numba", "numba_cuda", "bitsandbytes", "torch", "method"):
            assert key in data["meta"], (p, key)
        for r in data["records"]:
            assert r["kind"] in ("kernel", "ceiling", "baseline", "bound", "exactness", "time") + tuple(OTHER_KINDS), p
            if r["kind"] in OTHER_KINDS:   # the model benchmark's and the launch-cost records
                for key in OTHER_KINDS[r["kind"]]:
                    assert key in r, (p, r["kind"], key)
                continue
            if r["kind"] == "exactness":  # a bit-exactness check, no timing: a case, an op or a notebook's version
                assert r["bit_exact"] in (True, False) and r.get("name"), p
                assert ("shape" in r and "dtype" in r) or "inputs" in r or "notebook" in r, p
                continue
            if r["kind"] == "time":  # how long a notebook took to execute
                assert r["seconds"] > 0 and r.get("name"), p
                continue
            for key in ("kind", "name", "shape", "dtype", "ms", "gbps"):
                assert key in r, (p, key)
            assert r["gbps"] is None or r["gbps"] > 0


@pytest.mark.skipif(nf4lab.ON_GPU, reason="checks the GPU-less behaviour")
def test_no_fake_timings_without_a_gpu():
    with pytest.raises(bench.NoGPUError):
        bench.gpu_time_ms(lambda s: None)
    p = subprocess.run([sys.executable, "-m", "nf4lab", "bench", "--shape", "64", "64"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "no usable CUDA GPU" in p.stderr


def test_step_in_the_simulator_shows_recorded_results_or_says_none(capsys):
    if nf4lab.ON_GPU:
        pytest.skip("measures on a GPU")
    run = bench.step("00_no_such_notebook", {})
    assert run is None and "no recorded GPU results" in capsys.readouterr().out


def test_plots_draw_ceilings_and_labels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from nf4lab.lesson import plots

    rec = lambda kind, name, gbps, **kw: dict({"kind": kind, "name": name, "shape": [8, 8], "dtype": "bf16",
                                               "ms": 0.1, "gbps": gbps, "bytes": 10 ** 8}, **kw)
    run = bench.Run(meta={"gpu": "G", "date": "d", "method": "m"}, records=[
        rec("ceiling", bench.COPY, 3000.0), rec("ceiling", bench.FILL, 3200.0),
        rec("baseline", bench.BNB_GPU, 2000.0), rec("kernel", "06 best", 2900.0)]).finalize()
    ax = plots.bars(run)
    assert ax.get_xlabel().startswith("effective bandwidth")
    assert len(ax.get_lines()) == 2  # the two ceilings
    ax = plots.sweep(run)
    assert ax.get_xscale() == "log" and ax.get_ylabel().endswith("GB/s")


def test_readme_results_block_is_generated_from_the_results_files():
    p = subprocess.run([sys.executable, str(results.ROOT / "tools" / "readme_results.py"), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_noise_bands_judge_as_printed_with_a_near_band():
    """One rule for every verdict against the noise margin: within it, past it but within twice it
    ("near": a pair this close can flip between executions), or beyond; a % of the bound likewise."""
    m = bench.NOISE_PCT
    assert bench.noise_band(m) == "within" and bench.noise_band(-m) == "within"
    assert bench.noise_band(m + 0.3) == "near" and bench.noise_band(-(m + 0.3)) == "near"
    assert bench.noise_band(2 * m) == "near" and bench.noise_band(2 * m + 0.1) == "beyond"
    assert bench.bound_band(100 - m) == "at" and bench.bound_band(101.5) == "at"
    assert bench.bound_band(100 - m - 0.2) == "near" and bench.bound_band(100 - 2 * m) == "near"
    assert bench.bound_band(100 - 2 * m - 0.1) == "below"
    # 99.0 and 98.8 (one session's two processes) no longer land on opposite sides of a verdict's ends
    assert {bench.bound_band(99.0), bench.bound_band(98.8)} <= {"at", "near"}


def test_run_to_run_line_computes_its_change_from_the_numbers_it_prints():
    """A kernel's GB/s here against another notebook's record of it: the printed change must follow from the two
    printed (rounded) GB/s, so a reader can check it (1764 against 1765 is -0.06%, not -0.0%)."""
    name = "03 packed u32 (grid-stride)"
    other = bench.Run(meta={"gpu": "Test GPU", "date": "2026-11-30 00:00 UTC"},
                      records=[{"kind": "kernel", "name": name, "shape": [4, 4], "dtype": "bf16", "gbps": 1765.4}])
    line = bench.run_to_run(name, {"gbps": 1763.6}, other, "03")
    assert line.startswith(f"run to run, {name}: 1764 GB/s here, 1765 GB/s in 03's record (")
    assert "Test GPU" in line and line.endswith("): -0.06%")


def test_change_pct_follows_from_the_gbps_as_printed():
    """A verdict line prints two GB/s rounded to whole numbers and the change between them: the change must be
    the one those printed numbers give (02 printed 1830 against 1532 GB/s as +19.4%, from the unrounded
    records; the printed numbers give +19.5%), judged to one decimal."""
    assert bench.change_pct({"gbps": 1829.6}, {"gbps": 1532.4}) == 19.5
    assert round(100 * (1829.6 / 1532.4 - 1), 1) == 19.4          # what the unrounded records give
    assert bench.change_pct({"gbps": 1849.4}, {"gbps": 1827.6}) == 1.1
    assert bench.change_pct({"gbps": 1531.0}, {"gbps": 1564.0}) == -2.1
    assert f"{bench.change_pct({'gbps': 4011.0}, {'gbps': 4012.0}):+.1f}" == "+0.0"   # not "-0.0"
