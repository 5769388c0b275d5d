"""default.cpp: tex ops on CPU tensors through ``tensor_ops._cpp``, with zero-copy NumPy views.

bfloat16 tensors are viewed as int16 (``dtype="bfloat16"`` tells the kernels); outputs are
allocated as torch tensors and written in place, so nothing is copied either way. Each
adapter's ``supports`` accepts only what the kernel takes exactly (CPU, C-contiguous, the
dtype combinations it has); everything else goes to the next candidate without a warning.
No native code is loaded at registration: availability asks the cpp backend (which loads
and probes the module once) and checks that the kernel an adapter needs exists.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

NAME = "cpp"
IMPL_ID = "default.cpp"
_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16
_OK = (_F32, _F16, _BF16)
_I16 = torch.int16


def _native():
    from tensor_ops.backends import cpp
    return cpp.native()


def _np(t):
    if t.dtype is _BF16:
        return t.detach().view(_I16).numpy()
    return t.detach().numpy()


_NP_DT = {_F32: "float32", _F16: "float16", _BF16: "int16"}
_BIG = 1 << 20  # the cpp module's block cache serves outputs from 1 MiB on


def _empty(shape, dtype):
    """A new CPU tensor; large ones come from the cpp module's output block cache (zero-copy
    through NumPy): a freed output goes back to it and the next one of that size is already
    mapped, instead of page-faulting a new buffer every call (8192x4096 rmsnorm_fwd,
    `benchmarks/bench_tex.py --stat min`: fp32 14.1 -> 7.8 ms, bf16 7.5 -> 3.6 ms, the same
    as writing into a reused ln_out). The tensor's storage is not resizable."""
    n = math.prod(shape)
    if n * (4 if dtype is _F32 else 2) < _BIG:
        return torch.empty(shape, dtype=dtype)
    t = torch.from_numpy(_native().empty(tuple(shape), _NP_DT[dtype]))
    return t.view(_BF16) if dtype is _BF16 else t


def _empty_like(t):
    return _empty(tuple(t.shape), t.dtype)


def _kw(*ts):
    return "bfloat16" if any(t is not None and t.dtype is _BF16 for t in ts) else None


def _plain(t, dtype=None) -> bool:
    """CPU, C-contiguous, one of the kernel dtypes (or exactly ``dtype``)."""
    return (type(t) is torch.Tensor or isinstance(t, torch.Tensor)) and t.device.type == "cpu" and \
        (t.dtype is dtype if dtype is not None else t.dtype in _OK) and t.is_contiguous()


# ---------------------------------------------------------------- norms

def _sup_rms_fwd(input, weight, eps, ln_out, q, otype, sm, zc):
    dt = input.dtype
    return _plain(input) and _plain(weight, dt) and otype is dt and (ln_out is None or _plain(ln_out, dt))


def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    h = input.shape[-1]
    out = ln_out if ln_out is not None else _empty_like(input)
    rs = torch.empty(input.numel() // h if h else 0, dtype=_F32)
    _native().rms_norm(_np(input), _np(weight.reshape(-1)), eps, _np(out), rsigma=rs.numpy(),
                       zero_centered_gamma=zero_centered_gamma, dtype=_kw(input))
    return [out, None, rs]


def _sup_ln_fwd(input, weight, bias, eps, ln_out, q, otype, sm, zc):
    dt = input.dtype
    return (_plain(input) and _plain(weight, dt) and (bias is None or _plain(bias, dt)) and otype is dt
            and (ln_out is None or _plain(ln_out, dt)))


def layernorm_fwd(input, weight, bias, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
    h = input.shape[-1]
    n = input.numel() // h if h else 0
    out = ln_out if ln_out is not None else _empty_like(input)
    mu = torch.empty(n, dtype=_F32)
    rs = torch.empty(n, dtype=_F32)
    _native().layer_norm(_np(input), _np(weight.reshape(-1)), None if bias is None else _np(bias.reshape(-1)), eps,
                         _np(out), mu=mu.numpy(), rsigma=rs.numpy(), zero_centered_gamma=zero_centered_gamma,
                         dtype=_kw(input))
    return [out, mu, rs]


def _sup_rms_bwd(dz, x, rsigma, gamma, sm, zc):
    dt = x.dtype
    return _plain(x) and _plain(dz, dt) and _plain(gamma, dt) and _plain(rsigma, _F32)


def rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx = _empty_like(x)
    dg = torch.empty_like(gamma)
    _native().rms_norm_bwd(_np(dz), _np(x), _np(rsigma), _np(gamma.reshape(-1)), _np(dx), _np(dg.reshape(-1)),
                           zero_centered_gamma, dtype=_kw(x))
    return [dx, dg]


def _sup_rms_bwd_add(dz, x, add, rsigma, gamma, sm, zc):
    # fp32 only: for 16-bit x the kernel rounds dx before the add (TE adds before rounding)
    return x.dtype is _F32 and _sup_rms_bwd(dz, x, rsigma, gamma, sm, zc) and _plain(add, _F32)


def rmsnorm_bwd_add(dz, x, add, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx, dg = rmsnorm_bwd(dz, x, rsigma, gamma, sm_margin, zero_centered_gamma)
    dx.add_(add)
    return [dx, dg]


def _sup_ln_bwd(dz, x, mu, rsigma, gamma, sm, zc):
    return _sup_rms_bwd(dz, x, rsigma, gamma, sm, zc) and _plain(mu, _F32)


def layernorm_bwd(dz, x, mu, rsigma, gamma, sm_margin, zero_centered_gamma):
    dx = _empty_like(x)
    dg = torch.empty_like(gamma)
    db = torch.empty_like(gamma)
    _native().layer_norm_bwd(_np(dz), _np(x), _np(mu), _np(rsigma), _np(gamma.reshape(-1)), _np(dx),
                             _np(dg.reshape(-1)), _np(db.reshape(-1)), zero_centered_gamma, dtype=_kw(x))
    return [dx, dg, db]


# ---------------------------------------------------------------- activations

def _sup_act(input, quantizer):
    return _plain(input)


def _unary(kernel, **extra):
    def fn(input, quantizer):
        out = _empty_like(input)
        getattr(_native(), kernel)(_np(input), out=_np(out), dtype=_kw(input), **extra)
        return out
    return fn


def _glu(kernel, **extra):
    def fn(input, quantizer):
        out = _empty(tuple(input.shape[:-1]) + (input.shape[-1] // 2,), input.dtype)
        getattr(_native(), kernel)(_np(input), out=_np(out), dtype=_kw(input), **extra)
        return out
    return fn


# ---------------------------------------------------------------- multi-tensor

def _flat(t):
    return _np(t).reshape(-1)


def _no_fp16_bf16_mix(*ts):
    dts = {t.dtype for t in ts}
    return not (_F16 in dts and _BF16 in dts)  # one dtype= flag per call cannot say both


def _sup_adam(chunk, noop, lists, lr, b1, b2, eps, step, mode, bc, wd):
    master = lists[4] if len(lists) == 5 else None
    for i, (g, p, m, v) in enumerate(zip(*lists[:4])):
        if not (_plain(g) and _plain(p) and _plain(m, _F32) and _plain(v, _F32)):
            return False
        if master is not None and not _plain(master[i], _F32):
            return False
        if not _no_fp16_bf16_mix(g, p):
            return False
    return True


def multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, bias_correction,
                      weight_decay):
    bc1 = 1.0 - beta1 ** step if bias_correction == 1 else 1.0
    bc2 = 1.0 - beta2 ** step if bias_correction == 1 else 1.0
    k = _native().adam_step
    grads, params, ms, vs = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) == 5 else None
    for i in range(len(grads)):
        g, p = grads[i], params[i]
        k(_flat(g), _flat(p), _flat(ms[i]), _flat(vs[i]), lr, beta1, beta2, eps, bc1, bc2, mode, weight_decay,
          None if masters is None else _flat(masters[i]), dtype=_kw(g, p))


def _sup_scale(chunk, noop, lists, scale):
    for i, o in zip(*lists):
        if not (_plain(i) and _plain(o) and _no_fp16_bf16_mix(i, o)):
            return False
        if i is not o and i.untyped_storage().data_ptr() == o.untyped_storage().data_ptr():
            return False  # the kernel takes exact in-place only; other aliasing goes to the reference
        if i is o and i.dtype is not o.dtype:
            return False
    return True


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    k = _native().scale
    bad = False
    for i, o in zip(*tensor_lists):
        bad |= bool(k(_flat(i), _flat(o), scale, dtype=_kw(i, o)))
    if bad:
        noop_flag.fill_(1)


def _sup_l2(chunk, noop, lists, *rest):
    return all(_plain(t) for t in lists[0])


def _l2(noop_flag, tensors, per_tensor, factor=1.0):
    k = _native().l2norm_sq
    sq = [k(_flat(t), dtype=_kw(t)) * factor for t in tensors]
    total = math.sqrt(math.fsum(sq)) if all(map(math.isfinite, sq)) else float("nan")
    if not math.isfinite(total):
        noop_flag.fill_(1)
    norm = torch.tensor([total], dtype=_F32)
    per = torch.tensor([math.sqrt(s) if s >= 0 else s for s in sq], dtype=_F32) if per_tensor else \
        torch.zeros(0, dtype=_F32)
    return norm, per


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    return _l2(noop_flag, tensor_lists[0], per_tensor)


def multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    s = float(inv_scale.reshape(-1)[0])
    return _l2(noop_flag, tensor_lists[0], per_tensor, s * s)


# ---------------------------------------------------------------- training: activation derivatives

_DACT = {"gelu": "gelu", "silu": "silu", "relu": "relu", "qgelu": "qgelu", "srelu": "srelu"}
_DGLU = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu", "qgeglu": "qgelu", "sreglu": "srelu", "glu": "sigmoid"}


def _sup_dact(grad, fwd_input, quantizer):
    return _plain(fwd_input) and _plain(grad, fwd_input.dtype)


def _dact(kind):
    def fn(grad, fwd_input, quantizer):
        k = _native()
        out = _empty_like(fwd_input)
        k.dact(_np(grad), _np(fwd_input), _np(out), k.DACT_CODES[kind], dtype=_kw(fwd_input))
        return out
    return fn


def _dbias_dact(kind):
    def fn(grad, fwd_input, quantizer):
        k = _native()
        out = _empty_like(fwd_input)
        h = fwd_input.shape[-1]
        db = torch.zeros(h, dtype=_F32)
        k.dact(_np(grad), _np(fwd_input), _np(out), k.DACT_CODES[kind], dbias=db.numpy(), dtype=_kw(fwd_input))
        return [db.to(grad.dtype), out]
    return fn


def _dglu(kind):
    def fn(grad, fwd_input, quantizer):
        k = _native()
        out = _empty_like(fwd_input)
        k.dglu(_np(grad), _np(fwd_input), _np(out), k.DACT_CODES[kind], dtype=_kw(fwd_input))
        return out
    return fn


# ---------------------------------------------------------------- training: TE's softmax family

_SM_PLAIN, _SM_MASK, _SM_CAUSAL = 0, 1, 2


def _softmax_run(x, mode, scale, mask=None, heads=1, sq=1, causal_off=0):
    out = _empty_like(x)
    _native().tex_softmax(_np(x), _np(out), scale, mode, mask, heads, sq, causal_off, dtype=_kw(x))
    return out


def _sup_sm(input, scale):
    return _plain(input)


def tex_scaled_softmax_forward(input, scale):
    return _softmax_run(input, _SM_PLAIN, scale)


def _sup_masked(input, mask, scale):
    return _plain(input) and mask.device.type == "cpu" and mask.is_contiguous() and \
        mask.dtype in (torch.uint8, torch.bool)


def scaled_masked_softmax_forward(input, mask, scale):
    b, h, sq, sk = input.shape
    m = mask.view(torch.uint8) if mask.dtype is torch.bool else mask
    return _softmax_run(input, _SM_MASK, scale, m.detach().numpy(), heads=h, sq=sq)


def scaled_upper_triang_masked_softmax_forward(input, scale):
    return _softmax_run(input, _SM_CAUSAL, scale, sq=input.shape[1])


def scaled_aligned_causal_masked_softmax_forward(input, scale):
    sq, sk = input.shape[-2:]
    return _softmax_run(input, _SM_CAUSAL, scale, sq=sq, causal_off=sk - sq)


def _sup_sm_bwd(dy, y, scale):
    return _plain(y) and _plain(dy, y.dtype)


def scaled_softmax_backward(output_grads, softmax_results, scale):
    out = _empty_like(softmax_results)
    _native().tex_softmax_bwd(_np(output_grads), _np(softmax_results), _np(out), scale, dtype=_kw(softmax_results))
    return out


# ---------------------------------------------------------------- training: fused RoPE


def _sup_rope(x, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
    return _plain(x) and freqs.device.type == "cpu"


def _rope(transpose):
    def fn(x, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
        from ._rope import _positions
        d2 = freqs.shape[-1]
        f = freqs.reshape(freqs.shape[0], d2).float()
        pos = _positions(x, qkv_format, start_positions, cu_seqlens, cp_size, cp_rank)
        pos = pos.contiguous().reshape(-1).to(torch.int64)
        heads = x.shape[-2]
        out = _empty_like(x)
        _native().tex_rope(_np(x), torch.cos(f).numpy(), torch.sin(f).numpy(), pos.numpy(), _np(out), heads,
                           bool(interleaved), transpose, dtype=_kw(x))
        return out
    return fn


# ---------------------------------------------------------------- training: SGD


def _sup_sgd(chunk, noop, lists, wd, momentum, dampening, lr, nesterov, first_run, wd_after, scale):
    if len(lists) != 3:   # the fp16 model copies of a 4th list: the reference
        return False
    for g, p, b in zip(*lists):
        if not (_plain(p) and _plain(g, p.dtype) and _plain(b, p.dtype)):
            return False
    return True


def multi_tensor_sgd(chunk_size, noop_flag, tensor_lists, wd, momentum, dampening, lr, nesterov, first_run,
                     wd_after_momentum, scale):
    if bool(noop_flag.reshape(-1)[0] != 0):
        return
    k = _native().sgd_step
    for g, p, b in zip(*tensor_lists):
        k(_flat(g), _flat(p), _flat(b), wd, momentum, dampening, lr, nesterov, first_run, wd_after_momentum, scale,
          dtype=_kw(p))


# ---------------------------------------------------------------- registration

#: tex op → (adapter, supports, native function it needs)
ADAPTERS: dict[str, tuple[Callable[..., Any], Callable[..., bool], str]] = {
    "rmsnorm_fwd": (rmsnorm_fwd, _sup_rms_fwd, "rms_norm"),
    "layernorm_fwd": (layernorm_fwd, _sup_ln_fwd, "layer_norm"),
    "rmsnorm_bwd": (rmsnorm_bwd, _sup_rms_bwd, "rms_norm_bwd"),
    "rmsnorm_bwd_add": (rmsnorm_bwd_add, _sup_rms_bwd_add, "rms_norm_bwd"),
    "layernorm_bwd": (layernorm_bwd, _sup_ln_bwd, "layer_norm_bwd"),
    "gelu": (_unary("gelu", approximate="tanh"), _sup_act, "gelu"),
    "silu": (_unary("silu"), _sup_act, "silu"),
    "relu": (_unary("relu"), _sup_act, "relu"),
    "swiglu": (_glu("swiglu"), _sup_act, "swiglu"),
    "geglu": (_glu("geglu", approximate="tanh"), _sup_act, "geglu"),
    "scaled_softmax_forward": (tex_scaled_softmax_forward, _sup_sm, "tex_softmax"),
    "multi_tensor_adam": (multi_tensor_adam, _sup_adam, "adam_step"),
    "multi_tensor_scale": (multi_tensor_scale, _sup_scale, "scale"),
    "multi_tensor_l2norm": (multi_tensor_l2norm, _sup_l2, "l2norm_sq"),
    "multi_tensor_unscale_l2norm": (multi_tensor_unscale_l2norm, _sup_l2, "l2norm_sq"),
    # training kernels (cpp_ext/tex_train.cpp)
    **{"d" + op: (_dact(kind), _sup_dact, "dact") for op, kind in _DACT.items()},
    **{"dbias_d" + op: (_dbias_dact(kind), _sup_dact, "dact") for op, kind in _DACT.items()},
    **{"d" + op: (_dglu(kind), _sup_dact, "dglu") for op, kind in _DGLU.items()},
    "scaled_masked_softmax_forward": (scaled_masked_softmax_forward, _sup_masked, "tex_softmax"),
    "scaled_upper_triang_masked_softmax_forward": (scaled_upper_triang_masked_softmax_forward, _sup_sm, "tex_softmax"),
    "scaled_aligned_causal_masked_softmax_forward": (scaled_aligned_causal_masked_softmax_forward, _sup_sm,
                                                     "tex_softmax"),
    **{op: (scaled_softmax_backward, _sup_sm_bwd, "tex_softmax_bwd")
       for op in ("scaled_softmax_backward", "scaled_masked_softmax_backward",
                  "scaled_upper_triang_masked_softmax_backward", "scaled_aligned_causal_masked_softmax_backward")},
    "fused_rope_forward": (_rope(False), _sup_rope, "tex_rope"),
    "fused_rope_backward": (_rope(True), _sup_rope, "tex_rope"),
    "multi_tensor_sgd": (multi_tensor_sgd, _sup_sgd, "sgd_step"),
}
HOT_OPS = tuple(ADAPTERS)


def _availability(kernel):
    def available():
        from tensor_ops.backends import cpp
        ok, reason = cpp.availability()
        if not ok:
            return False, reason
        if not hasattr(cpp.native(), kernel):
            return False, f"tensor_ops._cpp has no {kernel!r} kernel in this build (rebuild: pip install -e .)"
        return True, ""
    return available


def register(registry) -> None:
    from tensor_ops._registry import BackendImplKind, OpImpl
    try:
        import tensor_ops.backends.cpp  # noqa: F401
    except ImportError:  # this build ships no cpp backend
        return
    for op, (fn, sup, kernel) in ADAPTERS.items():
        registry.register_impl(OpImpl(op_name=op, impl_id=IMPL_ID, kind=BackendImplKind.DEFAULT, fn=fn, backend=NAME,
                                      supports=sup, available=_availability(kernel), api="tex"))
