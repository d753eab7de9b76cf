"""The tensor-core GEMV against the read bound and bitsandbytes, per recorded GPU (no GPU needed).

Prints README.md's generated tensor-core section (``tools/readme_results.py``, ``gemv_tc_lines``) for every GPU
with a record: data/results/<gpu>/09_gemv_tc.json and 09_gemv_tc_batch.json, timed by

    python -m lab.bench_gemv --variants TC 'R2 S1 C32 W8 B4' --variant-dtypes bf16 fp16 --ms 1 2 4 8 \
        --batch-shapes 4096x14336 14336x4096 8192x28672 --batch-dtypes bf16 fp16 --no-save

(the files it writes under $OUT, renamed), beside 09_read_bound.json of the same session (lab/gemv_read_bound.py).

    python -m lab.gemv_tc_report
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    from tools import readme_results

    gpus = sorted(p.parent.name for p in (ROOT / "data" / "results").glob("*/09_gemv_tc.json"))
    for gpu in gpus:
        print(f"## {gpu}\n" + "\n".join(readme_results.gemv_tc_lines(gpu)), end="\n\n")
    return 0 if gpus else 1


if __name__ == "__main__":
    sys.exit(main())
