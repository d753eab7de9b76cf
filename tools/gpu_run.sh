#!/usr/bin/env bash
# Run on the GPU machine (device tool, carry .whl) from the repo root: each quoted command in turn,
# with its output in $OUT/TAG.log, then packs the results files they wrote into $OUT/TAG.tgz
# (also after each command, so a call stopped at the tool's limit still returns what finished).
#   bash tools/gpu_run.sh TAG "python3 lab/decode_profile.py" "python3 tools/bench_dequantize.py --quick"
set -uo pipefail
tag=$1; shift
source tools/gpu_env.sh
log="$OUT/$tag.log"
gpu_versions | tee -a "$log"
for c in "$@"; do
  echo "== $(date -u +%H:%M:%S) $c" | tee -a "$log"
  t0=$(date +%s)
  bash -c "$c" 2>&1 | grep -v "NumbaPerformanceWarning\|^  warn" | tee -a "$log"
  echo "== rc ${PIPESTATUS[0]} in $(( $(date +%s) - t0 )) s" | tee -a "$log"
  files=$(find data/results -type f -newer "$stamp")
  [ -n "$files" ] && tar czf "$OUT/$tag.tgz" $files
done
