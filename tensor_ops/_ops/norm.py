"""Norm family: ``rms_norm``, ``layer_norm`` and the fused residual add + norm ``add_rms_norm`` /
``add_layer_norm`` (kernels: cpp_ext/norm.cpp, opencl_ext/norm*.cl,
cuda_ext/norm.cu)."""
from __future__ import annotations

import numpy as np

from .._validate import check_eps, check_like_x, check_vector, check_x
from ._common import f64, normal, rows, rows_pair, weight
from ._spec import OpSpec


def rms_norm(x, weight, eps=1e-6):
    """Root-mean-square normalisation over the last axis.

    ``y = x / sqrt(mean(x**2, -1) + eps) * weight``, computed in fp32 for fp16 input.

    Args:
        x: array (..., n), float16/float32/float64.
        weight: array (n,).
        eps: finite number >= 0 added to the mean square.

    Returns:
        The normalised array, same shape and dtype as ``x``.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.rms_norm(np.array([[3.0, 4.0]], np.float32), np.ones(2, np.float32), eps=0.0).round(4)
        array([[0.8485, 1.1314]], dtype=float32)
    """


def _prepare_rms(x, weight, eps, out):
    kx, dt = check_x(x)
    n = x.shape[-1]
    w = check_vector(weight, "weight", n, x, kx, dt)
    return rows(x, kx, dt, (w, check_eps(eps)), out, inputs=(weight,))


def _oracle_rms(x, weight, eps=1e-6):
    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(weight)


def layer_norm(x, weight, bias=None, eps=1e-5):
    """Layer normalisation over the last axis (biased variance, like torch).

    Args:
        x: array (..., n), float16/float32/float64.
        weight: array (n,).
        bias: array (n,) or None.
        eps: finite number >= 0 added to the variance.

    Returns:
        ``(x - mean) / sqrt(var + eps) * weight (+ bias)``, same shape and dtype as ``x``.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.layer_norm(np.array([[1.0, 3.0]], np.float32), np.ones(2, np.float32), eps=0.0)
        array([[-1.,  1.]], dtype=float32)
    """


def _prepare_ln(x, weight, bias, eps, out):
    kx, dt = check_x(x)
    n = x.shape[-1]
    w = check_vector(weight, "weight", n, x, kx, dt)
    b = None if bias is None else check_vector(bias, "bias", n, x, kx, dt)
    return rows(x, kx, dt, (w, b, check_eps(eps)), out, inputs=(weight, bias))


def _oracle_ln(x, weight, bias=None, eps=1e-5):
    x = f64(x)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * f64(weight)
    return y + f64(bias) if bias is not None else y


RMS_NORM = OpSpec(
    stub=rms_norm, kernel_params=("x", "weight", "eps", "out"), prepare=_prepare_rms, oracle=_oracle_rms,
    make_args=lambda x, rng, v: (weight(rng, x.shape[-1], x.dtype), 1e-6), tolerance="reduction")

LAYER_NORM = OpSpec(
    stub=layer_norm, kernel_params=("x", "weight", "bias", "eps", "out"), prepare=_prepare_ln, oracle=_oracle_ln,
    make_args=lambda x, rng, v: (weight(rng, x.shape[-1], x.dtype), normal(rng, x.shape[-1], x.dtype, 1.0), 1e-5),
    tolerance="reduction")


# ---- fused residual add + norm (vLLM's fused_add_rms_norm) ------------------------------
def add_rms_norm(x, residual, weight, eps=1e-6):
    """Fused residual add + RMS norm: ``s = x + residual`` (rounded to x's dtype), then
    ``(rms_norm(s, weight, eps), s)`` in one pass (vLLM's ``fused_add_rms_norm``).

    Args:
        x: array (..., n), float16/bfloat16/float32/float64.
        residual: array of x's shape.
        weight: array (n,).
        eps: finite number >= 0 added to the mean square.

    Returns:
        ``(normed, s)``, both of x's shape and dtype. ``out=`` is a tuple ``(out_normed,
        out_sum)``; ``out=(x, residual)`` is the in-place form (normed into x, the sum into
        residual, as vLLM does). Any other sharing of memory between the two outputs, or
        between an output and an input, is a ValueError.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> x, res = np.array([[1.0, 2.0]], np.float32), np.array([[2.0, 2.0]], np.float32)
        >>> y, s = to.add_rms_norm(x, res, np.ones(2, np.float32), eps=0.0)
        >>> s, y.round(4)
        (array([[3., 4.]], dtype=float32), array([[0.8485, 1.1314]], dtype=float32))
    """


def add_layer_norm(x, residual, weight, bias=None, eps=1e-5):
    """Fused residual add + layer norm: ``s = x + residual`` (rounded to x's dtype), then
    ``(layer_norm(s, weight, bias, eps), s)`` in one pass.

    Args:
        x: array (..., n), float16/bfloat16/float32/float64.
        residual: array of x's shape.
        weight: array (n,).
        bias: array (n,) or None.
        eps: finite number >= 0 added to the variance.

    Returns:
        ``(normed, s)``, both of x's shape and dtype; ``out=`` as for :func:`add_rms_norm`
        (``out=(x, residual)`` is the in-place form).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> x, res = np.array([[0.0, 1.0]], np.float32), np.array([[1.0, 2.0]], np.float32)
        >>> y, s = to.add_layer_norm(x, res, np.ones(2, np.float32), eps=0.0)
        >>> s, y
        (array([[1., 3.]], dtype=float32), array([[-1.,  1.]], dtype=float32))
    """


def _prepare_add(x, residual, weight, bias, eps, out, layer: bool):
    kx, dt = check_x(x)
    n = x.shape[-1]
    r = check_like_x(residual, "residual", x, kx, dt)
    w = check_vector(weight, "weight", n, x, kx, dt)
    extra: tuple = (w,)
    if layer:
        extra += (None if bias is None else check_vector(bias, "bias", n, x, kx, dt),)
    extra += (check_eps(eps),)
    inputs = (("x", x), ("residual", residual), ("weight", weight), ("bias", bias))
    return rows_pair(x, kx, dt, r, extra, out, (("x", x), ("residual", residual)), inputs)


def add_sum(x, residual):
    """``x + residual`` rounded to x's dtype, as float64 (the oracles' s)."""
    x = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return f64((f64(x) + f64(residual)).astype(x.dtype))


def _oracle_add_rms(x, residual, weight, eps=1e-6):
    s = add_sum(x, residual)
    with np.errstate(over="ignore", invalid="ignore"):
        return _oracle_rms(s, weight, eps), s


def _oracle_add_ln(x, residual, weight, bias=None, eps=1e-5):
    s = add_sum(x, residual)
    with np.errstate(over="ignore", invalid="ignore"):
        return _oracle_ln(s, weight, bias, eps), s


ADD_RMS_NORM = OpSpec(
    stub=add_rms_norm, kernel_params=("x", "residual", "weight", "eps", "out", "residual_out"),
    prepare=lambda x, residual, weight, eps, out: _prepare_add(x, residual, weight, None, eps, out, False),
    oracle=_oracle_add_rms, tolerance="reduction", outputs=2,
    make_args=lambda x, rng, v: (normal(rng, x.shape, x.dtype), weight(rng, x.shape[-1], x.dtype), 1e-6))

ADD_LAYER_NORM = OpSpec(
    stub=add_layer_norm, kernel_params=("x", "residual", "weight", "bias", "eps", "out", "residual_out"),
    prepare=lambda x, residual, weight, bias, eps, out: _prepare_add(x, residual, weight, bias, eps, out, True),
    oracle=_oracle_add_ln, tolerance="reduction", outputs=2,
    make_args=lambda x, rng, v: (normal(rng, x.shape, x.dtype), weight(rng, x.shape[-1], x.dtype),
                                 normal(rng, x.shape[-1], x.dtype, 1.0), 1e-5))
