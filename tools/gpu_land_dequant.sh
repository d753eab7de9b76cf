#!/usr/bin/env bash
# Re-measure everything that depends on the dequantization kernel (notebook 06's and nf4lab.dequantize's),
# on the GPU machine (device tool, carry .whl), from the repo root. Four calls per GPU, each under the
# tool's 10-minute limit (06 took 112-152 s, 07 209-252 s on the H100/H200); run them back to back so the
# machine stays warm:
#   bash tools/gpu_land_dequant.sh a TAG   # exactness (native + NF4LAB_ARCH=sm_75), launch shapes
#   bash tools/gpu_land_dequant.sh t TAG   # the GPU tests, native and NF4LAB_ARCH=sm_75 (NF4LAB_MODE=gpu)
#   bash tools/gpu_land_dequant.sh b TAG   # notebook 06 under NF4LAB_ARCH=sm_75 (its T4-path record), then natively
#   bash tools/gpu_land_dequant.sh c TAG   # notebooks 07 and 08, executed in place
#   bash tools/gpu_land_dequant.sh e TAG   # notebooks 03 and 09 (their printed conclusions), executed in place
#   bash tools/gpu_land_dequant.sh g TAG   # notebook 09 alone
#   bash tools/gpu_land_dequant.sh gemv_peers TAG   # the GEMV against its peers in one process (lab/gemv_peers.py)
# Each call packs the results and notebooks it wrote into $OUT/TAG.tgz. Back here: unpack it; on a GPU
# other than the one the committed notebooks ran on, move notebooks/0[678]_*.ipynb to data/executed/<gpu>/
# and restore notebooks/ from git; then python tools/readme_results.py.
# A change to notebook 06's kernel or nf4lab.dequantize's: rebuild 06 (python tools/build_notebooks.py
# 06_output_dtypes), run these calls on every GPU, read 06-08 against each GPU's outputs, commit.
set -uo pipefail
part=$1; tag=$2
case $part in a|b|c|t|e|g|gemv_peers) ;; *) echo "usage: bash tools/gpu_land_dequant.sh a|t|b|c|e|g|gemv_peers TAG" >&2; exit 2 ;; esac
if [ "$part" = a ]; then
  exec bash tools/gpu_check.sh "$tag" exact shapes
elif [ "$part" = t ]; then
  exec bash tools/gpu_check.sh "$tag" tests
fi
source tools/gpu_env.sh
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
log="$OUT/$tag.log"
gpu_versions | tee -a "$log"
# Only what this call wrote: the checkout arrives fresh each call, so an unexecuted notebook must not come back.
pack() { tar czf "$OUT/$tag.tgz" $(find notebooks -maxdepth 1 -name "*.ipynb" -newer "$stamp") $(find data/results -type f -newer "$stamp"); }
if [ "$part" = gemv_peers ]; then
  timeout 300 python3 -m lab.gemv_peers 2>&1 | tee -a "$log"; rc=$?   # pipefail: python's status (1: a check failed)
  pack
  exit $rc
fi
# The T4 paths first: 06 writes its sm_75 record (sm_75_06_output_dtypes.json), which the native run of 06
# then prints beside its own; the native run overwrites the executed notebook.
if [ "$part" = b ]; then
  NF4LAB_ARCH=sm_75 timeout 280 python3 -m nf4lab notebooks --only 06 --no-solutions --inplace --no-plot 2>&1 | tee -a "$log"
  pack
  set -- 06
elif [ "$part" = e ]; then
  set -- 03 09
elif [ "$part" = g ]; then
  set -- 09
else
  set -- 07 08
fi
for p in "$@"; do
  timeout 300 python3 -m nf4lab notebooks --only "$p" --no-solutions --inplace --no-plot 2>&1 | tee -a "$log"
  pack
done
