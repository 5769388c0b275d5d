"""The one benchmark engine: ``detect_and_benchmark.py``, ``python -m tensor_ops bench`` and
every ``benchmarks/*.py`` preset time through it, with one timer and one statistic.

- :func:`time_rounds`, the timer: the rows of one case (impls, baselines and the ceiling
  copy) are called in interleaved rounds, one call each per round, the order rotating, so a
  burst of load from other processes hits them alike.
- The statistic (:func:`stats`): per row the median time, and every ratio as the **median
  of per-round ratios** (row time / ceiling time in the same round, and so on), which a load
  burst on a shared VM moves far less than a ratio of two medians.
- The ceiling (:func:`ceiling_copy`): a streaming-store copy of the op's own input pages
  (``tensor_ops._cpp.stream_copy``) moving the op's bytes, timed in the same rounds; without
  it a memcpy split over the same threads, labelled as such (glibc's memcpy does not stream
  at these sizes, so kernels with streaming stores can beat it).
- :func:`benchmark`: op × dtype × a ladder of sizes that grows until the leading impl's
  bandwidth has converged past the last-level cache (or the 256 MiB-per-array cap); the NumPy
  reference and the baselines are sampled at the smallest, a middle and the largest size up to
  64 MiB per array.

The cases, the fp64 oracle and the baselines are in ``_bench_cases.py``, the ceiling copy in
``_bench_ceiling.py``, validation and the impl list in ``_bench_impls.py``.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ._bench_cases import (ALIASES, COLS, HEAD_DIM, VALIDATION_SHAPES, VARIANTS,  # noqa: F401
                           Case, bench_case, make_case, numpy_formula, reference, split_name, torch_compiled,
                           torch_eager)
from ._bench_ceiling import MEMCPY_MISSING, ceiling_copy, copy_threads, stream_copy_fn  # noqa: F401
from ._bench_impls import (ImplRef, facade_impls, host_copies_allowed, impl_token, run_forced,  # noqa: F401
                           strict_mode, validate)
from ._global import settings_override  # noqa: F401
from .testing import np_dtype
from ._tune import _human

BENCH_OPS = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm", "softmax", "silu", "gelu", "relu", "swiglu",
             "geglu", "rope", "matmul")
DTYPES = ("float32", "float16")
MATMUL_SIDES = {"quick": (64, 256), "default": (64, 256, 1024), "full": (64, 256, 1024)}
CAP_BYTES = 256 << 20             # no array of the ladder is larger, whatever the cache reports
REF_CAP_BYTES = 64 << 20          # the sampled NumPy / torch rows stop here (NumPy fp16 takes s per call)
CONVERGED = 0.05                  # two sizes past the cache within 5 %: the ladder stops
NOISE = 1.25                      # a reference impl this close to the leader is still swept
BASELINES = ("numpy formula", "torch", "torch.compile")


# ----------------------------------------------------------------------------- machine
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
            best = max(best, (level, int(s.rstrip("KMGkmg")) * mult))
    except (OSError, ValueError):
        pass
    if best[1]:
        return best[1], f"{base} (L{best[0]})"
    return 32 << 20, "assumed (no cache information found)"


def cpu_pressure() -> Optional[float]:
    """Linux PSI: % of the last 10 s in which some task waited for a CPU (None if unknown).

    High values mean other processes compete for the cores; multi-threaded backends (OpenMP,
    PoCL, torch) then lose whole time slices at every barrier."""
    try:
        with open("/proc/pressure/cpu") as fh:
            for line in fh:
                if line.startswith("some"):
                    return float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return None


# ----------------------------------------------------------------------------- ladder
def row_ladder(dtype: str, llc: int, mode: str = "default", cols: int = COLS) -> list[int]:
    """Rows of (rows, cols) to measure.

    ``quick``: 1, 32, 512. ``full``: powers of 4 until x + out >= 4 x LLC (uncapped, as
    before the adaptive ladder).
    ``default``: the candidates the adaptive sweep walks: powers of 4 while x is smaller than
    the LLC, then doubling, up to the cap (x <= 256 MiB); :func:`converged` stops it earlier."""
    if mode == "quick":
        return [1, 32, 512]
    row_bytes = cols * np_dtype(dtype).itemsize
    rows, out = 1, []
    if mode == "full":
        target = 4 * llc
        while True:
            out.append(rows)
            if 2 * rows * row_bytes >= target:
                return out
            nxt = rows * 4
            if 2 * nxt * row_bytes > target:       # last step: just reach the target
                nxt = max(rows + 1, -(-target // (2 * row_bytes)))
            rows = nxt
    cap = max(1, CAP_BYTES // row_bytes)
    while rows < cap:
        out.append(rows)
        rows *= 2 if rows * row_bytes >= llc else 4
    return out + [cap]


def _leader(rows: list) -> Optional[dict]:
    live = [r for r in rows if r["kind"] == "impl" and r.get("median_s")]
    return min(live, key=lambda r: r["median_s"]) if live else None


def converged(prev: list, cur: list, llc: int, tol: float = CONVERGED) -> str:
    """Why the ladder may stop after ``cur`` (rows of one size; ``prev`` those of the size
    before), or ''. Both sizes must be past the cache (x >= LLC) and the leading impl's GB/s
    within ``tol`` of its figure at the size before, or its × ceiling within ``tol``: the
    form a load burst on a shared machine cannot fake, since it hits the copy alike."""
    lead = _leader(cur)
    if lead is None or not prev or min(prev[0]["nbytes"], lead["nbytes"]) < llc:
        return ""
    p = next((r for r in prev if r["col"] == lead["col"] and r.get("median_s")), None)
    if p is None:
        return ""
    dg = abs(lead["gbps"] / p["gbps"] - 1)
    dc = abs(lead["x_ceiling"] / p["x_ceiling"] - 1) if lead.get("x_ceiling") and p.get("x_ceiling") else 1.0
    if min(dg, dc) > tol:
        return ""
    xc = f", × ceiling {p['x_ceiling']:.2f} -> {lead['x_ceiling']:.2f}" if dc < 1.0 else ""
    return (f"converged past the cache: {lead['col']} {p['gbps']:.1f} -> {lead['gbps']:.1f} GB/s{xc} "
            f"({p['shape']} -> {lead['shape']})")


# ----------------------------------------------------------------------------- the timer
@dataclass
class Timing:
    """Seconds per round of one row (None where it did not run), and its error if any."""

    samples: list = field(default_factory=list)
    error: str = ""

    @property
    def times(self) -> list:
        return [s for s in self.samples if s is not None]


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def time_rounds(fns: dict, budget_s: float, min_rounds: int = 5, max_rounds: int = 500,
                clock: Optional[Callable[[], float]] = None, calls: int = 1,
                sync: Optional[Callable[[], object]] = None, warmed=()) -> dict:
    """THE timer. ``{name: Timing}`` for ``{name: fn}``: a warm-up call each (tiny calls a
    few more; none for the names in ``warmed``, already called once), then rounds calling
    every fn once, the order rotating by one each round, until ``min_rounds`` rounds and
    ``budget_s`` seconds per fn have passed (3 rounds once a call is slower than the budget;
    at most 10x the budget). ``budget_s=0``: exactly ``min_rounds`` rounds. A fn that raises
    keeps its error and is left out from then on. For devices: each sample is ``calls``
    back-to-back calls then ``sync()``, divided by ``calls``."""
    clock = clock or time.perf_counter
    if calls > 1 or sync is not None:
        fns = {k: _block(fn, calls, sync) for k, fn in fns.items()}
    res = {k: Timing() for k in fns}
    slowest = 0.0
    for k, fn in fns.items():
        if k in warmed:
            continue
        try:
            t0 = clock()
            fn()
            first = clock() - t0
            if first < budget_s / 50:               # tiny calls: settle caches / JIT
                for _ in range(3):
                    fn()
            slowest = max(slowest, first / calls)
        except Exception as exc:  # a failure is a result (e.g. an fp16 kernel torch lacks)
            res[k].error = _err(exc)
    live = [k for k in fns if not res[k].error]
    start, rounds = clock(), 0
    while live and rounds < max_rounds:
        got: dict = {}
        for k in live[rounds % len(live):] + live[:rounds % len(live)]:
            t0 = clock()
            try:
                fns[k]()
            except Exception as exc:
                res[k].error = _err(exc)
                continue
            got[k] = (clock() - t0) / calls
        for k in fns:
            if not (res[k].error and not res[k].samples):
                res[k].samples.append(got.get(k))
        live = [k for k in live if not res[k].error]
        rounds += 1
        slowest = max([slowest, *got.values()])
        if budget_s > 0 and slowest > budget_s:   # slow calls (NumPy fp16 at 256 MiB): 3 rounds
            min_rounds = min(min_rounds, 3)
        spent = clock() - start
        if rounds >= min_rounds and spent >= budget_s * max(1, len(live)):
            break
        if budget_s > 0 and rounds >= 3 and spent >= 10 * budget_s * max(1, len(live)):
            break
    return res


def _block(fn, calls: int, sync):
    def run():
        for _ in range(calls):
            fn()
        if sync is not None:
            sync()
    return run


def median_ratio(num: Timing, den: Timing) -> Optional[float]:
    """THE ratio: the median over the rounds both ran of ``num / den`` (ceiling time / row
    time = × ceiling; NumPy time / row time = × NumPy)."""
    r = [a / b for a, b in zip(num.samples, den.samples) if a is not None and b]
    return float(np.median(r)) if r else None


# ----------------------------------------------------------------------------- rows of a case
@dataclass
class Entry:
    """One row of a case: an impl, a baseline or a ceiling, and the call to time."""

    col: str
    kind: str                  # impl (out=), fresh (impl, fresh output), baseline, ceiling, memcpy
    fn: Optional[Callable]
    label: str = ""
    backend: str = ""
    impl_id: str = ""
    token: str = ""
    error: str = ""
    warmed: bool = False       # already called once (the served check, a compile): no warm-up


def impl_entry(case: Case, ir: ImplRef, fresh: bool = False) -> Entry:
    """``ir`` forced on ``case`` with ``out=`` (or a fresh output), checked once to be served
    by that impl."""
    col = (ir.token if not ir.token.startswith("impl:") else ir.impl_id) + (" (fresh)" if fresh else "")
    e = Entry(col, "fresh" if fresh else "impl", None, col, ir.backend, ir.impl_id, ir.token)
    token = f"impl:{ir.impl_id}"
    out = case.empty_out()
    try:
        _, served = run_forced(case, ir.impl_id, out)
    except Exception as exc:  # a failure is a result, not the end of the run
        e.error = _err(exc)
        return e
    if ir.impl_id not in served:
        e.error = f"declined (served by {sorted(served)})"
    else:
        e.fn = (lambda: case.run(token, None)) if fresh else (lambda: case.run(token, out))
        e.warmed = not fresh            # the check call above touched out= and loaded the kernel
    return e


def baseline_entry(case: Case, name: str) -> Entry:
    fn: Optional[Callable]
    if name == "numpy formula":
        fn, why = numpy_formula(case), ""
    else:
        fn, why = (torch_eager if name == "torch" else torch_compiled)(case)
    return Entry(name, "baseline", fn, name, name.split()[0], "", "reference row", why,
                 warmed=name == "torch.compile")


def case_entries(case: Case, impls: list, baselines=(), fresh: bool = False, ref_impls: bool = True,
                 memcpy: bool = False) -> tuple[list, str]:
    """(entries, ceiling label) of one case: the impls (with fresh-output twins), the
    baselines, the ceiling copy and, where the ceiling streams, the memcpy as a second line."""
    entries = []
    for ir in impls:
        if ir.kind == "reference" and not ref_impls:
            continue
        entries.append(impl_entry(case, ir))
        if fresh:
            entries.append(impl_entry(case, ir, fresh=True))
    entries += [baseline_entry(case, b) for b in baselines]
    fn, kind, label = ceiling_copy(case.reads, case.bytes_moved // 2)
    entries.append(Entry("ceiling", "ceiling", fn, label, kind, token="reference row"))
    if memcpy and kind == "stream":
        fn, kind, mlabel = ceiling_copy(case.reads, case.bytes_moved // 2, memcpy=True)
        entries.append(Entry("memcpy", "memcpy", fn, mlabel, kind, token="reference row"))
    return entries, label


def stats(timings: dict, bytes_moved: int, ceiling: str = "ceiling") -> dict:
    """THE statistic, per row of one case: ``{col: {median_s, best_s, reps, gbps,
    x_ceiling, ceiling_gbps, vs: {other col: median(t_other / t_row)}, error}}``; every ratio
    is a median of per-round ratios (``x_ceiling`` = ceiling time / row time)."""
    ceil = timings.get(ceiling)
    ceil_t = ceil.times if ceil is not None and not ceil.error else []
    out = {}
    for col, t in timings.items():
        ts = t.times if not t.error else []
        med = float(np.median(ts)) if ts else None
        vs = {c: median_ratio(o, t) for c, o in timings.items() if med and c not in (col, ceiling) and not o.error}
        out[col] = {"median_s": med, "best_s": min(ts) if ts else None, "reps": len(ts),
                    "gbps": bytes_moved / med / 1e9 if med else None,
                    "x_ceiling": median_ratio(ceil, t) if (med and ceil is not None and ceil_t) else None,
                    "ceiling_gbps": bytes_moved / float(np.median(ceil_t)) / 1e9 if ceil_t else None,
                    "vs": {c: v for c, v in vs.items() if v is not None}, "error": t.error or None}
    return out


def rows_of(case: Case, size, entries: list, timings: dict, ceiling_label: str) -> list:
    """One JSON-ready row per entry of ``case``: its :func:`stats` and what it is."""
    st = stats(timings, case.bytes_moved)
    out = []
    for e in entries:
        s = st.get(e.col) or {"median_s": None, "best_s": None, "reps": 0, "gbps": None, "x_ceiling": None,
                              "ceiling_gbps": None, "vs": {}, "error": "not timed"}
        out.append({
            "op": case.op, "variant": case.variant, "name": case.name, "dtype": case.dtype,
            "shape": case.shape_label, "rows": size, "nbytes": case.nbytes, "bytes_moved": case.bytes_moved,
            "col": e.col, "kind": e.kind, "label": e.label, "backend": e.backend, "impl_id": e.impl_id,
            "token": e.token, **s, "ceiling": ceiling_label, "speedup_vs_numpy": s["vs"].get("numpy"),
            "error": e.error or s["error"]})
    return out


def measure_case(case: Case, size, impls: list, *, baselines=(), fresh: bool = False, ref_impls: bool = True,
                 memcpy: bool = False, budget_s: float = 0.05, min_rounds: int = 5, max_rounds: int = 500,
                 clock=None, calls: int = 1, sync=None) -> list:
    """Every row of one case timed in the same interleaved rounds; returns :func:`rows_of`."""
    entries, label = case_entries(case, impls, baselines, fresh, ref_impls, memcpy)
    fns = {e.col: e.fn for e in entries if e.fn is not None and not e.error}
    timings = time_rounds(fns, budget_s, min_rounds, max_rounds, clock, calls, sync,
                          warmed={e.col for e in entries if e.warmed})
    return rows_of(case, size, entries, timings, label)


# ----------------------------------------------------------------------------- the plan
@dataclass
class BenchPlan:
    """What to time. ``mode``: ``default`` (adaptive ladder, references sampled), ``quick``,
    ``full`` (the exhaustive ladder up to 4x the LLC, every row at every size) or ``fixed``
    (``shapes``)."""

    ops: list                              # benchmark names (gelu_tanh allowed)
    dtypes: list
    impls: list                            # ImplRef, available and validated
    mode: str = "default"
    shapes: list = field(default_factory=list)   # (rows, cols) for mode "fixed"
    llc: int = 32 << 20
    matmul_sides: tuple = MATMUL_SIDES["default"]
    budget_s: float = 0.05
    min_rounds: int = 5
    max_rounds: int = 500
    baselines: tuple = ("torch",)
    fresh: bool = False
    memcpy: bool = False
    time_budget_s: Optional[float] = None  # default mode: the seconds the whole benchmark may take

    def units(self) -> list:
        return [(op, dt) for op in self.ops for dt in self.dtypes]

    def sizes(self, name: str, dtype: str) -> list:
        """[(rows, cols)] to walk for one unit (the adaptive ladder may stop earlier)."""
        if split_name(name)[0] == "matmul":
            sides = [s for s, _ in self.shapes] if self.mode == "fixed" else list(self.matmul_sides)
            return [(s, s) for s in sides if dtype != "float16" or s <= 256]   # NumPy has no fp16 BLAS
        if self.mode == "fixed":
            return list(self.shapes)
        return [(r, COLS) for r in row_ladder(dtype, self.llc, self.mode)]


def _competitive(rows: list) -> bool:
    lead = _leader(rows)
    return any(r["kind"] == "impl" and r["col"] == "numpy" and r.get("median_s")
               and r["median_s"] <= NOISE * lead["median_s"] for r in rows) if lead else True


def sweep(plan: BenchPlan, name: str, dtype: str, clock=None, deadline: Optional[float] = None) -> tuple[list, dict]:
    """(rows, ladder record) of one (op, dtype): walk the sizes; in ``default`` mode stop
    when :func:`converged`, time the NumPy reference only while it is within ``NOISE`` of the
    leader and the baselines only at the first size, then re-time the middle and the largest
    size with x <= ``REF_CAP_BYTES`` with every row (all rows of a size come from the same
    rounds). Past ``deadline`` (``clock()`` time) the ladder stops once x has reached
    min(LLC, 64 MiB)."""
    impls = [i for i in plan.impls if i.op == split_name(name)[0]]
    adaptive = plan.mode == "default" and split_name(name)[0] != "matmul"
    kw = dict(fresh=plan.fresh, memcpy=plan.memcpy, budget_s=plan.budget_s, min_rounds=plan.min_rounds,
              max_rounds=plan.max_rounds, clock=clock)
    done: list = []                     # [(rows, cols), rows, every row timed]
    stop, ref_next = "every size measured", True
    for rows, cols in plan.sizes(name, dtype):
        if adaptive and deadline is not None and done and done[-1][1] and (clock or time.perf_counter)() > deadline \
                and done[-1][1][0]["nbytes"] >= min(plan.llc, REF_CAP_BYTES):
            stop = (f"time budget ({plan.time_budget_s:.0f}s for the run) spent: stopped at "
                    f"{done[-1][1][0]['shape']}")
            break
        full = not adaptive or not done
        case = bench_case(name, dtype, rows, cols)
        got = measure_case(case, rows, impls, baselines=plan.baselines if full else (),
                           ref_impls=full or ref_next, **kw)
        del case
        done.append([(rows, cols), got, full])
        if adaptive:
            ref_next = _competitive(got)
            why = converged(done[-2][1], got, plan.llc) if len(done) > 1 else ""
            if why:
                stop = why
                break
    else:
        if adaptive:
            stop = f"cap: {_human(CAP_BYTES)} per array"
    hi = max((i for i, d in enumerate(done) if d[1] and d[1][0]["nbytes"] <= REF_CAP_BYTES), default=0)
    for i in sorted({hi // 2, hi}) if done else ():
        if not done[i][2]:
            (rows, cols), _, _ = done[i]
            done[i][1] = measure_case(bench_case(name, dtype, rows, cols), rows, impls,
                                      baselines=plan.baselines, ref_impls=True, **kw)
            done[i][2] = True
    rec = {"op": name, "dtype": dtype, "sizes": [d[1][0]["shape"] for d in done if d[1]], "stop": stop,
           "references_at": [d[1][0]["shape"] for d in done if d[2] and d[1]]}
    return [r for d in done for r in d[1]], rec


def benchmark(plan: BenchPlan, progress: Optional[Callable[[str], None]] = None, clock=None) -> dict:
    """Time every unit (op × dtype) of ``plan``; ``progress(what)`` is called as each starts.
    Returns ``{"results": rows, "ladders": [...], "ceiling": label}``."""
    results, ladders = [], []
    units = plan.units()
    if {"torch", "torch.compile"} & set(plan.baselines):
        try:            # imported before the first unit, so its ETA is not skewed by the import
            import torch  # noqa: F401
        except ImportError:
            pass
    t0 = (clock or time.perf_counter)()
    with host_copies_allowed():
        for k, (name, dt) in enumerate(units):
            if progress:
                progress(f"{name} {dt}")
            # each unit may use its share of the budget plus what earlier units left unused
            deadline = t0 + plan.time_budget_s * (k + 1) / len(units) if plan.time_budget_s else None
            rows, rec = sweep(plan, name, dt, clock, deadline)
            results += rows
            ladders.append(rec)
    # every ceiling of the run, in order: the copy layout is chosen per size (ceiling_copy), so
    # one run can hold two (an AMD Zen 3 took the linear copy at some sizes, 4 pages at others)
    labels = list(dict.fromkeys(r["ceiling"] for r in results if r.get("ceiling")))
    return {"results": results, "ladders": ladders, "ceiling": " | ".join(labels) or None}
