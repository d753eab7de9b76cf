#!/usr/bin/env bash
# Run on the GPU machine (device tool) from the repo root: execute the given notebooks in
# place, then pack the executed notebooks and the results they recorded into $OUT.
#   bash tools/gpu_notebooks.sh TAG 00 01 02 03
set -uo pipefail
tag=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .whl/extra/*.whl 2>&1 | grep -v "already exists"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1  # no MPLBACKEND: the kernels must use the inline backend, or no plot lands in the notebook
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
mkdir -p "$OUT"
stamp=$(mktemp); sleep 1
python3 -m nf4lab notebooks --only "$@" --no-solutions --inplace --no-plot 2>&1 | tee "$OUT/$tag.log"
nbs=$(for p in "$@"; do ls notebooks/${p}_*.ipynb; done)
# Only the results this run wrote: the others here are copies of the checkout, and unpacking
# them over results that an earlier call brought back would undo that call.
tar czf "$OUT/$tag.tgz" $nbs $(find data/results -type f -newer "$stamp")
