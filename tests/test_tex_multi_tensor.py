"""tex multi_tensor_*: TE's FusedAdam / FusedSGD call sites vs torch.optim; scale and l2norm."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402


class MultiTensorApply:
    """TE's transformer_engine/pytorch/optimizers/multi_tensor_apply.py."""

    def __init__(self, chunk_size):
        self.chunk_size = chunk_size

    def __call__(self, op, noop_flag_buffer, tensor_lists, *args):
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
SHAPES = [(33, 17), (1000,), (5, 6, 7), (1,)]


def _params(dtype=torch.float32, seed=0):
    return [T.rand(s, dtype, seed=seed + i) for i, s in enumerate(SHAPES)]


def _grads(step, dtype=torch.float32):
    return [T.rand(s, dtype, seed=1000 * step + i) for i, s in enumerate(SHAPES)]


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_adam"))
@pytest.mark.parametrize("mode", [0, 1], ids=["L2-Adam", "AdamW"])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_fused_adam_vs_torch(backend, mode, wd):
    lr, betas, eps = 1e-2, (0.9, 0.99), 1e-8
    ref = [p.clone().requires_grad_(True) for p in _params()]
    opt = (torch.optim.AdamW if mode == 1 else torch.optim.Adam)(ref, lr=lr, betas=betas, eps=eps,
                                                                  weight_decay=wd, foreach=False)
    params = _params()
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    noop = torch.zeros(1, dtype=torch.int32)
    for step in range(1, 11):
        gs = _grads(step)
        for p, g in zip(ref, gs):
            p.grad = g.clone()
        opt.step()
        with T.forced(backend):
            multi_tensor_applier(tex.multi_tensor_adam, noop, [gs, params, m, v], lr, betas[0], betas[1], eps,
                                 step, mode, 1, wd)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r.detach(), rtol=1e-5, atol=1e-6)
    assert noop.item() == 0


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_adam"))
@pytest.mark.parametrize("pdtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_adam_master_weights(backend, pdtype):
    """5-list form: math on the fp32 master, p = cast(master)."""
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-8, 0.01
    master = _params()
    ref = [p.clone().requires_grad_(True) for p in master]
    opt = torch.optim.AdamW(ref, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
    params = [p.to(pdtype) for p in master]
    m = [torch.zeros_like(p) for p in master]
    v = [torch.zeros_like(p) for p in master]
    noop = torch.zeros(1, dtype=torch.int32)
    for step in range(1, 11):
        gs = _grads(step, pdtype)
        for p, g in zip(ref, gs):
            p.grad = g.float()
        opt.step()
        with T.forced(backend):
            multi_tensor_applier(tex.multi_tensor_adam, noop, [gs, params, m, v, master], lr, b1, b2, eps, step, 1,
                                 1, wd)
    for p, mw, r in zip(params, master, ref):
        torch.testing.assert_close(mw, r.detach(), rtol=1e-5, atol=1e-6)
        assert torch.equal(p, mw.to(pdtype))


def test_adam_no_bias_correction():
    p = torch.ones(4)
    m, v = torch.zeros(4), torch.zeros(4)
    g = torch.full((4,), 2.0)
    tex.multi_tensor_adam(65536, torch.zeros(1, dtype=torch.int32), [[g], [p], [m], [v]], 0.1, 0.9, 0.999, 0.0, 1,
                          1, 0, 0.0)
    # no bias correction: update = m / sqrt(v) = 0.2 / sqrt(0.004); upstream forms (1 - beta) in fp32,
    # (1 - 0.999f = 0.00099998713), which moves the result by ~3e-6 relative
    assert p[0].item() == pytest.approx(1 - 0.1 * 0.2 / math.sqrt(0.004), rel=1e-5)


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_sgd"))
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd", [0.0, 1e-2])
def test_fused_sgd_arg_order_vs_torch(nesterov, wd, backend):
    """TE's FusedSGD: (wd, momentum, dampening, lr, nesterov, first_run, wd_after_momentum, 1/scale)."""
    lr, momentum, dampening = 0.05, 0.9, 0.0
    ref = [p.clone().requires_grad_(True) for p in _params()]
    opt = torch.optim.SGD(ref, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=wd,
                          foreach=False)
    params = _params()
    bufs = [torch.zeros_like(p) for p in params]
    noop = torch.zeros(1, dtype=torch.int32)
    for step in range(1, 11):
        gs = _grads(step)
        for p, g in zip(ref, gs):
            p.grad = g.clone()
        opt.step()
        with T.forced(backend):
            multi_tensor_applier(tex.multi_tensor_sgd, noop, [gs, params, bufs], wd, momentum, dampening, lr, nesterov,
                                 step == 1, False, 1.0)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r.detach(), rtol=1e-5, atol=1e-6)


def test_sgd_fp16_copy_scale_and_noop():
    params = _params()
    copies = [p.half() for p in params]
    bufs = [torch.zeros_like(p) for p in params]
    gs = _grads(1)
    noop = torch.zeros(1, dtype=torch.int32)
    before = [p.clone() for p in params]
    multi_tensor_applier(tex.multi_tensor_sgd, noop, [gs, params, bufs, copies], 0.0, 0.0, 0.0, 0.1, False, True,
                         False, 0.5)
    for p, b, g, c in zip(params, before, gs, copies):
        torch.testing.assert_close(p, b - 0.1 * 0.5 * g)
        assert torch.equal(c, p.half())
    noop.fill_(1)
    frozen = [p.clone() for p in params]
    multi_tensor_applier(tex.multi_tensor_sgd, noop, [gs, params, bufs], 0.0, 0.0, 0.0, 0.1, False, True, False, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(params, frozen))  # skipped when noop_flag is set


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_scale"))
@pytest.mark.parametrize("src,dst", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                     (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)], ids=str)
def test_scale(backend, src, dst):
    ins = [T.rand(s, src, seed=i) for i, s in enumerate(SHAPES)]
    outs = [torch.empty(s, dtype=dst) for s in SHAPES]
    noop = torch.zeros(1, dtype=torch.int32)
    with T.forced(backend):
        multi_tensor_applier(tex.multi_tensor_scale, noop, [ins, outs], 0.25)
    assert noop.item() == 0
    for i, o in zip(ins, outs):
        T.assert_close(o, i.double() * 0.25)
    ins[2].view(-1)[5] = float("inf")
    with T.forced(backend):
        multi_tensor_applier(tex.multi_tensor_scale, noop, [ins, outs], 0.25)
    assert noop.item() == 1


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_l2norm"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_l2norm(backend, dtype):
    ts = [T.rand(s, dtype, seed=i) for i, s in enumerate(SHAPES)]
    noop = torch.zeros(1, dtype=torch.int32)
    with T.forced(backend):
        norm, per = multi_tensor_applier(tex.multi_tensor_l2norm, noop, [ts], True)
        norm2, per2 = multi_tensor_applier(tex.multi_tensor_l2norm, noop, [ts])
    exp_per = torch.stack([t.double().norm() for t in ts])
    assert norm.dtype == torch.float32 and norm.shape == (1,)
    assert per.dtype == torch.float32 and per.shape == (len(ts),)
    assert per2.shape == (0,) and torch.equal(norm, norm2)
    T.assert_close(norm, exp_per.norm().reshape(1), torch.float32, red=1100)
    T.assert_close(per, exp_per, torch.float32, red=1100)
    unorm, uper = tex.multi_tensor_unscale_l2norm(65536, noop, [ts], torch.tensor([0.5]), True)
    T.assert_close(unorm, 0.5 * exp_per.norm().reshape(1), torch.float32, red=1100)
    T.assert_close(uper, 0.5 * exp_per, torch.float32, red=1100)
    assert noop.item() == 0
    ts[0][0, 0] = float("nan")
    with T.forced(backend):
        multi_tensor_applier(tex.multi_tensor_l2norm, noop, [ts], False)
    assert noop.item() == 1


def test_multi_tensor_bad_input():
    noop = torch.zeros(1, dtype=torch.int32)
    p = [torch.zeros(3)]
    with pytest.raises(ValueError, match="4 or 5"):
        tex.multi_tensor_adam(65536, noop, [p, p, p], 1e-3, 0.9, 0.99, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match="has 2 tensors"):
        tex.multi_tensor_adam(65536, noop, [p, p * 2, p, p], 1e-3, 0.9, 0.99, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match="shape"):
        tex.multi_tensor_adam(65536, noop, [p, [torch.zeros(4)], p, p], 1e-3, 0.9, 0.99, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match="mode=2"):
        tex.multi_tensor_adam(65536, noop, [p, p, p, p], 1e-3, 0.9, 0.99, 1e-8, 1, 2, 1, 0.0)
    with pytest.raises(TypeError, match="11"):
        tex.multi_tensor_sgd(65536, noop, [p, p, p], 0.0, 0.9, 0.0, 0.1, False, True, False)
    with pytest.raises(ValueError, match="one device"):
        tex.multi_tensor_scale(65536, noop, [[torch.zeros(2, device="meta")], [torch.zeros(2)]], 1.0)


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_scale"))
def test_scale_in_place_and_aliasing(backend):
    a = T.rand((64,), torch.float32, seed=1)
    ref = a.double() * 3
    noop = torch.zeros(1, dtype=torch.int32)
    with T.forced(backend):
        tex.multi_tensor_scale(65536, noop, [[a], [a]], 3.0)  # exact in place
    T.assert_close(a, ref)
    buf = T.rand((65,), torch.float32, seed=2)
    src, dst = buf[1:], buf[:-1]  # overlapping views of one storage
    exp = src.double() * 0.5
    with T.forced(backend):
        tex.multi_tensor_scale(65536, noop, [[src], [dst]], 0.5)
    T.assert_close(dst, exp)


def _apex_sgd_f64(g, p, buf, wd, momentum, dampening, lr, nesterov, first_run, wd_after, scale):
    """apex's / TE's SGD kernel (multi_tensor_sgd_kernel.cu) in float64: the oracle for every flag."""
    g, p, buf = g.double() * scale, p.double(), buf.double()
    if wd != 0 and not wd_after:
        g = g + wd * p
    if momentum != 0:
        buf = g if first_run else buf * momentum + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    if wd != 0 and wd_after:
        g = g + wd * p
    return p - lr * g, buf


FLAGS = [(wd, wd_after, momentum, nesterov, first_run)
         for wd in (0.0, 0.01) for wd_after in (False, True) for momentum in (0.0, 0.9)
         for nesterov in (False, True) for first_run in (False, True)]


@pytest.mark.parametrize("backend", T.backends_for("multi_tensor_sgd"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("wd,wd_after,momentum,nesterov,first_run", FLAGS)
def test_sgd_every_flag_combination_vs_float64(backend, dtype, wd, wd_after, momentum, nesterov, first_run):
    """Each combination of the flags (the cpp kernel compiles one loop per combination), grad scale
    and dampening, on sizes with a partial last vector, against apex's formula in float64."""
    lr, dampening, scale = 0.05, 0.25, 0.5
    params, gs = _params(dtype), _grads(1, dtype)
    bufs = [T.rand(p.shape, dtype, seed=77 + i) for i, p in enumerate(params)]
    want = [_apex_sgd_f64(g, p, b, wd, momentum, dampening, lr, nesterov, first_run, wd_after, scale)
            for g, p, b in zip(gs, params, bufs)]
    untouched = [b.clone() for b in bufs]
    with T.forced(backend):
        multi_tensor_applier(tex.multi_tensor_sgd, torch.zeros(1, dtype=torch.int32), [gs, params, bufs], wd, momentum,
                             dampening, lr, nesterov, first_run, wd_after, scale)
    tol = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    for p, b, u, (wp, wb) in zip(params, bufs, untouched, want):
        torch.testing.assert_close(p.double(), wp, rtol=tol, atol=tol)
        if momentum != 0:
            torch.testing.assert_close(b.double(), wb, rtol=tol, atol=tol)
        else:
            assert torch.equal(b, u)  # no momentum: the buffer is not written
