"""tensor_ops for PyTorch: every facade op as a ``torch.library`` op (``torch.ops.tensor_ops.*``)
with a fake (meta) implementation and a registered backward, so autograd,
``torch.library.opcheck`` and ``torch.compile(fullgraph=True)`` work on them.

``import tensor_ops`` never imports torch; the ops are registered the first time a torch
tensor reaches a facade op that needs autograd, or by importing this module (or
``tensor_ops.nn``). :func:`status` says whether registration succeeded, and why not.

The facade functions (``tensor_ops.rms_norm`` ...) take torch tensors directly (torch out,
the input's dtype and device); under ``torch.compile`` they are traced as the torch ops
(``torch.compiler.substitute_in_graph``), so a compiled model may call either form.

Ops (``torch.ops.tensor_ops.<name>``; every one takes ``backend: str | None`` last):

============================== ==================================================
``rms_norm(x, weight, eps)``    ``layer_norm(x, weight, bias, eps)``
``softmax(x, axis)``            ``silu(x)``, ``relu(x)``, ``gelu(x, approximate)``
``swiglu(x)``, ``geglu(x, a)``  halves of the last axis (TransformerEngine convention)
``silu_mul(a, b)``              ``silu(a) * b`` (Hugging Face's gate/up projections)
``gelu_mul(a, b, approximate)`` ``gelu(a) * b``
``rope(x, cos, sin, interl.)``  ``matmul(a, b)``
``scaled_softmax(x, s, off)``   ``softmax(x*s)`` (+ causal mask) in one pass (attention)
============================== ==================================================

Example:
    >>> import torch, tensor_ops.torch as tot
    >>> x = torch.randn(4, 8, requires_grad=True)
    >>> y = tot.silu_mul(x, torch.ones(4, 8))
    >>> y.sum().backward(); x.grad.shape
    torch.Size([4, 8])
"""
from __future__ import annotations

import threading

from .._torch_facade import MIN_TORCH
from .._torch_facade import version_tuple as _version_tuple

_LOCK = threading.Lock()
_STATUS: dict = {}


def register() -> dict:
    """Register the ``tensor_ops`` torch ops and the compile substitutions (once); returns
    :func:`status`. Never raises: a failure is recorded with its reason."""
    with _LOCK:
        if _STATUS:
            return dict(_STATUS)
        try:
            import torch
        except ImportError as exc:
            _STATUS.update(ok=False, reason=f"torch is not installed ({exc})", torch=None)
            return dict(_STATUS)
        _STATUS["torch"] = torch.__version__
        if _version_tuple(torch.__version__) < MIN_TORCH:
            _STATUS.update(ok=False, reason=f"torch {torch.__version__} is too old: tensor_ops.torch needs torch "
                                            f">= {'.'.join(map(str, MIN_TORCH))} (torch.library.custom_op with "
                                            f"register_autograd, torch.compiler.substitute_in_graph)")
            return dict(_STATUS)
        try:
            from . import _attention, _compile, _library  # noqa: F401  (_attention registers its ops)
            _compile.install()
            _STATUS.update(ok=True, reason=None, ops=sorted(_library.OPS) + ["layer_norm", "rms_norm"],
                           compile=_compile.STATUS)
        except Exception as exc:  # reported by get_backend_info(), never fatal
            _STATUS.update(ok=False, reason=f"registration failed: {type(exc).__name__}: {exc}")
        return dict(_STATUS)


def status() -> dict:
    """{'ok': bool, 'reason': str | None, 'torch': version, ...}; 'not attempted' until a torch
    tensor or an import of tensor_ops.torch / tensor_ops.nn triggered registration."""
    if not _STATUS:
        return {"ok": None, "reason": "not registered yet (on the first torch tensor that needs autograd, or "
                                      "`import tensor_ops.torch`)"}
    return dict(_STATUS)


def require() -> None:
    """Register, or raise RuntimeError with the reason (autograd cannot be recorded without it)."""
    st = register()
    if not st["ok"]:
        raise RuntimeError(f"tensor_ops: autograd through tensor_ops needs its torch ops, which are not "
                           f"available: {st['reason']}. Call under torch.no_grad() (or detach the inputs) to "
                           f"compute without a backward")


def _call(name: str, *args, backend=None):
    """The op as torch needs it: ``torch.ops.tensor_ops.<name>`` under torch.compile, the
    op's autograd.Function (:mod:`._eager`) when autograd records it, else the facade
    function (its native entry first: inference skips the op dispatcher)."""
    import torch
    if torch.compiler.is_compiling():
        return getattr(torch.ops.tensor_ops, name)(*args, backend=backend)
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        from . import _eager
        return _eager.call(name, args, backend)
    if name in ("silu_mul", "gelu_mul"):
        from . import _library
        return getattr(_library, "_" + name)(*args, backend=backend)
    from .. import _facade      # the facade function: its native entry first (a Parameter included)
    return _facade.OPS[name](*args, backend=backend)


def silu_mul(a, b, *, backend=None):
    """``silu(a) * b`` for two tensors of one shape (a gated MLP with separate projections)."""
    return _call("silu_mul", a, b, backend=backend)


def gelu_mul(a, b, approximate: str = "none", *, backend=None):
    """``gelu(a) * b`` (``approximate="tanh"`` for the tanh form)."""
    return _call("gelu_mul", a, b, approximate, backend=backend)


def rms_norm(x, weight, eps: float = 1e-6, *, backend=None):
    return _call("rms_norm", x, weight, float(eps), backend=backend)


def layer_norm(x, weight, bias=None, eps: float = 1e-5, *, backend=None):
    return _call("layer_norm", x, weight, bias, float(eps), backend=backend)


def rope(x, cos, sin, interleaved: bool = False, *, backend=None):
    return _call("rope", x, cos, sin, bool(interleaved), backend=backend)


def scaled_softmax(x, scale: float = 1.0, causal_offset=None):
    """Attention's ``softmax(x * scale)`` over the last axis, fp32 math, ``x``'s dtype out, as
    one pass; ``causal_offset=o``: row ``i`` of the last two axes sees columns ``j <= i + o``
    (0 for a square causal mask, ``sk - sq`` with a KV cache). See ``_attention``."""
    if not _STATUS.get("ok"):
        require()
    import torch
    return torch.ops.tensor_ops.scaled_softmax(x, float(scale), None if causal_offset is None else int(causal_offset))


register()

__all__ = ["register", "status", "require", "silu_mul", "gelu_mul", "rms_norm", "layer_norm", "rope",
           "scaled_softmax"]
