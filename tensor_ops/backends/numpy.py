"""The NumPy reference backend: always available, every op, float16/bfloat16/float32/float64.

Registered like every other backend (kind REFERENCE, impl_id ``reference.numpy``), so it is
the last fallback of every order. 16-bit storage (float16, ml_dtypes bfloat16) is computed in
fp32 and rounded once (as the native backends do); float32 in float32; float64 in float64.
``matmul`` is NumPy's, i.e. BLAS (bfloat16 through float32). It serves NumPy arrays and
torch CPU tensors (the facade hands it zero-copy NumPy views of those).
"""
from __future__ import annotations

import numpy as np

from .._arrays import is_bf16
from .._registry import BackendImplKind
from ._contract import Backend, ops_from

_SQRT_2_OVER_PI = 0.7978845608028654

try:  # scipy's erf is correctly rounded to ~1 ulp and vectorised
    from scipy.special import erf as _erf
except ImportError:  # pragma: no cover - scipy is a dependency; keep a correct (slow) path
    import math
    _erf = np.vectorize(math.erf, otypes=[np.float64])


def _work(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype.itemsize == 2 else x


def _finish(y: np.ndarray, dtype, out):
    if out is None:
        return y.astype(dtype, copy=False)
    np.copyto(out, y, casting="unsafe")
    return out


def rms_norm(x, weight, eps, out):
    xf = _work(x)
    # an overflowing x² is handled below, as every backend does; inf * 0 in an inf row is the
    # NaN the kernels give, without NumPy's RuntimeWarning (no other backend warns)
    with np.errstate(over="ignore", invalid="ignore"):
        ms = np.mean(np.square(xf), axis=-1, keepdims=True)
        y = xf * (1.0 / np.sqrt(ms + xf.dtype.type(eps))) * _work(weight)
    if xf.dtype != np.float64 and xf.size and not np.isfinite(ms).all():
        # x² overflowed fp32 (|x| > ~1.8e19) in a row of finite values: that row again in
        # float64, so finite input never becomes 0 (torch's F.rms_norm returns 0 there). The
        # cpp, OpenCL and CUDA kernels redo such rows too (in double, or scaled by a power of two);
        # rows holding inf/NaN keep the formula's 0/NaN.
        bad = ~np.isfinite(ms[..., 0]) & np.isfinite(xf).all(-1)
        if bad.any():
            x64 = xf[bad].astype(np.float64)
            rs = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + float(eps))
            y[bad] = (x64 * rs * _work(weight).astype(np.float64)).astype(y.dtype)
    return _finish(y, x.dtype, out)


def layer_norm(x, weight, bias, eps, out):
    xf = _work(x)
    mu = np.mean(xf, axis=-1, keepdims=True)
    d = xf - mu
    with np.errstate(over="ignore"):
        var = np.mean(np.square(d), axis=-1, keepdims=True)
    if xf.dtype != np.float64 and not np.isfinite(var).all():
        # d² overflowed fp32 (|d| > ~1.8e19): redo those rows in float64 so a finite input
        # never turns into "output = bias"; the result is then rounded back as usual.
        bad = ~np.isfinite(var[:, 0])
        d64 = xf[bad].astype(np.float64) - xf[bad].astype(np.float64).mean(-1, keepdims=True)
        y_bad = d64 / np.sqrt((d64 * d64).mean(-1, keepdims=True) + eps) * _work(weight).astype(np.float64)
        var = np.where(np.isfinite(var), var, 1.0).astype(xf.dtype)
    else:
        bad = None
    y = d * (1.0 / np.sqrt(var + xf.dtype.type(eps))) * _work(weight)
    if bad is not None:
        y[bad] = y_bad
    if bias is not None:
        y += _work(bias)
    return _finish(y, x.dtype, out)


def _add(x, residual):
    """x + residual rounded to x's dtype (16-bit: added in fp32, rounded once), a new array."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (_work(x) + _work(residual)).astype(x.dtype)


def add_rms_norm(x, residual, weight, eps, out, residual_out):
    # s first, into a new array: out may be x and residual_out may be residual (in place)
    s = _add(x, residual)
    return rms_norm(s, weight, eps, out), _finish(s, x.dtype, residual_out)


def add_layer_norm(x, residual, weight, bias, eps, out, residual_out):
    s = _add(x, residual)
    return layer_norm(s, weight, bias, eps, out), _finish(s, x.dtype, residual_out)


def softmax(x, out):
    xf = _work(x)
    m = np.max(xf, axis=-1, keepdims=True)
    # A row that is all -inf has max -inf; subtracting it would make NaN where NumPy-style
    # semantics (and torch) also give NaN, so no special case: NaN propagates like torch.
    e = np.exp(xf - m)
    y = e / np.sum(e, axis=-1, keepdims=True)
    return _finish(y, x.dtype, out)


def _silu(xf):
    with np.errstate(over="ignore"):
        return xf / (1.0 + np.exp(-xf))


def _gelu(xf, approximate):
    if approximate == "tanh":
        inner = xf.dtype.type(_SQRT_2_OVER_PI) * (xf + xf.dtype.type(0.044715) * xf * xf * xf)
        return 0.5 * xf * (1.0 + np.tanh(inner))
    return (0.5 * xf * (1.0 + _erf(xf * xf.dtype.type(0.7071067811865476)))).astype(xf.dtype, copy=False)


def silu(x, out):
    return _finish(_silu(_work(x)), x.dtype, out)


def relu(x, out):
    if x.dtype.itemsize == 2 and x.dtype != np.float16:     # bfloat16: ml_dtypes' maximum drops NaN
        return _finish(np.maximum(_work(x), np.float32(0)), x.dtype, out)
    if out is None:
        return np.maximum(x, x.dtype.type(0))
    np.maximum(x, x.dtype.type(0), out=out)
    return out


def gelu(x, approximate, out):
    return _finish(_gelu(_work(x), approximate), x.dtype, out)


def swiglu(x, out):
    h = x.shape[-1] // 2
    xf = _work(x)
    return _finish(_silu(xf[:, :h]) * xf[:, h:], x.dtype, out)


def geglu(x, approximate, out):
    h = x.shape[-1] // 2
    xf = _work(x)
    return _finish(_gelu(xf[:, :h], approximate) * xf[:, h:], x.dtype, out)


def rope(x, cos, sin, interleaved, out):
    rows, n = x.shape
    t = cos.shape[0]
    xf = _work(x).reshape(rows // t, t, n)
    if interleaved:
        rot = np.empty_like(xf)
        rot[..., 0::2] = -xf[..., 1::2]
        rot[..., 1::2] = xf[..., 0::2]
    else:
        h = n // 2
        rot = np.concatenate([-xf[..., h:], xf[..., :h]], axis=-1)
    y = xf * cos + rot * sin
    return _finish(y.reshape(rows, n), x.dtype, out)


def matmul(a, b, out):
    if is_bf16(a.dtype):     # ml_dtypes' matmul is an object-speed loop: BLAS in float32, rounded once
        return _finish(np.matmul(a.astype(np.float32), b.astype(np.float32)), a.dtype, out)
    return np.matmul(a, b, out=out)


def _supports_host(x, *rest):
    return type(x) is np.ndarray


def _probe() -> str:
    return f"numpy {np.__version__}"


def info() -> dict:
    erf = "scipy.special.erf" if _erf.__class__.__name__ != "vectorize" else "math.erf"
    return {"numpy": np.__version__, "erf": erf}


BACKEND = Backend(name="numpy", ops=ops_from(globals()), probe=_probe, kind=BackendImplKind.REFERENCE,
                  array_kinds=("numpy", "torch-cpu"), dtypes=("float16", "bfloat16", "float32", "float64"),
                  supports=_supports_host, info=info)


def get_numpy_info() -> dict:
    """Availability, array kinds, ops and versions of the NumPy reference backend."""
    return BACKEND.describe()
