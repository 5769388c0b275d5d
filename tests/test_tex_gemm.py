"""tex.generic_gemm: layouts, epilogues, TE's Linear call sites, bad shapes."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402
from tests._helpers import cpp_native  # noqa: E402

DT = [pytest.param(d, id=str(d).split(".")[-1]) for d in T.DTYPES]
WS = torch.empty(0, dtype=torch.uint8)


def gemm(A, transA, B, transB, D=None, out_dtype=None, bias=None, gelu=False, gelu_in=None, grad=False,
         accumulate=False, **kw):
    return tex.generic_gemm(A, transA, B, transB, D, None, out_dtype, bias, None, gelu, gelu_in, grad, WS, 0,
                            accumulate, False, **kw)


def general_gemm(A, B, workspace, out_dtype=None, quantization_params=None, gelu=False, gelu_in=None,
                 accumulate=False, layout="TN", out=None, bias=None, use_split_accumulator=False, grad=False):
    """TE's transformer_engine/pytorch/cpp_extensions/gemm.py general_gemm (quantizer-free part)."""
    transa = layout[0] == "T"
    transb = layout[1] == "T"
    bias_dtype = tex.DType.kFloat32 if bias is None else {torch.float32: tex.DType.kFloat32,
                                                          torch.bfloat16: tex.DType.kBFloat16,
                                                          torch.float16: tex.DType.kFloat16}[bias.dtype]
    args = (A, transa, B, transb, out, quantization_params,
            None if out_dtype is None else {torch.float32: tex.DType.kFloat32, torch.bfloat16: tex.DType.kBFloat16,
                                            torch.float16: tex.DType.kFloat16}[out_dtype],
            bias, bias_dtype, gelu, gelu_in, grad, workspace, workspace.shape[0], accumulate, use_split_accumulator)
    out, bias_grad, gelu_input, extra_output = tex.generic_gemm(*args)
    return out, bias_grad, gelu_input, extra_output


@pytest.mark.parametrize("backend", T.backends_for("generic_gemm"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("transA", [False, True], ids=["nA", "tA"])
@pytest.mark.parametrize("transB", [False, True], ids=["nB", "tB"])
def test_layouts(backend, dtype, transA, transB):
    m, k, n = 7, 33, 5
    A = T.rand((n, k) if transA else (k, n), dtype, seed=1)
    B = T.rand((k, m) if transB else (m, k), dtype, seed=2)
    with T.forced(backend):
        D, bg, pre, extra = gemm(A, transA, B, transB)
    ref = (B.double().t() if transB else B.double()) @ (A.double().t() if transA else A.double())
    assert D.dtype == dtype and bg is None and pre is None and extra is None
    T.assert_close(D, ref, red=k)


def test_leading_dims_and_output_dtype():
    x = T.rand((3, 4, 16), torch.bfloat16)
    W = T.rand((8, 16), torch.bfloat16, seed=3)
    D, *_ = gemm(W, True, x, False, out_dtype=tex.DType.kFloat32)
    assert D.shape == (3, 4, 8) and D.dtype == torch.float32
    T.assert_close(D, x.double() @ W.double().t(), torch.float32, red=16)


def test_bias_gelu_epilogue_and_dgelu():
    x, W = T.rand((6, 12), torch.float32), T.rand((10, 12), torch.float32, seed=1)
    b = T.rand((10,), torch.float32, seed=2)
    D, bg, pre, _ = gemm(W, True, x, False, bias=b, gelu=True)
    pre_ref = x.double() @ W.double().t() + b.double()
    T.assert_close(pre, pre_ref, red=12)
    T.assert_close(D, F.gelu(pre_ref, approximate="tanh"), red=12)
    assert bg is None
    # grad=True with gelu: D = (dy @ W2) * gelu'(gelu_in); bias grad of that (DGELU_BGRAD)
    dy, W2 = T.rand((6, 4), torch.float32, seed=5), T.rand((4, 10), torch.float32, seed=6)
    D2, bg2, pre2, _ = gemm(W2, False, dy, False, bias=torch.empty(10), gelu=True, gelu_in=pre, grad=True)
    _, (gpre,) = T.grads(lambda p: F.gelu(p, approximate="tanh"), [pre], dy.double() @ W2.double())
    T.assert_close(D2, gpre, red=4)
    T.assert_close(bg2, gpre.sum(0), red=24)
    assert pre2 is None


def test_gelu_in_buffer_is_filled():
    x, W = T.rand((4, 8), torch.float32), T.rand((6, 8), torch.float32, seed=1)
    buf = torch.empty(4, 6)
    D, _, pre, _ = gemm(W, True, x, False, gelu=True, gelu_in=buf)
    assert pre is buf
    T.assert_close(buf, x.double() @ W.double().t(), red=8)


@pytest.mark.parametrize("dtype", DT)
def test_te_linear_call_sites(dtype):
    """Forward "TN", dgrad "NN", wgrad "NT" with grad=True and bias: vs torch autograd of F.linear."""
    x = T.rand((2, 5, 24), dtype, seed=1)
    W = T.rand((16, 24), dtype, seed=2)
    b = T.rand((16,), dtype, seed=3)
    dy = T.rand((2, 5, 16), dtype, seed=4)
    ws = torch.empty(32, dtype=torch.uint8)
    y, _, _, _ = general_gemm(W, x, ws, out_dtype=dtype, bias=b, layout="TN")
    dgrad, _, _, _ = general_gemm(W, dy, ws, out_dtype=dtype, layout="NN")
    x2, dy2 = x.reshape(-1, 24), dy.reshape(-1, 16)
    wgrad, bgrad, _, _ = general_gemm(x2, dy2, ws, out_dtype=dtype, layout="NT", bias=b, grad=True)
    ref, (gx, gW, gb) = T.grads(lambda a, w, c: F.linear(a, w, c), [x, W, b], dy)
    T.assert_close(y, ref, red=24, msg="fwd")
    T.assert_close(dgrad, gx, red=16, msg="dgrad")
    T.assert_close(wgrad, gW, red=10, msg="wgrad")
    T.assert_close(bgrad, gb, red=10, msg="bias grad")
    assert bgrad.dtype == dtype and bgrad.shape == (16,)


@pytest.mark.parametrize("backend", T.backends_for("generic_gemm"))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("otype", ["same", torch.float32])
def test_bias_grad_rounds_once(backend, dtype, otype):
    """BGRADB of a 16-bit B: column sums accumulated in fp32, rounded once to otype (as cuBLASLt's
    epilogue), whether otype is B's dtype (torch's 16-bit sum, no fp32 copy of B) or fp32."""
    otype = dtype if otype == "same" else otype
    x, dy = T.rand((300, 24), dtype, seed=5), T.rand((300, 40), dtype, seed=6) * 3
    ws = torch.empty(32, dtype=torch.uint8)
    with T.forced(backend):
        _, bgrad, _, _ = general_gemm(x, dy, ws, out_dtype=otype, layout="NT", bias=torch.zeros(40, dtype=dtype),
                                      grad=True)
    assert bgrad.dtype == otype
    exact = dy.double().sum(0)
    half_ulp = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -20}[otype]
    err = (bgrad.double() - exact).abs()
    assert (err <= half_ulp * exact.abs() + 1e-6).all(), err.max()   # one rounding, no 16-bit partial sums


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("rows,n", [(0, 5), (1, 1), (67, 17), (64, 40), (1000, 1030), (129, 4096)])
def test_native_column_sums(dtype, rows, n):
    """default.cpp's bias gradient (``_cpp.col_sums``): every remainder of its 64-row blocks, 4-row
    steps and vector lanes, against fp64; error within a 64-term fp32 sum per block."""
    C = cpp_native()
    from tensor_ops.tex import _cpp_base as A
    x = T.rand((rows, n), dtype, seed=rows + n) * 4 - 1
    out = torch.full((n,), float("nan"))
    C.col_sums(A._np(x), out.numpy(), dtype=A._kw(x))
    exact = x.double().sum(0)
    u = 2.0 ** -24
    bound = 64 * u * x.double().abs().sum(0) + u * exact.abs()
    assert ((out.double() - exact).abs() <= bound).all(), (out.double() - exact).abs().max()


def test_native_column_sums_fold_blocks_in_fp64():
    """A column of 2^26 and then ones: an fp32 running sum drops every 1 (2^26 + 4 rounds to 2^26,
    even four at a time); the blocked sum loses at most the first block's 63 and adds the other
    blocks exactly in fp64 (a plain fp32 sum is 1024 off here)."""
    C = cpp_native()
    x = torch.ones(1025, 3)
    x[0] = 2.0 ** 26
    out = torch.empty(3)
    C.col_sums(x.numpy(), out.numpy())
    err = (out.double() - (2.0 ** 26 + 1024)).abs()
    assert (err <= 63 + 8).all(), out     # + 8: the result's own rounding (fp32 spacing at 2^26)
    with pytest.raises(ValueError, match="out must hold n = 3"):
        C.col_sums(x.numpy(), torch.empty(4).numpy())


def test_accumulate_alpha_beta_and_inplace():
    A, B = T.rand((8, 4), torch.float32), T.rand((3, 8), torch.float32, seed=1)
    D0 = T.rand((3, 4), torch.float32, seed=2)
    D = D0.clone()
    out, *_ = gemm(A, False, B, False, D=D, accumulate=True)
    assert out is D
    T.assert_close(D, B.double() @ A.double() + D0.double(), red=8)
    D = D0.clone()
    gemm(A, False, B, False, D=D, accumulate=True, alpha=0.5, beta=2.0)
    T.assert_close(D, 0.5 * (B.double() @ A.double()) + 2 * D0.double(), red=8)
    D = D0.clone()
    gemm(A, False, B, False, D=D, alpha=-1.0)  # not accumulating: overwritten
    T.assert_close(D, -(B.double() @ A.double()), red=8)
    with pytest.raises(ValueError, match="beta"):
        gemm(A, False, B, False, D=D, beta=1.0)


def test_empty():
    A, B = torch.randn(0, 4), torch.randn(3, 0)
    D = torch.full((3, 4), 7.0)
    out, bg, _, _ = gemm(A, False, B, False, D=D, bias=torch.ones(3), grad=True)
    assert torch.equal(out, torch.zeros(3, 4))
    assert torch.equal(bg, torch.zeros(0)) or bg.abs().sum() == 0


def test_shape_mismatch_message():
    A, B = torch.randn(16, 24), torch.randn(5, 23)
    with pytest.raises(ValueError) as ei:
        gemm(A, True, B, False)
    msg = str(ei.value)
    assert "(16, 24)" in msg and "(5, 23)" in msg and "transA=True" in msg and "transB=False" in msg
    with pytest.raises(ValueError, match="D has shape"):
        gemm(torch.randn(16, 24), True, torch.randn(5, 24), False, D=torch.empty(5, 15))
    with pytest.raises(ValueError, match="different devices"):
        gemm(torch.randn(16, 24), True, torch.randn(5, 24, device="meta"), False)


def test_seed_testing_your_backend_snippet():
    """TE-FL README's "Testing Your Backend", on CPU tensors."""
    x = torch.randn(32, 1024, dtype=torch.bfloat16)
    weight = torch.ones(1024, dtype=torch.bfloat16)
    output, _, rsigma = tex.rmsnorm_fwd(x, weight, 1e-5, None, None, torch.bfloat16, 0, False)
    assert output.shape == (32, 1024)
    A = torch.randn(1024, 512, dtype=torch.bfloat16)
    B = torch.randn(512, 2048, dtype=torch.bfloat16)
    D = torch.empty(1024, 2048, dtype=torch.bfloat16)
    workspace = torch.empty(1024 * 1024, dtype=torch.uint8)
    # upstream's D = B @ A with A (1024, 512), B (512, 2048): K = A0 = 1024 != B1 = 2048 → the
    # snippet's shapes only fit as op(B) @ op(A) = B.T... so TE would reject it; we do too, clearly.
    with pytest.raises(ValueError, match="inner dimensions"):
        tex.generic_gemm(A, False, B, False, D, None, torch.bfloat16, None, None, False, None, False, workspace,
                         1024 * 1024, False, False)
    # the intended product A @ B in TE's row-major convention: generic_gemm(B, False, A, False)
    result = tex.generic_gemm(B, False, A, False, D, None, torch.bfloat16, None, None, False, None, False,
                              workspace, 1024 * 1024, False, False)
    assert result[0] is D and D.shape == (1024, 2048)
    T.assert_close(D[:4], A[:4].double() @ B.double(), red=512)
