"""Input validation, once, before dispatch, identical for every backend.

Each ``prepare_*`` returns the normalised arguments of the backend contract
(CONTRIBUTING.md): 2-D C-contiguous ``x``, weight/bias cast to ``x``'s dtype, a writable
contiguous ``out`` view or ``None``. Errors follow one formula: the argument, its value
(``!r``), what is accepted.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ._arrays import ACCEPTED, device_of, dtype_label, is_bf16, is_float, kind_of, np_dtype


def _kind(a, name: str) -> str:
    k = kind_of(a)
    if not k:
        raise TypeError(f"{name} must be an array (numpy.ndarray, or a CuPy / torch CUDA / pyopencl array "
                        f"for the device backends), got {type(a).__name__}")
    return k


def _native(dt):
    """Byte-swapped floats count as their native dtype (the copy to native order happens in
    contiguous()/as_dtype(), so kernels only ever see native data)."""
    if dt is not None and dt.kind == "f" and not dt.isnative:
        return dt.newbyteorder("=")
    return dt


def check_x(x, name: str = "x"):
    """Return (x, kind, dtype) for a floating array of rank ≥ 1."""
    k = _kind(x, name)
    if k == "numpy" and isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a numpy.ma.MaskedArray: its mask would be ignored; pass "
                        f"{name}.filled(value) or a plain numpy.ndarray")
    dt = _native(np_dtype(x, k))
    if dt is None or not is_float(dt):
        raise TypeError(f"{name} must have dtype {ACCEPTED}, got {dtype_label(x, k)}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least 1 dimension (the last one is the feature axis), "
                         f"got a 0-d array")
    return k, dt


def check_eps(eps, name: str = "eps") -> float:
    if type(eps) is float and 0.0 <= eps < math.inf:
        return eps
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {eps!r}")
    e = float(eps)
    if not math.isfinite(e) or e < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    return e


def same_place(a, ka, x, kx, name: str, ref: str = "x") -> None:
    """``a`` (argument ``name``) must be the same array kind as ``ref`` and on its device."""
    if ka != kx:
        raise TypeError(f"{name} is a {ka} array but {ref} is a {kx} array: pass both on the same device")
    if kx != "numpy":
        da, dx = device_of(a, ka), device_of(x, kx)
        if da != dx:
            raise ValueError(f"{name} is on {da} but {ref} is on {dx}: pass both on the same device")


def contiguous(a, kind: str):
    """A C-contiguous, aligned version of ``a`` (a copy only when needed)."""
    if kind == "numpy":
        f = a.flags
        if f.c_contiguous and f.aligned and type(a) is np.ndarray and a.dtype.isnative:
            return a
        if not a.dtype.isnative:
            return np.ascontiguousarray(a.astype(a.dtype.newbyteorder("="), subok=False))
        # a copy is also a plain ndarray: subclasses (np.matrix, memmap, ...) lose their type
        return np.array(a, order="C", copy=True, subok=False)
    if kind == "torch":
        return a.contiguous()
    if kind == "cupy":
        import cupy
        return cupy.ascontiguousarray(a)
    return a if a.flags.c_contiguous else a.copy()


def as_dtype(a, ka, dt, kind_x):
    """Cast ``a`` to dtype ``dt`` of the x array kind."""
    if np_dtype(a, ka) == dt:
        return a
    if ka == "torch":
        import torch
        return a.to(torch.bfloat16 if is_bf16(dt) else getattr(torch, dt.name))
    return a.astype(dt)


def check_vector(v, name: str, n: int, x, kx: str, dt):
    """weight/bias: floating, 1-D, length n, same device as x; cast to x's dtype."""
    kv = _kind(v, name)
    vdt = _native(np_dtype(v, kv))
    if vdt is None or not is_float(vdt):
        raise TypeError(f"{name} must have dtype {ACCEPTED}, got {dtype_label(v, kv)}")
    if v.ndim != 1 or v.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match x.shape[-1] = {n}, got {tuple(v.shape)}")
    same_place(v, kv, x, kx, name)
    return contiguous(as_dtype(v, kv, dt, kx), kv)


def check_like_x(v, name: str, x, kx: str, dt):
    """A second input of x's shape (e.g. ``residual``): floating, same shape and device as x;
    cast to x's dtype."""
    kv = _kind(v, name)
    vdt = _native(np_dtype(v, kv))
    if vdt is None or not is_float(vdt):
        raise TypeError(f"{name} must have dtype {ACCEPTED}, got {dtype_label(v, kv)}")
    if tuple(v.shape) != tuple(x.shape):
        raise ValueError(f"{name} must have the shape of x, {tuple(x.shape)}, got {tuple(v.shape)}")
    same_place(v, kv, x, kx, name)
    return as_dtype(v, kv, dt, kx)


def _extent(a, kind: str):
    """(first byte, one past the last byte) that ``a`` can touch, or None when unknown."""
    if kind == "torch":
        if a.numel() == 0:
            return None
        size = a.element_size()
        lo = hi = a.data_ptr()
        for n, st in zip(a.shape, a.stride()):
            (lo, hi) = (lo + (n - 1) * st * size, hi) if st < 0 else (lo, hi + (n - 1) * st * size)
        return lo, hi + size
    if kind == "cupy":
        if a.size == 0:
            return None
        lo = hi = a.data.ptr
        for n, st in zip(a.shape, a.strides):
            (lo, hi) = (lo + (n - 1) * st, hi) if st < 0 else (lo, hi + (n - 1) * st)
        return lo, hi + a.itemsize
    return None


def overlaps(out, kind: str, inputs) -> bool:
    """Whether ``out`` may share memory with any of ``inputs`` (arrays or None).

    A conservative answer (NumPy's bounds check; address ranges on devices; the same buffer
    for pyopencl) only costs a temporary: the result is computed into a fresh array and
    copied into ``out``, so in-place calls (``out=x``, ``out=weight``, …) give the same
    numbers as separate buffers on every backend."""
    arrays = [a for a in inputs if a is not None]
    if kind == "numpy":
        return any(isinstance(a, np.ndarray) and np.may_share_memory(out, a) for a in arrays)
    if kind == "pyopencl":
        return any(getattr(a, "base_data", None) is out.base_data for a in arrays)
    ext = _extent(out, kind)
    if ext is None:
        return False
    for a in arrays:
        e = _extent(a, kind) if kind_of(a) == kind else None
        if e is not None and e[0] < ext[1] and ext[0] < e[1]:
            return True
    return False


def _check_one_out(out, kx: str, x, dt, shape: tuple, name: str) -> tuple:
    """(kind, whether the kernel may write into it) for one output array ``name``."""
    ko = _kind(out, name)
    same_place(out, ko, x, kx, name)
    odt = np_dtype(out, ko)
    if odt != dt:
        raise TypeError(f"{name} must have dtype {dt} (the dtype of x), got {dtype_label(out, ko)}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(out.shape)}")
    if ko == "numpy":
        if not out.flags.writeable:
            raise ValueError(f"{name} is read-only: pass a writable array")
        f = out.flags
        return ko, f.c_contiguous and f.aligned
    if ko == "torch":
        return ko, out.is_contiguous()
    return ko, out.flags.c_contiguous


def check_out(out, kx: str, x, dt, shape: tuple, inputs: tuple = ()):
    """Validate ``out=``; return (view the kernel writes or None, the caller's out or None).

    The kernel gets no view (it allocates, and the facade copies the result into ``out``)
    when ``out`` is not C-contiguous or may share memory with ``x`` or any of ``inputs``."""
    if out is None:
        return None, None
    ko, direct = _check_one_out(out, kx, x, dt, shape, "out")
    if direct and overlaps(out, ko, (x, *inputs)):
        direct = False
    return (out if direct else None), out


def same_array(a, b, kind: str) -> bool:
    """Whether ``a`` and ``b`` are the same memory with the same layout (one array, maybe
    two view objects of it): the exact in-place case."""
    if a is b:
        return True
    if a is None or b is None or kind_of(b) != kind or tuple(a.shape) != tuple(b.shape):
        return False
    if kind == "numpy":
        return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
                and a.strides == b.strides and a.dtype == b.dtype)
    if kind == "torch":
        return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.dtype == b.dtype
    if kind == "cupy":
        return a.data.ptr == b.data.ptr and a.strides == b.strides and a.dtype == b.dtype
    return (getattr(a, "base_data", None) is getattr(b, "base_data", None) and a.offset == b.offset
            and a.strides == b.strides and a.dtype == b.dtype)


def _overlap(a, b, kind: str) -> bool:
    """Whether ``a`` and ``b`` share memory (NumPy: exactly, so interleaved views of one buffer
    do not; the bounds check first, which settles nearly every call)."""
    if b is None or a is None:
        return False
    if kind == "numpy":
        return isinstance(b, np.ndarray) and np.may_share_memory(a, b) and bool(np.shares_memory(a, b))
    return overlaps(a, kind, (b,))


def check_out_pair(out, kx: str, x, dt, shape: tuple, mates: tuple, inputs: tuple):
    """Validate a two-array ``out=(out0, out1)``; return (the kernel's views, each the array
    or None, or None; the caller's tuple or None).

    ``mates[i]`` (name, array) is the one input ``out[i]`` may be (exactly: the in-place
    form, e.g. ``out=(x, residual)``); any other sharing of memory, between the two outputs or
    with ``inputs`` ((name, array) pairs, the mates included), is a ValueError naming both."""
    if out is None:
        return None, None
    if type(out) is not tuple or len(out) != 2:
        what = f"a tuple of {len(out)}" if type(out) is tuple else type(out).__name__
        raise TypeError(f"out must be a tuple of two arrays (out for the normed result, out for the sum), "
                        f"got {what}")
    names = ("out[0]", "out[1]")
    views = []
    for i, o in enumerate(out):
        ko, direct = _check_one_out(o, kx, x, dt, shape, names[i])
        views.append((ko, direct))
    if _overlap(out[0], out[1], views[0][0]):
        raise ValueError("out[0] and out[1] share memory: pass two separate arrays")
    kern = []
    for i, o in enumerate(out):
        ko, direct = views[i]
        mate_name, mate = mates[i]
        for name, a in inputs:
            if a is None or kind_of(a) != ko:
                continue
            if name == mate_name and same_array(o, mate, ko):
                continue
            if _overlap(o, a, ko):
                allowed = f"; {names[i]} may only be {mate_name} itself (in place)"
                raise ValueError(f"{names[i]} shares memory with {name}{allowed}: pass a separate array")
        kern.append(o if direct else None)
    return tuple(kern), out


def rows_2d(a, n: int):
    """View ``a`` (contiguous) as (rows, n)."""
    return a if a.ndim == 2 else a.reshape(-1, n)
