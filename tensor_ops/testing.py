"""The conformance suite, public: run it against your own backend or plugin in one call.

Everything here is read from the op definitions (:mod:`tensor_ops._ops`): the fp64 oracles,
the cases (every op × variant × dtype × shape, including one row, odd widths that are not a
multiple of any SIMD width, batched rows, a strided view and empty arrays) and the one
tolerance table. tensor_ops' own test harness uses the same functions, so a plugin is held to
exactly the bar the built-in backends meet (ggml's ``test-backend-ops`` is the model).

Example:
    >>> import tensor_ops.testing as tt
    >>> report = tt.run_conformance("numpy", ops=["silu"], dtypes=["float32"])
    >>> report.ok, report.failed
    (True, [])

A vendor checks a plugin the same way: ``tt.run_conformance("vendor:acme")`` (or any order
token: ``"acme"``, ``"impl:vendor.acme"``) raises nothing and returns a :class:`Report`
whose ``failed`` lists ``(case id, what went wrong)``; ``report.raise_for_failures()`` turns
that into an AssertionError for a test.
"""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np

from ._errors import BackendUnsupportedError
from ._ops import SPECS, TOLERANCES, OpSpec, spec
from ._ops import tolerance as _tolerance

__all__ = ["SHAPES", "DTYPES", "KINDS", "TOLERANCES", "Case", "Report", "cases", "oracle", "oracles", "tolerance",
           "compare", "run_case", "run_conformance", "strict", "np_dtype", "as_kind", "to_numpy"]

#: shape id -> shape; "strided" is a (3, 66) non-contiguous view of a (6, 132) array
SHAPES: dict[str, Union[tuple, str]] = {
    "1x1": (1, 2), "1x4096": (1, 4096), "3x4097": (3, 4097), "5x17": (5, 17),
    "2x3x64": (2, 3, 64), "4x8x130": (4, 8, 130), "strided": "strided",
    # empty arrays of every kind: no rows, a 1-D empty x, an empty last (feature) axis, an
    # empty middle axis; each returns the empty result of the right shape and dtype
    "empty": (0, 8), "empty_1d": (0,), "empty_last": (2, 3, 0), "empty_mid": (3, 0, 6), "empty_all": (3, 0, 0),
}
DTYPES = ("float32", "float16", "bfloat16", "float64")
#: array kinds a case can be passed as: NumPy arrays, or torch CPU tensors (zero-copy views of
#: the same data; the result must come back as a torch tensor)
KINDS = ("numpy", "torch")


def np_dtype(name: str):
    """The NumPy dtype called ``name`` ('bfloat16' is ml_dtypes', imported on first use)."""
    if name == "bfloat16":
        from ._arrays import bfloat16
        return bfloat16()
    return np.dtype(name)


def as_kind(a, kind: str):
    """``a`` (a NumPy array, or anything else unchanged) as ``kind``: 'numpy' or 'torch' (a CPU
    tensor sharing the memory; bfloat16 through an int16 view)."""
    if kind == "numpy" or not isinstance(a, np.ndarray):
        return a
    from ._torch_facade import to_torch
    return to_torch(np.ascontiguousarray(a) if not a.flags.aligned else a)


def to_numpy(r):
    """A result as a NumPy array (torch tensors through their zero-copy view)."""
    if type(r).__module__.split(".")[0] == "torch":
        from ._torch_facade import to_numpy as view
        return view(r.cpu(), "result")
    return r


def oracle(op: str, x, *args, **kwargs):
    """``op`` computed from its definition in float64 (independent of every backend)."""
    return spec(op).oracle(x, *args, **kwargs)


#: the fp64 oracles by op name, with the facade's signatures: ``oracles.rms_norm(x, w, eps)``
oracles = SimpleNamespace(**{name: s.oracle for name, s in SPECS.items()})


def tolerance(op: str, dtype, n: int = 1, level: str = "conformance") -> tuple[float, float]:
    """(rtol, atol) for ``op``'s result of ``dtype`` with rows of length ``n``."""
    return _tolerance(dtype, spec(op).tolerance, n, level)


@dataclass
class Case:
    """One conformance case: call the facade op with ``x, *args`` and compare with the oracle."""

    op: str
    variant: str
    dtype: str
    shape_id: str
    x: Any
    args: tuple

    @property
    def id(self) -> str:
        v = f"[{self.variant}]" if self.variant else ""
        return f"{self.op}{v}-{self.dtype}-{self.shape_id}"

    @property
    def spec(self) -> OpSpec:
        return SPECS[self.op]

    @property
    def out_shape(self) -> tuple:
        if self.op == "matmul":
            return tuple(self.x.shape[:-1]) + (self.args[0].shape[-1],)
        return tuple(self.x.shape[:-1]) + (self.spec.out_width(self.x.shape[-1]),)

    def call(self, backend: Optional[str] = None, out=None, kind: str = "numpy"):
        from . import _facade
        o = tuple(as_kind(a, kind) for a in out) if type(out) is tuple else as_kind(out, kind)
        return _facade.OPS[self.op](as_kind(self.x, kind), *(as_kind(a, kind) for a in self.args),
                                    out=o, backend=backend)

    def empty_out(self, kind: str = "numpy"):
        """A NaN-filled ``out=`` for the case (a tuple of them for a two-output op)."""
        def one():
            return as_kind(np.full(self.out_shape, np.nan, np_dtype(self.dtype)), kind)
        return one() if self.spec.single else tuple(one() for _ in range(self.spec.outputs))

    def expected(self):
        with np.errstate(all="ignore"):
            return self.spec.oracle(self.x, *self.args)

    def tolerance(self, level: str = "conformance") -> tuple[float, float]:
        return _tolerance(self.dtype, self.spec.tolerance, max(1, self.x.shape[-1]), level)


def _make_x(shape_id: str, dtype, rng, rule) -> np.ndarray:
    spec_shape = SHAPES[shape_id]
    if isinstance(spec_shape, str):       # "strided"
        base = (rng.standard_normal((6, 2 * 66)) * 2).astype(dtype)
        return base[::2, ::2]
    shape: list[int] = [int(d) for d in spec_shape]
    if rule.even and shape[-1] % 2:
        shape[-1] += 1
    return (rng.standard_normal(shape) * 2).astype(dtype)


def cases(ops: Optional[Iterable[str]] = None, dtypes: Iterable[str] = DTYPES,
          shapes: Iterable[str] = tuple(SHAPES)) -> Iterator[Case]:
    """Every (op, variant, dtype, shape) case, with the same data on every run."""
    for op in (ops or SPECS):
        s = spec(op)
        for variant in s.variants:
            for dt in dtypes:
                for shape_id in shapes:
                    rng = np.random.default_rng(zlib.crc32(f"{op}/{variant}/{shape_id}".encode()))
                    x = _make_x(shape_id, np_dtype(dt), rng, s.x_rule)
                    if x.ndim < s.x_rule.min_ndim:
                        continue
                    yield Case(op, variant, np_dtype(dt).name, shape_id, x, s.make_args(x, rng, variant))


def compare(case: Case, got, level: str = "conformance", kind: str = "numpy") -> str:
    """'' when ``got`` is ``case``'s right answer within tolerance, else what is wrong (a
    two-output op: ``got`` is the tuple, each compared with the oracle's)."""
    if not case.spec.single:
        if type(got) is not tuple or len(got) != case.spec.outputs:
            return f"returned {type(got).__name__}, expected a tuple of {case.spec.outputs} arrays"
        cache: list = []

        def want(i):
            if not cache:
                cache.append(case.expected())
            return cache[0][i]
        for i, g in enumerate(got):
            why = _compare_one(case, g, lambda i=i: want(i), level, kind)
            if why:
                return f"result[{i}]: {why}"
        return ""
    return _compare_one(case, got, case.expected, level, kind)


def _compare_one(case: Case, got, expected, level: str, kind: str) -> str:
    if kind == "torch":
        if type(got).__module__.split(".")[0] != "torch":
            return f"returned {type(got).__name__}, expected a torch.Tensor"
        got = to_numpy(got)
    if not isinstance(got, np.ndarray):
        return f"returned {type(got).__name__}, expected numpy.ndarray"
    if got.shape != case.out_shape or got.dtype.name != case.dtype:
        return f"returned shape {got.shape} dtype {got.dtype}, expected {case.out_shape} {case.dtype}"
    if got.size == 0:
        return ""
    want = expected()
    rtol, atol = case.tolerance(level)
    g = got.astype(np.float64)
    same_nan = np.isnan(g) == np.isnan(want)
    close = np.isclose(g, want, rtol=rtol, atol=atol, equal_nan=True) & same_nan
    if close.all():
        return ""
    bad = int((~close).sum())
    err = float(np.nanmax(np.abs(g - want))) if bad else 0.0
    return f"{bad}/{close.size} elements off, max abs error {err:.3g} (rtol {rtol:g}, atol {atol:.3g})"


@contextlib.contextmanager
def strict():
    """Strict mode for the block (a backend failure raises instead of falling back), without
    touching ``os.environ``: the global manager's settings are swapped and restored."""
    from . import _global
    with _global.settings_override(strict=True, strict_source="tensor_ops.testing.strict()"):
        yield


@dataclass
class Report:
    """The outcome of :func:`run_conformance`: case ids per result."""

    backend: str
    passed: list = field(default_factory=list)
    failed: list = field(default_factory=list)      # (case id, why)
    declined: list = field(default_factory=list)    # (case id, served by)
    skipped: list = field(default_factory=list)     # (op, why)

    @property
    def ok(self) -> bool:
        return not self.failed

    def raise_for_failures(self) -> None:
        if self.failed:
            lines = "\n".join(f"  {cid}: {why}" for cid, why in self.failed)
            raise AssertionError(f"{self.backend}: {len(self.failed)} conformance case(s) failed:\n{lines}")

    def summary(self) -> str:
        return (f"{self.backend}: {len(self.passed)} passed, {len(self.failed)} failed, "
                f"{len(self.declined)} declined, {len(self.skipped)} ops skipped")


def _served(op, token, dtype, nbytes, kind: str = "numpy") -> dict:
    from . import _global
    k = "torch-cpu" if kind == "torch" else "numpy"
    return dict(_global.manager().resolve(op, token, "facade", dtype, nbytes, k).by_impl)


def run_case(case: Case, backend: str, kind: str = "numpy") -> tuple[str, str]:
    """('passed' | 'failed' | 'declined', detail) of one case forced onto ``backend``, its
    arrays passed as ``kind`` ('numpy' or 'torch' CPU tensors).

    The impl that served is read from the manager's counters: a case the backend declined
    (its ``supports()``, or a forced backend's BackendUnsupportedError for a dtype or array
    kind it does not serve), and which the resolver then gave to another impl, is 'declined',
    never a pass."""
    x = case.x
    before = _served(case.op, backend, case.dtype, x.nbytes, kind)
    try:
        got = case.call(backend, kind=kind)
    except BackendUnsupportedError as exc:   # the forced backend does not serve this dtype/kind
        return "declined", f"raised BackendUnsupportedError: {exc}"
    except Exception as exc:  # strict mode: a backend failure lands here
        return "failed", f"raised {type(exc).__name__}: {exc}"
    after = _served(case.op, backend, case.dtype, x.nbytes, kind)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    if x.size and delta and not _is_backend(delta, backend):
        return "declined", f"served by {sorted(delta)}"
    why = compare(case, got, kind=kind)
    if why:
        return "failed", why
    out = case.empty_out(kind)
    try:
        r2 = case.call(backend, out=out, kind=kind)
    except Exception as exc:
        return "failed", f"with out=: raised {type(exc).__name__}: {exc}"
    pairs = list(zip(out, got)) if type(out) is tuple else [(out, got)]
    same = (type(r2) is tuple and len(r2) == len(out) and all(a is b for a, b in zip(r2, out))
            if type(out) is tuple else r2 is out)
    if not same or not all(np.array_equal(to_numpy(o).astype(np.float64), to_numpy(g).astype(np.float64),
                                               equal_nan=True) for o, g in pairs):
        return "failed", "out= gave other numbers than the plain call (or did not return out)"
    return "passed", ""


def _is_backend(delta: dict, token: str) -> bool:
    from . import _global
    reg = _global.get_registry()
    ids = set(delta)
    for impl in reg.all_impls():
        if impl.impl_id in ids and impl.api == "facade":
            t = token.lower()
            if t in (impl.backend, f"impl:{impl.impl_id}".lower(), f"vendor:{(impl.vendor or '').lower()}",
                     impl.kind.value):
                return True
    return False


def run_conformance(backend: str, ops: Optional[Iterable[str]] = None, dtypes: Iterable[str] = DTYPES,
                    shapes: Iterable[str] = tuple(SHAPES), kinds: Iterable[str] = ("numpy",)) -> Report:
    """Every conformance case forced onto ``backend`` (an order token), in strict mode, with
    its arrays passed as each of ``kinds`` ('numpy'; 'torch' for torch CPU tensors: a case id
    then ends in ``-torch``).

    Ops the backend does not implement, or cannot run here (unavailable, with the reason),
    are listed in ``skipped``; cases it declines are listed in ``declined``."""
    from . import _global
    m = _global.manager()
    rep = Report(backend)
    with strict():
        for op in (ops or SPECS):
            impls = [i for i in m.registry.get_impls(op, "facade") if _is_backend({i.impl_id: 1}, backend)]
            if not impls:
                rep.skipped.append((op, f"{backend} does not implement {op}"))
                continue
            ok, why = m.availability(impls[0])
            if not ok:
                rep.skipped.append((op, f"{backend} unavailable: {why}"))
                continue
            for case in cases([op], dtypes, shapes):
                for kind in kinds:
                    result, detail = run_case(case, backend, kind)
                    cid = case.id + ("" if kind == "numpy" else f"-{kind}")
                    if result == "passed":
                        rep.passed.append(cid)
                    elif result == "declined":
                        rep.declined.append((cid, detail))
                    else:
                        rep.failed.append((cid, detail))
    return rep
