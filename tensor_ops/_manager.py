"""OpManager: ordered candidates per (op, policy), cached; per-call work is only ``supports``.

Resolution (order tokens → candidate impls filtered by availability, disabled backends and
vendor allow/deny lists) happens once per cache key: ``(op, api, runtime override, tuning
bucket)``. A call walks the cached candidates: the first whose ``supports(*args)`` accepts
runs; a backend failure (any exception except ValueError/TypeError, which are user errors)
moves to the next candidate with one warning per (op, impl), unless strict.
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Optional

import numpy as np

from . import _state
from ._config import check_token
from ._errors import BackendError, BackendFallbackWarning, BackendUnavailableError, BackendUnsupportedError
from ._ops import BUILTIN_BACKENDS
from ._registry import BackendImplKind, OpImpl, OpRegistry, default_api
from ._resolve import Resolution, default_rank, host_declined, is_shared, match, wrong_result

log = logging.getLogger("tensor_ops")

_REF = BackendImplKind.REFERENCE
_ND = np.ndarray
_VENDOR = BackendImplKind.VENDOR


class OpManager:
    """Resolve and call ops of an :class:`OpRegistry`.

    Args:
        registry: the impls to choose from.
        settings: a :class:`tensor_ops._policy.Settings`; ``None`` means built-in defaults
            with no configuration file or environment (what the TE-FL seed example expects
            of a private registry).

    Example:
        >>> from tensor_ops.plugin import OpRegistry, OpManager, OpImpl, BackendImplKind
        >>> reg = OpRegistry()
        >>> _ = reg.register_impl(OpImpl(op_name="double", impl_id="vendor.demo",
        ...                              kind=BackendImplKind.VENDOR, fn=lambda v: 2 * v))
        >>> OpManager(reg).call("double", 21)
        42
    """

    def __init__(self, registry: OpRegistry, settings=None) -> None:
        self.registry = registry
        self.settings = settings
        self._lock = threading.RLock()
        self._cache: dict = {}
        self._avail: dict = {}               # impl -> (ok, reason)
        self._warned: set = set()
        # op -> a native entry that does the whole plain call (see _install_fast_fn); the
        # global manager shares _state.fast_fns with the facade. Cleared in place, never rebound.
        self.fast_fns: dict = {}
        self.fast_out_fns: dict = {}         # the entries of fast_fns that also take out= (_state's too)
        self.fast_stats_fns: dict = {}       # op -> its PlainEntry.stats, beside fast_fns (_state's too)
        self._retired: dict = {}             # (op, api) -> [calls by impl, fallbacks] of dropped caches
        self._seq = 0
        self._override_tokens: dict = {}
        self._failures: dict = {}            # (op, api, impl_id) -> [count, last error]
        self._substituted: dict = {}         # (op, api, forced backend, what) -> count
        registry._add_listener(self)
        log.info("Registered impl_ids: %s", registry.impl_ids())

    # -- invalidation -------------------------------------------------------------------
    def _registry_changed(self) -> None:
        self.invalidate()

    def invalidate(self, settings: Any = None) -> None:
        """Drop cached resolutions (policy or registry changed); counters are kept in info."""
        with self._lock:
            if settings is not None:
                self.settings = settings
            for res in self._cache.values():     # keep the counts of retired resolutions
                acc = self._retired.setdefault((res.op, res.api), [{}, 0])
                for k, v in res.by_impl.items():
                    acc[0][k] = acc[0].get(k, 0) + v
                acc[1] += res.fallbacks
            self._cache = {}
            self.clear_fast()
            self._override_tokens = {}

    def clear_fast(self) -> None:
        """Drop every native entry (plain and out=); in place: the facade reads these dicts."""
        self.fast_fns.clear()
        self.fast_out_fns.clear()
        self.fast_stats_fns.clear()

    # -- availability -------------------------------------------------------------------
    def availability(self, impl: OpImpl) -> tuple[bool, str]:
        key = impl            # the object itself: an id() could be reused after unregistration
        got = self._avail.get(key)
        if got is None:
            if impl.available is None:
                got = (True, "")
            else:
                try:
                    r = impl.available()
                    got = (bool(r[0]), str(r[1] or "")) if isinstance(r, tuple) else (bool(r), "")
                except Exception as exc:  # an availability check must not take the process down
                    got = (False, f"availability check raised {type(exc).__name__}: {exc}")
                if not got[0] and not got[1]:
                    got = (False, "reported unavailable")
            self._avail[key] = got
        return got

    # -- resolution ---------------------------------------------------------------------
    def _names(self):
        s = self.settings
        return sorted(set(s.names if s else ()) | set(self.registry.backends()) | set(BUILTIN_BACKENDS))

    def _tokens_for_override(self, override: str) -> list:
        toks = self._override_tokens.get(override)
        if toks is None:
            names = self._names()
            if not isinstance(override, str):
                raise TypeError(f"backend must be a str such as 'cpp' or 'cpp,numpy', got {override!r}")
            parts = [p for p in override.replace("|", ",").split(",") if p.strip()]
            if not parts:
                raise ValueError(f"backend must name at least one backend, got {override!r}; accepted: {names}")
            try:
                toks = [check_token(p, "backend", names) for p in parts]
            except ValueError as exc:
                raise ValueError(str(exc)) from None
            self._override_tokens[override] = toks
        return toks

    def resolve(self, op: str, override: Optional[str] = None, api: Optional[str] = None,
                dtype_name: Optional[str] = None, nbytes: int = 0, kind: str = "numpy") -> Resolution:
        """The ordered candidates for ``op`` (cached). ``kind`` other than 'numpy' (e.g.
        'torch-cpu': NumPy views of torch CPU tensors) keeps the backends that declare it."""
        api = api or default_api(op)
        s = self.settings
        bucket = s.bucket(op, dtype_name, nbytes) if s is not None and s.tuning_ops else -1
        key = (op, api, override, bucket, dtype_name if bucket >= 0 else None, kind)
        res = self._cache.get(key)
        if res is None:
            with self._lock:
                res = self._cache.get(key)
                if res is None:
                    res = self._resolve(op, api, override, dtype_name, nbytes, kind)
                    self._seq += 1
                    res.seq = (override is None, self._seq)
                    self._cache[key] = res
                    if override is None and api == "facade" and op not in self.fast_fns:
                        self._install_fast_fn(op)
        return res

    #: the dtypes a native plain-call entry computes (it declines every other one)
    _FAST_DTYPES = ("float32", "float16")

    def _install_fast_fn(self, op: str) -> None:
        """Let the facade call a native entry directly when the policy always picks its impl.

        A backend may set ``impl.plain_entry = PlainEntry(fn, entry, count)``: ``entry`` takes
        the facade's plain arguments, validates them itself and returns the result, or None to
        decline (the facade then takes its general path); ``calls()`` is how many calls it served.
        The entry is installed for ``op`` when, for host arrays of every dtype it computes
        and every size (each tuning bucket, when a tuning table decides the op), the first
        candidate is that same impl, and only while ``impl.fn`` is still ``fn`` (a replaced
        fn, e.g. a fault hook, goes through run() as usual); never under set_backend().
        Called under the lock, on the first resolution of ``op`` after an invalidation.
        """
        s = self.settings
        if _state.global_backend is not None:
            return
        first = None
        for dt in self._FAST_DTYPES:
            sizes = [0]
            if s is not None and s.tuning_applies(op) and dt in s.tuning_ops[op]:
                thresholds = s.tuning_ops[op][dt][0]
                sizes = list(thresholds) + [thresholds[-1] + 1 if thresholds else 0]
            for nbytes in sizes:
                try:
                    cands = self._resolve(op, "facade", None, dt, nbytes).candidates
                except Exception:      # e.g. a forced backend that is unavailable: no fast path
                    return
                host = next((i for i in cands if not i.declines_host), None)
                if host is None or (first is not None and host is not first):
                    return
                first = host
        if first is None:
            return
        fp = first.plain_entry
        if fp is not None and first.fn is fp.fn:
            self.fast_fns[op] = fp.entry
            if getattr(fp, "takes_out", False):
                self.fast_out_fns[op] = fp.entry
            if getattr(fp, "stats", None) is not None:
                self.fast_stats_fns[op] = fp.stats

    def _resolve(self, op, api, override, dtype_name, nbytes, kind: str = "numpy") -> Resolution:
        s = self.settings
        impls = self.registry.get_impls(op, api)
        if kind != "numpy":     # backends on the contract say which kinds they serve; bare OpImpls serve all
            impls = [i for i in impls if i.owner is None or kind in getattr(i.owner, "array_kinds", (kind,))]
        if override is not None:
            tokens = self._tokens_for_override(override)
            forced = len(tokens) == 1 and tokens[0] not in ("default", "vendor", "reference")
            source = "call/use_backend/set_backend override"
        elif s is not None:
            tokens, source, forced = s.order_for(op, dtype_name, nbytes)
        else:
            tokens, source, forced = ["default", "vendor", "reference"], "built-in default", False
        strict = bool(s.strict) if s is not None else False
        if source == "built-in default":
            # The default order names numpy last for readability; references are appended
            # after every vendor impl anyway, which is what "reference always last" means.
            tokens = [t for t in tokens if t not in ("numpy", "torch")]

        excluded: dict = {}
        usable: list = []
        for impl in impls:
            reason = self._exclusion(impl)
            if reason:
                excluded[impl.impl_id] = reason
            else:
                usable.append(impl)

        ordered: list = []
        for tok in tokens:
            for impl in sorted((i for i in usable if match(i, tok)), key=lambda i: (-i.priority, i.impl_id)):
                if impl not in ordered:
                    ordered.append(impl)
        note = ""
        guard, guard_ok = 0, False
        fallback_set = bool(s is not None and s.fallback)
        if forced:
            tok = tokens[0]
            named = [i for i in impls if match(i, tok)]
            if named and not ordered:
                reasons = "; ".join(f"{i.impl_id}: {excluded.get(i.impl_id)}" for i in named)
                raise BackendUnavailableError(
                    f"backend {tok!r} was forced for op {op!r} ({source}) but is not available: {reasons}")
            if not named:
                if not any(match(i, tok) for i in self.registry.all_impls()) and tok not in self._names():
                    raise BackendUnavailableError(
                        f"backend {tok!r} was forced ({source}) but nothing by that name is registered")
                if api == "facade" and not fallback_set:
                    raise self._unsupported(op, tok, source, f"op {op!r}", [])
                note = f"{tok!r} has no {op!r}; served by the fallback"
            elif api == "facade":
                # A forced backend is never silently replaced (tex keeps TE-FL's documented
                # fallback to reference.torch): past its impls is an error or, with a
                # fallback asked for, a warned and counted substitution.
                guard, guard_ok = len(ordered), fallback_set
            fb = ((s.fallback or []) if s is not None else []) + ["reference"]
            for ftok in fb:
                for impl in sorted((i for i in usable if match(i, ftok)), key=lambda i: (-i.priority, i.impl_id)):
                    if impl not in ordered:
                        ordered.append(impl)
        else:
            if override is not None and api == "facade" and ordered:
                # a call's own order ("cpp,numpy"): the next entry may serve, with a warning
                guard, guard_ok = sum(1 for i in ordered if match(i, tokens[0])), True
            rest = sorted((i for i in usable if i not in ordered), key=default_rank)
            ordered += [i for i in rest if i.kind is not _REF] + [i for i in rest if i.kind is _REF]
        by_name: set = set() if source == "built-in default" else \
            {t for t in tokens if t not in ("default", "vendor", "reference") and not t.startswith("vendor:")}
        ordered = [i if i.host_arrays == "always" or i.backend in by_name or f"impl:{i.impl_id}" in by_name
                   else host_declined(i) for i in ordered]
        res = Resolution(op, api, tokens, source, forced, strict, tuple(ordered), excluded, note)
        res.guard, res.guard_ok, res.named = guard, guard_ok, tokens[0] if tokens else ""
        if note and api == "facade":      # the forced backend lacks the op; a fallback was asked for
            res.guard, res.guard_ok = -1, True
        return res

    def _unsupported(self, op: str, tok: str, source: str, what: str, impls: list) -> "BackendUnsupportedError":
        """The error for a forced backend that cannot serve a call: names the backend, the op,
        what the call needed, what the backend serves, and how to allow another backend."""
        owner = next((i.owner for i in impls if i.owner is not None), None)
        if owner is None:
            owner = next((i.owner for i in self.registry.all_impls() if match(i, tok) and i.owner is not None), None)
        serves = []
        if owner is not None:
            dts = getattr(owner, "dtypes", None)
            serves.append(f"dtypes {list(dts)}" if dts else "")
            serves.append(f"array kinds {list(owner.array_kinds)}")
        ops = sorted({i.op_name for i in self.registry.all_impls() if match(i, tok) and i.api == "facade"})
        serves.append(f"ops {ops}")
        return BackendUnsupportedError(
            f"op {op!r}: backend {tok!r} was forced ({source}) but does not support {what}; it serves "
            f"{', '.join(x for x in serves if x)}. To let another backend serve such calls, pass an order "
            f"(backend='{tok},numpy') or set a fallback (TENSOR_OPS_FALLBACK_BACKEND=numpy or backend.json "
            f"'fallback')")

    def _past_guard(self, res: Resolution, args: tuple) -> None:
        """Every forced candidate declined the call: raise, or warn once per (op, backend,
        reason) and count the substitution (get_backend_info()['ops'][op]['substituted'])."""
        x = args[0] if args else None
        what = (f"{getattr(getattr(x, 'dtype', None), 'name', getattr(x, 'dtype', '?'))} "
                f"{type(x).__module__.split('.')[0]}.{type(x).__name__} input") if x is not None else "this call"
        if res.guard < 0:
            what = f"op {res.op!r}"
        if not res.guard_ok:
            raise self._unsupported(res.op, res.named, res.source, what, list(res.candidates[:max(res.guard, 0)]))
        key = (res.op, res.api, res.named, what)
        with self._lock:
            first = key not in self._substituted
            self._substituted[key] = self._substituted.get(key, 0) + 1
        if first:
            via = (f"the fallback {self.settings.fallback if self.settings else None}" if res.forced
                   else f"the order {','.join(res.tokens)}")
            msg = (f"tensor_ops: op {res.op!r}: {res.named!r} does not support {what}; served by {via} "
                   f"({res.source})")
            log.warning(msg)
            warnings.warn(msg, BackendFallbackWarning, stacklevel=4)

    def _exclusion(self, impl: OpImpl) -> str:
        s = self.settings
        if s is not None:
            why = s.tuning_excluded.get(impl.op_name, {}).get(impl.impl_id) if impl.api == "facade" else None
            if why:
                return f"excluded by detect_and_benchmark validation: {why}"
            for name in (impl.backend, (impl.vendor or "").lower()):
                if name and name in s.disabled:
                    return f"disabled by {s.disabled[name]}"
            if impl.kind is _VENDOR:
                v = str(impl.vendor or impl.backend).lower()
                if s.allow_vendors is not None and v not in s.allow_vendors:
                    return f"vendor {v!r} not in allow_vendors {s.allow_vendors} ({s.allow_source})"
                if v in s.deny_vendors:
                    return f"vendor {v!r} denied ({s.deny_source})"
        ok, reason = self.availability(impl)
        return "" if ok else f"unavailable: {reason}"

    # -- calling ------------------------------------------------------------------------
    def call(self, op: str, *args, **kwargs):
        """Call ``op`` with the best available impl (TE-FL's form)."""
        return self.dispatch(op, args, kwargs)

    def dispatch(self, op: str, args: tuple, kwargs: Optional[dict] = None, backend: Optional[str] = None,
                 api: Optional[str] = None, dtype_name: Optional[str] = None, nbytes: int = 0,
                 expect: Optional[tuple] = None, kind: str = "numpy"):
        """Resolve and run ``op``. ``backend`` overrides the order (a token or comma list);
        ``expect=(shape, dtype)`` treats a wrongly shaped result as a backend failure."""
        if backend is None:
            backend = _state.context_backend.get()
            if backend is None:
                backend = _state.global_backend
        return self.run(self.resolve(op, backend, api, dtype_name, nbytes, kind), args, kwargs, expect)

    def run(self, res: Resolution, args: tuple, kwargs: Optional[dict] = None, expect: Optional[tuple] = None):
        """Walk the candidates of a resolution: the per-call part of dispatch."""
        last_exc = None
        guard = res.guard
        if guard < 0:
            self._past_guard(res, args)
        for idx, impl in enumerate(res.candidates):
            if idx == guard and idx and last_exc is None:    # guard 0: none
                self._past_guard(res, args)
            sup = impl.supports
            try:
                if kwargs:
                    if sup is not None and not sup(*args, **kwargs):
                        continue
                    out = impl.fn(*args, **kwargs)
                else:
                    if sup is not None and not sup(*args):
                        continue
                    out = impl.fn(*args)
                if expect is not None and (
                        (out.shape != expect[0] or (out.dtype is not expect[1] and out.dtype != expect[1]))
                        if type(out) is _ND else wrong_result(out, expect)):
                    raise BackendError(
                        f"{impl.impl_id} returned {type(out).__name__} of shape {getattr(out, 'shape', None)} "
                        f"dtype {getattr(out, 'dtype', None)}; expected shape {expect[0]} dtype {expect[1]}")
            except Exception as exc:  # a backend failure: fall back (or raise when strict)
                if isinstance(exc, (ValueError, TypeError)) and res.api != "facade":
                    # tex ops may still meet a user error inside an impl; a facade call was
                    # fully validated by its spec before dispatch, so there a TypeError or
                    # ValueError is the impl's failure (e.g. a plugin fn with the wrong arity)
                    raise
                last_exc = exc
                if res.strict:
                    self._count_failure(res, impl, exc, warn=False)
                    raise BackendError(f"op {res.op!r}: {impl.impl_id} failed and strict mode forbids fallback: "
                                       f"{type(exc).__name__}: {exc}") from exc
                self._count_failure(res, impl, exc, warn=True)
                continue
            by = res.by_impl
            by[impl.impl_id] = by.get(impl.impl_id, 0) + 1
            if res.logged is not impl:
                self._log_choice(res, impl)
            return out
        raise self._no_candidate(res, args, kwargs, last_exc)

    def _count_failure(self, res: Resolution, impl: OpImpl, exc: BaseException, warn: bool) -> None:
        with self._lock:
            res.fallbacks += 1
            key = (res.op, res.api, impl.impl_id)
            first = key not in self._warned
            self._warned.add(key)
            self._failures.setdefault(key, [0, ""])
            self._failures[key][0] += 1
            self._failures[key][1] = f"{type(exc).__name__}: {exc}"
        if warn and first:
            msg = (f"tensor_ops: op {res.op!r} impl {impl.impl_id!r} failed ({type(exc).__name__}: {exc}); "
                   f"falling back to the next candidate (set TENSOR_OPS_STRICT=1 to raise instead)")
            log.warning(msg)
            warnings.warn(msg, BackendFallbackWarning, stacklevel=4)

    def _log_choice(self, res: Resolution, impl: OpImpl) -> None:
        res.logged = impl
        extra = f"vendor={impl.vendor}" if impl.kind is _VENDOR else f"backend={impl.backend}"
        log.info("Op '%s' using '%s' (kind=%s, %s)", res.op, impl.impl_id, impl.kind.value, extra)

    def _no_candidate(self, res: Resolution, args, kwargs, last_exc):
        if last_exc is not None:
            return BackendError(f"op {res.op!r}: every candidate failed; last error "
                                f"{type(last_exc).__name__}: {last_exc}")
        if not self.registry.get_impls(res.op, res.api):
            return NotImplementedError(f"no implementation registered for op {res.op!r}")
        tried = [i.impl_id for i in res.candidates]
        why = "; ".join(f"{k}: {v}" for k, v in res.excluded.items())
        return NotImplementedError(
            f"op {res.op!r}: no available implementation supports these arguments "
            f"(candidates {tried} declined{'; excluded ' + why if why else ''})")

    # -- introspection ------------------------------------------------------------------
    def op_info(self) -> dict:
        """Per op: the current order and selection (the policy's own resolution when there is
        one, else the latest override), calls per impl and fallbacks since the process began."""
        out: dict = {}
        with self._lock:
            current: dict = {}
            for res in self._cache.values():
                key = (res.op, res.api)
                if key not in current or res.seq > current[key].seq:
                    current[key] = res
            for key in set(current) | set(self._retired):
                op, api = key
                calls, fallbacks = dict(self._retired.get(key, [{}, 0])[0]), self._retired.get(key, [{}, 0])[1]
                for res in self._cache.values():
                    if (res.op, res.api) == key:
                        for k, v in res.by_impl.items():
                            calls[k] = calls.get(k, 0) + v
                        fallbacks += res.fallbacks
                entry: dict = {"api": api, "calls": calls, "fallbacks": fallbacks}
                res = current.get(key)
                if res is not None:
                    entry.update({
                        "order": [i.impl_id for i in res.candidates],
                        # what NumPy input gets: impls that serve device arrays only come first
                        # in the order but decline host arrays (listed under device_only)
                        "selected": next((i.impl_id for i in res.candidates if not i.declines_host),
                                         res.candidates[0].impl_id if res.candidates else None),
                        "device_only": [i.impl_id for i in res.candidates if i.declines_host],
                        "source": res.source, "tokens": res.tokens, "excluded": dict(res.excluded),
                        **({"note": res.note} if res.note else {})})
                if api == "facade" and op in self.fast_fns:   # plain calls skip the resolver
                    f = self.fast_fns[op]
                    entry["native_entry"] = f"{getattr(f, '__module__', None) or ''}.{getattr(f, '__name__', f)}"
                out[f"tex:{op}" if api == "tex" and is_shared(op) else op] = entry
            for impl in self.registry.all_impls():
                fp = impl.plain_entry
                n = fp.calls() if fp is not None and impl.api == "facade" else 0
                if n:
                    calls = out.setdefault(impl.op_name, {"api": "facade", "calls": {}, "fallbacks": 0})["calls"]
                    calls[impl.impl_id] = calls.get(impl.impl_id, 0) + n
            for (op, api, name, what), n in self._substituted.items():
                label = f"tex:{op}" if api == "tex" and is_shared(op) else op
                subs = out.setdefault(label, {}).setdefault("substituted", {})
                subs[name] = {"count": n, "reason": f"does not support {what}"}
            for (op, api, impl_id), (n, reason) in self._failures.items():
                name = f"tex:{op}" if api == "tex" and is_shared(op) else op
                out.setdefault(name, {}).setdefault("failures", {})[impl_id] = {"count": n, "last_error": reason}
        return out
