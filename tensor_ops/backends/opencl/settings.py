"""Every environment variable the OpenCL backend reads, read here and nowhere else, through
the project's registry (:mod:`tensor_ops._env`: names, parsers, defaults and the documented
meaning; BACKEND_CONFIG.md's table is generated from it).

Each is read when it is needed (tests change them between calls). The parsers are lenient
where the backend always was: an LWS that is not a positive integer, or a layout other than
``cpu``/``gpu``, means "unset".
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from tensor_ops import _env


def source_dir() -> Path | None:
    """``TENSOR_OPS_OPENCL_SRC``: a directory holding the ``.cl`` sources."""
    return _env.get("TENSOR_OPS_OPENCL_SRC")


def cache_dir() -> Path | Literal[False] | None:
    """``TENSOR_OPS_OPENCL_CACHE``: the program-binary cache directory (None = unset, the user
    cache dir; False = ``off``, no binary cache)."""
    return _env.get("TENSOR_OPS_OPENCL_CACHE")


def device_spec() -> str:
    """``TENSOR_OPS_OPENCL_DEVICE``: ``"<platform>:<device>"`` or a name substring ('' = auto)."""
    return _env.get("TENSOR_OPS_OPENCL_DEVICE") or ""


def local_size() -> int | None:
    """``TENSOR_OPS_OPENCL_LWS``: the local work size asked for (None = the device default)."""
    return _env.get("TENSOR_OPS_OPENCL_LWS")


def layout() -> str | None:
    """``TENSOR_OPS_OPENCL_LAYOUT``: ``"cpu"`` or ``"gpu"`` (None = by device type)."""
    return _env.get("TENSOR_OPS_OPENCL_LAYOUT")
