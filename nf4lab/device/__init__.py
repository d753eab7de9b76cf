"""Device operations numba does not spell directly (ops: rounding, 128-bit accesses; warp_ops: mma, prmt,
shuffles, shared-memory lookups), each with a plain-Python twin that the simulator runs."""
