"""Hugging Face eager attention with its scale, causal mask, softmax and cast as one kernel
pass (``tensor_ops.torch.scaled_softmax``), for :func:`tensor_ops.integrations.transformers.apply`.

HF's ``eager_attention_forward`` runs ``matmul(q, k^T) * scaling``, ``+ attention_mask``,
``softmax(dtype=float32)``, ``.to(q.dtype)`` and ``dropout``: four or five full passes over
the (batch, heads, q, k) scores, each saved for the backward. The masks HF builds for these
models are, in the common case, exactly causal: ``0`` where key ``j <= i + (sk - sq)``,
``finfo(dtype).min`` elsewhere (``masking_utils``' eager mask). For those, and for no mask,
the fused op gives the same result (fp32 math; the masked entries are exact zeros either way)
in one pass forward and one backward. Any other mask (padding, sliding window, chunked,
custom) and any module whose eager function adds something (Gemma 2's logit softcap,
attention sinks) keeps the original function, so nothing changes meaning.

Recognising the mask costs one comparison over ``batch * q * k`` elements (1/heads of the
scores), done once per mask tensor: every layer of a forward pass receives the same tensor.
"""
from __future__ import annotations

import weakref

import torch

_LAST: dict = {"ref": None, "key": None, "kind": None}
_REF: dict = {}
_EXTRAS = ("softcap", "s_aux", "sinks")    # eager variants with more than scale + mask


def standard_eager(fn) -> bool:
    """Whether ``fn`` (a model module's ``eager_attention_forward``) is the plain form."""
    code = getattr(fn, "__code__", None)
    return code is not None and not any(n in code.co_varnames or n in code.co_names for n in _EXTRAS) \
        and "repeat_kv" in code.co_names and "repeat_kv" in fn.__globals__


def mask_kind(mask, sq: int, sk: int):
    """'none' (no mask), 'causal' (HF's aligned causal mask) or None (anything else)."""
    if mask is None:
        return "none"
    if torch.compiler.is_compiling() or not isinstance(mask, torch.Tensor) or not mask.is_floating_point() \
            or mask.dim() != 4 or mask.shape[1] != 1 or tuple(mask.shape[-2:]) != (sq, sk):
        return None
    key = (mask.data_ptr(), mask._version, tuple(mask.shape), tuple(mask.stride()), mask.dtype, sq, sk)
    ref = _LAST["ref"]
    if ref is not None and ref() is mask and _LAST["key"] == key:
        return _LAST["kind"]
    kind = "causal" if torch.equal(mask, _causal(sq, sk, mask.dtype, mask.device).expand_as(mask)) else None
    _LAST.update(ref=weakref.ref(mask), key=key, kind=kind)
    return kind


def _causal(sq: int, sk: int, dtype, device):
    """HF's eager causal mask (sq, sk): 0 where ``j <= i + sk - sq``, ``finfo.min`` elsewhere;
    the last one made is kept (decoding asks for a new sk every step, prefill for the same)."""
    key = (sq, sk, dtype, str(device))
    if _REF.get("key") != key:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=device).tril(sk - sq)
        _REF.update(key=key, mask=torch.zeros(sq, sk, dtype=dtype, device=device).masked_fill_(
            ~keep, torch.finfo(dtype).min))
    return _REF["mask"]


def fused_eager(original):
    """An ``eager_attention_forward`` that fuses scale + mask + softmax + cast where
    :func:`mask_kind` allows, and calls ``original`` (same signature) otherwise."""
    repeat_kv = original.__globals__["repeat_kv"]

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        sq, sk = query.shape[-2], key.shape[-2]
        kind = mask_kind(attention_mask, sq, sk) if query.device.type == "cpu" else None
        if kind is None:
            return original(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        from .. import torch as _tot
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
        scores = torch.matmul(query, key_states.transpose(2, 3))
        weights = _tot.scaled_softmax(scores, scaling, (sk - sq) if kind == "causal" else None)
        if dropout and module.training:
            weights = torch.nn.functional.dropout(weights, p=dropout, training=True)
        out = torch.matmul(weights, value_states).transpose(1, 2).contiguous()
        return out, weights

    eager_attention_forward.__wrapped__ = original
    return eager_attention_forward
