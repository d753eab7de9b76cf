"""The shipped kernels: the dequantization behind ``nf4lab.dequantize`` (dequant, with fastkernel's kernels and
launcher) and the fused decode GEMV (gemv)."""
