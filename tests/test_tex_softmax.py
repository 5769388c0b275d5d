"""tex fused softmax family vs fp64 torch autograd; mask semantics; bad masks."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402

DT = [pytest.param(d, id=str(d).split(".")[-1]) for d in T.DTYPES]


def _check(fwd, bwd, x, ref_fn, scale, backend):
    dy = T.rand(x.shape, x.dtype, seed=9)
    with T.forced(backend):
        y = fwd(x, scale)
        dx = bwd(dy, y, scale)
    ref, (gx,) = T.grads(ref_fn, [x], dy)
    T.assert_close(y, ref)
    # the backward uses the stored (rounded) probabilities, as TE's kernels do
    y64 = y.double()
    exp = scale * y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))
    T.assert_close(dx, exp, red=x.shape[-1])
    if x.dtype == torch.float32:  # low precision: y's rounding dominates; checked against `exp` above
        T.assert_close(dx, gx, red=x.shape[-1])
    assert dx.dtype == x.dtype and dx.data_ptr() != dy.data_ptr()


@pytest.mark.parametrize("backend", T.backends_for("scaled_softmax_forward"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", [(1, 1, 1, 7), (2, 3, 5, 33), (1, 2, 4, 128)], ids=str)
@pytest.mark.parametrize("scale", [0.7, 1.0])
def test_scaled_softmax(backend, dtype, shape, scale):
    x = T.rand(shape, dtype, seed=1, scale=3)
    _check(tex.scaled_softmax_forward, tex.scaled_softmax_backward, x,
           lambda v: torch.softmax(v * scale, -1), scale, backend)


@pytest.mark.parametrize("backend", T.backends_for("scaled_masked_softmax_forward"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("mask_b", [1, 2])
def test_scaled_masked_softmax(backend, dtype, mask_b):
    b, h, sq, sk = 2, 3, 6, 17
    x = T.rand((b, h, sq, sk), dtype, seed=2, scale=3)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand((mask_b, 1, sq, sk), generator=g) < 0.3).to(torch.uint8)
    mask[0, 0, 1, :] = 1  # one fully masked row → zeros

    def ref(v):
        logits = (v * 0.5).masked_fill(mask.bool(), -10000.0)
        out = torch.softmax(logits, -1)
        return out.masked_fill(mask.bool().all(-1, keepdim=True), 0.0)

    _check(lambda v, s: tex.scaled_masked_softmax_forward(v, mask, s), tex.scaled_masked_softmax_backward,
           x, ref, 0.5, backend)
    with T.forced(backend):
        y = tex.scaled_masked_softmax_forward(x, mask, 0.5)
    assert (y[:, :, 1][0] == 0).all() if mask_b == 1 else (y[0, :, 1] == 0).all()


@pytest.mark.parametrize("backend", T.backends_for("scaled_softmax_forward"))
@pytest.mark.parametrize("n", [2, 21, 64])
def test_scaled_softmax_huge_logit_is_rounded_before_the_shift(backend, n):
    """x*scale is a rounded fp32 logit: z - max(z) is exactly 0 at the max. GCC contracted
    x*scale - max into one FMA (unrounded product minus the rounded max: +1e23 for x = 1e30,
    scale 3), so e^(z - max) overflowed and the row came out NaN (tests/test_fuzz.py found it)."""
    x = torch.zeros(1, 1, 1, n)
    x[..., 0] = 1e30
    x[..., 1:] = T.rand((1, 1, 1, n - 1), torch.float32, seed=4)
    with T.forced(backend):
        y = tex.scaled_softmax_forward(x, 3.0)
    want = torch.zeros_like(x)
    want[..., 0] = 1.0
    assert torch.equal(y, want), y


@pytest.mark.parametrize("backend", T.backends_for("scaled_masked_softmax_forward"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("sk", [5, 256, 300], ids=lambda n: f"sk{n}")
def test_masked_softmax_follows_te_mask_rules(backend, dtype, sk):
    """TE's kernel (scaled_masked_softmax.cu) masks where ``mask == 1`` only (it tests
    ``mask != 1``: 2 and 255 keep their logit) and multiplies a row by 0 where the row's max is
    -10000 (``scale_value``): every logit masked, or none above -10000 - then also a row with
    some logits masked below it. A row of logits all below -10000 with nothing masked is a plain
    softmax. Every backend, rows on the pipelined (sk 256) and unpipelined paths."""
    g = torch.Generator().manual_seed(5)
    sq = 8
    x = T.rand((1, 2, sq, sk), dtype, seed=6, scale=3)
    mask = torch.zeros(1, 1, sq, sk, dtype=torch.uint8)
    mask[0, 0, 0] = (torch.rand(sk, generator=g) < 0.4).to(torch.uint8) * 2      # 2: not masked
    mask[0, 0, 1] = (torch.rand(sk, generator=g) < 0.4).to(torch.uint8) * 255    # 255: not masked
    mask[0, 0, 2] = torch.randint(0, 3, (sk,), generator=g, dtype=torch.uint8)   # only the 1s mask
    mask[0, 0, 3] = 1                                                            # all masked: zeros
    mask[0, 0, 4, 1] = 1                     # one masked, the rest below -10000: max -10000, zeros
    x[:, :, 4] = -20000.0 - x[:, :, 4].abs()
    x[:, :, 5] = -20000.0 - x[:, :, 5].abs()  # all below -10000, nothing masked: a softmax
    x[:, :, 6] = -30000.0                     # one logit exactly -10000, nothing masked: zeros (TE)
    x[:, :, 6, sk // 2] = -10000.0
    mask[0, 0, 7, :sk - 1] = 2                # 2s and one 1: a softmax of all but the last
    mask[0, 0, 7, sk - 1] = 1
    with T.forced(backend):
        y = tex.scaled_masked_softmax_forward(x, mask, 1.0)
    z = x.double().masked_fill(mask == 1, -10000.0)
    want = torch.softmax(z, -1).masked_fill(z.amax(-1, keepdim=True) == -10000.0, 0.0)
    T.assert_close(y, want)
    for r in (3, 4, 6) if dtype != torch.bfloat16 else (3, 4):   # bf16 has no -10000 (-9984)
        assert not y[:, :, r].any(), f"row {r}: max -10000, TE gives zeros"
    assert (y[:, :, 5].double().sum(-1) - 1).abs().max() < 1e-2
    T.assert_close(y[:, :, :2], torch.softmax(x[:, :, :2].double(), -1))   # 2 and 255 do not mask


def test_masked_logit_is_replaced_not_added():
    x = torch.tensor([[[[20000.0, 0.0]]]])
    mask = torch.tensor([[[[1, 0]]]], dtype=torch.uint8)
    y = tex.scaled_masked_softmax_forward(x, mask, 1.0)
    # replaced: logits (-10000, 0) → ~(0, 1); adding -10000 would give (10000, 0) → (1, 0)
    assert y[0, 0, 0, 1].item() == pytest.approx(1.0)


@pytest.mark.parametrize("backend", T.backends_for("scaled_upper_triang_masked_softmax_forward"))
@pytest.mark.parametrize("dtype", DT)
def test_upper_triang(backend, dtype):
    x = T.rand((4, 9, 9), dtype, seed=4, scale=2)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)
    _check(tex.scaled_upper_triang_masked_softmax_forward, tex.scaled_upper_triang_masked_softmax_backward, x,
           lambda v: torch.softmax((v * 1.3).masked_fill(causal, float("-inf")), -1), 1.3, backend)


@pytest.mark.parametrize("backend", T.backends_for("scaled_aligned_causal_masked_softmax_forward"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("sq,sk", [(5, 9), (9, 9), (1, 4)])
def test_aligned_causal(backend, dtype, sq, sk):
    x = T.rand((2, 2, sq, sk), dtype, seed=5, scale=2)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    m = j > i + (sk - sq)
    _check(tex.scaled_aligned_causal_masked_softmax_forward, tex.scaled_aligned_causal_masked_softmax_backward, x,
           lambda v: torch.softmax((v * 0.9).masked_fill(m, float("-inf")), -1), 0.9, backend)


def test_softmax_bad_input():
    x = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3, 4, 5\)"):
        tex.scaled_masked_softmax_forward(x, torch.zeros(2, 3, 4, 5, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match="mask has shape"):
        tex.scaled_masked_softmax_forward(x, torch.zeros(3, 1, 4, 5, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match="mask has shape"):
        tex.scaled_masked_softmax_forward(x, torch.zeros(1, 1, 4, 6, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match="4-D"):
        tex.scaled_softmax_forward(torch.randn(3, 4, 5), 1.0)
    with pytest.raises(ValueError, match="square"):
        tex.scaled_upper_triang_masked_softmax_forward(torch.randn(3, 4, 5), 1.0)
    with pytest.raises(TypeError, match="3"):
        tex.scaled_softmax_backward(x, x)
    with pytest.raises(ValueError, match="differ in shape"):
        tex.scaled_softmax_backward(x, x[..., :4], 1.0)
    with pytest.raises(ValueError, match="different devices"):
        tex.scaled_masked_softmax_forward(x, torch.zeros(2, 1, 4, 5, dtype=torch.uint8, device="meta"), 1.0)
