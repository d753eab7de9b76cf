"""A Linear4bit forward whose compiled guards stay cheap: the decode step of a 4-bit model.

Why: dynamo re-checks, at every call of a compiled forward, the guards it took while tracing. bitsandbytes'
``Linear4bit.forward`` reads ``self.weight.quant_state`` and, through it, four statistics tensors and six
Python attributes, so every 4-bit layer adds five tensor checks and a walk through two plain Python objects.
Measured by lab/guard_cost.py (224 layers of 64x64, guard_cost.json): on the H100 machine's host 2.3 us of guards
per Linear4bit against 0.14 us per bf16 nn.Linear; an 8B model has 224 of them, at every decode step.

What this changes: :func:`prepare` gives each bitsandbytes ``Linear4bit`` of a model a subclass of its own
class (``isinstance`` still holds) whose forward reads a snapshot of the weight's quant_state kept in the
module's own ``__dict__`` (the same tensors, no copy) and calls the very op bitsandbytes' ``matmul_4bit``
calls, ``bitsandbytes::gemm_4bit``, with the same arguments. Every case that forward does not mirror goes
to bitsandbytes' own forward: gradients needed, an AVX-512 CPU's repacking path, a weight in [K, N]
orientation, an empty input, a bias of another dtype, a layer whose compute type is not set yet, no
quant_state. The snapshot is taken again whenever ``weight``, ``compute_dtype`` or ``quant_state`` is
assigned and after ``.to()``/``.cuda()``; assigning ``weight.quant_state`` in place is not seen (call
``prepare`` again). With every tensor a layer reads at the top of its ``__dict__``, the layer is also one
that dynamo's ``use_recursive_dict_tags_for_guards`` can check by its dict tag alone.

    prepare(model) -> int   # how many Linear4bit modules now have the lean forward
    restore(model) -> int   # their classes back, the snapshots gone
"""
from __future__ import annotations

_SNAP = ("_nf4lab_lean", "_nf4lab_shape", "_nf4lab_blocksize", "_nf4lab_quant_type", "_nf4lab_cdt",
         "_nf4lab_absmax", "_nf4lab_absmax8", "_nf4lab_code2", "_nf4lab_offset")
_REFRESH = frozenset({"weight", "compute_dtype", "quant_state"})
_classes: dict = {}


def _snapshot(m) -> None:
    """Store in m.__dict__ what forward reads; ``_nf4lab_lean`` False when forward must be bitsandbytes'."""
    d = m.__dict__
    for k in _SNAP:
        d[k] = None
    d["_nf4lab_lean"] = False
    qs = getattr(m._parameters.get("weight"), "quant_state", None)
    if qs is None or getattr(qs, "packing_format_for_cpu", False) or len(qs.shape) != 2:
        return
    nested = bool(qs.nested)
    if nested and qs.state2.blocksize != 256:
        return
    cdt = m.compute_dtype   # kept as its name: dynamo's dict-tag check skips no module holding a torch.dtype
    d.update(_nf4lab_shape=tuple(int(n) for n in qs.shape), _nf4lab_blocksize=int(qs.blocksize),
             _nf4lab_quant_type=str(qs.quant_type), _nf4lab_cdt=None if cdt is None else str(cdt).split(".")[-1])
    if nested:
        d.update(_nf4lab_absmax=qs.state2.absmax, _nf4lab_absmax8=qs.absmax, _nf4lab_code2=qs.state2.code,
                 _nf4lab_offset=qs.offset)
    else:
        d["_nf4lab_absmax"] = qs.absmax
    d["_nf4lab_lean"] = True


def _lean_forward(self, x):
    import torch

    if (not self._nf4lab_lean or not self.compute_type_is_set or x.numel() == 0
            or (x.device.type == "cpu" and self.support_avx512bf16_for_cpu)):
        return super(type(self), self).forward(x)
    shape = self._nf4lab_shape
    k = x.shape[-1]
    if k == shape[0] and k != shape[1]:   # a [K, N]-quantized weight: bitsandbytes' deprecated path
        return super(type(self), self).forward(x)
    inp_dtype = x.dtype
    xc = x if self._nf4lab_cdt is None else x.to(getattr(torch, self._nf4lab_cdt))
    bias = self.bias
    if bias is not None and bias.dtype != xc.dtype:   # bitsandbytes casts the bias in place, once
        return super(type(self), self).forward(x)
    if torch.is_grad_enabled() and (xc.requires_grad or (bias is not None and bias.requires_grad)):
        return super(type(self), self).forward(x)
    op = torch.ops.bitsandbytes.gemm_4bit.default
    w = self.weight.view(-1, 1)
    if self._nf4lab_absmax8 is None:
        y = op(xc, w, shape, self._nf4lab_absmax, self._nf4lab_blocksize, self._nf4lab_quant_type, bias=bias)
    else:
        y = op(xc, w, shape, self._nf4lab_absmax, self._nf4lab_blocksize, self._nf4lab_quant_type, bias=bias,
               absmax_8bit=self._nf4lab_absmax8, absmax_code=self._nf4lab_code2, absmax_offset=self._nf4lab_offset)
    return y.to(inp_dtype)


def _setattr(self, name, value):
    super(type(self), self).__setattr__(name, value)
    if name in _REFRESH:
        _snapshot(self)


def _apply(self, fn, *args, **kwargs):
    out = super(type(self), self)._apply(fn, *args, **kwargs)
    _snapshot(self)
    return out


def _lean_class(cls):
    if cls not in _classes:
        name = f"Lean{cls.__name__}"
        _classes[cls] = type(name, (cls,), {
            "forward": _lean_forward, "__setattr__": _setattr, "_apply": _apply, "_nf4lab_base": cls,
            "__module__": __name__, "__qualname__": name,
            "__doc__": f"{cls.__name__} whose forward reads a snapshot of its quant_state (nf4lab.integrations.lean_linear)."})
    return _classes[cls]


def __getattr__(name):
    """``LeanLinear4bit`` and the like by name, made on demand: what pickle looks up when a prepared model is
    loaded (``torch.save(model)``) in a process that has not called :func:`prepare`."""
    if name.startswith("Lean"):
        import bitsandbytes as bnb

        base = getattr(bnb.nn, name[4:], None)
        if isinstance(base, type) and issubclass(base, bnb.nn.Linear4bit):
            return _lean_class(base)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def prepare(model) -> int:
    """Give every bitsandbytes Linear4bit in ``model`` the lean forward; returns how many now have it."""
    import bitsandbytes as bnb

    n = 0
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            if "_nf4lab_base" not in type(m).__dict__:   # a prepared one keeps its snapshot current itself:
                m.__class__ = _lean_class(type(m))       # writing it again would change the dict tags dynamo checks
                _snapshot(m)
            n += 1
    return n


def restore(model) -> int:
    """Undo :func:`prepare` on ``model``; returns how many modules got their class back."""
    n = 0
    for m in model.modules():
        base = type(m).__dict__.get("_nf4lab_base")
        if base is not None:
            m.__class__ = base
            for k in _SNAP:
                m.__dict__.pop(k, None)
            n += 1
    return n
