"""``rope``, rotary position embedding (kernels: cpp_ext/rope.cpp, opencl_ext/rope.cl,
cuda_ext/rope.cu)."""
from __future__ import annotations

import numpy as np

from .._validate import check_x, same_place
from ._common import f64, rows
from ._spec import OpSpec, XRule


def rope(x, cos, sin, interleaved=False):
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


def _angles(c, name, kx, x, t, n, interleaved, work_dt):
    """``cos``/``sin`` as a C-contiguous (T, n) table of the work dtype, on x's device."""
    kc, _ = check_x(c, name)
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


def _prepare(x, cos, sin, interleaved, out):
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
    return rows(x, kx, dt, (c, s, bool(interleaved)), out, inputs=(cos, sin))


def _full(a, n, interleaved):
    a = f64(a)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.shape[-1] == n:
        return a
    return np.repeat(a, 2, axis=-1) if interleaved else np.concatenate([a, a], axis=-1)


def _oracle(x, cos, sin, interleaved=False):
    """``x·cos + rot(x)·sin`` with (T, n) tables; rot pairs (i, i+n/2) or (2i, 2i+1)."""
    x = f64(x)
    n = x.shape[-1]
    c, s = _full(cos, n, interleaved), _full(sin, n, interleaved)
    rot = np.empty_like(x)
    if interleaved:
        rot[..., 0::2], rot[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    else:
        h = n // 2
        rot[..., :h], rot[..., h:] = -x[..., h:], x[..., :h]
    return x * c + rot * s


def _args(x, rng, variant):
    t, n = x.shape[-2], x.shape[-1]
    ang = rng.uniform(-4, 4, (t, n // 2))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32), variant == "interleaved"


ROPE = OpSpec(stub=rope, kernel_params=("x", "cos", "sin", "interleaved", "out"), prepare=_prepare,
              oracle=_oracle, make_args=_args, variants=("", "interleaved"), x_rule=XRule(even=True, min_ndim=2))
