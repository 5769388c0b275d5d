"""Patch a Hugging Face model in place with tensor_ops kernels (Liger-kernel's
``apply_liger_kernel_to_llama`` is the model): its RMSNorms, its gated-MLP activation and its
rotary embedding, each per flag, for Llama, Mistral, Qwen2/Qwen3 and Gemma (1/2/3) models.

What is swapped, and how checkpoints and optimizers keep working:

- **RMSNorm** modules (``*RMSNorm`` with ``weight`` and ``variance_epsilon``/``eps``, Qwen3's
  and Gemma3's q/k norms included) become :class:`tensor_ops.nn.RMSNorm` sharing the same
  ``weight`` Parameter (same ``state_dict`` key, same object in any optimizer). Gemma's
  ``(1 + weight)`` form is read from the module's source and becomes ``offset=1.0``.
- **MLP** modules with ``gate_proj``/``up_proj``/``down_proj`` and an ``act_fn`` become
  :class:`tensor_ops.nn.GatedMLP` holding the same three Linear modules, with
  ``act(gate) * up`` as one kernel (forward and backward). The activation is identified by
  evaluating ``act_fn`` (silu, exact GELU or tanh-GELU); any other activation is skipped.
- **RoPE**: each attention module whose ``forward`` calls the module-level
  ``apply_rotary_pos_emb`` gets an instance ``forward`` that calls tensor_ops' instead (the
  same code with that one global replaced; nothing module-wide is changed, so unpatched
  models in the process are untouched).
- **softmax** of eager attention (``attn_implementation="eager"``; SDPA and flash attention
  keep theirs): the same instance ``forward`` calls a copy of the module's
  ``eager_attention_forward`` whose ``nn.functional.softmax`` is tensor_ops' (fp32 math; a
  16-bit result stays 16-bit, which the function casts to the query's dtype anyway). Where
  the mask is HF's causal one (or none) and the function is the plain form, the scale, the
  mask, the softmax and the cast are one kernel pass instead (:mod:`._hf_attention`).

The returned :class:`Patched` says what was replaced and skipped (and why) and can
``undo()`` it. Outputs keep the input's dtype (Hugging Face's Llama RMSNorm returns the
weight's dtype when that is wider).

Example (tiny random Llama, no download)::

    from transformers import LlamaConfig, LlamaForCausalLM
    from tensor_ops.integrations import transformers as to_hf
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, vocab_size=100))
    print(to_hf.apply(model))            # rms_norm: 5 modules, mlp: 2, rope: 2 attention modules
"""
from __future__ import annotations

import functools
import inspect
import itertools
import logging
import sys
import types
import weakref
from dataclasses import dataclass, field

import torch

from .. import nn as tnn
from . import _hf_attention, _hf_decoder
from .. import torch as _tot

log = logging.getLogger("tensor_ops")

#: the architectures this is tested on (others with the same module structure are patched too)
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text")
_ROPE = "apply_rotary_pos_emb"
_PATCHED = itertools.count()   # the patched functions' own modules (_with_globals)


@dataclass
class Patched:
    """What :func:`apply` did: module paths per part, skipped ones with the reason."""

    model_type: str = ""
    replaced: dict = field(default_factory=lambda: {"rms_norm": [], "mlp": [], "rope": [], "softmax": [],
                                                    "add_rms_norm": []})
    skipped: dict = field(default_factory=dict)          # path -> why
    _undo: list = field(default_factory=list, repr=False)

    def undo(self) -> None:
        """Put every original module / forward back."""
        for fn in reversed(self._undo):
            fn()
        self._undo.clear()
        for k in self.replaced:
            self.replaced[k] = []

    def __str__(self) -> str:
        parts = [f"{k}: {len(v)} module{'s' if len(v) != 1 else ''}" for k, v in self.replaced.items()]
        text = f"tensor_ops patched {self.model_type or 'model'}: " + ", ".join(parts)
        if self.skipped:
            text += "; skipped " + "; ".join(f"{p} ({why})" for p, why in self.skipped.items())
        return text


def apply(model, *, rms_norm: bool = True, mlp: bool = True, rope: bool = True, softmax: bool = True,
          add_rms_norm: bool = True, backend=None) -> Patched:
    """Swap ``model``'s RMSNorms, gated MLP activation and RoPE for tensor_ops ones, in place.

    Args:
        model: a Hugging Face ``PreTrainedModel`` (or any ``nn.Module`` containing those parts).
        rms_norm, mlp, rope, softmax: which parts to swap (softmax: eager attention's).
        add_rms_norm: fuse each decoder layer's residual add with the RMSNorm after it
            (:mod:`._hf_decoder`; takes effect where the norm is a tensor_ops one).
        backend: a tensor_ops backend order for the new modules (None: the resolver's).

    Returns:
        A :class:`Patched` listing what was replaced and skipped; ``.undo()`` reverts it.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    cfg = getattr(model, "config", None)
    rep = Patched(model_type=str(getattr(cfg, "model_type", "") or type(model).__name__))
    if cfg is not None and rep.model_type not in SUPPORTED:
        log.info("tensor_ops: %s is not a tested architecture %s; patching by module structure", rep.model_type,
                 SUPPORTED)
    for path, mod in list(model.named_modules()):
        if rms_norm and _is_rms_norm(mod):
            _swap(model, path, tnn.RMSNorm.from_torch(mod, offset=_offset(mod), backend=backend), rep, "rms_norm")
        elif mlp and _is_gated_mlp(mod):
            act = identify_act(mod.act_fn)
            if act is None:
                rep.skipped[path] = f"mlp activation {type(mod.act_fn).__name__} is not silu/gelu/gelu_tanh"
                continue
            _swap(model, path, tnn.GatedMLP(mod.gate_proj, mod.up_proj, mod.down_proj, act, backend=backend), rep,
                  "mlp")
        elif (rope or softmax) and _patchable_attention(mod):
            _patch_attention(mod, path, rep, backend, rope, softmax)
        elif add_rms_norm and _hf_decoder.is_decoder_layer(mod):
            why = _hf_decoder.patch_layer(mod, _rewrap)
            if why is None:
                rep.replaced["add_rms_norm"].append(path)
                rep._undo.append(lambda m=mod: m.__dict__.pop("forward", None))
            else:
                rep.skipped[path] = f"add_rms_norm: {why}"
    log.info("%s", rep)
    return rep


def _is_rms_norm(mod) -> bool:
    w = getattr(mod, "weight", None)
    return (type(mod).__name__.endswith("RMSNorm") and not isinstance(mod, tnn.RMSNorm)
            and isinstance(w, torch.nn.Parameter) and w.dim() == 1
            and (hasattr(mod, "variance_epsilon") or hasattr(mod, "eps")))


_SOURCES: dict = {}


def _source(cls) -> str:
    """The source of ``cls.forward`` ('' when unavailable), read once per class."""
    if cls not in _SOURCES:
        try:
            _SOURCES[cls] = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            _SOURCES[cls] = ""
    return _SOURCES[cls]


def _offset(mod) -> float:
    """1.0 for Gemma-style RMSNorms that multiply by ``(1 + weight)``."""
    src = _source(type(mod)).replace(" ", "")
    return 1.0 if "1.0+self.weight" in src or "1+self.weight" in src else 0.0


def _is_gated_mlp(mod) -> bool:
    return all(isinstance(getattr(mod, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
        and callable(getattr(mod, "act_fn", None)) and not isinstance(mod, tnn.GatedMLP)


def identify_act(fn):
    """'silu', 'gelu' (exact), 'gelu_tanh' or None: by evaluating ``fn`` on a grid (class names
    differ across transformers versions; the numbers do not)."""
    x = torch.linspace(-6, 6, 97, dtype=torch.float64)
    try:
        with torch.no_grad():
            y = fn(x).double()
    except Exception:
        return None
    refs = {"silu": x * torch.sigmoid(x), "gelu": 0.5 * x * (1 + torch.erf(x / 2 ** 0.5)),
            "gelu_tanh": 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)))}
    for name, r in refs.items():
        if y.shape == r.shape and torch.allclose(y, r, rtol=1e-5, atol=1e-6):
            return name
    return None


def _swap(model, path: str, new, rep: Patched, part: str) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, name)
    setattr(parent, name, new)
    rep.replaced[part].append(path)
    rep._undo.append(lambda: setattr(parent, name, old))


def _patchable_attention(mod) -> bool:
    fn = _inner(getattr(type(mod), "forward", None))
    code = getattr(fn, "__code__", None)
    return code is not None and _ROPE in code.co_names and _ROPE in getattr(fn, "__globals__", {}) \
        and "forward" not in vars(mod)


def _inner(fn):
    """The function under decorators made with ``functools.wraps`` (transformers 5 wraps
    ``forward`` in ``deprecate_kwarg``): its code calls ``apply_rotary_pos_emb``."""
    seen = 0
    while fn is not None and hasattr(fn, "__wrapped__") and seen < 8:
        fn, seen = fn.__wrapped__, seen + 1
    return fn


def _with_globals(fn, new: dict, modules: list):
    """A copy of function ``fn`` whose module globals are overridden by ``new`` (only there);
    a decorated ``fn`` keeps its decorators around a copy of the inner function.

    The copy's globals are the ``__dict__`` of a module of their own, registered in
    ``sys.modules`` under its ``__name__`` (appended to ``modules``, for undo): torch.compile
    looks up an inlined function's globals as attributes of the module its globals'
    ``__name__`` names, so a plain copied dict (HF's module name, our names in it) met HF's
    originals there - a guard on the unpatched ``apply_rotary_pos_emb`` and an
    InternalTorchDynamoError."""
    inner = _inner(fn)
    name = f"_tensor_ops_patched_{next(_PATCHED)}_" + str(inner.__globals__.get("__name__", "")).replace(".", "_")
    module = types.ModuleType(name)
    g = module.__dict__
    g.update(inner.__globals__)
    g.update(new)
    g["__name__"] = name
    sys.modules[name] = module
    modules.append(name)
    out = types.FunctionType(inner.__code__, g, inner.__name__, inner.__defaults__, inner.__closure__)
    out.__kwdefaults__ = inner.__kwdefaults__
    out.__qualname__ = inner.__qualname__
    return _rewrap(fn, out)


def _rewrap(fn, new_inner):
    """``fn`` with the function under its decorators replaced by ``new_inner``: each wrapper made
    with ``functools.wraps`` that holds the wrapped function in its closure is copied with that
    cell pointing at the new one (the decorator's own arguments stay)."""
    inner = getattr(fn, "__wrapped__", None)
    cells = fn.__closure__ or ()
    if inner is None or not any(_cell(c) is inner for c in cells):
        return new_inner
    below = _rewrap(inner, new_inner)
    closure = tuple(types.CellType(below) if _cell(c) is inner else c for c in cells)
    out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    out.__dict__.update(fn.__dict__)
    out.__wrapped__ = below
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__ = fn.__qualname__
    return out


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:        # an empty cell
        return None


def _functional(backend):
    """torch.nn.functional with softmax computed by tensor_ops (for eager attention's copy)."""
    ns = {k: v for k, v in vars(torch.nn.functional).items() if not k.startswith("__")}

    def softmax(input, dim=None, _stacklevel=3, dtype=None):
        return _tot._call("softmax", input, -1 if dim is None else int(dim), backend=backend)
    ns["softmax"] = softmax
    return types.SimpleNamespace(functional=types.SimpleNamespace(**ns))


def _patch_attention(mod, path: str, rep: Patched, backend, rope: bool, softmax: bool) -> None:
    fn = type(mod).forward
    glb = _inner(fn).__globals__
    new: dict = {}
    modules: list = []
    if rope:
        new[_ROPE] = functools.partial(apply_rotary_pos_emb, original=glb[_ROPE], backend=backend)
    eager = glb.get("eager_attention_forward")
    if softmax and callable(eager) and getattr(eager, "__code__", None) is not None and "nn" in eager.__code__.co_names:
        new["eager_attention_forward"] = _with_globals(eager, {"nn": _functional(backend)}, modules)
        if backend is None and _hf_attention.standard_eager(eager):   # scale+mask+softmax+cast: one pass
            new["eager_attention_forward"] = _hf_attention.fused_eager(new["eager_attention_forward"])
    if not new:
        return
    mod.forward = types.MethodType(_with_globals(fn, new, modules), mod)
    if rope:
        rep.replaced["rope"].append(path)
    if "eager_attention_forward" in new:
        rep.replaced["softmax"].append(path)
    rep._undo.append(lambda: (vars(mod).pop("forward", None), [sys.modules.pop(m, None) for m in modules]))


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *, original=None, backend=None):
    """Hugging Face's ``apply_rotary_pos_emb`` on tensor_ops' rope: q, k ``(B, H, T, D)``,
    cos/sin ``(B or 1, T, D)``. Other layouts go to ``original``."""
    if unsqueeze_dim != 1 or cos.dim() != 3 or q.dim() != 4 or cos.shape[-2] != q.shape[-2] or \
            cos.shape[0] not in (1, q.shape[0]) or cos.shape != sin.shape:
        if original is None:
            raise ValueError(f"unsupported rope layout: q {tuple(q.shape)}, cos {tuple(cos.shape)}, "
                             f"unsqueeze_dim={unsqueeze_dim}")
        return original(q, k, cos, sin, unsqueeze_dim)
    cos, sin = _tables(cos, sin)
    if cos.shape[0] == 1:
        return (_tot.rope(q, cos[0], sin[0], backend=backend), _tot.rope(k, cos[0], sin[0], backend=backend))
    # positions differ per sequence: one call per sequence (each (H, T, D) with its own table)
    qs = [_tot.rope(q[i], cos[i], sin[i], backend=backend) for i in range(q.shape[0])]
    ks = [_tot.rope(k[i], cos[i], sin[i], backend=backend) for i in range(k.shape[0])]
    return torch.stack(qs), torch.stack(ks)


_LAST_TABLES: list = [None]   # (weakref cos, weakref sin, their versions, (cos', sin')): the last pair


def _forget_tables(ref) -> None:
    """A prepared pair lives no longer than its tables (a 32k-token prefill's is ~48 MB)."""
    last = _LAST_TABLES[0]
    if last is not None and (last[0] is ref or last[1] is ref):
        _LAST_TABLES[0] = None


def _tables(cos, sin):
    """The model's (B, T, D) rotary tables as rope takes them, worked out once per forward.

    Every layer of one forward gets the same two tensors (the model computes them once), so
    the last pair's result is kept (by identity and version counter), held by weak references
    to the originals: it is dropped with them. Two things are worked out:

    * float32: rope's native entry takes float32 tables only (the kernel computes in fp32); a
      bf16/fp16 model's tables arrive in its dtype, and each layer's two rope calls took the
      general path, which converts them exactly so (``_ops/rope.py _angles``), ~25 µs a call.
    * one table for the batch: HF expands ``position_ids`` to (B, T), so a batch has B
      tables even when every sequence has the same positions (no padding), and B rope calls
      for q and B for k per layer plus a stack of each; a batched decode step (B = 8)
      took 2-3.4x HF's own time. Rows that are all equal give (1, T, D) (a copy of the first:
      a view would keep the originals alive), and q and k take one call each.

    Tables that require grad or live elsewhere are left as they are, and so are all under
    torch.compile (a cache kept in Python state is not something to trace)."""
    if not cos.is_cpu or cos.requires_grad or sin.requires_grad or torch.compiler.is_compiling() or \
            (cos.dtype == torch.float32 and cos.shape[0] == 1):
        return cos, sin
    versions = (cos._version, sin._version)
    last = _LAST_TABLES[0]
    if last is not None and last[0]() is cos and last[1]() is sin and last[2] == versions:
        return last[3] or (cos, sin)
    c, s = cos, sin
    if c.shape[0] > 1 and bool((c == c[:1]).all()) and bool((s == s[:1]).all()):
        c, s = c[:1], s[:1]
    # None: the originals as they are (float32, one per sequence), not held by the entry
    pair = None if c is cos and cos.dtype == torch.float32 else \
        (c.to(torch.float32, copy=True), s.to(torch.float32, copy=True))
    _LAST_TABLES[0] = (weakref.ref(cos, _forget_tables), weakref.ref(sin, _forget_tables), versions, pair)
    return pair or (cos, sin)
