"""The backend contract: one declared shape for every backend, built-in or plugin.

A backend module defines its op functions under the op names (the facade contract:
``fn(*spec.kernel_params)``, see :mod:`tensor_ops._ops`) and one :class:`Backend` object,
``BACKEND``. Everything else is derived from the backend's ``name`` by one rule
(:meth:`Backend.names`): its module ``tensor_ops.backends.<name>``, its kernel sources
``<name>_ext/``, its config and order token ``<name>``, its environment prefix
``TENSOR_OPS_<NAME>_``, its pytest marker ``<name>`` and its info getter
``tensor_ops.get_<name>_info()``. :func:`register_backend` is the one registrar: the
built-in backends and every plugin that ships a ``BACKEND`` go through it (a plugin with
only TE-FL's ``register(registry)`` still works: it registers OpImpls itself).

What the contract declares (HF ``kernels``' backend protocol and ggml's interface struct
with optional slots are the models):

- ``ops``: op → callable, taken from the module by the name rule (``ops_from(module)``);
- ``array_kinds``: the array kinds it serves ('numpy', 'torch-cpu', 'torch-cuda', 'cupy',
  'pyopencl', or 'torch-<device type>' for a plugin serving torch tensors on another device,
  e.g. 'torch-mps'), shown by ``get_backend_info()``. A torch CPU call reaches the backends
  declaring 'torch-cpu' as zero-copy NumPy views; a torch tensor on another device reaches
  those declaring 'torch-<device>' as the tensor itself;
- ``device_only``: host (NumPy) arrays are served only when an order names the backend (a
  device backend would copy them to a device nobody asked for);
- ``probe``: decides availability once (import the toolkit, find the device, run a probe
  kernel and check its numbers); :class:`Availability` memoises it, thread-safe, never
  raising: one implementation for every backend;
- ``info``: what ``get_backend_info()`` shows for it;
- ``plain_entry``: optional native plain-call entries (the facade's fast path);
- ``faults``: the fault kinds :meth:`Backend.inject_fault` accepts (the one fault-injection
  hook: tests switch a failure on for a block, the backend's code reads ``BACKEND.fault``).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

from .._ops import SPECS
from .._registry import BackendImplKind, OpImpl

ARRAY_KINDS = ("numpy", "torch-cpu", "torch-cuda", "cupy", "pyopencl")


class Unavailable(Exception):
    """Raised by a backend's probe: the message is the reason shown to the user."""


class PlainEntry(NamedTuple):
    """A native plain-call entry of one op (see CONTRIBUTING.md "The fast path")."""

    fn: Callable[..., Any]      # the impl's fn it stands for (the entry is dropped if fn is replaced)
    entry: Callable[..., Any]   # takes the facade's plain arguments; returns the result or None
    calls: Callable[[], int]    # calls it served (added to get_backend_info()'s counts)
    #: whether ``entry`` also takes ``out=`` as one more positional argument (writes it and
    #: returns it, or None to decline); the facade then calls it for out= calls as well
    takes_out: bool = False
    #: the same plain call returning ``(y, *statistics)`` (the norms: rsigma, mu and rsigma,
    #: float32 of shape x.shape[:-1]) or None; an autograd forward calls it instead of the
    #: resolver and the kernel's ``rsigma=`` (tensor_ops/torch/_kernels.py), its backward
    #: reuses them
    stats: Optional[Callable[..., Any]] = None


class Availability:
    """``probe()`` run once, memoised: ``(True, summary)`` or ``(False, reason)``; never raises.

    ``on_ok`` callbacks run once, under the lock, when the probe succeeded (cpp binds its
    native functions into its OpImpls there)."""

    def __init__(self, probe: Callable[[], str]) -> None:
        self._probe = probe
        self._lock = threading.Lock()
        self._result: Optional[tuple[bool, str]] = None
        self.on_ok: list[Callable[[], None]] = []

    def __call__(self) -> tuple[bool, str]:
        r = self._result
        if r is not None:
            return r
        with self._lock:
            if self._result is None:
                try:
                    got = (True, str(self._probe() or ""))
                except Unavailable as exc:
                    got = (False, str(exc) or "unavailable")
                except Exception as exc:  # a probe must not take the process down
                    got = (False, f"probe raised {type(exc).__name__}: {exc}")
                if got[0]:
                    for cb in self.on_ok:
                        cb()
                self._result = got
            return self._result

    @property
    def decided(self) -> bool:
        return self._result is not None

    def reset(self) -> None:
        """Forget the decision (tests only: the next call probes again)."""
        with self._lock:
            self._result = None


@dataclass(eq=False)
class Backend:
    """One backend. See the module docstring for the meaning of each field."""

    name: str
    ops: Mapping[str, Callable[..., Any]]
    probe: Callable[[], str]
    kind: BackendImplKind = BackendImplKind.DEFAULT
    array_kinds: tuple = ("numpy",)
    dtypes: Optional[tuple] = None          # the dtypes it computes (None: ask supports())
    device_only: bool = False
    supports: Any = None                    # callable, or {op: callable}
    info: Optional[Callable[[], dict]] = None
    plain_entry: Optional[Callable[[str], Optional[PlainEntry]]] = None
    faults: tuple = ()
    priority: int = 0
    vendor: Optional[str] = None
    fault: Optional[str] = None             # the active injected fault (read by the backend's code)
    availability: Availability = field(init=False)
    impls: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name.lower()
        self.kind = BackendImplKind(self.kind)
        bad = [k for k in self.array_kinds if k not in ARRAY_KINDS and not k.startswith("torch-")]
        if bad:
            raise ValueError(f"Backend {self.name!r}: unknown array kinds {bad}; accepted: {list(ARRAY_KINDS)} "
                             f"or 'torch-<device type>' (e.g. 'torch-mps')")
        self.availability = Availability(self.probe)

    # -- the name rule --------------------------------------------------------------------
    @property
    def impl_id(self) -> str:
        return f"{self.kind.value}.{self.name}"

    def names(self) -> dict:
        """Everything derived from the name (one rule for every backend)."""
        n = self.name
        return {"module": f"tensor_ops.backends.{n}", "sources": f"{n}_ext/", "config_key": n,
                "token": n, "env_prefix": f"TENSOR_OPS_{n.upper()}_", "marker": n,
                "info_getter": f"get_{n}_info", "impl_id": self.impl_id}

    def register(self, registry) -> list:
        """Register this backend's ops into ``registry`` (:func:`register_backend`)."""
        return register_backend(registry, self)

    # -- introspection --------------------------------------------------------------------
    def describe(self) -> dict:
        """What ``get_<name>_info()`` returns: availability, reason, array kinds, ops, info."""
        ok, why = self.availability()
        out = {"available": ok, "reason": None if ok else why, "summary": why if ok else None,
               "array_kinds": list(self.array_kinds), "dtypes": list(self.dtypes) if self.dtypes else None,
               "device_only": self.device_only,
               "ops": sorted(self.ops), **self.names()}
        if ok and self.info is not None:
            try:
                out.update(self.info())
            except Exception as exc:  # info must never break introspection
                out["info_error"] = f"{type(exc).__name__}: {exc}"
        return out

    # -- the one fault-injection hook ----------------------------------------------------
    @contextlib.contextmanager
    def inject_fault(self, kind: Optional[str]) -> Iterator[None]:
        """Make the backend fail in the way ``kind`` names inside the block (tests)."""
        if kind is not None and kind not in self.faults:
            raise ValueError(f"backend {self.name!r} injects faults {sorted(self.faults)}, got {kind!r}")
        old, self.fault = self.fault, kind
        try:
            yield
        finally:
            self.fault = old


def ops_from(namespace: Mapping[str, Any], only: Optional[tuple] = None) -> dict:
    """op → callable for every facade op ``namespace`` defines under its name (the name rule)."""
    names = only if only is not None else tuple(SPECS)
    return {op: namespace[op] for op in names if callable(namespace.get(op))}


def register_backend(registry, backend: Backend) -> list[OpImpl]:
    """Register one OpImpl per op of ``backend`` (built-ins and plugins alike)."""
    sup = backend.supports
    made = []
    for op, fn in backend.ops.items():
        impl = OpImpl(op_name=op, impl_id=backend.impl_id, kind=backend.kind, fn=fn, backend=backend.name,
                      vendor=backend.vendor, priority=backend.priority,
                      supports=sup.get(op) if isinstance(sup, Mapping) else sup,
                      available=backend.availability, api="facade",
                      host_arrays="when-named" if backend.device_only else "always", owner=backend)
        registry.register_impl(impl)
        made.append(impl)
    backend.impls.extend(made)
    av = backend.availability
    if av.decided and av()[0]:        # already probed: what on_ok does for the first impls
        for cb in av.on_ok:
            cb()
    return made
