"""tex → OpManager: every public tex function validates, then calls :func:`call`."""
from __future__ import annotations

from typing import Callable

from ._common import log

#: op name → pure-torch reference implementation (registered as ``reference.torch``)
REFERENCE: dict[str, Callable] = {}

_get = None  # () -> OpManager, bound on first use


def reference(op: str):
    def deco(fn):
        REFERENCE[op] = fn
        return fn
    return deco


def manager():
    """The global OpManager (None only while the core is missing during bring-up)."""
    global _get
    if _get is None:
        try:
            from tensor_ops import _global
            _get = _global.manager
        except ImportError:
            try:
                from tensor_ops import get_manager as _gm
                _get = _gm
            except ImportError:
                return None
    m = _get()
    if not _registered:
        _register_into(m.registry)
    return m


_registered: list = []


def _register_into(registry) -> None:
    """Register tex's impls into ``registry`` once (lazily: plugins may import tex while the
    global manager is still being built)."""
    if _registered:
        return
    from ._register import register_all
    register_all(registry)
    _registered.append(registry)


def call(op: str, args: tuple):
    """Run ``op`` with canonical positional ``args`` through the manager (tex's backend override)."""
    from ._backends import current_override

    override = current_override()
    mgr = manager()
    if mgr is None:
        return REFERENCE[op](*args)
    if override is not None and log.isEnabledFor(10):
        log.debug("tex.%s: backend override %r", op, override)
    return mgr.dispatch(op, args, None, override, "tex")
