"""tex norms vs fp64 torch autograd, every backend, fp32/fp16/bf16, TE's shapes."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402

# run once per forced backend in CI (TENSOR_OPS_BACKEND=<name> pytest -m <name>)
pytestmark = pytest.mark.every_backend

SHAPES = [(1, 7), (5, 33), (3, 4, 64), (2, 3, 5, 129), (0, 16)]
DT = [pytest.param(d, id=str(d).split(".")[-1]) for d in T.DTYPES]


@pytest.mark.parametrize("backend", T.backends_for("rmsnorm_fwd"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zc"])
def test_rmsnorm_fwd_bwd(backend, dtype, shape, zc):
    x = T.rand(shape, dtype, seed=1)
    w = T.rand(shape[-1:], dtype, seed=2, scale=0.5) + (0 if zc else 1)
    dz = T.rand(shape, dtype, seed=3)
    eps = 1e-5
    with T.forced(backend):
        out, none, rs = tex.rmsnorm_fwd(x, w, eps, None, None, tex.DType(tex._enums.to_te_dtype(dtype)), 0, zc)
        dx, dg = tex.rmsnorm_bwd(dz, x, rs, w, 0, zc)
        dx7, dg7 = tex.rmsnorm_bwd(dz, x, rs, w, 0, zc, eps)  # TE-FL's 7-argument form
    assert none is None
    assert rs.dtype == torch.float32 and tuple(rs.shape) == (x.numel() // shape[-1],)
    assert out.dtype == dtype and out.shape == x.shape
    ref, (gx, gw) = T.grads(lambda a, b: T.rmsnorm(a, b, eps, zc), [x, w], dz)
    T.assert_close(out, ref, msg="out")
    x64 = x.double()
    T.assert_close(rs, torch.rsqrt(x64.square().mean(-1) + eps).reshape(-1), torch.float32, msg="rsigma")
    assert dx.dtype == dtype and dg.dtype == dtype and dg.shape == w.shape
    T.assert_close(dx, gx, msg="dx")
    T.assert_close(dg, gw, red=max(1, x.numel() // shape[-1]), msg="dgamma")
    assert torch.equal(dx, dx7) and torch.equal(dg, dg7)


@pytest.mark.parametrize("backend", T.backends_for("layernorm_fwd"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zc"])
def test_layernorm_fwd_bwd(backend, dtype, shape, zc):
    x = T.rand(shape, dtype, seed=4) + 0.5
    w = T.rand(shape[-1:], dtype, seed=5, scale=0.5) + (0 if zc else 1)
    b = T.rand(shape[-1:], dtype, seed=6)
    dz = T.rand(shape, dtype, seed=7)
    eps = 1e-5
    with T.forced(backend):
        out, mu, rs = tex.layernorm_fwd(x, w, b, eps, None, None, dtype, 0, zc)
        dx, dg, db = tex.layernorm_bwd(dz, x, mu, rs, w, 0, zc)
    n = x.numel() // shape[-1]
    assert mu.dtype == rs.dtype == torch.float32 and mu.shape == rs.shape == (n,)
    ref, (gx, gw, gb) = T.grads(lambda a, c, d: T.layernorm(a, c, d, eps, zc), [x, w, b], dz)
    T.assert_close(out, ref, msg="out")
    T.assert_close(mu, x.double().mean(-1).reshape(-1), torch.float32, msg="mu")
    if n:
        T.assert_close(rs, torch.rsqrt(x.double().var(-1, unbiased=False) + eps).reshape(-1), torch.float32,
                       red=2, msg="rsigma")
    T.assert_close(dx, gx, msg="dx")
    T.assert_close(dg, gw, red=max(1, n), msg="dgamma")
    T.assert_close(db, gb, red=max(1, n), msg="dbeta")


@pytest.mark.parametrize("backend", T.backends_for("rmsnorm_bwd_add"))
@pytest.mark.parametrize("dtype", DT)
def test_rmsnorm_bwd_add(backend, dtype):
    x, dz, add = T.rand((6, 40), dtype, seed=1), T.rand((6, 40), dtype, seed=2), T.rand((6, 40), dtype, seed=3)
    w = T.rand((40,), dtype, seed=4) + 1
    with T.forced(backend):
        _, _, rs = tex.rmsnorm_fwd(x, w, 1e-6, None, None, None, 0, False)
        dx, dg = tex.rmsnorm_bwd_add(dz, x, add, rs, w, 0, False)
    _, (gx, gw) = T.grads(lambda a, b: T.rmsnorm(a, b, 1e-6), [x, w], dz)
    T.assert_close(dx, gx + add.double(), msg="dx+add")
    T.assert_close(dg, gw, red=6, msg="dgamma")


def test_otype_and_ln_out():
    x = T.rand((4, 24), torch.float32)
    w = torch.ones(24)
    out, _, _ = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    assert out.dtype == torch.bfloat16
    out, _, _ = tex.rmsnorm_fwd(x, w, 1e-5, None, None, torch.float16, 0, False)  # torch.dtype accepted
    assert out.dtype == torch.float16
    buf = torch.empty(4, 24, dtype=torch.bfloat16)
    out, mu, rs = tex.layernorm_fwd(x, w, torch.zeros(24), 1e-5, buf, None, tex.DType.kBFloat16, 0, False)
    assert out is buf
    ref = T.layernorm(x.double(), w.double(), None, 1e-5)
    T.assert_close(buf, ref)


def test_apply_normalization_call_site():
    """TE's transformer_engine/pytorch/module/_common.py apply_normalization, as TE writes it."""
    TE_DType = {torch.uint8: tex.DType.kByte, torch.int32: tex.DType.kInt32, torch.float32: tex.DType.kFloat32,
                torch.half: tex.DType.kFloat16, torch.bfloat16: tex.DType.kBFloat16}
    inputmat = T.rand((2, 3, 64), torch.bfloat16)
    ln_weight = torch.ones(64, dtype=torch.bfloat16)
    ln_bias = torch.zeros(64, dtype=torch.bfloat16)
    for normalization in ("LayerNorm", "RMSNorm"):
        normalization_func = {"LayerNorm": tex.layernorm_fwd, "RMSNorm": tex.rmsnorm_fwd}[normalization]
        inputs = (inputmat, ln_weight) if ln_bias is None or normalization == "RMSNorm" else (inputmat, ln_weight,
                                                                                              ln_bias)
        output = normalization_func(*inputs, 1e-5, None, None, TE_DType[inputmat.dtype], 0, False)
        ln_out, mu, rsigma = output
        assert ln_out.shape == inputmat.shape and ln_out.dtype == torch.bfloat16
        assert (mu is None) == (normalization == "RMSNorm")
        assert rsigma.dtype == torch.float32 and rsigma.shape == (6,)


def test_norm_bad_input():
    x, w = torch.randn(4, 8), torch.ones(8)
    with pytest.raises(ValueError, match=r"weight has shape \(7,\)"):
        tex.rmsnorm_fwd(x, torch.ones(7), 1e-5, None, None, None, 0, False)
    with pytest.raises(TypeError, match="6 .* or 7"):
        tex.rmsnorm_bwd(x, x, torch.ones(4), w, 0)
    with pytest.raises(TypeError, match="8 were given"):
        tex.rmsnorm_bwd(x, x, torch.ones(4), w, 0, False, 1e-5, 1)
    with pytest.raises(TypeError):
        tex.rmsnorm_fwd(x, w, 1e-5, None, None, None, 0)
    with pytest.raises(TypeError, match="7"):
        tex.layernorm_bwd(x, x, torch.ones(4), torch.ones(4), w, 0)
    with pytest.raises(ValueError, match="rsigma has 3 elements"):
        tex.rmsnorm_bwd(x, x, torch.ones(3), w, 0, False)
    with pytest.raises(ValueError, match="ln_out has shape"):
        tex.rmsnorm_fwd(x, w, 1e-5, torch.empty(4, 9), None, None, 0, False)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tex.rmsnorm_fwd(x.numpy(), w, 1e-5, None, None, None, 0, False)
    with pytest.raises(ValueError, match="not a tex.DType"):
        tex.rmsnorm_fwd(x, w, 1e-5, None, None, 3, 0, False)


def test_norm_different_devices():
    meta = torch.ones(8, device="meta")
    with pytest.raises(ValueError, match="different devices"):
        tex.rmsnorm_fwd(torch.randn(4, 8), meta, 1e-5, None, None, None, 0, False)


def test_quantizer_not_implemented():
    class Float8Quantizer:
        pass
    with pytest.raises(NotImplementedError, match="rmsnorm_fwd.*Float8Quantizer"):
        tex.rmsnorm_fwd(torch.randn(2, 8), torch.ones(8), 1e-5, None, Float8Quantizer(), None, 0, False)
    with pytest.raises(NotImplementedError, match="gelu.*Float8Quantizer"):
        tex.gelu(torch.randn(2, 8), Float8Quantizer())


@pytest.mark.parametrize("backend", T.backends_for("rmsnorm_fwd"))
def test_strided_and_mixed_dtype_inputs(backend):
    """Views the native kernels do not take (non-contiguous, fp32 gamma with bf16 input) still
    give TE's result: the adapter declines them and the next candidate serves."""
    base = T.rand((16, 40), torch.float32, seed=11)
    x = base.t()[:, ::2]  # (40, 8) non-contiguous
    w = T.rand((8,), torch.float32, seed=12) + 1
    with T.forced(backend):
        out, _, rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, None, 0, False)
        xb = x.contiguous().bfloat16()
        outb, _, _ = tex.rmsnorm_fwd(xb, w, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    T.assert_close(out, T.rmsnorm(x.double(), w.double(), 1e-5))
    T.assert_close(outb, T.rmsnorm(xb.double(), w.double(), 1e-5))


@pytest.mark.parametrize("backend", T.backends_for("rmsnorm_fwd"))
@pytest.mark.parametrize("dtype", DT)
def test_large_outputs(backend, dtype):
    """Outputs above 4 MiB (the cpp adapter allocates those through NumPy for huge pages)."""
    x = T.rand((1100, 2048), dtype, seed=21)
    w = T.rand((2048,), dtype, seed=22) + 1
    with T.forced(backend):
        out, _, rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, dtype, 0, False)
        g = tex.gelu(out, None)
        dx, dw = tex.rmsnorm_bwd(g, x, rs, w, 0, False)
    assert out.dtype == dtype and out.shape == x.shape and dx.dtype == dtype
    T.assert_close(out, T.rmsnorm(x.double(), w.double(), 1e-5))
    out2 = out * 2  # ordinary torch tensors: usable anywhere
    assert out2.dtype == dtype and torch.isfinite(dx.float()).all()
