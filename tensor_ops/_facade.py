"""The public ops: validate once, then dispatch through the global OpManager.

NumPy in → NumPy out (device arrays come back as the same kind), dtype preserved, the last
axis is the feature axis. Every op takes ``out=`` and ``backend=``.
"""
from __future__ import annotations

import numpy as np

from . import _global as _g
from . import _state
from ._validate import check_eps, check_out, check_vector, check_x, contiguous, rows_2d, same_place


_NAMES = {np.dtype(t): np.dtype(t).name for t in (np.float16, np.float32, np.float64)}


def _alloc(kx, x, shape, dt):
    if kx == "numpy":
        return np.empty(shape, dt)
    if kx == "torch":
        import torch
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if kx == "cupy":
        import cupy
        return cupy.empty(shape, dt)
    import pyopencl.array as cla
    return cla.empty(x.queue, shape, dt)


def _run(op, args, kx, x, dt, out_shape, out2_shape, user_out, kern_out, backend):
    """Dispatch ``args`` (which end with the kernel's ``out``) and reshape the result back.

    Empty inputs return at once (same result on every backend); a result whose 2-D shape or
    dtype is wrong counts as a backend failure inside the manager.
    """
    if 0 in x.shape or 0 in out_shape:
        return user_out if user_out is not None else _alloc(kx, x, out_shape, dt)
    res = _g.manager().dispatch(op, args, None, backend, "facade", _NAMES[dt], x.nbytes,
                                (out2_shape, args[0].dtype))
    if user_out is not None:
        if kern_out is None:
            user_out[...] = res.reshape(out_shape)
        return user_out
    return res.reshape(out_shape) if res.shape != out_shape else res


_ND = np.ndarray
_INF = float("inf")
_F = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))
_ctx_get = _state.context_backend.get
# op -> native entry (e.g. tensor_ops._cpp._fast_rms_norm) when the policy's first choice
# for plain host calls has one: it validates the plain case itself and returns the result,
# or None to send the call down the general path (same result or the same error). Tier 1
# of the fast path; _fast() below (the cached resolution, checks in Python) is tier 2.
_native = _state.fast_fns.get


def _fast(op):
    """The cached resolution when no override is active, else None (→ general path).

    The fast path exists because a (1, 4096) op costs ~1 µs in the kernel: validation and
    dispatch must not cost several times that. It only takes inputs that need no
    normalisation (2-D, C-contiguous, aligned, non-empty, same-dtype weights); everything
    else goes through the general path, which produces the same result or the error.
    """
    m = _g._manager
    if m is None or _state.global_backend is not None or _ctx_get() is not None:
        return None, None
    return m, m.fast.get(op)


def _plain_native(op, out, backend, *args):
    """The native entry's result for a plain call (no out=, backend= or use_backend()), or
    None: no entry, or it declined the arguments (the general path then decides)."""
    if out is None and backend is None:
        f = _native(op)
        if f is not None and _ctx_get() is None:
            return f(*args)
    return None


def _plain(x):
    return type(x) is _ND and x.ndim == 2 and x.dtype in _F and x.flags.carray and x.size


def rms_norm(x, weight, eps=1e-6, *, out=None, backend=None):
    """Root-mean-square normalisation over the last axis.

    ``y = x / sqrt(mean(x**2, -1) + eps) * weight``, computed in fp32 for fp16 input.

    Args:
        x: array (..., n), float16/float32/float64.
        weight: array (n,).
        eps: finite number >= 0 added to the mean square.
        out: optional output array of x's shape and dtype.
        backend: optional backend name (forces it) or comma-separated order.

    Returns:
        The normalised array, same shape and dtype as ``x``.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.rms_norm(np.array([[3.0, 4.0]], np.float32), np.ones(2, np.float32), eps=0.0).round(4)
        array([[0.8485, 1.1314]], dtype=float32)
    """
    r = _plain_native("rms_norm", out, backend, x, weight, eps)
    if r is not None:
        return r
    if out is None and backend is None and type(eps) is float and 0.0 <= eps < _INF and _plain(x) \
            and type(weight) is _ND and weight.dtype is x.dtype and weight.ndim == 1 \
            and weight.shape[0] == x.shape[1] and weight.flags.carray:
        m, res = _fast("rms_norm")
        if res is not None:
            return m.run(res, (x, weight, eps, None), None, (x.shape, x.dtype))
    kx, dt = check_x(x)
    n = x.shape[-1]
    w = check_vector(weight, "weight", n, x, kx, dt)
    e = check_eps(eps)
    shape = tuple(x.shape)
    kern_out, user_out = check_out(out, kx, x, dt, shape)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, n) if kern_out is not None else None
    return _run("rms_norm", (x2, w, e, o2), kx, x, dt, shape, x2.shape, user_out, o2, backend)


def layer_norm(x, weight, bias=None, eps=1e-5, *, out=None, backend=None):
    """Layer normalisation over the last axis (biased variance, like torch).

    Args:
        x: array (..., n); weight: (n,); bias: (n,) or None; eps: finite >= 0.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.layer_norm(np.array([[1.0, 3.0]], np.float32), np.ones(2, np.float32), eps=0.0)
        array([[-1.,  1.]], dtype=float32)
    """
    r = _plain_native("layer_norm", out, backend, x, weight, bias, eps)
    if r is not None:
        return r
    kx, dt = check_x(x)
    n = x.shape[-1]
    w = check_vector(weight, "weight", n, x, kx, dt)
    b = None if bias is None else check_vector(bias, "bias", n, x, kx, dt)
    e = check_eps(eps)
    shape = tuple(x.shape)
    kern_out, user_out = check_out(out, kx, x, dt, shape)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, n) if kern_out is not None else None
    return _run("layer_norm", (x2, w, b, e, o2), kx, x, dt, shape, x2.shape, user_out, o2, backend)


def softmax(x, axis=-1, *, out=None, backend=None):
    """Numerically stable softmax along ``axis`` (max subtracted before exp).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.softmax(np.array([[0.0, 0.0]], np.float32))
        array([[0.5, 0.5]], dtype=float32)
    """
    r = _plain_native("softmax", out, backend, x, axis)
    if r is not None:
        return r
    kx, dt = check_x(x)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r}")
    nd = x.ndim
    if not -nd <= axis < nd:
        raise ValueError(f"axis must be in [{-nd}, {nd - 1}] for a {nd}-d x, got {axis!r}")
    axis = int(axis) % nd
    shape = tuple(x.shape)
    if axis != nd - 1:
        if kx != "numpy":
            raise ValueError(f"softmax over axis {axis} != -1 is supported for NumPy input only; "
                             f"move the axis last on the device first")
        kern_out, user_out = check_out(out, kx, x, dt, shape)
        moved = np.moveaxis(x, axis, -1)
        res = softmax(np.ascontiguousarray(moved), -1, backend=backend)
        res = np.moveaxis(res, -1, axis)
        if user_out is not None:
            user_out[...] = res
            return user_out
        return np.ascontiguousarray(res)
    n = shape[-1]
    kern_out, user_out = check_out(out, kx, x, dt, shape)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, n) if kern_out is not None else None
    return _run("softmax", (x2, o2), kx, x, dt, shape, x2.shape, user_out, o2, backend)




def _elementwise(op, x, out, backend, extra=(), check=None):
    """``check`` validates ``extra`` after the native entry (which validates it itself)."""
    r = _plain_native(op, out, backend, x, *extra)
    if r is not None:
        return r
    if check is not None:
        extra = (check(*extra),)
    if out is None and backend is None and _plain(x):
        m, res = _fast(op)
        if res is not None:
            return m.run(res, (x, *extra, None), None, (x.shape, x.dtype))
    kx, dt = check_x(x)
    n = x.shape[-1]
    shape = tuple(x.shape)
    kern_out, user_out = check_out(out, kx, x, dt, shape)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, n) if kern_out is not None else None
    return _run(op, (x2, *extra, o2), kx, x, dt, shape, x2.shape, user_out, o2, backend)


def silu(x, *, out=None, backend=None):
    """SiLU (swish): ``x * sigmoid(x)``.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.silu(np.array([0.0], np.float32))
        array([0.], dtype=float32)
    """
    return _elementwise("silu", x, out, backend)


def relu(x, *, out=None, backend=None):
    """ReLU: ``max(x, 0)`` (NaN propagates).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.relu(np.array([-1.0, 2.0], np.float32))
        array([0., 2.], dtype=float32)
    """
    return _elementwise("relu", x, out, backend)


def _check_approximate(approximate):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' (exact erf) or 'tanh', got {approximate!r}")
    return approximate


def gelu(x, approximate="none", *, out=None, backend=None):
    """GELU: exact ``0.5·x·(1 + erf(x/√2))`` or, with ``approximate="tanh"``, the tanh form.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.gelu(np.array([0.0], np.float32), approximate="tanh")
        array([0.], dtype=float32)
    """
    return _elementwise("gelu", x, out, backend, (approximate,), _check_approximate)


def _gated(op, x, out, backend, extra=(), check=None):
    r = _plain_native(op, out, backend, x, *extra)
    if r is not None:
        return r
    if check is not None:
        extra = (check(*extra),)
    kx, dt = check_x(x)
    n = x.shape[-1]
    if n % 2:
        raise ValueError(f"x.shape[-1] must be even for {op} (it is split into two halves), got {n}")
    shape = tuple(x.shape[:-1]) + (n // 2,)
    kern_out, user_out = check_out(out, kx, x, dt, shape)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, n // 2) if kern_out is not None else None
    return _run(op, (x2, *extra, o2), kx, x, dt, shape, (x2.shape[0], n // 2), user_out, o2, backend)


def swiglu(x, *, out=None, backend=None):
    """Gated SiLU (TransformerEngine convention): ``silu(a) * b`` with ``a, b`` the first and
    second halves of the last axis.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.swiglu(np.array([[0.0, 5.0]], np.float32))
        array([[0.]], dtype=float32)
    """
    return _gated("swiglu", x, out, backend)


def geglu(x, approximate="none", *, out=None, backend=None):
    """Gated GELU: ``gelu(a) * b`` with ``a, b`` the first and second halves of the last axis.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.geglu(np.array([[0.0, 5.0]], np.float32))
        array([[0.]], dtype=float32)
    """
    return _gated("geglu", x, out, backend, (approximate,), _check_approximate)


def _angles(c, name, kx, x, t, n, interleaved, work_dt):
    kc, cdt = check_x(c, name)
    same_place(c, kc, x, kx, name)
    while c.ndim > 2 and c.shape[0] == 1:
        c = c[0]
    if c.ndim != 2 or c.shape[0] != t or c.shape[1] not in (n, n // 2):
        raise ValueError(f"{name} must have shape (T, n) = ({t}, {n}) or (T, n/2) = ({t}, {n // 2}) "
                         f"(leading size-1 dims allowed), got {tuple(c.shape)}")
    if kc == "torch":
        import torch
        if c.shape[1] != n:
            c = torch.repeat_interleave(c, 2, dim=-1) if interleaved else torch.cat([c, c], -1)
        return c.to({np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}[work_dt]).contiguous()
    if kc == "pyopencl":
        c = c.get()
        kc = "numpy"
    xp = np
    if kc == "cupy":
        import cupy as xp
    if c.shape[1] != n:
        c = xp.repeat(c, 2, axis=-1) if interleaved else xp.concatenate([c, c], axis=-1)
    return xp.ascontiguousarray(c.astype(work_dt, copy=False))


def rope(x, cos, sin, interleaved=False, *, out=None, backend=None):
    """Rotary position embedding over the last axis of ``x (..., T, n)``.

    ``cos``/``sin`` have shape ``(T, n)`` (HF style, halves duplicated) or ``(T, n/2)`` (one
    angle per pair); leading size-1 dims are allowed. Non-interleaved rotates the pairs
    ``(i, i + n/2)`` (``x·cos + rotate_half(x)·sin``); ``interleaved=True`` rotates
    ``(2i, 2i+1)``.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> x = np.array([[1.0, 0.0]], np.float32)
        >>> to.rope(x, np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32))
        array([[0., 1.]], dtype=float32)
    """
    kx, dt = check_x(x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., T, n) with at least 2 dims, got {tuple(x.shape)}")
    if not isinstance(interleaved, (bool, np.bool_)):
        raise TypeError(f"interleaved must be a bool, got {interleaved!r}")
    n, t = x.shape[-1], x.shape[-2]
    if n % 2:
        raise ValueError(f"x.shape[-1] must be even for rope (rotation pairs), got {n}")
    work = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    c = _angles(cos, "cos", kx, x, t, n, interleaved, work)
    s = _angles(sin, "sin", kx, x, t, n, interleaved, work)
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    shape = tuple(x.shape)
    kern_out, user_out = check_out(out, kx, x, dt, shape)
    x2 = rows_2d(contiguous(x, kx), n)
    o2 = rows_2d(kern_out, n) if kern_out is not None else None
    return _run("rope", (x2, c, s, bool(interleaved), o2), kx, x, dt, shape, x2.shape, user_out, o2, backend)


def matmul(a, b, *, out=None, backend=None):
    """Matrix product with NumPy semantics, computed by BLAS (cuBLAS for CuPy arrays).

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> to.matmul(np.eye(2, dtype=np.float32), np.ones((2, 1), np.float32))
        array([[1.],
               [1.]], dtype=float32)
    """
    ka, da = check_x(a, "a")
    kb, db = check_x(b, "b")
    same_place(b, kb, a, ka, "b")
    k_a = a.shape[-1]
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if k_a != k_b:
        raise ValueError(f"matmul: a.shape {tuple(a.shape)} and b.shape {tuple(b.shape)} are not compatible: "
                         f"a.shape[-1] = {k_a} must equal b.shape[-2] = {k_b}")
    dt = np.result_type(da, db)
    try:
        shape = np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])) + \
            ((a.shape[-2],) if a.ndim >= 2 else ()) + ((b.shape[-1],) if b.ndim >= 2 else ())
    except ValueError:
        raise ValueError(f"matmul: batch dims of a.shape {tuple(a.shape)} and b.shape {tuple(b.shape)} "
                         f"do not broadcast") from None
    kern_out, user_out = check_out(out, ka, a, dt, shape)
    if da != dt:
        a = a.astype(dt)
    if db != dt:
        b = b.astype(dt)
    if a.size == 0 or b.size == 0:
        res = user_out if user_out is not None else _alloc(ka, a, shape, dt)
        res[...] = 0
        return res
    res = _g.manager().dispatch("matmul", (a, b, kern_out), None, backend, "facade", _NAMES[dt], a.nbytes + b.nbytes)
    if user_out is not None and kern_out is None:
        user_out[...] = res
        return user_out
    return user_out if user_out is not None else res
