"""Activation family: ``silu``, ``relu``, ``gelu`` and the gated ``swiglu``/``geglu`` (kernels:
cpp_ext/activation.cpp, opencl_ext/activation*.cl, cuda_ext/activation*.cu)."""
from __future__ import annotations

import math

import numpy as np

from .._validate import check_x
from ._common import GELU_TANH_CUBIC, SQRT_2_OVER_PI, erf64, f64, rows
from ._spec import OpSpec, XRule

APPROXIMATE = ("none", "tanh")


def check_approximate(approximate):
    if approximate not in APPROXIMATE:
        raise ValueError(f"approximate must be 'none' (exact erf) or 'tanh', got {approximate!r}")
    return approximate


def silu(x):
    """SiLU (swish): ``x * sigmoid(x)``.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.silu(np.array([0.0], np.float32))
        array([0.], dtype=float32)
    """


def relu(x):
    """ReLU: ``max(x, 0)`` (NaN propagates).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.relu(np.array([-1.0, 2.0], np.float32))
        array([0., 2.], dtype=float32)
    """


def gelu(x, approximate="none"):
    """GELU: exact ``0.5·x·(1 + erf(x/√2))`` or, with ``approximate="tanh"``, the tanh form.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.gelu(np.array([0.0], np.float32), approximate="tanh")
        array([0.], dtype=float32)
    """


def swiglu(x):
    """Gated SiLU (TransformerEngine convention): ``silu(a) * b`` with ``a, b`` the first and
    second halves of the last axis.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.swiglu(np.array([[0.0, 5.0]], np.float32))
        array([[0.]], dtype=float32)
    """


def geglu(x, approximate="none"):
    """Gated GELU: ``gelu(a) * b`` with ``a, b`` the first and second halves of the last axis.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.geglu(np.array([[0.0, 5.0]], np.float32))
        array([[0.]], dtype=float32)
    """


def _prepare_unary(x, out, extra=()):
    kx, dt = check_x(x)
    return rows(x, kx, dt, extra, out)


def _prepare_gated(op, x, out, extra=()):
    kx, dt = check_x(x)
    n = x.shape[-1]
    if n % 2:
        raise ValueError(f"x.shape[-1] must be even for {op} (it is split into two halves), got {n}")
    return rows(x, kx, dt, extra, out, n // 2)


def _silu64(x):
    x = f64(x)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-x))


def _gelu64(x, approximate="none"):
    x = f64(x)
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x ** 3)))
    return 0.5 * x * (1 + erf64(x / math.sqrt(2)))


def _halves(x):
    h = x.shape[-1] // 2
    return x[..., :h], f64(x[..., h:])


def _variant(v):
    return "tanh" if v == "tanh" else "none"


SILU = OpSpec(stub=silu, kernel_params=("x", "out"), prepare=lambda x, out: _prepare_unary(x, out),
              oracle=_silu64, make_args=lambda x, rng, v: ())
RELU = OpSpec(stub=relu, kernel_params=("x", "out"), prepare=lambda x, out: _prepare_unary(x, out),
              oracle=lambda x: np.maximum(f64(x), 0), make_args=lambda x, rng, v: ())
GELU = OpSpec(stub=gelu, kernel_params=("x", "approximate", "out"),
              prepare=lambda x, approximate, out: _prepare_unary(x, out, (check_approximate(approximate),)),
              oracle=_gelu64, make_args=lambda x, rng, v: (_variant(v),), variants=("", "tanh"),
              bench_variants=("", "tanh"))
SWIGLU = OpSpec(stub=swiglu, kernel_params=("x", "out"), prepare=lambda x, out: _prepare_gated("swiglu", x, out),
                oracle=lambda x: _silu64(_halves(x)[0]) * _halves(x)[1], make_args=lambda x, rng, v: (),
                x_rule=XRule(even=True), out_width=lambda n: n // 2)
GEGLU = OpSpec(stub=geglu, kernel_params=("x", "approximate", "out"),
               prepare=lambda x, approximate, out: _prepare_gated("geglu", x, out, (check_approximate(approximate),)),
               oracle=lambda x, approximate="none": _gelu64(_halves(x)[0], approximate) * _halves(x)[1],
               make_args=lambda x, rng, v: (_variant(v),), variants=("", "tanh"),
               x_rule=XRule(even=True), out_width=lambda n: n // 2)
