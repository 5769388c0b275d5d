"""``python -m tensor_ops bench`` and the validate → benchmark → tune → report half of
``detect_and_benchmark.py``: options, the plan, progress, the table, the PNG plot and the
JSON of raw figures (``_bench_report.py`` draws them). No build and no config write unless
asked (``--write``).
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

from . import _bench, _global, _tune
from ._bench_report import Progress, console as _console, plot, report, say  # noqa: F401

DEFAULT_DIR = Path("bench_results")
BUDGET = {"quick": 0.03, "default": 0.05, "fixed": 0.05, "full": 0.1}
TIME_BUDGET = 210.0               # default mode: detect + build + validate + report fit in 5 minutes


def add_arguments(p, write_flag: bool = True) -> None:
    """Options shared by ``python -m tensor_ops bench`` and ``detect_and_benchmark.py``
    (which writes by default and has ``--no-write`` instead of ``--write``)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="3 sizes and short timings (CI; < 1 minute)")
    g.add_argument("--full", action="store_true", help="the exhaustive sweep: every size up to 4x the last-level "
                                                       "cache, every row (NumPy, torch) at every size")
    p.add_argument("--ops", help=f"comma list of ops (default: all): {','.join(_bench.BENCH_OPS)}")
    p.add_argument("--backends", help="comma list of backends/vendors to time besides the NumPy reference")
    p.add_argument("--dtypes", default=",".join(_bench.DTYPES), help="comma list: float32,float16 (default both)")
    p.add_argument("--sizes", help="comma list of row counts of (rows, 4096) (matmul: square sides), "
                                   "e.g. 1,64,4096; default: a ladder that stops when bandwidth has converged "
                                   "past the last-level cache (arrays <= 256 MiB)")
    p.add_argument("--budget", type=float, default=None, help="seconds of rounds per row and size "
                                                              "(default 0.05; quick 0.03; full 0.1)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds the default ladder may take in all (default 210): a unit past its share stops "
                        "growing sizes once x >= min(LLC, 64 MiB); 0 = no limit")
    p.add_argument("--no-torch", action="store_true", help="leave out the torch eager reference rows")
    p.add_argument("--compile", action="store_true", help="add torch.compile (Inductor) reference rows "
                                                          "(compiled once per case, outside the timing; slow)")
    p.add_argument("--json", dest="json_path", help="raw figures (default bench_results/bench.json)")
    p.add_argument("--plot", dest="plot_path", help="PNG plot (default next to the JSON, same stem)")
    if write_flag:
        p.add_argument("--write", action="store_true", help="write the tuning table into backend.json")


def _csv(v: Optional[str]) -> list:
    return [p.strip() for p in (v or "").split(",") if p.strip()]


def check_args(args) -> Optional[str]:
    """An error message for invalid option values, else None."""
    bad = [o for o in _csv(args.ops) if o not in _bench.BENCH_OPS]
    if bad:
        return f"--ops: unknown op(s) {bad}; choose from {list(_bench.BENCH_OPS)}"
    bad = [d for d in _csv(args.dtypes) if d not in ("float32", "float16", "float64")]
    if bad:
        return f"--dtypes: unknown dtype(s) {bad}; choose from ['float16', 'float32', 'float64']"
    try:
        sizes = [int(s) for s in _csv(args.sizes)]
    except ValueError:
        return f"--sizes must be a comma list of positive row counts such as 1,64,4096, got {args.sizes!r}"
    if any(s < 1 for s in sizes):
        return f"--sizes must be positive, got {args.sizes!r}"
    return None


def make_plan(args, impls: list, llc: int) -> _bench.BenchPlan:
    """The BenchPlan of the options: ``--sizes`` fixed, else the quick / full / default ladder."""
    sizes = sorted({int(s) for s in _csv(args.sizes)})
    mode = "fixed" if sizes else ("quick" if args.quick else "full" if getattr(args, "full", False) else "default")
    sides = tuple(sizes) if sizes else _bench.MATMUL_SIDES["quick" if args.quick else "default"]
    baselines = () if args.no_torch else ("torch",) + (("torch.compile",) if getattr(args, "compile", False) else ())
    return _bench.BenchPlan(_csv(args.ops) or list(_bench.BENCH_OPS), _csv(args.dtypes) or list(_bench.DTYPES),
                            impls, mode, [(s, _bench.COLS) for s in sizes], llc, sides,
                            args.budget if args.budget is not None else BUDGET[mode], baselines=baselines,
                            time_budget_s=(TIME_BUDGET if args.time_budget is None else args.time_budget or None)
                            if mode == "default" else None)


def _dram_ceiling(results: list) -> Optional[float]:
    """The ceiling's GB/s at the largest case measured (the roofline the tuning table records)."""
    ceil = [r for r in results if r["kind"] == "ceiling" and r["op"] != "matmul" and r.get("gbps")]
    return max(ceil, key=lambda r: (r["bytes_moved"], r["dtype"] == "float32"))["gbps"] if ceil else None


def pipeline(args, console, detected: Optional[dict] = None, write: bool = False, source: str = "",
             strict: bool = False) -> dict:
    """Validate → benchmark → tune (→ write) → report. Returns the JSON payload; with
    ``strict``, a validation failure stops right after validation (``payload["aborted"]``)."""
    t_start = time.perf_counter()
    ops = _csv(args.ops) or list(_bench.BENCH_OPS)
    dtypes = _csv(args.dtypes) or list(_bench.DTYPES)
    backends = [b.lower() for b in _csv(args.backends)] or None
    llc, llc_src = _bench.llc_bytes()
    load0 = os.getloadavg()
    psi0 = _bench.cpu_pressure()

    impls = _bench.facade_impls(ops, backends)
    for ir in impls:
        if not ir.available:
            say(console, f"  {ir.impl_id:<22} {ir.op:<11} not timed: {ir.reason}")
    live = [i for i in impls if i.available]
    say(console, f"validating {len(live)} impls against the fp64 reference …")
    prog = Progress(console, "validate", len(live), lines=False)
    t0 = time.perf_counter()
    validation = _bench.validate(impls, [d for d in dtypes if d != "float64"] or ["float32"], prog)
    prog.close()
    t_val = time.perf_counter() - t0
    excluded = _tune.exclusions(validation)
    for op, d in sorted(excluded.items()):
        for iid, why in d.items():
            say(console, f"  EXCLUDED {iid} from {op}: {why}")
    if strict and excluded:
        payload: dict = {"aborted": "--strict: a backend failed validation; nothing benchmarked or written",
                   "detected": detected, "validation": validation, "results": []}
        save_json(payload, args)
        say(console, payload["aborted"])
        return payload
    ok_impls = [i for i in live if i.impl_id not in excluded.get(i.op, {})]
    say(console, f"validated {len(live)} impls x {len(dtypes)} dtypes in {t_val:.1f}s; "
                 f"{sum(len(d) for d in excluded.values())} (impl, op) pairs excluded")

    plan = make_plan(args, ok_impls, llc)
    say(console, f"benchmark: {len(plan.units())} (op, dtype) units, {plan.mode} sizes, rows timed in interleaved "
                 f"rounds with the ceiling copy")
    prog = Progress(console, "benchmark", len(plan.units()))
    t0 = time.perf_counter()
    figures = _bench.benchmark(plan, prog)
    prog.close()
    t_bench = time.perf_counter() - t0
    ceiling_gbps = _dram_ceiling(figures["results"])
    stops: dict = {}
    for rec in figures["ladders"]:
        key = rec["stop"].split(":")[0].split(" (")[0]
        stops[key] = stops.get(key, 0) + 1
    say(console, f"benchmark done in {t_bench:.0f}s; ladders: " + ", ".join(f"{n} {k}" for k, n in stops.items()))

    psi1 = _bench.cpu_pressure()
    busy = max((p for p in (psi0, psi1) if p is not None), default=None)
    note = ""
    if busy is not None and busy > 20:
        note = (f"machine busy while measuring (CPU pressure {busy:.0f}%, load average {load0[0]:.1f}): "
                f"multi-threaded backends lose time slices; rerun on an idle machine for a stable table")
        say(console, "WARNING: " + note)
    tuning = _tune.build_tuning(figures["results"], validation, ceiling_gbps,
                                (source or "python -m tensor_ops bench") + (f"; {note}" if note else ""), detected)
    payload = {"created": tuning["created"], "fingerprint": tuning["fingerprint"], "llc_bytes": llc,
               "llc_source": llc_src, "mode": plan.mode, "ceiling": figures["ceiling"],
               "ceiling_gbps_largest": ceiling_gbps,
               "statistic": "per row the median time of interleaved rounds; ratios (x_ceiling, vs, "
                            "speedup_vs_numpy) are medians of per-round ratios",
               "loadavg_start": load0, "loadavg_end": os.getloadavg(), "cpu_pressure_pct": [psi0, psi1],
               "busy_note": note or None, "budget_s": plan.budget_s, "ladders": figures["ladders"],
               "detected": detected, "validation": validation, "results": figures["results"], "tuning": tuning}
    if write:
        try:
            path, kept = _tune.write_tuning(tuning, detected)
            payload["written"] = {"path": str(path), "user_keys_kept": kept}
            say(console, f"wrote 'tuning' to {path}" + (f" (kept user settings: {', '.join(kept)})" if kept else ""))
        except (OSError, ValueError) as exc:
            payload["written"] = {"error": str(exc)}
            say(console, f"could not write the tuning table: {exc}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _global.reload_config()
    big = max((r["nbytes"] for r in figures["results"] if r["dtype"] == "float32" and r["op"] != "matmul"),
              default=1 << 26)
    payload["serving"] = _tune.serving(ops, {"1x4096": 4 * _bench.COLS, "largest": big})
    payload["timing_s"] = {"validate": round(t_val, 1), "benchmark": round(t_bench, 1),
                           "total": round(time.perf_counter() - t_start, 1)}
    report(payload, console)
    _save(payload, args, console)
    return payload


# ----------------------------------------------------------------------------- files
def _paths(args) -> tuple[Path, Path]:
    jpath = Path(args.json_path) if args.json_path else DEFAULT_DIR / "bench.json"
    return jpath, (Path(args.plot_path) if args.plot_path else jpath.with_suffix(".png"))


def save_json(payload: dict, args) -> Path:
    jpath, _ = _paths(args)
    jpath.parent.mkdir(parents=True, exist_ok=True)
    jpath.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return jpath


def _save(payload: dict, args, console) -> None:
    jpath, ppath = _paths(args)
    payload["plot"] = str(ppath)
    try:
        plot(payload, ppath)
    except ImportError as exc:
        payload["plot"] = f"not drawn: {exc} (pip install matplotlib)"
    save_json(payload, args)
    say(console, f"raw figures: {jpath}   plot: {payload['plot']}")


def run_cli(args) -> int:
    """Entry point of ``python -m tensor_ops bench``: no build; no write unless ``--write``."""
    err = check_args(args)
    if err:
        print(err, file=sys.stderr)
        return 2
    console = _console()
    try:
        _global.reload_config()
    except ValueError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 1
    payload = pipeline(args, console, write=args.write, source="python -m tensor_ops bench " + " ".join(sys.argv[2:]))
    failed = any(v["failures"] for v in payload["validation"].values())
    return 1 if failed or "error" in payload.get("written", {}) else 0
