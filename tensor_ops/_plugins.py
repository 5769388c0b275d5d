"""Plugin discovery: modules named in TENSOR_OPS_PLUGINS / TE_FL_PLUGIN_MODULES and entry
points in group ``tensor_ops.plugins``. A plugin is a module with a ``BACKEND`` (the backend
contract, registered by the same registrar as the built-in backends), or with TE-FL's
``register(registry)``, or a callable taking the registry. A plugin that fails to import or
register (a bad op name, a function that cannot take its op's arguments, an exception) is
isolated: logged, recorded with its reason, and its partial registrations are undone.
"""
from __future__ import annotations

import importlib
import logging
import traceback

log = logging.getLogger("tensor_ops")

ENTRY_POINT_GROUP = "tensor_ops.plugins"


def _entry_points():
    try:
        from importlib.metadata import entry_points
        return list(entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # broken metadata must not break import
        log.warning("tensor_ops: reading entry points failed: %s", exc)
        return []


def _register_one(registry, name: str, source: str, obj_loader) -> dict:
    before = {(i.op_name, i.api, i.impl_id) for i in registry.all_impls()}
    try:
        obj = obj_loader()
        from .backends._contract import Backend, register_backend
        backend = getattr(obj, "BACKEND", obj if isinstance(obj, Backend) else None)
        fn = getattr(obj, "register", None)
        if isinstance(backend, Backend) and fn is None:
            register_backend(registry, backend)
        else:
            if fn is None and callable(obj):
                fn = obj
            if fn is None:
                raise TypeError(f"plugin {name!r} has no register(registry) function, no BACKEND and is not callable")
            fn(registry)
    except BaseException as exc:  # isolate everything a plugin can throw, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        for impl in registry.all_impls():
            if (impl.op_name, impl.api, impl.impl_id) not in before:
                registry.unregister_impl(impl.op_name, impl.impl_id, impl.api)
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("tensor_ops: plugin %r (%s) failed and was skipped: %s", name, source, reason)
        log.debug("%s", traceback.format_exc())
        return {"name": name, "source": source, "ok": False, "reason": reason}
    added = sorted({i.impl_id for i in registry.all_impls() if (i.op_name, i.api, i.impl_id) not in before})
    log.info("tensor_ops: plugin %r (%s) registered %s", name, source, added)
    return {"name": name, "source": source, "ok": True, "impl_ids": added}


def load_plugins(registry, modules, entry_points: bool = True) -> list[dict]:
    """Load every plugin; return one record per plugin (ok, reason or impl_ids)."""
    records = []
    for mod, source in modules:
        records.append(_register_one(registry, mod, source, lambda m=mod: importlib.import_module(m)))
    for ep in (_entry_points() if entry_points else ()):
        records.append(_register_one(registry, ep.name, f"entry point {ep.value}", ep.load))
    return records
