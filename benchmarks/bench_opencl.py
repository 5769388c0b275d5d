"""The OpenCL backend against the C++ backend, NumPy, torch (CPU) and the ceiling: a preset of
the one benchmark engine (``tensor_ops/_bench.py``).

    python benchmarks/bench_opencl.py                          # 8192x4096 float32, all ops
    python benchmarks/bench_opencl.py --ops rms_norm,silu --rows 1024 --json out.json

Per op: the median time and GB/s (bytes read + written) of each backend (through the facade,
``out=`` given), × ceiling and opencl/cpp (goal, issue 4: >= 0.6 on PoCL), both medians of
per-round ratios over ``--repeats`` interleaved rounds. Also: the two host-array strategies
(USE_HOST_PTR vs copies through pooled device buffers), the per-call cost of a (1, 4096)
rms_norm, and the warm program load (a fresh process whose binary cache is warm). Exits 2
with the reason when the OpenCL backend is unavailable.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "gelu_tanh", "relu", "swiglu", "geglu", "rope")
GOAL_VS_CPP = 0.6


def _warm_load(cache: str) -> dict:
    """A fresh process with a warm binary cache: state creation and first-call times."""
    code = ("import time, json, numpy as np; t0 = time.perf_counter(); "
            "from tensor_ops.backends import opencl as m; st = m.device.get(); t1 = time.perf_counter(); "
            "m.rms_norm(np.ones((1, 4096), np.float32), np.ones(4096, np.float32), 1e-6, None); "
            "t2 = time.perf_counter(); print(json.dumps({'load_ms': st.load_ms, "
            "'state_ms': (t1 - t0) * 1e3, 'first_call_ms': (t2 - t1) * 1e3, **m.state.STATS}))")
    env = dict(os.environ, TENSOR_OPS_OPENCL_CACHE=cache)
    out = []
    for _ in range(2):   # the first run may build (cold cache); the second is the warm figure
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        if r.returncode:
            return {"error": r.stderr[-500:]}
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {"cold": out[0], "warm": out[1]}


def _extras(rows: int, n: int, dt) -> list[dict]:
    """Host-array strategies and (1, 4096) per-call costs, timed by the engine's timer."""
    import tensor_ops as to
    from tensor_ops import _bench
    from tensor_ops.backends import opencl as ocl
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, n)).astype(dt)
    w, out = np.ones(n, dt), np.empty_like(x)

    def mode(m):
        def run():
            ocl.set_host_mode(m)
            ocl.rms_norm(x, w, 1e-6, out)
        return run
    try:
        t = _bench.time_rounds({"hostptr": mode("hostptr"), "copy": mode("copy")}, 0, 3)
    finally:
        ocl.set_host_mode(None)
    res = [{"kind": "mode", "op": "rms_norm", **{f"{k}_ms": float(np.median(v.times)) * 1e3 for k, v in t.items()}}]
    xs = rng.standard_normal((1, 4096)).astype(np.float32)
    ws, os_ = np.ones(4096, np.float32), np.empty((1, 4096), np.float32)
    fns = {}
    for b in ("opencl", "cpp", "numpy"):
        impl = next((i for i in to.get_registry().get_impls("rms_norm", "facade") if i.backend == b), None)
        if impl is not None and to.get_manager().availability(impl)[0]:
            fns[f"{b}.fn"] = (lambda fn=impl.fn: fn(xs, ws, 1e-6, os_))
    fns["opencl.facade"] = lambda: to.rms_norm(xs, ws, 1e-6, out=os_, backend="opencl")
    t = _bench.time_rounds(fns, 0, 7, calls=200)
    res.append({"kind": "small", "op": "rms_norm", "shape": [1, 4096],
                "us_per_call": {k: float(np.median(v.times)) * 1e6 for k, v in t.items()}})
    return res


def run(rows: int = 8192, n: int = 4096, dtype: str = "float32", ops=OPS, repeats: int = 7,
        backends=("opencl", "cpp", "numpy", "torch"), small: bool = True, load: bool = True) -> list[dict]:
    """The engine's rows (``kind`` impl / baseline / ceiling) plus 'ratio', 'mode', 'small'
    and 'load' records. Raises RuntimeError when the OpenCL backend is unavailable."""
    from tensor_ops import _bench
    from tensor_ops.backends import opencl as ocl
    ok, reason = ocl.availability()
    if not ok:
        raise RuntimeError(f"opencl unavailable: {reason}")
    try:
        import torch
        torch.set_num_threads(2)
    except ImportError:
        pass
    impls = [i for i in _bench.facade_impls({_bench.split_name(o)[0] for o in ops}, list(backends))
             if i.available and i.backend in backends]
    plan = _bench.BenchPlan(list(ops), [dtype], impls, "fixed", [(rows, n)], budget_s=0, min_rounds=repeats,
                            baselines=("torch",) if "torch" in backends else ())
    out = _bench.benchmark(plan)["results"]
    dev = ocl.get_opencl_info()["chosen"]["name"]
    for r in [r for r in out if r["col"] == "opencl" and "cpp" in r["vs"]]:
        out.append({"kind": "ratio", "name": r["name"], "opencl_vs_cpp": r["vs"]["cpp"], "goal": GOAL_VS_CPP,
                    "device": dev})
    if small:
        out += _extras(rows, n, np.dtype(dtype))
    if load:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            out.append({"kind": "load", **_warm_load(d)})
    return out


def _print(rows: list[dict]) -> None:
    from tensor_ops._bench_report import text_table
    timed = [r for r in rows if r["kind"] in ("impl", "baseline", "ceiling")]
    if timed:
        print(f"ceiling: {timed[0]['ceiling']}; {timed[0]['reps']} interleaved rounds, median times, "
              f"ratios = medians of per-round ratios")
        print(text_table(["op", "backend", "ms", "GB/s", "× ceiling"],
                         [[r["name"], r["col"], f"{r['median_s'] * 1e3:.2f}" if r["median_s"] else "-",
                           f"{r['gbps']:.1f}" if r["gbps"] else "-",
                           f"{r['x_ceiling']:.2f}" if r["x_ceiling"] else (r["error"] or "-")[:60]] for r in timed]))
    for r in rows:
        if r["kind"] == "ratio":
            verdict = "ok" if r["opencl_vs_cpp"] >= r["goal"] else "BELOW GOAL"
            print(f"{r['name']:<11} opencl/cpp = {r['opencl_vs_cpp']:.2f}  (goal >= {r['goal']}) {verdict}")
        elif r["kind"] == "mode":
            print(f"host arrays, rms_norm: USE_HOST_PTR {r['hostptr_ms']:.2f} ms, pooled copies {r['copy_ms']:.2f} ms")
        elif r["kind"] == "small":
            print("(1, 4096) rms_norm per call: " + ", ".join(f"{b} {us:.1f} us" for b, us in r["us_per_call"].items()))
        elif r["kind"] == "load" and "error" in r:
            print(f"warm load: failed: {r['error']}")
        elif r["kind"] == "load":
            w = r["warm"]
            print(f"program load, warm cache (fresh process): state {w['state_ms']:.1f} ms (programs+context "
                  f"{w['load_ms']:.1f} ms, {w['hits']} hits, {w['builds']} builds), first call "
                  f"{w['first_call_ms']:.1f} ms; cold: {r['cold']['load_ms']:.1f} ms with {r['cold']['builds']} builds")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--backends", default="opencl,cpp,numpy,torch")
    p.add_argument("--no-load", action="store_true", help="skip the warm-load subprocess")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args(argv)
    ops = tuple(o.strip() for o in a.ops.split(",") if o.strip())
    if set(ops) - set(OPS):
        p.error(f"--ops: unknown {sorted(set(ops) - set(OPS))}; choose from {list(OPS)}")
    try:
        rows = run(a.rows, a.n, a.dtype, ops, a.repeats, tuple(a.backends.split(",")), load=not a.no_load)
    except RuntimeError as exc:
        print(f"bench_opencl: {exc}", file=sys.stderr)
        return 2
    _print(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
