"""The C++ SIMD backend against the ceiling, NumPy and torch: a preset of the one benchmark
engine (``tensor_ops/_bench.py``), which builds the cases, times and computes every figure.

    python benchmarks/bench_cpp.py                       # 8192x4096 fp32, every op
    python benchmarks/bench_cpp.py --sizes 8192x4096 1024x1024 --dtypes float32 float16
    python benchmarks/bench_cpp.py --compile             # + torch.compile (Inductor) rows
    python benchmarks/bench_cpp.py --small               # (1, 4096) rms_norm call overhead
    python benchmarks/bench_cpp.py --threshold           # 1 vs 2 threads by size (OpenMP threshold)

Per case, the cpp kernel with ``out=`` and with a fresh output, the NumPy formula, torch eager
(same thread count), optionally torch.compile, and the ceiling — a streaming-store copy of
the op's own input pages moving the op's bytes (``memcpy`` where ``_cpp.stream_copy`` is
missing, and then labelled so) — run in ``--reps`` interleaved rounds. Columns: GB/s from
the median time; × ceiling, × NumPy, × torch as medians of per-round ratios (fresh output
against NumPy's and torch's fresh outputs). Bytes: x + output, rope's two (T, 128) float32
tables (x is (32 heads, rows, 128)), gated ops read 2h and write h.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tensor_ops._bench import BENCH_OPS  # noqa: E402  (the engine's op list: one definition)

#: the engine's memory-bound ops (matmul has its own preset) plus tanh-GELU, a variant of gelu
OPS = tuple(o for o in BENCH_OPS if o != "matmul") + ("gelu_tanh",)
EPS = 1e-6


def run(sizes=((8192, 4096),), ops=OPS, dtypes=("float32",), reps: int = 7, threads: int = 2,
        with_torch: bool = True, compile: bool = False) -> list[dict]:
    """The engine's rows for every (op, size, dtype): cpp, cpp (fresh), baselines, ceiling."""
    from tensor_ops import _bench
    from tensor_ops.backends import cpp
    cpp.set_num_threads(threads)
    baselines = ("numpy formula",)
    if with_torch:
        try:
            import torch
            torch.set_num_threads(threads)
            baselines += ("torch",) + (("torch.compile",) if compile else ())
        except ImportError:
            pass
    names = {_bench.split_name(o)[0] for o in ops}
    impls = [i for i in _bench.facade_impls(names) if i.backend == "cpp" and i.available]
    plan = _bench.BenchPlan(list(ops), list(dtypes), impls, "fixed", list(sizes), budget_s=0, min_rounds=reps,
                            baselines=baselines, fresh=True, memcpy=True)
    return _bench.benchmark(plan)["results"]


def small_call(reps: int = 50_000) -> dict:
    """(1, 4096) fp32 rms_norm in µs: the _cpp function, its native entry, the facade with
    cpp first in the configured order (so its plain-call entry is used), np.empty; each plain
    and with ``out=``, and on torch CPU tensors beside ``F.rms_norm`` when torch is installed;
    add_rms_norm and a decode step's rope; the "general" lines hide the native entry for their calls
    (the path it replaced)."""
    import tensor_ops as to
    from tensor_ops import _bench, _state
    from tensor_ops.backends import cpp
    C = cpp.native()
    x = np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)
    w = np.ones(4096, np.float32)
    y = np.empty_like(x)
    xr = np.random.default_rng(1).standard_normal((32, 1, 128)).astype(np.float32)   # a decode step's q
    cs = np.ones((1, 128), np.float32)
    block = 50                  # calls per sample: short enough to fit between preemptions

    def loop(f):
        def g():
            for _ in range(block):
                f()
        return g

    def general(f, op="rms_norm", table=_state.fast_out_fns):
        """The same call with its native entry hidden: the general path the entry replaced."""
        def g():
            e = table.pop(op, None)
            try:
                for _ in range(block):
                    f()
            finally:
                if e is not None:
                    table[op] = e
        return g
    with _bench.settings_override(env_priority=["cpp", "numpy"], env_priority_source="bench_cpp --small"):
        assert to.get_backend("rms_norm") == "cpp", to.get_backend("rms_norm")
        fns = {"direct": loop(lambda: C.rms_norm(x, w, EPS, None)),
               "entry": loop(lambda: C._fast_rms_norm(x, w, EPS)),
               "facade": loop(lambda: to.rms_norm(x, w, EPS)),
               "direct_out": loop(lambda: C.rms_norm(x, w, EPS, y)),
               "facade_out": loop(lambda: to.rms_norm(x, w, EPS, out=y)),
               "general_out": general(lambda: to.rms_norm(x, w, EPS, out=y)),
               "add": loop(lambda: to.add_rms_norm(x, y, w, EPS)),
               "general_add": general(lambda: to.add_rms_norm(x, y, w, EPS), "add_rms_norm", _state.fast_fns),
               "rope": loop(lambda: to.rope(xr, cs, cs)),
               "general_rope": general(lambda: to.rope(xr, cs, cs), "rope", _state.fast_fns),
               "np_empty": loop(lambda: np.empty((1, 4096), np.float32))}
        try:
            import torch
            import torch.nn.functional as F
            xt, wt, yt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(y)
            fns.update({"torch_facade": loop(lambda: to.rms_norm(xt, wt, EPS)),
                        "torch_facade_out": loop(lambda: to.rms_norm(xt, wt, EPS, out=yt)),
                        "torch_general_out": general(lambda: to.rms_norm(xt, wt, EPS, out=yt)),
                        "torch_F": loop(lambda: F.rms_norm(xt, (4096,), wt, EPS))})
        except ImportError:
            pass
        t = _bench.time_rounds(fns, 0, max(1, reps // block))
    us = {k: float(np.median(v.times)) / block * 1e6 for k, v in t.items()}
    return {"direct_us": us["direct"], "facade_us": us["facade"], "facade_overhead_us": us["facade"] - us["direct"],
            "native_entry_us": us["entry"], "np_empty_us": us["np_empty"], "direct_out_us": us["direct_out"],
            "facade_out_us": us["facade_out"], "general_out_us": us["general_out"], "add_us": us["add"],
            "general_add_us": us["general_add"], "rope_us": us["rope"], "general_rope_us": us["general_rope"],
            **{f"{k}_us": us[k] for k in us if k.startswith("torch")}}


def threshold_scan(reps: int = 30) -> list[dict]:
    """rms_norm + silu at growing sizes on 1 vs 2 threads (parallel threshold forced to 0)."""
    from tensor_ops import _bench
    from tensor_ops.backends import cpp
    C = cpp.native()
    info = C.build_info()
    res = []
    try:
        C._set_tuning(0, -1)
        for kb in (16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048):
            rows = max(1, kb * 1024 // 4 // 1024 // 2)       # kb = bytes read + written
            x = np.random.default_rng(0).standard_normal((rows, 1024)).astype(np.float32)
            y, w = np.empty_like(x), np.ones(1024, np.float32)

            def f(th, x=x, w=w, y=y):
                def g():
                    C.set_num_threads(th)
                    for _ in range(10):
                        C.rms_norm(x, w, EPS, y)
                        C.silu(x, y)
                return g
            t = _bench.time_rounds({1: f(1), 2: f(2)}, 0, reps)
            res.append({"bytes": 2 * x.nbytes, "t1_us": float(np.median(t[1].times)) / 10 * 1e6,
                        "t2_us": float(np.median(t[2].times)) / 10 * 1e6, "speedup": _bench.median_ratio(t[1], t[2])})
    finally:
        C._set_tuning(info["parallel_threshold_bytes"], -1)
        C.set_num_threads(info["num_threads"])
    return res


def _f(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def print_table(rows: list[dict]) -> None:
    from tensor_ops._bench_report import by_case, text_table
    cases = by_case(rows)
    extra = [c for c in ("torch.compile", "memcpy") if any(c in cols for _, cols in cases)]
    head = ["op", "shape", "dtype", "ceiling GB/s", "out GB/s", "× ceiling", "fresh GB/s", "× numpy", "× torch"]
    head += ["× compile" if c == "torch.compile" else "memcpy × ceiling" for c in extra]
    lines = []
    for first, c in cases:
        out, fresh = c.get("cpp", {}), c.get("cpp (fresh)", {})
        vs = fresh.get("vs", {})
        ln = [first["name"], first["shape"], first["dtype"], _f(out.get("ceiling_gbps"), "{:.1f}"),
              _f(out.get("gbps"), "{:.1f}"), _f(out.get("x_ceiling")), _f(fresh.get("gbps"), "{:.1f}"),
              _f(vs.get("numpy formula"), "{:.1f}"), _f(vs.get("torch"), "{:.1f}")]
        ln += [_f(vs.get("torch.compile"), "{:.1f}") if k == "torch.compile" else _f(c["memcpy"].get("x_ceiling"))
               for k in extra]
        lines.append(ln)
    print(f"ceiling: {rows[0]['ceiling'] if rows else '-'}; GB/s from median times, ratios are medians of "
          f"per-round ratios over {rows[0]['reps'] if rows else 0} interleaved rounds")
    print(text_table(head, lines))
    for r in rows:
        if r.get("error") and r["kind"] != "ceiling":
            print(f"  {r['name']} {r['shape']} {r['dtype']} {r['col']}: {r['error']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="*", default=["8192x4096"], help="ROWSxN, e.g. 8192x4096")
    p.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    p.add_argument("--dtypes", nargs="*", default=["float32"], choices=["float32", "float16", "bfloat16"])
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds per case (default 7)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--small", action="store_true", help="only the (1, 4096) call-overhead measurement")
    p.add_argument("--threshold", action="store_true", help="only the 1-vs-2-thread size scan")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--compile", action="store_true", help="add torch.compile rows (compiled once per case)")
    p.add_argument("--json", help="also write the engine's rows here")
    a = p.parse_args(argv)
    try:
        sizes = [tuple(int(v) for v in s.lower().split("x")) for s in a.sizes]
        assert all(len(s) == 2 and min(s) > 0 for s in sizes)
    except (ValueError, AssertionError):
        p.error(f"--sizes: expected ROWSxN such as 8192x4096, got {a.sizes}")
    from tensor_ops.backends import cpp
    info = cpp.get_optimization_info()
    if not info["available"]:
        print(f"cpp backend unavailable: {info['reason']}", file=sys.stderr)
        return 2
    print(f"# cpp isa={info['selected_isa']} variants={info['compiled_variants']} threads={a.threads} "
          f"compiler={info['compiler']}")
    if a.threshold:
        for r in threshold_scan():
            print(f"{r['bytes'] / 1024:8.0f} KiB  1 thread {r['t1_us']:8.2f} us  2 threads {r['t2_us']:8.2f} us"
                  f"  speedup {r['speedup']:.2f}")
        return 0
    if a.small:
        r = small_call()
        print(f"(1,4096) fp32 rms_norm (medians): direct _cpp.rms_norm {r['direct_us']:.3f} us, facade "
              f"{r['facade_us']:.3f} us, facade overhead {r['facade_overhead_us']:.3f} us (the native entry "
              f"_cpp._fast_rms_norm alone {r['native_entry_us']:.3f} us; np.empty alone {r['np_empty_us']:.3f} us)")
        print(f"  with out=: direct {r['direct_out_us']:.3f} us, facade {r['facade_out_us']:.3f} us (its general "
              f"path {r['general_out_us']:.3f} us); add_rms_norm {r['add_us']:.3f} us (general path "
              f"{r['general_add_us']:.3f} us); rope (32, 1, 128) {r['rope_us']:.3f} us (general path "
              f"{r['general_rope_us']:.3f} us)")
        if "torch_F_us" in r:
            print(f"  torch CPU tensors: facade {r['torch_facade_us']:.3f} us, facade out= "
                  f"{r['torch_facade_out_us']:.3f} us (general path {r['torch_general_out_us']:.3f} us), "
                  f"torch.nn.functional.rms_norm {r['torch_F_us']:.3f} us")
        return 0
    rows = run(sizes, a.ops, a.dtypes, reps=a.reps, threads=a.threads, with_torch=not a.no_torch, compile=a.compile)
    print_table(rows)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
