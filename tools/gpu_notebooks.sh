#!/usr/bin/env bash
# Run on the GPU machine (device tool) from the repo root: execute the given notebooks in
# place, then pack the executed notebooks and the results they recorded into $OUT.
#   bash tools/gpu_notebooks.sh TAG 00 01 02 03
set -uo pipefail
tag=$1; shift
source tools/gpu_env.sh
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
# One notebook at a time, packing after each: a call stopped at its time limit still brings back
# every notebook it finished (one lost call once brought back nothing).
done_nbs=""
for p in "$@"; do
  python3 -m nf4lab notebooks --only "$p" --no-solutions --inplace --no-plot 2>&1 | tee -a "$OUT/$tag.log"
  done_nbs="$done_nbs $(ls notebooks/${p}_*.ipynb)"
  # Only the results this run wrote: the others here are copies of the checkout, and unpacking
  # them over results that an earlier call brought back would undo that call.
  tar czf "$OUT/$tag.tgz" $done_nbs $(find data/results -type f -newer "$stamp")
done
