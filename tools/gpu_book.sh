#!/usr/bin/env bash
# Execute the book's notebooks in place on the GPU machine (device tool, carry .whl), from the repo root,
# one at a time, packing after each one, so a call stopped at its limit still brings back what finished:
#   bash tools/gpu_book.sh TAG solutions 00 01 02     notebooks/solutions/NN_*_SOLUTION.ipynb
#   bash tools/gpu_book.sh TAG lessons 00 01 02       notebooks/NN_*.ipynb
# A lesson's benchmark saves data/results/<gpu>/<notebook>.json and a solution's the same name under solutions/
# (NF4LAB_NOTEBOOK_KIND), so neither replaces the other's; solutions first keeps the book's usual order.
# Each notebook is its own run (its own kernel process, its own run id in the records it writes).
# Back here: tar xzf TAG_solutions.tgz, then TAG_lessons.tgz,
# then python tools/readme_results.py.
set -uo pipefail
tag=$1; which=$2; shift 2
case $which in solutions|lessons) ;; *) echo "usage: bash tools/gpu_book.sh TAG solutions|lessons NN ..." >&2; exit 2 ;; esac
source tools/gpu_env.sh
log="$OUT/$tag.log"
# Once per machine and call of tools/gpu_book_seq.sh (which sets NF4LAB_BOOK_PREPARED after its first notebook):
# the kernel spec, and the versions (importing torch and bitsandbytes takes seconds; every record carries them too).
if [ -z "${NF4LAB_BOOK_PREPARED:-}" ]; then
  python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
  gpu_versions | tee -a "$log"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a "$log"
fi
done_nbs=""
for p in "$@"; do
  if [ "$which" = solutions ]; then nb=$(ls notebooks/solutions/${p}_*_SOLUTION.ipynb); else nb=$(ls notebooks/${p}_*.ipynb); fi
  echo "== $(date -u +%H:%M:%S) $nb" | tee -a "$log"
  timeout 420 python3 - "$nb" <<'PY' 2>&1 | grep -v "NumbaPerformanceWarning\|^  warn" | tee -a "$log"
import sys
from pathlib import Path

from nf4lab.__main__ import execute_notebook, record_time

p = Path(sys.argv[1])
try:
    secs = execute_notebook(p, p)
    record_time(p.stem, secs)
    print(f"ok     {p} ({secs:.0f} s)")
except Exception as exc:
    msg = str(exc).strip().splitlines()
    print(f"FAILED {p}: {msg[-1] if msg else type(exc).__name__}")
PY
  done_nbs="$done_nbs $nb"
  # One pack per TAG and kind: a lessons call after a solutions call with the same TAG must not replace its pack.
  tar czf "$OUT/${tag}_$which.tgz" $done_nbs $(find data/results -type f -newer "$stamp")
done
