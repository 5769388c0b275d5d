"""tex fused RoPE (sbhd/bshd/thd, interleaved, partial rotary, start positions, CP) vs a loop oracle."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402

DT = [pytest.param(d, id=str(d).split(".")[-1]) for d in T.DTYPES]
FMT = {"sbhd": tex.NVTE_QKV_Format.NVTE_SBHD, "bshd": tex.NVTE_QKV_Format.NVTE_BSHD,
       "thd": tex.NVTE_QKV_Format.NVTE_THD}


def _freqs(s, d2, interleaved):
    inv = 1.0 / (10000 ** (torch.arange(0, d2, 2, dtype=torch.float64) / d2))
    f = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    emb = torch.stack([f, f], -1).flatten(-2) if interleaved else torch.cat([f, f], -1)
    return emb.float().reshape(s, 1, 1, d2)


@pytest.mark.parametrize("backend", T.backends_for("fused_rope_forward"))
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("d2", [32, 16], ids=["full", "partial"])
@pytest.mark.parametrize("start", [False, True], ids=["pos0", "start_positions"])
def test_rope(backend, dtype, fmt, interleaved, d2, start):
    s, b, h, d = 7, 3, 2, 32
    cu = None
    if fmt == "sbhd":
        shape = (s, b, h, d)
    elif fmt == "bshd":
        shape = (b, s, h, d)
    else:
        cu = torch.tensor([0, 3, 10, 12], dtype=torch.int32)
        shape = (12, h, d)
    x = T.rand(shape, dtype, seed=1)
    dy = T.rand(shape, dtype, seed=2)
    sp = torch.tensor([0, 2, 5], dtype=torch.int32) if start else None
    freqs = _freqs(s + 6, d2, interleaved)
    with T.forced(backend):
        y = tex.fused_rope_forward(x, freqs, sp, FMT[fmt], interleaved, cu, 1, 0)
        dx = tex.fused_rope_backward(dy, freqs, sp, FMT[fmt], interleaved, cu, 1, 0)
    ref, (gx,) = T.grads(lambda v: T.rope(v, freqs, fmt, interleaved, sp, cu), [x], dy)
    assert y.dtype == dtype and y.shape == x.shape
    T.assert_close(y, ref)
    T.assert_close(dx, gx)


@pytest.mark.parametrize("backend", T.backends_for("fused_rope_forward"))
def test_rope_tables_follow_freqs(backend):
    """default.cpp keeps the cos/sin tables of the last freqs (a model's layers share one): reusing
    it, writing it in place (directly or through a view: its version counter moves), a new tensor
    with other values or with the same values, -0.0 written over 0.0, an inference tensor (no
    version counter: compared by value) and a freqs that requires grad each give the oracle's
    result."""
    fmt = tex.NVTE_QKV_Format.NVTE_SBHD
    x = T.rand((9, 2, 3, 16), torch.float32, seed=3)

    def check(freqs):
        with T.forced(backend):
            y = tex.fused_rope_forward(x, freqs, None, fmt, False, None, 1, 0)
            dx = tex.fused_rope_backward(x, freqs, None, fmt, False, None, 1, 0)
        ref, (gx,) = T.grads(lambda v: T.rope(v, freqs.detach(), "sbhd", False, None, None), [x], x)
        T.assert_close(y, ref)
        T.assert_close(dx, gx)

    freqs = _freqs(9, 16, False)
    check(freqs)
    check(freqs)
    freqs.mul_(0.5)            # in place: same object, new version
    check(freqs)
    freqs[3] = 1.25            # through a view: the version counter is shared
    check(freqs)
    freqs[0] = -0.0            # sin(-0.0) = -0.0
    check(freqs)
    check(freqs * 2)
    check(freqs * 2)           # a new tensor, the same bits
    with torch.inference_mode():
        fi = _freqs(9, 16, False) * 3
    check(fi)
    with torch.inference_mode():
        fi[1] = 0.5            # in place on an inference tensor: found by the value comparison
    check(fi)
    check(_freqs(9, 16, False).requires_grad_(True))


@pytest.mark.parametrize("fmt", ["sbhd", "thd"])
def test_rope_context_parallel(fmt):
    cp_size, d = 2, 16
    cu = None
    if fmt == "sbhd":
        x = T.rand((6, 2, 2, d), torch.float32)
    else:
        cu = torch.tensor([0, 4, 10], dtype=torch.int32)
        x = T.rand((10, 2, d), torch.float32)
    freqs = _freqs(24, d, False)
    for rank in range(cp_size):
        y = tex.fused_rope_forward(x, freqs, None, FMT[fmt], False, cu, cp_size, rank)
        ref = T.rope(x.double(), freqs, fmt, False, None, cu, cp_size, rank)
        T.assert_close(y, ref)


def test_rope_v29_backward_signature_and_errors():
    x = T.rand((4, 1, 2, 8), torch.float32)
    freqs = _freqs(4, 8, False)
    a = tex.fused_rope_backward(x, freqs, tex.NVTE_QKV_Format.NVTE_SBHD, False, None, 1, 0)
    b = tex.fused_rope_backward(x, freqs, None, tex.NVTE_QKV_Format.NVTE_SBHD, False, None, 1, 0)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="8"):
        tex.fused_rope_forward(x, freqs, None, tex.NVTE_QKV_Format.NVTE_SBHD, False, None)
    with pytest.raises(ValueError, match="freqs"):
        tex.fused_rope_forward(x, freqs[:, :, :, :5], None, tex.NVTE_QKV_Format.NVTE_SBHD, False, None, 1, 0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        tex.fused_rope_forward(x[:, 0], freqs, None, tex.NVTE_QKV_Format.NVTE_THD, False, None, 1, 0)
    with pytest.raises(ValueError, match="qkv_format"):
        tex.fused_rope_forward(x, freqs, None, 17, False, None, 1, 0)
