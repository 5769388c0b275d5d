"""A tiny out-of-tree plugin package: ``register(registry)`` is all tensor_ops needs.

Load it with ``TENSOR_OPS_PLUGINS=acme_tensor_plugin`` (or TE-FL's ``TE_FL_PLUGIN_MODULES``),
or install it: its pyproject declares the ``tensor_ops.plugins`` entry point.
"""
from __future__ import annotations

import numpy as np

from tensor_ops.plugin import BackendImplKind, OpImpl

CALLS = {"silu": 0}


def acme_silu(x, out):
    CALLS["silu"] += 1
    xf = x.astype(np.float32)
    y = xf / (1.0 + np.exp(-xf))
    if out is None:
        return y.astype(x.dtype)
    out[...] = y
    return out


def register(registry):
    """Called once by tensor_ops with the global registry."""
    registry.register_impl(OpImpl(
        op_name="silu", impl_id="vendor.acme", kind=BackendImplKind.VENDOR, vendor="acme",
        fn=acme_silu, priority=200, api="facade",
        supports=lambda x, out: x.dtype != np.float64))
