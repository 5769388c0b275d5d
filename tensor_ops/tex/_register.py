"""Put every tex op into the global OpRegistry — reference.torch, default.cpp / default.cuda
adapters where kernels exist, vendor.nvidia passthrough — once, and hand out the global
manager with them registered.

Registration is wired one way: the op families fill ``_refs.REFERENCE`` when imported,
:func:`manager` registers on first use, and everything that dispatches (``_dispatch``,
``_backends``) imports :func:`manager` from here; nothing here imports them back.
"""
from __future__ import annotations

import importlib
import threading

from tensor_ops import _global
from tensor_ops._ops import TEX_OPS
from tensor_ops._registry import BackendImplKind, OpImpl

from ._common import log
from ._refs import REFERENCE

# Modules with a register(registry): optional (a missing toolkit only means no such impls).
ADAPTERS = ("_cpp_adapters", "_cuda_adapters", "_nvidia")

_lock = threading.Lock()
_done = False


def register_all(registry) -> None:
    """Register tex's impls into ``registry`` once per process (impl ids already there, e.g.
    from a plugin that registered them itself, are kept)."""
    global _done
    with _lock:
        if _done:
            return
        missing = sorted(set(TEX_OPS) - set(REFERENCE))
        if missing:  # every declared tex op must have a reference
            raise RuntimeError(f"tensor_ops.tex: no reference.torch implementation for {missing}")
        have = {i.impl_id for i in registry.get_impls("rmsnorm_fwd", "tex")}
        if "reference.torch" not in have:
            for op in TEX_OPS:
                registry.register_impl(OpImpl(op_name=op, impl_id="reference.torch",
                                              kind=BackendImplKind.REFERENCE, fn=REFERENCE[op],
                                              backend="torch", priority=0, api="tex"))
        for modname in ADAPTERS:
            try:
                mod = importlib.import_module(f"{__package__}.{modname}")
            except ImportError as exc:
                log.debug("tensor_ops.tex: %s not loaded: %s", modname, exc)
                continue
            impl_id = getattr(mod, "IMPL_ID", f"vendor.{getattr(mod, 'NAME', '')}")
            if impl_id not in have:
                mod.register(registry)
        _done = True


def manager():
    """The global OpManager, tex's impls registered into its registry.

    Lazily: a plugin may import tex while the global manager is being built
    (``_global.building()``); tex then registers on its first call, through here."""
    m = _global.manager()
    if not _done:
        register_all(m.registry)
    return m
