"""Process-wide state, kept in one tiny module: the runtime override layers.

``use_backend()`` lives on a ContextVar (so it nests and is per-thread/per-task);
``set_backend()`` is one process-wide value. The registry/manager singletons live in
``_manager``.
"""
from __future__ import annotations

import contextvars
from typing import Optional

context_backend: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "tensor_ops_backend", default=None)
global_backend: Optional[str] = None
# op -> native entry for the facade's plain calls, filled by the global OpManager when the
# policy's first candidate has one (OpManager._install_fast_fn), emptied on every
# invalidation and by set_backend(). One dict for the process: the facade binds its .get.
fast_fns: dict = {}
# the same for out= calls: the entries whose PlainEntry.takes_out (a subset of fast_fns)
fast_out_fns: dict = {}
# the same for an autograd forward that needs the norms' statistics too (PlainEntry.stats)
fast_stats_fns: dict = {}
