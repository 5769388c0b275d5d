"""tensor_ops.integrations.transformers.apply on tiny random Hugging Face models built in code
(no downloads): Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3 (issue 15, item 4).

After patching, the logits match the unpatched model within fp32 tolerance on every available
backend, 5 AdamW steps give the same losses within 1e-5 relative (fp32), the state_dict keys
and the optimizer's parameters are unchanged, and ``undo()`` puts the originals back.
"""
from __future__ import annotations

import copy
import gc

import pytest

torch = pytest.importorskip("torch", reason="torch not installed: the transformers suite skips")
transformers = pytest.importorskip("transformers", reason="transformers not installed (the [transformers] extra)")

import tensor_ops as to  # noqa: E402
import tensor_ops.nn as tnn  # noqa: E402
from tensor_ops.integrations import transformers as to_hf  # noqa: E402
from tests.conftest import BACKENDS, backend_impl  # noqa: E402

VOCAB = 97
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=64)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "attn_logit_softcapping": None,
                                                    "final_logit_softcapping": None}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16}),
}
#: RMSNorms per family with 2 layers: (2 per layer + final) [+ q/k norms] [+ Gemma2/3's 2 extra per layer]
NORMS = {"llama": 5, "mistral": 5, "qwen2": 5, "qwen3": 9, "gemma": 5, "gemma2": 9, "gemma3": 13}


def tiny(family, dtype=torch.float32):
    cfg_name, model_name, extra = FAMILIES[family]
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    torch.manual_seed(0)
    cfg = cfg_cls(**COMMON, **extra)
    cfg._attn_implementation = "eager"
    return getattr(transformers, model_name)(cfg).to(dtype).eval()


def _ids(seed, batch=2, seq=12):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_apply_reports_what_it_replaced(family):
    m = tiny(family)
    keys = list(m.state_dict())
    params = [id(p) for p in m.parameters()]
    rep = to_hf.apply(m)
    assert len(rep.replaced["rms_norm"]) == NORMS[family], rep
    assert len(rep.replaced["mlp"]) == 2 and len(rep.replaced["rope"]) == 2 and not rep.skipped, rep
    assert rep.replaced["softmax"] == rep.replaced["rope"], rep
    assert str(rep).startswith(f"tensor_ops patched {m.config.model_type}: rms_norm: {NORMS[family]} modules")
    assert list(m.state_dict()) == keys and [id(p) for p in m.parameters()] == params
    assert all(isinstance(mod, tnn.RMSNorm) for p, mod in m.named_modules() if p in rep.replaced["rms_norm"])
    if family.startswith("gemma"):
        assert all(mod.offset == 1.0 for mod in m.modules() if isinstance(mod, tnn.RMSNorm))
    rep.undo()
    assert not any(isinstance(mod, (tnn.RMSNorm, tnn.GatedMLP)) for mod in m.modules())
    assert all("forward" not in vars(mod) for mod in m.modules())


def test_flags_choose_the_parts():
    m = tiny("llama")
    rep = to_hf.apply(m, rms_norm=False, rope=False, softmax=False)
    assert rep.replaced == {"rms_norm": [], "mlp": ["model.layers.0.mlp", "model.layers.1.mlp"], "rope": [],
                            "softmax": [], "add_rms_norm": ["model.layers.0", "model.layers.1"]}
    again = to_hf.apply(m)                     # the rest later; nothing is patched twice
    assert not again.replaced["mlp"] and len(again.replaced["rms_norm"]) == 5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_match_the_unpatched_model(family, backend):
    for op in ("rms_norm", "rope"):
        backend_impl(op, backend)
    m = tiny(family)
    ref_model = copy.deepcopy(m)
    to_hf.apply(m, backend=backend)
    ids = _ids(1)
    with torch.no_grad():
        want = ref_model(ids).logits
        try:
            got = m(ids).logits
        except Exception as exc:      # a forced backend that does not serve a dtype: its reason
            if "does not support" in str(exc):
                pytest.skip(str(exc))
            raise
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_five_adamw_steps_give_the_same_losses(family):
    ref_model = tiny(family).train()
    m = copy.deepcopy(ref_model)
    to_hf.apply(m)
    losses = []
    for model in (ref_model, m):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ls = []
        for step in range(5):
            ids = _ids(10 + step)
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            ls.append(loss.item())
        losses.append(ls)
    for a, b in zip(*losses):
        assert abs(a - b) <= 1e-5 * abs(a), losses


def test_bfloat16_model_runs_close():
    m = tiny("llama", torch.bfloat16)
    ref_model = copy.deepcopy(m)
    to_hf.apply(m)
    ids = _ids(3)
    with torch.no_grad():
        got, want = m(ids).logits.float(), ref_model(ids).logits.float()
    assert got.dtype == torch.float32 and (got - want).abs().max() < 0.1 * want.abs().max()


def test_rope_with_per_sequence_positions():
    """position_ids that differ per sequence give (B, T, D) tables: one call per sequence."""
    m = tiny("llama")
    ref_model = copy.deepcopy(m)
    to_hf.apply(m)
    ids = _ids(4)
    pos = torch.stack([torch.arange(12), torch.arange(5, 17)])
    with torch.no_grad():
        torch.testing.assert_close(m(ids, position_ids=pos).logits, ref_model(ids, position_ids=pos).logits,
                                   rtol=1e-5, atol=1e-5)


def test_patched_model_compiles_and_undo_forgets_its_modules():
    """torch.compile of a patched model: the patched functions' globals are modules of their own
    in sys.modules (dynamo looks an inlined function's globals up as its module's attributes;
    with a copied dict it met HF's originals and raised InternalTorchDynamoError), the rewritten
    decoder layer's add_norm is in the layer's module. undo() takes the modules away again."""
    import sys
    m = tiny("llama")
    ref_model = copy.deepcopy(m)
    before = {n for n in sys.modules if n.startswith("_tensor_ops_patched_")}
    patched = to_hf.apply(m)
    ours = {n for n in sys.modules if n.startswith("_tensor_ops_patched_")} - before
    assert ours                                     # one per patched attention (and its eager function)
    ids = _ids(6, batch=3)
    with torch.no_grad():
        want = ref_model(ids).logits
        torch.testing.assert_close(torch.compile(m)(ids).logits, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    patched.undo()
    assert not ours & set(sys.modules)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16bit_rope_tables_are_converted_once_and_exactly(dtype):
    """A 16-bit model's position embeddings: converted to float32 once per forward (so rope
    takes its native entry), with the same result as the 16-bit tables' general path."""
    from tensor_ops.backends import cpp
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 3, 16, generator=g).to(dtype), torch.randn(1, 2, 3, 16, generator=g).to(dtype)
    ang = torch.rand(1, 3, 16, generator=g) * 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    to_hf._LAST_TABLES[0] = None
    with torch.no_grad():
        want = (to.rope(q, cos[0], sin[0], backend="numpy"), to.rope(k, cos[0], sin[0], backend="numpy"))
        got = to_hf.apply_rotary_pos_emb(q, k, cos, sin)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        c32 = to_hf._LAST_TABLES[0][3][0]
        assert c32.dtype == torch.float32 and torch.equal(c32, cos.float())
        to_hf.apply_rotary_pos_emb(q, k, cos, sin)
        assert to_hf._LAST_TABLES[0][3][0] is c32                  # the same tensors: not converted again
        if cpp.availability()[0]:
            before = cpp.native()._fast_calls()["rope"]
            to_hf.apply_rotary_pos_emb(q, k, cos, sin)
            assert cpp.native()._fast_calls()["rope"] - before == 2   # both calls on the native entry
        cos.mul_(-1)                                                # changed in place: converted again
        got = to_hf.apply_rotary_pos_emb(q, k, cos, sin)
        assert torch.equal(got[0], to.rope(q, cos[0], sin[0], backend="numpy"))
    del cos, c32                                                    # the converted pair dies with its tables
    gc.collect()
    assert to_hf._LAST_TABLES[0] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batched_rope_tables_with_equal_rows_take_one_call_each(dtype):
    """HF expands position_ids to (B, T), so a batch whose sequences share positions brings B
    equal tables: q and k then take one rope call each (not one per sequence and a stack), and
    a batch whose positions differ keeps a table per sequence."""
    from tensor_ops.backends import cpp
    g = torch.Generator().manual_seed(7)
    B, T = 3, 5
    q, k = torch.randn(B, 4, T, 16, generator=g).to(dtype), torch.randn(B, 2, T, 16, generator=g).to(dtype)
    same = (torch.rand(1, T, 16, generator=g) * 6).expand(B, T, 16).contiguous()
    differ = same.clone()
    differ[1] += 0.5
    to.rope(q, torch.ones(T, 16), torch.zeros(T, 16))     # the process's first torch call sets the entry up
    for ang in (same, differ):
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        to_hf._LAST_TABLES[0] = None
        with torch.no_grad():
            calls = cpp.native()._fast_calls()["rope"] if cpp.availability()[0] else None
            got = to_hf.apply_rotary_pos_emb(q, k, cos, sin)
            if calls is not None:
                assert cpp.native()._fast_calls()["rope"] - calls == (2 if ang is same else 2 * B)
            for out, x in zip(got, (q, k)):
                want = torch.stack([to.rope(x[i], cos[i], sin[i], backend="numpy") for i in range(B)])
                torch.testing.assert_close(out, want, rtol=1.3e-6, atol=1e-5) if dtype == torch.float32 \
                    else torch.testing.assert_close(out, want, rtol=0, atol=0)
        prepared = to_hf._LAST_TABLES[0][3]
        if ang is same:
            assert prepared[0].shape == (1, T, 16) and prepared[0].dtype == torch.float32
        elif dtype == torch.float32:
            assert prepared is None              # the originals serve: the entry holds no copy of them


def test_identify_act_and_bad_model():
    assert to_hf.identify_act(torch.nn.SiLU()) == "silu"
    assert to_hf.identify_act(torch.nn.GELU()) == "gelu"
    assert to_hf.identify_act(torch.nn.GELU(approximate="tanh")) == "gelu_tanh"
    assert to_hf.identify_act(torch.nn.ReLU()) is None
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        to_hf.apply("llama")
