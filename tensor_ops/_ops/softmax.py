"""``softmax`` (kernels: cpp_ext/softmax.cpp, opencl_ext/softmax.cl, cuda_ext/softmax.cu)."""
from __future__ import annotations

import numpy as np

from .._validate import check_out, check_x
from ._common import f64, rows
from ._spec import OpSpec, Prepared


def softmax(x, axis=-1):
    """Numerically stable softmax along ``axis`` (max subtracted before exp).

    Args:
        x: array, float16/float32/float64.
        axis: the axis to normalise (NumPy input: any; device arrays: the last).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.softmax(np.array([[0.0, 0.0]], np.float32))
        array([[0.5, 0.5]], dtype=float32)
    """


def _prepare(x, axis, out):
    kx, dt = check_x(x)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    nd = x.ndim
    if not -nd <= axis < nd:
        raise ValueError(f"axis must be in [{-nd}, {nd - 1}] for a {nd}-d x, got {axis!r}")
    axis = int(axis) % nd
    if axis == nd - 1:
        return rows(x, kx, dt, (), out)
    if kx != "numpy":
        raise ValueError(f"softmax over axis {axis} != -1 is supported for NumPy input only; "
                         f"move the axis last on the device first")
    # The kernels normalise the last axis: compute on a copy with ``axis`` moved last, then
    # move it back (the user's out= receives the result through the facade's copy).
    check_out(out, kx, x, dt, tuple(x.shape))
    moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    p = rows(moved, kx, dt, (), None)
    back = lambda r: np.ascontiguousarray(np.moveaxis(r.reshape(moved.shape), -1, axis))  # noqa: E731
    return Prepared(p.args, kx, x, dt, tuple(x.shape), p.shape2, out, None, p.nbytes, back)


def _oracle(x, axis=-1):
    x = f64(x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


SOFTMAX = OpSpec(stub=softmax, kernel_params=("x", "out"), prepare=_prepare, oracle=_oracle,
                 make_args=lambda x, rng, v: (), tolerance="reduction")
