#!/usr/bin/env bash
# Execute notebooks in book order on a machine with two GPUs (device tool kind nvidia-h200-x2, carry .whl): the
# lessons on GPU 0 and the solutions on GPU 1, at the same time, each chain in the order given:
#   bash tools/gpu_book_twins.sh TAG 00 01 02 03 04 05        then, in the next call,   ... TAG2 06 09 07 08
# The two chains are independent: a lesson quotes the lessons' records and a solution the solutions' own
# (nf4lab.measure.results.load), so neither waits for the other, and the book costs about half the device time of
# tools/gpu_book_seq.sh. 06 is run first with NF4LAB_ARCH=sm_75 in each chain, under one NF4LAB_RUN_ID per chain, so
# that each 06 compares its sm_75 record with its native one (one run, only the code path differs) and never with
# the other chain's, which ran on another GPU. On a machine with one GPU the chains run one after the other,
# solutions first, so the lessons' records are the ones that stay where both write one.
# Everything comes back as $OUT/TAG.tgz (packed again after each notebook, so a call stopped at its limit keeps
# what finished) and $OUT/TAG_lessons.log, $OUT/TAG_solutions.log (and TAG_*_sm75.log, TAG.gpus). Back here: tar xzf TAG.tgz, then the next call
# after tools/book_carry.sh with every earlier pack.
set -uo pipefail
tag=$1; shift
source tools/gpu_env.sh          # installs the wheels once, before the chains start
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
final_out=$OUT call_stamp=$stamp
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$final_out/$tag.gpus"

pack() {   # one writer at a time: both chains pack after each notebook
  flock /tmp/book_twins.lock tar czf "$final_out/$tag.tgz" \
    $(find notebooks -name "*.ipynb" -newer "$call_stamp") $(find data/results -type f -newer "$call_stamp")
}

chain() {   # chain lessons|solutions GPU NN ...
  local which=$1 gpu=$2; shift 2
  export CUDA_VISIBLE_DEVICES=$gpu OUT=/tmp/book_twins_$which
  rm -rf "$OUT" && mkdir -p "$OUT"   # this call's logs only
  for n in "$@"; do
    if [ "$n" = 06 ]; then
      export NF4LAB_RUN_ID=$(python3 -c "import uuid; print(uuid.uuid4().hex[:12])")
      # its own log folder: its "ok" line must not stand for the notebook's time (notebook_times below)
      NF4LAB_ARCH=sm_75 OUT=$OUT/sm75 bash tools/gpu_book.sh "sm75_$n" "$which" "$n" >/dev/null 2>&1
      cat "$OUT"/sm75/*.log > "$final_out/${tag}_${which}_sm75.log"
      export NF4LAB_BOOK_PREPARED=1
    fi
    bash tools/gpu_book.sh "nb_$n" "$which" "$n" >/dev/null 2>&1
    export NF4LAB_BOOK_PREPARED=1
    unset NF4LAB_RUN_ID
    cat "$OUT"/*.log > "$final_out/${tag}_$which.log"
    pack
  done
}

if [ "$ngpu" -ge 2 ]; then
  chain lessons 0 "$@" &
  chain solutions 1 "$@" &
  wait
else
  chain solutions 0 "$@"
  chain lessons 0 "$@"
fi
# notebook_times.json is read, changed and written by each notebook's run: two chains at once can drop each other's
# entries, so it is written again from the "ok ... (N s)" lines of both logs.
python3 tools/notebook_times.py "$final_out/${tag}_lessons.log" "$final_out/${tag}_solutions.log"
pack
grep -h "^ok\|^FAILED\|^== " "$final_out/${tag}_lessons.log" "$final_out/${tag}_solutions.log"
