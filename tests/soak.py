"""Soak test (issue 8): threads × mixed ops × many calls through the resolver, with the
configuration rewritten and reloaded underneath them.

Run by hand (the full run; prints a JSON summary, exit status 1 on any failure)::

    PYTHONPATH=. python tests/soak.py                      # 4 threads × 100,000 calls each
    PYTHONPATH=. python tests/soak.py --threads 4 --calls 25000 --no-tex

What it does: each worker thread calls a random facade op (and, when torch is importable, a
tex op) on small random inputs, on a random backend order — no override (the configured
policy; plain inputs take the fast path), ``backend=`` keyword, or a ``use_backend()``
block — with the inputs in random layouts (contiguous, strided, ``out=``). One reloader
thread keeps rewriting backend.json atomically with a different valid configuration and
calling ``tensor_ops.reload_config()``. Every ``--check-every``-th call is compared with the
NumPy reference. Pass criteria: no exception in any thread, no fallback warning (nothing
failed), every sampled result right, resident memory growth after warm-up below ``--max-rss-mb``
(default 20 MB). ``tests/test_soak.py`` runs a short version in CI.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tensor_ops as to  # noqa: E402
from tensor_ops import BackendFallbackWarning  # noqa: E402
from tensor_ops._build.jsonfile import atomic_write as atomic_write_json  # noqa: E402

from tensor_ops._ops import FACADE_OPS  # noqa: E402


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; falls back to the peak from getrusage)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_backends() -> list[str]:
    m = to.get_manager()
    out = []
    for b in ("numpy", "cpp", "opencl", "cuda"):
        impls = [i for i in m.registry.all_impls() if i.backend == b and i.api == "facade"]
        if impls and m.availability(impls[0])[0]:
            out.append(b)
    return out


def config_variants(backends: list[str]) -> list[dict]:
    natives = [b for b in backends if b != "numpy"]
    v = [{"schema_version": 1},
         {"schema_version": 1, "priority": ["numpy"]},
         {"schema_version": 1, "priority": natives[::-1] + ["numpy"]},
         {"schema_version": 1, "per_op": {"silu": ["numpy"], "rms_norm": natives[:1] + ["numpy"]}},
         {"schema_version": 1, "strict": False, "priority": natives + ["numpy"]}]
    v.append({"schema_version": 1, "disabled": ["cuda"], "deny_vendors": ["acme"]})
    return v


class _Inputs:
    """Pre-built inputs per (op, dtype, layout): the soak measures the library, not NumPy's RNG."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.cases = []
        for dt in (np.float32, np.float16):
            for rows, n in ((1, 64), (3, 258), (8, 1024), (2, 4096)):   # 258: odd halves
                x = rng.standard_normal((rows, n)).astype(dt)
                w = (1 + 0.1 * rng.standard_normal(n)).astype(dt)
                ang = rng.uniform(-3, 3, (rows, n // 2))
                self.cases.append({"x": x, "xs": np.repeat(x, 2, axis=0)[::2], "w": w,
                                   "cos": np.cos(ang).astype(np.float32), "sin": np.sin(ang).astype(np.float32),
                                   "b": rng.standard_normal((n, 16)).astype(dt)})

    def call(self, op: str, c: dict, layout: str, backend):
        x = c["xs"] if layout == "strided" else c["x"]
        kw = {} if backend is None else {"backend": backend}
        if op in ("add_rms_norm", "add_layer_norm"):     # x is its own residual; (normed, s) side by side
            if layout == "out":
                kw["out"] = (np.empty(x.shape, x.dtype), np.empty(x.shape, x.dtype))
            extra = (c["w"],) if op == "add_rms_norm" else (c["w"], c["w"])
            return np.concatenate(getattr(to, op)(x, x, *extra, **kw), -1), (x, *extra)
        if layout == "out":
            shape = x.shape[:-1] + ((x.shape[-1] // 2,) if op in ("swiglu", "geglu") else
                                    (16,) if op == "matmul" else (x.shape[-1],))
            kw["out"] = np.empty(shape, x.dtype)
        if op == "rms_norm":
            return to.rms_norm(x, c["w"], **kw), (x, c["w"])
        if op == "layer_norm":
            return to.layer_norm(x, c["w"], c["w"], **kw), (x, c["w"], c["w"])
        if op == "rope":
            return to.rope(x, c["cos"], c["sin"], **kw), (x, c["cos"], c["sin"])
        if op == "matmul":
            return to.matmul(x, c["b"], **kw), (x, c["b"])
        return getattr(to, op)(x, **kw), (x,)


def _tex_call(rng, torch, tex):
    x = torch.from_numpy(rng.standard_normal((4, 128)).astype(np.float32))
    w = torch.ones(128)
    if rng.random() < 0.5:
        out, _, rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tex.DType.kFloat32, 0, False)
        want = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5)
        return float((out - want).abs().max())
    y = tex.gelu(x, None)
    return float((y - torch.nn.functional.gelu(x, approximate="tanh")).abs().max())


def run(threads: int = 4, calls: int = 100_000, config_path: Path | None = None, check_every: int = 50,
        reload_every_s: float = 0.005, tex: bool = True, seed: int = 0, warmup_frac: float = 0.05,
        max_rss_mb: float = 20.0, progress: bool = False) -> dict:
    """Run the soak; ``calls`` is per thread. Returns a summary dict with ``ok``."""
    own_tmp = None
    if config_path is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="tensor_ops_soak_")
        config_path = Path(own_tmp.name) / "backend.json"
    old_cfg = os.environ.get("TENSOR_OPS_CONFIG")
    os.environ["TENSOR_OPS_CONFIG"] = str(config_path)
    to.reload_config()
    backends = available_backends()
    variants = config_variants(backends)
    orders = [None, None, None] + backends + [",".join(backends[::-1])]
    # a backend forced on its own serves only its ops (it is never silently replaced)
    serves = {b: {i.op_name for i in to.get_registry().all_impls() if i.backend == b and i.api == "facade"}
              for b in backends}
    torch = texmod = None
    if tex:
        try:
            import torch
            import tensor_ops.tex as texmod
        except ImportError:
            tex = False

    errors: list = []
    bad: list = []
    counts = [0] * threads
    checked = [0] * threads
    stop = threading.Event()
    warm = threading.Barrier(threads + 1)
    rss = {}
    reloads = [0]

    def worker(i: int):
        inp = _Inputs(seed * 100 + i)
        rng = inp.rng
        warm_n = max(1, int(calls * warmup_frac))
        try:
            for k in range(calls):
                if k == warm_n:
                    warm.wait(timeout=600)          # all threads warm: RSS baseline taken here
                    warm.wait(timeout=600)
                if tex and rng.random() < 0.02:
                    err = _tex_call(rng, torch, texmod)
                    if err > 1e-4:
                        bad.append(f"tex result off by {err}")
                    counts[i] += 1
                    continue
                op = FACADE_OPS[rng.integers(len(FACADE_OPS))]
                c = inp.cases[rng.integers(len(inp.cases))]
                layout = ("plain", "plain", "strided", "out")[rng.integers(4)]
                order = orders[rng.integers(len(orders))]
                if order in serves and op not in serves[order]:
                    order = f"{order},numpy"     # an order: the next backend serves (no warning: none of it)
                if order is not None and rng.random() < 0.5:
                    with to.use_backend(order):
                        y, args = inp.call(op, c, layout, None)
                else:
                    y, args = inp.call(op, c, layout, order)
                counts[i] += 1
                if k % check_every == 0:
                    ref, _ = inp.call(op, c, layout, "numpy")
                    tol = 2e-2 if c["x"].dtype == np.float16 else 1e-4
                    if y.shape != ref.shape or y.dtype != ref.dtype or not np.allclose(
                            y.astype(np.float64), ref.astype(np.float64), rtol=tol,
                            atol=tol * (1 + (op == "matmul") * 30)):
                        bad.append(f"{op} {layout} order={order}: max diff "
                                   f"{np.abs(y.astype(np.float64) - ref.astype(np.float64)).max()}")
                    checked[i] += 1
                if progress and i == 0 and k % 10000 == 0:
                    print(f"  thread 0: {k}/{calls} calls, rss {rss_bytes() / 2**20:.1f} MB", file=sys.stderr)
        except BaseException as exc:  # recorded, the run fails
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")
            try:
                warm.abort()
            except Exception:
                pass

    def reloader():
        i = 0
        while not stop.is_set():
            atomic_write_json(config_path, variants[i % len(variants)])
            try:
                to.reload_config()
                reloads[0] += 1
            except Exception as exc:
                errors.append(f"reloader: {type(exc).__name__}: {exc}")
                return
            i += 1
            stop.wait(reload_every_s)

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", BackendFallbackWarning)
        ws = [threading.Thread(target=worker, args=(i,), name=f"soak-{i}") for i in range(threads)]
        rl = threading.Thread(target=reloader, name="soak-reloader")
        for t in ws:
            t.start()
        rl.start()
        try:
            warm.wait(timeout=600)
            gc.collect()
            rss["baseline"] = rss_bytes()
            warm.wait(timeout=600)
        except threading.BrokenBarrierError:
            pass
        for t in ws:
            t.join()
        stop.set()
        rl.join()
    elapsed = time.perf_counter() - t0
    gc.collect()
    rss["end"] = rss_bytes()
    fallbacks = [str(w.message) for w in rec if issubclass(w.category, BackendFallbackWarning)]
    growth_mb = (rss["end"] - rss.get("baseline", rss["end"])) / 2**20
    info = to.get_backend_info()
    served: dict = {}
    for o in info.get("ops", {}).values():
        for impl, n in o.get("calls", {}).items():
            served[impl] = served.get(impl, 0) + n
    if old_cfg is None:
        os.environ.pop("TENSOR_OPS_CONFIG", None)
    else:
        os.environ["TENSOR_OPS_CONFIG"] = old_cfg
    to.reload_config()
    if own_tmp is not None:
        own_tmp.cleanup()
    summary = {
        "threads": threads, "calls_per_thread": calls, "calls": sum(counts), "checked": sum(checked),
        "reloads": reloads[0], "backends": backends, "served_by": served, "seconds": round(elapsed, 2),
        "calls_per_second": round(sum(counts) / elapsed) if elapsed else None,
        "rss_baseline_mb": round(rss.get("baseline", 0) / 2**20, 1), "rss_end_mb": round(rss["end"] / 2**20, 1),
        "rss_growth_mb": round(growth_mb, 2), "errors": errors[:10], "wrong_results": bad[:10],
        "fallback_warnings": fallbacks[:10],
    }
    summary["ok"] = (not errors and not bad and not fallbacks and sum(counts) == threads * calls
                     and growth_mb < max_rss_mb)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--calls", type=int, default=100_000, help="calls per thread (default 100,000)")
    ap.add_argument("--check-every", type=int, default=50, help="compare every Nth call with NumPy")
    ap.add_argument("--reload-ms", type=float, default=5.0, help="pause between config rewrites+reloads")
    ap.add_argument("--max-rss-mb", type=float, default=20.0)
    ap.add_argument("--no-tex", action="store_true", help="facade ops only (no torch)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    s = run(a.threads, a.calls, None, a.check_every, a.reload_ms / 1000, not a.no_tex, a.seed,
            max_rss_mb=a.max_rss_mb, progress=True)
    print(json.dumps(s, indent=1))
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
