import os

# Tests run where there is no GPU (CI): make that explicit and deterministic.
os.environ.setdefault("NF4LAB_MODE", "sim")

import nf4lab  # noqa: E402,F401  (switches numba to the simulator before anything imports numba.cuda)
