#!/usr/bin/env bash
# Fill .bnbtests/ (git-ignored, carried to the GPU machine) with bitsandbytes' tests of tag 0.50.1:
# there is no 0.50.2 tag; the installed 0.50.2's _ops.py, functional.py and backends/cuda/ops.py are
# identical to that tag's, and its tests are unchanged up to the 0.50.2.dev0 commits after it.
# fsdp_state_dict_save.py is the script test_linear4bit.py::test_fsdp_state_dict_save_4bit runs under torchrun.
#   bash tools/fetch_bnb_tests.sh /path/to/bitsandbytes.git   (a clone or mirror of bitsandbytes-foundation/bitsandbytes)
set -euo pipefail
git_dir=$1
rev=${BNB_TESTS_REV:-0.50.1}
mkdir -p .bnbtests/tests
for f in __init__.py conftest.py helpers.py fsdp_state_dict_save.py test_functional.py test_ops.py test_linear4bit.py test_autograd.py; do
  git --git-dir="$git_dir" show "$rev:tests/$f" > ".bnbtests/tests/$f"
done
git --git-dir="$git_dir" rev-parse "$rev^{commit}" > .bnbtests/SOURCE_COMMIT
grep -qx "/.bnbtests/" "$(git rev-parse --git-common-dir)/info/exclude" || echo "/.bnbtests/" >> "$(git rev-parse --git-common-dir)/info/exclude"
echo "bitsandbytes tests of $rev ($(cat .bnbtests/SOURCE_COMMIT)) in .bnbtests/"
