"""The process-wide registry and manager, built lazily on first use, plus the public
selection API (set_backend / use_backend / get_backend / reload_config).

``import tensor_ops`` does none of this: the first op call (or info query) registers the
built-in backends, loads plugins, validates the configuration and builds the manager.
Backend availability is decided later still, per backend, the first time an order reaches it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Iterator, Optional

from . import _env, _state
from ._manager import OpManager
from ._ops import BUILTIN_BACKENDS, FACADE_OPS as _FACADE_NAMES
from ._policy import build_settings
from ._registry import OpRegistry

log = logging.getLogger("tensor_ops")

_lock = threading.RLock()
_registry: Optional[OpRegistry] = None
_manager: Optional[OpManager] = None
_builtins: dict = {}
_plugins: list = []
_loaded_plugin_names: set = set()
_handler: Optional[logging.Handler] = None
_building_thread: Optional[int] = None   # the thread inside _init(), while it runs


def building() -> bool:
    """True on the thread that is building the global registry and manager right now.

    A plugin loaded during that build may import ``tensor_ops.tex``, which must then not ask
    for the manager (it would re-enter the build); tex registers on its first call instead.
    """
    return _building_thread == threading.get_ident()


def manager() -> OpManager:
    """The global OpManager (built on first use)."""
    m = _manager
    if m is None:
        m = _init()
    return m


def get_manager() -> OpManager:
    """The global :class:`OpManager` that the facade and tex dispatch through."""
    return manager()


def get_registry() -> OpRegistry:
    """The global :class:`OpRegistry` (built-in backends and plugins registered)."""
    return manager().registry


def _apply_logging(settings) -> None:
    global _handler
    log.setLevel(getattr(logging, settings.log_level))
    if settings.log_source != "default" and not log.handlers and not logging.getLogger().handlers:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[tensor_ops %(filename)s:%(lineno)d %(levelname)s] %(message)s"))
        log.addHandler(_handler)


def _load_env_plugins(registry, first_time: bool) -> None:
    from ._plugins import load_plugins
    mods, var = _env.lookup("TENSOR_OPS_PLUGINS")
    mods = [(m, f"env {var}") for m in mods or ()]
    fresh = [(m, src) for m, src in mods if m not in _loaded_plugin_names]
    records = load_plugins(registry, fresh, entry_points=first_time)
    for r in records:
        _loaded_plugin_names.add(r["name"])
    _plugins.extend(records)


def _gpu_device_ids(name: str) -> Optional[list]:
    """The devices the built-in GPU backend ``name`` sees now, or None when it is unavailable
    (its tokens then match nothing anyway). Used by Settings.tuned_gpu_mismatch."""
    mod = _builtins.get(name)
    if mod is None or isinstance(mod, str) or not hasattr(mod, "device_ids"):
        return None
    try:
        return list(mod.device_ids()) if mod.availability()[0] else None
    except Exception:   # a probe must not fail a call; the backend's own checks report it
        return None


def _init() -> OpManager:
    global _building_thread
    with _lock:
        if _manager is not None:
            return _manager
        _building_thread = threading.get_ident()
        try:
            return _build()
        finally:
            _building_thread = None


def _build() -> OpManager:
    """Register the built-ins and plugins, read the settings, make the manager (under _lock)."""
    global _registry, _manager
    from .backends import register_builtins
    registry = OpRegistry(strict_names=True)
    _builtins.update(register_builtins(registry))
    _registry = registry
    _load_env_plugins(registry, True)
    settings = build_settings(os.environ, registry.backends())
    settings.gpu_probe = _gpu_device_ids
    _apply_logging(settings)
    m = OpManager(registry, settings)
    m.fast_fns = _state.fast_fns  # the facade's native fast path reads these dicts
    m.fast_out_fns = _state.fast_out_fns
    m.fast_stats_fns = _state.fast_stats_fns
    _manager = m
    return _manager


def reload_config() -> None:
    """Re-read environment variables and backend.json; drop cached resolutions.

    Raises ConfigError (a ValueError) naming the file/variable and key when invalid; the
    previous configuration then stays in force.
    """
    with _lock:
        m = manager()
        _load_env_plugins(m.registry, False)
        settings = build_settings(os.environ, m.registry.backends())
        settings.gpu_probe = _gpu_device_ids
        _apply_logging(settings)
        m.invalidate(settings)


@contextlib.contextmanager
def settings_override(**changes) -> Iterator[None]:
    """Run a block with some settings changed (e.g. ``strict=True``), process-wide, without
    touching ``os.environ``; the previous settings object comes back afterwards, even if a
    reload_config() happened inside (the block's view of the world ends with the block).

    Used by tensor_ops.testing and the benchmark engine's validation."""
    import dataclasses
    m = manager()
    with _lock:
        old = m.settings
        if old is not None:      # a manager without settings: nothing to switch
            m.invalidate(dataclasses.replace(old, **changes))
    if old is None:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            m.invalidate(old)


def _check_override(name) -> None:
    manager()._tokens_for_override(name)


def set_backend(name: Optional[str]) -> None:
    """Force a backend (or an order, ``"cpp,numpy"``) for every op; ``None`` clears it.

    Example:
        >>> import tensor_ops as to
        >>> to.set_backend("numpy"); to.get_backend("rms_norm")
        'numpy'
        >>> to.set_backend(None)
    """
    if name is not None:
        _check_override(name)
    m = manager()
    with m._lock:   # no resolve() can install a fast entry in between
        _state.global_backend = name
        m.clear_fast()
        if name is None:
            for op in {r.op for r in m._cache.values() if r.api == "facade"}:
                m._install_fast_fn(op)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager: force ``name`` (or an order) inside the block, this thread/task only.

    Example:
        >>> import numpy as np, tensor_ops as to
        >>> with to.use_backend("numpy"):
        ...     y = to.silu(np.zeros(3, np.float32))
    """
    _check_override(name)
    token = _state.context_backend.set(name)
    try:
        yield
    finally:
        _state.context_backend.reset(token)


def get_backend(op: Optional[str] = None, dtype: str = "float32", nbytes: int = 1 << 26) -> str:
    """The backend that serves ``op`` for NumPy input of ``dtype`` and ``nbytes`` bytes, or,
    with no op, the first available backend of the default order that takes NumPy input
    without being named (device backends serve host arrays only when an order names them).
    """
    m = manager()
    if op is None:
        for name in BUILTIN_BACKENDS:
            impls = [i for i in m.registry.all_impls() if i.backend == name and i.api == "facade"]
            if impls and impls[0].host_arrays == "always" and not m._exclusion(impls[0]):
                return name
        return "numpy"
    override = _state.context_backend.get() or _state.global_backend
    res = m.resolve(op, override, "facade" if op in _FACADE_NAMES else None, dtype, nbytes)
    host = [i for i in res.candidates if not i.declines_host]
    if not host:
        raise NotImplementedError(f"no available implementation of op {op!r}")
    return host[0].backend



def builtins() -> dict:
    manager()
    return dict(_builtins)


def plugins() -> list:
    manager()
    return list(_plugins)
