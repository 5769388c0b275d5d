"""Helpers the op families share: the row-wise preparation and fp64 building blocks."""
from __future__ import annotations

import math

import numpy as np

from .._validate import check_out, check_out_pair, contiguous, rows_2d
from ._spec import Prepared

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


def f64(a):
    return np.asarray(a, dtype=np.float64)


def rows(x, kx: str, dt, extra: tuple, out, out_width: int | None = None, inputs: tuple = ()) -> Prepared:
    """The common preparation of a row-wise op: ``x`` viewed as (rows, n) C-contiguous, the
    result (rows, out_width), ``out=`` checked; kernel args ``(x2, *extra, out2)``.

    ``inputs`` are the caller's other arrays (weight, bias, cos, sin): an ``out`` that may
    share memory with x or any of them is written through a temporary (CONTRIBUTING.md,
    "out= and aliasing").

    An empty ``x`` (any axis 0) gives ``args=None``: the facade returns the empty result
    without dispatching (the same on every backend)."""
    n = x.shape[-1]
    w = n if out_width is None else out_width
    shape = tuple(x.shape[:-1]) + (w,)
    kern_out, user_out = check_out(out, kx, x, dt, shape, inputs)
    if 0 in tuple(x.shape) or 0 in shape:
        return Prepared(None, kx, x, dt, shape, None, user_out, kern_out, 0)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, w) if kern_out is not None else None
    return Prepared((x2, *extra, o2), kx, x, dt, shape, (x2.shape[0], w), user_out, o2, x.nbytes)


def rows_pair(x, kx: str, dt, r, extra: tuple, out, mates: tuple, inputs: tuple) -> Prepared:
    """:func:`rows` for an op with a second x-shaped input ``r`` (already checked and cast)
    and two x-shaped outputs (``out=(out0, out1)``, see ``_validate.check_out_pair``); kernel
    args ``(x2, r2, *extra, out0, out1)``."""
    shape = tuple(x.shape)
    kern, user = check_out_pair(out, kx, x, dt, shape, mates, inputs)
    if 0 in shape:
        return Prepared(None, kx, x, dt, shape, None, user, kern, 0)
    n = shape[-1]
    x2 = rows_2d(contiguous(x, kx), n)
    r2 = rows_2d(contiguous(r, kx), n)
    o = tuple(rows_2d(k, n) if k is not None else None for k in kern) if kern is not None else (None, None)
    return Prepared((x2, r2, *extra, *o), kx, x, dt, shape, (x2.shape[0], n), user,
                    o if kern is not None else None, 2 * x.nbytes)


def erf64(x):
    try:
        from scipy.special import erf
    except ImportError:  # scipy is a dependency; keep a correct (slow) path anyway
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def normal(rng, shape, dtype, scale: float = 2.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def weight(rng, n: int, dtype):
    return (rng.standard_normal(n) * 0.5 + 1).astype(dtype)
