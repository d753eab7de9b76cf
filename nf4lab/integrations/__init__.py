"""nf4lab in other people's code: ``nf4lab.dequantize`` (dequantize), torch custom ops that torch.compile
traces through (torch_ops), the bitsandbytes backend behind ``nf4lab.install()`` (bnb_backend) and the lean
Linear4bit forward (lean_linear)."""
