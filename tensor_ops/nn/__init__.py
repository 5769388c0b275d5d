"""Drop-in ``torch.nn`` modules on tensor_ops' kernels (forward and backward).

``RMSNorm`` and ``LayerNorm`` take ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm``'s constructor
arguments and have their ``state_dict`` keys (``weight``, ``bias``), so a checkpoint of either
loads unchanged, and ``from_torch`` converts a module in place of the other (sharing its
parameters). ``SwiGLU`` / ``GeGLU`` are the gated activations, on the halves of one tensor
(TransformerEngine's convention) or on two tensors (``act(gate) * up``, a Hugging Face MLP's
layout). ``GatedMLP`` is that MLP (``gate_proj``, ``up_proj``, ``down_proj``: the same
submodules and keys as Llama's). Every module takes ``backend=`` (a resolver order, as the
facade's keyword) and works under autograd and ``torch.compile``.

Example:
    >>> import torch, tensor_ops.nn as tnn
    >>> norm = tnn.RMSNorm(8)
    >>> norm.load_state_dict(torch.nn.RMSNorm(8).state_dict())
    <All keys matched successfully>
    >>> norm(torch.randn(2, 8)).shape
    torch.Size([2, 8])
"""
from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .. import torch as _tot

__all__ = ["RMSNorm", "LayerNorm", "SwiGLU", "GeGLU", "GatedMLP"]


def _shape(normalized_shape) -> tuple:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(d) for d in normalized_shape)


def _flat(x, shape: tuple):
    """x with its last len(shape) dims flattened into one (the kernels normalise the last axis)."""
    if len(shape) == 1:
        return x
    if tuple(x.shape[-len(shape):]) != shape:
        raise ValueError(f"x must end with the normalized shape {shape}, got {tuple(x.shape)}")
    return x.reshape(*x.shape[:-len(shape)], math.prod(shape))


class RMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` on tensor_ops: ``x / sqrt(mean(x^2) + eps) * weight``.

    Args (as torch.nn.RMSNorm): normalized_shape, eps (None: the machine epsilon of the math
    dtype, float32 for 16-bit inputs, as torch),
    elementwise_affine, device, dtype. Extra, keyword-only: ``offset`` (the weight is used as
    ``offset + weight``: 1.0 for Gemma's zero-centred weights) and ``backend``.
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None, dtype=None, *,
                 offset: float = 0.0, backend=None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.offset = float(offset)
        self.backend = backend
        if elementwise_affine:
            init = torch.zeros if self.offset else torch.ones
            self.weight = nn.Parameter(init(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    @classmethod
    def from_torch(cls, module, *, offset: float = 0.0, backend=None) -> "RMSNorm":
        """A tensor_ops RMSNorm sharing ``module``'s weight (torch.nn.RMSNorm, or any RMSNorm
        with ``weight`` and ``eps``/``variance_epsilon``, e.g. Hugging Face's)."""
        w = module.weight
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
        new = cls(tuple(w.shape) if w is not None else module.normalized_shape, eps,
                  elementwise_affine=w is not None, device="meta", offset=offset, backend=backend)
        if w is not None:
            new.weight = w
        return new

    def forward(self, x):
        # torch's default: the machine epsilon of the math dtype (float32 for 16-bit storage)
        eps = self.eps if self.eps is not None else torch.finfo(torch.float64 if x.dtype == torch.float64
                                                                else torch.float32).eps
        n = math.prod(self.normalized_shape)
        w = self.weight
        if w is None:
            w = torch.full((n,), 1.0 + self.offset, dtype=x.dtype, device=x.device)
        else:
            w = w.reshape(n)
            if self.offset:
                w = w.float() + self.offset
        y = _tot.rms_norm(_flat(x, self.normalized_shape), w, eps, backend=self.backend)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
                + (f", offset={self.offset}" if self.offset else ""))


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm`` on tensor_ops (biased variance), same arguments and keys."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, *, backend=None) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.backend = backend
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape, device=device, dtype=dtype)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    @classmethod
    def from_torch(cls, module, *, backend=None) -> "LayerNorm":
        """A tensor_ops LayerNorm sharing ``module``'s parameters (a torch.nn.LayerNorm)."""
        new = cls(module.normalized_shape, module.eps, elementwise_affine=False, backend=backend)
        new.elementwise_affine = module.elementwise_affine
        new.weight, new.bias = module.weight, module.bias
        return new

    def forward(self, x):
        n = math.prod(self.normalized_shape)
        w = self.weight.reshape(n) if self.weight is not None else torch.ones(n, dtype=x.dtype, device=x.device)
        b = self.bias.reshape(n) if self.bias is not None else None
        y = _tot.layer_norm(_flat(x, self.normalized_shape), w, b, self.eps, backend=self.backend)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class SwiGLU(nn.Module):
    """``silu(a) * b``: ``forward(x)`` splits x's last axis into halves ``[a | b]``;
    ``forward(gate, up)`` takes two tensors of one shape."""

    def __init__(self, *, backend=None) -> None:
        super().__init__()
        self.backend = backend

    def forward(self, x, up=None):
        if up is not None:
            return _tot.silu_mul(x, up, backend=self.backend)
        return _tot._call("swiglu", x, backend=self.backend)


class GeGLU(nn.Module):
    """``gelu(a) * b`` (``approximate="tanh"`` for the tanh form), halves or two tensors."""

    def __init__(self, approximate: str = "none", *, backend=None) -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' (exact erf) or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.backend = backend

    def forward(self, x, up=None):
        if up is not None:
            return _tot.gelu_mul(x, up, self.approximate, backend=self.backend)
        return _tot._call("geglu", x, self.approximate, backend=self.backend)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with the activation and the product fused
    (Llama/Mistral/Qwen/Gemma MLPs). ``act``: 'silu', 'gelu' or 'gelu_tanh'."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module, act: str = "silu", *,
                 backend=None) -> None:
        super().__init__()
        if act not in ("silu", "gelu", "gelu_tanh"):
            raise ValueError(f"act must be 'silu', 'gelu' or 'gelu_tanh', got {act!r}")
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.act = act
        self.backend = backend

    def forward(self, x):
        g, u = self.gate_proj(x), self.up_proj(x)
        if self.act == "silu":
            h = _tot.silu_mul(g, u, backend=self.backend)
        else:
            h = _tot.gelu_mul(g, u, "tanh" if self.act == "gelu_tanh" else "none", backend=self.backend)
        return self.down_proj(h)

    def extra_repr(self) -> str:
        return f"act={self.act!r}"
