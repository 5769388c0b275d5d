"""Showing what the benchmark engine measured: progress with an ETA (a rich bar on a
terminal, plain lines in CI logs and pipes), the tables (the pipeline's op × size × backend
table and the presets' one-line-per-case tables) and the PNG plot (× ceiling per size)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Optional

from ._bench import BENCH_OPS, _human

ORDER = {"numpy": 0, "cpp": 1, "opencl": 2, "cuda": 3, "numpy formula": 7, "torch": 8, "torch.compile": 9,
         "memcpy": 10, "ceiling": 11}


def console():
    """A rich Console (wide when not a terminal), or None without rich."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    c = Console()
    return c if c.is_terminal else Console(width=200)


def say(con, text: str = "") -> None:
    if con is not None:
        con.print(text, highlight=False, markup=False)
    else:
        print(text, flush=True)


def fmt_duration(s: float) -> str:
    m, s = divmod(int(round(s)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Progress per unit with an ETA: a rich bar on a terminal; otherwise (CI logs, ``| tee``,
    no rich) one plain line as each unit starts, ``[3/20] softmax float32 … eta 1m20s``
    (``lines=False``: nothing per unit). Call it with the unit's name as it starts."""

    def __init__(self, con, label: str, total: int, lines: bool = True, stream=None,
                 clock: Callable[[], float] = time.monotonic):
        self.label, self.total, self.lines, self.clock = label, total, lines, clock
        self.stream = stream
        self.k, self.t0, self.bar = 0, clock(), None
        if con is not None and getattr(con, "is_terminal", False) and total:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self.bar = Bar(TextColumn("[bold]{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=con,
                           transient=True)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)

    def eta(self) -> Optional[float]:
        """Seconds left: the mean time of the finished units times the units left."""
        done = self.k - 1
        return (self.clock() - self.t0) / done * (self.total - done) if done > 0 else None

    def __call__(self, what: str) -> None:
        self.k += 1
        if self.bar is not None:
            self.bar.update(self.task, completed=self.k - 1, description=f"{self.label}: {what}"[:40])
        elif self.lines:
            eta = self.eta()
            print(f"[{self.k}/{self.total}] {what} … eta {fmt_duration(eta) if eta is not None else '?'}",
                  file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.total)
            self.bar.stop()


# ----------------------------------------------------------------------------- tables
def by_case(results: list) -> list:
    """[(first row of the case, {col: row})] in op, dtype, size order."""
    cases: dict = {}
    for r in results:
        cases.setdefault((r.get("name", r["op"]), r["dtype"], r["shape"]), {})[r["col"]] = r
    order = list(BENCH_OPS)

    def key(item):
        first = next(iter(item[1].values()))
        op = first["op"]
        return (order.index(op) if op in order else 99, first.get("name", op), first["dtype"], first["bytes_moved"])
    return [(next(iter(c.values())), c) for _, c in sorted(cases.items(), key=key)]


def columns(results: list) -> list:
    cols = []
    for r in results:
        if r["col"] not in cols and r["kind"] != "ceiling":
            cols.append(r["col"])
    return sorted(cols, key=lambda c: (ORDER.get(c.replace(" (fresh)", ""), 5), c))


def text_table(headers: list, lines: list) -> str:
    """Plain aligned columns (first three left-aligned)."""
    w = [max(len(str(x)) for x in col) for col in zip(headers, *lines)]
    fmt = lambda ln: "  ".join((str(v).ljust if i < 3 else str(v).rjust)(w[i]) for i, v in enumerate(ln))  # noqa: E731
    return "\n".join([fmt(headers), fmt(["-" * n for n in w])] + [fmt(ln) for ln in lines])


def show_table(con, title: str, headers: list, lines: list) -> None:
    if con is not None:
        from rich.table import Table
        t = Table(title=title, header_style="bold")
        for h in headers:
            t.add_column(h, justify="left" if h in ("op", "dtype", "x", "shape") else "right", no_wrap=True)
        for ln in lines:
            t.add_row(*[str(v) for v in ln])
        con.print(t)
    else:
        print(title)
        print(text_table(headers, lines))


def _cell(r: Optional[dict]) -> str:
    if r is None:
        return "-"
    if not r.get("gbps"):
        return "err" if r.get("error") else "-"
    s = f"{r['gbps']:6.2f} {r['x_ceiling']:4.2f}" if r.get("x_ceiling") else f"{r['gbps']:6.2f}"
    if r.get("speedup_vs_numpy") and r["col"] != "numpy":
        s += f" {r['speedup_vs_numpy']:5.2f}x"
    return s


def report(payload: dict, con) -> None:
    """The table (op × size × row: GB/s, × ceiling, × numpy) and the serving lines."""
    results = payload["results"]
    cols = columns(results)
    lines = []
    for first, rows in by_case(results):
        ceil = rows.get("ceiling", {}).get("gbps")
        lines.append([first.get("name", first["op"]), first["dtype"].replace("float", "f"), first["shape"],
                      _human(first["bytes_moved"]), f"{ceil:.1f}" if ceil else "-"]
                     + [_cell(rows.get(c)) for c in cols])
    title = (f"GB/s (read+write), × ceiling and × numpy (medians of per-round ratios); "
             f"ceiling = {payload.get('ceiling') or '-'}")
    show_table(con, title, ["op", "dtype", "x", "moved", "ceiling"] + cols, lines)
    say(con, "")
    serving = payload.get("serving") or []
    if serving:
        say(con, f"who serves each op now (float32; tuning {serving[0]['tuning_status']}):")
    for s in serving:
        at = " · ".join(f"{a['size']} ({_human(a['nbytes'])}) -> {a['impl']}" for a in s["at"])
        say(con, f"  {s['op']:<11} {at}   [{s['at'][-1]['source']}]")


def plot(payload: dict, path: Path) -> None:
    """× ceiling vs bytes moved per op: one line per row (impl / baseline) and dtype, the
    ceiling at 1; each panel's title gives the ceiling's GB/s at its largest size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    results = [r for r in payload["results"] if r.get("x_ceiling") and r["kind"] != "ceiling"]
    names = [n for n in dict.fromkeys(r.get("name", r["op"]) for r in payload["results"])]
    ncol = min(4, max(1, len(names)))
    nrow = -(-len(names) // ncol) or 1
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.4 * nrow), squeeze=False)
    colors = {"numpy": "tab:blue", "cpp": "tab:green", "opencl": "tab:orange", "cuda": "tab:red", "torch": "tab:purple",
              "torch.compile": "tab:pink", "numpy formula": "tab:cyan", "memcpy": "tab:gray"}
    styles = {"float32": "-", "float16": ":", "float64": "-."}
    for ax, name in zip(axes.flat, names):
        mine = [r for r in results if r.get("name", r["op"]) == name]
        for col, dt in sorted({(r["col"], r["dtype"]) for r in mine}):
            pts = sorted((r["bytes_moved"], r["x_ceiling"]) for r in mine if (r["col"], r["dtype"]) == (col, dt))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(dt, "-"), marker="o", ms=3,
                    color=colors.get(col.replace(" (fresh)", ""), "tab:olive"),
                    label=f"{col} {dt.replace('float', 'f')}")
        ax.axhline(1.0, ls="--", color="black", lw=1.0, label="ceiling")
        ceil = [r for r in payload["results"]
                if r["kind"] == "ceiling" and r.get("name", r["op"]) == name and r.get("gbps")]
        big = max(ceil, key=lambda r: r["bytes_moved"], default=None)
        ax.set_title(name + (f" (ceiling {big['gbps']:.0f} GB/s at {_human(big['bytes_moved'])})" if big else ""),
                     fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes moved (read + write)", fontsize=8)
        ax.set_ylabel("× ceiling", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.25)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(6, max(1, len(labels))), fontsize=8, frameon=False)
    cpu = (payload.get("fingerprint") or {}).get("cpu", "")
    fig.suptitle(f"tensor_ops {cpu}: × ceiling (median of per-round ratios); ceiling = {payload.get('ceiling')}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
