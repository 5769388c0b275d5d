"""Issue #16's training bars, op by op: tex's Adam rounds as torch.optim.AdamW/Adam(foreach=True)
does (a model trained through TE's FusedAdam on tex stays on torch's trajectory), the layer norm
forward/backward of TE's modules run in the native zero-copy kernels (fp32/fp16/bf16) on every
thread count and from concurrent callers, and tex's gated derivative (dswiglu, ...) is the same
kernel as the autograd's glu2_bwd."""
from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402
from tensor_ops.tex._norms import ref_layernorm_bwd  # noqa: E402
from tests._helpers import cpp_native  # noqa: E402

pytestmark = pytest.mark.tex

ADAM_BACKENDS = T.backends_for("multi_tensor_adam")


# ---------------------------------------------------------------- Adam in torch's rounding order

def _grads(n, step):
    g = torch.Generator().manual_seed(100 + step)
    # magnitudes over 8 decades: small-v elements are where a biased rounding shows most
    return torch.randn(n, generator=g) * 10.0 ** -torch.randint(0, 8, (n,), generator=g).float()


@pytest.mark.parametrize("backend", ADAM_BACKENDS)
@pytest.mark.parametrize("adam_w_mode,wd", [(1, 0.01), (1, 0.0), (0, 0.01)], ids=["adamw", "adamw-nowd", "adam-l2"])
def test_adam_step_rounds_like_torch_foreach(backend, adam_w_mode, wd):
    """From the same state, one step of tex.multi_tensor_adam gives torch's exp_avg and exp_avg_sq
    bit for bit and the parameter to within one ulp of it plus a few ulp of the update (torch's
    CPU sqrt is MKL's, not correctly rounded), every step of 20. Before: 1 - beta2 was formed in
    fp32 (1.0f - 0.999f is 1.3e-5 off 0.001), every v was biased and the losses of a model drifted
    1.8e-5 apart in 20 steps."""
    n = 4099
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    p_ref = torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(1)) * 0.02)
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    opt = cls([p_ref], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=True)
    with tex.use_backend(backend):
        for step in range(1, 21):
            g = _grads(n, step)
            st = opt.state.get(p_ref, {})
            p = p_ref.detach().clone()
            p_before = p.clone()
            m = st["exp_avg"].clone() if st else torch.zeros(n)
            v = st["exp_avg_sq"].clone() if st else torch.zeros(n)
            tex.multi_tensor_adam(2048 * 32, torch.zeros(1, dtype=torch.int32), [[g.clone()], [p], [m], [v]],
                                  lr, b1, b2, eps, step, adam_w_mode, 1, wd)
            p_ref.grad = g.clone()
            opt.step()
            st = opt.state[p_ref]
            assert torch.equal(m, st["exp_avg"]), f"step {step}: exp_avg differs from torch's"
            assert torch.equal(v, st["exp_avg_sq"]), f"step {step}: exp_avg_sq differs from torch's"
            ulp = torch.from_numpy(np.spacing(np.abs(p_ref.detach().numpy())))
            tol = ulp + 4 * 2.0 ** -24 * (p_ref.detach() - p_before).abs()
            bad = (p - p_ref.detach()).abs() > tol
            assert not bool(bad.any()), f"step {step}: {int(bad.sum())} params off by more than 1 ulp + 4 ulp(update)"


@pytest.mark.parametrize("backend", ADAM_BACKENDS)
def test_adam_20_steps_no_drift(backend):
    """20 steps on their own (no resync), fed the same gradients: tex's parameters stay within a
    few ulp of torch's (the old fp32 1 - beta rounding left them ~1e-7 apart and growing)."""
    n = 8192
    p0 = torch.randn(n, generator=torch.Generator().manual_seed(2)) * 0.02
    p_ref = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([p_ref], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True)
    p, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
    with tex.use_backend(backend):
        for step in range(1, 21):
            g = _grads(n, step)
            tex.multi_tensor_adam(65536, torch.zeros(1, dtype=torch.int32), [[g.clone()], [p], [m], [v]],
                                  1e-3, 0.9, 0.999, 1e-8, step, 1, 1, 0.01)
            p_ref.grad = g
            opt.step()
    assert torch.equal(v, opt.state[p_ref]["exp_avg_sq"])
    diff = p - p_ref.detach()
    moved = (p_ref.detach() - p0).abs()
    assert float(diff.abs().max()) <= 1e-6 * float(moved.max()), float(diff.abs().max())
    # no systematic bias: the differences are rounding noise that cancels, not a scaled update
    assert abs(float(diff.sum())) <= 1e-7 * float(moved.sum()), (float(diff.sum()), float(moved.sum()))


# ---------------------------------------------------------------- layer norm: native, zero-copy

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _served(op):
    import tensor_ops
    info = tensor_ops.get_manager().op_info()
    return dict(info.get(f"tex:{op}", info.get(op, {})).get("calls", {}))


def _ln_case(dt, rows=96, h=320, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, h, generator=g) * 2 + 0.5).to(dt)
    w = (torch.rand(h, generator=g) + 0.5).to(dt)
    b = torch.randn(h, generator=g).to(dt)
    dz = torch.randn(rows, h, generator=g).to(dt)
    return x, w, b, dz


def _te_dt(dt):
    return {torch.float32: tex.DType.kFloat32, torch.float16: tex.DType.kFloat16,
            torch.bfloat16: tex.DType.kBFloat16}[dt]


@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_layernorm_fwd_bwd_native_matches_torch(dt):
    """layernorm_fwd/bwd are served by default.cpp (no reference fallback) for the three dtypes,
    and agree with torch's autograd; dgamma/dbeta come back in gamma's dtype."""
    cpp_native()
    x, w, b, dz = _ln_case(dt)
    before = (_served("layernorm_fwd").get("default.cpp", 0), _served("layernorm_bwd").get("default.cpp", 0))
    y, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, _te_dt(dt), 0, False)
    dx, dg, db = tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)
    after = (_served("layernorm_fwd").get("default.cpp", 0), _served("layernorm_bwd").get("default.cpp", 0))
    assert after[0] == before[0] + 1 and after[1] == before[1] + 1, (before, after)
    xt, wt, bt = (t.float().requires_grad_(True) for t in (x, w, b))
    yt = torch.nn.functional.layer_norm(xt, (x.shape[-1],), wt, bt, 1e-5)
    gx, gw, gb = torch.autograd.grad(yt, (xt, wt, bt), dz.float())
    assert y.dtype is dt and dx.dtype is dt and dg.dtype is dt and db.dtype is dt
    torch.testing.assert_close(y.float(), yt.detach(), **TOL[dt])
    torch.testing.assert_close(dx.float(), gx, **TOL[dt])
    scale = dict(rtol=TOL[dt]["rtol"], atol=TOL[dt]["atol"] * x.shape[0])   # sums over the rows
    torch.testing.assert_close(dg.float(), gw, **scale)
    torch.testing.assert_close(db.float(), gb, **scale)


@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_layernorm_bwd_threads_and_streaming(dt):
    """A backward big enough for threads and streaming stores (4 MiB+ of dx): dx, dgamma and dbeta
    are the same bit for bit on 1 and 2 threads and with rows that do not start on a vector
    boundary (odd h) (dgamma/dbeta: partial sums over fixed row groups, added in group order)."""
    C = cpp_native()
    for rows, h in ((2048, 1024), (1031, 1027)):
        x, w, b, dz = _ln_case(dt, rows, h, seed=3)
        y, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, _te_dt(dt), 0, False)
        old = C.get_num_threads()
        try:
            C.set_num_threads(1)
            one = tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)
            C.set_num_threads(2)
            two = tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)
        finally:
            C.set_num_threads(old)
        ref = ref_layernorm_bwd(dz, x, mu, rs, w, 0, False)
        for a, b2 in zip(one, two):
            assert torch.equal(a, b2)
        for a, r in zip(one, ref):
            torch.testing.assert_close(a.float(), r.float(), rtol=TOL[dt]["rtol"], atol=TOL[dt]["atol"] * 8)


def _in_threads(target, args_list):
    """target(*args) on one Python thread per args, all started before any is joined."""
    ts = [threading.Thread(target=target, args=a) for a in args_list]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_column_reductions_are_deterministic(dt):
    """The reductions over rows - layernorm_bwd's dgamma/dbeta, rmsnorm_bwd's dgamma, dbias_d*'s
    bias gradient, the GEMM's column sums - and multi_tensor_l2norm's fp64 sum of squares give
    the same bits on every call, on 1 or 2 threads and
    from concurrent callers (a caller that finds the pool busy runs alone). Before: per-thread
    partials over dynamically claimed chunks; repeated calls differed in the last bits (fp32
    dbias_dgelu at 8192x4096: up to 8e-4; the l2norm case gave 2 different sums in 12 calls)."""
    from tensor_ops.tex import _cpp_base as A
    C = cpp_native()
    rows, h = 1500, 520
    x, w, b, dz = _ln_case(dt, rows, h, seed=5)
    _, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, _te_dt(dt), 0, False)
    _, _, rrs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, _te_dt(dt), 0, False)

    def col_sums():
        out = torch.empty(h)
        C.col_sums(A._np(dz), out.numpy(), dtype=A._kw(dz))
        return (out,)

    g = torch.Generator().manual_seed(9)
    big = (torch.randn(300_007, generator=g) * torch.logspace(-5, 5, 300_007)).to(dt)   # 8 decades of squares

    calls = {"layernorm_bwd": lambda: tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)[1:],
             "l2norm_sq": lambda: (torch.tensor(C.l2norm_sq(A._np(big), dtype=A._kw(big)), dtype=torch.float64),),
             "rmsnorm_bwd": lambda: tex.rmsnorm_bwd(dz, x, rrs, w, 0, False)[1:],
             "dbias_dgelu": lambda: tex.dbias_dgelu(dz, x, None)[:1],
             "col_sums": col_sums}
    old = C.get_num_threads()
    try:
        with T.forced("cpp"):
            C.set_num_threads(2)
            want = {k: f() for k, f in calls.items()}
            got = {k: [] for k in calls}
            for n in (1, 2, 2):
                C.set_num_threads(n)
                for k, f in calls.items():
                    got[k].append(f())

            def work():
                with T.forced("cpp"):
                    for k, f in calls.items():
                        got[k].append(f())
            _in_threads(work, [()] * 3)
    finally:
        C.set_num_threads(old)
    for k, runs in got.items():
        assert len(runs) == 6, k
        for r in runs:
            assert all(torch.equal(a, b2) for a, b2 in zip(r, want[k])), k


def test_norms_from_concurrent_threads():
    """The kernels release the GIL and share one thread pool: callers on several Python threads
    at once (a call that finds the pool busy runs on its own thread) all get their own right
    answer."""
    C = cpp_native()
    cases = [_ln_case(torch.float32, 1024, 1024, seed=s) for s in range(4)]
    want = []
    for x, w, b, dz in cases:
        y, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, tex.DType.kFloat32, 0, False)
        want.append((y, tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)[0]))
    got: list = [None] * len(cases)
    errors: list = []

    def work(i):
        try:
            x, w, b, dz = cases[i]
            for _ in range(5):
                y, mu, rs = tex.layernorm_fwd(x, w, b, 1e-5, None, None, tex.DType.kFloat32, 0, False)
                got[i] = (y, tex.layernorm_bwd(dz, x, mu, rs, w, 0, False)[0])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    old = C.get_num_threads()
    C.set_num_threads(2)
    try:
        _in_threads(work, [(i,) for i in range(len(cases))])
    finally:
        C.set_num_threads(old)
    assert not errors, errors
    for (y, dx), (yw, dxw) in zip(got, want):
        assert torch.equal(y, yw) and torch.equal(dx, dxw)


@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_te_layernorm_mlp_norms_are_native(dt):
    """TE's LayerNormMLP (the benchmark's module) reaches the native kernels for its norm forward
    and backward in every dtype: nothing falls to the torch reference."""
    cpp_native()
    from tests._te_cpu import cuda_on_cpu, import_te
    te = import_te()
    with cuda_on_cpu():
        m = te.LayerNormMLP(64, 96, activation="swiglu", params_dtype=dt, device="cpu")
        before = {op: _served(op) for op in ("layernorm_fwd", "layernorm_bwd", "dswiglu")}
        x = torch.randn(24, 64).to(dt).requires_grad_(True)
        m(x).float().sum().backward()
    for op, b in before.items():
        a = _served(op)
        new = {k: a.get(k, 0) - b.get(k, 0) for k in a if a.get(k, 0) != b.get(k, 0)}
        assert new == {"default.cpp": 1}, (op, new)


# ---------------------------------------------------------------- one gated derivative


@pytest.mark.parametrize("kind,act", [("swiglu", "silu"), ("geglu", "gelu_tanh")])
@pytest.mark.parametrize("dt", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_dglu_is_glu2_bwd(kind, act, dt):
    """tex's dswiglu/dgeglu and the autograd's glu2_bwd are one kernel (backward.cpp's
    gated_bwd_k): the same bits on [a | b] rows."""
    C = cpp_native()
    g = torch.Generator().manual_seed(5)
    rows, h = 37, 200
    x = (torch.randn(rows, 2 * h, generator=g) * 3).to(dt)
    dy = torch.randn(rows, h, generator=g).to(dt)
    out = getattr(tex, "d" + kind)(dy, x, None)

    def np_(t):
        return (t.view(torch.int16) if t.dtype is torch.bfloat16 else t).numpy()

    kw = {"dtype": "bfloat16"} if dt is torch.bfloat16 else {}
    a, b = x[:, :h].contiguous(), x[:, h:].contiguous()
    da, db = (torch.empty_like(a) for _ in range(2))
    C.glu2_bwd(np_(dy), np_(a), np_(b), np_(da), np_(db), act=act, **kw)
    assert torch.equal(out[:, :h], da) and torch.equal(out[:, h:], db)
