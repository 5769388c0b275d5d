"""Every facade op as a ``torch.library`` op in namespace ``tensor_ops``, with a fake (meta)
implementation and a registered backward, so autograd, ``torch.library.opcheck`` and
``torch.compile(fullgraph=True)`` work (imported by :func:`tensor_ops.torch.register`).

The norms (and the fused residual add + norm, ``add_rms_norm_fwd`` → ``(normed, s)``) follow
aten's own layer_norm / native_layer_norm design: the public op
(``tensor_ops::rms_norm``) is CompositeImplicitAutograd and calls a custom op that also
returns the per-row statistics (``rms_norm_fwd`` → ``(y, rsigma)``), whose autograd formula
saves them, so the backward reuses the forward's rsigma/mu as tex's norms do (and a weight of
another dtype is cast inside the composite, where autograd sees the cast). Every other op is
one ``custom_op``. Backward passes are custom ops too (``*_bwd``), so a compiled backward graph
holds them as single nodes; their kernels live in :mod:`._kernels`.

The implementations go through the facade (the resolver, ``backend=`` honoured); the schemas
take ``str? backend=None`` for that.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .._ops import FACADE_OPS
from . import _kernels as K

NS = "tensor_ops"
_LIB = torch.library.Library(NS, "FRAGMENT")   # the composite ops (custom_op keeps its own)
OPS: dict = {}                                   # name -> the custom op (OpOverload wrapper)
IMPLS: dict = {}                                 # name -> its Python body (what the custom op runs)
AUTOGRAD: dict = {}                              # name -> (setup_context, backward) as registered
#: ops whose backward is itself differentiable (rope's is rope, a custom op with autograd;
#: matmul's is torch matmuls): a double backward works through them, so the eager Functions
#: (._eager) keep their backward as it is; every other backward calls native kernels
TWICE_DIFFERENTIABLE = frozenset({"rope", "matmul"})


def _op(name: str, schema: str, fake):
    """Define ``tensor_ops::<name>`` with ``schema``; its body is ``K.<name>``-style ``impl``."""
    def deco(impl):
        op = torch.library.custom_op(f"{NS}::{name}", impl, mutates_args=(), schema=schema)
        op.register_fake(fake)
        OPS[name] = op
        IMPLS[name] = impl
        return op
    return deco


def _bwd(ctx, name: str):
    """The op a backward calls: the custom op (a compiled backward graph holds it as a node), or
    its Python body when ``ctx`` is an eager Function's (:mod:`._eager`: no dispatcher)."""
    return IMPLS[name] if getattr(ctx, "eager", False) else OPS[name]


def _like(x, shape=None, dtype=None):
    return x.new_empty(tuple(x.shape) if shape is None else tuple(shape), dtype=dtype or x.dtype)


def _stat(x):
    return _like(x, x.shape[:-1], torch.float64 if x.dtype == torch.float64 else torch.float32)


def _half(x):
    return _like(x, tuple(x.shape[:-1]) + (x.shape[-1] // 2,))


def _act_name(approximate: str) -> str:
    return "gelu_tanh" if approximate == "tanh" else "gelu"


# ----------------------------------------------------------------- norms

@_op("rms_norm_fwd", "(Tensor x, Tensor weight, float eps, str? backend=None) -> (Tensor, Tensor)",
     lambda x, weight, eps, backend=None: (_like(x), _stat(x)))
def _rms_norm_fwd(x, weight, eps, backend=None):
    return K.rms_norm_fwd(x, weight, eps, backend)


@_op("rms_norm_bwd", "(Tensor dy, Tensor x, Tensor rsigma, Tensor weight) -> (Tensor, Tensor)",
     lambda dy, x, rsigma, weight: (_like(x), _like(weight)))
def _rms_norm_bwd(dy, x, rsigma, weight):
    return K.rms_norm_bwd(dy, x, rsigma, weight)


def _rms_setup(ctx, inputs, output):
    x, weight = inputs[0], inputs[1]
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)     # no zero-filled gradient for the statistics


def _rms_backward(ctx, dy, _drs):
    if dy is None:
        return None, None, None, None
    x, weight, rs = ctx.saved_tensors
    dx, dw = _bwd(ctx, "rms_norm_bwd")(dy, x, rs, weight)
    return dx, dw, None, None


@_op("layer_norm_fwd",
     "(Tensor x, Tensor weight, Tensor? bias, float eps, str? backend=None) -> (Tensor, Tensor, Tensor)",
     lambda x, weight, bias, eps, backend=None: (_like(x), _stat(x), _stat(x)))
def _layer_norm_fwd(x, weight, bias, eps, backend=None):
    return K.layer_norm_fwd(x, weight, bias, eps, backend)


@_op("layer_norm_bwd", "(Tensor dy, Tensor x, Tensor mu, Tensor rsigma, Tensor weight) -> (Tensor, Tensor, Tensor)",
     lambda dy, x, mu, rsigma, weight: (_like(x), _like(weight), _like(weight)))
def _layer_norm_bwd(dy, x, mu, rsigma, weight):
    return K.layer_norm_bwd(dy, x, mu, rsigma, weight)


def _ln_setup(ctx, inputs, output):
    x, weight, bias = inputs[0], inputs[1], inputs[2]
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)


def _ln_backward(ctx, dy, _dmu, _drs):
    if dy is None:
        return None, None, None, None, None
    x, weight, mu, rs = ctx.saved_tensors
    dx, dw, db = _bwd(ctx, "layer_norm_bwd")(dy, x, mu, rs, weight)
    return dx, dw, (db if ctx.has_bias else None), None, None


def _cast(t, x):
    return t if t is None or t.dtype == x.dtype else t.to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, backend=None, _fwd=OPS.__getitem__) -> Tensor:
    return _fwd("rms_norm_fwd")(x, _cast(weight, x), eps, backend)[0]


def layer_norm(x: Tensor, weight: Tensor, bias=None, eps: float = 1e-5, backend=None, _fwd=OPS.__getitem__) -> Tensor:
    return _fwd("layer_norm_fwd")(x, _cast(weight, x), _cast(bias, x), eps, backend)[0]


# The fused residual add + norm: the forward is the fused kernel (through the facade); the
# backward a composite: d(normed) through the norm's backward into s (statistics recomputed
# from the saved s), plus d(s), is the gradient of both x and residual.

@_op("add_rms_norm_fwd",
     "(Tensor x, Tensor residual, Tensor weight, float eps, str? backend=None) -> (Tensor, Tensor)",
     lambda x, residual, weight, eps, backend=None: (_like(x), _like(x)))
def _add_rms_norm_fwd(x, residual, weight, eps, backend=None):
    return K.forward("add_rms_norm", (x, residual, weight, eps), backend)


@_op("add_layer_norm_fwd",
     "(Tensor x, Tensor residual, Tensor weight, Tensor? bias, float eps, str? backend=None) -> (Tensor, Tensor)",
     lambda x, residual, weight, bias, eps, backend=None: (_like(x), _like(x)))
def _add_layer_norm_fwd(x, residual, weight, bias, eps, backend=None):
    return K.forward("add_layer_norm", (x, residual, weight, bias, eps), backend)


def _add_setup(ctx, inputs, output):
    layer = len(inputs) == 6
    ctx.layer, ctx.eps = layer, inputs[4 if layer else 3]
    ctx.has_bias = layer and inputs[3] is not None
    ctx.save_for_backward(inputs[2], output[1])
    ctx.set_materialize_grads(False)


def _add_backward(ctx, dy, ds):
    weight, s = ctx.saved_tensors
    dw = db = None
    dx = ds
    if dy is not None:
        if ctx.layer:
            mu, rs = K.ln_stats(s, ctx.eps)
            dn, dw, db = _bwd(ctx, "layer_norm_bwd")(dy, s, mu, rs, weight)
        else:
            dn, dw = _bwd(ctx, "rms_norm_bwd")(dy, s, K.rms_stats(s, ctx.eps), weight)
        dx = dn if ds is None else dn + ds
    if ctx.layer:
        return dx, dx, dw, (db if ctx.has_bias else None), None, None
    return dx, dx, dw, None, None


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, backend=None, _fwd=OPS.__getitem__):
    return _fwd("add_rms_norm_fwd")(x, _cast(residual, x), _cast(weight, x), eps, backend)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias=None, eps: float = 1e-5, backend=None,
                   _fwd=OPS.__getitem__):
    return _fwd("add_layer_norm_fwd")(x, _cast(residual, x), _cast(weight, x), _cast(bias, x), eps, backend)


# ----------------------------------------------------------------- softmax

@_op("softmax", "(Tensor x, int axis=-1, str? backend=None) -> Tensor", lambda x, axis=-1, backend=None: _like(x))
def _softmax(x, axis=-1, backend=None):
    return K.forward("softmax", (x, axis), backend)


@_op("softmax_bwd", "(Tensor dy, Tensor y, int axis) -> Tensor", lambda dy, y, axis: _like(y))
def _softmax_bwd(dy, y, axis):
    return K.softmax_bwd(dy, y, axis)


def _softmax_setup(ctx, inputs, output):
    ctx.axis = inputs[1]
    ctx.save_for_backward(output)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return _bwd(ctx, "softmax_bwd")(dy, y, ctx.axis), None, None


# ----------------------------------------------------------------- activations

@_op("silu", "(Tensor x, str? backend=None) -> Tensor", lambda x, backend=None: _like(x))
def _silu(x, backend=None):
    return K.forward("silu", (x,), backend)


@_op("relu", "(Tensor x, str? backend=None) -> Tensor", lambda x, backend=None: _like(x))
def _relu(x, backend=None):
    return K.forward("relu", (x,), backend)


@_op("gelu", "(Tensor x, str approximate=\"none\", str? backend=None) -> Tensor",
     lambda x, approximate="none", backend=None: _like(x))
def _gelu(x, approximate="none", backend=None):
    return K.forward("gelu", (x, approximate), backend)


@_op("act_bwd", "(Tensor dy, Tensor x, str act) -> Tensor", lambda dy, x, act: _like(x))
def _act_bwd(dy, x, act):
    return K.act_bwd(act, dy, x)


def _save_x(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.act = None if len(inputs) < 3 else _act_name(inputs[1])


def _unary_backward(act):
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        n_extra = 1 if act is None else 2
        return (_bwd(ctx, "act_bwd")(dy, x, ctx.act or act),) + (None,) * n_extra
    return backward


@_op("swiglu", "(Tensor x, str? backend=None) -> Tensor", lambda x, backend=None: _half(x))
def _swiglu(x, backend=None):
    return K.forward("swiglu", (x,), backend)


@_op("geglu", "(Tensor x, str approximate=\"none\", str? backend=None) -> Tensor",
     lambda x, approximate="none", backend=None: _half(x))
def _geglu(x, approximate="none", backend=None):
    return K.forward("geglu", (x, approximate), backend)


@_op("glu_bwd", "(Tensor dy, Tensor x, str act) -> Tensor", lambda dy, x, act: _like(x))
def _glu_bwd(dy, x, act):
    return K.glu_bwd(act, dy, x)


def _gated_backward(act):
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return (_bwd(ctx, "glu_bwd")(dy, x, ctx.act or act),) + (None,) * (1 if act == "silu" else 2)
    return backward


# Two operands (Hugging Face's MLP: act(gate_proj(x)) * up_proj(x)): no facade twin.
@_op("silu_mul", "(Tensor a, Tensor b, str? backend=None) -> Tensor", lambda a, b, backend=None: _like(a))
def _silu_mul(a, b, backend=None):
    _check_pair("silu_mul", a, b)
    return K.glu2("silu", a, b, backend)


@_op("gelu_mul", "(Tensor a, Tensor b, str approximate=\"none\", str? backend=None) -> Tensor",
     lambda a, b, approximate="none", backend=None: _like(a))
def _gelu_mul(a, b, approximate="none", backend=None):
    _check_pair("gelu_mul", a, b)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' (exact erf) or 'tanh', got {approximate!r}")
    return K.glu2(_act_name(approximate), a, b, backend)


@_op("glu2_bwd", "(Tensor dy, Tensor a, Tensor b, str act) -> (Tensor, Tensor)",
     lambda dy, a, b, act: (_like(a), _like(b)))
def _glu2_bwd(dy, a, b, act):
    return K.glu2_bwd(act, dy, a, b)


def _check_pair(op, a, b):
    for name, t in (("a", a), ("b", b)):
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64, got "
                            f"{str(t.dtype).replace('torch.', '')}")
    if b.dtype != a.dtype:
        raise TypeError(f"b must have the dtype of a ({str(a.dtype).replace('torch.', '')}), got "
                        f"{str(b.dtype).replace('torch.', '')}")
    if a.shape != b.shape:
        raise ValueError(f"b must have the shape of a {tuple(a.shape)} for {op}, got {tuple(b.shape)}")
    if a.device != b.device:
        raise ValueError(f"b is on {b.device} but a is on {a.device}: pass both on the same device")


def _pair_setup(ctx, inputs, output):
    ctx.act = "silu" if len(inputs) == 3 else _act_name(inputs[2])
    ctx.n_extra = len(inputs) - 2
    ctx.save_for_backward(inputs[0], inputs[1])


def _pair_backward(ctx, dy):
    a, b = ctx.saved_tensors
    da, db = _bwd(ctx, "glu2_bwd")(dy, a, b, ctx.act)
    return (da, db) + (None,) * ctx.n_extra


# ----------------------------------------------------------------- rope, matmul

@_op("rope", "(Tensor x, Tensor cos, Tensor sin, bool interleaved=False, str? backend=None) -> Tensor",
     lambda x, cos, sin, interleaved=False, backend=None: _like(x))
def _rope(x, cos, sin, interleaved=False, backend=None):
    return K.forward("rope", (x, cos, sin, interleaved), backend)


def _rope_setup(ctx, inputs, output):
    x, cos, sin, interleaved, backend = inputs
    ctx.interleaved, ctx.backend = interleaved, backend
    tables = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    ctx.save_for_backward(cos, sin, x if tables else None)


def _rope_backward(ctx, dy):
    """dx = R^T dy: the rotation by -angle, i.e. rope with cos and -sin' where sin' pairs each
    element with its partner's sine (the halves / pairs of a (T, n) table swapped; a (T, n/2)
    table is its own swap)."""
    cos, sin, x = ctx.saved_tensors
    dx = None
    if ctx.needs_input_grad[0]:
        s = sin
        if dy.shape[-1] == s.shape[-1]:
            h = s.shape[-1] // 2
            s = (s.unflatten(-1, (h, 2)).flip(-1).flatten(-2) if ctx.interleaved
                 else torch.cat([s[..., h:], s[..., :h]], -1))
        dx = _bwd(ctx, "rope")(dy.contiguous(), cos, torch.neg(s), ctx.interleaved, ctx.backend)
    dc = ds = None
    if x is not None:
        dc, ds = K.rope_table_grads(dy, x, cos, sin, ctx.interleaved)
    return dx, dc, ds, None, None


def _mm_shape(a, b):
    sa, sb = tuple(a.shape), tuple(b.shape)
    batch = torch.broadcast_shapes(sa[:-2], sb[:-2])
    return tuple(batch) + ((sa[-2],) if len(sa) >= 2 else ()) + ((sb[-1],) if len(sb) >= 2 else ())


@_op("matmul", "(Tensor a, Tensor b, str? backend=None) -> Tensor",
     lambda a, b, backend=None: a.new_empty(_mm_shape(a, b), dtype=torch.promote_types(a.dtype, b.dtype)))
def _matmul(a, b, backend=None):
    return K.forward("matmul", (a, b), backend)


def _mm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])


def _mm_backward(ctx, dy):
    """NumPy-semantics matmul gradients: 1-D operands promoted, broadcast batch dims summed."""
    a, b = ctx.saved_tensors
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    g = dy
    if a.dim() == 1:
        g = g.unsqueeze(-2)
    if b.dim() == 1:
        g = g.unsqueeze(-1)
    da = db = None
    if ctx.needs_input_grad[0]:
        da = torch.matmul(g, b2.transpose(-1, -2).to(g.dtype)).sum_to_size(a2.shape).reshape(a.shape).to(a.dtype)
    if ctx.needs_input_grad[1]:
        db = torch.matmul(a2.transpose(-1, -2).to(g.dtype), g).sum_to_size(b2.shape).reshape(b.shape).to(b.dtype)
    return da, db, None


# ----------------------------------------------------------------- registration

def _autograd(name: str, backward, setup) -> None:
    """``OPS[name].register_autograd``, and the pair kept for :mod:`._eager` (the same formulas
    as an ``autograd.Function`` for eager calls)."""
    OPS[name].register_autograd(backward, setup_context=setup)
    AUTOGRAD[name] = (setup, backward)


_autograd("rms_norm_fwd", _rms_backward, _rms_setup)
_autograd("layer_norm_fwd", _ln_backward, _ln_setup)
_autograd("add_rms_norm_fwd", _add_backward, _add_setup)
_autograd("add_layer_norm_fwd", _add_backward, _add_setup)
_autograd("softmax", _softmax_backward, _softmax_setup)
_autograd("silu", _unary_backward("silu"), _save_x)
_autograd("relu", _unary_backward("relu"), _save_x)
_autograd("gelu", _unary_backward(None), _save_x)
_autograd("swiglu", _gated_backward("silu"), _save_x)
_autograd("geglu", _gated_backward(None), _save_x)
_autograd("silu_mul", _pair_backward, _pair_setup)
_autograd("gelu_mul", _pair_backward, _pair_setup)
_autograd("rope", _rope_backward, _rope_setup)
_autograd("matmul", _mm_backward, _mm_setup)

_LIB.define("rms_norm(Tensor x, Tensor weight, float eps=1e-06, str? backend=None) -> Tensor")
_LIB.impl("rms_norm", rms_norm, "CompositeImplicitAutograd")
_LIB.define("layer_norm(Tensor x, Tensor weight, Tensor? bias=None, float eps=1e-05, str? backend=None) -> Tensor")
_LIB.impl("layer_norm", layer_norm, "CompositeImplicitAutograd")
_LIB.define("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-06, str? backend=None) "
            "-> (Tensor, Tensor)")
_LIB.impl("add_rms_norm", add_rms_norm, "CompositeImplicitAutograd")
_LIB.define("add_layer_norm(Tensor x, Tensor residual, Tensor weight, Tensor? bias=None, float eps=1e-05, "
            "str? backend=None) -> (Tensor, Tensor)")
_LIB.impl("add_layer_norm", add_layer_norm, "CompositeImplicitAutograd")

#: the facade ops, by name, as torch ops (what the facade calls for autograd); the names come
#: from the op definitions, so a facade op without its torch op fails here, at registration
FACADE = {name: getattr(torch.ops.tensor_ops, name) for name in FACADE_OPS}
_SCALARS = {"rms_norm": (None, None, float), "layer_norm": (None, None, None, float), "softmax": (None, int),
            "add_rms_norm": (None, None, None, float), "add_layer_norm": (None, None, None, None, float),
            "gelu": (None, str), "geglu": (None, str), "rope": (None, None, None, bool)}


def schema_args(op: str, args: tuple) -> tuple:
    """A facade call's arguments with its scalars converted as the op's schema types them."""
    conv = _SCALARS.get(op)
    return args if conv is None else tuple(a if c is None else c(a) for a, c in zip(args, conv))


def autograd_call(op: str, args: tuple, backend=None):
    """The facade call ``op(*args)`` through its torch op (validated by the facade already)."""
    return FACADE[op](*schema_args(op, args), backend=backend)

