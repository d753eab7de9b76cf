"""``nf4lab.dequantize(A, quant_state, out=None)``: the drop-in for bitsandbytes' ``dequantize_4bit``.

Eager calls validate and run :mod:`nf4lab.kernels.dequant` directly. Under ``torch.compile`` the launch
(pointers, alignment, path choice) cannot be traced, so the call goes through nf4lab's torch custom op
(:mod:`nf4lab.integrations.torch_ops`), which the graph sees through its fake implementation. That is
why this function sits above the kernels: it is the one place that knows both.
"""
from __future__ import annotations

from ..kernels import dequant as _dq


def dequantize(A, quant_state=None, out=None):
    """Dequantize packed 4-bit weights exactly as ``bitsandbytes.functional.dequantize_4bit``.

    ``A``: packed uint8 tensor (or a ``Params4bit``), ``quant_state``: its ``QuantState``
    (taken from ``A.quant_state`` when omitted), ``out``: optional tensor of
    ``quant_state.shape`` and ``quant_state.dtype`` on A's device, filled and returned.
    """
    p = _dq.plan(A, quant_state, out)
    if _dq.compiling():
        from . import torch_ops  # noqa: F401  (registers the ops; imports torch, which is in use here anyway)

        import torch

        args = _dq.op_args(p)
        if out is None:
            result = torch.ops.nf4lab.dequantize_4bit(*args)
        else:
            torch.ops.nf4lab.dequantize_4bit_out(*args, out)
            result = out
    else:
        result = _dq.run(p, out)
    # bitsandbytes' BC shim, reproduced: a packed weight given as one row comes back transposed.
    if p.A.dim() >= 1 and p.A.shape[0] == 1:
        return result.t()
    return result
