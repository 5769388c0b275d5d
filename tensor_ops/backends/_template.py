"""Template for a vendor backend of the facade ops: copy, rename, fill in.

A backend is a module with ``NAME``, ``availability()``, ``register(registry)`` and
``info()`` (CONTRIBUTING.md, "The backend contract"). Ship it as a plugin package (see
``examples/outtree_plugin``) and load it with ``TENSOR_OPS_PLUGINS=your_module`` or an
entry point in group ``tensor_ops.plugins``; it is then selectable as ``vendor:<name>`` (or
by its name) in every order: ``backend=``, ``use_backend``, ``TENSOR_OPS_PRIORITY``,
backend.json ``priority``/``per_op``.

What you receive in ``fn`` is already validated (2-D C-contiguous float16/float32 ``x``,
weights cast, ``out`` None or writable). Raise ValueError/TypeError only for user errors;
raise anything else (``tensor_ops.BackendError``) for device/driver trouble and tensor_ops
falls back to the next backend with one warning (or raises, in strict mode).
"""
from __future__ import annotations

import functools

import numpy as np

from tensor_ops import BackendError
from tensor_ops.plugin import BackendImplKind, OpImpl

NAME = "mydevice"


@functools.lru_cache(maxsize=None)
def availability() -> tuple[bool, str]:
    """Decided once: import the SDK, find a device, run a probe kernel and check it."""
    try:
        # import my_sdk; dev = my_sdk.first_device()
        x = np.array([[3.0, 4.0]], np.float32)
        y = rms_norm(x, np.ones(2, np.float32), 0.0, None)
        if not np.allclose(y, x / np.sqrt(12.5), rtol=1e-6):
            return False, f"probe kernel returned wrong numbers: {y}"
        return True, ""
    except Exception as exc:  # availability never raises
        return False, f"{type(exc).__name__}: {exc}"


def rms_norm(x, weight, eps, out):
    try:
        ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)  # replace with your kernel
        y = x * (1.0 / np.sqrt(ms + np.float32(eps))) * weight
    except MemoryError as exc:
        raise BackendError(f"{NAME}: out of device memory") from exc
    if out is None:
        return y.astype(x.dtype, copy=False)
    out[...] = y
    return out


def _supports(x, *rest) -> bool:
    return type(x) is np.ndarray and x.dtype in (np.float16, np.float32)


def info() -> dict:
    return {"device": "describe the device here"}


def register(registry) -> None:
    for op, fn in {"rms_norm": rms_norm}.items():
        registry.register_impl(OpImpl(op_name=op, impl_id=f"vendor.{NAME}", kind=BackendImplKind.VENDOR,
                                      vendor=NAME, fn=fn, priority=100, supports=_supports,
                                      available=availability, api="facade"))
