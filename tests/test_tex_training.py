"""End to end: a TE-style MLP block (RMSNorm → Linear → SwiGLU → Linear) whose autograd.Functions
call only tex, trained 20 steps with tex's Adam, against the same model in plain torch."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from tensor_ops.tex import _testing as T  # noqa: E402

HOT = ["rmsnorm_fwd", "rmsnorm_bwd", "generic_gemm", "swiglu", "dswiglu", "multi_tensor_adam"]


def _backends():
    seen = {}
    for op in HOT:
        for p in T.backends_for(op):
            seen.setdefault(p.values[0], p)
    return list(seen.values())


@pytest.mark.parametrize("backend", _backends())
def test_mlp_training_matches_torch(backend):
    import tensor_ops
    ref = [p.clone().requires_grad_(True) for p in T.mlp_params()]
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
    params = [p.clone().requires_grad_(True) for p in T.mlp_params()]
    opt = T.TexAdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses, ref_losses = [], []
    with T.forced(backend):
        for step in range(20):
            x, target = T.mlp_data(step)
            for p in params:
                p.grad = None
            loss = (T.mlp_tex(x, params) - target).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())

            opt_ref.zero_grad()
            loss_ref = (T.mlp_torch(x, ref) - target).square().mean()
            loss_ref.backward()
            opt_ref.step()
            ref_losses.append(loss_ref.item())
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {i}: tex loss {a} vs torch {b}"
    assert losses[-1] < losses[0]  # it trains
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-4, atol=1e-5)
    if backend != "torch":  # the forced backend really served the hot ops it implements
        info = tensor_ops.get_manager().op_info()
        served = {op: info.get(op, info.get(f"tex:{op}", {})).get("calls", {}) for op in HOT}
        assert any(f"default.{backend}" in c for c in served.values()), served
