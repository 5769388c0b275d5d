"""TE's fused scaled softmax family (logits where mask == 1 become -10000; a row whose max is then
-10000, e.g. fully masked, gives 0)."""
from __future__ import annotations

import torch

from ._common import as_float, check_same_device, check_tensor, nargs_error
from ._dispatch import call
from ._refs import reference

__all__ = [
    "scaled_softmax_forward", "scaled_softmax_backward",
    "scaled_masked_softmax_forward", "scaled_masked_softmax_backward",
    "scaled_upper_triang_masked_softmax_forward", "scaled_upper_triang_masked_softmax_backward",
    "scaled_aligned_causal_masked_softmax_forward", "scaled_aligned_causal_masked_softmax_backward",
]
_MASK_VALUE = -10000.0


def _check_input(op, x, ndim):
    check_tensor(op, "input", x, float_only=True)
    if x.dim() != ndim:
        raise ValueError(f"tex.{op}: input must be {ndim}-D "
                         f"({'[attn_batches, sq, sk]' if ndim == 3 else '[b, h, sq, sk]'}), "
                         f"got shape {tuple(x.shape)}")


def scaled_softmax_forward(input, scale):
    """``softmax(input * scale, -1)`` for ``input[b, h, sq, sk]``."""
    _check_input("scaled_softmax_forward", input, 4)
    return call("scaled_softmax_forward", (input, as_float("scaled_softmax_forward", "scale", scale)))


def scaled_masked_softmax_forward(input, mask, scale):
    """Softmax of ``input*scale`` with logits where ``mask == 1`` replaced by -10000."""
    op = "scaled_masked_softmax_forward"
    _check_input(op, input, 4)
    check_tensor(op, "mask", mask)
    check_same_device(op, input=input, mask=mask)
    b, _, sq, sk = input.shape
    if mask.dim() != 4 or mask.shape[0] not in (b, 1) or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (sq, sk):
        raise ValueError(f"tex.{op}: mask has shape {tuple(mask.shape)}; expected ({b} or 1, 1, {sq}, {sk}) "
                         f"for input {tuple(input.shape)}")
    if mask.dtype not in (torch.uint8, torch.bool):
        raise TypeError(f"tex.{op}: mask must be uint8 (or bool), got {mask.dtype}")
    return call(op, (input, mask, as_float(op, "scale", scale)))


def scaled_upper_triang_masked_softmax_forward(input, scale):
    """Causal softmax (``j > i`` masked) for ``input[attn_batches, sq, sq]``."""
    op = "scaled_upper_triang_masked_softmax_forward"
    _check_input(op, input, 3)
    if input.shape[1] != input.shape[2]:
        raise ValueError(f"tex.{op}: input must be square in its last two dims, got {tuple(input.shape)}")
    return call(op, (input, as_float(op, "scale", scale)))


def scaled_aligned_causal_masked_softmax_forward(input, scale):
    """Causal softmax aligned bottom-right (``j > i + sk - sq`` masked) for ``input[b, h, sq, sk]``."""
    op = "scaled_aligned_causal_masked_softmax_forward"
    _check_input(op, input, 4)
    return call(op, (input, as_float(op, "scale", scale)))


def _make_bwd(op):
    def fn(*args):
        if len(args) != 3:
            raise nargs_error(op, "3 (output_grads, softmax_results, scale)", len(args))
        dy, y, scale = args
        check_tensor(op, "output_grads", dy, float_only=True)
        check_tensor(op, "softmax_results", y, float_only=True)
        check_same_device(op, output_grads=dy, softmax_results=y)
        if dy.shape != y.shape:
            raise ValueError(f"tex.{op}: output_grads {tuple(dy.shape)} and softmax_results "
                             f"{tuple(y.shape)} differ in shape")
        return call(op, (dy, y, as_float(op, "scale", scale)))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"tex.{op}(output_grads, softmax_results, scale) → scale·y⊙(dy − Σ dy⊙y) (new tensor)."
    return fn


scaled_softmax_backward = _make_bwd("scaled_softmax_backward")
scaled_masked_softmax_backward = _make_bwd("scaled_masked_softmax_backward")
scaled_upper_triang_masked_softmax_backward = _make_bwd("scaled_upper_triang_masked_softmax_backward")
scaled_aligned_causal_masked_softmax_backward = _make_bwd("scaled_aligned_causal_masked_softmax_backward")


# ---------------------------------------------------------------- reference.torch


def _masked_softmax(x32, masked):
    """Softmax where ``masked`` entries are excluded; rows with nothing left give 0."""
    x32 = x32.masked_fill(masked, float("-inf"))
    y = torch.softmax(x32, -1)
    return torch.nan_to_num(y, nan=0.0)


@reference("scaled_softmax_forward")
def ref_scaled_softmax_forward(input, scale):
    return torch.softmax(input.float() * scale, -1).to(input.dtype)


@reference("scaled_masked_softmax_forward")
def ref_scaled_masked_softmax_forward(input, mask, scale):
    logits = (input.float() * scale).masked_fill(mask == 1, _MASK_VALUE)
    y = torch.softmax(logits, -1)
    # TE's kernel scales a row by 0 where its max is the mask value (every logit masked, or
    # none above -10000), by 1 elsewhere; amax keeps a NaN row NaN
    y = y.masked_fill(logits.amax(-1, keepdim=True) == _MASK_VALUE, 0.0)
    return y.to(input.dtype)


def _causal_mask(sq, sk, device):
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j > i + (sk - sq)


@reference("scaled_upper_triang_masked_softmax_forward")
def ref_scaled_upper_triang_masked_softmax_forward(input, scale):
    sq = input.shape[-1]
    return _masked_softmax(input.float() * scale, _causal_mask(sq, sq, input.device)).to(input.dtype)


@reference("scaled_aligned_causal_masked_softmax_forward")
def ref_scaled_aligned_causal_masked_softmax_forward(input, scale):
    sq, sk = input.shape[-2:]
    return _masked_softmax(input.float() * scale, _causal_mask(sq, sk, input.device)).to(input.dtype)


def _ref_bwd(dy, y, scale):
    y32 = y.float()
    dy32 = dy.float()
    dx = scale * y32 * (dy32 - (dy32 * y32).sum(-1, keepdim=True))
    return dx.to(dy.dtype)


for _op in ("scaled_softmax_backward", "scaled_masked_softmax_backward",
            "scaled_upper_triang_masked_softmax_backward", "scaled_aligned_causal_masked_softmax_backward"):
    reference(_op)(_ref_bwd)
