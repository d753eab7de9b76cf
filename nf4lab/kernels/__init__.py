"""The shipped kernels: ``nf4lab.dequantize`` (dequant + fastkernel), the fused GEMV (gemv),
the device ops with their simulator twins (ops, arch: the sm_75..sm_90 code paths), and the torch
custom ops that bitsandbytes dispatches to after ``nf4lab.install()`` (torch_ops, bnb_backend)."""
