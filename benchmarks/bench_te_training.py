"""TransformerEngine's own modules trained on CPU through tensor_ops.tex, against plain torch.

A 2-layer model of ``te.LayerNormMLP`` (pre-norm residual blocks: x + MLP(LN(x)), swiglu) trained
with TE's ``FusedAdam``, and the same model from ``torch.nn`` modules with
``torch.optim.AdamW(foreach=True)``, from the same initial weights and data. Reported:

- the losses of both, step by step (fp32: must agree within 1e-5 relative);
- step time, the two interleaved step by step (``time.perf_counter``), median of per-step ratios;
- by the torch profiler, one step at a time, tex and torch alternating: the time in GEMMs
  (aten::mm/addmm/bmm/matmul/linear self time) and everything else of the step's wall time (norms,
  activations and their backward, the optimizer, and the glue both share: residual adds, the loss,
  autograd, TE's Python), the non-GEMM speedup as the median of per-step-pair ratios. Why per
  step: the sums over all of one side's steps, then the other's, read 0.40x, 2.55x and 8.34x in
  three runs of one build (bf16 and fp32, Zen 4, 2026-12-02): one hiccup of the host inside one
  side's block (that 0.40x run: tex's non-GEMM 2.10 s against 0.26 s in the next run) decided it;
- the non-GEMM work category by category (norms, activations, optimizer), tex against torch's
  equivalents on the model's shapes, interleaved rounds of the benchmark engine (the issue's
  "≥ 3× faster" bar; robust to a loaded machine, where whole steps are not).

TE's modules ask for CUDA; the test-only ``tests/_te_cpu.py`` answers (needs the ``te`` extra).

    python benchmarks/bench_te_training.py --dtype fp32 --steps 20
    python benchmarks/bench_te_training.py --dtype bf16 --hidden 256 --ffn 1024 --tokens 512 --steps 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("NVTE_TORCH_COMPILE", "0")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
            "aten::_addmm_activation"}


class TorchMLP(torch.nn.Module):
    def __init__(self, hidden, ffn, dtype):
        super().__init__()
        self.ln = torch.nn.LayerNorm(hidden, eps=1e-5, dtype=dtype)
        self.fc1 = torch.nn.Linear(hidden, 2 * ffn, dtype=dtype)
        self.fc2 = torch.nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x):
        a, b = self.fc1(self.ln(x)).chunk(2, dim=-1)
        return self.fc2(F.silu(a) * b)


def build(te, hidden, ffn, layers, dtype):
    tex_layers = [te.LayerNormMLP(hidden, ffn, activation="swiglu", params_dtype=dtype, device="cpu")
                  for _ in range(layers)]
    torch_layers = [TorchMLP(hidden, ffn, dtype) for _ in range(layers)]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t, r in zip(tex_layers, torch_layers):
            for p in t.parameters():   # TE inits norms to 1/0: perturb so every parameter matters
                p.copy_((torch.randn(p.shape, generator=g) * (0.02 if p.dim() == 2 else 0.1)
                         + (1.0 if "layer_norm_weight" in _name(t, p) else 0.0)).to(dtype))
            r.ln.weight.copy_(t.layer_norm_weight)
            r.ln.bias.copy_(t.layer_norm_bias)
            r.fc1.weight.copy_(t.fc1_weight)
            r.fc1.bias.copy_(t.fc1_bias)
            r.fc2.weight.copy_(t.fc2_weight)
            r.fc2.bias.copy_(t.fc2_bias)
    return torch.nn.ModuleList(tex_layers), torch.nn.ModuleList(torch_layers)


def _name(module, param):
    return next(n for n, p in module.named_parameters() if p is param)


def forward(layers, x):
    for m in layers:
        x = x + m(x)
    return x


def data(step, tokens, hidden, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(tokens, hidden, generator=g).to(dtype), torch.randn(tokens, hidden, generator=g).to(dtype))


def train_step(layers, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(forward(layers, x).float(), y.float())
    loss.backward()
    opt.step()
    return float(loss)


def profile_step(layers, opt, batch, top=0, label=""):
    """(GEMM seconds, step wall seconds) of one training step under the profiler; with ``top``,
    also prints the ops with the most self time (how the bias broadcast's page faults inside
    ``addmm`` were found: ``aten::copy_`` of (4096, 8192), 62 ms per fp32 step)."""
    from torch.profiler import ProfilerActivity, profile
    x, y = batch
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(layers, opt, x, y)
    total = time.perf_counter() - t0
    ka = prof.key_averages()
    gemm = sum(e.self_cpu_time_total for e in ka if e.key in GEMM_OPS) / 1e6
    for e in sorted(ka, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"{label:5s} {e.key[:60]:60s} calls {e.count:6d}  self {e.self_cpu_time_total / 1e3:9.2f} ms")
    return gemm, total


def profile_split(tex_layers, torch_layers, opt_tex, opt_torch, batches, top=0):
    """Each batch one profiled step of each side, alternating which goes first: per side the
    medians of the per-step GEMM, non-GEMM and total seconds, and the median of the per-step
    non-GEMM ratios (torch / tex). ``top`` prints the last pair's heaviest ops."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]):  # the profiler's first-use cost, on neither side
        torch.ones(8).add_(1)
    sides = {"tex": (tex_layers, opt_tex), "torch": (torch_layers, opt_torch)}
    got: dict = {"tex": [], "torch": []}
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        for name in (("tex", "torch") if i % 2 == 0 else ("torch", "tex")):
            got[name].append(profile_step(*sides[name], batch, top if last else 0, name))
    out = {name: {"gemm_s": statistics.median(g for g, _ in v), "other_s": statistics.median(t - g for g, t in v),
                  "total_s": statistics.median(t for _, t in v)} for name, v in got.items()}
    ratios = [(tt - gt) / (tx - gx) for (gx, tx), (gt, tt) in zip(got["tex"], got["torch"]) if tx > gx]
    out["non_gemm_speedup"] = statistics.median(ratios) if ratios else float("inf")
    out["non_gemm_speedup_per_step"] = ratios
    return out


def categories(te_layers, torch_layers, opt_tex, opt_torch, tokens, hidden, ffn, dtype, rounds):
    """The non-GEMM work of one training step, category by category, tex against torch's equivalents
    on the model's own shapes, timed in interleaved rounds by the benchmark engine (median of
    per-round ratios): norms (LayerNorm forward + backward), activations (SwiGLU forward +
    backward), the optimizer step (FusedAdam on tex vs AdamW(foreach)). Per layer for norms and
    activations (times the layer count in the totals)."""
    import tensor_ops.tex as tex
    from tensor_ops import _bench
    g = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    b = torch.randn(hidden, generator=g).to(dtype)
    dz = torch.randn(tokens, hidden, generator=g).to(dtype)
    a = torch.randn(tokens, 2 * ffn, generator=g).to(dtype)
    da = torch.randn(tokens, ffn, generator=g).to(dtype)
    te_dt = tex.DType.kFloat32 if dtype == torch.float32 else tex.DType.kBFloat16

    def tex_norm():
        y, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, te_dt, 0, False)
        tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)

    xt, wt, bt = (t.clone().requires_grad_(True) for t in (x, w, b))

    def torch_norm():
        y = F.layer_norm(xt, (hidden,), wt, bt, 1e-5)
        torch.autograd.grad(y, (xt, wt, bt), dz)

    def tex_act():
        tex.swiglu(a, None)
        tex.dswiglu(da, a, None)

    at = a.clone().requires_grad_(True)

    def torch_act():
        p, q = at.chunk(2, dim=-1)
        y = F.silu(p) * q
        torch.autograd.grad(y, at, da)

    for ps in (te_layers.parameters(), torch_layers.parameters()):   # gradients for the optimizers
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype) * 1e-3
    fns = {"tex_norm": tex_norm, "torch_norm": torch_norm, "tex_act": tex_act, "torch_act": torch_act,
           "tex_opt": opt_tex.step, "torch_opt": opt_torch.step}
    t = _bench.time_rounds(fns, 0, rounds)
    med = {k: statistics.median(v.times) for k, v in t.items()}
    n = len(te_layers)
    out = {}
    for cat, per_layer in (("norm", True), ("act", True), ("opt", False)):
        k = n if per_layer else 1
        out[cat] = {"tex_ms": med[f"tex_{cat}"] * k * 1e3, "torch_ms": med[f"torch_{cat}"] * k * 1e3,
                    "speedup": _bench.median_ratio(t[f"torch_{cat}"], t[f"tex_{cat}"])}
    tex_total = sum(v["tex_ms"] for v in out.values())
    torch_total = sum(v["torch_ms"] for v in out.values())
    per_round = [sum(t[f"torch_{c}"].times[i] * (n if c != "opt" else 1) for c in ("norm", "act", "opt"))
                 / sum(t[f"tex_{c}"].times[i] * (n if c != "opt" else 1) for c in ("norm", "act", "opt"))
                 for i in range(min(len(v.times) for v in t.values()))]
    out["all"] = {"tex_ms": tex_total, "torch_ms": torch_total, "speedup": statistics.median(per_round)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=4096, help="batch x seq")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile-steps", type=int, default=5, help="profiled steps of each side")
    ap.add_argument("--category-rounds", type=int, default=7, help="rounds of the per-category timing")
    ap.add_argument("--top", type=int, default=0, help="print the N ops with the most self time, each side")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16

    from tests._te_cpu import cuda_on_cpu
    import tensor_ops.tex as tex
    te = tex.import_transformer_engine()
    from transformer_engine.pytorch.optimizers import FusedAdam

    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    with cuda_on_cpu():
        tex_layers, torch_layers = build(te, args.hidden, args.ffn, args.layers, dtype)
        opt_tex = FusedAdam(tex_layers.parameters(), adam_w_mode=True, **kw)
        opt_torch = torch.optim.AdamW(torch_layers.parameters(), foreach=True, **kw)
        losses_tex, losses_torch, t_tex, t_torch = [], [], [], []
        for step in range(args.steps):
            x, y = data(step, args.tokens, args.hidden, dtype)
            order = ((tex_layers, opt_tex, losses_tex, t_tex), (torch_layers, opt_torch, losses_torch, t_torch))
            for layers, opt, losses, times in (order if step % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                losses.append(train_step(layers, opt, x, y))
                times.append(time.perf_counter() - t0)
            print(f"step {step:2d}: loss tex {losses_tex[-1]:.8f} torch {losses_torch[-1]:.8f}  "
                  f"time tex {t_tex[-1] * 1e3:8.1f} ms torch {t_torch[-1] * 1e3:8.1f} ms", flush=True)
        batches = [data(1000 + i, args.tokens, args.hidden, dtype) for i in range(args.profile_steps)]
        prof = profile_split(tex_layers, torch_layers, opt_tex, opt_torch, batches, args.top)
        cats = categories(tex_layers, torch_layers, opt_tex, opt_torch, args.tokens, args.hidden, args.ffn, dtype,
                          args.category_rounds)

    rel = [abs(a - b) / abs(b) for a, b in zip(losses_tex, losses_torch)]
    ratios = [b / a for a, b in zip(t_tex[1:], t_torch[1:])]     # step 0 is warm-up
    res = {
        "dtype": args.dtype, "hidden": args.hidden, "ffn": args.ffn, "tokens": args.tokens, "layers": args.layers,
        "steps": args.steps, "max_rel_loss_diff": max(rel), "median_step_ms_tex": statistics.median(t_tex[1:]) * 1e3,
        "median_step_ms_torch": statistics.median(t_torch[1:]) * 1e3, "median_speedup": statistics.median(ratios),
        "min_speedup": min(ratios),
        "profile": prof,
        "categories": cats,
    }
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
