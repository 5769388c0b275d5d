"""The CUDA backend's process-wide state, in one small module (STYLE.md: module-level state
lives in a tiny file of its own); the loaded kernels live with their loader in :mod:`.module`."""
from __future__ import annotations

import sys
import threading

#: guards loading the kernel module
LOCK = threading.RLock()
#: {op: minimum x.nbytes} for which NumPy input is copied to the GPU and back. Empty by
#: default (host arrays stay on the host backends); ``set_host_copy_policy`` sets it.
HOST_COPY_MIN_BYTES: dict[str, int] = {}
#: device index -> multiprocessor count
SM_COUNT: dict[int, int] = {}
#: (device, torch stream handle) -> cupy.cuda.ExternalStream
EXT_STREAMS: dict = {}

# The package object: its BACKEND (made last in __init__, after these modules) carries the
# one fault hook, ``BACKEND.inject_fault(kind)``; ``fault()`` reads it at call time.
_PKG = sys.modules[__package__]


def fault() -> str | None:
    """The fault injected through ``BACKEND.inject_fault`` ("launch", "oom"), or None."""
    return _PKG.BACKEND.fault
