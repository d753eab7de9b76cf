#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what the device tool's GPU image lacks, for cp312 manylinux:
#   bitsandbytes 0.50.2 slimmed to its
#   CPU and CUDA 13.0 libraries (the full wheel is 43 MB of the 64 MiB a call may carry), and the
#   Jupyter kernel stack that nbclient needs to execute notebooks (.whl/extra; no debugpy/jedi: optional).
# Then: run(command="bash tools/gpu_notebooks.sh TAG 00 01 ...", carry=[".whl"]).
set -euo pipefail
cd "$(dirname "$0")/.."
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d "$@"; }
rm -rf .whl && mkdir -p .whl/extra
# numpy: the image's 2.5 is used as is (nf4lab.runtime gives numba-cuda back np.row_stack).
dl .whl "bitsandbytes==0.50.2"
tmp=$(mktemp -d)
(cd "$tmp" && unzip -q "$OLDPWD"/.whl/bitsandbytes-*.whl && \
  find bitsandbytes -name 'libbitsandbytes_*.so' ! -name '*cpu*' ! -name '*cuda130*' -delete && \
  rec=$(ls -d bitsandbytes-*.dist-info)/RECORD && \
  python3 -c "import os,sys; p=sys.argv[1]; l=[x for x in open(p) if os.path.exists(x.split(',')[0])]; open(p,'w').writelines(l)" "$rec" && \
  rm "$OLDPWD"/.whl/bitsandbytes-*.whl && zip -q -r "$OLDPWD/.whl/bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl" .)
rm -rf "$tmp"
for p in nbclient nbformat jupyter_client jupyter_core ipykernel ipython traitlets pyzmq tornado fastjsonschema \
         comm matplotlib-inline nest-asyncio nest-asyncio2 platformdirs parso prompt_toolkit stack_data executing \
         asttokens pure_eval wcwidth decorator pexpect ptyprocess ipython_pygments_lexers jsonschema referencing \
         rpds-py jsonschema-specifications; do
  dl .whl/extra "$p"
done
du -sh .whl
