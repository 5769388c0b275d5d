"""Every environment variable the CUDA backend reads, read here and nowhere else (one place to
switch to the project's environment registry). BACKEND_CONFIG.md documents them."""
from __future__ import annotations

import os


def skip_requested() -> bool:
    """``TE_FL_SKIP_CUDA`` (TE-FL's switch): a true value disables the backend."""
    return os.environ.get("TE_FL_SKIP_CUDA", "").strip().lower() in ("1", "true", "yes", "on")
