"""The OpenCL backend's process-wide state, in one small module (STYLE.md: module-level state
lives in a tiny file of its own). Everything here is reset by the package's
``_reset_for_tests()``."""
from __future__ import annotations

import sys
import threading
from typing import Any

#: guards device creation, kernel creation, the buffer pool and enqueues
LOCK = threading.RLock()
#: the :class:`~tensor_ops.backends.opencl.device.Device` of the chosen device, once created
device: Any = None
#: context ``int_ptr`` -> Device, for pyopencl arrays of other contexts
ctx_devices: dict = {}
#: host-array strategy: None = per device ("hostptr" on CPU / unified-memory devices, "copy"
#: otherwise); :func:`tensor_ops.backends.opencl.set_host_mode` sets it (benchmark, tests)
host_mode: str | None = None
#: binary-cache counters and the last program load time, shown by get_opencl_info()
STATS = {"hits": 0, "misses": 0, "builds": 0, "corrupt": 0, "load_ms": 0.0}

# The package object: its BACKEND (made last in __init__, after these modules) carries the
# one fault hook, ``BACKEND.inject_fault(kind)``; ``fault()`` reads it at call time.
_PKG = sys.modules[__package__]


def fault() -> str | None:
    """The fault injected through ``BACKEND.inject_fault`` ("build", "device_lost", "oom"), or None."""
    return _PKG.BACKEND.fault


def reset() -> None:
    """Forget the devices and counters (tests only)."""
    global device
    with LOCK:
        device = None
        ctx_devices.clear()
        STATS.update(hits=0, misses=0, builds=0, corrupt=0, load_ms=0.0)
