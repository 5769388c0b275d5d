"""The impls the benchmark engine times and how it runs them: the list of facade impls,
forcing one impl on a case (and proving it served), strict mode and host copies for the
duration of a run, and :func:`validate` against the fp64 oracle of ``_bench_cases.py``.
"""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from . import _global
from ._bench_cases import VALIDATION_SHAPES, VARIANTS, Case, make_case
from ._ops import BUILTIN_BACKENDS


@dataclass
class ImplRef:
    """One facade impl to validate and time."""

    op: str
    impl_id: str
    backend: str
    kind: str
    token: str                 # its order token in backend.json
    available: bool = True
    reason: str = ""


def impl_token(impl) -> str:
    if impl.backend in BUILTIN_BACKENDS and impl.impl_id in (f"default.{impl.backend}", f"reference.{impl.backend}"):
        return impl.backend
    return f"impl:{impl.impl_id}"


def facade_impls(ops, backends: Optional[list] = None) -> list[ImplRef]:
    """Every facade impl of ``ops`` (optionally only those whose backend/vendor is listed;
    the NumPy reference is always kept)."""
    m = _global.manager()
    out = []
    for op in ops:
        for impl in m.registry.get_impls(op, "facade"):
            names = {impl.backend, (impl.vendor or "").lower(), impl.impl_id}
            if backends and not names & set(backends) and impl.kind.value != "reference":
                continue
            ok, why = m.availability(impl)
            excl = m._exclusion(impl)
            out.append(ImplRef(op, impl.impl_id, impl.backend or "", impl.kind.value, impl_token(impl),
                               not excl, excl or ("" if ok else why)))
    return out


@contextlib.contextmanager
def host_copies_allowed():
    """Let GPU backends take host arrays while timing them (their tuned policy decides later)."""
    saved = []
    for mod in _global.builtins().values():
        setter = getattr(mod, "set_host_copy_policy", None)
        if setter is None or isinstance(mod, str):
            continue
        table = dict(getattr(mod, "_HOST_COPY_MIN_BYTES", {}))
        saved.append((mod, table))
        for op in getattr(mod, "OPS", ()):
            try:
                setter(op, 0)
            except Exception:  # a backend that refuses keeps its policy
                pass
    try:
        yield
    finally:
        for mod, table in saved:
            for op in getattr(mod, "OPS", ()):
                try:
                    mod.set_host_copy_policy(op, table.get(op))
                except Exception:
                    pass


def strict_mode():
    """Strict mode for the block (a backend failure raises instead of falling back), through
    the manager's settings (``_global.settings_override``), never ``os.environ``."""
    return _global.settings_override(strict=True, strict_source="benchmark validation (strict_mode)")


def _served_delta(case: Case, token: str, before: dict) -> dict:
    res = _global.manager().resolve(case.op, token, "facade", case.dtype, case.nbytes)
    return {k: v - before.get(k, 0) for k, v in res.by_impl.items() if v != before.get(k, 0)}


def run_forced(case: Case, impl_id: str, out=None):
    """(result, served impl ids) of ``case`` forced onto ``impl_id``."""
    token = f"impl:{impl_id}"
    before = dict(_global.manager().resolve(case.op, token, "facade", case.dtype, case.nbytes).by_impl)
    y = case.run(token, out)
    return y, _served_delta(case, token, before)


def validate(impls: list[ImplRef], dtypes=("float32", "float16"), progress: Optional[Callable] = None) -> dict:
    """Conformance of every available impl against the fp64 reference.

    Returns ``{impl_id: {"backend", "checked", "declined", "failures": [...],
    "excluded_ops": {op: reason}}}``; an op with any failing case is excluded for that impl.
    """
    out: dict = {}
    with strict_mode(), host_copies_allowed():
        for ir in impls:
            rec = out.setdefault(ir.impl_id, {"backend": ir.backend, "token": ir.token, "available": ir.available,
                                              "reason": ir.reason, "checked": 0, "declined": 0,
                                              "failures": [], "excluded_ops": {}})
            if not ir.available:
                continue
            for dt in dtypes:
                for shape in VALIDATION_SHAPES:
                    if ir.op == "matmul" and len(shape) > 2:
                        continue
                    for variant in VARIANTS.get(ir.op, ("",)):
                        seed = zlib.crc32(repr((ir.op, shape)).encode()) % 1000
                        case = make_case(ir.op, dt, shape, variant, seed=seed)
                        why = _check(case, ir.impl_id)
                        if why == "declined":
                            rec["declined"] += 1
                            continue
                        rec["checked"] += 1
                        if why:
                            msg = f"{ir.op}{'(' + variant + ')' if variant else ''} {dt} {case.shape_label}: {why}"
                            rec["failures"].append(msg)
                            rec["excluded_ops"].setdefault(ir.op, f"wrong numerics vs fp64 reference: {msg}")
            if progress:
                progress(f"validate {ir.impl_id} {ir.op}")
    return out


def _check(case: Case, impl_id: str) -> str:
    """'' when ``impl_id`` computes ``case`` within tolerance, 'declined', or what went wrong."""
    try:
        y, served = run_forced(case, impl_id)
    except Exception as exc:  # strict mode: a backend failure lands here
        return f"raised {type(exc).__name__}: {str(exc)[:200]}"
    if impl_id not in served:
        return "declined"
    want = case.expected()
    if isinstance(want, tuple):                  # a two-output op (the fused add + norm): each result
        if type(y) is not tuple or len(y) != len(want):
            return f"returned {type(y).__name__}, expected a tuple of {len(want)} arrays"
        for i, (g, w) in enumerate(zip(y, want)):
            why = _close(case, g, w)
            if why:
                return f"result[{i}]: {why}"
        return ""
    return _close(case, y, want)


def _close(case: Case, y, want) -> str:
    if not isinstance(y, np.ndarray) or y.shape != case.out_shape or y.dtype.name != case.dtype:
        return f"returned {type(y).__name__} {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}"
    rtol, atol = case.tolerance()
    got = y.astype(np.float64)
    bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
    if bad.any():
        err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).all() else float("nan")
        return f"{int(bad.sum())}/{bad.size} elements off, max abs error {err:.3g} (rtol {rtol:g}, atol {atol:.3g})"
    return ""
