#!/usr/bin/env bash
# Execute notebooks in place on one GPU (device tool, carry .whl), each notebook's solution and then its lesson
# before the next notebook, so that every notebook quotes the records of the earlier ones that stay:
#   bash tools/gpu_book_seq.sh TAG 00 01 02 03
# 06 is run first with NF4LAB_ARCH=sm_75 (the T4's paths): it prints that record beside its native one.
# Order across calls (docs/DEVELOPING.md): 00 first (every notebook quotes its ceilings), 04 after 03, 06 after 05,
# 07 after a change to a kernel of 01-06, 08 after 07. Device time on an H200 (2026-11-29), lesson + solution and the gaps between
# them: about 2 min for 00, 01, 02, 03, 05 and 09 each, 3 min for 04, 06 about 7 min (its NF4LAB_ARCH=sm_75 pass alone
# 189 s), 07 about 6: 06 alone in one call, 07 and 08 in the next. Everything comes back as $OUT/TAG.tgz (packed again after each
# notebook, so a call stopped at its limit keeps what finished) and $OUT/TAG.log. Between calls, here:
# bash tools/book_carry.sh <the previous call's TAG.tgz>, so the next call's notebooks quote the records that stay.
set -uo pipefail
tag=$1; shift
source tools/gpu_env.sh
start=$stamp final_out=$OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$final_out/$tag.log"
for n in "$@"; do
  if [ "$n" = 06 ]; then
    # One run id for the sm_75 pass and the native runs, so that 06 may compare their records (one run, only
    # the code path differs); unset after 06.
    export NF4LAB_RUN_ID=$(python3 -c "import uuid; print(uuid.uuid4().hex[:12])")
    # as tools/gpu_land_dequant.sh b does; the native runs below overwrite its notebook and its time
    NF4LAB_ARCH=sm_75 timeout 280 python3 -m nf4lab notebooks --only 06 --no-solutions --inplace --no-plot 2>&1 \
      | tail -2 | tee -a "$final_out/$tag.log"
  fi
  for which in solutions lessons; do
    OUT=/tmp/book_seq bash tools/gpu_book.sh "${tag}_$n" "$which" "$n" >/dev/null 2>&1
    export NF4LAB_BOOK_PREPARED=1
  done
  unset NF4LAB_RUN_ID
  grep -h "^ok\|^FAILED\|^== " /tmp/book_seq/"${tag}_$n".log | tee -a "$final_out/$tag.log"
  tar czf "$final_out/$tag.tgz" $(find notebooks -name "*.ipynb" -newer "$start") $(find data/results -type f -newer "$start")
done
