"""Benchmark of the C++ SIMD backend against a 2-thread memory copy, NumPy and torch.

    python benchmarks/bench_cpp.py                       # the issue-3 table (8192x4096 fp32)
    python benchmarks/bench_cpp.py --sizes 8192x4096 1024x1024 --dtypes float32 float16
    python benchmarks/bench_cpp.py --small               # (1, 4096) rms_norm call overhead
    python benchmarks/bench_cpp.py --threshold           # 1 vs 2 threads by size (OpenMP threshold)

``run(sizes, ops, dtypes)`` returns one dict per (op, size, dtype) for ``python -m tensor_ops
bench``. Everything is measured side by side in the same process, interleaved, best of
``reps`` (the minimum is the least disturbed by other processes on a shared machine):

- ``copy_gbps``: a 2-thread memory copy of the same bytes (two NumPy ``copyto`` halves in two
  threads, i.e. glibc memcpy with the GIL released), or torch's ``copy_`` if that is faster;
- ``out_gbps``: the cpp kernel through the facade with ``out=`` preallocated;
- ``fresh_s`` / ``numpy_s`` / ``torch_s``: a fresh output each call for cpp, the NumPy
  formula and torch eager (torch with the same thread count).
Bytes are the big tensors read plus written: x and the output, and for rope also its two
(T, n) float32 tables, which the kernel must read once (16 MiB each at 8192x4096; the (n,)
norm weights are left out). rope runs on x viewed as (rows/T, T, n) with T = 1024 positions.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from typing import Callable

import numpy as np

OPS = ("rms_norm", "layer_norm", "softmax", "silu", "relu", "gelu", "gelu_tanh", "swiglu", "geglu", "rope")
EPS = 1e-6


def _best(fns: dict, reps: int) -> dict:
    """Interleaved best-of-reps seconds for each callable (one warm-up call each)."""
    for f in fns.values():
        f()
    best = {k: math.inf for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def _copy2(srcs: list, nbytes: int) -> Callable[[], None]:
    """A 2-thread memcpy of the first nbytes/2 bytes of ``srcs`` (the op's own input arrays,
    so the copy reads the very pages the kernel reads) into new buffers: nbytes moved in
    all. NumPy releases the GIL in copyto; each thread copies half of every piece."""
    pairs, left = [], nbytes // 2
    for s in srcs:
        a = s.reshape(-1).view(np.uint8)[:left]
        if a.size:
            pairs.append((a, np.empty_like(a)))
            left -= a.size

    def half(k):
        for a, b in pairs:
            h = a.size // 2
            if k:
                np.copyto(b[h:], a[h:])
            else:
                np.copyto(b[:h], a[:h])

    def run():
        t = threading.Thread(target=half, args=(1,))
        t.start()
        half(0)
        t.join()
    return run


def _numpy_fns(x, w, b, cos, sin):
    from scipy.special import erf
    s2 = np.float32(1 / math.sqrt(2))
    c = np.float32(math.sqrt(2 / math.pi))

    def silu(v):
        return v / (1 + np.exp(-v))

    def gelu(v):
        return 0.5 * v * (1 + erf(v * s2))

    def gelu_t(v):
        return 0.5 * v * (1 + np.tanh(c * (v + np.float32(0.044715) * v * v * v)))

    def rms(v):
        return v / np.sqrt(np.mean(v * v, -1, keepdims=True) + np.float32(EPS)) * w

    def ln(v):
        d = v - v.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(EPS)) * w + b

    def sm(v):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def rope(v):
        h = v.shape[-1] // 2
        rot = np.concatenate([-v[..., h:], v[..., :h]], -1)
        return v * cos + rot * sin

    def halves(f):
        return lambda v: f(v[:, : v.shape[1] // 2]) * v[:, v.shape[1] // 2:]

    return {"rms_norm": rms, "layer_norm": ln, "softmax": sm, "silu": silu, "relu": lambda v: np.maximum(v, 0),
            "gelu": gelu, "gelu_tanh": gelu_t, "swiglu": halves(silu), "geglu": halves(gelu), "rope": rope}


def _torch_fns(x, w, b, cos, sin):
    import torch
    import torch.nn.functional as F
    tw, tb, tc, ts = (torch.from_numpy(a) for a in (w, b, cos, sin))
    n = x.shape[-1]

    def halves(f):
        return lambda v: f(v[:, : v.shape[1] // 2]) * v[:, v.shape[1] // 2:]

    def rope(v):
        h = v.shape[-1] // 2
        return v * tc + torch.cat([-v[..., h:], v[..., :h]], -1) * ts

    return {"rms_norm": lambda v: F.rms_norm(v, (n,), tw, EPS), "layer_norm": lambda v: F.layer_norm(v, (n,), tw, tb, EPS),
            "softmax": lambda v: torch.softmax(v, -1), "silu": F.silu, "relu": F.relu, "gelu": F.gelu,
            "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"), "swiglu": halves(F.silu), "geglu": halves(F.gelu),
            "rope": rope}


def _facade_call(to, op, x, w, b, cos, sin, out):
    kw = {"out": out, "backend": "cpp"}
    if op == "rms_norm":
        return lambda: to.rms_norm(x, w, EPS, **kw)
    if op == "layer_norm":
        return lambda: to.layer_norm(x, w, b, EPS, **kw)
    if op == "softmax":
        return lambda: to.softmax(x, **kw)
    if op in ("silu", "relu", "swiglu"):
        return lambda: getattr(to, op)(x, **kw)
    if op in ("gelu", "gelu_tanh"):
        a = "tanh" if op == "gelu_tanh" else "none"
        return lambda: to.gelu(x, approximate=a, **kw)
    if op == "geglu":
        return lambda: to.geglu(x, **kw)
    if op == "rope":
        return lambda: to.rope(x, cos, sin, **kw)
    raise ValueError(f"unknown op {op!r}; choose from {sorted(OPS)}")


def run(sizes=((8192, 4096),), ops=OPS, dtypes=("float32",), reps: int = 7, threads: int = 2,
        with_torch: bool = True) -> list[dict]:
    """Measure every (op, size, dtype); returns one dict per row (see the module docstring)."""
    import tensor_ops as to
    from tensor_ops.backends import cpp
    C = cpp.native()
    C.set_num_threads(threads)
    torch = None
    if with_torch:
        try:
            import torch
            torch.set_num_threads(threads)
        except ImportError:
            torch = None
    rows_out = []
    for (R, N) in sizes:
        for dt in dtypes:
            rng = np.random.default_rng(0)
            x = rng.standard_normal((R, N), dtype=np.float32).astype(dt)
            w = rng.standard_normal(N, dtype=np.float32).astype(dt)
            b = rng.standard_normal(N, dtype=np.float32).astype(dt)
            # rope: x viewed as (R/T, T, N) with T positions, cos/sin (T, N) broadcast
            T = math.gcd(R, 1024)
            ang = rng.uniform(-3, 3, (T, N)).astype(np.float32)
            cos, sin = np.cos(ang), np.sin(ang)
            npf = _numpy_fns(x, w, b, cos, sin) if dt == "float32" else {}
            thf = _torch_fns(x, w, b, cos, sin) if (torch is not None and dt == "float32") else {}
            tx = torch.from_numpy(x) if thf else None
            for op in ops:
                xin = x.reshape(R // T, T, N) if op == "rope" else x
                glu = op in ("swiglu", "geglu")
                out = np.empty((R, N // 2) if glu else (R, N), dt)
                nbytes = x.nbytes + out.nbytes + (cos.nbytes + sin.nbytes if op == "rope" else 0)
                fns = {"copy": _copy2([x, cos, sin], nbytes),
                       "out": _facade_call(to, op, xin, w, b, cos, sin, out.reshape(xin.shape) if op == "rope" else out),
                       "fresh": _facade_call(to, op, xin, w, b, cos, sin, None)}
                if torch is not None:
                    ts_ = torch.from_numpy(x.reshape(-1).view(np.uint8)[: nbytes // 2]) if nbytes // 2 <= x.nbytes \
                        else torch.from_numpy(np.ones(nbytes // 2, np.uint8))
                    td_ = torch.empty_like(ts_)
                    fns["torch_copy"] = lambda ts_=ts_, td_=td_: td_.copy_(ts_)
                if op in npf:
                    fns["numpy"] = lambda f=npf[op], v=xin: f(v)
                if op in thf:
                    fns["torch"] = lambda f=thf[op], v=tx.reshape(xin.shape): f(v)
                t = _best(fns, reps)
                copy_s = min(t["copy"], t.get("torch_copy", math.inf))
                row = {"op": op, "shape": (R, N), "dtype": dt, "bytes": nbytes, "threads": threads,
                       "isa": C.ISA, "copy_gbps": nbytes / copy_s / 1e9,
                       "out_s": t["out"], "out_gbps": nbytes / t["out"] / 1e9, "ratio_copy": copy_s / t["out"],
                       "fresh_s": t["fresh"], "fresh_gbps": nbytes / t["fresh"] / 1e9,
                       "numpy_s": t.get("numpy"), "torch_s": t.get("torch"),
                       "x_numpy": t["numpy"] / t["fresh"] if "numpy" in t else None,
                       "x_torch": t["torch"] / t["fresh"] if "torch" in t else None}
                rows_out.append(row)
    return rows_out


def small_call(reps: int = 50_000) -> dict:
    """(1, 4096) fp32 rms_norm: direct _cpp call vs the facade (cpp chosen by config)."""
    import tensor_ops as to
    from tensor_ops.backends import cpp
    C = cpp.native()
    old = os.environ.get("TENSOR_OPS_PRIORITY")
    os.environ["TENSOR_OPS_PRIORITY"] = "cpp,numpy"
    try:
        to.reload_config()
        x = np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)
        w = np.ones(4096, np.float32)
        assert to.get_backend("rms_norm") == "cpp", to.get_backend("rms_norm")

        # Blocks of 50 calls, best block: short enough to fit between preemptions on a
        # shared machine, long enough for the timer resolution.
        block = 50

        def loop(f):
            def g():
                for _ in range(block):
                    f()
            return g
        t = _best({"direct": loop(lambda: C.rms_norm(x, w, EPS, None)),
                   "entry": loop(lambda: C._fast_rms_norm(x, w, EPS)),
                   "facade": loop(lambda: to.rms_norm(x, w, EPS)),
                   "np_empty": loop(lambda: np.empty((1, 4096), np.float32))}, max(1, reps // block))
        us = {k: v / block * 1e6 for k, v in t.items()}
        return {"direct_us": us["direct"], "facade_us": us["facade"], "facade_overhead_us": us["facade"] - us["direct"],
                "native_entry_us": us["entry"], "np_empty_us": us["np_empty"]}
    finally:
        if old is None:
            os.environ.pop("TENSOR_OPS_PRIORITY", None)
        else:
            os.environ["TENSOR_OPS_PRIORITY"] = old
        to.reload_config()


def threshold_scan(reps: int = 300) -> list[dict]:
    """rms_norm / silu at growing sizes on 1 vs 2 threads (parallel threshold forced to 0)."""
    from tensor_ops.backends import cpp
    C = cpp.native()
    info = C.build_info()
    res = []
    try:
        for kb in (16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048):
            n = 1024
            rows = max(1, kb * 1024 // 4 // n // 2)  # kb = bytes read + written
            x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
            y = np.empty_like(x)
            w = np.ones(n, np.float32)
            C._set_tuning(0, -1)
            fns = {}
            for th in (1, 2):
                def f(th=th):
                    C.set_num_threads(th)
                    for _ in range(10):
                        C.rms_norm(x, w, EPS, y)
                        C.silu(x, y)
                fns[th] = f
            t = _best(fns, reps // 10)
            res.append({"bytes": 2 * x.nbytes, "t1_us": t[1] / 10 * 1e6, "t2_us": t[2] / 10 * 1e6,
                        "speedup": t[1] / t[2]})
    finally:
        C._set_tuning(info["parallel_threshold_bytes"], -1)
        C.set_num_threads(info["num_threads"])
    return res


def _fmt(v, f="{:.2f}"):
    return "-" if v is None else f.format(v)


def print_table(rows: list[dict]) -> None:
    print(f"{'op':<11}{'shape':>12}{'dtype':>9}{'copy GB/s':>10}{'out GB/s':>10}{'x copy':>8}"
          f"{'fresh GB/s':>11}{'x numpy':>9}{'x torch':>9}")
    for r in rows:
        print(f"{r['op']:<11}{'x'.join(map(str, r['shape'])):>12}{r['dtype']:>9}{r['copy_gbps']:>10.1f}"
              f"{r['out_gbps']:>10.1f}{r['ratio_copy']:>8.2f}{r['fresh_gbps']:>11.1f}"
              f"{_fmt(r['x_numpy'], '{:.1f}'):>9}{_fmt(r['x_torch'], '{:.1f}'):>9}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="*", default=["8192x4096"], help="ROWSxN, e.g. 8192x4096")
    p.add_argument("--ops", nargs="*", default=list(OPS), choices=list(OPS))
    p.add_argument("--dtypes", nargs="*", default=["float32"], choices=["float32", "float16"])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--small", action="store_true", help="only the (1, 4096) call-overhead measurement")
    p.add_argument("--threshold", action="store_true", help="only the 1-vs-2-thread size scan")
    p.add_argument("--no-torch", action="store_true")
    a = p.parse_args(argv)
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
        print(f"(1,4096) fp32 rms_norm: direct _cpp.rms_norm {r['direct_us']:.3f} us, facade {r['facade_us']:.3f} us, "
              f"facade overhead {r['facade_overhead_us']:.3f} us (the native entry _cpp._fast_rms_norm alone "
              f"{r['native_entry_us']:.3f} us; np.empty alone {r['np_empty_us']:.3f} us)")
        return 0
    sizes = [tuple(int(v) for v in s.lower().split("x")) for s in a.sizes]
    print_table(run(sizes, a.ops, a.dtypes, reps=a.reps, threads=a.threads, with_torch=not a.no_torch))
    return 0


if __name__ == "__main__":
    # run as a script from a source checkout: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
