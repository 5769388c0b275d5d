"""default.cpp, training side: tex's activation derivatives (with the bias gradient), TE's
softmax family forward and backward, fused RoPE, the SGD step (``cpp_ext/tex_train.cpp``) and the
GEMM (torch's BLAS, fresh results from the block cache, the bias gradient from the native column
sums). Registered with the forward adapters by ``_cpp_adapters.register``; the same rules hold:
each ``supports`` accepts only what its kernel takes exactly."""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from ._cpp_base import _F32, _OK, _empty, _empty_like, _flat, _kw, _native, _np, _plain, _views


# ---------------------------------------------------------------- training: activation derivatives

_DACT = {"gelu": "gelu", "silu": "silu", "relu": "relu", "qgelu": "qgelu", "srelu": "srelu"}
_DGLU = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu", "qgeglu": "qgelu", "sreglu": "srelu", "glu": "sigmoid"}


def _sup_dact(grad, fwd_input, quantizer):
    return _plain(fwd_input) and _plain(grad, fwd_input.dtype)


def _deriv(kernel, kind):
    """``dact`` (the plain derivatives) or ``dglu`` (the gated ones) into a fresh output."""
    def fn(grad, fwd_input, quantizer):
        k = _native()
        out = _empty_like(fwd_input)
        gv, xv, ov = _views(grad, fwd_input, out)
        getattr(k, kernel)(gv, xv, ov, k.DACT_CODES[kind], dtype=_kw(fwd_input))
        return out
    return fn


def _dbias_dact(kind):
    def fn(grad, fwd_input, quantizer):
        k = _native()
        out = _empty_like(fwd_input)
        h = fwd_input.shape[-1]
        db = torch.zeros(h, dtype=_F32)
        gv, xv, ov, dbv = _views(grad, fwd_input, out, db)
        k.dact(gv, xv, ov, k.DACT_CODES[kind], dbias=dbv, dtype=_kw(fwd_input))
        return [db.to(grad.dtype), out]
    return fn


# ---------------------------------------------------------------- training: TE's softmax family

_SM_PLAIN, _SM_MASK, _SM_CAUSAL = 0, 1, 2


def _softmax_run(x, mode, scale, mask=None, heads=1, sq=1, causal_off=0):
    out = _empty_like(x)
    xv, ov = _views(x, out)
    _native().tex_softmax(xv, ov, scale, mode, mask, heads, sq, causal_off, dtype=_kw(x))
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
    gv, yv, ov = _views(output_grads, softmax_results, out)
    _native().tex_softmax_bwd(gv, yv, ov, scale, dtype=_kw(softmax_results))
    return out


# ---------------------------------------------------------------- training: fused RoPE


def _sup_rope(x, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
    return _plain(x) and freqs.device.type == "cpu"


class _Tables:
    """cos/sin of the last ``freqs`` rotated by, as (P, d2) fp32 arrays. A model's layers (and
    each layer's q and k, forward and backward) rotate by one freqs per step, and the tables
    cost ~1.4 ms of a ~9 ms (8192, 1, 32, 128) fp32 call. Reused for the same tensor while its
    version counter is unchanged (PyTorch's own rule for in-place writes: like autograd, this
    does not see writes through ``.data``), and for another tensor holding the same bits (a
    freqs rebuilt every step; the comparison costs ~0.35 ms, so the same tensor skips it).
    Tables over 64 MiB are not kept."""

    entry = None   # (weakref to the freqs, its _version, its bits as (P, d2) int32, cos, sin)

    @classmethod
    def get(cls, freqs):
        try:
            ver = freqs._version
        except RuntimeError:   # an inference tensor: no version counter, compared by value
            ver = None
        e = cls.entry
        if e is not None and ver is not None and e[0]() is freqs and e[1] == ver:
            return e[3], e[4]
        f = freqs.detach().reshape(freqs.shape[0], freqs.shape[-1]).float()
        bits = f.view(torch.int32)      # bitwise: -0.0 vs 0.0 (sin's sign) and NaNs compare exactly
        if e is not None and e[2].shape == bits.shape and torch.equal(e[2], bits):
            kept, c, s = e[2], e[3], e[4]
        else:
            kept, c, s = bits.clone(), torch.cos(f).numpy(), torch.sin(f).numpy()
        cls.entry = (weakref.ref(freqs), ver, kept, c, s) if 2 * c.nbytes <= 64 << 20 else None
        return c, s


def _rope(transpose):
    def fn(x, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
        from ._rope import _positions
        cos, sin = _Tables.get(freqs)
        pos = _positions(x, qkv_format, start_positions, cu_seqlens, cp_size, cp_rank)
        pos = pos.contiguous().reshape(-1).to(torch.int64)
        heads = x.shape[-2]
        out = _empty_like(x)
        xv, ov = _views(x, out)
        _native().tex_rope(xv, cos, sin, pos.numpy(), ov, heads, bool(interleaved), transpose, dtype=_kw(x))
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


# ---------------------------------------------------------------- GEMM (torch's BLAS; results from the block cache)


def _sup_gemm(A, transA, B, transB, D, q, otype, bias, *rest):
    return all(t is None or (t.device.type == "cpu" and t.dtype in _OK) for t in (A, B, D, bias))


def _col_sums(x, otype):
    if not _plain(x):
        from ._gemm import _column_sums
        return _column_sums(x, otype)
    out = torch.empty(x.shape[-1], dtype=_F32)
    _native().col_sums(_np(x), out.numpy(), dtype=_kw(x))
    return out.to(otype)


def generic_gemm(*args):
    """_gemm.gemm (one definition of the GEMM and its epilogues, BLAS through torch) with fresh
    results from the block cache and the bias gradient from the native column sums (4096x8192:
    fp32 4.6 vs 7.9 ms, bf16 2.4 vs 5.8 ms for torch's sum(0), 2 threads)."""
    from ._gemm import gemm
    return gemm(*args, empty=_empty, column_sums=_col_sums)


#: tex op → (adapter, supports, native function it needs); ``_cpp_adapters.ADAPTERS`` includes these
ADAPTERS: dict[str, tuple[Callable[..., Any], Callable[..., bool], str]] = {
    "scaled_softmax_forward": (tex_scaled_softmax_forward, _sup_sm, "tex_softmax"),
    **{"d" + op: (_deriv("dact", kind), _sup_dact, "dact") for op, kind in _DACT.items()},
    **{"dbias_d" + op: (_dbias_dact(kind), _sup_dact, "dact") for op, kind in _DACT.items()},
    **{"d" + op: (_deriv("dglu", kind), _sup_dact, "dglu") for op, kind in _DGLU.items()},
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
    "generic_gemm": (generic_gemm, _sup_gemm, "col_sums"),
}
