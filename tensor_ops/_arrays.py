"""What kind of array a value is, without importing the toolkits that define them.

NumPy arrays take the fast path everywhere; CuPy arrays, torch tensors and
``pyopencl.array.Array`` are recognised by their type's module so that ``import tensor_ops``
never imports cupy, torch, pyopencl or ml_dtypes.

bfloat16 is a first-class dtype: NumPy arrays of ``ml_dtypes.bfloat16`` (recognised by the
dtype's name, so ml_dtypes is imported only by code that has to make one) and torch
``bfloat16`` tensors.
"""
from __future__ import annotations

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_FLOAT_SET = frozenset(FLOAT_DTYPES)
ACCEPTED = "float16, bfloat16, float32 or float64"


def kind_of(a) -> str:
    """'numpy', 'cupy', 'torch', 'pyopencl' or '' (not an array we take)."""
    t = type(a)
    if t is np.ndarray:
        return "numpy"
    mod = t.__module__.split(".", 1)[0]
    if mod in ("cupy", "torch", "pyopencl"):
        return mod
    if isinstance(a, np.ndarray):
        return "numpy"
    return ""


def bfloat16():
    """The NumPy bfloat16 dtype (``ml_dtypes``, a dependency; imported on first use)."""
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def is_bf16(dt) -> bool:
    """Whether NumPy dtype ``dt`` is ml_dtypes' bfloat16 (by name: no import needed; cached,
    since ``dtype.name`` is Python code in NumPy)."""
    if dt is None or dt.itemsize != 2:
        return False
    r = _IS_BF16.get(dt)
    if r is None:
        r = _IS_BF16[dt] = dt.name == "bfloat16"
    return r


_IS_BF16: dict = {}


def np_dtype(a, kind: str):
    """The array's dtype as a NumPy dtype (torch dtypes mapped, bfloat16 to ml_dtypes';
    None for a torch dtype NumPy has no equivalent of)."""
    if kind == "numpy":
        return a.dtype
    if kind == "torch":
        d = a.dtype
        r = _TORCH_NP.get(d)
        if r is None:
            import torch  # only reached when the caller already passed a torch tensor
            r = bfloat16() if d is torch.bfloat16 else {
                torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
                torch.float64: np.dtype(np.float64)}.get(d, None)
            if r is not None:
                _TORCH_NP[d] = r
        return r
    return np.dtype(a.dtype)


#: torch dtype -> NumPy dtype, filled as each dtype is first seen (the mapping was a dict built
#: on every call; ml_dtypes is still imported only for a bfloat16 tensor)
_TORCH_NP: dict = {}


def dtype_label(a, kind: str) -> str:
    return str(a.dtype).replace("torch.", "") if kind == "torch" else str(np.dtype(a.dtype))


def device_of(a, kind: str) -> str:
    if kind == "cupy":
        return f"cuda:{a.device.id}"
    if kind == "torch":
        return str(a.device)
    if kind == "pyopencl":
        return f"opencl:{a.queue.device.name if a.queue is not None else '?'}"
    return "cpu"


def is_float(dt) -> bool:
    return dt in _FLOAT_SET or is_bf16(dt)


def math_dtype(dt):
    """The dtype the NumPy reference computes ``dt`` in: float32 for the 16-bit storage types."""
    return np.dtype(np.float32) if dt.itemsize == 2 else dt


def dtype_name(dt) -> str:
    """'float32', 'bfloat16', ... (the resolver's and the tolerance table's name)."""
    return dt.name
