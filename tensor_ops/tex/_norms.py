"""rmsnorm / layernorm forward and backward (TE semantics: fp32 math, fp32 [N] mu/rsigma)."""
from __future__ import annotations

import torch

from ._common import as_float, check_quantizer, check_same_device, check_shape, check_tensor, nargs_error, rows_2d
from ._dispatch import call
from ._refs import reference
from ._enums import to_torch_dtype

__all__ = ["rmsnorm_fwd", "layernorm_fwd", "rmsnorm_bwd", "layernorm_bwd", "rmsnorm_bwd_add"]


def _check_fwd(op, input, weight, bias, ln_out, quantizer):
    check_quantizer(op, quantizer)
    check_tensor(op, "input", input, float_only=True)
    check_tensor(op, "weight", weight, float_only=True)
    check_tensor(op, "bias", bias, optional=True, float_only=True)
    check_tensor(op, "ln_out", ln_out, optional=True)
    check_same_device(op, input=input, weight=weight, bias=bias, ln_out=ln_out)
    if input.dim() == 0:
        raise ValueError(f"tex.{op}: input must have at least 1 dimension, got a scalar")
    h = input.shape[-1]
    if weight.numel() != h:
        raise ValueError(f"tex.{op}: weight has shape {tuple(weight.shape)} but input's last dim is {h}")
    if bias is not None and bias.numel() != h:
        raise ValueError(f"tex.{op}: bias has shape {tuple(bias.shape)} but input's last dim is {h}")
    if ln_out is not None:
        check_shape(op, "ln_out", ln_out, input.shape)


def _check_bwd(op, dz, x, rsigma, gamma, mu=None, add=None):
    for name, t in (("dz", dz), ("x", x), ("rsigma", rsigma), ("gamma", gamma)):
        check_tensor(op, name, t, float_only=name != "rsigma")
    check_tensor(op, "mu", mu, optional=True)
    check_tensor(op, "add", add, optional=True)
    check_same_device(op, dz=dz, x=x, rsigma=rsigma, gamma=gamma, mu=mu, add=add)
    check_shape(op, "dz", dz, x.shape)
    h = x.shape[-1]
    n = x.numel() // h if h else 0
    if gamma.numel() != h:
        raise ValueError(f"tex.{op}: gamma has shape {tuple(gamma.shape)} but x's last dim is {h}")
    if rsigma.numel() != n:
        raise ValueError(f"tex.{op}: rsigma has {rsigma.numel()} elements, expected N={n} (rows of x)")
    if mu is not None and mu.numel() != n:
        raise ValueError(f"tex.{op}: mu has {mu.numel()} elements, expected N={n} (rows of x)")
    if add is not None:
        check_shape(op, "add", add, x.shape)


def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    """RMSNorm forward → ``[out, None, rsigma]`` (rsigma fp32 ``[N]``)."""
    _check_fwd("rmsnorm_fwd", input, weight, None, ln_out, quantizer)
    otype = to_torch_dtype(otype, input.dtype)
    return call("rmsnorm_fwd", (input, weight, as_float("rmsnorm_fwd", "eps", eps), ln_out, None, otype, sm_margin,
                                bool(zero_centered_gamma)))


def layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    """LayerNorm forward → ``[out, mu, rsigma]`` (mu, rsigma fp32 ``[N]``)."""
    _check_fwd("layernorm_fwd", input, weight, bias, ln_out, quantizer)
    otype = to_torch_dtype(otype, input.dtype)
    return call("layernorm_fwd", (input, weight, bias, as_float("layernorm_fwd", "eps", eps), ln_out, None, otype,
                                  sm_margin,
                                  bool(zero_centered_gamma)))


def rmsnorm_bwd(*args):
    """``rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma)`` → ``[dx, dgamma]``.

    TE-FL's 7-argument form (a trailing ``eps``) is accepted; eps is not needed.
    """
    if len(args) not in (6, 7):
        raise nargs_error("rmsnorm_bwd", "6 (dz, x, rsigma, gamma, sm_margin, zero_centered_gamma) or 7 (+ eps)",
                          len(args))
    dz, x, rsigma, gamma, sm_margin, zcg = args[:6]
    _check_bwd("rmsnorm_bwd", dz, x, rsigma, gamma)
    return call("rmsnorm_bwd", (dz, x, rsigma, gamma, sm_margin, bool(zcg)))


def rmsnorm_bwd_add(*args):
    """``rmsnorm_bwd_add(dz, x, add, rsigma, gamma, sm_margin, zero_centered_gamma)`` → ``[dx + add, dgamma]``."""
    if len(args) != 7:
        raise nargs_error("rmsnorm_bwd_add", "7 (dz, x, add, rsigma, gamma, sm_margin, zero_centered_gamma)",
                          len(args))
    dz, x, add, rsigma, gamma, sm_margin, zcg = args
    _check_bwd("rmsnorm_bwd_add", dz, x, rsigma, gamma, add=add)
    return call("rmsnorm_bwd_add", (dz, x, add, rsigma, gamma, sm_margin, bool(zcg)))


def layernorm_bwd(*args):
    """``layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma)`` → ``[dx, dgamma, dbeta]``."""
    if len(args) != 7:
        raise nargs_error("layernorm_bwd", "7 (dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma)",
                          len(args))
    dz, x, mu, rsigma, gamma, sm_margin, zcg = args
    _check_bwd("layernorm_bwd", dz, x, rsigma, gamma, mu=mu)
    return call("layernorm_bwd", (dz, x, mu, rsigma, gamma, sm_margin, bool(zcg)))


# ---------------------------------------------------------------- reference.torch


def _gamma32(w, zero_centered):
    g = w.reshape(-1).float()
    return g + 1.0 if zero_centered else g


def _emit(y32, input, otype, ln_out):
    y = y32.reshape(input.shape)
    if ln_out is not None:
        ln_out.copy_(y)
        return ln_out
    return y.to(otype)


@reference("rmsnorm_fwd")
def ref_rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    x = rows_2d(input).float()
    rs = torch.rsqrt(x.square().mean(-1) + eps)
    y = x * rs[:, None] * _gamma32(weight, zero_centered_gamma)
    bad = (rs == 0) & torch.isfinite(x).all(-1) if x.numel() else None
    if bad is not None and bad.any():
        # squares overflowed fp32 (|x| > ~1.8e19): those rows in float64, as every facade
        # backend and the C++ kernel do, so finite input never comes out as 0
        x64 = x[bad].double()
        rs64 = torch.rsqrt(x64.square().mean(-1) + eps)
        y, rs = y.clone(), rs.clone()
        y[bad] = (x64 * rs64[:, None] * _gamma32(weight, zero_centered_gamma).double()).float()
        rs[bad] = rs64.float()
    return [_emit(y, input, otype, ln_out), None, rs]


@reference("layernorm_fwd")
def ref_layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    x = rows_2d(input).float()
    mu = x.mean(-1)
    xc = x - mu[:, None]
    rs = torch.rsqrt(xc.square().mean(-1) + eps)
    y = xc * rs[:, None] * _gamma32(weight, zero_centered_gamma)
    if bias is not None:
        y = y + bias.reshape(-1).float()
    bad = (~torch.isfinite(rs) | (rs == 0)) & torch.isfinite(x).all(-1) if x.numel() else None
    if bad is not None and bad.any():
        # centred squares overflowed fp32 (|x - mean| > ~1.8e19): redo those rows in float64,
        # as the C++ kernel does, so finite input never comes out as "y = bias"
        x64 = x[bad].double()
        mu64 = x64.mean(-1)
        rs64 = torch.rsqrt((x64 - mu64[:, None]).square().mean(-1) + eps)
        y64 = (x64 - mu64[:, None]) * rs64[:, None] * _gamma32(weight, zero_centered_gamma).double()
        if bias is not None:
            y64 = y64 + bias.reshape(-1).double()
        y, mu, rs = y.clone(), mu.clone(), rs.clone()
        y[bad], mu[bad], rs[bad] = y64.float(), mu64.float(), rs64.float()
    return [_emit(y, input, otype, ln_out), mu, rs]


def _rms_bwd32(dz, x, rsigma, gamma, zcg):
    x2 = rows_2d(x).float()
    dz2 = rows_2d(dz).float()
    rs = rsigma.reshape(-1, 1).float()
    xhat = x2 * rs
    dy = dz2 * _gamma32(gamma, zcg)
    dx = rs * (dy - xhat * (dy * xhat).mean(-1, keepdim=True))
    dgamma = (dz2 * xhat).sum(0)
    return dx, dgamma


@reference("rmsnorm_bwd")
def ref_rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx, dg = _rms_bwd32(dz, x, rsigma, gamma, zero_centered_gamma)
    return [dx.reshape(x.shape).to(x.dtype), dg.reshape(gamma.shape).to(gamma.dtype)]


@reference("rmsnorm_bwd_add")
def ref_rmsnorm_bwd_add(dz, x, add, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx, dg = _rms_bwd32(dz, x, rsigma, gamma, zero_centered_gamma)
    dx = dx + rows_2d(add).float()
    return [dx.reshape(x.shape).to(x.dtype), dg.reshape(gamma.shape).to(gamma.dtype)]


@reference("layernorm_bwd")
def ref_layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    x2 = rows_2d(x).float()
    dz2 = rows_2d(dz).float()
    rs = rsigma.reshape(-1, 1).float()
    xhat = (x2 - mu.reshape(-1, 1).float()) * rs
    dy = dz2 * _gamma32(gamma, zero_centered_gamma)
    dx = rs * (dy - dy.mean(-1, keepdim=True) - xhat * (dy * xhat).mean(-1, keepdim=True))
    dgamma = (dz2 * xhat).sum(0)
    dbeta = dz2.sum(0)
    return [dx.reshape(x.shape).to(x.dtype), dgamma.reshape(gamma.shape).to(gamma.dtype),
            dbeta.reshape(gamma.shape).to(gamma.dtype)]
