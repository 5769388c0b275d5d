"""TE-FL's vendor API: TEXBackendBase, @register_backend, list/set/get_backend, use_backend.

A tex backend is a name that order tokens match (``OpImpl.backend``): ``torch`` (the
``reference.torch`` impls), ``cpp`` / ``cuda`` (``default.*`` adapters), ``nvidia`` (a real
``transformer_engine_torch``) and every vendor registered with :func:`register_backend`.
Selecting one here is an order override passed to the manager for tex ops only; the
facade's own ``set_backend`` is untouched.
"""
from __future__ import annotations

import abc
import contextlib
import contextvars
import sys
from typing import Optional

from tensor_ops import _env
from tensor_ops._ops import TEX_OPS
from tensor_ops._registry import BackendImplKind, OpImpl

from ._register import manager

__all__ = ["TEXBackendBase", "register_backend", "unregister_backend", "list_backends", "set_backend",
           "get_backend", "use_backend"]

#: built-in tex backends: name → (vendor, priority shown by list_backends)
BUILTIN = {"nvidia": ("NVIDIA", 100), "cuda": ("tensor_ops", 90), "cpp": ("tensor_ops", 50),
           "torch": ("PyTorch", 0)}

_ctx: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("tex_backend", default=None)
_forced: Optional[str] = None
_VENDORS: dict = {}                 # name → TEXBackendBase instance
_env_checked: dict = {}             # (env value, registry version) → validated name


def _not_implemented(op):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"{op} not implemented by tex backend {self.name!r}")
    method.__name__ = method.__qualname__ = op
    method._tex_base_method = True
    return method


class TEXBackendBase(abc.ABC):
    """One method per tex op; a subclass overrides the ones it implements.

    Class attributes ``NAME`` (case-insensitive), ``PRIORITY`` (higher first among vendors)
    and optionally ``VENDOR``. Methods receive the tex function's arguments positionally,
    already validated, with ``otype``/``output_dtype`` as a ``torch.dtype`` and ``quantizer``
    None. An op whose method is not overridden (or raises) is served by the next candidate.
    """

    NAME: str = ""
    VENDOR: str = ""
    PRIORITY: int = 50

    @property
    def name(self) -> str:
        return (self.NAME or type(self).__name__).lower()

    @property
    def vendor(self) -> str:
        return self.VENDOR or self.name

    @property
    def priority(self) -> int:
        return int(self.PRIORITY)

    @abc.abstractmethod
    def is_available(self) -> bool:
        """Whether the hardware/library this backend needs is present (asked once)."""

    @classmethod
    def implemented_ops(cls) -> list:
        return [op for op in TEX_OPS if not getattr(getattr(cls, op), "_tex_base_method", False)]

    def __repr__(self) -> str:
        return f"<tex backend {self.name!r} vendor={self.vendor!r} priority={self.priority}>"


for _op in TEX_OPS:
    setattr(TEXBackendBase, _op, _not_implemented(_op))


class _BuiltinBackend(TEXBackendBase):
    """What :func:`get_backend` returns for the built-in backends: methods call tex forced to it."""

    def __init__(self, name):
        self._name = name

    @property
    def name(self):
        return self._name

    @property
    def vendor(self):
        return BUILTIN.get(self._name, (self._name, 0))[0]

    @property
    def priority(self):
        return BUILTIN.get(self._name, (self._name, 0))[1]

    def is_available(self):
        return _backend_available(self._name)


def _forward(op):
    def method(self, *args, **kwargs):
        # The package's public (validating) function; looked up, not imported: the package
        # imports this module, and is complete by the time a backend object exists.
        tex = sys.modules[__package__]
        with use_backend(self.name):
            return getattr(tex, op)(*args, **kwargs)
    method.__name__ = op
    return method


for _op in TEX_OPS:
    setattr(_BuiltinBackend, _op, _forward(_op))


def _registry():
    return manager().registry


def register_backend(cls, registry=None):
    """Class decorator: each overridden method becomes an OpImpl ``vendor.<name>`` of kind VENDOR.

    Example::

        @register_backend
        class Acme(TEXBackendBase):
            NAME, PRIORITY = "acme", 90
            def is_available(self): return True
            def gelu(self, input, quantizer): ...

    ``registry``: register there instead of the global registry (a plugin's
    ``register(registry)`` passes the one it was given).
    """
    if not (isinstance(cls, type) and issubclass(cls, TEXBackendBase)):
        raise TypeError(f"@register_backend expects a TEXBackendBase subclass, got {cls!r}")
    inst = cls()
    name = inst.name
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"tex backend NAME must be a simple identifier, got {name!r}")
    if name in BUILTIN or name in _VENDORS:
        raise ValueError(f"tex backend {name!r} is already registered "
                         f"({'built-in' if name in BUILTIN else type(_VENDORS[name]).__qualname__}); "
                         f"choose another NAME or unregister_backend({name!r}) first")
    ops = cls.implemented_ops()
    reg = registry if registry is not None else _registry()
    done = []

    def available():
        return bool(inst.is_available())

    try:
        for op in ops:
            reg.register_impl(OpImpl(op_name=op, impl_id=f"vendor.{name}", kind=BackendImplKind.VENDOR,
                                     vendor=name, fn=getattr(inst, op), priority=inst.priority,
                                     available=available, api="tex"))
            done.append(op)
    except Exception:
        for op in done:
            reg.unregister_impl(op, f"vendor.{name}", "tex")
        raise
    _VENDORS[name] = inst
    _env_checked.clear()
    cls._tex_instance = inst
    return cls


def unregister_backend(name: str) -> None:
    """Undo :func:`register_backend` (tests, plugin reloads)."""
    global _forced
    name = name.lower()
    inst = _VENDORS.pop(name, None)
    if inst is None:
        raise KeyError(f"no vendor tex backend {name!r}; registered: {sorted(_VENDORS)}")
    reg = _registry()
    for op in type(inst).implemented_ops():
        try:
            reg.unregister_impl(op, f"vendor.{name}", "tex")
        except KeyError:
            pass
    if _forced == name:
        _forced = None
    _env_checked.clear()


def _tex_impls():
    reg = _registry()
    out: dict = {}
    for impl in reg.all_impls():
        if impl.api == "tex":
            out.setdefault(impl.backend, []).append(impl)
    return out


def _backend_available(name: str) -> bool:
    mgr = manager()
    impls = _tex_impls().get(name, [])
    return any(not mgr._exclusion(i) for i in impls)


def _available_names() -> list:
    return sorted(n for n in _tex_impls() if _backend_available(n))


def _not_found(name) -> RuntimeError:
    return RuntimeError(f"Backend '{name}' not found. Available backends: {_available_names()}")


def _check_name(name) -> str:
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"backend name must be a non-empty str, got {name!r}")
    n = name.strip().lower()
    if n not in _tex_impls() or not _backend_available(n):
        raise _not_found(name.strip())
    return n


def set_backend(name: Optional[str]) -> None:
    """Force tex ops onto one backend (``None`` or ``"auto"``: back to the resolver's order).

    Raises RuntimeError ``Backend 'x' not found. Available backends: [...]`` for an unknown or
    unavailable name. Only tex ops are affected.
    """
    global _forced
    if name is None or (isinstance(name, str) and name.strip().lower() == "auto"):
        _forced = None
        return
    _forced = _check_name(name)


@contextlib.contextmanager
def use_backend(name: Optional[str]):
    """Context manager form of :func:`set_backend` (per thread/task; nests)."""
    tok = _ctx.set(None if name is None else _check_name(name))
    try:
        yield
    finally:
        _ctx.reset(tok)


def _env_name() -> Optional[str]:
    return _env.get("TE_BACKEND")      # then its alias TE_PLUGIN


def current_override() -> Optional[str]:
    """The order override for tex ops: use_backend() > set_backend() > TE_BACKEND > TE_PLUGIN."""
    v = _ctx.get()
    if v is not None:
        return v
    if _forced is not None:
        return _forced
    env = _env_name()
    if env is None:
        return None
    key = (env, _registry().version)
    got = _env_checked.get(key)
    if got is None:
        got = _env_checked[key] = _check_name(env)
    return got


def _current_name() -> Optional[str]:
    o = current_override()
    if o is not None:
        return o
    res = manager().resolve("rmsnorm_fwd", None, "tex")
    return res.candidates[0].backend if res.candidates else None


def get_backend() -> TEXBackendBase:
    """The selected backend object (the resolver's first choice for rmsnorm_fwd when none is forced)."""
    name = _current_name()
    if name in _VENDORS:
        return _VENDORS[name]
    return _BuiltinBackend(name)


def list_backends() -> list:
    """``[{'name', 'vendor', 'priority', 'available', 'current'}]``, highest priority first."""
    try:
        cur = _current_name()
    except RuntimeError:  # TE_BACKEND names nothing available: list anyway, nothing current
        cur = None
    out = []
    for name in _tex_impls():
        if name in _VENDORS:
            inst = _VENDORS[name]
            vendor, prio = inst.vendor, inst.priority
        else:
            vendor, prio = BUILTIN.get(name, (name, 0))
        out.append({"name": name, "vendor": vendor, "priority": prio, "available": _backend_available(name),
                    "current": name == cur})
    out.sort(key=lambda d: (-d["priority"], d["name"]))
    return out
