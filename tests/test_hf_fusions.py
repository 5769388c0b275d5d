"""The fusions :func:`tensor_ops.integrations.transformers.apply` makes across HF modules:
eager attention's scale + causal mask + softmax + cast as one op (``_hf_attention``,
``tensor_ops.torch.scaled_softmax``; taken exactly where HF's mask is causal or absent) and each
decoder layer's residual add + RMSNorm as ``add_rms_norm`` (``_hf_decoder``; by rewriting the
layer's forward at exactly that statement sequence). Outputs, gradients and KV-cache
generation match the unpatched model; what cannot be fused keeps HF's own arithmetic."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the [transformers] extra)")

import tensor_ops.torch as tot  # noqa: E402
from tensor_ops.integrations import _hf_attention as hfa  # noqa: E402
from tensor_ops.integrations import _hf_decoder as hfd  # noqa: E402
from tensor_ops.integrations import transformers as to_hf  # noqa: E402
from tests.test_transformers import FAMILIES, _ids, tiny  # noqa: E402


@pytest.fixture
def calls(monkeypatch):
    """Counts the fused op's calls (what the patched attention took)."""
    seen = []
    real = tot.scaled_softmax

    def spy(x, scale=1.0, causal_offset=None):
        seen.append((tuple(x.shape), causal_offset))
        return real(x, scale, causal_offset)
    monkeypatch.setattr(tot, "scaled_softmax", spy)
    return seen


def _causal(b, sq, sk, dtype=torch.float32):
    keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    return torch.zeros(sq, sk, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min).expand(b, 1, sq, sk)


def test_mask_kind_recognises_only_hf_causal_masks():
    assert hfa.mask_kind(None, 4, 4) == "none"
    assert hfa.mask_kind(_causal(2, 5, 5), 5, 5) == "causal"
    assert hfa.mask_kind(_causal(1, 3, 7), 3, 7) == "causal"           # KV cache: aligned causal
    m = _causal(2, 5, 5).clone()
    m[1, 0, 4, 0] = torch.finfo(torch.float32).min                      # a padded key in sequence 1
    assert hfa.mask_kind(m, 5, 5) is None
    m = _causal(2, 5, 5).clone()
    m[0, 0, 1, 1] = -1e4                                                # another constant
    assert hfa.mask_kind(m, 5, 5) is None
    assert hfa.mask_kind(_causal(2, 5, 5), 5, 6) is None                # shapes that disagree
    assert hfa.mask_kind(_causal(2, 5, 5) > 0, 5, 5) is None            # a boolean mask
    m = _causal(2, 5, 5).clone()
    assert hfa.mask_kind(m, 5, 5) == "causal"
    m[0, 0, 0, 0] = 1.0                                                 # changed in place: looked at again
    assert hfa.mask_kind(m, 5, 5) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("offset", [None, 0, 2, -1])
def test_scaled_softmax_matches_torch_forward_and_backward(dtype, offset):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 7, dtype=dtype, requires_grad=True)
    y = tot.scaled_softmax(x, 0.3, offset)
    xr = x.detach().double().requires_grad_()
    z = xr * 0.3
    if offset is not None:
        z = z.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(offset), float("-inf"))
    want = torch.softmax(z, -1).nan_to_num(0.0)
    g = torch.randn_like(want)
    (y.double() * g).sum().backward()
    (want * g).sum().backward()
    tol = dict(rtol=1e-2, atol=4e-3) if dtype is torch.bfloat16 else dict(rtol=1e-6, atol=1e-7)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), want, **tol)
    torch.testing.assert_close(x.grad.double(), xr.grad, **tol)
    if offset == -1:
        assert (y[..., 0, :] == 0).all()                                # a row that sees nothing


def test_scaled_softmax_gradcheck_opcheck_and_compile():
    x = torch.randn(2, 2, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: tot.scaled_softmax(t, 0.7, 2), (x,))
    for args in ((torch.randn(2, 3, 4, 4), 0.5, 0), (torch.randn(3, 4, 4, dtype=torch.bfloat16), 0.5, None),
                 (torch.randn(2, 3, 4, 4, requires_grad=True), 0.25, 1)):
        torch.library.opcheck(torch.ops.tensor_ops.scaled_softmax, args)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    f = torch.compile(lambda t: tot.scaled_softmax(t, 0.5, 0), fullgraph=True)
    y = f(x)
    y.sum().backward()
    torch.testing.assert_close(y, tot.scaled_softmax(x, 0.5, 0))


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
def test_fused_attention_is_taken_and_matches(family, calls):
    m = tiny(family)
    ref_model = copy.deepcopy(m)
    to_hf.apply(m)
    ids = _ids(5)
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, ref_model(ids).logits, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 and all(off == 0 for _, off in calls), calls   # both layers, square causal


def test_padding_mask_keeps_hf_arithmetic(calls):
    m = tiny("llama")
    ref_model = copy.deepcopy(m)
    to_hf.apply(m)
    ids = _ids(6)
    am = torch.ones_like(ids)
    am[1, :3] = 0                                                       # left padding in sequence 1
    with torch.no_grad():
        got, want = m(ids, attention_mask=am).logits, ref_model(ids, attention_mask=am).logits
    assert not calls
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1, 3:], want[1, 3:], rtol=1e-5, atol=1e-5)


def test_kv_cache_generation_matches(calls):
    m = tiny("llama")
    ref_model = copy.deepcopy(m)
    to_hf.apply(m)
    ids = _ids(7, batch=1, seq=6)
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert m.generate(ids, **kw).tolist() == ref_model.generate(ids, **kw).tolist()
    assert any(shape[-2] == 1 for shape, _ in calls), calls             # decode steps went fused


def test_training_gradients_match(calls):
    m = tiny("llama").train()
    ref_model = copy.deepcopy(m)
    to_hf.apply(m)
    ids = _ids(8)
    for model in (m, ref_model):
        model(ids, labels=ids).loss.backward()
    assert calls
    for (n, p), (_, q) in zip(m.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.fixture
def fused_adds(monkeypatch):
    """Counts the fused residual add + norm calls."""
    seen = []
    real = tot._call

    def spy(name, *args, **kw):
        if name == "add_rms_norm":
            seen.append(tuple(args[0].shape))
        return real(name, *args, **kw)
    monkeypatch.setattr(tot, "_call", spy)
    return seen


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decoder_add_norm_is_fused_and_matches(family, fused_adds):
    m = tiny(family)
    ref_model = copy.deepcopy(m)
    rep = to_hf.apply(m)
    assert rep.replaced["add_rms_norm"] == ["model.layers.0", "model.layers.1"], rep
    ids = _ids(9)
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, ref_model(ids).logits, rtol=1e-5, atol=1e-5)
    assert len(fused_adds) == 2, fused_adds                             # one per layer
    rep.undo()
    assert all("forward" not in vars(layer) for layer in m.model.layers)


def test_decoder_fusion_trains_like_hf(fused_adds):
    m = tiny("qwen3").train()
    ref_model = copy.deepcopy(m)
    to_hf.apply(m, rms_norm=True, mlp=False, rope=False, softmax=False)
    ids = _ids(11)
    for model in (m, ref_model):
        model(ids, labels=ids).loss.backward()
    assert len(fused_adds) == 2
    for (n, p), (_, q) in zip(m.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_decoder_without_the_pattern_is_skipped_with_the_reason():
    class OddDecoderLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Identity()
            self.self_attn = torch.nn.Identity()
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, hidden_states):
            return self.norm(self.mlp(hidden_states) + hidden_states)      # post-norm: nothing to fuse

    layer = torch.nn.Sequential(OddDecoderLayer())
    rep = to_hf.apply(layer)
    assert not rep.replaced["add_rms_norm"] and "no 'residual + hidden_states'" in rep.skipped["0"], rep
    assert "forward" not in vars(layer[0])


def test_add_norm_falls_back_for_other_norms():
    h, r = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    ln = torch.nn.LayerNorm(8)
    y, s = hfd.add_norm(ln, h, r)
    torch.testing.assert_close(s, r + h)
    torch.testing.assert_close(y, ln(r + h))
