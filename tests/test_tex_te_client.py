"""The real client: TransformerEngine 2.20.2's own Python layer (``transformer_engine.pytorch``)
imported on top of tex, its modules and optimizers run on CPU tensors, forward and backward,
against plain torch modules. Needs the ``te`` extra (README); skips with the reason otherwise.
TE's CUDA queries are answered by the test-only ``tests/_te_cpu.py``."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from tests._te_cpu import cuda_on_cpu, import_te  # noqa: E402

pytestmark = pytest.mark.tex

H, FFN, ROWS = 64, 96, 24


@pytest.fixture(scope="module")
def te():
    return import_te()


@pytest.fixture
def cpu_cuda():
    with cuda_on_cpu():
        yield


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _swiglu(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


ACTS = {"gelu": _gelu_tanh, "relu": F.relu, "swiglu": _swiglu}


def _torch_twin(name, m, act=None):
    """A function of (x, params) computing what TE module ``m`` computes, in plain torch."""
    eps = getattr(m, "eps", 1e-5)
    if name == "RMSNorm":
        return lambda x, p: F.rms_norm(x, (H,), p["weight"], eps)
    if name == "LayerNorm":
        return lambda x, p: F.layer_norm(x, (H,), p["weight"], p["bias"], eps)
    if name == "Linear":
        return lambda x, p: F.linear(x, p["weight"], p["bias"])
    if name == "LayerNormLinear":
        return lambda x, p: F.linear(F.layer_norm(x, (H,), p["layer_norm_weight"], p["layer_norm_bias"], eps),
                                     p["weight"], p["bias"])
    fn = ACTS[act]
    return lambda x, p: F.linear(fn(F.linear(F.layer_norm(x, (H,), p["layer_norm_weight"], p["layer_norm_bias"], eps),
                                             p["fc1_weight"], p["fc1_bias"])), p["fc2_weight"], p["fc2_bias"])


def _make(te, name, act, dtype):
    kw = dict(device="cpu", params_dtype=dtype)
    if name == "RMSNorm":
        return te.RMSNorm(H, **kw)
    if name == "LayerNorm":
        return te.LayerNorm(H, **kw)
    if name == "Linear":
        return te.Linear(H, 32, **kw)
    if name == "LayerNormLinear":
        return te.LayerNormLinear(H, 32, **kw)
    return te.LayerNormMLP(H, FFN, activation=act, **kw)


MODULES = [("RMSNorm", None), ("LayerNorm", None), ("Linear", None), ("LayerNormLinear", None),
           ("LayerNormMLP", "gelu"), ("LayerNormMLP", "swiglu"), ("LayerNormMLP", "relu")]
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name,act", MODULES, ids=[n + (f"-{a}" if a else "") for n, a in MODULES])
def test_te_module_matches_torch(te, cpu_cuda, name, act, dtype):
    torch.manual_seed(0)
    m = _make(te, name, act, dtype)
    with torch.no_grad():   # non-trivial norm weights/biases (TE initialises them to 1 / 0)
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(ROWS, H, dtype=dtype).requires_grad_(True)
    dy_shape = (ROWS, 32 if name in ("Linear", "LayerNormLinear") else H)
    dy = torch.randn(dy_shape, dtype=dtype)
    y = m(x)
    y = y[0] if isinstance(y, tuple) else y
    y.backward(dy)
    # the oracle: the same function in plain torch: fp64 for fp32; for bf16 torch's own bf16 modules (an
    # fp64 oracle would put relu's kink elsewhere than any bf16 computation, torch's included)
    odt = torch.float64 if dtype == torch.float32 else dtype
    p64 = {n: p.detach().to(odt).requires_grad_(True) for n, p in m.named_parameters()}
    x64 = x.detach().to(odt).requires_grad_(True)
    y64 = _torch_twin(name, m, act)(x64, p64)
    y64.backward(dy.to(odt))
    tol = TOL[dtype]
    torch.testing.assert_close(y.double(), y64.double(), **tol, msg=lambda s: f"{name} forward: {s}")
    torch.testing.assert_close(x.grad.double(), x64.grad.double(), **tol, msg=lambda s: f"{name} dgrad: {s}")
    for n, p in m.named_parameters():
        scale = max(1.0, float(p64[n].grad.abs().max()))
        torch.testing.assert_close(p.grad.double(), p64[n].grad.double(), rtol=tol["rtol"], atol=tol["atol"] * scale,
                                   msg=lambda s, n=n: f"{name} grad of {n}: {s}")


def _served(op):
    import tensor_ops
    info = tensor_ops.get_manager().op_info()
    return info.get(op, info.get(f"tex:{op}", {})).get("calls", {})


def test_te_modules_reach_tex(te, cpu_cuda):
    """TE's modules call tex (not some fallback of their own): the ops show up as served."""
    m = te.LayerNormMLP(H, FFN, activation="swiglu", device="cpu")
    m(torch.randn(4, H, requires_grad=True)).sum().backward()
    for op in ("layernorm_fwd", "layernorm_bwd", "generic_gemm", "swiglu", "dswiglu"):
        assert sum(_served(op).values()) > 0, (op, _served(op))


def _train(params, opt, steps=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        opt.step()


@pytest.mark.parametrize("adam_w_mode", [True, False], ids=["adamw", "adam-l2"])
def test_fused_adam_matches_torch(te, cpu_cuda, adam_w_mode):
    from transformer_engine.pytorch.optimizers import FusedAdam
    torch.manual_seed(0)
    shapes = [(32, 16), (16,), (7, 3)]
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    opt = FusedAdam(ps, adam_w_mode=adam_w_mode, **kw)
    ropt = (torch.optim.AdamW if adam_w_mode else torch.optim.Adam)(ref, foreach=False, **kw)
    _train(ps, opt)
    _train(ref, ropt)
    for p, r in zip(ps, ref):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_fused_sgd_matches_torch(te, cpu_cuda, nesterov):
    """Regression: FusedSGD.step() on parameters that require grad raised "a leaf Variable that
    requires grad is being used in an in-place operation" (tex's multi_tensor_sgd ran under autograd)."""
    from transformer_engine.pytorch.optimizers import FusedSGD
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in [(32, 16), (16,)]]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    kw = dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=nesterov)
    opt = FusedSGD(ps, **kw)
    ropt = torch.optim.SGD(ref, foreach=False, **kw)
    assert torch.is_grad_enabled()
    _train(ps, opt)
    _train(ref, ropt)
    for p, r in zip(ps, ref):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)


ROPE = [("sbhd", False), ("bshd", False), ("sbhd", True), ("thd", False), ("thd", True)]


@pytest.mark.parametrize("fmt,interleaved", ROPE, ids=[f"{f}-{'inter' if i else 'half'}" for f, i in ROPE])
def test_fused_rope_matches_unfused(te, cpu_cuda, fmt, interleaved):
    """TE's apply_rotary_pos_emb(fused=True) (tex) against its own fused=False PyTorch path; the
    output is contiguous whatever the input's strides (regression: tex returned the input's strides)."""
    from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb
    torch.manual_seed(0)
    s, b, h, d = 12, 2, 3, 16
    freqs = RotaryPositionEmbedding(d, interleaved=interleaved)(s)
    kw = dict(tensor_format=fmt, interleaved=interleaved)
    if fmt == "thd":
        cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
        x = torch.randn(20, h, d)
        kw["cu_seqlens"] = cu
    else:
        # a permuted (non-contiguous) view, as attention code hands it over
        x = torch.randn(b, s, h, d).transpose(0, 1) if fmt == "sbhd" else torch.randn(s, b, h, d).transpose(0, 1)
    a = x.detach().clone().requires_grad_(True)
    r = x.detach().clone().requires_grad_(True)
    ya = apply_rotary_pos_emb(a, freqs, fused=True, **kw)
    yr = apply_rotary_pos_emb(r, freqs, fused=False, **kw)
    assert ya.is_contiguous()
    torch.testing.assert_close(ya, yr, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(yr)
    ya.backward(dy)
    yr.backward(dy)
    torch.testing.assert_close(a.grad, r.grad, rtol=1e-5, atol=1e-5)


def test_fused_qkv_rope_matches_unfused(te, cpu_cuda):
    from transformer_engine.pytorch.attention.rope import (RotaryPositionEmbedding, apply_fused_qkv_rotary_pos_emb,
                                                           apply_rotary_pos_emb)
    torch.manual_seed(0)
    s, b, g, d = 10, 2, 2, 16
    split = [2 * d, d, d]   # two q heads per kv group
    qkv = torch.randn(s, b, g, sum(split), requires_grad=True)
    freqs = RotaryPositionEmbedding(d)(s)
    q, k, v = apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, split)
    qr, kr, vr = torch.split(qkv, split, dim=-1)
    qr = apply_rotary_pos_emb(qr.reshape(s, b, -1, d), freqs)
    kr = apply_rotary_pos_emb(kr.reshape(s, b, -1, d), freqs)
    for got, want in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(got, want.reshape(got.shape), rtol=1e-5, atol=1e-5)
    dq, dk, dv = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    (gx,) = torch.autograd.grad((q, k, v), qkv, (dq, dk, dv))
    (gr,) = torch.autograd.grad((qr, kr, vr), qkv, (dq.reshape(qr.shape), dk.reshape(kr.shape), dv))
    torch.testing.assert_close(gx, gr, rtol=1e-5, atol=1e-5)


def test_moe_permute_roundtrip(te, cpu_cuda):
    """te.moe_permute / moe_unpermute (index map) on tex: unpermute(permute(x)) with probs = Σ_k p_k x."""
    torch.manual_seed(0)
    n, hdim, e, k = 9, 8, 4, 2
    x = torch.randn(n, hdim, requires_grad=True)
    idx = torch.stack([torch.randperm(e)[:k] for _ in range(n)]).to(torch.int32)
    probs = torch.softmax(torch.randn(n, k), -1).requires_grad_(True)
    px, row_id_map = te.moe_permute(x, idx, num_out_tokens=0, map_type="index")
    assert px.shape == (n * k, hdim)
    out = te.moe_unpermute(px, row_id_map, probs, map_type="index")
    want = (probs.unsqueeze(-1) * x.unsqueeze(1)).sum(1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(out)
    gx, gp = torch.autograd.grad(out, (x, probs), dy)
    wx, wp = torch.autograd.grad(want, (x, probs), dy)
    torch.testing.assert_close(gx, wx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gp, wp, rtol=1e-5, atol=1e-5)


def test_router_matches_reference(te, cpu_cuda):
    from transformer_engine.pytorch.router import fused_moe_aux_loss, fused_topk_with_score_function
    torch.manual_seed(0)
    logits = torch.randn(16, 8, requires_grad=True)
    probs, routing_map = fused_topk_with_score_function(logits, 2, False, None, None, None, "softmax", None)
    top, idx = torch.topk(logits, 2, dim=-1)
    want = torch.zeros_like(logits).scatter(1, idx, torch.softmax(top, -1))
    torch.testing.assert_close(probs, want, rtol=1e-6, atol=1e-6)
    assert routing_map.dtype == torch.bool and int(routing_map.sum()) == 32
    dy = torch.randn_like(probs)
    (g,) = torch.autograd.grad(probs, logits, dy)
    (w,) = torch.autograd.grad(want, logits, dy)
    torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    tpe = routing_map.sum(0).to(torch.int32)
    p = probs.detach().requires_grad_(True)
    loss = fused_moe_aux_loss(p, tpe, 16, 8, 2, 0.01)
    want_loss = (p.sum(0) * tpe).sum() * (8 * 0.01 / (2 * 16 * 16))
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-7)
    (gl,) = torch.autograd.grad(loss, p)
    torch.testing.assert_close(gl, torch.autograd.grad(want_loss, p)[0], rtol=1e-6, atol=1e-8)
    assert math.isfinite(float(loss))
