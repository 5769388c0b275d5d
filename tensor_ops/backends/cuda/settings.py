"""Every environment variable the CUDA backend reads, read here and nowhere else, through the
project's registry (:mod:`tensor_ops._env`; BACKEND_CONFIG.md's table is generated from it)."""
from __future__ import annotations

from tensor_ops import _env


def skip_requested() -> bool:
    """``TE_FL_SKIP_CUDA`` (TE-FL's switch): a true value disables the backend. Never raises:
    a probe must not fail on a typo, which the resolver reports anyway."""
    return _env.enabled("TE_FL_SKIP_CUDA")
