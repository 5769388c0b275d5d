"""tensor_ops on torch CPU tensors vs torch eager and torch.compile (Inductor), a preset of the one
benchmark engine (``tensor_ops/_bench.py``: its cases, baselines, timer, statistic, ceiling).

    python benchmarks/bench_torch.py                 # 8192x4096 fp32 + bf16: forward, forward+backward, small call
    python benchmarks/bench_torch.py --quick         # 1024x4096, fewer rounds (smoke test)
    python benchmarks/bench_torch.py --json out.json
    python benchmarks/bench_torch.py --small         # the small-call table alone (call overheads)

Three tables, every ratio the median of per-round ratios of rows timed in the same rounds:

1. **forward**: rms_norm, layer_norm, softmax, silu, swiglu: ``tensor_ops.<op>(torch tensors)``
   (fresh output) vs ``torch_eager`` / ``torch_compiled`` of the engine (the same math in torch;
   compiled and run once outside the timing) and the ceiling (a streaming copy of the op's
   pages);
2. **forward + backward**: rms_norm and swiglu on tensors that require grad, ``y.backward(g)``
   through tensor_ops' torch ops vs the same in torch eager;
3. **small call**: (1, 4096) fp32 rms_norm through the facade on a torch tensor, on a NumPy
   array, and ``torch.nn.functional.rms_norm``, in blocks of calls; off the native entry, the
   general path (``backend="cpp"``), the autograd forward (a Parameter weight) and forward +
   backward against ``F.rms_norm``'s;
4. **small autograd calls, every op** (with ``--small``): one row of 4096 (swiglu 8192, rope
   a decode step's (32, 1, 128)) that requires grad, Parameter weights: the forward and
   forward + ``.sum().backward()`` against the same in torch eager (``F.rms_norm``,
   ``F.layer_norm``, ``x + r`` then ``F.rms_norm``, ``torch.softmax``, ``F.silu``, ``F.gelu``,
   ``F.silu(a) * b``, rope's rotate-half formula). At this size a call is its overheads: torch's
   autograd nodes are C++, ours an ``autograd.Function`` (CONTRIBUTING.md, "Torch calls off
   the fast path").
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensor_ops as to  # noqa: E402
import tensor_ops.torch  # noqa: E402,F401  (registers the torch ops)
from tensor_ops import _bench  # noqa: E402
from tensor_ops._bench_cases import bench_case, on_torch, torch_compiled, torch_eager  # noqa: E402

FORWARD = ("rms_norm", "layer_norm", "softmax", "silu", "swiglu")
BACKWARD = ("rms_norm", "swiglu")
DTYPES = ("float32", "bfloat16")
F = torch.nn.functional


def forward(rows: int, rounds: int) -> list:
    out = []
    for dtype in DTYPES:
        for op in FORWARD:
            case = on_torch(bench_case(op, "float32", rows), device="cpu", dtype=dtype)
            fns = {"tensor_ops": lambda c=case: c.run(None)}
            for name, make in (("torch", torch_eager), ("compile", torch_compiled)):
                fn, why = make(case)
                if fn is None:
                    print(f"  {op} {dtype}: no {name} row ({why})", file=sys.stderr)
                else:
                    fns[name] = fn
            fns["ceiling"], _, label = _bench.ceiling_copy(case.reads, case.bytes_moved // 2)
            st = _bench.stats(_bench.time_rounds(fns, 0, rounds), case.bytes_moved)
            me = st["tensor_ops"]
            out.append({"op": op, "dtype": dtype, "shape": case.shape_label, "ms": me["median_s"] * 1e3,
                        "GBps": me["gbps"], "x_ceiling": me["x_ceiling"],
                        "x_eager": me["vs"].get("torch"), "x_compile": me["vs"].get("compile"),
                        "eager_ms": _ms(st.get("torch")), "compile_ms": _ms(st.get("compile")), "ceiling": label})
    return out


def _ms(s):
    return s["median_s"] * 1e3 if s and s.get("median_s") else None


def _fwd_bwd(op: str, case):
    """(tensor_ops fn, torch eager fn): forward then backward of a fixed upstream gradient."""
    x = case.x.detach().clone().requires_grad_()
    n, h = x.shape[-1], x.shape[-1] // 2
    if op == "rms_norm":
        w = case.args[0].detach().clone().requires_grad_()
        ours, ref, params = (lambda: to.rms_norm(x, w, 1e-6)), (lambda: F.rms_norm(x, (n,), w, 1e-6)), (x, w)
    else:
        ours, ref, params = (lambda: to.swiglu(x)), (lambda: F.silu(x[..., :h]) * x[..., h:]), (x,)
    g = torch.randn(case.out_shape, dtype=torch.float32).to(x.dtype)

    def run(f):
        def step():
            for p in params:
                p.grad = None
            f().backward(g)
        return step
    return run(ours), run(ref)


def forward_backward(rows: int, rounds: int) -> list:
    out = []
    for dtype in DTYPES:
        for op in BACKWARD:
            case = on_torch(bench_case(op, "float32", rows), device="cpu", dtype=dtype)
            ours, ref = _fwd_bwd(op, case)
            st = _bench.stats(_bench.time_rounds({"tensor_ops": ours, "torch": ref}, 0, rounds), 1)
            out.append({"op": op, "dtype": dtype, "shape": case.shape_label, "ms": _ms(st["tensor_ops"]),
                        "eager_ms": _ms(st["torch"]), "x_eager": st["tensor_ops"]["vs"].get("torch")})
    return out


def small_call(rounds: int, calls: int) -> dict:
    case = on_torch(bench_case("rms_norm", "float32", 1), device="cpu")
    x, w = case.x, case.args[0]
    xn, wn = x.numpy(), w.numpy()
    xg, p = x.clone().requires_grad_(), torch.nn.Parameter(w.clone())
    to.rms_norm(x, w, 1e-6)                     # the first torch call hands torch to the native entries
    fns = {"torch_tensor": lambda: to.rms_norm(x, w, 1e-6), "numpy_array": lambda: to.rms_norm(xn, wn, 1e-6),
           "F.rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
           # off the native entry: backend= forces the general path (strided tensors, HF rope tables,
           # out= pairs take it too), and a Parameter weight with grad on takes autograd
           "general_path": lambda: to.rms_norm(x, w, 1e-6, backend="cpp"),
           "autograd_fwd": lambda: to.rms_norm(x, p, 1e-6),
           "autograd_fwd_bwd": lambda: to.rms_norm(xg, p, 1e-6).sum().backward(),
           "F.rms_norm_fwd_bwd": lambda: F.rms_norm(xg, (4096,), p, 1e-6).sum().backward()}
    t = _bench.time_rounds(fns, 0, rounds, calls=calls)
    st = _bench.stats(t, 1)
    us = {k: st[k]["median_s"] * 1e6 for k in fns}
    diffs = sorted(a - b for a, b in zip(t["torch_tensor"].samples, t["numpy_array"].samples))
    return {"shape": "1x4096", "dtype": "float32", "us": us, "torch_minus_numpy_us": diffs[len(diffs) // 2] * 1e6,
            "x_vs_F_rms_norm": st["torch_tensor"]["vs"]["F.rms_norm"],
            "fwd_bwd_x_vs_F": st["autograd_fwd_bwd"]["vs"]["F.rms_norm_fwd_bwd"]}


def _rope_torch(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def _swiglu_torch(x):
    a, b = x.chunk(2, -1)
    return F.silu(a) * b


def autograd_small(rounds: int, calls: int) -> list:
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(1, 4096, generator=g).requires_grad_() for _ in "ab")
    w, b = (torch.nn.Parameter(torch.randn(4096, generator=g)) for _ in "ab")
    x2 = torch.randn(1, 8192, generator=g).requires_grad_()
    q = torch.randn(32, 1, 128, generator=g).requires_grad_()
    cos, sin = torch.randn(1, 128, generator=g), torch.randn(1, 128, generator=g)
    pairs = {
        "rms_norm": (lambda: to.rms_norm(x, w, 1e-6), lambda: F.rms_norm(x, (4096,), w, 1e-6)),
        "layer_norm": (lambda: to.layer_norm(x, w, b, 1e-5), lambda: F.layer_norm(x, (4096,), w, b, 1e-5)),
        "add_rms_norm": (lambda: sum(to.add_rms_norm(x, r, w, 1e-6)),
                         lambda: (lambda s: F.rms_norm(s, (4096,), w, 1e-6) + s)(x + r)),
        "softmax": (lambda: to.softmax(x), lambda: torch.softmax(x, -1)),
        "silu": (lambda: to.silu(x), lambda: F.silu(x)),
        "gelu": (lambda: to.gelu(x), lambda: F.gelu(x)),
        "swiglu": (lambda: to.swiglu(x2), lambda: _swiglu_torch(x2)),
        "rope": (lambda: to.rope(q, cos, sin), lambda: _rope_torch(q, cos, sin)),
    }
    out = []
    for op, (ours, ref) in pairs.items():
        fns = {"fwd": ours, "torch_fwd": ref, "fwd_bwd": lambda f=ours: f().sum().backward(),
               "torch_fwd_bwd": lambda f=ref: f().sum().backward()}
        st = _bench.stats(_bench.time_rounds(fns, 0, rounds, calls=calls), 1)
        out.append({"op": op, **{f"{k}_us": st[k]["median_s"] * 1e6 for k in fns},
                    "x_torch_fwd": st["fwd"]["vs"]["torch_fwd"],
                    "x_torch_fwd_bwd": st["fwd_bwd"]["vs"]["torch_fwd_bwd"]})
    return out


def _print_autograd_small(rows: list) -> None:
    print("\nsmall autograd calls (one row; medians of blocks of calls), vs torch eager")
    print(f"{'op':<13} {'fwd us':>8} {'torch':>8} {'x torch':>8} {'fwd+bwd us':>11} {'torch':>8} {'x torch':>8}")
    for r in rows:
        print(f"{r['op']:<13} {r['fwd_us']:>8.1f} {r['torch_fwd_us']:>8.1f} {r['x_torch_fwd']:>8.2f} "
              f"{r['fwd_bwd_us']:>11.1f} {r['torch_fwd_bwd_us']:>8.1f} {r['x_torch_fwd_bwd']:>8.2f}")


def _print_small(s: dict) -> None:
    u = s["us"]
    print(f"\nsmall call rms_norm (1, 4096) fp32, medians of blocks of 200 calls: torch tensor "
          f"{u['torch_tensor']:.2f} us, NumPy array {u['numpy_array']:.2f} us, F.rms_norm "
          f"{u['F.rms_norm']:.2f} us; torch - NumPy {s['torch_minus_numpy_us']:.2f} us; "
          f"x F.rms_norm {s['x_vs_F_rms_norm']:.2f}")
    print(f"off the entry: general path (backend='cpp') {u['general_path']:.1f} us; autograd forward (Parameter "
          f"weight) {u['autograd_fwd']:.1f} us; forward + backward {u['autograd_fwd_bwd']:.1f} us against "
          f"F.rms_norm's {u['F.rms_norm_fwd_bwd']:.1f} us (x {s['fwd_bwd_x_vs_F']:.2f})")


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1024 rows, 3 rounds")
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--small", action="store_true", help="only the small-call table (call overheads)")
    a = p.parse_args(argv)
    rows, rounds = (1024, 3) if a.quick else (a.rows, a.rounds)
    if a.small:
        res = {"small_call": small_call(max(rounds, 15), 200), "autograd_small": autograd_small(max(rounds, 9), 50)}
        _print_small(res["small_call"])
        _print_autograd_small(res["autograd_small"])
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    res = {"forward": forward(rows, rounds), "forward_backward": forward_backward(rows, max(3, rounds // 2)),
           "small_call": small_call(max(rounds, 15), 200), "torch": torch.__version__,
           "cpp": to.get_cpp_info().get("selected_isa")}
    print(f"\nforward, torch CPU tensors ({res['forward'][0]['shape']}; fresh outputs; ceiling: "
          f"{res['forward'][0]['ceiling']})")
    print(f"{'op':<11} {'dtype':<9} {'ms':>7} {'GB/s':>6} {'x ceil':>6} {'x eager':>8} {'x compile':>9}"
          f" {'eager ms':>9} {'compile ms':>10}")
    for r in res["forward"]:
        print(f"{r['op']:<11} {r['dtype']:<9} {_f(r['ms']):>7} {_f(r['GBps'], '{:.1f}'):>6} {_f(r['x_ceiling']):>6}"
              f" {_f(r['x_eager']):>8} {_f(r['x_compile']):>9} {_f(r['eager_ms']):>9} {_f(r['compile_ms']):>10}")
    print("\nforward + backward (y.backward(g)), vs torch eager")
    print(f"{'op':<11} {'dtype':<9} {'ms':>8} {'eager ms':>9} {'x eager':>8}")
    for r in res["forward_backward"]:
        print(f"{r['op']:<11} {r['dtype']:<9} {_f(r['ms']):>8} {_f(r['eager_ms']):>9} {_f(r['x_eager']):>8}")
    _print_small(res["small_call"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
