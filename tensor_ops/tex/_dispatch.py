"""tex → OpManager: every public tex function validates, then calls :func:`call`."""
from __future__ import annotations

from ._backends import current_override
from ._common import log
from ._register import manager


def call(op: str, args: tuple):
    """Run ``op`` with canonical positional ``args`` through the manager (tex's backend override)."""
    override = current_override()
    mgr = manager()
    if override is not None and log.isEnabledFor(10):
        log.debug("tex.%s: backend override %r", op, override)
    return mgr.dispatch(op, args, None, override, "tex")
