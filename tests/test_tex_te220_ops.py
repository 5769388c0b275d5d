"""The ops TE 2.20 calls that need no FP8 (issue 16, item 5), each against an fp64 / torch-autograd
oracle written from upstream's semantics, on every tex backend that serves it; plus their bad
input (the tex error formula, nothing written before validation passes)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402

pytestmark = pytest.mark.tex


def close(a, b, rtol=1e-6, atol=1e-6, msg=""):
    torch.testing.assert_close(a.double() if a.is_floating_point() else a, b.double() if b.is_floating_point() else b,
                               rtol=rtol, atol=atol, msg=lambda m: f"{msg}: {m}")


# ---------------------------------------------------------------- multi-tensor


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_scale_tensor"))
def test_multi_tensor_scale_tensor(backend):
    xs = [torch.randn(5, 3), torch.randn(7)]
    outs = [torch.empty_like(x) for x in xs]
    noop = torch.zeros(1, dtype=torch.int32)
    with T.forced(backend):
        tex.multi_tensor_scale_tensor(2048, noop, [xs, outs], torch.tensor([0.5]))
    for x, o in zip(xs, outs):
        close(o, x.double() * 0.5)
    assert int(noop) == 0
    xs[1][2] = float("inf")
    with T.forced(backend):
        tex.multi_tensor_scale_tensor(2048, noop, [xs, outs], torch.tensor([0.5]))
    assert int(noop) == 1


def _scale_oracle(amax, max_fp8, pow2, eps):
    a = max(amax, eps) if not math.isnan(amax) else amax
    if math.isinf(a) or a == 0 or math.isnan(a):
        return 1.0
    s = float(torch.tensor(max_fp8, dtype=torch.float32) / torch.tensor(a, dtype=torch.float32))
    if math.isinf(s):
        s = float(torch.finfo(torch.float32).max)
    if pow2:
        s = 2.0 ** math.floor(math.log2(s))
    return s


@pytest.mark.parametrize("pow2", [False, True], ids=["exact", "pow2"])
@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_compute_scale_and_scale_inv"))
def test_compute_scale_and_scale_inv(backend, pow2):
    amax = torch.tensor([3.0, 0.0, float("inf"), float("nan"), 1e-45, 448.0, 1e-3], dtype=torch.float32)
    scale, scale_inv = torch.empty_like(amax), torch.empty_like(amax)
    with T.forced(backend):
        tex.multi_tensor_compute_scale_and_scale_inv(65536, torch.zeros(1, dtype=torch.int32),
                                                     [[amax], [scale], [scale_inv]], 448.0, pow2, 0.0)
    want = torch.tensor([_scale_oracle(float(a), 448.0, pow2, 0.0) for a in amax], dtype=torch.float32)
    close(scale, want, rtol=0, atol=0)
    close(scale_inv, 1.0 / want.double(), rtol=1e-7, atol=0)
    # epsilon clamps small amaxes
    amax2 = torch.tensor([1e-9], dtype=torch.float32)
    with T.forced(backend):
        tex.multi_tensor_compute_scale_and_scale_inv(65536, torch.zeros(1, dtype=torch.int32),
                                                     [[amax2], [scale[:1]], [scale_inv[:1]]], 448.0, False, 1e-4)
    close(scale[:1], torch.tensor([448.0 / 1e-4]), rtol=1e-6)


def _e8m0_oracle(amax):
    v = float(torch.tensor(amax, dtype=torch.bfloat16).float() * torch.tensor(1 / 448, dtype=torch.float32))
    if math.isnan(v):
        return 0xFF
    if math.isinf(v):
        return 0xFE
    if v == 0:
        return 0
    m, e = math.frexp(v)          # v = m·2^e, m in [0.5, 1)
    exp = e - 1 + 127             # biased exponent of v
    if exp <= 0:                  # denormal fp32
        return 1 if v > 2.0 ** -127 else 0
    return min(exp + (1 if m != 0.5 else 0), 0xFE)


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_compute_scale_inv_e8m0"))
def test_compute_scale_inv_e8m0(backend):
    vals = [448.0, 449.0, 896.0, 1.0, 0.0, float("inf"), float("nan"), 3.5e-38, 1e5]
    amax = torch.tensor(vals, dtype=torch.bfloat16)
    out = torch.empty(len(vals), dtype=torch.uint8)
    with T.forced(backend):
        tex.multi_tensor_compute_scale_inv_e8m0(65536, None, [[amax], [out]])
    assert out.tolist() == [_e8m0_oracle(v) for v in vals]
    # the scale it encodes is the power of two >= amax/448: amax/448 <= 2^(e-127)
    assert all(2.0 ** (e - 127) >= float(a) / 448 * (1 - 1e-2) for e, a in zip(out.tolist()[:4], vals[:4]))


def _adam_oracle(g, p, m, v, lr, b1, b2, eps, step, mode, wd):
    g, p, m, v = (t.double() for t in (g, p, m, v))
    bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
    if mode == 0:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    upd = (m / bc1) / ((v / bc2).sqrt() + eps)
    if mode == 1:
        upd = upd + wd * p
    return p - lr * upd, m, v


@pytest.mark.parametrize("master", [False, True], ids=["plain", "master"])
@pytest.mark.parametrize("mode", [0, 1], ids=["l2", "adamw"])
@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_adam_capturable"))
def test_adam_capturable(backend, mode, master):
    torch.manual_seed(0)
    pdt = torch.bfloat16 if master else torch.float32
    p32 = torch.randn(40)
    p = p32.to(pdt)
    g = torch.randn(40).to(pdt) * 4
    m, v = torch.randn(40) * 0.1, torch.rand(40) * 0.1
    lists = [[g], [p], [m], [v]] + ([[p32]] if master else [])
    want_p, want_m, want_v = _adam_oracle(g.float() / 4, p32 if master else p, m, v, 1e-2, 0.9, 0.99, 1e-8, 3, mode,
                                          0.1)
    g0 = g.clone()
    op = tex.multi_tensor_adam_capturable_master if master else tex.multi_tensor_adam_capturable
    with T.forced(backend):
        op(2048, torch.zeros(1, dtype=torch.int32), lists, torch.tensor([1e-2]), 0.9, 0.99, 1e-8,
           torch.tensor([3], dtype=torch.int32), mode, 1, 0.1, torch.tensor([0.25]))
    close(m, want_m, rtol=1e-5, atol=1e-6)
    close(v, want_v, rtol=1e-5, atol=1e-7)
    close(p32 if master else p, want_p, rtol=1e-5, atol=1e-6)
    if master:
        close(p, want_p.to(pdt), rtol=0, atol=0)
    close(g, (g0.float() * 0.25).to(pdt), rtol=0, atol=0, msg="grads unscaled in place")
    # noop_flag set: nothing moves
    before = [t.clone() for t in (p, m, v)]
    with T.forced(backend):
        op(2048, torch.ones(1, dtype=torch.int32), lists, torch.tensor([1e-2]), 0.9, 0.99, 1e-8,
           torch.tensor([4], dtype=torch.int32), mode, 1, 0.1, torch.tensor([0.25]))
    for a, b in zip((p, m, v), before):
        assert torch.equal(a, b)


def test_multi_tensor_ops_run_outside_autograd():
    """Regression: with grad mode on, in-place updates of leaves that require grad raised."""
    p = torch.nn.Parameter(torch.randn(8))
    g = torch.randn(8)
    buf = torch.zeros(8)
    tex.multi_tensor_sgd(2048, torch.zeros(1, dtype=torch.int32), [[g], [p], [buf]], 0.0, 0.9, 0.0, 0.1, False,
                         True, False, 1.0)
    tex.multi_tensor_scale(2048, torch.zeros(1, dtype=torch.int32), [[g], [p]], 2.0)
    m, v = torch.zeros(8), torch.zeros(8)
    tex.multi_tensor_adam(2048, torch.zeros(1, dtype=torch.int32), [[g], [p], [m], [v]], 1e-3, 0.9, 0.99, 1e-8, 1,
                          1, 1, 0.0)
    tex.multi_tensor_adam_capturable(2048, torch.zeros(1, dtype=torch.int32), [[g], [p], [m], [v]],
                                     torch.tensor([1e-3]), 0.9, 0.99, 1e-8, torch.tensor([1]), 1, 1, 0.0,
                                     torch.tensor([1.0]))
    assert p.requires_grad and p.grad is None


# ---------------------------------------------------------------- fused QKV RoPE


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "inter"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("backend", T.backends_for("fused_qkv_rope_forward"))
def test_fused_qkv_rope(backend, fmt, interleaved):
    torch.manual_seed(0)
    s, b, g, d, d2 = 6, 2, 2, 8, 6
    split = [2 * d, d, d]
    shape = (s, b, g, sum(split)) if fmt == "sbhd" else (b, s, g, sum(split))
    qkv = torch.randn(shape)
    qf, kf = torch.randn(s, 1, 1, d2), torch.randn(s, 1, 1, d2)
    efmt = tex.NVTE_QKV_Format.NVTE_SBHD if fmt == "sbhd" else tex.NVTE_QKV_Format.NVTE_BSHD

    def oracle(x):
        q, k, v = torch.split(x, split, dim=-1)
        q = T.rope(q.reshape(*shape[:2], -1, d), qf.double(), fmt, interleaved)
        k = T.rope(k.reshape(*shape[:2], -1, d), kf.double(), fmt, interleaved)
        return q, k, v

    x64 = qkv.double().requires_grad_(True)
    wq, wk, wv = oracle(x64)
    with T.forced(backend):
        q, k, v = tex.fused_qkv_rope_forward(qkv, qf, kf, None, split, efmt, interleaved, 1, 0)
    assert q.shape == (*shape[:2], 2 * g, d) and k.shape == (*shape[:2], g, d) and v.shape == (*shape[:2], g, d)
    for got, want in ((q, wq), (k, wk), (v, wv)):
        close(got, want.reshape(got.shape), rtol=1e-5, atol=1e-5)
    dq, dk, dv = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    (gx,) = torch.autograd.grad((wq, wk, wv), x64, (dq.double().reshape(wq.shape), dk.double().reshape(wk.shape),
                                                    dv.double()))
    with T.forced(backend):
        got = tex.fused_qkv_rope_backward(dq, dk, dv, qf, kf, split, efmt, interleaved, 1, 0)
    assert got.is_contiguous()
    close(got, gx, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- MoE permutation


def _perm_oracle(x, idx, num_out):
    n, k = idx.shape
    order = sorted(range(n * k), key=lambda i: (int(idx.reshape(-1)[i]), i))   # stable by expert
    num_out = num_out or n * k
    row_id_map = torch.full((k * n,), -1, dtype=torch.int32)
    out = torch.zeros(num_out, x.shape[1], dtype=torch.float64)
    for dst, src in enumerate(order):
        t, c = divmod(src, k)
        if dst < num_out:
            row_id_map[c * n + t] = dst
            out[dst] = x[t].double()
    return out, row_id_map


@pytest.mark.parametrize("num_out", [0, 7], ids=["all", "dropping"])
@pytest.mark.parametrize("backend", T.backends_for("moe_permute_fwd"))
def test_moe_permute_unpermute(backend, num_out):
    torch.manual_seed(0)
    n, c, e, k = 6, 5, 4, 2
    x = torch.randn(n, c)
    idx = torch.stack([torch.randperm(e)[:k] for _ in range(n)]).to(torch.int32)
    want, want_map = _perm_oracle(x, idx, num_out)
    with T.forced(backend):
        out, row_id_map, ws = tex.moe_permute_fwd(x, tex.DType.kFloat32, idx, num_out, [], n * k)
    assert torch.equal(row_id_map, want_map) and ws == []
    close(out, want, rtol=0, atol=0)
    probs = torch.rand(n, k)
    # unpermute: out[t] = Σ_k prob[t,k]·permuted[row(t,k)] (dropped rows count 0); autograd oracle
    p64 = out.double().requires_grad_(True)
    pr64 = probs.double().requires_grad_(True)
    rows = want_map.long().reshape(k, n)
    uw = sum(torch.where((rows[j] >= 0)[:, None], p64[rows[j].clamp_min(0)] * pr64[:, j:j + 1], torch.zeros(1))
             for j in range(k))
    with T.forced(backend):
        un = tex.moe_unpermute_fwd(out, tex.DType.kFloat32, row_id_map, probs, n, k)
        un_noprob = tex.moe_unpermute_fwd(out, tex.DType.kFloat32, row_id_map, torch.empty(0), n, k)
        back = tex.moe_permute_bwd(out, tex.DType.kFloat32, row_id_map, torch.empty(0), n, k)
    close(un, uw, rtol=1e-6, atol=1e-6)
    close(un_noprob, back, rtol=0, atol=0)
    dy = torch.randn(n, c)
    gx, gp = torch.autograd.grad(uw, (p64, pr64), dy.double())
    with T.forced(backend):
        act_grad, prob_grad = tex.moe_unpermute_bwd(dy, out, tex.DType.kFloat32, row_id_map, probs)
    close(act_grad, gx, rtol=1e-6, atol=1e-6)
    close(prob_grad, gp, rtol=1e-6, atol=1e-6)
    assert prob_grad.dtype == torch.float32


# ---------------------------------------------------------------- router


def _router_oracle(logits, topk, pre, groups, gtopk, sf, score_function, bias):
    """TE's PyTorch reference (tests/pytorch/test_fused_router.py), fp64."""
    x = logits.double()
    t, e = x.shape

    def sel(scores):
        if gtopk:
            gs = scores.view(t, groups, -1).topk(topk // gtopk, dim=-1)[0].sum(-1)
            gi = torch.topk(gs, k=gtopk, dim=-1, sorted=False)[1]
            gm = torch.zeros_like(gs).scatter(1, gi, 1)
            smask = gm.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, -1)
            return torch.topk(scores.masked_fill(~smask.bool(), float("-inf")), k=topk, dim=-1)
        return torch.topk(scores, k=topk, dim=1)

    if score_function == "softmax":
        if pre:
            probs, idx = sel(torch.softmax(x, -1))
        else:
            sc, idx = sel(x)
            probs = torch.softmax(sc, -1)
    else:
        s = torch.sigmoid(x) if score_function == "sigmoid" else F.softplus(x).sqrt()
        if bias is not None:
            _, idx = sel(s + bias.double())
            s = torch.gather(s, 1, idx)
        else:
            s, idx = sel(s)
        probs = s / (s.sum(-1, keepdim=True) + 1e-20) if topk > 1 else s
    if sf:
        probs = probs * sf
    return torch.zeros_like(x).scatter(1, idx, probs), torch.zeros_like(x).scatter(1, idx, 1).bool()


ROUTER = [("softmax", False, None, None, None, False), ("softmax", True, None, None, 1.5, False),
          ("softmax", False, 4, 2, None, False), ("sigmoid", False, None, None, 2.0, True),
          ("sqrtsoftplus", False, 4, 2, None, True), ("sigmoid", False, None, None, None, False)]


@pytest.mark.parametrize("fmt", ["bytemap", "bitmap", "dense"])
@pytest.mark.parametrize("sf_name,pre,groups,gtopk,scale,bias", ROUTER,
                         ids=["softmax", "pre-softmax-scaled", "softmax-groups", "sigmoid-bias-scaled",
                              "sqrtsoftplus-groups-bias", "sigmoid"])
@pytest.mark.parametrize("backend", T.backends_for("fused_topk_with_score_function_fwd"))
def test_fused_topk_with_score_function(backend, sf_name, pre, groups, gtopk, scale, bias, fmt):
    torch.manual_seed(0)
    t, e, k = 10, 8, 4
    logits = torch.randn(t, e)
    eb = torch.randn(e) * 0.1 if bias else None
    want, want_map = _router_oracle(logits, k, pre, groups, gtopk, scale, sf_name, eb)
    mfmt = 1 if fmt == "bitmap" else 0
    dense = torch.empty(t, k, dtype=torch.int16) if fmt == "dense" else None
    with T.forced(backend):
        probs, routing, inter = tex.fused_topk_with_score_function_fwd(logits, k, pre, groups, gtopk, scale, sf_name,
                                                                       eb, mfmt, dense)
    close(probs, want, rtol=1e-5, atol=1e-6)
    if fmt == "bytemap":
        assert routing.dtype == torch.bool and torch.equal(routing, want_map)
    elif fmt == "bitmap":
        assert routing.dtype == torch.uint8 and routing.shape == (t, 1)
        bits = [[bool(int(routing[i, j // 8]) >> (j % 8) & 1) for j in range(e)] for i in range(t)]
        assert torch.equal(torch.tensor(bits), want_map)
    else:
        assert routing is dense
        assert torch.equal(torch.zeros(t, e, dtype=torch.bool).scatter(1, dense.long(), True), want_map)
    # backward: autograd of the oracle with the same selection
    x64 = logits.double().requires_grad_(True)

    def with_sel(x):
        if sf_name == "softmax":
            if pre:
                p = torch.softmax(x, -1) * want_map
            else:
                p = torch.softmax(x.masked_fill(~want_map, float("-inf")), -1)
        else:
            s = (torch.sigmoid(x) if sf_name == "sigmoid" else F.softplus(x).sqrt()) * want_map
            p = s / (s.sum(-1, keepdim=True) + 1e-20)
        return p * scale if scale else p

    dy = torch.randn(t, e)
    (gw,) = torch.autograd.grad(with_sel(x64), x64, dy.double())
    grad_logits = torch.empty(t, e)
    with T.forced(backend):
        ret = tex.fused_topk_with_score_function_bwd(routing, inter, dy, grad_logits, k, pre, scale, sf_name,
                                                     fmt == "dense", mfmt)
    assert ret is None
    close(grad_logits, gw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sf_name", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("backend", T.backends_for("fused_score_for_moe_aux_loss_fwd"))
def test_score_for_moe_aux_loss(backend, sf_name):
    torch.manual_seed(0)
    logits = torch.randn(9, 6)
    x64 = logits.double().requires_grad_(True)
    s = torch.softmax(x64, -1) if sf_name == "softmax" else (torch.sigmoid(x64) if sf_name == "sigmoid"
                                                             else F.softplus(x64).sqrt())
    if sf_name != "softmax":
        s = s / (s.sum(-1, keepdim=True) + 1e-20)
    with T.forced(backend):
        scores, routing, inter = tex.fused_score_for_moe_aux_loss_fwd(logits, 2, sf_name)
    assert scores.dtype == torch.float32
    close(scores, s, rtol=1e-6, atol=1e-7)
    assert torch.equal(routing, torch.zeros(9, 6, dtype=torch.bool).scatter(1, torch.topk(s, 2, -1)[1], True))
    dy = torch.randn(9, 6)
    (gw,) = torch.autograd.grad(s, x64, dy.double())
    gl = torch.empty(9, 6)
    with T.forced(backend):
        tex.fused_score_for_moe_aux_loss_bwd(inter, dy, gl, 2, sf_name)
    close(gl, gw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("graph_safe", [False, True], ids=["int", "tensor"])
@pytest.mark.parametrize("backend", T.backends_for("fused_moe_aux_loss_fwd"))
def test_fused_moe_aux_loss(backend, graph_safe):
    torch.manual_seed(0)
    t, e, k, coeff = 12, 5, 2, 0.01
    probs = torch.rand(t, e)
    tpe = torch.randint(0, 8, (e,), dtype=torch.int32)
    p64 = probs.double().requires_grad_(True)
    want = (p64.sum(0) * tpe.double()).sum() * (e * coeff / (k * t * t))
    total = torch.tensor(t) if graph_safe else t
    fn = tex.fused_moe_aux_loss_fwd_graph_safe if graph_safe else tex.fused_moe_aux_loss_fwd
    with T.forced(backend):
        loss, const = fn(probs, tpe, total, e, t, e, k, coeff)
        gl = tex.fused_moe_aux_loss_bwd(const, tpe, t, e, torch.tensor(2.0))
    assert loss.shape == () and loss.dtype == probs.dtype and const.shape == (2,) and const.dtype == torch.float32
    close(loss, want, rtol=1e-6, atol=1e-9)
    close(const[1], want, rtol=1e-6, atol=1e-9)
    (gw,) = torch.autograd.grad(want, p64, torch.tensor(2.0, dtype=torch.float64))
    close(gl, gw, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- padding, offsets


@pytest.mark.parametrize("backend", T.backends_for("fused_multi_row_padding"))
def test_multi_row_padding_roundtrip(backend):
    rows, padded = [3, 0, 5], [4, 0, 8]
    x = torch.randn(sum(rows), 6)
    out = torch.full((sum(padded), 6), 7.0)
    with T.forced(backend):
        tex.fused_multi_row_padding(x, out, rows, padded)
    want = torch.cat([x[:3], torch.zeros(1, 6), x[3:], torch.zeros(3, 6)])
    close(out, want, rtol=0, atol=0)
    back = torch.empty_like(x)
    with T.forced(backend):
        tex.fused_multi_row_unpadding(out, back, padded, rows)
    close(back, x, rtol=0, atol=0)


@pytest.mark.parametrize("backend", T.backends_for("splits_to_offsets"))
def test_splits_to_offsets(backend):
    with T.forced(backend):
        got = tex.splits_to_offsets(torch.tensor([3, 0, 2, 5]), 4)
    assert got.dtype == torch.int64 and got.tolist() == [0, 12, 12, 20, 40]
    sizes, outs = tex.splits_to_offsets_multi(torch.tensor([1, 2, 3], dtype=torch.int32), "cpu", [1, 8], [True, False],
                                              [torch.int64, torch.int32])
    assert sizes.dtype == torch.int64 and outs[0].tolist() == [0, 1, 3, 6] and outs[1].tolist() == [8, 24, 48]
    assert outs[1].dtype == torch.int32


# ---------------------------------------------------------------- THD / context parallel


CU = torch.tensor([0, 4, 12, 16], dtype=torch.int32)      # lengths 4, 8, 4 (multiples of 2·cp for cp=2)


def _halves(cu):
    cu = cu.tolist()
    first, second = [], []
    for a, b in zip(cu[:-1], cu[1:]):
        h = (b - a) // 2
        first += list(range(a, a + h))
        second += list(range(a + h, b))
    return torch.tensor(first), torch.tensor(second)


@pytest.mark.parametrize("rank4", [False, True], ids=["thd", "2thd"])
@pytest.mark.parametrize("backend", T.backends_for("thd_read_half_tensor"))
def test_thd_read_half_tensor(backend, rank4):
    x = torch.randn(2, 16, 3, 4) if rank4 else torch.randn(16, 3, 4)
    first, second = _halves(CU)
    sd = 1 if rank4 else 0
    with T.forced(backend):
        h0 = tex.thd_read_half_tensor(x, CU, 0)
        h1 = tex.thd_read_half_tensor(x, CU, 1)
    close(h0, x.index_select(sd, first), rtol=0, atol=0)
    close(h1, x.index_select(sd, second), rtol=0, atol=0)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("backend", T.backends_for("thd_second_half_lse_correction"))
def test_thd_lse_ops(backend, packed):
    torch.manual_seed(0)
    nh = 2
    lens = (CU[1:] - CU[:-1]).tolist()
    if packed:
        lse = torch.randn(nh, 16)
        per = torch.randn(nh, 8)
        _, second = _halves(CU)
        want_read = lse[:, second]
        want = lse.clone()
        want[:, second] = torch.logaddexp(lse[:, second], per)
        half_len = 8
    else:
        smax = max(lens)
        lse = torch.randn(3, nh, smax)
        per = torch.randn(3, nh, smax // 2)
        want = lse.clone()
        want_read = torch.zeros(3, nh, smax // 2)
        for i, n in enumerate(lens):
            h = n // 2
            want_read[i, :, :h] = lse[i, :, h:n]
            want[i, :, h:n] = torch.logaddexp(lse[i, :, h:n], per[i, :, :h])
        half_len = smax // 2
    with T.forced(backend):
        got_read = tex.thd_read_second_half_lse(lse, CU, packed, half_len)
        tex.thd_second_half_lse_correction(lse, per, CU, packed)
    close(got_read, want_read, rtol=0, atol=0)
    close(lse, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("only_second", [False, True], ids=["all", "second-half"])
@pytest.mark.parametrize("backend", T.backends_for("thd_out_correction"))
def test_thd_out_correction(backend, only_second):
    torch.manual_seed(0)
    nh, d = 2, 4
    out = torch.randn(16, nh, d)
    lse = torch.randn(nh, 16)
    _, second = _halves(CU)
    tokens = second if only_second else torch.arange(16)
    per = torch.randn(tokens.numel(), nh, d)
    per[0, 0, 0] = 0.0
    lse_step = torch.randn(nh, tokens.numel())
    want = out.clone().double()
    scale = torch.exp(lse_step.double() - lse[:, tokens].double()).t()          # [tokens, h]
    want[tokens] += per.double() * scale[..., None]
    with T.forced(backend):
        tex.thd_out_correction(out, per, lse, lse_step, CU, only_second, True)
    close(out, want, rtol=1e-6, atol=1e-6)


GRAD_MODES = [("add", "none"), ("copy", "none"), ("none", "add"), ("none", "copy"), ("add", "copy")]


@pytest.mark.parametrize("first,second", GRAD_MODES, ids=[f"{a}-{b}" for a, b in GRAD_MODES])
@pytest.mark.parametrize("backend", T.backends_for("thd_grad_correction"))
def test_thd_grad_correction(backend, first, second):
    torch.manual_seed(0)
    grad = torch.randn(16, 2, 4)
    f_idx, s_idx = _halves(CU)
    half = "none" in (first, second)
    per = torch.randn(8 if half else 16, 2, 4)
    want = grad.clone()
    for mode, idx in ((first, f_idx), (second, s_idx)):
        if mode == "none":
            continue
        src = per if half else per[idx]
        src = src if half else src
        if mode == "copy":
            want[idx] = src
        else:
            want[idx] = want[idx] + src
    with T.forced(backend):
        tex.thd_grad_correction(grad, per, CU, first, second)
    close(grad, want, rtol=1e-6, atol=1e-6)


def _partition_oracle(cu, world, rank):
    out = []
    cu = cu.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        chunk = (b - a) // (2 * world)
        out += list(range(a + rank * chunk, a + (rank + 1) * chunk))
        j = 2 * world - 1 - rank
        out += list(range(a + j * chunk, a + (j + 1) * chunk))
    return out


@pytest.mark.parametrize("backend", T.backends_for("thd_get_partitioned_indices"))
def test_thd_partition_and_reorder(backend):
    world = 2
    with T.forced(backend):
        parts = [tex.thd_get_partitioned_indices(CU, 16, world, r) for r in range(world)]
    for r, p in enumerate(parts):
        assert p.dtype == torch.int32 and p.tolist() == _partition_oracle(CU, world, r)
    x = torch.randn(16, 3)
    with T.forced(backend):
        ranked = tex.thd_sequence_order_to_cp_rank_order(x, CU, world, 16)
        back = tex.thd_cp_rank_order_to_sequence_order(ranked, CU, world, 16)
    order = torch.tensor(_partition_oracle(CU, world, 0) + _partition_oracle(CU, world, 1))
    close(ranked, x[order], rtol=0, atol=0)
    close(back, x, rtol=0, atol=0)


@pytest.mark.parametrize("backend", T.backends_for("thd_copy_valid_tokens_from_per_split_to_rank_local"))
def test_thd_copy_valid_tokens(backend):
    padded = torch.tensor([0, 4, 10], dtype=torch.int32)
    valid = torch.tensor([0, 3, 8], dtype=torch.int32)       # lengths 3 and 5 in slots of 4 and 6
    inp = torch.randn(10, 2)
    out = torch.zeros(10, 2)
    with T.forced(backend):
        tex.thd_copy_valid_tokens_from_per_split_to_rank_local(out, inp, padded, valid)
    want = torch.zeros(10, 2)
    want[0:3] = inp[0:3]
    want[4:9] = inp[4:9]
    close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", T.backends_for("convert_thd_to_bshd"))
def test_convert_thd_bshd(backend):
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    x = torch.randn(5, 2, 3)
    with T.forced(backend):
        b = tex.convert_thd_to_bshd(x, cu, 2, 4)
        t = tex.convert_bshd_to_thd(b, cu, 5)
    want = torch.zeros(2, 4, 2, 3)
    want[0, :2] = x[:2]
    want[1, :3] = x[2:]
    close(b, want, rtol=0, atol=0)
    close(t, x, rtol=0, atol=0)


# ---------------------------------------------------------------- grouped GEMM


@pytest.mark.parametrize("single_output", [False, True], ids=["lists", "single"])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("backend", T.backends_for("te_general_grouped_gemm"))
def test_grouped_gemm(backend, layout, single_output):
    torch.manual_seed(0)
    m_splits = [3, 0, 5]
    k, n = 6, 4
    transa, transb = layout[0] == "T", layout[1] == "T"
    As, Bs, wants = [], [], []
    for m in m_splits:
        # TE's layouts: TN fwd (W [n,k], x [m,k]) → x @ W.T; NN dgrad (W [k,n]... ), NT wgrad
        if layout == "TN":
            A, B = torch.randn(n, k), torch.randn(m, k)
            want = B.double() @ A.double().t()
        elif layout == "NN":
            A, B = torch.randn(k, n), torch.randn(m, k)
            want = B.double() @ A.double()
        else:
            A, B = torch.randn(m, n), torch.randn(m, k)
            want = B.double().t() @ A.double()
        As.append(A)
        Bs.append(B)
        wants.append(want)
    if single_output and layout == "NT":
        pytest.skip("single_output stacks row blocks of m_splits (forward/dgrad), not wgrad")
    empty = [torch.empty(0)] * 3
    if single_output:
        D = [torch.full((sum(m_splits), n), 9.0)]
    else:
        D = [torch.full(w.shape, 9.0) for w in wants]
    with T.forced(backend):
        ret = tex.te_general_grouped_gemm(As, transa, Bs, transb, D, tex.DType.kFloat32, m_splits, empty,
                                          tex.DType.kFloat32, single_output, empty, False, [torch.empty(1)], 1,
                                          False, False, 0)
    assert ret == empty
    got = torch.split(D[0], m_splits) if single_output else D
    for g, w in zip(got, wants):
        close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", T.backends_for("te_general_grouped_gemm"))
def test_grouped_gemm_bias_grad_and_accumulate(backend):
    """wgrad layout with grad=True: D[i] += dy_i.T @ x_i and bias[i] = Σ rows of dy_i (written in place)."""
    torch.manual_seed(0)
    xs = [torch.randn(5, 3), torch.randn(2, 3)]
    dys = [torch.randn(5, 4), torch.randn(2, 4)]
    D = [torch.randn(4, 3) for _ in xs]
    D0 = [d.clone() for d in D]
    bias = [torch.empty(4), torch.empty(4)]
    with T.forced(backend):
        ret = tex.te_general_grouped_gemm(xs, False, dys, True, D, tex.DType.kFloat32, [5, 2], bias,
                                          tex.DType.kFloat32, False, [torch.empty(0)] * 2, True, [torch.empty(1)], 1,
                                          True, False, 0)
    assert ret is not None and ret[0] is bias[0]
    for d, d0, x, dy, b in zip(D, D0, xs, dys, bias):
        close(d, d0.double() + dy.double().t() @ x.double(), rtol=1e-5, atol=1e-5)
        close(b, dy.double().sum(0), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- bad input


BAD = [
    ("scale_tensor-scale-f64", lambda: tex.multi_tensor_scale_tensor(
        1, torch.zeros(1, dtype=torch.int32), [[torch.ones(2)], [torch.empty(2)]], torch.ones(1, dtype=torch.float64)),
     TypeError, "scale"),
    ("scale_inv-amax-f16", lambda: tex.multi_tensor_compute_scale_and_scale_inv(
        1, torch.zeros(1, dtype=torch.int32), [[torch.ones(2, dtype=torch.float16)], [torch.empty(2)],
                                               [torch.empty(2)]], 448.0, False, 0.0), TypeError, "amaxes"),
    ("e8m0-out-f32", lambda: tex.multi_tensor_compute_scale_inv_e8m0(
        1, None, [[torch.ones(2, dtype=torch.bfloat16)], [torch.empty(2)]]), TypeError, "scale_invs"),
    ("adam-cap-lr-float", lambda: tex.multi_tensor_adam_capturable(
        1, torch.zeros(1, dtype=torch.int32), [[torch.ones(2)], [torch.ones(2)], [torch.zeros(2)], [torch.zeros(2)]],
        1e-3, 0.9, 0.99, 1e-8, torch.ones(1), 1, 1, 0.0, torch.ones(1)), TypeError, "lr"),
    ("qkv-rope-split", lambda: tex.fused_qkv_rope_forward(
        torch.randn(4, 1, 1, 24), torch.randn(4, 1, 1, 8), torch.randn(4, 1, 1, 8), None, [8, 8, 7],
        tex.NVTE_QKV_Format.NVTE_SBHD, False, 1, 0), ValueError, "qkv_split_arg_list"),
    ("qkv-rope-noncontig", lambda: tex.fused_qkv_rope_forward(
        torch.randn(4, 1, 1, 48)[..., :24], torch.randn(4, 1, 1, 8), torch.randn(4, 1, 1, 8), None, [8, 8, 8],
        tex.NVTE_QKV_Format.NVTE_SBHD, False, 1, 0), ValueError, "qkv_input"),
    ("permute-indices-float", lambda: tex.moe_permute_fwd(torch.randn(3, 2), tex.DType.kFloat32,
                                                          torch.zeros(3, 1), 0, [], 3), TypeError, "indices"),
    ("permute-dtype-mismatch", lambda: tex.moe_permute_fwd(torch.randn(3, 2), tex.DType.kBFloat16,
                                                           torch.zeros(3, 1, dtype=torch.int32), 0, [], 3),
     ValueError, "dtype"),
    ("unpermute-map-len", lambda: tex.moe_unpermute_fwd(torch.randn(3, 2), tex.DType.kFloat32,
                                                        torch.zeros(5, dtype=torch.int32), torch.empty(0), 3, 1),
     ValueError, "row_id_map"),
    ("router-score-fn", lambda: tex.fused_topk_with_score_function_fwd(torch.randn(4, 8), 2, False, None, None,
                                                                       None, "relu", None), ValueError,
     "score_function"),
    ("router-topk", lambda: tex.fused_topk_with_score_function_fwd(torch.randn(4, 8), 9, False, None, None, None,
                                                                   "softmax", None), ValueError, "topk"),
    ("router-meta", lambda: tex.fused_topk_with_score_function_fwd(
        torch.randn(4, 8), 2, False, None, None, None, "sigmoid", torch.zeros(8, device="meta")), ValueError,
     "devices"),
    ("aux-loss-shape", lambda: tex.fused_moe_aux_loss_fwd(torch.rand(4, 3), torch.ones(3), 4, 3, 4, 5, 1, 0.1),
     ValueError, "probs"),
    ("padding-rows", lambda: tex.fused_multi_row_padding(torch.randn(3, 2), torch.empty(5, 2), [3], [2]),
     ValueError, "padded_input_row_list"),
    ("offsets-int32", lambda: tex.splits_to_offsets(torch.ones(3, dtype=torch.int32), 4), TypeError, "first_dims"),
    ("thd-half-idx", lambda: tex.thd_read_half_tensor(torch.randn(16, 2, 4), CU, 2), ValueError, "half_idx"),
    ("thd-grad-mode", lambda: tex.thd_grad_correction(torch.randn(16, 2, 4), torch.randn(16, 2, 4), CU, "mul",
                                                      "copy"), ValueError, "first_half"),
    ("thd-cu-float", lambda: tex.thd_get_partitioned_indices(torch.tensor([0.0, 4.0]), 4, 1, 0), TypeError,
     "cu_seqlens"),
    ("grouped-gemm-quantized", lambda: tex.te_general_grouped_gemm(
        [object()], False, [torch.randn(2, 2)], False, [torch.empty(2, 2)], tex.DType.kFloat32, [2],
        [torch.empty(0)], tex.DType.kFloat32, False, [torch.empty(0)], False, [], 0, False, False, 0),
     NotImplementedError, "quantizer"),
    ("grouped-gemm-k", lambda: tex.te_general_grouped_gemm(
        [torch.randn(3, 4)], True, [torch.randn(2, 5)], False, [torch.empty(2, 3)], tex.DType.kFloat32, [2],
        [torch.empty(0)], tex.DType.kFloat32, False, [torch.empty(0)], False, [], 0, False, False, 0),
     ValueError, "inner dimensions"),
]


@pytest.mark.parametrize("fn,exc,text", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(fn, exc, text):
    with pytest.raises(exc, match=text) as info:
        fn()
    assert str(info.value).startswith("tex.") or exc is NotImplementedError, info.value


def test_nothing_written_before_validation():
    out = torch.full((5, 2), 3.0)
    with pytest.raises(ValueError):
        tex.fused_multi_row_padding(torch.randn(3, 2), out, [3, 1], [4])   # list lengths differ
    assert torch.equal(out, torch.full((5, 2), 3.0))
    gl = torch.full((4, 8), 3.0)
    with pytest.raises(ValueError):
        tex.fused_topk_with_score_function_bwd(torch.zeros(4, 8, dtype=torch.bool), torch.zeros(4, 8),
                                               torch.zeros(4, 7), gl, 2, False, None, "softmax")
    assert torch.equal(gl, torch.full((4, 8), 3.0))
