"""Benchmark tensor_ops.tex on CPU: the default.cpp adapters vs reference.torch / torch.optim.

    python benchmarks/bench_tex.py                # rmsnorm 8192x4096 fp32+bf16, Adam 50M params
    python benchmarks/bench_tex.py --quick        # smaller sizes (smoke test)
    python benchmarks/bench_tex.py --json out.json

Reports medians of several timed repeats after a warm-up. The Adam figure is also given as
effective bandwidth (28 bytes per parameter: read g; read+write p, m, v) and as a fraction of
the measured 2-thread copy bandwidth (read + write of a large fp32 buffer).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import tensor_ops
import tensor_ops.tex as tex


STAT = statistics.median  # --stat min: the least-disturbed repeat (shared, noisy machines)


def _median_time(fn, repeat, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return STAT(ts)


def bench_rmsnorm(rows, cols, dtype, repeat):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g).to(dtype)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype)
    out = {}
    for backend in ("torch", "cpp"):
        with tex.use_backend(backend):
            def run():
                tex.rmsnorm_fwd(x, w, 1e-5, None, None, dtype, 0, False)
            out[backend] = _median_time(run, repeat)
    buf = torch.empty_like(x)  # TE passes ln_out=None; with a reused output no page faults are timed
    with tex.use_backend("cpp"):
        out["cpp_ln_out"] = _median_time(lambda: tex.rmsnorm_fwd(x, w, 1e-5, buf, None, dtype, 0, False), repeat)
    info = tensor_ops.get_manager().op_info()["rmsnorm_fwd"]["calls"]
    assert info.get("default.cpp"), f"cpp adapter did not run: {info}"
    gb = 2 * x.numel() * x.element_size() / 1e9
    return {"op": "rmsnorm_fwd", "shape": [rows, cols], "dtype": str(dtype).replace("torch.", ""),
            "reference_torch_ms": out["torch"] * 1e3, "cpp_ms": out["cpp"] * 1e3,
            "speedup": out["torch"] / out["cpp"], "cpp_GBps": gb / out["cpp"],
            "cpp_reused_ln_out_ms": out["cpp_ln_out"] * 1e3, "cpp_reused_ln_out_GBps": gb / out["cpp_ln_out"]}


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_adam(total, ntensors, repeat):
    """Interleaved repeats (copy, cpp, torch.optim each round), so a noisy neighbour hits all
    three alike; ratios are taken per round, then the statistic over rounds."""
    per = total // ntensors
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(per, generator=g) for _ in range(ntensors)]
    grads = [torch.randn(per, generator=g) * 1e-2 for _ in range(ntensors)]
    m = [torch.zeros(per) for _ in range(ntensors)]
    v = [torch.zeros(per) for _ in range(ntensors)]
    noop = torch.zeros(1, dtype=torch.int32)
    tparams = [p.clone().requires_grad_(True) for p in params]
    for p, gr in zip(tparams, grads):
        p.grad = gr
    opt = torch.optim.Adam(tparams, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=True)
    src, dst = torch.ones(total), torch.empty(total)
    step = [0]

    def cpp_step():
        step[0] += 1
        tex.multi_tensor_adam(65536, noop, [grads, params, m, v], 1e-3, 0.9, 0.999, 1e-8, step[0], 1, 1, 0.01)

    with tex.use_backend("cpp"):
        cpp_step(), opt.step(), dst.copy_(src)  # warm-up: first touch of states and buffers
        rows = [(_timed(lambda: dst.copy_(src)), _timed(cpp_step), _timed(opt.step)) for _ in range(repeat)]
    info = tensor_ops.get_manager().op_info()["multi_tensor_adam"]["calls"]
    assert info.get("default.cpp"), f"cpp adapter did not run: {info}"
    del opt, tparams
    with tex.use_backend("torch"):
        ref = _median_time(
            lambda: tex.multi_tensor_adam(65536, noop, [grads, params, m, v], 1e-3, 0.9, 0.999, 1e-8, 5, 1, 1, 0.01),
            2, warmup=1)
    copy_t = STAT([r[0] for r in rows])
    cpp_t = STAT([r[1] for r in rows])
    torch_t = STAT([r[2] for r in rows])
    copy_bw = 2 * total * 4 / copy_t / 1e9
    adam_bw = 28 * total / cpp_t / 1e9
    return {"op": "multi_tensor_adam", "params": total, "tensors": ntensors, "cpp_ms": cpp_t * 1e3,
            "torch_optim_adam_foreach_ms": torch_t * 1e3, "reference_torch_ms": ref * 1e3,
            # ratios: median over rounds whatever the statistic (min of a ratio is its worst round)
            "speedup_vs_torch_adam": statistics.median([r[2] / r[1] for r in rows]),
            "cpp_effective_GBps_28B_per_param": adam_bw, "copy_GBps_2threads": copy_bw,
            "fraction_of_copy_bw": statistics.median([(28 * total / r[1]) / (2 * total * 4 / r[0]) for r in rows])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--stat", choices=("median", "min"), default="median", help="statistic over the repeats")
    a = ap.parse_args(argv)
    global STAT
    STAT = min if a.stat == "min" else statistics.median
    rows, cols, total = (1024, 1024, 2_000_000) if a.quick else (8192, 4096, 50_000_000)
    repeat = a.repeat or (5 if a.quick else 10)
    threads = torch.get_num_threads()
    try:
        from tensor_ops.backends import cpp
        cpp_info = cpp.get_optimization_info()
    except Exception as exc:  # pragma: no cover
        cpp_info = {"available": False, "reason": str(exc)}
    print(f"torch {torch.__version__}, torch threads={threads}, cpp: isa={cpp_info.get('selected_isa')} "
          f"threads={cpp_info.get('num_threads')}, statistic={a.stat}")
    results = [bench_rmsnorm(rows, cols, torch.float32, repeat), bench_rmsnorm(rows, cols, torch.bfloat16, repeat),
               bench_adam(total, 100, max(3, repeat // 2))]
    for r in results:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch_threads": threads, "statistic": a.stat, "cpp": cpp_info, "results": results}, f,
                      indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
