"""dropout_fwd / dropout_bwd with TE's bit-packed uint8 mask (1 = keep, element k → byte k//8, bit k%8)."""
from __future__ import annotations

import torch

from ._common import as_float, check_same_device, check_shape, check_tensor
from ._dispatch import call
from ._refs import reference

__all__ = ["dropout_fwd", "dropout_bwd"]


def _check_p(op, p):
    p = as_float(op, "dropout_probability", p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"tex.{op}: dropout_probability={p!r} must be in [0, 1]")
    return p


def dropout_fwd(input, dropout_probability, out=None):
    """→ ``[out, mask]``: ``out = input·keep/(1-p)``; ``mask`` uint8 of ``ceil(numel/8)`` bytes."""
    op = "dropout_fwd"
    check_tensor(op, "input", input, float_only=True)
    check_tensor(op, "out", out, optional=True)
    check_same_device(op, input=input, out=out)
    if out is not None:
        check_shape(op, "out", out, input.shape)
    return call(op, (input, _check_p(op, dropout_probability), out))


def dropout_bwd(grad_output, mask, dropout_probability, grad_input=None):
    """→ ``grad_input = grad_output·keep/(1-p)`` with ``keep`` unpacked from ``mask``."""
    op = "dropout_bwd"
    check_tensor(op, "grad_output", grad_output, float_only=True)
    check_tensor(op, "mask", mask)
    check_tensor(op, "grad_input", grad_input, optional=True)
    check_same_device(op, grad_output=grad_output, mask=mask, grad_input=grad_input)
    need = (grad_output.numel() + 7) // 8
    if mask.dtype != torch.uint8 or mask.numel() != need:
        raise ValueError(f"tex.{op}: mask must be a bit-packed uint8 tensor of {need} elements for "
                         f"{grad_output.numel()} values, got {mask.dtype} with {mask.numel()}")
    if grad_input is not None:
        check_shape(op, "grad_input", grad_input, grad_output.shape)
    return call(op, (grad_output, mask, _check_p(op, dropout_probability), grad_input))


_BITS = [1 << i for i in range(8)]


def pack_bits(keep: torch.Tensor) -> torch.Tensor:
    """bool [numel] → uint8 [ceil(numel/8)], LSB first."""
    n = keep.numel()
    pad = (-n) % 8
    k = keep.reshape(-1).to(torch.uint8)
    if pad:
        k = torch.cat([k, k.new_zeros(pad)])
    w = torch.tensor(_BITS, dtype=torch.uint8, device=k.device)
    return (k.reshape(-1, 8) * w).sum(-1, dtype=torch.uint8)


def unpack_bits(mask: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 [ceil(n/8)] → bool [n]."""
    w = torch.tensor(_BITS, dtype=torch.uint8, device=mask.device)
    return ((mask.reshape(-1, 1) & w) != 0).reshape(-1)[:n]


def _scale(p):
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - p)


@reference("dropout_fwd")
def ref_dropout_fwd(input, dropout_probability, out=None):
    keep = torch.rand(input.shape, device=input.device) >= dropout_probability
    y = (input.float() * keep * _scale(dropout_probability)).to(input.dtype)
    if out is not None:
        out.copy_(y)
        y = out
    return [y, pack_bits(keep)]


@reference("dropout_bwd")
def ref_dropout_bwd(grad_output, mask, dropout_probability, grad_input=None):
    keep = unpack_bits(mask, grad_output.numel()).reshape(grad_output.shape)
    g = (grad_output.float() * keep * _scale(dropout_probability)).to(grad_output.dtype)
    if grad_input is not None:
        grad_input.copy_(g)
        return grad_input
    return g
