"""Hugging Face decoder layers with the residual add and the following RMSNorm as one kernel
(``add_rms_norm``, vLLM's ``fused_add_rms_norm``), for
:func:`tensor_ops.integrations.transformers.apply`.

A pre-norm decoder layer runs ``hidden = residual + hidden; residual = hidden;
hidden = self.post_attention_layernorm(hidden)``: the add reads two tensors and writes one,
the norm reads that one back and writes another. Fused, the pair reads two and writes two,
and autograd keeps one node instead of two.

How: the layer class's ``forward`` source is rewritten at exactly those three statements
(found line by line, comments and blank lines between them allowed) into one call of
:func:`add_norm`, compiled with the function's own globals and put back under its decorators.
A ``forward`` without that sequence (Gemma 2/3's sandwich norms, a future rewrite of the
layer) is left alone and reported as skipped: only code known to mean the same is replaced.
The replacement goes on the instance (``undo()`` deletes it), like the attention patch.
"""
from __future__ import annotations

import inspect
import re
import textwrap
import types

import torch

from .. import nn as tnn

_PATTERN = re.compile(
    r"^(?P<ind>[ \t]+)hidden_states = residual \+ hidden_states[ \t]*\n"
    r"(?:[ \t]*(?:#[^\n]*)?\n)*"
    r"[ \t]+residual = hidden_states[ \t]*\n"
    r"(?:[ \t]*(?:#[^\n]*)?\n)*"
    r"[ \t]+hidden_states = self\.(?P<norm>\w*norm\w*)\(hidden_states\)[ \t]*\n", re.M)
_CACHE: dict = {}        # layer class -> (new inner function | None, why)


def add_norm(norm, hidden, residual):
    """``(norm(residual + hidden), residual + hidden)``: one fused kernel when ``norm`` is a
    tensor_ops RMSNorm over the last axis (Gemma's ``offset`` too), the two steps otherwise."""
    from .. import torch as _tot
    if isinstance(norm, tnn.RMSNorm) and norm.weight is not None and len(norm.normalized_shape) == 1 \
            and hidden.shape == residual.shape and hidden.dtype == residual.dtype:
        eps = norm.eps if norm.eps is not None else torch.finfo(
            torch.float64 if hidden.dtype == torch.float64 else torch.float32).eps
        w = norm.weight.float() + norm.offset if norm.offset else norm.weight   # as RMSNorm.forward
        normed, s = _tot._call("add_rms_norm", hidden, residual, w, float(eps), backend=norm.backend)
        return normed, s
    s = residual + hidden
    return norm(s), s


def _rewrite(inner):
    """The layer's undecorated ``forward`` with the add + norm fused, or (None, why)."""
    code = getattr(inner, "__code__", None)
    if code is None or code.co_freevars:
        return None, "forward is not a plain function"
    try:
        src = textwrap.dedent(inspect.getsource(inner))
    except (OSError, TypeError):
        return None, "forward's source is not available"
    src = re.sub(r"\A(?:@[^\n]*\n(?:[ \t]+[^\n]*\n)*?)+(?=def )", "", src)   # its decorators: re-applied below
    hits = list(_PATTERN.finditer(src))
    if not hits:
        return None, "no 'residual + hidden_states' followed by a norm in forward"
    for m in reversed(hits):
        line = f"{m['ind']}hidden_states, residual = _tensor_ops_add_norm(self.{m['norm']}, hidden_states, residual)\n"
        src = src[:m.start()] + line + src[m.end():]
    # The function's own module globals, with add_norm among them: torch.compile resolves an
    # inlined function's globals as attributes of the module its __name__ names, so a copied
    # dict holding one more name failed there ("module ... has no attribute").
    glb = inner.__globals__
    glb["_tensor_ops_add_norm"] = add_norm
    ns: dict = {}
    exec(compile(src, f"<tensor_ops: {inner.__qualname__} with add_rms_norm>", "exec"), glb, ns)
    new = ns[inner.__name__]
    new.__defaults__, new.__kwdefaults__ = inner.__defaults__, inner.__kwdefaults__
    new.__qualname__ = inner.__qualname__
    return new, f"{len(hits)} residual add + norm fused"


def patch_layer(mod, rewrap) -> str | None:
    """Give decoder layer ``mod`` the fused forward; None if patched, else why not.
    ``rewrap(fn, new_inner)`` puts ``new_inner`` under ``fn``'s decorators."""
    cls = type(mod)
    if "forward" in vars(mod):
        return "forward already replaced on this module"
    if cls not in _CACHE:
        fn = cls.forward
        inner = fn
        while hasattr(inner, "__wrapped__"):
            inner = inner.__wrapped__
        new, why = _rewrite(inner)
        _CACHE[cls] = (None if new is None else rewrap(fn, new), why)
    new_fn, why = _CACHE[cls]
    if new_fn is None:
        return why
    mod.forward = types.MethodType(new_fn, mod)
    return None


def is_decoder_layer(mod) -> bool:
    return type(mod).__name__.endswith("DecoderLayer") and hasattr(mod, "mlp") and hasattr(mod, "self_attn")
