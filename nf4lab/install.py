"""Run bitsandbytes' 4-bit CUDA paths on nf4lab's kernels, and make 4-bit models compileable for decode.

Public API (also reachable as ``nf4lab.install`` etc.)::

    nf4lab.install(compile=False) -> bool     # True when nf4lab's kernels now serve bitsandbytes on CUDA
    nf4lab.uninstall() -> None                # bitsandbytes exactly as it was (its own registrations back)
    nf4lab.installed() -> bool
    with nf4lab.installed_in():               # install() for the block, uninstall() after (if it installed)
        ...
    nf4lab.compile_for_decode(model) -> model  # install(), then mark a transformers bnb-4bit model compileable

What install() changes: it registers nf4lab's implementation as the CUDA kernel of three of
bitsandbytes' own torch ops (``bitsandbytes::dequantize_4bit``, ``bitsandbytes::dequantize_4bit.out``
and ``bitsandbytes::gemm_4bit``), through a ``torch.library.Library`` it owns. Everything above the
ops is untouched: ``bitsandbytes.functional.dequantize_4bit``, ``Linear4bit`` forward and
backward, ``Params4bit`` dequantization and ``matmul_4bit`` all reach nf4lab through the
dispatcher, in eager mode and under ``torch.compile`` (the ops' fake implementations are
bitsandbytes' own, so tracing is unchanged). uninstall() destroys that Library: the dispatcher
then serves bitsandbytes' registrations again, unchanged.

What nf4lab does not handle falls through to bitsandbytes' own CUDA implementation inside the
op (see :func:`_dequantize_handles` and :func:`_gemm_handles`), never to a different answer:
CPU tensors are never touched (the CUDA key only), and without a GPU install() does nothing.
"""
