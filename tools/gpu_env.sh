# Sourced by the tools/gpu_*.sh scripts on the GPU machine (device tool, carry .whl), from the repo root:
# installs the carried wheels (tools/fetch_gpu_wheels.sh) beside the image's own packages, makes the
# checkout importable, and creates $OUT.
# Once per machine: a second script sourcing this in the same call skips the ~20 s install.
if ls .whl/*.whl >/dev/null 2>&1 && [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$(ls .whl .whl/extra)" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl .whl/extra/*.whl 2>&1 | grep -v "already exists"
  ls .whl .whl/extra > /tmp/site/.wheels
fi
# No MPLBACKEND: notebook kernels must use the inline backend, or no plot lands in the notebook.
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/nf4lab_out}   # the device tool sets OUT; elsewhere results are also copied here
mkdir -p "$OUT"
# What a call brings back is what it wrote after this point: find data/results -newer "$stamp".
stamp=$(mktemp); sleep 1
gpu_versions() {
  python3 -c "import numpy, numba_cuda, torch, bitsandbytes; print('numpy', numpy.__version__, 'numba-cuda', numba_cuda.__version__, 'torch', torch.__version__, 'bnb', bitsandbytes.__version__)" 2>&1
}
