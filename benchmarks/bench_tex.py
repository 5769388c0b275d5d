"""tensor_ops.tex on CPU: the default.cpp adapters vs reference.torch / torch.optim, a preset of
the one benchmark engine (``tensor_ops/_bench.py``: its timer, statistic and ceiling).

    python benchmarks/bench_tex.py                # rmsnorm 8192x4096 fp32+bf16, Adam 50M params
    python benchmarks/bench_tex.py --quick        # smaller sizes (smoke test)
    python benchmarks/bench_tex.py --json out.json
    python benchmarks/bench_tex.py --stat min     # show best times instead of medians
    python benchmarks/bench_tex.py --kernels      # the training kernels (tex_train.cpp), 8192x4096 fp32 + bf16

The rows of one measurement run in interleaved rounds with the ceiling (a streaming-store
copy of the op's own input pages moving the op's bytes; memcpy, labelled, without
``_cpp.stream_copy``). ``--stat`` picks the time shown (median or best of the rounds); every
ratio (speedup, × ceiling) is the median of per-round ratios whatever ``--stat`` says. Adam
moves 28 bytes per parameter (read g; read + write p, m, v).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensor_ops  # noqa: E402
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops import _bench  # noqa: E402

STAT = "median_s"          # or "best_s" (--stat min)


def _measure(fns: dict, srcs, moved: int, repeat: int) -> tuple[dict, str]:
    """The engine's statistic of ``fns`` timed in ``repeat`` rounds with the ceiling copy."""
    fn, _, label = _bench.ceiling_copy(srcs, moved // 2)
    return _bench.stats(_bench.time_rounds({**fns, "ceiling": fn}, 0, repeat), moved), label


def bench_rmsnorm(rows, cols, dtype, repeat):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g).to(dtype)
    w = (torch.rand(cols, generator=g) + 0.5).to(dtype)
    buf = torch.empty_like(x)  # TE passes ln_out=None; with a reused output no page faults are timed

    def call(backend, ln_out=None):
        def run():
            with tex.use_backend(backend):
                tex.rmsnorm_fwd(x, w, 1e-5, ln_out, None, dtype, 0, False)
        return run
    moved = 2 * x.numel() * x.element_size()
    st, label = _measure({"torch": call("torch"), "cpp": call("cpp"), "cpp_ln_out": call("cpp", buf)}, [x], moved,
                         repeat)
    info = tensor_ops.get_manager().op_info()["rmsnorm_fwd"]["calls"]
    assert info.get("default.cpp"), f"cpp adapter did not run: {info}"
    return {"op": "rmsnorm_fwd", "shape": [rows, cols], "dtype": str(dtype).replace("torch.", ""),
            "reference_torch_ms": st["torch"][STAT] * 1e3, "cpp_ms": st["cpp"][STAT] * 1e3,
            "speedup": st["cpp"]["vs"]["torch"], "cpp_GBps": moved / st["cpp"][STAT] / 1e9,
            "cpp_x_ceiling": st["cpp"]["x_ceiling"], "cpp_reused_ln_out_ms": st["cpp_ln_out"][STAT] * 1e3,
            "cpp_reused_ln_out_GBps": moved / st["cpp_ln_out"][STAT] / 1e9, "ceiling": label}


def bench_adam(total, ntensors, repeat):
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
    step = [0]

    def cpp_step():
        step[0] += 1
        tex.multi_tensor_adam(65536, noop, [grads, params, m, v], 1e-3, 0.9, 0.999, 1e-8, step[0], 1, 1, 0.01)

    moved = 28 * total
    with tex.use_backend("cpp"):
        st, label = _measure({"cpp": cpp_step, "torch.optim": opt.step}, grads + params + m + v, moved, repeat)
    info = tensor_ops.get_manager().op_info()["multi_tensor_adam"]["calls"]
    assert info.get("default.cpp"), f"cpp adapter did not run: {info}"
    del opt, tparams
    with tex.use_backend("torch"):
        ref = _bench.time_rounds({"reference.torch": lambda: tex.multi_tensor_adam(
            65536, noop, [grads, params, m, v], 1e-3, 0.9, 0.999, 1e-8, 5, 1, 1, 0.01)}, 0, 2)["reference.torch"]
    ref_s = min(ref.times) if STAT == "best_s" else statistics.median(ref.times)
    return {"op": "multi_tensor_adam", "params": total, "tensors": ntensors, "cpp_ms": st["cpp"][STAT] * 1e3,
            "torch_optim_adam_foreach_ms": st["torch.optim"][STAT] * 1e3, "reference_torch_ms": ref_s * 1e3,
            "speedup_vs_torch_adam": st["cpp"]["vs"]["torch.optim"],
            "cpp_effective_GBps_28B_per_param": moved / st["cpp"][STAT] / 1e9,
            "ceiling_GBps": st["ceiling"]["gbps"], "fraction_of_ceiling": st["cpp"]["x_ceiling"], "ceiling": label}


def _train_cases(rows, cols, dtype):
    """(op, fn(backend) -> callable, bytes it must move, source arrays for the ceiling) per training kernel."""
    g = torch.Generator().manual_seed(0)
    es = torch.tensor([], dtype=dtype).element_size()
    n = rows * cols
    x = torch.randn(rows, cols, generator=g).to(dtype)
    dy = torch.randn(rows, cols, generator=g).to(dtype)
    dyh = torch.randn(rows, cols // 2, generator=g).to(dtype)
    cases = []
    def d_call(fn, grad):
        return lambda: (lambda: fn(grad, x, None))
    for op in ("dgelu", "dsilu", "drelu", "dqgelu", "dsrelu", "dbias_dgelu"):
        cases.append((op, d_call(getattr(tex, op), dy), 3 * n * es, [dy, x]))
    for op in ("dswiglu", "dgeglu"):
        cases.append((op, d_call(getattr(tex, op), dyh), 5 * n * es // 2, [dyh, x]))
    x4 = x.view(1, 16, rows // 16, cols)
    mask = (torch.rand(1, 1, rows // 16, cols, generator=g) < 0.2).to(torch.uint8)
    y4 = torch.softmax(x4.float(), -1).to(dtype)
    dy4 = dy.view_as(x4)
    cases.append(("scaled_softmax_forward", lambda: (lambda: tex.scaled_softmax_forward(x4, 0.125)), 2 * n * es, [x]))
    cases.append(("scaled_masked_softmax_forward", lambda: (lambda: tex.scaled_masked_softmax_forward(x4, mask, 0.125)),
                  2 * n * es + mask.numel(), [x]))
    sq = int(n ** 0.5) if int(n ** 0.5) ** 2 == n else cols
    xc = x.view(-1, sq, sq) if n % (sq * sq) == 0 else x.view(-1, cols, cols)
    tri = xc.shape[1] * (xc.shape[1] + 1) // 2 * xc.shape[0]   # causal: the lower triangle is read, all written
    cases.append(("scaled_upper_triang_masked_softmax_forward",
                  lambda: (lambda: tex.scaled_upper_triang_masked_softmax_forward(xc, 0.125)), (tri + n) * es, [x]))
    cases.append(("scaled_softmax_backward", lambda: (lambda: tex.scaled_softmax_backward(dy4, y4, 0.125)),
                  3 * n * es, [dy, y4]))
    d, h = 128, max(1, cols // 128)
    s = rows
    xr = x.view(s, 1, h, d)
    freqs = torch.randn(s, 1, 1, d, generator=g)
    fmt = tex.NVTE_QKV_Format.NVTE_SBHD
    tables = 2 * s * d * 4
    cases.append(("fused_rope_forward",
                  lambda: (lambda: tex.fused_rope_forward(xr, freqs, None, fmt, False, None, 1, 0)),
                  2 * n * es + tables, [x]))
    cases.append(("fused_rope_backward",
                  lambda: (lambda: tex.fused_rope_backward(xr, freqs, None, fmt, False, None, 1, 0)),
                  2 * n * es + tables, [x]))
    p, buf, gr = x.reshape(-1).clone(), torch.zeros(n, dtype=dtype), dy.reshape(-1)
    noop = torch.zeros(1, dtype=torch.int32)
    cases.append(("multi_tensor_sgd", lambda: (lambda: tex.multi_tensor_sgd(
        65536, noop, [[gr], [p], [buf]], 0.01, 0.9, 0.0, 1e-3, False, False, False, 1.0)), 5 * n * es, [p, buf]))
    return cases


def bench_train_kernels(rows, cols, dtype, repeat, with_reference=True):
    """Every training kernel through its tex function on default.cpp, against the ceiling copy moving
    the bytes the op must move, in interleaved rounds (and reference.torch in the same rounds)."""
    out = []
    for op, make, moved, srcs in _train_cases(rows, cols, dtype):
        fn = make()

        def forced(backend, fn=fn):
            def run():
                with tex.use_backend(backend):
                    fn()
            return run
        fns = {"cpp": forced("cpp")}
        if with_reference:
            fns["torch"] = forced("torch")
        st, label = _measure(fns, srcs, moved, repeat)
        info = tensor_ops.get_manager().op_info()[op]["calls"]
        assert info.get("default.cpp"), f"cpp adapter did not run for {op}: {info}"
        r = {"op": op, "shape": [rows, cols], "dtype": str(dtype).replace("torch.", ""), "moved_MB": moved / 2 ** 20,
             "cpp_ms": st["cpp"][STAT] * 1e3, "cpp_GBps": moved / st["cpp"][STAT] / 1e9,
             "ceiling_GBps": st["ceiling"]["gbps"], "cpp_x_ceiling": st["cpp"]["x_ceiling"], "ceiling": label}
        if with_reference:
            r.update(reference_torch_ms=st["torch"][STAT] * 1e3, speedup_vs_reference=st["cpp"]["vs"]["torch"])
        out.append(r)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "ceiling"}),
              flush=True)
    return out


def main(argv=None) -> int:
    global STAT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    ap.add_argument("--repeat", type=int, default=None, help="interleaved rounds (default 10; quick 5)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--kernels", action="store_true",
                    help="the training kernels (d-activations, softmax family, fused RoPE, SGD) vs the ceiling")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="with --kernels: the dtypes")
    ap.add_argument("--no-reference", action="store_true", help="with --kernels: leave reference.torch out")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="time shown: median or best of the rounds (ratios are always medians of per-round ratios)")
    a = ap.parse_args(argv)
    STAT = "best_s" if a.stat == "min" else "median_s"
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
    if a.kernels:
        results = []
        for name in a.dtypes.split(","):
            results += bench_train_kernels(rows, cols, getattr(torch, name.strip()), repeat, not a.no_reference)
    else:
        results = [bench_rmsnorm(rows, cols, torch.float32, repeat),
                   bench_rmsnorm(rows, cols, torch.bfloat16, repeat), bench_adam(total, 100, max(3, repeat // 2))]
        for r in results:
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch_threads": threads, "statistic": a.stat, "cpp": cpp_info, "results": results}, f,
                      indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
