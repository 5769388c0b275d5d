"""The fp64 oracle: each op written from its definition, independently of every backend."""
from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def f64(a):
    return np.asarray(a, dtype=np.float64)


def rms_norm(x, w, eps=1e-6):
    x, w = f64(x), f64(w)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x, w, b=None, eps=1e-5):
    x, w = f64(x), f64(w)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * w
    return y + f64(b) if b is not None else y


def softmax(x, axis=-1):
    x = f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def silu(x):
    x = f64(x)
    return x / (1 + np.exp(-x))


def relu(x):
    return np.maximum(f64(x), 0)


def gelu(x, approximate="none"):
    x = f64(x)
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def swiglu(x):
    h = x.shape[-1] // 2
    return silu(x[..., :h]) * f64(x[..., h:])


def geglu(x, approximate="none"):
    h = x.shape[-1] // 2
    return gelu(x[..., :h], approximate) * f64(x[..., h:])


def rope(x, cos, sin, interleaved=False):
    """cos/sin: (T, n/2) angles' cos/sin, one per rotation pair."""
    x = f64(x)
    c, s = f64(cos), f64(sin)
    y = np.empty_like(x)
    n = x.shape[-1]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = b * c + a * s
    else:
        h = n // 2
        a, b = x[..., :h], x[..., h:]
        y[..., :h] = a * c - b * s
        y[..., h:] = b * c + a * s
    return y


def matmul(a, b):
    return f64(a) @ f64(b)
