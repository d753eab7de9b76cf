# Sourced by the tools/gpu_*.sh scripts on the GPU machine (device tool, carry .whl), from the repo root:
# installs the carried wheels (tools/fetch_gpu_wheels.sh) beside the image's own packages, makes the
# checkout importable, and creates $OUT.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl .whl/extra/*.whl 2>&1 | grep -v "already exists"
fi
# No MPLBACKEND: notebook kernels must use the inline backend, or no plot lands in the notebook.
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/nf4lab_out}   # the device tool sets OUT; elsewhere results are also copied here
mkdir -p "$OUT"
