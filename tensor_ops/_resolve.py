"""Resolution: what the policy's order tokens mean for one op (pure functions of the impls).

:class:`OpManager` caches one :class:`Resolution` per (op, api, override, tuning bucket);
this module holds the pieces that do not need the manager's state: the cached record, token
matching, the default rank of impls nobody named, and the view of a device backend's impl
that declines host arrays.
"""
from __future__ import annotations

from typing import Optional

from ._ops import BUILTIN_BACKENDS, FACADE_OPS, TEX_OPS
from ._registry import BackendImplKind, OpImpl

_REF = BackendImplKind.REFERENCE
_VENDOR = BackendImplKind.VENDOR
KIND_TOKENS = ("default", "vendor", "reference")


class Resolution:
    """The cached outcome of resolving one op under one policy."""

    __slots__ = ("op", "api", "tokens", "source", "forced", "strict", "candidates", "excluded",
                 "by_impl", "fallbacks", "logged", "note", "seq", "guard", "guard_ok", "named")

    def __init__(self, op: str, api: str, tokens: list, source: str, forced: bool, strict: bool,
                 candidates: tuple, excluded: dict, note: str = "") -> None:
        # guard > 0: the first ``guard`` candidates are the ones the user forced (or put first
        # in a call's order); moving past them because all declined the call is an error
        # (guard_ok False) or a counted, warned substitution (guard_ok True, a fallback was
        # asked for). ``named`` is the backend token they answer to.
        self.guard, self.guard_ok, self.named = 0, False, ""
        self.seq: tuple = (False, 0)        # (policy's own, creation order): info shows the newest
        self.op, self.api, self.tokens, self.source = op, api, tokens, source
        self.forced, self.strict = forced, strict
        self.candidates: tuple = candidates
        self.excluded: dict = excluded           # impl_id -> reason
        self.by_impl: dict = {}
        self.fallbacks = 0
        self.logged: Optional[OpImpl] = None
        self.note = note


def host_declined(impl: OpImpl) -> OpImpl:
    """A view of ``impl`` that declines host (NumPy) arrays: used when the order did not name
    a device backend, so host data is not copied to a device nobody asked for."""
    import dataclasses
    import numpy as np
    inner = impl.supports

    def supports(*args, **kw):
        if args and type(args[0]) is np.ndarray:
            return False
        return inner(*args, **kw) if inner is not None else True

    return dataclasses.replace(impl, supports=supports, source=impl.source, declines_host=True)


def wrong_result(out, expect) -> bool:
    """True when a facade impl returned something other than an array of the expected 2-D
    shape and dtype (a lying backend must not hand garbage to the caller). ``expect[2]``,
    when there: the number of such arrays in the tuple the impl must return."""
    if len(expect) > 2:
        return type(out) is not tuple or len(out) != expect[2] or any(wrong_result(o, expect[:2]) for o in out)
    try:
        dt = out.dtype
        return out.shape != expect[0] or (dt is not expect[1] and dt != expect[1])
    except AttributeError:
        return True


def match(impl: OpImpl, tok: str) -> bool:
    if tok in KIND_TOKENS:
        return impl.kind.value == tok
    if tok.startswith("vendor:"):
        return impl.kind is _VENDOR and (impl.vendor or "").lower() == tok[7:]
    if tok.startswith("impl:"):
        return impl.impl_id == tok[5:]
    return impl.backend == tok


def default_rank(impl: OpImpl) -> tuple:
    """Order of impls no token named: built-in accelerated, other defaults, vendors, references."""
    if impl.kind is _REF:
        return (3, 0, -impl.priority, impl.impl_id)
    if impl.kind is _VENDOR:
        return (2, 0, -impl.priority, impl.impl_id)
    b = BUILTIN_BACKENDS.index(impl.backend) if impl.backend in BUILTIN_BACKENDS else len(BUILTIN_BACKENDS)
    return (1, b, -impl.priority, impl.impl_id)


def is_shared(op: str) -> bool:
    return op in FACADE_OPS and op in TEX_OPS
