"""Old names of :mod:`jsonfile`, kept only until ``tensor_ops/backends/cpp.py`` (owned by the
C++ split) switches to ``jsonfile.recorded("built", "cpp")``; then delete this file.

``config_path()`` was "$TENSOR_OPS_CONFIG, else the project file"; it is now
``jsonfile.write_target()``, the one rule the runtime and every command share.
"""
from __future__ import annotations

from .jsonfile import SCHEMA_VERSION, update_section  # noqa: F401
from .jsonfile import atomic_write as atomic_write_json  # noqa: F401
from .jsonfile import read_document as read_json  # noqa: F401
from .jsonfile import write_target as config_path  # noqa: F401
