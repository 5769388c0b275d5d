"""``matmul``: NumPy semantics, computed by BLAS (cuBLAS for CuPy). Never a hand-written kernel."""
from __future__ import annotations

import numpy as np

from .._validate import check_out, check_x, same_place
from ._common import f64
from ._spec import OpSpec, Prepared


def matmul(a, b):
    """Matrix product with NumPy semantics, computed by BLAS (cuBLAS for CuPy arrays).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.matmul(np.eye(2, dtype=np.float32), np.ones((2, 1), np.float32))
        array([[1.],
               [1.]], dtype=float32)
    """


def _prepare(a, b, out):
    ka, da = check_x(a, "a")
    kb, db = check_x(b, "b")
    same_place(b, kb, a, ka, "b", "a")
    k_a = a.shape[-1]
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if k_a != k_b:
        raise ValueError(f"matmul: a.shape {tuple(a.shape)} and b.shape {tuple(b.shape)} are not compatible: "
                         f"a.shape[-1] = {k_a} must equal b.shape[-2] = {k_b}")
    try:
        dt = np.result_type(da, db)
    except TypeError:       # bfloat16 with float16: NumPy has no common type; compute in float32
        dt = np.dtype(np.float32)
    try:
        shape = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])) + \
            ((a.shape[-2],) if a.ndim >= 2 else ()) + ((b.shape[-1],) if b.ndim >= 2 else ())
    except ValueError:
        raise ValueError(f"matmul: batch dims of a.shape {tuple(a.shape)} and b.shape {tuple(b.shape)} "
                         f"do not broadcast") from None
    kern_out, user_out = check_out(out, ka, a, dt, shape, (b,))
    if da != dt:
        a = a.astype(dt)
    if db != dt:
        b = b.astype(dt)
    if a.size == 0 or b.size == 0:     # an empty product: zeros of the result's shape
        return Prepared(None, ka, a, dt, shape, None, user_out, kern_out, 0, _zeros)
    return Prepared((a, b, kern_out), ka, a, dt, shape, None, user_out, kern_out, a.nbytes + b.nbytes)


def _zeros(res):
    res[...] = 0
    return res


def _args(x, rng, variant):
    # b scaled by 1/sqrt(k): results stay O(1) whatever k, so the one tolerance table applies
    k = max(1, x.shape[-1])
    return ((rng.standard_normal((k if x.shape[-1] else 0, 5)) / np.sqrt(k)).astype(x.dtype),)


MATMUL = OpSpec(stub=matmul, kernel_params=("a", "b", "out"), prepare=_prepare,
                oracle=lambda a, b: f64(a) @ f64(b), make_args=_args, tolerance="reduction", kernel=False,
                out_width=lambda n: 5)
