"""A tiny Hugging Face Llama on CPU, unpatched vs patched by ``tensor_ops.integrations.transformers``
(a preset of the one benchmark engine: its timer and statistic for the step times; the torch
profiler for where the time goes).

    python benchmarks/bench_hf_llama.py                  # hidden 1024, 4 layers, seq 512, batch 4; fp32 + bf16
    python benchmarks/bench_hf_llama.py --quick          # hidden 256, 2 layers, seq 128 (smoke test)
    python benchmarks/bench_hf_llama.py --json out.json

Per dtype and mode (forward; forward + backward of HF's causal-LM loss), two measurements:

- the whole step, both models timed in the same interleaved rounds (``_bench.time_rounds``,
  medians and the median of per-round ratios);
- torch profiler passes over each model, interleaved (``--profile-rounds``, one call per model
  per round): the matmuls' time is the self CPU time of the matmul operators
  (``aten::mm``/``addmm``/``bmm``/``matmul``/``linear``, forward and backward); everything
  else (norms, activations, RoPE, softmax, casts, adds, the loss, tensor_ops' kernels,
  Python) is the step's wall time in that pass minus the matmuls'; the speedup is the median
  of per-round ratios.

Eager attention (``attn_implementation="eager"``) keeps the attention softmax a separate op
(SDPA would fuse it into its kernel). Vocabulary 4096: the LM head and the loss stay small
next to the layers.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tensor_ops import _bench  # noqa: E402
from tensor_ops.integrations import transformers as to_hf  # noqa: E402

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
          "aten::_addmm_activation")


def build(hidden, layers, vocab, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, vocab_size=vocab,
                      max_position_embeddings=2048)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).to(dtype)


def step_fn(model, ids, mode):
    if mode == "forward":
        model.eval()

        def fwd():
            with torch.no_grad():
                model(ids)
        return fwd
    model.train()

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
    return fwd_bwd


def profile_once(fn) -> tuple:
    """(wall, matmul seconds, {op: self seconds}) of one call under the torch profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    mm = 0.0
    top: dict = {}
    for e in prof.key_averages():
        t = e.self_cpu_time_total / 1e6
        if e.key in MATMUL:
            mm += t
        else:
            top[e.key] = top.get(e.key, 0.0) + t
    return wall, mm, top


def profile_split(fns: dict, rounds=3) -> dict:
    """Per model: the matmuls' seconds per call (their operators' self CPU time, torch profiler)
    and everything else (the step's wall time minus that, so time outside any torch operator —
    tensor_ops' kernels called without the dispatcher in inference, Python — counts too).
    The models are profiled in interleaved rounds, one call each per round; the figures are
    medians over rounds and the speedup is the median of per-round ratios (the engine's
    statistic), so a burst of load on this shared machine hits both sides of a ratio."""
    for f in fns.values():
        f()
    per: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            per[k].append(profile_once(f))
    out: dict = {}
    for k, runs in per.items():
        top: dict = {}
        for _, _, t in runs:
            for op, v in t.items():
                top[op] = top.get(op, 0.0) + v / len(runs)
        out[k] = {"wall_s": statistics.median(r[0] for r in runs), "matmul_s": statistics.median(r[1] for r in runs),
                  "other_s": statistics.median(r[0] - r[1] for r in runs), "other_runs_s": [r[0] - r[1] for r in runs],
                  "top_other": sorted(top.items(), key=lambda kv: -kv[1])[:8]}
    return out


def run(hidden, layers, seq, batch, vocab, dtype, mode, rounds, profile_rounds=3):
    base = build(hidden, layers, vocab, dtype)
    patched = copy.deepcopy(base)
    rep = to_hf.apply(patched)
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    fns = {"hf": step_fn(base, ids, mode), "tensor_ops": step_fn(patched, ids, mode)}
    st = _bench.stats(_bench.time_rounds(fns, 0, rounds), 1)
    prof = profile_split(fns, profile_rounds)
    ratios = [a / max(b, 1e-12) for a, b in zip(prof["hf"]["other_runs_s"], prof["tensor_ops"]["other_runs_s"])]
    return {"dtype": str(dtype).replace("torch.", ""), "mode": mode, "patched": str(rep),
            "step_s": {k: st[k]["median_s"] for k in fns}, "step_speedup": st["tensor_ops"]["vs"]["hf"],
            "profile": prof, "non_matmul_speedup": statistics.median(ratios), "non_matmul_speedups": ratios}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile-rounds", type=int, default=3, help="interleaved profiled calls per model")
    p.add_argument("--modes", default="forward,forward+backward")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--json")
    a = p.parse_args(argv)
    for name in ("rounds", "profile_rounds"):
        if getattr(a, name) < 1:  # the medians need one call per model; the split one profiled call
            p.error(f"--{name.replace('_', '-')}: got {getattr(a, name)}; it must be at least 1")
    shape = dict(hidden=256, layers=2, seq=128, batch=2, vocab=1024) if a.quick else \
        dict(hidden=1024, layers=4, seq=512, batch=4, vocab=4096)
    res = []
    for dt in a.dtypes.split(","):
        for mode in a.modes.split(","):
            r = run(**shape, dtype=getattr(torch, dt), mode=mode, rounds=a.rounds, profile_rounds=a.profile_rounds)
            res.append(r)
            hf, me = r["profile"]["hf"], r["profile"]["tensor_ops"]
            print(f"{r['dtype']:<9} {mode:<17} step {r['step_s']['hf'] * 1e3:8.0f} -> "
                  f"{r['step_s']['tensor_ops'] * 1e3:8.0f} ms"
                  f" (x{r['step_speedup']:.2f}); non-matmul {hf['other_s'] * 1e3:7.0f} -> {me['other_s'] * 1e3:6.0f} ms"
                  f" (x{r['non_matmul_speedup']:.2f}); matmul {hf['matmul_s'] * 1e3:6.0f} / "
                  f"{me['matmul_s'] * 1e3:6.0f} ms",
                  flush=True)
    print(f"\nshape {shape}; {res[0]['patched']}")
    for r in res:
        print(f"{r['dtype']} {r['mode']}: largest non-matmul ops, unpatched: "
              + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in r["profile"]["hf"]["top_other"][:5])
              + "; patched: " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in r["profile"]["tensor_ops"]["top_other"][:5]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": shape, "torch": torch.__version__, "results": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
