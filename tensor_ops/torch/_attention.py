"""``tensor_ops::scaled_softmax``: attention's ``softmax(scores * scale + causal mask)`` as one
kernel pass, forward and backward (registered with the other torch ops by
:func:`tensor_ops.torch.register`).

Why a separate op: eager attention (Hugging Face's ``eager_attention_forward``) spends four
full passes over the (batch, heads, q, k) scores after the ``QK^T`` matmul — the ``* scaling``,
the ``+ attention_mask``, the fp32 softmax and the cast back to the query's dtype — and
autograd saves and replays each. For the masks LLMs use (none, or causal), the scale and the
mask are arithmetic the softmax kernel can do while it reads the row: TransformerEngine's
``scaled_upper_triang_masked_softmax`` family does exactly that, and its CPU kernels
(``cpp_ext/tex_train.cpp``: fp32 math, exact zeros above the diagonal, the input's dtype out)
serve this op. ``causal_offset=None`` is the unmasked form; an int ``o`` lets row ``i`` (of
``sq`` query rows) see columns ``j <= i + o`` (``sk - sq`` for a KV cache: the aligned causal
mask); a row that sees no column is all zeros (as TE's kernel does).

Tensors the native kernel does not take (other devices, float64, non-contiguous) use the
same formula in torch, so the op is defined everywhere.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _kernels as K
from ._library import OPS, _like, _op

_NATIVE = (torch.float32, torch.float16, torch.bfloat16)
_PLAIN, _CAUSAL = 0, 2


def _native_ok(*ts) -> bool:
    return all(t.device.type == "cpu" and t.dtype in _NATIVE and t.is_contiguous() and not t.is_complex()
               for t in ts) and ts[0].dim() >= 2 and ts[0].numel() > 0


def _torch_forward(x: Tensor, scale: float, causal_offset: Optional[int]) -> Tensor:
    z = x.to(torch.promote_types(x.dtype, torch.float32)) * scale   # fp32 math (fp64 stays fp64)
    if causal_offset is not None:
        sq, sk = x.shape[-2], x.shape[-1]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=x.device).tril(causal_offset)
        z = z.masked_fill(~keep, float("-inf"))
        y = torch.softmax(z, -1).nan_to_num(0.0)           # rows that see nothing: zeros
    else:
        y = torch.softmax(z, -1)
    return y.to(x.dtype)


@_op("scaled_softmax", "(Tensor x, float scale, int? causal_offset=None) -> Tensor",
     lambda x, scale, causal_offset=None: _like(x))
def _scaled_softmax(x, scale, causal_offset=None):
    if not _native_ok(x):
        return _torch_forward(x, scale, causal_offset)
    from ..tex import _cpp_train as A
    sq = x.shape[-2] if causal_offset is not None else 1
    mode = _PLAIN if causal_offset is None else _CAUSAL
    return A._softmax_run(x, mode, float(scale), sq=sq, causal_off=int(causal_offset or 0))


@_op("scaled_softmax_bwd", "(Tensor dy, Tensor y, float scale) -> Tensor", lambda dy, y, scale: _like(y))
def _scaled_softmax_bwd(dy, y, scale):
    return K.softmax_bwd(dy, y, -1, scale)     # the facade softmax's backward, scaled


def _setup(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return OPS["scaled_softmax_bwd"](dy, y, ctx.scale), None, None


OPS["scaled_softmax"].register_autograd(_backward, setup_context=_setup)


def scaled_softmax(x: Tensor, scale: float = 1.0, causal_offset: Optional[int] = None) -> Tensor:
    """``softmax(x * scale)`` over the last axis in fp32 math, the result in ``x``'s dtype; with
    ``causal_offset=o``, row ``i`` of the last two axes sees only columns ``j <= i + o``."""
    return OPS["scaled_softmax"](x, float(scale), None if causal_offset is None else int(causal_offset))
