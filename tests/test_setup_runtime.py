"""The Colab/Kaggle setup installs what the runtime lacks, with the NVVM its driver can load."""
import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("setup_runtime", Path(__file__).parent.parent / "tools" / "setup_runtime.py")
setup_runtime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_runtime)

COLAB = {"numba-cuda": "0.22.0", "bitsandbytes": None, "torch": "2.11.0+cu128", "numpy": "2.1.3",
         "cloudpickle": "3.1.1", "tqdm": "4.67.1", "matplotlib": "3.10.0"}


def test_colab_t4_gets_cu12_numba_cuda_and_bitsandbytes_never_torch():
    reqs = setup_runtime.plan(COLAB, 12)
    assert reqs == ["numba-cuda[cu12]>=0.30.4,<0.31", "bitsandbytes==0.50.2"]
    assert not any(r.startswith(("torch", "numpy")) for r in reqs)


def test_cuda13_driver_gets_cu13():
    have = dict(COLAB, **{"numba-cuda": "0.30.4", "bitsandbytes": "0.50.2", "numpy": "2.5.2"})
    assert setup_runtime.plan(have, 13) == ["numba-cuda[cu13]>=0.30.4,<0.31"]


def test_missing_small_packages_are_added_and_nothing_when_complete_without_gpu():
    have = dict(COLAB, **{"numba-cuda": "0.30.4", "bitsandbytes": "0.50.2", "tqdm": None})
    assert setup_runtime.plan(have, None) == ["tqdm"]
    assert setup_runtime.plan(dict(have, tqdm="4.67"), None) == []


def test_too_old_driver_is_refused():
    with pytest.raises(SystemExit, match="CUDA 11"):
        setup_runtime.plan(COLAB, 11)
