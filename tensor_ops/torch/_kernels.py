"""The kernels behind the custom ops' implementations: forwards with the statistics the
backward reuses, and the backward passes.

Who computes what:

- **forward** of every op: the facade (the resolver picks the backend, as for any call). The
  norms need their per-row statistics too (rsigma, and mu for layer_norm): when the resolver
  always picks the cpp kernel and no override is in force, its entry computes y and them in
  one native call (``PlainEntry.stats``: ``_cpp._fast_rms_norm_stats`` & co., the plain case
  only); else, when the resolver picks cpp for this call, its kernel writes them in the same
  pass (``rsigma=``/``mu=``, as tex's norms do); any other backend computes y and the
  statistics come from a torch formula.
- **backward** on CPU tensors of float32/float16/bfloat16 with the cpp backend available:
  native kernels. The plain case (C-contiguous tensors of one dtype, the statistics float32,
  grad mode off as in a backward) in one call each: ``_cpp._fast_rms_norm_bwd``,
  ``_fast_layer_norm_bwd``, ``_fast_act_bwd``, ``_fast_glu_bwd``, ``_fast_softmax_bwd``
  (fast_entry.cpp: checks, fresh outputs and torch views in C; a (1, 4096) backward through
  the Python below cost 40-100 µs). They return None for anything else, which takes:
  norms: ``_cpp.rms_norm_bwd``/``layer_norm_bwd`` (norm.cpp, the tex kernels).
  Gated ops (both layouts) and the exact-GELU derivative: this package's ``_cpp.glu_bwd``,
  ``glu2_bwd``, ``gelu_erf_bwd`` (cpp_ext/backward.cpp). silu, tanh-GELU, relu and softmax:
  the tex ops ``tex.dsilu``/``dgelu``/``drelu``/``scaled_softmax_backward`` (native where
  tex has cpp kernels for them, its torch reference otherwise). rope: the forward itself
  with ``-sin`` (a rotation's transpose is the opposite rotation; _library._rope_backward).
- **everything else** (float64, other devices, no cpp): torch formulas, in float32 for
  16-bit storage and in float64 for float64 (so ``torch.autograd.gradcheck`` sees exact
  derivatives).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import _facade, _global, _state
from .. import _torch_facade as _tf
from .._arrays import is_bf16
from .._ops import SPECS
from .._torch_facade import host_views, route, to_torch

_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K0, _K1 = math.sqrt(2.0 / math.pi), 0.044715


def cpp():
    """The native module when the cpp backend is available, else None."""
    from ..backends import cpp as backend
    ok, _ = backend.availability()
    return backend.native() if ok else None


def native_ok(*ts, binding: str = "") -> bool:
    """CPU tensors of one native dtype, cpp available (with ``binding`` when named)."""
    dt = ts[0].dtype
    if dt not in _NATIVE_DTYPES or any(t.device.type != "cpu" or t.dtype is not dt for t in ts):
        return False
    mod = cpp()
    return mod is not None and (not binding or hasattr(mod, binding))


def _np(t):
    """A NumPy view of a C-contiguous tensor for a native call (bfloat16 as int16 bits)."""
    if t.requires_grad:
        t = t.detach()
    return t.view(torch.int16).numpy() if t.dtype is torch.bfloat16 else t.numpy()


def _nps(*ts) -> tuple:
    """:func:`_np` of each C-contiguous tensor, made by the cpp module in one call when it can
    (``_torch_views``: 2.8 µs for two tensors against 3.2 µs each through ``to_numpy``, timeit)."""
    mk = _tf._VIEWS[0]
    vs = mk(*ts) if mk is not None else None
    if vs is None:
        return tuple(_np(t) for t in ts)
    return tuple(v.view(np.int16) if is_bf16(v.dtype) else v for v in vs)


def _kw(t):
    return "bfloat16" if t.dtype is torch.bfloat16 else None


def _math(t):
    return t.double() if t.dtype is torch.float64 else t.float()


def _stat_dtype(x):
    return torch.float64 if x.dtype is torch.float64 else torch.float32


# ----------------------------------------------------------------- forward

def forward(op: str, args: tuple, backend):
    """The facade's forward for torch tensors, never through autograd (the custom ops' body).

    Its native plain-call entry first, as the facade function does (``args`` are the facade's
    positional arguments): in an ``autograd.Function``'s forward grad mode is off, so tensors
    that require grad are plain to it; anything it declines takes the torch facade's route."""
    if backend is None and _state.global_backend is None and _state.context_backend.get() is None:
        f = _state.fast_fns.get(op)
        r = f(*args) if f is not None else None
        if r is not None:
            return r
    return route(SPECS[op], args, None, backend, _facade._general_arrays, grad=False)


def _choice(op, x, args, backend):
    """(resolution, prepared call, impl) the resolver would run for this CPU call, or None."""
    spec = SPECS[op]
    p = spec.prepare(*host_views(spec, args), None)
    if p.args is None:
        return None
    m = _global.manager()
    override = backend or _state.context_backend.get() or _state.global_backend
    res = m.resolve(op, override, "facade", _facade._dtype_name(p.dtype), p.nbytes, "torch-cpu")
    for impl in res.candidates:
        if impl.supports is None or impl.supports(*p.args):
            return res, p, impl
    return res, p, None


def _native_stats(op, x, args, backend):
    """The cpp kernel's call with statistics when the resolver picks cpp for it, else None."""
    if x.device.type != "cpu" or x.dtype not in _NATIVE_DTYPES:
        return None
    got = _choice(op, x, args, backend)
    if got is None:
        return None
    res, p, impl = got
    mod = cpp()
    if impl is None or mod is None or impl.backend != "cpp" or impl.fn is not getattr(mod, op, None):
        return None     # another backend (or a wrapped/fault-injected cpp fn): the facade runs it
    by = res.by_impl
    by[impl.impl_id] = by.get(impl.impl_id, 0) + 1
    return mod, p


def _stats_entry(op: str, backend):
    """The native entry computing ``op`` with its statistics (``PlainEntry.stats``) when the
    resolver always picks its impl and no override is in force, else None. It takes the plain
    case (contiguous tensors of one dtype, weights of x's; requires_grad is fine: a
    Function's forward runs with grad mode off) and declines the rest with None."""
    if backend is None and _state.global_backend is None and _state.context_backend.get() is None:
        return _state.fast_stats_fns.get(op)
    return None


def rms_norm_fwd(x, w, eps: float, backend):
    """(y, rsigma): rsigma = 1/sqrt(mean(x^2) + eps) per row, shape x.shape[:-1]."""
    f = _stats_entry("rms_norm", backend)
    if f is not None:
        r = f(x, w, eps)
        if r is not None:
            return r
    got = _native_stats("rms_norm", x, (x, w, eps), backend) if x.numel() else None
    if got is not None:
        mod, p = got
        rs = np.empty(p.args[0].shape[0], np.float32)
        y = mod.rms_norm(p.args[0], p.args[1], p.args[2], None, rsigma=rs)
        return _shaped(y, x.shape), torch.from_numpy(rs.reshape(x.shape[:-1]))
    stats = x.new_empty(x.shape[:-1], dtype=_stat_dtype(x))
    y = forward("rms_norm", (x, w, eps), backend)
    if x.numel():
        stats.copy_(torch.rsqrt(_math(x).square().mean(-1) + eps))
    return y, stats


def layer_norm_fwd(x, w, b, eps: float, backend):
    """(y, mu, rsigma): per-row mean and 1/sqrt(var + eps), shape x.shape[:-1]."""
    f = _stats_entry("layer_norm", backend)
    if f is not None:
        r = f(x, w, b, eps)
        if r is not None:
            return r
    got = _native_stats("layer_norm", x, (x, w, b, eps), backend) if x.numel() else None
    if got is not None:
        mod, p = got
        a = p.args
        rows = x.shape[:-1]
        mu_a, rs_a = np.empty(a[0].shape[0], np.float32), np.empty(a[0].shape[0], np.float32)
        y = mod.layer_norm(a[0], a[1], a[2], a[3], None, mu=mu_a, rsigma=rs_a)
        return _shaped(y, x.shape), torch.from_numpy(mu_a.reshape(rows)), torch.from_numpy(rs_a.reshape(rows))
    mu = x.new_empty(x.shape[:-1], dtype=_stat_dtype(x))
    rs = torch.empty_like(mu)
    y = forward("layer_norm", (x, w, b, eps), backend)
    if x.numel():
        xm = _math(x)
        m = xm.mean(-1)
        mu.copy_(m)
        rs.copy_(torch.rsqrt((xm - m.unsqueeze(-1)).square().mean(-1) + eps))
    return y, mu, rs


def _shaped(y, shape):
    """The native kernel's 2-D result as a tensor of ``shape`` (reshaped as an array: cheaper)."""
    return to_torch(y.reshape(shape) if y.shape != shape else y)


def rms_stats(s, eps: float):
    """rsigma of rows ``s`` (the fused add's saved sum), as rms_norm_fwd gives it."""
    return torch.rsqrt(_math(s).square().mean(-1) + eps).to(_stat_dtype(s))


def ln_stats(s, eps: float):
    """(mu, rsigma) of rows ``s``, as layer_norm_fwd gives them."""
    sm = _math(s)
    m = sm.mean(-1)
    rs = torch.rsqrt((sm - m.unsqueeze(-1)).square().mean(-1) + eps)
    return m.to(_stat_dtype(s)), rs.to(_stat_dtype(s))


def glu2(act: str, a, b, backend):
    """act(a) * b on two operands of one shape (Hugging Face's gate and up projections)."""
    if a.numel() and native_ok(a, b, binding="glu2") and _first_backend("swiglu", a, backend) == "cpp":
        out = _empty(a.shape, a.dtype)
        cpp().glu2(*_nps(a.contiguous(), b.contiguous(), out), act=act, dtype=_kw(a))
        return out
    return (_act(act, _math(a)) * _math(b)).to(a.dtype)


def _first_backend(op, x, backend):
    """The backend the resolver puts first for ``op`` on host input like ``x`` (the two-operand
    gated ops follow their one-operand op's order), or None when that order cannot run."""
    m = _global.manager()
    override = backend or _state.context_backend.get() or _state.global_backend
    name = "bfloat16" if x.dtype is torch.bfloat16 else str(x.dtype).replace("torch.", "")
    try:
        res = m.resolve(op, override, "facade", name, x.numel() * x.element_size(), "torch-cpu")
    except Exception:      # e.g. a forced backend that is unavailable: the torch formula serves
        return None
    host = [i for i in res.candidates if not i.declines_host]
    return host[0].backend if host else None


def _empty(shape, dtype):
    """A new CPU tensor; 1 MiB and up from the cpp module's output block cache (see tex)."""
    n = math.prod(shape)
    if n * (4 if dtype is torch.float32 else 2) < (1 << 20):
        return torch.empty(shape, dtype=dtype)
    mod = cpp()
    a = mod.empty(tuple(shape), {torch.float32: "float32", torch.float16: "float16"}.get(dtype, "int16"))
    t = torch.from_numpy(a)
    return t.view(torch.bfloat16) if dtype is torch.bfloat16 else t


# ----------------------------------------------------------------- backward

def _entry(name: str):
    """``tensor_ops._cpp.<name>`` once the cpp backend is available (looked up once), else None."""
    f = _ENTRIES.get(name)
    if f is None:
        mod = cpp()
        if not _tf._NATIVE[0]:
            _tf._native_entries()       # the entries take torch tensors once the module knows torch
        f = getattr(mod, name, None) if mod is not None else None
        if f is not None:
            _ENTRIES[name] = f
    return f


_ENTRIES: dict = {}


def rms_norm_bwd(dy, x, rs, w):
    dy = dy.contiguous()
    f = _entry("_fast_rms_norm_bwd")    # the plain case in one native call (fast_entry.cpp)
    r = f(dy, x, rs, w) if f is not None else None
    if r is not None:
        return r
    if native_ok(dy, x, w, binding="rms_norm_bwd") and x.numel():
        dx, dw = _empty(x.shape, x.dtype), torch.empty(w.shape, dtype=w.dtype)
        cpp().rms_norm_bwd(*_nps(dy, x.contiguous(), rs.float().contiguous(), w.contiguous(), dx, dw), False,
                           dtype=_kw(x))
        return dx, dw
    n = x.shape[-1]
    xm, g, r = _math(x), _math(dy), _math(rs).unsqueeze(-1)
    xhat = xm * r
    gw = g * _math(w)
    dx = r * (gw - xhat * (gw * xhat).sum(-1, keepdim=True) / max(n, 1))
    dw = (g * xhat).reshape(-1, n).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


def layer_norm_bwd(dy, x, mu, rs, w):
    dy = dy.contiguous()
    f = _entry("_fast_layer_norm_bwd")
    r = f(dy, x, mu, rs, w) if f is not None else None
    if r is not None:
        return r
    if native_ok(dy, x, w, binding="layer_norm_bwd") and x.numel():
        dx, dw, db = _empty(x.shape, x.dtype), torch.empty(w.shape, dtype=w.dtype), torch.empty(w.shape, dtype=w.dtype)
        cpp().layer_norm_bwd(*_nps(dy, x.contiguous(), mu.float().contiguous(), rs.float().contiguous(), w.contiguous(),
                                   dx, dw, db), False, dtype=_kw(x))
        return dx, dw, db
    n = x.shape[-1]
    g, r = _math(dy), _math(rs).unsqueeze(-1)
    xhat = (_math(x) - _math(mu).unsqueeze(-1)) * r
    gw = g * _math(w)
    dx = r * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (g * xhat).reshape(-1, n).sum(0).to(w.dtype), g.reshape(-1, n).sum(0).to(w.dtype)


def softmax_bwd(dy, y, axis: int, scale: float = 1.0):
    """dx of ``y = softmax(scale * x)``: ``scale * y * (dy - sum(dy * y))`` along ``axis``."""
    dy = (dy if dy.dtype == y.dtype else dy.to(y.dtype)).contiguous()
    f = _entry("_fast_softmax_bwd") if axis in (-1, y.dim() - 1) else None
    r = f(dy, y, float(scale)) if f is not None else None
    if r is not None:
        return r
    if y.dtype is not torch.float64 and y.dim() and axis % y.dim() == y.dim() - 1 and y.numel():
        from .. import tex
        return tex.scaled_softmax_backward(dy, y.contiguous(), float(scale))
    g, ym = _math(dy), _math(y)
    return (scale * ym * (g - (g * ym).sum(axis, keepdim=True))).to(y.dtype)


def _sigmoid_parts(x):
    s = torch.sigmoid(x)
    return x * s, s + x * s * (1 - s)


def _act(act, x):
    """act(x) in x's (math) dtype."""
    if act == "silu":
        return x * torch.sigmoid(x)
    if act == "gelu":
        return 0.5 * x * (1 + torch.erf(x * _SQRT_HALF))
    if act == "gelu_tanh":
        return 0.5 * x * (1 + torch.tanh(_K0 * (x + _K1 * x ** 3)))
    return torch.clamp_min(x, 0)


def _dact(act, x):
    """act'(x) in x's (math) dtype."""
    if act == "silu":
        return _sigmoid_parts(x)[1]
    if act == "gelu":
        return 0.5 * (1 + torch.erf(x * _SQRT_HALF)) + x * _INV_SQRT_2PI * torch.exp(-0.5 * x * x)
    if act == "gelu_tanh":
        t = torch.tanh(_K0 * (x + _K1 * x ** 3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _K0 * (1 + 3 * _K1 * x * x)
    return (x > 0).to(x.dtype)


_TEX_DACT = {"silu": "dsilu", "gelu_tanh": "dgelu", "relu": "drelu"}


def act_bwd(act: str, dy, x):
    """dy * act'(x) for act in silu, gelu (erf), gelu_tanh, relu."""
    dy = dy.contiguous()
    f = _entry("_fast_act_bwd")
    r = f(dy, x, act) if f is not None else None
    if r is not None:
        return r
    if x.numel() and x.dtype is not torch.float64 and x.device.type == "cpu":
        if act == "gelu" and native_ok(dy, x, binding="gelu_erf_bwd"):
            out = _empty(x.shape, x.dtype)
            cpp().gelu_erf_bwd(*_nps(dy, x.contiguous(), out), dtype=_kw(x))
            return out
        if act in _TEX_DACT and dy.dtype is x.dtype:
            from .. import tex
            return getattr(tex, _TEX_DACT[act])(dy, x.contiguous(), None)
    return (_math(dy) * _dact(act, _math(x))).to(x.dtype)


def glu_bwd(act: str, dy, x):
    """dx of act(a) * b with x = [a | b] (the facade's swiglu/geglu)."""
    dy = dy.contiguous()
    f = _entry("_fast_glu_bwd")
    r = f(dy, x, act) if f is not None else None
    if r is not None:
        return r
    if x.numel() and native_ok(dy, x, binding="glu_bwd"):
        dx = _empty(x.shape, x.dtype)
        cpp().glu_bwd(*_nps(dy, x.contiguous(), dx), act=act, dtype=_kw(x))
        return dx
    h = x.shape[-1] // 2
    xm = _math(x)
    da, db = _glu2_formula(act, _math(dy), xm[..., :h], xm[..., h:])
    return torch.cat([da, db], -1).to(x.dtype)


def glu2_bwd(act: str, dy, a, b):
    """(da, db) of act(a) * b."""
    dy = dy.contiguous()
    if a.numel() and native_ok(dy, a, b, binding="glu2_bwd"):
        da, db = _empty(a.shape, a.dtype), _empty(a.shape, a.dtype)
        cpp().glu2_bwd(*_nps(dy, a.contiguous(), b.contiguous(), da, db), act=act, dtype=_kw(a))
        return da, db
    da, db = _glu2_formula(act, _math(dy), _math(a), _math(b))
    return da.to(a.dtype), db.to(b.dtype)


def _glu2_formula(act, g, a, b):
    return g * b * _dact(act, a), g * _act(act, a)


def rope_table_grads(dy, x, cos, sin, interleaved: bool):
    """d(cos), d(sin) (rarely needed: tables usually come from positions): y = x*c + rot(x)*s
    with (T, n) tables, so dc = sum over the batch of dy*x, ds = sum of dy*rot(x), folded back
    to a (T, n/2) table's shape when one was given."""
    n = x.shape[-1]
    xm, g = _math(x), _math(dy)
    rot = torch.empty_like(xm)
    if interleaved:
        rot[..., 0::2], rot[..., 1::2] = -xm[..., 1::2], xm[..., 0::2]
    else:
        h = n // 2
        rot[..., :h], rot[..., h:] = -xm[..., h:], xm[..., :h]
    t = x.shape[-2]
    dc = (g * xm).reshape(-1, t, n).sum(0)
    ds = (g * rot).reshape(-1, t, n).sum(0)
    out = []
    for d, tab in ((dc, cos), (ds, sin)):
        if tab.shape[-1] != n:
            d = d[..., 0::2] + d[..., 1::2] if interleaved else d[..., : n // 2] + d[..., n // 2:]
        out.append(d.reshape(tab.shape).to(tab.dtype))
    return out

