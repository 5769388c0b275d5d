"""GPU benchmark of the CUDA backend against a device-to-device copy and torch.

For each op, dtype and shape (default 8192x8192 and 1x4096) it reports the achieved
bandwidth of tensor_ops' kernel, of a device-to-device copy of the same bytes measured in the
same run, of torch eager (F.rms_norm, F.layer_norm, softmax, F.silu, F.gelu, ...) and of
torch.compile of the same math, plus the host-side latency of one small call.

    python benchmarks/bench_cuda.py                      # all ops, float32 + bfloat16
    python benchmarks/bench_cuda.py --ops rms_norm,softmax --dtypes float16 --json out.json

Goals (issue 5): rms_norm/layer_norm/softmax >= 0.85 of the copy, silu/gelu/swiglu >= 0.90,
>= 1.0x torch.compile, <= 10 us for the small call. Exits with status 2 and the reason when
there is no usable GPU (CuPy missing, no device, kernels not loadable).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPS = ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "gelu_tanh", "relu", "swiglu", "geglu", "rope")
GOAL_COPY = {"rms_norm": 0.85, "layer_norm": 0.85, "softmax": 0.85, "silu": 0.90, "gelu": 0.90,
             "gelu_tanh": 0.90, "relu": 0.90, "swiglu": 0.90, "geglu": 0.90, "rope": 0.85}


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


def _cases(torch, cuda, op, rows, n, dtype):
    """(ours, eager, math_fn_for_compile, bytes) for one op on fresh tensors."""
    import torch.nn.functional as F
    dev = "cuda"
    x = torch.randn(rows, n, device=dev, dtype=dtype)
    w = torch.randn(n, device=dev, dtype=dtype)
    b = torch.randn(n, device=dev, dtype=dtype)
    item = x.element_size()
    eps = 1e-6
    h = n // 2
    if op in ("swiglu", "geglu"):
        y = torch.empty(rows, h, device=dev, dtype=dtype)
        nbytes = rows * n * item + rows * h * item
    else:
        y = torch.empty_like(x)
        nbytes = 2 * rows * n * item
    if op == "rms_norm":
        def math(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
        return (lambda: cuda.rms_norm(x, w, eps, y), lambda: F.rms_norm(x, (n,), w, eps),
                lambda: math(x, w), math, (x, w), nbytes + n * item)
    if op == "layer_norm":
        def math(x, w, b):
            xf = x.float()
            mu = xf.mean(-1, keepdim=True)
            var = (xf - mu).pow(2).mean(-1, keepdim=True)
            return ((xf - mu) * torch.rsqrt(var + eps) * w.float() + b.float()).to(x.dtype)
        return (lambda: cuda.layer_norm(x, w, b, eps, y), lambda: F.layer_norm(x, (n,), w, b, eps),
                lambda: math(x, w, b), math, (x, w, b), nbytes + 2 * n * item)
    if op == "softmax":
        def math(x):
            return torch.softmax(x.float(), -1).to(x.dtype)
        return (lambda: cuda.softmax(x, y), lambda: torch.softmax(x, -1), lambda: math(x), math, (x,), nbytes)
    if op in ("silu", "relu", "gelu", "gelu_tanh"):
        eager = {"silu": F.silu, "relu": F.relu, "gelu": lambda t: F.gelu(t),
                 "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[op]
        ours = {"silu": lambda: cuda.silu(x, y), "relu": lambda: cuda.relu(x, y),
                "gelu": lambda: cuda.gelu(x, "none", y), "gelu_tanh": lambda: cuda.gelu(x, "tanh", y)}[op]

        def math(x):
            xf = x.float()
            return eager(xf).to(x.dtype)
        return ours, lambda: eager(x), lambda: math(x), math, (x,), nbytes
    if op in ("swiglu", "geglu"):
        act = F.silu if op == "swiglu" else F.gelu

        def math(x):
            xf = x.float()
            return (act(xf[:, :h]) * xf[:, h:]).to(x.dtype)
        ours = (lambda: cuda.swiglu(x, y)) if op == "swiglu" else (lambda: cuda.geglu(x, "none", y))
        return ours, lambda: act(x[:, :h]) * x[:, h:], lambda: math(x), math, (x,), nbytes
    if op == "rope":
        T = min(rows, 4096)
        cos = torch.randn(T, n, device=dev, dtype=torch.float32)
        sin = torch.randn(T, n, device=dev, dtype=torch.float32)
        pos = torch.arange(rows, device=dev) % T

        def math(x, cos, sin):
            xf = x.float()
            rot = torch.cat([-xf[:, h:], xf[:, :h]], -1)
            return (xf * cos[pos] + rot * sin[pos]).to(x.dtype)
        return (lambda: cuda.rope(x, cos, sin, False, y), lambda: math(x, cos, sin),
                lambda: math(x, cos, sin), math, (x, cos, sin), nbytes + 2 * T * n * 4)
    raise ValueError(op)


def _time_gpu(torch, fn, iters: int, warmup: int) -> float:
    """Seconds per call, CUDA events on the current stream (GPU time of back-to-back calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _time_host(torch, fn, iters: int) -> float:
    """Seconds per call including Python/launch overhead, synchronised once at the end."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma list of float32,float16,bfloat16")
    ap.add_argument("--shapes", default="8192x8192,1x4096", help="comma list of ROWSxN")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = sorted(set(ops) - set(OPS))
    if bad:
        ap.error(f"unknown ops {bad}; choose from {list(OPS)}")
    shapes = []
    for s in args.shapes.split(","):
        try:
            r, n = (int(v) for v in s.lower().split("x"))
        except ValueError:
            ap.error(f"--shapes: {s!r} is not ROWSxN")
        shapes.append((r, n))
    cuda, torch = _setup()
    dtypes = []
    for d in args.dtypes.split(","):
        if d.strip() not in ("float32", "float16", "bfloat16"):
            ap.error(f"--dtypes: {d!r}; choose from float32, float16, bfloat16")
        dtypes.append(getattr(torch, d.strip()))

    info = cuda.get_cuda_info()
    dev = info["devices"][0] if info["devices"] else {}
    print(f"device: {dev.get('name')} (sm {dev.get('compute_capability')}), kernels from {info['kernels_from']}, "
          f"torch {torch.__version__}, cupy {info.get('cupy')}")
    results = []
    hdr = (f"{'op':<11}{'dtype':<9}{'shape':>11}{'ours GB/s':>10}{'copy GB/s':>10}{'/copy':>7}"
           f"{'eager GB/s':>11}{'x eager':>8}{'compile GB/s':>13}{'x comp':>7}{'host us':>8}  goals")
    print(hdr)
    for dtype in dtypes:
        for rows, n in shapes:
            src = torch.randn(rows, n, device="cuda", dtype=dtype)
            dst = torch.empty_like(src)
            copy_bytes = 2 * src.numel() * src.element_size()
            t_copy = _time_gpu(torch, lambda: dst.copy_(src), args.iters, args.warmup)
            copy_gbs = copy_bytes / t_copy / 1e9
            for op in ops:
                ours, eager, _, math, margs, nbytes = _cases(torch, cuda, op, rows, n, dtype)
                t_ours = _time_gpu(torch, ours, args.iters, args.warmup)
                t_eager = _time_gpu(torch, eager, args.iters, args.warmup)
                t_comp, comp_note = None, ""
                if not args.no_compile:
                    try:
                        cfn = torch.compile(math, dynamic=False)
                        t_comp = _time_gpu(torch, lambda: cfn(*margs), args.iters, args.warmup)
                    except Exception as exc:  # noqa: BLE001 - report, keep measuring
                        comp_note = f"compile failed: {type(exc).__name__}: {str(exc)[:80]}"
                host_us = _time_host(torch, ours, max(args.iters, 200)) * 1e6
                ours_gbs = nbytes / t_ours / 1e9
                r = {"op": op, "dtype": str(dtype).replace("torch.", ""), "shape": [rows, n],
                     "bytes": nbytes, "ours_gbs": ours_gbs, "copy_gbs": copy_gbs,
                     "ratio_copy": ours_gbs / copy_gbs, "eager_gbs": nbytes / t_eager / 1e9,
                     "speedup_eager": t_eager / t_ours,
                     "compile_gbs": nbytes / t_comp / 1e9 if t_comp else None,
                     "speedup_compile": t_comp / t_ours if t_comp else None,
                     "ours_us": t_ours * 1e6, "host_us": host_us, "note": comp_note}
                goals = []
                small = rows * n <= 1 << 16
                if small:
                    goals.append("small<=10us " + ("ok" if host_us <= 10 else "MISS"))
                else:
                    goals.append(f"copy>={GOAL_COPY[op]:.2f} " + ("ok" if r["ratio_copy"] >= GOAL_COPY[op] else "MISS"))
                    if t_comp:
                        goals.append("compile>=1x " + ("ok" if r["speedup_compile"] >= 1.0 else "MISS"))
                r["goals"] = goals
                results.append(r)
                comp = f"{r['compile_gbs']:>13.1f}{r['speedup_compile']:>7.2f}" if t_comp else f"{'-':>13}{'-':>7}"
                print(f"{op:<11}{r['dtype']:<9}{f'{rows}x{n}':>11}{ours_gbs:>10.1f}{copy_gbs:>10.1f}"
                      f"{r['ratio_copy']:>7.2f}{r['eager_gbs']:>11.1f}{r['speedup_eager']:>8.2f}{comp}"
                      f"{host_us:>8.1f}  {'; '.join(goals)} {comp_note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev, "cuda_info": info, "results": results}, indent=2,
                                              default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
