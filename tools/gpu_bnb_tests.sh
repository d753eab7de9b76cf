#!/usr/bin/env bash
# bitsandbytes' own 4-bit tests, run with nf4lab installed (GPU machine, device tool, repo root).
#
#   bash tools/gpu_bnb_tests.sh [ours|quick|compile|all] [--baseline]
#
# Only CUDA-device tests (-k 'not cpu'): nf4lab installs on the CUDA key only.
# ours    : nf4lab's own GPU tests of the ops and install() (tests/test_install.py -k gpu), about a minute
# quick   : ours, then test_functional, test_ops, test_autograd 4-bit tests and test_linear4bit without torch.compile
# compile : test_linear4bit's torch.compile tests (the 64 that failed when nf4lab.dequantize was swapped in)
# all     : both (may pass 4 minutes on a cold machine)
# --baseline: the same selection without nf4lab.install() (bitsandbytes alone), for comparison.
#
# Needs, carried with the device tool's `carry` (both git-ignored):
#   .whl/       bash tools/fetch_gpu_wheels.sh   (numpy < 2.5, bitsandbytes 0.50.2)
#   .bnbtests/  bitsandbytes' tests of tag 0.50.1 (commit 37d2a938; the library files of the installed
#               0.50.2 are identical to that tag's): bash tools/fetch_bnb_tests.sh MIRROR
# Writes data/results/<gpu>/bnb_tests_<mode>[_baseline].json (and $OUT/) through tools/bnb_nf4lab_plugin.py.
set -uo pipefail
mode=${1:-quick}
baseline=${2:-}
root=$PWD
source tools/gpu_env.sh
export PYTHONPATH=$PYTHONPATH:$root/tools
export NF4LAB_INSTALL=1 NF4LAB_BNB_TAG=bnb_tests_$mode
if [ "$baseline" = "--baseline" ]; then export NF4LAB_INSTALL=0 NF4LAB_BNB_TAG=bnb_tests_${mode}_baseline; fi
four='4bit or fp4 or nf4'
if [ -z "$baseline" ] && { [ "$mode" = ours ] || [ "$mode" = quick ] || [ "$mode" = all ]; }; then
  # Whole logs under $OUT (failures with their tracebacks); the console gets the summary.
  NF4LAB_MODE=gpu python3 -m pytest tests/test_install.py -k gpu -q -rf -p no:cacheprovider --show-capture=no \
    > "$OUT/bnb_tests_ours.log" 2>&1
  tail -8 "$OUT/bnb_tests_ours.log"
  [ "$mode" = ours ] && exit 0
fi
if [ ! -f .bnbtests/tests/test_linear4bit.py ]; then
  echo "no .bnbtests/: run tools/fetch_bnb_tests.sh and carry .bnbtests" >&2; exit 2
fi
case $mode in
  quick)   files="tests/test_functional.py tests/test_ops.py tests/test_autograd.py tests/test_linear4bit.py"
           sel="($four or test_linear4bit) and not compile and not bench and not cpu" ;;
  compile) files="tests/test_linear4bit.py"; sel="compile and not cpu" ;;
  all)     files="tests/test_functional.py tests/test_ops.py tests/test_autograd.py tests/test_linear4bit.py"
           sel="($four or test_linear4bit) and not bench and not cpu" ;;
  *) echo "mode: ours, quick, compile or all" >&2; exit 2 ;;
esac
export NF4LAB_BNB_SELECTION="$files -k '$sel'"
cd .bnbtests
# -p: our plugin installs nf4lab before bitsandbytes' tests are imported; -m: bitsandbytes' own default filter
python3 -m pytest -p bnb_nf4lab_plugin $files -k "$sel" -m "not slow and not benchmark and not deprecated" \
  -q -rf --maxfail=100 -o addopts="" -p no:cacheprovider --show-capture=no > "$OUT/$NF4LAB_BNB_TAG.log" 2>&1
tail -40 "$OUT/$NF4LAB_BNB_TAG.log"
