#!/usr/bin/env bash
# Execute the book's notebooks in place on a machine with several GPUs (device tool, carry .whl), one group of
# notebooks per GPU, each group's solutions first and then its lessons (tools/gpu_book.sh, sequentially on its GPU):
#   bash tools/gpu_book_parallel.sh TAG "01 02 03 04 05 06" "09"     (after a call that ran 00: all quote its ceilings)
# Groups run at the same time on GPUs 0, 1, ...: a notebook that quotes another's record goes after it in its group
# or in a later call, never in another group, which may be replacing that record while it runs (QUOTES in
# tools/book_order.py: 01-06 quote 00's and the steps before them, e.g. 04 prints 03's, 05 04's, 06 05's; 09 00's).
# 07 loads the kernels of 01-06 and 08 quotes 07's record: both go in a later call, 07 first.
# The device tool returns at most 8 files: everything comes back as $OUT/TAG.tgz (the executed notebooks and
# the records written since the call began) and $OUT/TAG.log (every group's log, in turn).
# notebook_times.json is read, changed and written by each notebook's run: groups running at once can drop each
# other's entries, so this rewrites it at the end from the "ok ... (N s)" lines of the logs.
set -uo pipefail
tag=$1; shift
source tools/gpu_env.sh          # installs the wheels once, before the groups start
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
final_out=$OUT
ngpu=$(nvidia-smi -L | wc -l)
i=0
for group in "$@"; do
  if [ "$i" -ge "$ngpu" ]; then echo "more groups ($#) than GPUs ($ngpu)" >&2; exit 2; fi
  ( export CUDA_VISIBLE_DEVICES=$i OUT=/tmp/book_$i
    bash tools/gpu_book.sh "${tag}_$i" solutions $group >/dev/null 2>&1
    bash tools/gpu_book.sh "${tag}_$i" lessons $group >/dev/null 2>&1 ) &
  i=$((i + 1))
done
wait
for j in $(seq 0 $((i - 1))); do cat /tmp/book_$j/"${tag}_$j".log; done > "$final_out/$tag.log"
python3 tools/notebook_times.py "$final_out/$tag.log"
tar czf "$final_out/$tag.tgz" $(find notebooks -name "*.ipynb" -newer "$stamp") $(find data/results -type f -newer "$stamp")
grep -h "^ok\|^FAILED\|^== " "$final_out/$tag.log"
