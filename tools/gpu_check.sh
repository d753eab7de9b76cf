#!/usr/bin/env bash
# Run on the GPU machine (device tool, carry .whl) from the repo root: bit-exactness of every code
# path as the GPU compiles it and with NF4LAB_ARCH=sm_75 (the T4's paths), the launch-shape
# evidence, and the GPU tests under both; packs the results this call wrote into $OUT/TAG.tgz.
#   bash tools/gpu_check.sh TAG [exact] [shapes] [tests]
set -uo pipefail
tag=$1; shift
steps=${*:-exact shapes tests}
for s in $steps; do   # an unknown step is a typo: stop before any device time is spent on the others
  case $s in exact|shapes|tests) ;; *) echo "gpu_check.sh: unknown step '$s' (exact, shapes, tests)" >&2; exit 2 ;; esac
done
source tools/gpu_env.sh
log="$OUT/$tag.log"
gpu_versions | tee -a "$log"
for s in $steps; do
  case $s in
    exact)
      timeout 300 python3 tools/gpu_exactness.py 2>&1 | grep -v "^ *warn\|Warning" | tee -a "$log"
      NF4LAB_ARCH=sm_75 timeout 300 python3 tools/gpu_exactness.py 2>&1 | grep -v "^ *warn\|Warning" | tee -a "$log" ;;
    shapes)
      timeout 240 python3 tools/launch_shapes.py 2>&1 | tail -40 | tee -a "$log" ;;
    tests)
      for a in "" sm_75; do
        echo "== pytest on the GPU, NF4LAB_ARCH=${a:-unset}" | tee -a "$log"
        # NF4LAB_MODE=gpu: tests/conftest.py otherwise puts every test in the simulator, GPU or not
        # natively also the torch ops, install() and the GEMV (their GPU tests: compile, CUDA graphs, bitsandbytes served)
        more=$([ -z "$a" ] && echo "tests/test_install.py tests/test_torch_ops.py tests/test_gemv.py tests/test_lean_linear.py")
        # 8 workers (pytest-xdist, carried in .whl/extra): the GPU tests spend most of their time compiling on the CPU
        NF4LAB_MODE=gpu NF4LAB_ARCH=$a timeout ${GPU_TEST_TIMEOUT:-420} python3 -m pytest -q -p no:cacheprovider -m "not slow" -n 8 \
          -W "always::RuntimeWarning" -rfEw \
          tests/test_dequantize.py tests/test_exercises.py tests/test_ops_ptx.py tests/test_runtime.py $more 2>&1 \
          | grep -v "NumbaPerformanceWarning\|^  warn" > "$OUT/$tag.pytest_${a:-native}.log"
        tail -40 "$OUT/$tag.pytest_${a:-native}.log" | tee -a "$log"
      done ;;
  esac
done
tar czf "$OUT/$tag.tgz" $(find data/results -type f -newer "$stamp")
