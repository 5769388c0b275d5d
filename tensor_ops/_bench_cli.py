"""``python -m tensor_ops bench`` and the validate → benchmark → tune → report half of
``detect_and_benchmark.py``: options, progress bars (rich), the table, the PNG plot and the
JSON of raw figures. No build and no config write unless asked (``--write``).
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

DEFAULT_DIR = Path("bench_results")


def add_arguments(p, write_flag: bool = True) -> None:
    """Options shared by ``python -m tensor_ops bench`` and ``detect_and_benchmark.py``
    (which writes by default and has ``--no-write`` instead of ``--write``)."""
    p.add_argument("--quick", action="store_true", help="a few sizes and short timings (CI; < 1 minute)")
    p.add_argument("--ops", help=f"comma list of ops (default: all): {','.join(_bench.BENCH_OPS)}")
    p.add_argument("--backends", help="comma list of backends/vendors to time besides the NumPy reference")
    p.add_argument("--dtypes", default=",".join(_bench.DTYPES), help="comma list: float32,float16 (default both)")
    p.add_argument("--sizes", help="comma list of row counts of (rows, 4096) (matmul: square sides), "
                                   "e.g. 1,64,4096; default: a ladder up to 4x the last-level cache")
    p.add_argument("--budget", type=float, default=None, help="seconds of repeats per point (default 0.1; quick 0.03)")
    p.add_argument("--no-torch", action="store_true", help="leave out the torch eager reference rows")
    p.add_argument("--json", dest="json_path", help="raw figures (default bench_results/bench.json)")
    p.add_argument("--plot", dest="plot_path", help="PNG plot (default next to the JSON, same stem)")
    if write_flag:
        p.add_argument("--write", action="store_true", help="write the tuning table into backend.json")


def _csv(v: Optional[str]) -> list:
    return [p.strip() for p in (v or "").split(",") if p.strip()]


def _console():
    try:
        from rich.console import Console
    except ImportError:
        return None
    c = Console()
    if not c.is_terminal:
        c = Console(width=200)
    return c


class _Progress:
    """rich progress bar when rich is installed, else silent."""

    def __init__(self, console, label: str, total: int):
        self.bar = None
        if console is not None and total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("[bold]{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console, transient=not console.is_terminal)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)
        self.label = label

    def __call__(self, n: int, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=n, description=f"{self.label}: {what}"[:44])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def say(console, text: str = "") -> None:
    if console is not None:
        console.print(text, highlight=False, markup=False)
    else:
        print(text)


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


def pipeline(args, console, detected: Optional[dict] = None, write: bool = False, source: str = "",
             strict: bool = False) -> dict:
    """Validate → benchmark → tune (→ write) → report. Returns the JSON payload; with
    ``strict``, a validation failure stops right after validation (``payload["aborted"]``)."""
    t_start = time.perf_counter()
    ops = _csv(args.ops) or list(_bench.BENCH_OPS)
    dtypes = _csv(args.dtypes) or list(_bench.DTYPES)
    backends = [b.lower() for b in _csv(args.backends)] or None
    llc, llc_src = _bench.llc_bytes()
    sizes = sorted({int(s) for s in _csv(args.sizes)})
    ladder = {dt: sizes or _bench.row_ladder(dt, llc, args.quick) for dt in dtypes}
    sides = sizes or list(_bench.MATMUL_SIDES["quick" if args.quick else "full"])
    budget = args.budget if args.budget is not None else (0.03 if args.quick else 0.1)
    load0 = os.getloadavg()
    psi0 = _bench.cpu_pressure()

    impls = _bench.facade_impls(ops, backends)
    for ir in impls:
        if not ir.available:
            say(console, f"  {ir.impl_id:<22} {ir.op:<11} not timed: {ir.reason}")
    live = [i for i in impls if i.available]
    prog = _Progress(console, "validate", len(live))
    t0 = time.perf_counter()
    validation = _bench.validate(impls, [d for d in dtypes if d != "float64"] or ["float32"], prog)
    prog.close()
    t_val = time.perf_counter() - t0
    excluded = _tune.exclusions(validation)
    for op, d in sorted(excluded.items()):
        for iid, why in d.items():
            say(console, f"  EXCLUDED {iid} from {op}: {why}")
    if strict and excluded:
        payload = {"aborted": "--strict: a backend failed validation; nothing benchmarked or written",
                   "detected": detected, "validation": validation, "results": [], "copy": []}
        save_json(payload, args)
        say(console, payload["aborted"])
        return payload
    ok_impls = [i for i in live if i.impl_id not in excluded.get(i.op, {})]
    say(console, f"validated {len(live)} impls x {len(dtypes)} dtypes in {t_val:.1f}s; "
                 f"{sum(len(d) for d in excluded.values())} (impl, op) pairs excluded")

    plan = _bench.BenchPlan(ops, dtypes, ok_impls, ladder, sides, budget, torch=not args.no_torch)
    prog = _Progress(console, "benchmark", plan.points())
    t0 = time.perf_counter()
    figures = _bench.benchmark(plan, prog)
    prog.close()
    t_bench = time.perf_counter() - t0
    dram = max((c for c in figures["copy"]), key=lambda c: c["nbytes"], default=None)
    copy_gbps = dram["gbps_2t"] if dram else None

    psi1 = _bench.cpu_pressure()
    busy = max((p for p in (psi0, psi1) if p is not None), default=None)
    note = ""
    if busy is not None and busy > 20:
        note = (f"machine busy while measuring (CPU pressure {busy:.0f}%, load average {load0[0]:.1f}): "
                f"multi-threaded backends lose time slices; rerun on an idle machine for a stable table")
        say(console, "WARNING: " + note)
    tuning = _tune.build_tuning(figures["results"], validation, copy_gbps,
                                (source or "python -m tensor_ops bench") + (f"; {note}" if note else ""), detected)
    payload = {"created": tuning["created"], "fingerprint": tuning["fingerprint"], "llc_bytes": llc,
               "llc_source": llc_src, "copy_gbps_2thread_dram": copy_gbps,
               "copy_note": "copy per size: best of 1 thread and 2 threads; the DRAM roofline is the 2-thread copy "
                            "at the largest size",
               "loadavg_start": load0, "loadavg_end": os.getloadavg(), "cpu_pressure_pct": [psi0, psi1],
               "busy_note": note or None, "budget_s": budget,
               "ladder": ladder, "matmul_sides": sides, "detected": detected, "validation": validation,
               "copy": figures["copy"], "results": figures["results"], "tuning": tuning}
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


# ----------------------------------------------------------------------------- report
def _cell(r: Optional[dict]) -> str:
    if r is None:
        return "-"
    if not r.get("gbps"):
        return "err" if r.get("error") else "-"
    s = f"{r['gbps']:6.2f} {r['frac_copy']:4.2f}"
    if r.get("speedup_vs_numpy") and r["backend"] != "numpy":
        s += f" {r['speedup_vs_numpy']:5.2f}x"
    return s


def report(payload: dict, console) -> None:
    """The table (op × size × backend: GB/s, fraction of copy, speedup vs NumPy) and serving lines."""
    results = payload["results"]
    cols = []
    for r in results:
        name = r["backend"] if r["token"] != "reference row" else "torch"
        if r["token"].startswith("impl:"):
            name = r["impl_id"]
        if name not in cols:
            cols.append(name)
    order = {"numpy": 0, "cpp": 1, "opencl": 2, "cuda": 3, "torch": 9}
    cols.sort(key=lambda c: order.get(c, 5))
    keyed: dict = {}
    for r in results:
        name = "torch" if r["token"] == "reference row" else (r["impl_id"] if r["token"].startswith("impl:") else r["backend"])
        keyed[(r["op"], r["dtype"], r["shape"], name)] = r
    rows = sorted({(r["op"], r["dtype"], r["shape"], r["bytes_moved"]) for r in results},
                  key=lambda k: (list(_bench.BENCH_OPS).index(k[0]) if k[0] in _bench.BENCH_OPS else 99, k[1], k[3]))
    title = (f"GB/s (read+write), fraction of copy at that size, speedup vs numpy; "
             f"2-thread DRAM copy {payload['copy_gbps_2thread_dram'] or 0:.2f} GB/s")
    headers = ["op", "dtype", "x", "moved", "copy"] + cols
    lines = []
    for op, dt, shape, moved in rows:
        copy = next((r["copy_gbps"] for r in results if (r["op"], r["dtype"], r["shape"]) == (op, dt, shape)), 0)
        lines.append([op, dt.replace("float", "f"), shape, _tune._human(moved), f"{copy:.1f}"] +
                     [_cell(keyed.get((op, dt, shape, c))) for c in cols])
    if console is not None:
        from rich.table import Table
        t = Table(title=title, show_lines=False, header_style="bold")
        for h in headers:
            t.add_column(h, justify="left" if h in ("op", "dtype", "x") else "right", no_wrap=True)
        for ln in lines:
            t.add_row(*ln)
        console.print(t)
    else:
        print(title)
        print(" | ".join(headers))
        for ln in lines:
            print(" | ".join(ln))
    say(console, "")
    say(console, f"who serves each op now (float32; tuning {payload['serving'][0]['tuning_status'] if payload['serving'] else '-'}):")
    for s in payload["serving"]:
        at = " · ".join(f"{a['size']} ({_tune._human(a['nbytes'])}) -> {a['impl']}" for a in s["at"])
        say(console, f"  {s['op']:<11} {at}   [{s['at'][-1]['source']}]")


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


def plot(payload: dict, path: Path) -> None:
    """GB/s vs bytes moved per op: one line per backend and dtype, the copy as a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    results = payload["results"]
    ops = [o for o in _bench.BENCH_OPS if any(r["op"] == o for r in results)]
    ncol = min(4, max(1, len(ops)))
    nrow = -(-len(ops) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False)
    colors = {"numpy": "tab:blue", "cpp": "tab:green", "opencl": "tab:orange", "cuda": "tab:red", "torch": "tab:purple"}
    styles = {"float32": "-", "float16": ":", "float64": "-."}
    copy = sorted(payload["copy"], key=lambda c: c["bytes_moved"])
    for ax, op in zip(axes.flat, ops):
        mine = [r for r in results if r["op"] == op and r.get("gbps")]
        for name in sorted({(r["backend"], r["dtype"]) for r in mine}):
            pts = sorted((r["bytes_moved"], r["gbps"]) for r in mine if (r["backend"], r["dtype"]) == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(name[1], "-"), marker="o", ms=3,
                    color=colors.get(name[0], "tab:gray"), label=f"{name[0]} {name[1].replace('float', 'f')}")
        lo = min((r["bytes_moved"] for r in mine), default=1)
        hi = max((r["bytes_moved"] for r in mine), default=1)
        cp = [c for c in copy if lo / 2 <= c["bytes_moved"] <= hi * 2]
        ax.plot([c["bytes_moved"] for c in cp], [c["gbps"] for c in cp], "--", color="black", lw=1.2, label="copy")
        if payload.get("copy_gbps_2thread_dram"):
            ax.axhline(payload["copy_gbps_2thread_dram"], ls="--", color="gray", lw=0.8, label="copy 2t DRAM")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=10)
        ax.set_xlabel("bytes moved (read + write)", fontsize=8)
        ax.set_ylabel("GB/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.25)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(f"tensor_ops: {payload['fingerprint'].get('cpu', '')} - copy line dashed", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
