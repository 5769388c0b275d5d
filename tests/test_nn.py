"""tensor_ops.nn (issue 15, item 4): the modules take torch.nn's constructor arguments and
state_dict keys (checkpoints load unchanged both ways), compute what torch.nn computes, train
under autograd, and convert an existing module in place of the other sharing its parameters."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not installed: the torch suite skips")
F = torch.nn.functional

import tensor_ops.nn as tnn  # noqa: E402


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


@pytest.mark.parametrize("shape", [8, (8,), (3, 8)], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_is_torch_rmsnorm(shape, affine):
    ref = torch.nn.RMSNorm(shape, eps=1e-6, elementwise_affine=affine)
    mine = tnn.RMSNorm(shape, eps=1e-6, elementwise_affine=affine)
    assert list(mine.state_dict()) == list(ref.state_dict())
    if affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
        mine.load_state_dict(ref.state_dict())
        ref.load_state_dict(mine.state_dict())
    x = _x(4, 3, 8)
    torch.testing.assert_close(mine(x), ref(x), rtol=2e-6, atol=2e-6)


def test_rmsnorm_default_eps_is_the_dtypes():
    ref, mine = torch.nn.RMSNorm(16), tnn.RMSNorm(16)
    for dt in (torch.float32, torch.bfloat16):
        x = _x(4, 16, dtype=dt) * 1e-3
        torch.testing.assert_close(mine.to(dt)(x), ref.to(dt)(x), rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_is_torch_layernorm(bias):
    ref = torch.nn.LayerNorm(24, eps=1e-5, bias=bias)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        if bias:
            ref.bias.normal_()
    mine = tnn.LayerNorm(24, eps=1e-5, bias=bias)
    assert list(mine.state_dict()) == list(ref.state_dict())
    mine.load_state_dict(ref.state_dict())
    x = _x(5, 24)
    torch.testing.assert_close(mine(x), ref(x), rtol=2e-6, atol=2e-6)
    conv = tnn.LayerNorm.from_torch(ref)
    assert conv.weight is ref.weight and conv.bias is ref.bias
    torch.testing.assert_close(conv(x), ref(x), rtol=2e-6, atol=2e-6)


def test_modules_train_like_torch():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.RMSNorm(32, eps=1e-6), torch.nn.LayerNorm(32),
                              torch.nn.Linear(32, 1))
    mine = torch.nn.Sequential(torch.nn.Linear(16, 32), tnn.RMSNorm(32, eps=1e-6), tnn.LayerNorm(32),
                               torch.nn.Linear(32, 1))
    mine.load_state_dict(ref.state_dict())
    x, t = _x(64, 16), _x(64, 1)
    losses = []
    for model in (ref, mine):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ls = []
        for _ in range(5):
            loss = F.mse_loss(model(x), t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            ls.append(loss.item())
        losses.append(ls)
    for a, b in zip(*losses):
        assert abs(a - b) <= 1e-5 * abs(a), losses


def test_from_torch_shares_the_parameter_and_offset():
    ref = torch.nn.RMSNorm(8, eps=1e-5)
    conv = tnn.RMSNorm.from_torch(ref)
    assert conv.weight is ref.weight and conv.eps == 1e-5
    gemma = tnn.RMSNorm(8, eps=1e-6, offset=1.0)          # weights start at 0: (1 + w) = 1
    assert (gemma.weight == 0).all()
    x = _x(3, 8)
    torch.testing.assert_close(gemma(x), F.rms_norm(x, (8,), None, 1e-6), rtol=2e-6, atol=2e-6)


def test_gated_modules():
    x = _x(4, 12)
    a, b = x[:, :6], x[:, 6:]
    torch.testing.assert_close(tnn.SwiGLU()(x), F.silu(a) * b)
    torch.testing.assert_close(tnn.SwiGLU()(a.contiguous(), b.contiguous()), F.silu(a) * b)
    torch.testing.assert_close(tnn.GeGLU("tanh")(x), F.gelu(a, approximate="tanh") * b, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(tnn.GeGLU()(a, b), F.gelu(a) * b, rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="approximate must be 'none' .* got 'erf'"):
        tnn.GeGLU("erf")
    lin = [torch.nn.Linear(12, 20), torch.nn.Linear(12, 20), torch.nn.Linear(20, 12)]
    mlp = tnn.GatedMLP(*lin)
    torch.testing.assert_close(mlp(x), lin[2](F.silu(lin[0](x)) * lin[1](x)), rtol=2e-6, atol=2e-6)
    assert list(mlp.state_dict()) == ["gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias",
                                      "down_proj.weight", "down_proj.bias"]
    with pytest.raises(ValueError, match="act must be 'silu', 'gelu' or 'gelu_tanh', got 'relu'"):
        tnn.GatedMLP(*lin, act="relu")
