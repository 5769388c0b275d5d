"""The CUDA backend against a device copy, torch eager and torch.compile on the GPU: a preset
of the one benchmark engine (``tensor_ops/_bench.py``).

For each op, dtype and shape (default 8192x8192 and 1x4096) the engine times, in interleaved
rounds, tensor_ops' kernel (through the facade, ``out=`` given, on torch CUDA tensors), torch
eager, torch.compile of the same math and the ceiling — a device-to-device copy of the op's
own pages moving the op's bytes. One sample is ``--iters`` back-to-back calls and one
synchronize; GB/s come from median times, × ceiling / × eager / × compile are medians of
per-round ratios. The host-side latency of one call is timed the same way (200 calls).

``--graph`` times the kernels alone: every row (ours, eager, compile, the ceiling copy) is
``--iters`` calls captured once in a ``torch.cuda.CUDAGraph`` (our launches go to torch's
current stream, so they are captured) and each sample is one replay, so host cost drops out.
Without it an op whose kernel takes less than the ~70-150 us host cost of a facade call
measures the host (CONTRIBUTING.md, "CUDA on an H200").

    python benchmarks/bench_cuda.py                      # all ops, float32 + bfloat16
    python benchmarks/bench_cuda.py --ops rms_norm,softmax --dtypes float16 --json out.json

Goals (issue 5): rms_norm/layer_norm/softmax/rope >= 0.85 of the copy, the activations >= 0.90,
>= 1.0x torch.compile, <= 10 us for the small call. Exits with status 2 and the reason when
there is no usable GPU (CuPy missing, no device, kernels not loadable).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPS = ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "gelu_tanh", "relu", "swiglu", "geglu", "rope",
       "add_rms_norm", "add_layer_norm")
DTYPES = ("float32", "float16", "bfloat16")
GOAL_COPY = {"rms_norm": 0.85, "layer_norm": 0.85, "softmax": 0.85, "silu": 0.90, "gelu": 0.90,
             "gelu_tanh": 0.90, "relu": 0.90, "swiglu": 0.90, "geglu": 0.90, "rope": 0.85, "add_rms_norm": 0.90,
             "add_layer_norm": 0.90}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma list of float32,float16,bfloat16")
    ap.add_argument("--shapes", default="8192x8192,1x4096", help="comma list of ROWSxN")
    ap.add_argument("--iters", type=int, default=50, help="back-to-back calls per sample (one synchronize)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--graph", action="store_true",
                    help="kernels alone: each row's --iters calls captured in a CUDA graph, one replay a sample")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args(argv)
    a.ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    if set(a.ops) - set(OPS):
        ap.error(f"unknown ops {sorted(set(a.ops) - set(OPS))}; choose from {list(OPS)}")
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    if set(a.dtypes) - set(DTYPES):
        ap.error(f"--dtypes: {sorted(set(a.dtypes) - set(DTYPES))}; choose from {', '.join(DTYPES)}")
    shapes = []
    for s in a.shapes.split(","):
        try:
            r, n = (int(v) for v in s.lower().split("x"))
        except ValueError:
            ap.error(f"--shapes: {s!r} is not ROWSxN")
        shapes.append((r, n))
    a.shapes = shapes
    if a.iters < 1 or a.rounds < 1:
        ap.error("--iters and --rounds must be >= 1")
    return a


def _fail(msg: str) -> None:
    print(f"bench_cuda: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _setup():
    from tensor_ops.backends import cuda
    ok, reason = cuda.availability()
    if not ok:
        _fail(f"no usable GPU, nothing measured: {reason}")
    try:
        import torch
    except ImportError:
        _fail("torch is required for the comparison (pip install torch with CUDA)")
    if not torch.cuda.is_available():
        _fail("torch has no CUDA (a CPU-only torch build?); install a CUDA build of torch")
    return cuda, torch


def _goals(name: str, r: dict, host_us: float, small: bool) -> list:
    if small:
        return ["small<=10us " + ("ok" if host_us <= 10 else "MISS")]
    goals = [f"copy>={GOAL_COPY[name]:.2f} " + ("ok" if (r.get("x_ceiling") or 0) >= GOAL_COPY[name] else "MISS")]
    if "torch.compile" in r["vs"]:
        goals.append("compile>=1x " + ("ok" if r["vs"]["torch.compile"] >= 1.0 else "MISS"))
    return goals


def run(a, torch) -> list[dict]:
    """One engine row set per (op, dtype, shape), the 'ours' row annotated with host_us/goals."""
    from tensor_ops import _bench
    from tensor_ops._bench_cases import on_torch
    sync = torch.cuda.synchronize
    impls = [i for i in _bench.facade_impls({_bench.split_name(o)[0] for o in a.ops}, ["cuda"])
             if i.backend == "cuda" and i.available]
    baselines = ("torch",) + (() if a.no_compile else ("torch.compile",))
    out = []
    for dtype in a.dtypes:
        for rows, n in a.shapes:
            for name in a.ops:
                case = on_torch(_bench.bench_case(name, "float32", rows, n), "cuda", dtype)
                ir = [i for i in impls if i.op == case.op]
                if a.graph:
                    got = _graph_case(case, rows, ir, baselines, a, torch)
                else:
                    got = _bench.measure_case(case, rows, ir, baselines=baselines, budget_s=0, min_rounds=a.rounds,
                                              calls=a.iters, sync=sync)
                ours = next((r for r in got if r["kind"] == "impl"), None)
                if ours is not None and ours["median_s"]:
                    e = _bench.impl_entry(case, ir[0])
                    host = _bench.time_rounds({"host": e.fn}, 0, 5, calls=200, sync=sync)["host"]
                    ours["host_us"] = statistics.median(host.times) * 1e6
                    ours["goals"] = _goals(name, ours, ours["host_us"], rows * n <= 1 << 16)
                out += got
    return out


def _graphed(fn, iters: int, torch):
    """One replay of ``iters`` calls of ``fn`` captured in a CUDA graph (warmed on a side
    stream first, as torch.cuda.graphs asks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return g.replay


def _graph_case(case, rows: int, ir: list, baselines: tuple, a, torch) -> list:
    """The engine's rows of one case, each timed as replays of its captured calls; a row
    whose calls cannot be captured keeps the capture's error."""
    from tensor_ops import _bench
    entries, label = _bench.case_entries(case, ir, baselines)
    fns = {}
    for e in entries:
        if e.fn is None or e.error:
            continue
        try:
            fns[e.col] = _graphed(e.fn, a.iters, torch)
        except Exception as exc:  # a row that cannot be captured is a result, not the end
            e.error = f"not capturable: {type(exc).__name__}: {exc}"[:200]
    timings = _bench.time_rounds(fns, 0, a.rounds, sync=torch.cuda.synchronize)
    for t in timings.values():  # one sample = one replay of a.iters calls
        t.samples = [None if v is None else v / a.iters for v in t.samples]
    return _bench.rows_of(case, rows, entries, timings, label)


def _print(rows: list) -> None:
    from tensor_ops._bench_report import by_case, text_table
    lines = []
    for first, c in by_case(rows):
        o, e, k = c.get("cuda", {}), c.get("torch", {}), c.get("torch.compile", {})
        f = lambda v, s="{:.1f}": "-" if v is None else s.format(v)  # noqa: E731
        lines.append([first["name"], first["dtype"], first["shape"], f(o.get("gbps")), f(o.get("ceiling_gbps")),
                      f(o.get("x_ceiling"), "{:.2f}"), f(e.get("gbps")), f(o.get("vs", {}).get("torch"), "{:.2f}"),
                      f(k.get("gbps")), f(o.get("vs", {}).get("torch.compile"), "{:.2f}"), f(o.get("host_us")),
                      "; ".join(o.get("goals", [])) + " " + (k.get("error") or "")[:60]])
    print(text_table(["op", "dtype", "shape", "ours GB/s", "copy GB/s", "× ceiling", "eager GB/s", "× eager",
                      "compile GB/s", "× comp", "host us", "goals"], lines))


def main(argv=None) -> int:
    a = parse_args(argv)
    cuda, torch = _setup()
    info = cuda.get_cuda_info()
    dev = info["devices"][0] if info["devices"] else {}
    print(f"device: {dev.get('name')} (sm {dev.get('compute_capability')}), kernels from {info['kernels_from']}, "
          f"torch {torch.__version__}, cupy {info.get('cupy')}")
    rows = run(a, torch)
    _print(rows)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": dev, "cuda_info": info, "results": rows}, indent=2, default=str))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
