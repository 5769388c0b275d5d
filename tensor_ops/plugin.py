"""TE-FL's plugin core under its familiar names: ``from tensor_ops.plugin import OpRegistry,
OpManager, OpImpl, BackendImplKind``."""
from __future__ import annotations

from ._manager import OpManager
from ._registry import BackendImplKind, OpImpl, OpRegistry

__all__ = ["OpRegistry", "OpManager", "OpImpl", "BackendImplKind"]
