#!/usr/bin/env bash
# The whole book, solutions and lessons, in three device calls on a machine with two GPUs (nvidia-h200-x2),
# in the order the notebooks quote each other's records (docs/DEVELOPING.md):
#   bash tools/gpu_book_all.sh 1 TAG   # 00, which every notebook quotes; then 01 02 03 | 09
#   bash tools/gpu_book_all.sh 2 TAG   # 04 (quotes 03) | 06 on the T4's paths (NF4LAB_ARCH=sm_75), then 05 06
#   bash tools/gpu_book_all.sh 3 TAG   # 07, which reads every other notebook's record, then 08, which reads 07's;
#                                      # beside them the GEMV against its peers (lab/gemv_peers.py)
# From a `git archive` of HEAD carried as .book with .whl:
#   command: cd .book && ln -sfn ../.whl .whl && bash tools/gpu_book_all.sh N TAG      carry: [".whl", ".book"]
# Each phase takes 6-9 minutes on an H200 (data/results/<gpu>/notebook_times.json). Every part returns its own
# $OUT/<TAG>_<part>.tgz and .log; back here unpack them in order (phase 1's, 2's, 3's) and run
# python tools/readme_results.py.
set -uo pipefail
phase=$1; tag=$2
source tools/gpu_env.sh          # the wheels, once, before anything runs in the background
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/${tag}_gpus.txt"
if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then echo "tools/gpu_book_all.sh needs two GPUs (nvidia-h200-x2)" >&2; exit 2; fi
case $phase in
  1)
    CUDA_VISIBLE_DEVICES=0 bash tools/gpu_book_parallel.sh "${tag}_00" "00"
    bash tools/gpu_book_parallel.sh "${tag}_a" "01 02 03" "09" ;;
  2)
    # 06 prints its sm_75 record beside its native run: the sm_75 run goes first, and its notebook is then
    # overwritten by the native execution.
    ( export CUDA_VISIBLE_DEVICES=1
      # not through `nf4lab notebooks`: its time would race the others' in notebook_times.json, and it is not the native one
      NF4LAB_ARCH=sm_75 timeout 280 python3 -c "from pathlib import Path; from nf4lab.__main__ import execute_notebook
p = Path('notebooks/06_output_dtypes.ipynb'); print('ok sm_75', p, round(execute_notebook(p, p)), 's')" > "$OUT/${tag}_sm75.log" 2>&1
      tar czf "$OUT/${tag}_sm75.tgz" $(find data/results -name "sm_75_06*" -newer "$stamp") ) &
    wait
    bash tools/gpu_book_parallel.sh "${tag}_a" "04" "05 06" ;;
  3)
    ( export CUDA_VISIBLE_DEVICES=1
      timeout 300 python3 -m lab.gemv_peers > "$OUT/${tag}_gemv_peers.log" 2>&1
      tar czf "$OUT/${tag}_gemv_peers.tgz" $(find data/results -name "*gemv*" -newer "$stamp") $(find data/results -name "*read_bound*" -newer "$stamp") ) &
    CUDA_VISIBLE_DEVICES=0 bash tools/gpu_book_parallel.sh "${tag}_07" "07"
    CUDA_VISIBLE_DEVICES=0 bash tools/gpu_book_parallel.sh "${tag}_08" "08"
    wait ;;
  *) echo "usage: bash tools/gpu_book_all.sh 1|2|3 TAG" >&2; exit 2 ;;
esac
