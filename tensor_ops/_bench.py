"""The benchmark engine behind ``detect_and_benchmark.py`` and ``python -m tensor_ops bench``.

Three steps, each a plain function returning plain data (JSON-ready):

- :func:`validate`: every available impl of every facade op × float32/float16 × small odd
  shapes, forced with ``backend="impl:<impl_id>"`` in strict mode, compared with an fp64
  reference; the manager's ``by_impl`` counters prove which impl served.
- :func:`copy_bandwidth`: a memory copy split over 2 threads (NumPy releases the GIL), the
  roofline every op is compared with.
- :func:`benchmark`: op × impl × dtype × a ladder of sizes up to a working set of at least
  4× the last-level cache; warm-up, then the median of repeats, the impls of one size timed
  interleaved (one call each per round) so load bursts hit them alike. Bytes moved = read + write of
  the big tensors (x, out, and for rope the cos/sin tables); the op gets ``out=`` so page
  faults of a fresh allocation are not timed. Torch eager rows are added where torch imports.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from . import _facade, _global
from ._ops import BUILTIN_BACKENDS

BENCH_OPS = ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "relu", "swiglu", "geglu", "rope", "matmul")
DTYPES = ("float32", "float16")
COLS = 4096                       # feature width of the ladder: (rows, 4096)
HEAD_DIM = 128                    # rope runs on (heads, T, 128): LLM shapes, same element count
TOL = {"float64": (1e-12, 1e-12), "float32": (1.3e-6, 1e-5), "float16": (1e-3, 2e-3)}
REDUCTIONS = ("rms_norm", "layer_norm", "softmax")
MATMUL_SIDES = {"quick": (64, 256), "full": (64, 256, 1024)}


def llc_bytes() -> tuple[int, str]:
    """(size of the last-level cache, where it was read); 32 MiB assumed if unknown."""
    best = (0, 0)
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if not d.startswith("index"):
                continue
            with open(f"{base}/{d}/level") as fh:
                level = int(fh.read())
            with open(f"{base}/{d}/size") as fh:
                s = fh.read().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
            size = int(s.rstrip("KMGkmg")) * mult
            best = max(best, (level, size))
    except (OSError, ValueError):
        pass
    if best[1]:
        return best[1], f"{base} (L{best[0]})"
    return 32 << 20, "assumed (no cache information found)"


def cpu_pressure() -> Optional[float]:
    """Linux PSI: % of the last 10 s in which some task waited for a CPU (None if unknown).

    High values mean other processes compete for the cores; multi-threaded backends (OpenMP,
    PoCL, torch) then lose whole time slices at every barrier and their timings are not the
    machine's."""
    try:
        with open("/proc/pressure/cpu") as fh:
            for line in fh:
                if line.startswith("some"):
                    return float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return None


def row_ladder(dtype: str, llc: int, quick: bool) -> list[int]:
    """Rows of (rows, 4096): powers of 4 from 1 until x + out ≥ 4 × LLC."""
    if quick:
        return [1, 32, 512]
    item = np.dtype(dtype).itemsize
    target = 4 * llc
    rows, out = 1, []
    while True:
        out.append(rows)
        if 2 * rows * COLS * item >= target:
            return out
        nxt = rows * 4
        if 2 * nxt * COLS * item > target:       # last step: just reach the target
            nxt = max(rows + 1, -(-target // (2 * COLS * item)))
        rows = nxt


# ----------------------------------------------------------------------------- fp64 reference
def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _erf(x):
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:  # scipy is a dependency; keep a correct slow path anyway
        return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu64(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def reference(op: str, x, *args, **kw):
    """The op from its definition in float64 (independent of every backend)."""
    x = _f64(x)
    if op == "rms_norm":
        w, eps = _f64(args[0]), args[1]
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w
    if op == "layer_norm":
        w, b, eps = _f64(args[0]), args[1], args[2]
        mu = x.mean(-1, keepdims=True)
        y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w
        return y if b is None else y + _f64(b)
    if op == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if op == "silu":
        return x / (1 + np.exp(-x))
    if op == "relu":
        return np.maximum(x, 0)
    if op == "gelu":
        return _gelu64(x, args[0])
    h = x.shape[-1] // 2
    if op == "swiglu":
        return x[..., :h] / (1 + np.exp(-x[..., :h])) * x[..., h:]
    if op == "geglu":
        return _gelu64(x[..., :h], args[0]) * x[..., h:]
    if op == "rope":
        c, s, inter = _f64(args[0]), _f64(args[1]), args[2]    # (T, n/2) angles
        y = np.empty_like(x)
        a, b = (x[..., 0::2], x[..., 1::2]) if inter else (x[..., :h], x[..., h:])
        ya, yb = a * c - b * s, b * c + a * s
        if inter:
            y[..., 0::2], y[..., 1::2] = ya, yb
        else:
            y[..., :h], y[..., h:] = ya, yb
        return y
    if op == "matmul":
        return x @ _f64(args[0])
    raise KeyError(op)


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    """One op call: inputs, the output shape, bytes moved and the resolver's nbytes."""

    op: str
    variant: str
    dtype: str
    x: np.ndarray
    args: tuple
    out_shape: tuple
    bytes_moved: int
    nbytes: int
    shape_label: str
    ref_args: tuple = ()

    def run(self, backend: Optional[str], out=None):
        return getattr(_facade, self.op)(self.x, *self.args, out=out, backend=backend)

    def expected(self):
        return reference(self.op, self.x, *(self.ref_args or self.args))

    def tolerance(self) -> tuple[float, float]:
        rtol, atol = TOL[self.dtype]
        if self.op in REDUCTIONS:
            atol *= max(1.0, math.sqrt(self.x.shape[-1]) / 8)
        if self.op == "matmul":
            atol *= math.sqrt(self.x.shape[-1])
            rtol *= 4
        return rtol, atol


def make_case(op: str, dtype: str, shape, variant: str = "", seed: int = 0) -> Case:
    """Inputs for ``op`` with x of ``shape`` (for rope: (..., T, n); for matmul: (m, k))."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    shape = tuple(shape)
    x = (rng.standard_normal(shape) * 2).astype(dt)
    n = shape[-1]
    label = "x".join(map(str, shape))
    args: tuple = ()
    ref_args: tuple = ()
    out_shape = shape
    extra = 0
    if op == "rms_norm":
        args = ((rng.standard_normal(n) * 0.5 + 1).astype(dt), 1e-6)
    elif op == "layer_norm":
        b = None if variant == "nobias" else rng.standard_normal(n).astype(dt)
        args = ((rng.standard_normal(n) * 0.5 + 1).astype(dt), b, 1e-5)
    elif op in ("gelu", "geglu"):
        args = ("tanh" if variant == "tanh" else "none",)
    elif op == "rope":
        t = shape[-2]
        ang = rng.uniform(-4, 4, (t, n // 2))
        c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        inter = variant == "interleaved"
        args, ref_args = (c, s, inter), (c, s, inter)
        extra = 2 * t * n * 4        # the facade expands (T, n/2) fp32 angles to (T, n)
    elif op == "matmul":
        b = (rng.standard_normal((n, shape[0])) / math.sqrt(n)).astype(dt)
        args = (b,)
        out_shape = shape[:-1] + (b.shape[1],)
        extra = b.nbytes
    if op in ("swiglu", "geglu"):
        out_shape = shape[:-1] + (n // 2,)
    out_bytes = int(np.prod(out_shape)) * dt.itemsize
    nbytes = x.nbytes + (args[0].nbytes if op == "matmul" else 0)
    return Case(op, variant, dt.name, x, args, out_shape, x.nbytes + out_bytes + extra, nbytes, label,
                ref_args)


def bench_case(op: str, dtype: str, rows: int) -> Case:
    """The ladder's case for ``rows`` (matmul: ``rows`` is the side of a square product)."""
    if op == "matmul":
        return make_case(op, dtype, (rows, rows))
    if op == "rope":
        return make_case(op, dtype, (COLS // HEAD_DIM, rows, HEAD_DIM))
    return make_case(op, dtype, (rows, COLS))


VALIDATION_SHAPES = ((1, 8), (3, 4098), (5, 18), (2, 3, 66))
VARIANTS = {"layer_norm": ("", "nobias"), "gelu": ("", "tanh"), "geglu": ("", "tanh"),
            "rope": ("", "interleaved")}


# ----------------------------------------------------------------------------- impls
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
    """Every facade impl of ``ops`` (optionally only those whose backend/vendor is listed)."""
    m = _global.manager()
    out = []
    for op in ops:
        for impl in m.registry.get_impls(op, "facade"):
            names = {impl.backend, (impl.vendor or "").lower(), impl.impl_id}
            if backends and not names & set(backends) and impl.kind.value != "reference":
                continue
            ok, why = m.availability(impl)
            excl = m._exclusion(impl)
            out.append(ImplRef(op, impl.impl_id, impl.backend, impl.kind.value, impl_token(impl),
                               not excl, excl or ("" if ok else why)))
    return out


@contextlib.contextmanager
def host_copies_allowed():
    """Let GPU backends take host arrays while timing them (their tuned policy decides later)."""
    saved = []
    for name, mod in _global.builtins().items():
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


@contextlib.contextmanager
def strict_mode():
    old = os.environ.get("TENSOR_OPS_STRICT")
    os.environ["TENSOR_OPS_STRICT"] = "1"
    _global.reload_config()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TENSOR_OPS_STRICT", None)
        else:
            os.environ["TENSOR_OPS_STRICT"] = old
        _global.reload_config()


def _served_delta(case: Case, token: str, before: dict) -> dict:
    res = _global.manager().resolve(case.op, token, "facade", case.dtype, case.nbytes)
    return {k: v - before.get(k, 0) for k, v in res.by_impl.items() if v != before.get(k, 0)}


def run_forced(case: Case, impl_id: str, out=None):
    """(result, served impl ids) of ``case`` forced onto ``impl_id``."""
    token = f"impl:{impl_id}"
    before = dict(_global.manager().resolve(case.op, token, "facade", case.dtype, case.nbytes).by_impl)
    y = case.run(token, out)
    return y, _served_delta(case, token, before)


# ----------------------------------------------------------------------------- validation
def validate(impls: list[ImplRef], dtypes=DTYPES, progress: Optional[Callable] = None) -> dict:
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
                        case = make_case(ir.op, dt, shape, variant, seed=zlib.crc32(repr((ir.op, shape)).encode()) % 1000)
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
                progress(1, f"validate {ir.impl_id} {ir.op}")
    return out


def _check(case: Case, impl_id: str) -> str:
    """'' when ``impl_id`` computes ``case`` within tolerance, 'declined', or what went wrong."""
    try:
        y, served = run_forced(case, impl_id)
    except Exception as exc:  # strict mode: a backend failure lands here
        return f"raised {type(exc).__name__}: {str(exc)[:200]}"
    if impl_id not in served:
        return "declined"
    if not isinstance(y, np.ndarray) or y.shape != case.out_shape or y.dtype.name != case.dtype:
        return f"returned {type(y).__name__} {getattr(y, 'shape', None)} {getattr(y, 'dtype', None)}"
    want = case.expected()
    rtol, atol = case.tolerance()
    got = y.astype(np.float64)
    bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
    if bad.any():
        err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).all() else float("nan")
        return f"{int(bad.sum())}/{bad.size} elements off, max abs error {err:.3g} (rtol {rtol:g}, atol {atol:.3g})"
    return ""


# ----------------------------------------------------------------------------- timing
def time_call(fn: Callable[[], object], budget_s: float, min_reps: int = 5, max_reps: int = 500) -> tuple[float, int, float]:
    """(median seconds, repeats, best seconds): a warm-up call, then repeats until both
    minimums (``min_reps`` calls and ``budget_s`` seconds) are met."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first < budget_s / 50:                 # tiny calls: a few more warm-ups settle caches/JIT
        for _ in range(3):
            fn()
    elif first > budget_s:                    # slow calls (NumPy fp16 at 64 MiB): median of 3
        min_reps = min(min_reps, 3)
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_reps:
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
        if len(samples) >= min_reps and time.perf_counter() - start >= budget_s:
            break
        if len(samples) >= 3 and time.perf_counter() - start >= 10 * budget_s:
            break
    return float(np.median(samples)), len(samples), float(min(samples))


_POOL: Optional[ThreadPoolExecutor] = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(2, thread_name_prefix="tensor_ops_copy")
    return _POOL


def copy_bandwidth(nbytes: int, budget_s: float) -> dict:
    """GB/s (read + write) of copying ``nbytes`` with 1 thread and split over 2 threads."""
    n = max(1, nbytes // 4)
    src = np.ones(n, np.float32)
    dst = np.zeros_like(src)
    h = n // 2
    pool = _pool()

    def two():
        f = pool.submit(np.copyto, dst[:h], src[:h])
        np.copyto(dst[h:], src[h:])
        f.result()

    t1 = time_call(lambda: np.copyto(dst, src), budget_s)[0]
    t2 = time_call(two, budget_s)[0]
    moved = 2 * src.nbytes
    g1, g2 = moved / t1 / 1e9, moved / t2 / 1e9
    return {"nbytes": int(src.nbytes), "bytes_moved": int(moved), "gbps_1t": g1, "gbps_2t": g2,
            "gbps": max(g1, g2)}


def _torch_fn(case: Case):
    """Torch eager equivalent of ``case`` (CPU tensors sharing NumPy memory), or None."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception:
        return None
    x = torch.from_numpy(case.x)
    a = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in case.args]
    op, n = case.op, case.x.shape[-1]
    if op == "rms_norm":
        return lambda: F.rms_norm(x, (n,), a[0], a[1])
    if op == "layer_norm":
        return lambda: F.layer_norm(x, (n,), a[0], a[1], a[2])
    if op == "softmax":
        return lambda: torch.softmax(x, -1)
    if op == "silu":
        return lambda: F.silu(x)
    if op == "relu":
        return lambda: torch.relu(x)
    if op == "gelu":
        return lambda: F.gelu(x, approximate=a[0])
    if op == "swiglu":
        return lambda: F.silu(x[..., : n // 2]) * x[..., n // 2:]
    if op == "geglu":
        return lambda: F.gelu(x[..., : n // 2], approximate=a[0]) * x[..., n // 2:]
    if op == "rope":
        c = torch.cat([a[0], a[0]], -1).to(x.dtype)
        s = torch.cat([a[1], a[1]], -1).to(x.dtype)

        def rope():
            x1, x2 = x[..., : n // 2], x[..., n // 2:]
            return x * c + torch.cat([-x2, x1], -1) * s
        return rope
    if op == "matmul":
        return lambda: torch.matmul(x, a[0])
    return None


@dataclass
class BenchPlan:
    ops: list
    dtypes: list
    impls: list                      # ImplRef, available and validated
    ladder: dict                     # dtype -> [rows]
    matmul_sides: list
    budget_s: float = 0.15
    torch: bool = True
    skipped: list = field(default_factory=list)

    def points(self) -> int:
        n = 0
        for op in self.ops:
            k = sum(1 for i in self.impls if i.op == op) + (1 if self.torch else 0)
            for dt in self.dtypes:
                sizes = self.matmul_sides if op == "matmul" else self.ladder[dt]
                if op == "matmul" and dt == "float16":
                    sizes = [s for s in sizes if s <= 256]
                n += k * len(sizes)
        return n


def benchmark(plan: BenchPlan, progress: Optional[Callable] = None) -> dict:
    """Time every (op, dtype, size, impl) of ``plan``; returns ``{"copy": [...], "results": [...]}``.

    The impls of one (op, dtype, size) are timed interleaved (one call of each per round), so
    a burst of load from other processes hits them alike and the ranking stays fair."""
    copies: dict = {}
    results: list = []
    with host_copies_allowed():
        for op in plan.ops:
            impls = [i for i in plan.impls if i.op == op]
            for dt in plan.dtypes:
                sizes = plan.matmul_sides if op == "matmul" else plan.ladder[dt]
                if op == "matmul" and dt == "float16":
                    sizes = [s for s in sizes if s <= 256]    # NumPy has no fp16 BLAS
                for rows in sizes:
                    case = bench_case(op, dt, rows)
                    key = case.bytes_moved // 2
                    if key not in copies:
                        copies[key] = copy_bandwidth(key, plan.budget_s)
                    copy = copies[key]["gbps"]
                    entries = [_prepare(case, ir) for ir in impls]
                    if plan.torch:
                        fn = _torch_fn(case)
                        if fn is not None:
                            entries.append(("torch", "torch (eager)", "reference row", fn, ""))
                    live = [e for e in entries if not e[4]]
                    timed = time_interleaved([e[3] for e in live], plan.budget_s) if live else []
                    got = {id(e): t for e, t in zip(live, timed)}
                    for e in entries:
                        t = got.get(id(e))
                        err = e[4] or (t[3] if t else "")
                        results.append(_row(case, rows, e[0], e[1], e[2], err,
                                            None if (err or not t) else t[0], t[1] if t else 0, copy,
                                            None if (err or not t) else t[2]))
                    if progress:
                        progress(len(entries), f"{op} {dt} {case.shape_label}")
    _speedups(results)
    return {"copy": sorted(copies.values(), key=lambda c: c["nbytes"]), "results": results}


def _prepare(case: Case, ir: ImplRef) -> tuple:
    """(backend, impl_id, token, fn, error): check once that ``ir`` serves ``case``."""
    token = f"impl:{ir.impl_id}"
    out = np.empty(case.out_shape, case.dtype)
    try:
        _, served = run_forced(case, ir.impl_id, out)
    except Exception as exc:  # a failure is a result, not the end of the run
        return ir.backend, ir.impl_id, ir.token, None, f"{type(exc).__name__}: {str(exc)[:200]}"
    if ir.impl_id not in served:
        return ir.backend, ir.impl_id, ir.token, None, f"declined (served by {sorted(served)})"
    return ir.backend, ir.impl_id, ir.token, (lambda: case.run(token, out)), ""


def time_interleaved(fns: list, budget_s: float, min_reps: int = 5, max_reps: int = 500) -> list:
    """[(median s, repeats, best s, error)] per fn: warm-ups, then rounds calling each fn once,
    until ``min_reps`` rounds and ``budget_s`` per fn have passed."""
    n = len(fns)
    errors = [""] * n
    samples: list = [[] for _ in fns]
    firsts = []
    for i, fn in enumerate(fns):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # e.g. an fp16 kernel torch lacks on CPU
            errors[i] = f"{type(exc).__name__}: {str(exc)[:200]}"
        firsts.append(time.perf_counter() - t0)
        if not errors[i] and firsts[-1] < budget_s / 50:    # tiny calls: settle caches/JIT
            for _ in range(3):
                fn()
    if max(firsts, default=0) > budget_s:                     # slow calls: median of 3
        min_reps = min(min_reps, 3)
    start = time.perf_counter()
    rounds = 0
    while rounds < max_reps:
        for i, fn in enumerate(fns):
            if errors[i]:
                continue
            t = time.perf_counter()
            try:
                fn()
            except Exception as exc:
                errors[i] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            samples[i].append(time.perf_counter() - t)
        rounds += 1
        spent = time.perf_counter() - start
        if rounds >= min_reps and spent >= budget_s * n:
            break
        if rounds >= 3 and spent >= 10 * budget_s * n:
            break
    return [(float(np.median(s)) if s else None, len(s), float(min(s)) if s else None, errors[i])
            for i, s in enumerate(samples)]


def _row(case, rows, backend, impl_id, token, error, t, reps, copy, best=None) -> dict:
    gbps = case.bytes_moved / t / 1e9 if t else None
    return {"op": case.op, "dtype": case.dtype, "shape": case.shape_label, "rows": rows,
            "nbytes": case.nbytes, "bytes_moved": case.bytes_moved, "backend": backend, "impl_id": impl_id,
            "token": token, "median_s": t, "best_s": best, "reps": reps, "gbps": gbps, "copy_gbps": copy,
            "frac_copy": (gbps / copy) if gbps else None, "error": error or None}


def _speedups(results: list) -> None:
    base = {(r["op"], r["dtype"], r["shape"]): r["median_s"] for r in results
            if r["backend"] == "numpy" and r["median_s"]}
    for r in results:
        b = base.get((r["op"], r["dtype"], r["shape"]))
        r["speedup_vs_numpy"] = (b / r["median_s"]) if (b and r["median_s"]) else None
