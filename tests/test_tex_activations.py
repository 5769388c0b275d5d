"""tex activations (plain, gated, d*, dbias_d*, clamped SwiGLU, bgrad_quantize) vs fp64 autograd."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _activations as A  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402

# run once per forced backend in CI (TENSOR_OPS_BACKEND=<name> pytest -m <name>)
pytestmark = pytest.mark.every_backend

DT = [pytest.param(d, id=str(d).split(".")[-1]) for d in T.DTYPES]
SHAPES = [(1, 6), (7, 34), (2, 3, 130), (0, 8)]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", A.PLAIN_OPS)
def test_plain(name, shape, dtype):
    for backend in [p.values[0] for p in T.backends_for(name) if not p.marks]:
        x = T.rand(shape, dtype, seed=1, scale=2)
        g = T.rand(shape, dtype, seed=2)
        with T.forced(backend):
            y = getattr(tex, name)(x, None)
            dx = getattr(tex, "d" + name)(g, x, None)
            db, dx2 = getattr(tex, "dbias_d" + name)(g, x, None)
        ref, (gx,) = T.grads(T.ACT[name], [x], g)
        assert y.dtype == dx.dtype == dtype
        T.assert_close(y, ref, msg=f"{backend} {name}")
        T.assert_close(dx, gx, msg=f"{backend} d{name}")
        assert torch.equal(dx2, dx)
        # bias gradient = column sums of the d-activation output (not of grad), first element
        n = max(1, x.numel() // shape[-1])
        T.assert_close(db, dx.double().reshape(-1, shape[-1]).sum(0), red=n, msg=f"{backend} dbias_d{name}")
        assert db.shape == (shape[-1],) and db.dtype == dtype


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", ["gelu", "silu"])
@pytest.mark.parametrize("rows, n", [(1024, 4100), (1023, 4096), (7, 64)], ids=str)
def test_dbias_streamed_rows_store_dacts_bits(name, dtype, rows, n):
    """The bias-gradient path at sizes whose output is streamed - rows of 4100 (off every vector
    boundary: partial heads and tails) and an odd count of rows of 4096 (the cpp kernel writes
    those in pairs, one pass over the column sums for two rows, and the last row alone) - and a
    small cached one: the output holds exactly d<act>'s bits (a 16-bit output is rounded once,
    and those bits are both stored and summed - cpp_ext/tex_train.cpp stored_summed) and the
    bias gradient is their column sums."""
    for backend in [p.values[0] for p in T.backends_for("dbias_d" + name) if not p.marks]:
        x = T.rand((rows, n), dtype, seed=5, scale=2)
        g = T.rand((rows, n), dtype, seed=6)
        with T.forced(backend):
            dx = getattr(tex, "d" + name)(g, x, None)
            db, dx2 = getattr(tex, "dbias_d" + name)(g, x, None)
        assert torch.equal(dx2, dx), f"{backend} dbias_d{name}: the stored output differs from d{name}'s"
        T.assert_close(db, dx.double().sum(0), red=rows, msg=f"{backend} dbias_d{name}")


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", A.GATED_OPS)
def test_gated(name, shape, dtype):
    for backend in [p.values[0] for p in T.backends_for(name) if not p.marks]:
        x = T.rand(shape, dtype, seed=3, scale=2)
        g = T.rand(shape[:-1] + (shape[-1] // 2,), dtype, seed=4)
        with T.forced(backend):
            y = getattr(tex, name)(x, None)
            dx = getattr(tex, "d" + name)(g, x, None)
        ref, (gx,) = T.grads(lambda v: T.gated(name, v), [x], g)
        assert y.shape == g.shape and dx.shape == x.shape
        T.assert_close(y, ref, msg=f"{backend} {name}")
        T.assert_close(dx, gx, msg=f"{backend} d{name}")


def test_glu_gates_the_second_half():
    x = torch.tensor([[0.0, 3.0]])  # a = 0, b = 3 → sigmoid(0)·3 = 1.5 (torch's F.glu would give 0·σ(3))
    assert tex.glu(x, None).item() == pytest.approx(1.5)
    x = torch.tensor([[2.0, 5.0]])
    assert tex.swiglu(x, None).item() == pytest.approx(2 * torch.sigmoid(torch.tensor(2.0)).item() * 5, rel=1e-6)


def test_gelu_is_tanh_form():
    x = torch.linspace(-4, 4, 101)
    k = x * (0.79788456 + 0.03567741 * x * x)
    torch.testing.assert_close(tex.gelu(x, None), x * (0.5 + 0.5 * torch.tanh(k)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("limit,alpha,off", [(7.0, 1.702, 1.0), (1.5, 1.0, 0.5)])
def test_clamped_swiglu(dtype, limit, alpha, off):
    x = T.rand((9, 40), dtype, seed=5, scale=4)
    g = T.rand((9, 20), dtype, seed=6)
    y = tex.clamped_swiglu(x, None, limit, alpha, off)
    dx = tex.clamped_dswiglu(g, x, None, limit=limit, alpha=alpha, glu_linear_offset=off)
    ref, (gx,) = T.grads(lambda v: T.clamped_swiglu(v, limit, alpha, off), [x], g)
    T.assert_close(y, ref)
    T.assert_close(dx, gx)
    a = x[:, :20].double()
    assert (dx[:, :20][a > limit] == 0).all()  # no gradient through a where a > limit


def test_bgrad_quantize():
    x = T.rand((3, 4, 10), torch.bfloat16)
    db, same = tex.bgrad_quantize(x, None)
    assert same is x
    T.assert_close(db, x.double().reshape(-1, 10).sum(0), red=12)


def test_activation_bad_input():
    with pytest.raises(ValueError, match="must be even"):
        tex.swiglu(torch.randn(3, 5), None)
    with pytest.raises(ValueError, match="grad has shape"):
        tex.dswiglu(torch.randn(3, 4), torch.randn(3, 4), None)
    with pytest.raises(ValueError, match="grad has shape"):
        tex.dgelu(torch.randn(3, 5), torch.randn(3, 4), None)
    with pytest.raises(TypeError):
        tex.gelu()
    with pytest.raises(TypeError, match="dtype"):
        tex.gelu(torch.ones(3, dtype=torch.int32), None)
    assert tex.gelu(input=torch.zeros(2), quantizer=None).shape == (2,)  # TE's keyword names
    assert tex.dgelu(grad=torch.zeros(2), fwd_input=torch.zeros(2), quantizer=None).shape == (2,)


@pytest.mark.parametrize("name", ["silu", "gelu", "qgelu"])
def test_derivatives_at_the_extremes_match_autograd(name):
    """±Inf, NaN and arguments whose exponential overflows: the native derivative (1 - s formed
    without cancellation, vmath.h vsig_parts) gives autograd's values, NaN where it has NaN."""
    x = torch.tensor([-float("inf"), -1000.0, -100.0, -88.0, -20.0, -0.75, 0.0, 20.0, 88.0, 100.0,
                      float("inf"), float("nan")] * 3)
    g = torch.ones_like(x)
    for backend in [p.values[0] for p in T.backends_for("d" + name) if not p.marks]:
        with T.forced(backend):
            dx = getattr(tex, "d" + name)(g, x, None)
        _, (gx,) = T.grads(T.ACT[name], [x], g)
        assert torch.equal(torch.isnan(dx), torch.isnan(gx)), (backend, dx, gx)
        torch.testing.assert_close(dx, gx.to(dx.dtype), rtol=2e-6, atol=1e-6, equal_nan=True)
