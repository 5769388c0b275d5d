"""Norm family: ``rms_norm`` and ``layer_norm`` (kernels: cpp_ext/norm.cpp, opencl_ext/norm*.cl,
cuda_ext/norm.cu)."""
from __future__ import annotations

import numpy as np

from .._validate import check_eps, check_vector, check_x
from ._common import f64, normal, rows, weight
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
