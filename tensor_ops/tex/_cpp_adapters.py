"""default.cpp: tex ops on CPU tensors through ``tensor_ops._cpp``, with zero-copy NumPy views.

bfloat16 tensors are viewed as int16 (``dtype="bfloat16"`` tells the kernels); outputs are
allocated as torch tensors and written in place, so nothing is copied either way. Each
adapter's ``supports`` accepts only what the kernel takes exactly (CPU, C-contiguous, the
dtype combinations it has); everything else goes to the next candidate without a warning.
No native code is loaded at registration: availability asks the cpp backend (which loads
and probes the module once) and checks that the kernel an adapter needs exists.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from . import _cpp_train
from ._cpp_base import _BF16, _F16, _F32, _empty, _empty_like, _flat, _kw, _native, _plain, _vec, _views

NAME = "cpp"
IMPL_ID = "default.cpp"


# ---------------------------------------------------------------- norms

def _sup_rms_fwd(input, weight, eps, ln_out, q, otype, sm, zc):
    dt = input.dtype
    return _plain(input) and _plain(weight, dt) and otype is dt and (ln_out is None or _plain(ln_out, dt))


def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    h = input.shape[-1]
    out = ln_out if ln_out is not None else _empty_like(input)
    rs = torch.empty(input.numel() // h if h else 0, dtype=_F32)
    xv, wv, ov, rv = _views(input, weight, out, rs)
    _native().rms_norm(xv, _vec(wv), eps, ov, rsigma=rv, zero_centered_gamma=zero_centered_gamma, dtype=_kw(input))
    return [out, None, rs]


def _sup_ln_fwd(input, weight, bias, eps, ln_out, q, otype, sm, zc):
    dt = input.dtype
    return (_plain(input) and _plain(weight, dt) and (bias is None or _plain(bias, dt)) and otype is dt
            and (ln_out is None or _plain(ln_out, dt)))


def layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    h = input.shape[-1]
    n = input.numel() // h if h else 0
    out = ln_out if ln_out is not None else _empty_like(input)
    mu = torch.empty(n, dtype=_F32)
    rs = torch.empty(n, dtype=_F32)
    xv, wv, bv, ov, mv, rv = _views(input, weight, bias, out, mu, rs)
    _native().layer_norm(xv, _vec(wv), None if bv is None else _vec(bv), eps, ov, mu=mv, rsigma=rv,
                         zero_centered_gamma=zero_centered_gamma, dtype=_kw(input))
    return [out, mu, rs]


def _sup_rms_bwd(dz, x, rsigma, gamma, sm, zc):
    dt = x.dtype
    return _plain(x) and _plain(dz, dt) and _plain(gamma, dt) and _plain(rsigma, _F32)


def rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx = _empty_like(x)
    dg = torch.empty_like(gamma)
    zv, xv, rv, gv, dxv, dgv = _views(dz, x, rsigma, gamma, dx, dg)
    _native().rms_norm_bwd(zv, xv, rv, _vec(gv), dxv, _vec(dgv), zero_centered_gamma, dtype=_kw(x))
    return [dx, dg]


def _sup_rms_bwd_add(dz, x, add, rsigma, gamma, sm, zc):
    # fp32 only: for 16-bit x the kernel rounds dx before the add (TE adds before rounding)
    return x.dtype is _F32 and _sup_rms_bwd(dz, x, rsigma, gamma, sm, zc) and _plain(add, _F32)


def rmsnorm_bwd_add(dz, x, add, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx, dg = rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma)
    dx.add_(add)
    return [dx, dg]


def _sup_ln_bwd(dz, x, mu, rsigma, gamma, sm, zc):
    return _sup_rms_bwd(dz, x, rsigma, gamma, sm, zc) and _plain(mu, _F32)


def layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx = _empty_like(x)
    dg = torch.empty_like(gamma)
    db = torch.empty_like(gamma)
    zv, xv, mv, rv, gv, dxv, dgv, dbv = _views(dz, x, mu, rsigma, gamma, dx, dg, db)
    _native().layer_norm_bwd(zv, xv, mv, rv, _vec(gv), dxv, _vec(dgv), _vec(dbv), zero_centered_gamma, dtype=_kw(x))
    return [dx, dg, db]


# ---------------------------------------------------------------- activations

def _sup_act(input, quantizer):
    return _plain(input)


def _unary(kernel, **extra):
    def fn(input, quantizer):
        out = _empty_like(input)
        xv, ov = _views(input, out)
        getattr(_native(), kernel)(xv, out=ov, dtype=_kw(input), **extra)
        return out
    return fn


def _glu(kernel, **extra):
    def fn(input, quantizer):
        out = _empty(tuple(input.shape[:-1]) + (input.shape[-1] // 2,), input.dtype)
        xv, ov = _views(input, out)
        getattr(_native(), kernel)(xv, out=ov, dtype=_kw(input), **extra)
        return out
    return fn


# ---------------------------------------------------------------- multi-tensor

def _no_fp16_bf16_mix(*ts):
    dts = {t.dtype for t in ts}
    return not (_F16 in dts and _BF16 in dts)  # one dtype= flag per call cannot say both


def _sup_adam(chunk, noop, lists, lr, b1, b2, eps, step, mode, bc, wd):
    master = lists[4] if len(lists) == 5 else None
    for i, (g, p, m, v) in enumerate(zip(*lists[:4])):
        if not (_plain(g) and _plain(p) and _plain(m, _F32) and _plain(v, _F32)):
            return False
        if master is not None and not _plain(master[i], _F32):
            return False
        if not _no_fp16_bf16_mix(g, p):
            return False
    return True


def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, bias_correction,
                      weight_decay):
    bc1 = 1.0 - beta1 ** step if bias_correction == 1 else 1.0
    bc2 = 1.0 - beta2 ** step if bias_correction == 1 else 1.0
    k = _native().adam_step
    grads, params, ms, vs = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) == 5 else None
    for i in range(len(grads)):
        g, p = grads[i], params[i]
        k(_flat(g), _flat(p), _flat(ms[i]), _flat(vs[i]), lr, beta1, beta2, eps, bc1, bc2, mode, weight_decay,
          None if masters is None else _flat(masters[i]), dtype=_kw(g, p))


def _sup_scale(chunk, noop, lists, scale):
    for i, o in zip(*lists):
        if not (_plain(i) and _plain(o) and _no_fp16_bf16_mix(i, o)):
            return False
        if i is not o and i.untyped_storage().data_ptr() == o.untyped_storage().data_ptr():
            return False  # the kernel takes exact in-place only; other aliasing goes to the reference
        if i is o and i.dtype is not o.dtype:
            return False
    return True


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    k = _native().scale
    bad = False
    for i, o in zip(*tensor_lists):
        bad |= bool(k(_flat(i), _flat(o), scale, dtype=_kw(i, o)))
    if bad:
        noop_flag.fill_(1)


def _sup_l2(chunk, noop, lists, *rest):
    return all(_plain(t) for t in lists[0])


def _l2(noop_flag, tensors, per_tensor, factor=1.0):
    k = _native().l2norm_sq
    sq = [k(_flat(t), dtype=_kw(t)) * factor for t in tensors]
    total = math.sqrt(math.fsum(sq)) if all(map(math.isfinite, sq)) else float("nan")
    if not math.isfinite(total):
        noop_flag.fill_(1)
    norm = torch.tensor([total], dtype=_F32)
    per = torch.tensor([math.sqrt(s) if s >= 0 else s for s in sq], dtype=_F32) if per_tensor else \
        torch.zeros(0, dtype=_F32)
    return norm, per


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    return _l2(noop_flag, tensor_lists[0], per_tensor)


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    s = float(inv_scale.reshape(-1)[0])
    return _l2(noop_flag, tensor_lists[0], per_tensor, s * s)


# ---------------------------------------------------------------- registration

#: tex op → (adapter, supports, native function it needs); the training side's from _cpp_train
ADAPTERS: dict[str, tuple[Callable[..., Any], Callable[..., bool], str]] = {
    "rmsnorm_fwd": (rmsnorm_fwd, _sup_rms_fwd, "rms_norm"),
    "layernorm_fwd": (layernorm_fwd, _sup_ln_fwd, "layer_norm"),
    "rmsnorm_bwd": (rmsnorm_bwd, _sup_rms_bwd, "rms_norm_bwd"),
    "rmsnorm_bwd_add": (rmsnorm_bwd_add, _sup_rms_bwd_add, "rms_norm_bwd"),
    "layernorm_bwd": (layernorm_bwd, _sup_ln_bwd, "layer_norm_bwd"),
    "gelu": (_unary("gelu", approximate="tanh"), _sup_act, "gelu"),
    "silu": (_unary("silu"), _sup_act, "silu"),
    "relu": (_unary("relu"), _sup_act, "relu"),
    "swiglu": (_glu("swiglu"), _sup_act, "swiglu"),
    "geglu": (_glu("geglu", approximate="tanh"), _sup_act, "geglu"),
    "multi_tensor_adam": (multi_tensor_adam, _sup_adam, "adam_step"),
    "multi_tensor_scale": (multi_tensor_scale, _sup_scale, "scale"),
    "multi_tensor_l2norm": (multi_tensor_l2norm, _sup_l2, "l2norm_sq"),
    "multi_tensor_unscale_l2norm": (multi_tensor_unscale_l2norm, _sup_l2, "l2norm_sq"),
    **_cpp_train.ADAPTERS,
}
HOT_OPS = tuple(ADAPTERS)


def _availability(kernel):
    def available():
        from tensor_ops.backends import cpp
        ok, reason = cpp.availability()
        if not ok:
            return False, reason
        if not hasattr(cpp.native(), kernel):
            return False, f"tensor_ops._cpp has no {kernel!r} kernel in this build (rebuild: pip install -e .)"
        return True, ""
    return available


def register(registry) -> None:
    from tensor_ops._registry import BackendImplKind, OpImpl
    try:
        import tensor_ops.backends.cpp  # noqa: F401
    except ImportError:  # this build ships no cpp backend
        return
    for op, (fn, sup, kernel) in ADAPTERS.items():
        registry.register_impl(OpImpl(op_name=op, impl_id=IMPL_ID, kind=BackendImplKind.DEFAULT, fn=fn, backend=NAME,
                                      supports=sup, available=_availability(kernel), api="tex"))
