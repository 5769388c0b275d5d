"""Benchmark of the OpenCL backend against the C++ backend, NumPy, torch (CPU) and a 2-thread
memory copy of the same bytes, all measured in the same run.

    python benchmarks/bench_opencl.py                          # 8192x4096 float32, all ops
    python benchmarks/bench_opencl.py --ops rms_norm,silu --rows 1024 --json out.json

Per op it reports the best-of-N time and GB/s (bytes read + written) of each backend, the
fraction of the copy's GB/s, and opencl/cpp (goal, issue 4: >= 0.6 on PoCL). It also measures
the warm program load (a fresh process whose binary cache is warm: context + 4 programs), the
first call after it, the per-call host overhead of a (1, 4096) rms_norm, and the two
host-array strategies (USE_HOST_PTR vs copies through pooled device buffers). Backends are
timed interleaved (round-robin) so a noisy machine hurts them alike. Exits 2 with the reason
when the OpenCL backend is unavailable.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPS = ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "gelu_tanh", "relu", "swiglu",
       "geglu", "rope")
GOAL_VS_CPP = 0.6


def _impl_fn(op: str, backend: str):
    import tensor_ops as to
    impl_id = "reference.numpy" if backend == "numpy" else f"default.{backend}"
    try:
        impl = to.get_registry().get_impl(op, impl_id, "facade")
    except KeyError:
        return None, f"{backend} has no {op}"
    ok, reason = to.get_manager().availability(impl)
    return (impl.fn, "") if ok else (None, reason)


def _args(op: str, rows: int, n: int, dtype, rng):
    """(facade op, args without out, out shape, bytes moved)."""
    x = rng.standard_normal((rows, n)).astype(dtype)
    item = x.itemsize
    if op in ("swiglu", "geglu"):
        extra = ("none",) if op == "geglu" else ()
        return op, (x, *extra), (rows, n // 2), rows * n * item + rows * (n // 2) * item
    w = (rng.standard_normal(n) + 1).astype(dtype)
    nb = 2 * rows * n * item
    if op == "rms_norm":
        return op, (x, w, 1e-6), x.shape, nb
    if op == "layer_norm":
        return op, (x, w, rng.standard_normal(n).astype(dtype), 1e-5), x.shape, nb
    if op in ("gelu", "gelu_tanh"):
        return "gelu", (x, "tanh" if op == "gelu_tanh" else "none"), x.shape, nb
    if op == "rope":
        ang = rng.uniform(-3, 3, (rows, n // 2))
        c = np.ascontiguousarray(np.concatenate([np.cos(ang)] * 2, -1), np.float32)
        s = np.ascontiguousarray(np.concatenate([np.sin(ang)] * 2, -1), np.float32)
        return op, (x, c, s, False), x.shape, nb + 2 * c.nbytes
    return op, (x,), x.shape, nb


def _torch_fn(op, args, out):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(2)
    t = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
    o = torch.from_numpy(out)
    x = t[0]
    n = x.shape[-1]
    if op == "rms_norm":
        return lambda: o.copy_(F.rms_norm(x, (n,), t[1], t[2]))
    if op == "layer_norm":
        return lambda: o.copy_(F.layer_norm(x, (n,), t[1], t[2], t[3]))
    if op == "softmax":
        return lambda: torch.softmax(x, -1, out=o)
    if op == "silu":
        return lambda: F.silu(x)
    if op == "relu":
        return lambda: torch.relu(x)
    if op == "gelu":
        return lambda: F.gelu(x, approximate=t[1])
    if op == "swiglu":
        return lambda: F.silu(x[:, :n // 2]) * x[:, n // 2:]
    if op == "geglu":
        return lambda: F.gelu(x[:, :n // 2]) * x[:, n // 2:]
    return None


def _copy2(src: np.ndarray, dst: np.ndarray):
    """Copy with two threads (NumPy releases the GIL), the bandwidth yardstick."""
    half = src.shape[0] // 2
    s, d = src.reshape(src.shape[0], -1), dst.reshape(dst.shape[0], -1)

    def run():
        ts = [threading.Thread(target=np.copyto, args=(d[:half], s[:half])),
              threading.Thread(target=np.copyto, args=(d[half:], s[half:]))]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    return run


def _time_round_robin(fns: dict, repeats: int) -> dict:
    for f in fns.values():
        f()                                   # warm-up (page faults, kernel specialisation)
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def _warm_load(cache: str) -> dict:
    """A fresh process with a warm binary cache: state creation and first-call times."""
    code = ("import time, json, numpy as np; t0 = time.perf_counter(); "
            "from tensor_ops.backends import opencl as m; st = m._state(); t1 = time.perf_counter(); "
            "m.rms_norm(np.ones((1, 4096), np.float32), np.ones(4096, np.float32), 1e-6, None); "
            "t2 = time.perf_counter(); print(json.dumps({'load_ms': st.load_ms, "
            "'state_ms': (t1 - t0) * 1e3, 'first_call_ms': (t2 - t1) * 1e3, **m._STATS}))")
    env = dict(os.environ, TENSOR_OPS_OPENCL_CACHE=cache)
    out = []
    for _ in range(2):   # the first run may build (cold cache); the second is the warm figure
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        if r.returncode:
            return {"error": r.stderr[-500:]}
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {"cold": out[0], "warm": out[1]}


def run(rows: int = 8192, n: int = 4096, dtype: str = "float32", ops=OPS, repeats: int = 7,
        backends=("opencl", "cpp", "numpy", "torch"), small: bool = True,
        load: bool = True) -> list[dict]:
    """Measure; returns one dict per (op, backend) plus 'copy', 'load', 'small' and 'mode'
    rows. Raises RuntimeError when the OpenCL backend is unavailable."""
    from tensor_ops.backends import opencl as ocl
    ok, reason = ocl.availability()
    if not ok:
        raise RuntimeError(f"opencl unavailable: {reason}")
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    rows_out: list[dict] = []
    dev = ocl.get_opencl_info()["chosen"]
    src = rng.standard_normal((rows, n)).astype(dt)
    dst = np.empty_like(src)
    tcopy = _time_round_robin({"copy": _copy2(src, dst)}, repeats)["copy"]
    copy_gbs = 2 * src.nbytes / tcopy / 1e9
    rows_out.append({"kind": "copy", "shape": [rows, n], "dtype": dtype, "ms": tcopy * 1e3,
                     "GBps": copy_gbs, "device": dev["name"]})
    for op in ops:
        fop, args, oshape, nbytes = _args(op, rows, n, dt, rng)
        fns, skipped = {}, {}
        for b in backends:
            out = np.empty(oshape, dt)
            if b == "torch":
                f = _torch_fn(op, args, out)
                if f is None:
                    skipped[b] = "no torch equivalent / torch missing"
                else:
                    fns[b] = f
                continue
            fn, why = _impl_fn(fop, b)
            if fn is None:
                skipped[b] = why
                continue
            fns[b] = (lambda fn=fn, out=out: fn(*args, out))
        fns["copy"] = _copy2(src, dst)   # re-measured next to each op: the machine may be shared
        best = _time_round_robin(fns, repeats)
        tc = best.pop("copy")
        for b, t in best.items():
            gbs = nbytes / t / 1e9
            rows_out.append({"kind": "op", "op": op, "backend": b, "dtype": dtype,
                             "shape": [rows, n], "ms": t * 1e3, "GBps": gbs,
                             "frac_of_copy": gbs / (2 * src.nbytes / tc / 1e9),
                             "copy_ms": tc * 1e3})
        if "opencl" in best and "cpp" in best:
            rows_out.append({"kind": "ratio", "op": op, "opencl_vs_cpp": best["cpp"] / best["opencl"],
                             "goal": GOAL_VS_CPP})
        for b, why in skipped.items():
            rows_out.append({"kind": "skip", "op": op, "backend": b, "reason": why})
    # host strategies: USE_HOST_PTR (zero copy on CPU devices) vs pooled device buffers
    x = rng.standard_normal((rows, n)).astype(dt)
    w = np.ones(n, dt)
    out = np.empty_like(x)
    modes = {}
    for mode in ("hostptr", "copy"):
        ocl._HOST_MODE = mode
        modes[mode] = _time_round_robin({mode: lambda: ocl.rms_norm(x, w, 1e-6, out)}, 3)[mode]
    ocl._HOST_MODE = None
    rows_out.append({"kind": "mode", "op": "rms_norm", **{f"{k}_ms": v * 1e3 for k, v in modes.items()}})
    if small:
        import tensor_ops as to
        xs = rng.standard_normal((1, 4096)).astype(np.float32)
        ws = np.ones(4096, np.float32)
        os_ = np.empty_like(xs)
        fns = {}
        for b in ("opencl", "cpp", "numpy"):
            fn, _ = _impl_fn("rms_norm", b)
            if fn is not None:
                fns[f"{b}.fn"] = (lambda fn=fn: fn(xs, ws, 1e-6, os_))
        fns["opencl.facade"] = lambda: to.rms_norm(xs, ws, 1e-6, out=os_, backend="opencl")
        per = {}
        for k, f in fns.items():
            for _ in range(50):
                f()
            ts = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(200):
                    f()
                ts.append((time.perf_counter() - t0) / 200)
            per[k] = sorted(ts)[len(ts) // 2] * 1e6
        rows_out.append({"kind": "small", "op": "rms_norm", "shape": [1, 4096], "us_per_call": per})
    if load:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            rows_out.append({"kind": "load", **_warm_load(d)})
    return rows_out


def _print(rows: list[dict]) -> None:
    for r in rows:
        k = r["kind"]
        if k == "copy":
            print(f"device: {r['device']}   2-thread copy {r['shape'][0]}x{r['shape'][1]} "
                  f"{r['dtype']}: {r['ms']:.2f} ms  {r['GBps']:.1f} GB/s")
            print(f"{'op':<11} {'backend':<8} {'ms':>8} {'GB/s':>7} {'of copy':>8}")
        elif k == "op":
            print(f"{r['op']:<11} {r['backend']:<8} {r['ms']:8.2f} {r['GBps']:7.1f} "
                  f"{r['frac_of_copy']:8.2f}")
        elif k == "ratio":
            verdict = "ok" if r["opencl_vs_cpp"] >= r["goal"] else "BELOW GOAL"
            print(f"{r['op']:<11} opencl/cpp = {r['opencl_vs_cpp']:.2f}  (goal >= {r['goal']}) {verdict}")
        elif k == "skip":
            print(f"{r['op']:<11} {r['backend']:<8} skipped: {r['reason']}")
        elif k == "mode":
            print(f"host arrays, rms_norm: USE_HOST_PTR {r['hostptr_ms']:.2f} ms, "
                  f"pooled copies {r['copy_ms']:.2f} ms")
        elif k == "small":
            print("(1, 4096) rms_norm per call: " + ", ".join(
                f"{b} {us:.1f} us" for b, us in r["us_per_call"].items()))
        elif k == "load":
            if "error" in r:
                print(f"warm load: failed: {r['error']}")
            else:
                w = r["warm"]
                print(f"program load, warm cache (fresh process): state {w['state_ms']:.1f} ms "
                      f"(programs+context {w['load_ms']:.1f} ms, {w['hits']} hits, "
                      f"{w['builds']} builds), first call {w['first_call_ms']:.1f} ms; cold: "
                      f"{r['cold']['load_ms']:.1f} ms with {r['cold']['builds']} builds")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--backends", default="opencl,cpp,numpy,torch")
    p.add_argument("--no-load", action="store_true", help="skip the warm-load subprocess")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args(argv)
    try:
        rows = run(a.rows, a.n, a.dtype, tuple(a.ops.split(",")), a.repeats,
                   tuple(a.backends.split(",")), load=not a.no_load)
    except RuntimeError as exc:
        print(f"bench_opencl: {exc}", file=sys.stderr)
        return 2
    _print(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
