#!/usr/bin/env bash
# Build .book, the checkout a device call carries (carry [".whl", ".book"]): HEAD, the working tree's changes and
# untracked files, and whatever earlier calls brought back. Each call gets .book afresh, so a call that executes
# notebooks quoting an earlier call's records needs those records in it: unpack each earlier call's pack first,
#   bash tools/book_carry.sh /work/.device/N/TAG.tgz ...    (then the next call; the machine idles out after 30 s)
# Without this, notebooks of the second call quote the records the first call replaced (2026-11-29: 04 and 05
# quoted 00's and 03's records of the runs before).
set -euo pipefail
cd "$(dirname "$0")/.."
for pack in "$@"; do tar xzf "$pack"; done
rm -rf .book && mkdir .book
git archive HEAD | tar -x -C .book
# changed and new files go in; files deleted in the working tree go out
git ls-files -d -z | (cd .book && xargs -0 -r rm -f)
git ls-files -m -o --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && cp --parents "$f" .book; done
du -sh .book | cut -f1 | sed 's/^/.book: /'
