"""The Colab/Kaggle setup installs what the runtime lacks, with the NVVM its driver can load.

tools/setup_runtime.py runs as it does in a notebook's first cell, through its command line (--dry-run
prints the plan): in an interpreter without site-packages (-S) whose only installed distributions are the
runtime's, faked as dist-info folders, and with an nvidia-smi on PATH that reports the driver's CUDA version.
"""
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "setup_runtime.py"

COLAB = {"numba-cuda": "0.22.0", "bitsandbytes": None, "torch": "2.11.0+cu128", "numpy": "2.1.3",
         "cloudpickle": "3.1.1", "tqdm": "4.67.1", "matplotlib": "3.10.0"}


def plan(tmp_path, have: dict, cuda: int | None) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    for dist, version in have.items():
        if version is not None:
            info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    if cuda is not None:
        smi = bin_ / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '| NVIDIA-SMI 999.0   Driver Version: 999.0   CUDA Version: {cuda}.4 |'\n")
        smi.chmod(0o755)
    return subprocess.run([sys.executable, "-S", str(TOOL), "--dry-run"], capture_output=True, text=True,
                          timeout=120, env={"PATH": str(bin_), "PYTHONPATH": str(site)})


def installing(p) -> list[str]:
    assert p.returncode == 0, p.stdout + p.stderr
    line = p.stdout.strip().splitlines()[-1]
    return [] if line == "nothing to install" else line.removeprefix("installing: ").split()


def test_colab_t4_gets_cu12_numba_cuda_and_bitsandbytes_never_torch(tmp_path):
    reqs = installing(plan(tmp_path, COLAB, 12))
    assert reqs == ["numba-cuda[cu12]>=0.30.4,<0.31", "bitsandbytes==0.50.2"]
    assert not any(r.startswith(("torch", "numpy")) for r in reqs)


def test_cuda13_driver_gets_cu13(tmp_path):
    have = dict(COLAB, **{"numba-cuda": "0.30.4", "bitsandbytes": "0.50.2", "numpy": "2.5.2"})
    assert installing(plan(tmp_path, have, 13)) == ["numba-cuda[cu13]>=0.30.4,<0.31"]


def test_missing_small_packages_are_added_without_gpu(tmp_path):
    have = dict(COLAB, **{"numba-cuda": "0.30.4", "bitsandbytes": "0.50.2", "tqdm": None})
    assert installing(plan(tmp_path, have, None)) == ["tqdm"]


def test_nothing_is_installed_when_complete_without_gpu(tmp_path):
    have = dict(COLAB, **{"numba-cuda": "0.30.4", "bitsandbytes": "0.50.2", "tqdm": "4.67"})
    assert installing(plan(tmp_path, have, None)) == []


def test_too_old_driver_is_refused(tmp_path):
    p = plan(tmp_path, COLAB, 11)
    assert p.returncode != 0 and "CUDA 11" in p.stderr
