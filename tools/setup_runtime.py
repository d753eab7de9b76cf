"""Install what a hosted notebook runtime (Colab, Kaggle) lacks for nf4lab, and nothing else.

The first cell of every notebook runs this on Colab or Kaggle only. It never touches torch
(the runtime's build matches its driver) and installs only what is missing or too old:

- numba-cuda 0.30 (Colab has 0.22) with the NVVM of the driver's CUDA major version: a T4 on
  Colab runs a CUDA 12 driver, which cannot load the PTX that CUDA 13's NVVM emits (cu12 extra);
- bitsandbytes 0.50.2 (the reference every kernel is compared with, bit for bit);
- small pure-Python needs (cloudpickle, tqdm, matplotlib) if absent.

numpy stays as the runtime has it (1.24 up to 2.5 work; nf4lab.runtime gives numba-cuda the
np.row_stack that numpy 2.5 removed).

    python tools/setup_runtime.py            # install what is missing
    python tools/setup_runtime.py --dry-run  # only print the plan
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata

NUMBA_CUDA = ((0, 30, 4), (0, 31))   # [min, max) of the numba-cuda releases the series is tested with
BITSANDBYTES = "0.50.2"
PLAIN = ("cloudpickle", "tqdm", "matplotlib")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _tuple(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def installed() -> dict:
    return {d: _version(d) for d in ("numba-cuda", "bitsandbytes", "torch", "numpy", *PLAIN)}


def cuda_major() -> int | None:
    """The CUDA version the driver supports (nvidia-smi's "CUDA Version: 12.4" -> 12), or None."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"CUDA Version:\s*(\d+)", out)
    return int(m.group(1)) if m else None


def plan(have: dict, major: int | None) -> list[str]:
    """The pip requirements to install, given what is installed and the driver's CUDA major."""
    if major is not None and major < 12:
        raise SystemExit(f"this runtime's driver supports CUDA {major}; numba-cuda 0.30 needs a CUDA 12 or 13 driver")
    reqs = []
    extra = "cu13" if (major or 13) >= 13 else "cu12"
    lo, hi = NUMBA_CUDA
    nc = have.get("numba-cuda")
    # The extra also brings NVVM and the CUDA runtime libraries that match the driver.
    if nc is None or not (lo <= _tuple(nc) < hi) or major is not None:
        reqs.append(f"numba-cuda[{extra}]>={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}")
    if have.get("bitsandbytes") != BITSANDBYTES:
        reqs.append(f"bitsandbytes=={BITSANDBYTES}")
    reqs += [p for p in PLAIN if have.get(p) is None]
    return reqs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, install nothing")
    args = ap.parse_args(argv)
    have, major = installed(), cuda_major()
    reqs = plan(have, major)
    print(f"runtime: python {sys.version.split()[0]}, torch {have['torch']}, numpy {have['numpy']}, "
          f"numba-cuda {have['numba-cuda']}, bitsandbytes {have['bitsandbytes']}, driver CUDA {major}")
    if not reqs:
        print("nothing to install")
        return 0
    print("installing: " + " ".join(reqs))
    if args.dry_run:
        return 0
    # --no-deps would leave numba-cuda without its NVVM; torch is never in the list, so pip keeps the runtime's.
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", *reqs]).returncode


if __name__ == "__main__":
    sys.exit(main())
