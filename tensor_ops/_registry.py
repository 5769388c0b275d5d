"""OpImpl, BackendImplKind and the thread-safe OpRegistry (TE-FL's plugin core names).

An ``OpImpl`` is one implementation of one op. Built-in backends register exactly like
plugins do. Registration is validated when it happens (op known, callable, kind, id), and
a duplicate ``(op, impl_id)`` names both registration sites, so mistakes surface at import
rather than at call time.

Facade ops and TransformerEngine (tex) ops share one registry. Five names exist in both
APIs with different signatures (``gelu``, ``relu``, ``silu``, ``swiglu``, ``geglu``), so every
impl also carries an ``api`` ("facade" or "tex"); an op is identified by ``(op_name, api)``.
The default ``api`` follows the name: TE names mean tex (what TE-FL plugins expect), the
other facade names mean the facade.
"""
from __future__ import annotations

import enum
import inspect
import os
import sys
import threading
import weakref
from types import FrameType
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ._ops import FACADE_OPS, KNOWN_OPS, SPECS, TEX_OPS

_FACADE = frozenset(FACADE_OPS)
_TEX = frozenset(TEX_OPS)


class BackendImplKind(str, enum.Enum):
    """What kind of implementation an OpImpl is; the value is its order token."""

    DEFAULT = "default"      # built-in accelerated: cuda, opencl, cpp
    VENDOR = "vendor"        # third-party plugin
    REFERENCE = "reference"  # numpy / torch, always the last fallback

    FLAGOS = "default"       # TE-FL's name for DEFAULT (an alias member)

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            v = value.strip().lower()
            if v == "flagos":
                return cls.DEFAULT
            for m in cls:
                if m.value == v:
                    return m
        return None

    def __str__(self) -> str:
        return self.value


def default_api(op_name: str) -> str:
    """The API an op name belongs to when a registration does not say."""
    if op_name in _TEX:
        return "tex"
    if op_name in _FACADE:
        return "facade"
    return "custom"


def _caller_site(depth: int = 2) -> str:
    """'file:line' of the code that called into the registry (for duplicate errors)."""
    frame: Optional[FrameType]
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return "<unknown>"
    here = os.path.dirname(os.path.abspath(__file__))
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


@dataclass(eq=False)
class OpImpl:
    """One implementation of one op.

    Args:
        op_name: the op, e.g. ``"rms_norm"`` or TE's ``"rmsnorm_fwd"``.
        impl_id: ``"<kind>.<name>"``, e.g. ``"default.cpp"``, ``"vendor.acme"``.
        kind: a :class:`BackendImplKind` (or its token string).
        fn: the callable; receives the op's arguments exactly as the caller passed them.
        vendor: vendor name for VENDOR impls (matched case-insensitively).
        backend: backend name used by order tokens; defaults to the vendor, else the part of
            ``impl_id`` after the first dot.
        priority: higher runs first among impls matched by the same order token.
        supports: optional cheap per-call check ``supports(*args, **kw) -> bool``.
        available: optional ``() -> bool | (bool, reason)``, evaluated once.
        api: ``"facade"``, ``"tex"`` or ``"custom"``; defaults from the op name.
        host_arrays: ``"always"`` (default) or ``"when-named"``: a device backend (CUDA,
            OpenCL) that must copy host (NumPy) arrays takes them only when an order names
            it explicitly (backend name or ``impl:`` token: keyword, env, per_op, priority,
            tuning); under the built-in default it serves device arrays only.
        owner: the :class:`tensor_ops.backends._contract.Backend` that registered it, if any.
        plain_entry: a native plain-call entry (``PlainEntry``) the manager may give the
            facade for plain calls (set by the backend once its native code is loaded).
        declines_host: set on the resolver's views of a ``"when-named"`` impl that the order
            did not name (they decline host arrays).

    Example:
        >>> impl = OpImpl(op_name="rms_norm", impl_id="vendor.demo", kind="vendor",
        ...               vendor="demo", fn=lambda x, w, eps, out: x)
        >>> impl.backend
        'demo'
    """

    op_name: str
    impl_id: str
    kind: BackendImplKind
    fn: Callable[..., Any]
    vendor: Optional[str] = None
    backend: Optional[str] = None
    priority: int = 0
    supports: Optional[Callable[..., bool]] = None
    available: Optional[Callable[[], Any]] = None
    api: Optional[str] = None
    host_arrays: str = "always"
    source: str = field(default="")
    owner: Any = field(default=None, repr=False)
    plain_entry: Any = field(default=None, repr=False)
    declines_host: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.op_name, str) or not self.op_name:
            raise TypeError(f"OpImpl.op_name must be a non-empty str, got {self.op_name!r}")
        if not isinstance(self.impl_id, str) or not self.impl_id.strip():
            raise TypeError(f"OpImpl.impl_id must be a non-empty str like 'vendor.acme', got {self.impl_id!r}")
        try:
            self.kind = BackendImplKind(self.kind)
        except ValueError:
            raise ValueError(
                f"OpImpl.kind must be one of ['default', 'flagos', 'reference', 'vendor'], got {self.kind!r}"
            ) from None
        if not callable(self.fn):
            raise TypeError(f"OpImpl.fn for {self.op_name!r}/{self.impl_id!r} must be callable, got {self.fn!r}")
        if self.supports is not None and not callable(self.supports):
            raise TypeError(f"OpImpl.supports must be callable or None, got {self.supports!r}")
        if self.available is not None and not callable(self.available):
            raise TypeError(f"OpImpl.available must be callable or None, got {self.available!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise TypeError(f"OpImpl.priority must be an int, got {self.priority!r}")
        if self.kind is BackendImplKind.VENDOR and not self.vendor:
            # TE-FL ids are "vendor.<name>": take the vendor from there.
            self.vendor = self.impl_id.split(".", 1)[-1]
        if self.vendor is not None:
            self.vendor = str(self.vendor)
        if self.backend is None:
            self.backend = (self.vendor or self.impl_id.split(".", 1)[-1]).lower()
        else:
            self.backend = str(self.backend).lower()
        if self.host_arrays not in ("always", "when-named"):
            raise ValueError(f"OpImpl.host_arrays must be 'always' or 'when-named', got {self.host_arrays!r}")
        if self.api is None:
            self.api = default_api(self.op_name)
        elif self.api not in ("facade", "tex", "custom"):
            raise ValueError(f"OpImpl.api must be 'facade', 'tex' or 'custom', got {self.api!r}")

    def __repr__(self) -> str:
        return (f"OpImpl(op_name={self.op_name!r}, impl_id={self.impl_id!r}, kind={self.kind.value!r}, "
                f"backend={self.backend!r}, priority={self.priority})")


def check_signature(op: str, fn: Callable[..., Any], impl_id: str) -> None:
    """Refuse ``fn`` when it cannot take facade op ``op``'s kernel arguments (the backend
    contract: validated arguments, ``out`` last). pluggy's ``_verify_hook`` is the model: the
    error names the impl, the op, the expected call and the signature given.

    Callables whose signature Python cannot read (C functions without a text signature) are
    accepted: their own argument checks speak at the first call."""
    spec = SPECS.get(op)
    if spec is None:
        return
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*spec.kernel_params)
    except TypeError as exc:
        want = ", ".join(spec.kernel_params)
        raise TypeError(f"impl {impl_id!r} for op {op!r}: fn{sig} cannot be called as fn({want}) "
                        f"(the backend contract of {op!r}: validated arguments, out last): {exc}") from None


class OpRegistry:
    """Thread-safe store ``{(op, api): {impl_id: OpImpl}}``.

    Args:
        strict_names: refuse op names that are neither facade nor tex ops (the global
            registry does; a private registry built by a user accepts any name).
    """

    def __init__(self, strict_names: bool = False) -> None:
        self._lock = threading.RLock()
        self._impls: dict[tuple[str, str], dict[str, OpImpl]] = {}
        self._strict_names = strict_names
        self._listeners: "weakref.WeakSet" = weakref.WeakSet()
        self.version = 0

    # -- mutation ---------------------------------------------------------------------
    def register_impl(self, impl: OpImpl) -> OpImpl:
        """Add ``impl``; a duplicate ``(op, impl_id)`` raises ValueError naming both sites."""
        if not isinstance(impl, OpImpl):
            raise TypeError(f"register_impl expects an OpImpl, got {type(impl).__name__}")
        if impl.api == "facade":
            check_signature(impl.op_name, impl.fn, impl.impl_id)
        if self._strict_names and impl.op_name not in KNOWN_OPS:
            raise ValueError(
                f"unknown op {impl.op_name!r} in registration of {impl.impl_id!r}; "
                f"known ops: {sorted(KNOWN_OPS)}"
            )
        if not impl.source:
            impl.source = _caller_site()
        key = (impl.op_name, str(impl.api))      # api is set by __post_init__
        with self._lock:
            slot = self._impls.setdefault(key, {})
            old = slot.get(impl.impl_id)
            if old is not None:
                raise ValueError(
                    f"duplicate registration of op {impl.op_name!r} impl {impl.impl_id!r}: "
                    f"first registered at {old.source}, again at {impl.source}"
                )
            slot[impl.impl_id] = impl
            self._changed()
        return impl

    register = register_impl   # short alias; TE-FL code calls register_impl

    def unregister_impl(self, op_name: str, impl_id: str, api: Optional[str] = None) -> OpImpl:
        """Remove a registration (tests and plugins undo themselves with this)."""
        key = (op_name, api or default_api(op_name))
        with self._lock:
            try:
                impl = self._impls[key].pop(impl_id)
            except KeyError:
                raise KeyError(f"no impl {impl_id!r} registered for op {op_name!r}") from None
            if not self._impls[key]:
                del self._impls[key]
            self._changed()
        return impl

    def _changed(self) -> None:
        self.version += 1
        for listener in list(self._listeners):
            listener._registry_changed()

    def _add_listener(self, listener) -> None:
        self._listeners.add(listener)

    # -- queries ----------------------------------------------------------------------
    def get_impls(self, op_name: str, api: Optional[str] = None) -> list[OpImpl]:
        """All impls of an op, highest priority first."""
        with self._lock:
            impls = list(self._impls.get((op_name, api or default_api(op_name)), {}).values())
        impls.sort(key=lambda i: (-i.priority, i.impl_id))
        return impls

    def get_impl(self, op_name: str, impl_id: str, api: Optional[str] = None) -> OpImpl:
        with self._lock:
            try:
                return self._impls[(op_name, api or default_api(op_name))][impl_id]
            except KeyError:
                raise KeyError(f"no impl {impl_id!r} registered for op {op_name!r}") from None

    def ops(self) -> list[tuple[str, str]]:
        """Registered ``(op, api)`` pairs."""
        with self._lock:
            return sorted(self._impls)

    def impl_ids(self) -> list[str]:
        with self._lock:
            return sorted({iid for slot in self._impls.values() for iid in slot})

    def backends(self) -> list[str]:
        """Backend/vendor names present in the registry."""
        with self._lock:
            return sorted({str(i.backend) for slot in self._impls.values() for i in slot.values()})

    def all_impls(self) -> list[OpImpl]:
        with self._lock:
            return [i for slot in self._impls.values() for i in slot.values()]
