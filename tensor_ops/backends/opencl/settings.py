"""Every environment variable the OpenCL backend reads, read here and nowhere else.

Each is read when it is needed (tests change them between calls), so moving to a project-wide
environment registry is a change to :func:`_get` alone. BACKEND_CONFIG.md documents them.
"""
from __future__ import annotations

import os


def _get(name: str) -> str:
    return os.environ.get(name, "").strip()


def source_dir() -> str | None:
    """``TENSOR_OPS_OPENCL_SRC``: a directory holding the ``.cl`` sources."""
    return _get("TENSOR_OPS_OPENCL_SRC") or None


def cache_dir() -> str | None:
    """``TENSOR_OPS_OPENCL_CACHE``: the program-binary cache directory."""
    return _get("TENSOR_OPS_OPENCL_CACHE") or None


def device_spec() -> str:
    """``TENSOR_OPS_OPENCL_DEVICE``: ``"<platform>:<device>"`` or a name substring ('' = auto)."""
    return _get("TENSOR_OPS_OPENCL_DEVICE")


def local_size() -> int | None:
    """``TENSOR_OPS_OPENCL_LWS``: the local work size asked for (None = the device default)."""
    v = _get("TENSOR_OPS_OPENCL_LWS")
    return int(v) if v.isdigit() and int(v) > 0 else None


def layout() -> str | None:
    """``TENSOR_OPS_OPENCL_LAYOUT``: ``"cpu"`` or ``"gpu"`` (None = by device type)."""
    v = _get("TENSOR_OPS_OPENCL_LAYOUT").lower()
    return v if v in ("cpu", "gpu") else None
