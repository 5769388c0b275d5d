"""fused_rope_forward / fused_rope_backward (sbhd, bshd, thd; interleaved; start positions; CP)."""
from __future__ import annotations

import torch

from ._common import check_same_device, check_tensor, nargs_error
from ._dispatch import call
from ._enums import NVTE_QKV_Format
from ._refs import reference

__all__ = ["fused_rope_forward", "fused_rope_backward", "fused_qkv_rope_forward", "fused_qkv_rope_backward"]

_FORMATS = {"sbhd": NVTE_QKV_Format.NVTE_SBHD, "bshd": NVTE_QKV_Format.NVTE_BSHD,
            "thd": NVTE_QKV_Format.NVTE_THD}


def _fmt(op, qkv_format):
    if isinstance(qkv_format, str) and qkv_format.lower() in _FORMATS:
        return _FORMATS[qkv_format.lower()]
    try:
        f = NVTE_QKV_Format(int(qkv_format))
    except (ValueError, TypeError):
        f = None
    if f not in _FORMATS.values():
        raise ValueError(f"tex.{op}: qkv_format={qkv_format!r} is not supported; valid: "
                         f"NVTE_QKV_Format.NVTE_SBHD, NVTE_BSHD, NVTE_THD")
    return f


def _check(op, args):
    if len(args) == 7:  # TE v2.9 backward: no start_positions
        args = (args[0], args[1], None) + tuple(args[2:])
    if len(args) != 8:
        raise nargs_error(op, "8 (input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, "
                          "cp_size, cp_rank)", len(args))
    x, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank = args
    check_tensor(op, "input", x, float_only=True)
    check_tensor(op, "freqs", freqs, float_only=True)
    check_tensor(op, "start_positions", start_positions, optional=True)
    check_tensor(op, "cu_seqlens", cu_seqlens, optional=True)
    check_same_device(op, input=x, freqs=freqs, start_positions=start_positions, cu_seqlens=cu_seqlens)
    fmt = _fmt(op, qkv_format)
    cp_size, cp_rank = int(cp_size), int(cp_rank)
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"tex.{op}: cp_rank={cp_rank} must be in [0, cp_size={cp_size})")
    want_dim = 3 if fmt == NVTE_QKV_Format.NVTE_THD else 4
    if x.dim() != want_dim:
        raise ValueError(f"tex.{op}: input must be {want_dim}-D for {fmt.name}, got shape {tuple(x.shape)}")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"tex.{op}: freqs must have shape (s, 1, 1, d2), got {tuple(freqs.shape)}")
    d, d2 = x.shape[-1], freqs.shape[-1]
    if d2 > d or d2 % 2:
        raise ValueError(f"tex.{op}: freqs' last dim {d2} must be even and <= input's head dim {d}")
    if fmt == NVTE_QKV_Format.NVTE_THD:
        if cu_seqlens is None:
            raise ValueError(f"tex.{op}: qkv_format thd needs cu_seqlens (int32 [b+1])")
        nb = cu_seqlens.numel() - 1
    else:
        nb = x.shape[1] if fmt == NVTE_QKV_Format.NVTE_SBHD else x.shape[0]
        s = x.shape[0] if fmt == NVTE_QKV_Format.NVTE_SBHD else x.shape[1]
        if freqs.shape[0] < s * cp_size and start_positions is None:
            raise ValueError(f"tex.{op}: freqs has {freqs.shape[0]} positions but the sequence needs "
                             f"{s * cp_size}")
    if start_positions is not None and start_positions.numel() != nb:
        raise ValueError(f"tex.{op}: start_positions has {start_positions.numel()} elements, expected the "
                         f"batch size {nb}")
    return (x, freqs, start_positions, fmt, bool(interleaved), cu_seqlens, cp_size, cp_rank)


def _contiguous(out):
    # upstream allocates its output: contiguous whatever the input's strides (TE's tests assert it)
    return out.contiguous() if isinstance(out, torch.Tensor) else out


def fused_rope_forward(*args):
    """``fused_rope_forward(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank)``
    → a new contiguous tensor (upstream allocates it), whatever the input's strides."""
    return _contiguous(call("fused_rope_forward", _check("fused_rope_forward", args)))


def fused_rope_backward(*args):
    """``fused_rope_backward(output_grads, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size,
    cp_rank)`` → a new contiguous tensor; TE v2.9's 7-argument form (no start_positions) is accepted too."""
    return _contiguous(call("fused_rope_backward", _check("fused_rope_backward", args)))


def _check_qkv_common(op, q_freqs, k_freqs, split, qkv_format, cp_size, cp_rank, dev):
    for name, f in (("q_freqs", q_freqs), ("k_freqs", k_freqs)):
        check_tensor(op, name, f)
        if f.dtype != torch.float32:
            raise TypeError(f"tex.{op}: {name} has dtype {f.dtype}; expected torch.float32")
        if f.dim() != 4 or f.shape[1] != 1 or f.shape[2] != 1:
            raise ValueError(f"tex.{op}: {name} must have shape (s, 1, 1, d2), got {tuple(f.shape)}")
        if f.device != dev:
            raise ValueError(f"tex.{op}: {name} is on {f.device}, the activations on {dev}; move them to one device")
    if q_freqs.shape[-1] != k_freqs.shape[-1]:
        raise ValueError(f"tex.{op}: q_freqs and k_freqs differ in their last dim "
                         f"({q_freqs.shape[-1]} vs {k_freqs.shape[-1]})")
    if (not isinstance(split, (list, tuple)) or len(split) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in split)):
        raise ValueError(f"tex.{op}: qkv_split_arg_list={split!r} must be 3 positive ints (q, k, v widths)")
    s0, s1, s2 = split
    if s0 % s1 or s0 % s2 or s1 % s2:
        raise ValueError(f"tex.{op}: qkv_split_arg_list={list(split)!r}: the q and k widths must be multiples of "
                         f"the head dim (the v width {s2}), and q's of k's")
    d2 = q_freqs.shape[-1]
    if d2 > s2 or d2 % 2:
        raise ValueError(f"tex.{op}: the freqs' last dim {d2} must be even and <= the head dim {s2}")
    fmt = _fmt(op, qkv_format)
    if fmt == NVTE_QKV_Format.NVTE_THD:
        raise ValueError(f"tex.{op}: qkv_format thd is not supported (upstream neither); use sbhd or bshd")
    cp_size, cp_rank = int(cp_size), int(cp_rank)
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"tex.{op}: cp_rank={cp_rank} must be in [0, cp_size={cp_size})")
    return list(split), fmt, cp_size, cp_rank


def fused_qkv_rope_forward(*args):
    """``fused_qkv_rope_forward(qkv_input, q_freqs, k_freqs, start_positions, qkv_split_arg_list, qkv_format,
    interleaved, cp_size, cp_rank)`` → ``(q, k, v)``.

    ``qkv_input`` (s, b, h, q+k+v) sbhd (or bshd) holds per group the q, k and v widths of
    ``qkv_split_arg_list``; q comes back as (s, b, h·q/k, k), k as (s, b, h, k), v as (s, b, h, v),
    q and k rotated (fused RoPE on the first d2 channels of each head) with their own freqs.
    """
    op = "fused_qkv_rope_forward"
    if len(args) != 9:
        raise nargs_error(op, "9 (qkv_input, q_freqs, k_freqs, start_positions, qkv_split_arg_list, qkv_format, "
                          "interleaved, cp_size, cp_rank)", len(args))
    qkv, qf, kf, start, split, fmt, interleaved, cp_size, cp_rank = args
    check_tensor(op, "qkv_input", qkv, float_only=True)
    if qkv.dim() != 4:
        raise ValueError(f"tex.{op}: qkv_input must be 4-D (s, b, h, d) or (b, s, h, d), got {tuple(qkv.shape)}")
    if not qkv.is_contiguous():
        raise ValueError(f"tex.{op}: qkv_input must be contiguous (upstream requires it), got strides "
                         f"{tuple(qkv.stride())}")
    split, fmt, cp_size, cp_rank = _check_qkv_common(op, qf, kf, split, fmt, cp_size, cp_rank, qkv.device)
    if sum(split) != qkv.shape[-1]:
        raise ValueError(f"tex.{op}: qkv_split_arg_list {split} sums to {sum(split)}, qkv_input's last dim is "
                         f"{qkv.shape[-1]}")
    check_tensor(op, "start_positions", start, optional=True)
    nb = qkv.shape[1] if fmt == NVTE_QKV_Format.NVTE_SBHD else qkv.shape[0]
    seq = qkv.shape[0] if fmt == NVTE_QKV_Format.NVTE_SBHD else qkv.shape[1]
    if start is not None and start.numel() != nb:
        raise ValueError(f"tex.{op}: start_positions has {start.numel()} elements, expected the batch size {nb}")
    for name, f in (("q_freqs", qf), ("k_freqs", kf)):
        if f.shape[0] < seq * cp_size and start is None:
            raise ValueError(f"tex.{op}: {name} has {f.shape[0]} positions but the sequence needs {seq * cp_size}")
    return tuple(call(op, (qkv, qf, kf, start, split, fmt, bool(interleaved), cp_size, cp_rank)))


def fused_qkv_rope_backward(*args):
    """``fused_qkv_rope_backward(q_grad_out, k_grad_out, v_grad_out, q_freqs, k_freqs, qkv_split_arg_list,
    qkv_format, interleaved, cp_size, cp_rank)`` → the gradient of ``qkv_input`` (contiguous)."""
    op = "fused_qkv_rope_backward"
    if len(args) != 10:
        raise nargs_error(op, "10 (q_grad_out, k_grad_out, v_grad_out, q_freqs, k_freqs, qkv_split_arg_list, "
                          "qkv_format, interleaved, cp_size, cp_rank)", len(args))
    gq, gk, gv, qf, kf, split, fmt, interleaved, cp_size, cp_rank = args
    for name, g in (("q_grad_out", gq), ("k_grad_out", gk), ("v_grad_out", gv)):
        check_tensor(op, name, g, float_only=True)
        if g.dim() != 4:
            raise ValueError(f"tex.{op}: {name} must be 4-D, got shape {tuple(g.shape)}")
    check_same_device(op, q_grad_out=gq, k_grad_out=gk, v_grad_out=gv)
    split, fmt, cp_size, cp_rank = _check_qkv_common(op, qf, kf, split, fmt, cp_size, cp_rank, gq.device)
    s0, s1, s2 = split
    h = gk.shape[2]
    lead = tuple(gk.shape[:2])
    want = {"q_grad_out": lead + (h * s0 // s1, s1), "k_grad_out": lead + (h, s1), "v_grad_out": lead + (h, s2)}
    for name, g in (("q_grad_out", gq), ("k_grad_out", gk), ("v_grad_out", gv)):
        if tuple(g.shape) != want[name]:
            raise ValueError(f"tex.{op}: {name} has shape {tuple(g.shape)}, expected {want[name]} for "
                             f"qkv_split_arg_list {split} and {h} groups")
        if g.dtype != gq.dtype:
            raise TypeError(f"tex.{op}: {name} has dtype {g.dtype}, q_grad_out {gq.dtype}; pass one dtype")
    return _contiguous(call(op, (gq, gk, gv, qf, kf, split, fmt, bool(interleaved), cp_size, cp_rank)))


# ---------------------------------------------------------------- reference.torch


def _cp_pos(local, seqlen, cp_size, cp_rank):
    """Global position of local index ``local`` in a sequence of local length ``seqlen`` (load-balanced CP)."""
    if cp_size == 1:
        return local
    half = seqlen // 2
    first = local + cp_rank * half
    second = seqlen * cp_size - (cp_rank + 1) * half + (local - half)
    return torch.where(local < half, first, second)


def _positions(x, fmt, start_positions, cu_seqlens, cp_size, cp_rank):
    """Per-token freq index, shaped to broadcast against x without the head and channel dims."""
    dev = x.device
    if fmt == NVTE_QKV_Format.NVTE_THD:
        cu = cu_seqlens.to(device=dev, dtype=torch.long)
        lens = cu[1:] - cu[:-1]
        seq_id = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens, output_size=x.shape[0])
        local = torch.arange(x.shape[0], device=dev) - cu[seq_id]
        pos = _cp_pos(local, lens[seq_id], cp_size, cp_rank)
        if start_positions is not None:
            pos = pos + start_positions.to(device=dev, dtype=torch.long)[seq_id]
        return pos  # (t,)
    s = x.shape[0] if fmt == NVTE_QKV_Format.NVTE_SBHD else x.shape[1]
    nb = x.shape[1] if fmt == NVTE_QKV_Format.NVTE_SBHD else x.shape[0]
    pos = _cp_pos(torch.arange(s, device=dev), s, cp_size, cp_rank)[:, None].expand(s, nb)
    if start_positions is not None:
        pos = pos + start_positions.to(device=dev, dtype=torch.long)[None, :]
    return pos if fmt == NVTE_QKV_Format.NVTE_SBHD else pos.t()  # (s, b) or (b, s)


def _rotate(z, interleaved, transpose):
    if interleaved:
        ev, od = z[..., 0::2], z[..., 1::2]
        out = torch.stack((od, -ev) if transpose else (-od, ev), dim=-1)
        return out.flatten(-2)
    h = z.shape[-1] // 2
    z1, z2 = z[..., :h], z[..., h:]
    return torch.cat((z2, -z1) if transpose else (-z2, z1), dim=-1)


def _rope(x, freqs, start_positions, fmt, interleaved, cu_seqlens, cp_size, cp_rank, transpose):
    d2 = freqs.shape[-1]
    pos = _positions(x, fmt, start_positions, cu_seqlens, cp_size, cp_rank)
    f = freqs.reshape(freqs.shape[0], d2).float()[pos].unsqueeze(-2)  # (..., 1, d2): broadcast over heads
    cos, sin = torch.cos(f), torch.sin(f)
    xr = x[..., :d2].float()
    if transpose:  # d/dx of (x·cos + R x·sin) is cos·dy + Rᵀ(sin·dy)
        yr = xr * cos + _rotate(xr * sin, interleaved, True)
    else:
        yr = xr * cos + _rotate(xr, interleaved, False) * sin
    if d2 == x.shape[-1]:
        return yr.to(x.dtype)
    return torch.cat([yr.to(x.dtype), x[..., d2:]], dim=-1)


@reference("fused_rope_forward")
def ref_fused_rope_forward(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank):
    return _rope(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank, False)


@reference("fused_rope_backward")
def ref_fused_rope_backward(output_grads, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size,
                            cp_rank):
    return _rope(output_grads, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank,
                 True)


def _heads(t, d):
    """(s, b, h, w) → (s, b, h·w/d, d): the d-wide heads a fused-QKV row holds."""
    return t.reshape(t.shape[0], t.shape[1], -1, d)


@reference("fused_qkv_rope_forward")
def ref_fused_qkv_rope_forward(qkv_input, q_freqs, k_freqs, start_positions, qkv_split_arg_list, qkv_format,
                               interleaved, cp_size, cp_rank):
    s0, s1, s2 = qkv_split_arg_list
    q, k, v = torch.split(qkv_input, [s0, s1, s2], dim=-1)
    h = qkv_input.shape[2]
    start = start_positions if cp_size == 1 else None   # the kernel ignores them under CP
    qo = _rope(_heads(q, s2), q_freqs, start, qkv_format, interleaved, None, cp_size, cp_rank, False)
    ko = _rope(_heads(k, s2), k_freqs, start, qkv_format, interleaved, None, cp_size, cp_rank, False)
    lead = tuple(qkv_input.shape[:2])
    return [qo.reshape(lead + (h * s0 // s1, s1)).contiguous(), ko.reshape(lead + (h, s1)).contiguous(),
            v.contiguous()]


@reference("fused_qkv_rope_backward")
def ref_fused_qkv_rope_backward(q_grad_out, k_grad_out, v_grad_out, q_freqs, k_freqs, qkv_split_arg_list, qkv_format,
                                interleaved, cp_size, cp_rank):
    s0, s1, s2 = qkv_split_arg_list
    h = k_grad_out.shape[2]
    lead = tuple(k_grad_out.shape[:2])
    gq = _rope(_heads(q_grad_out, s2), q_freqs, None, qkv_format, interleaved, None, cp_size, cp_rank, True)
    gk = _rope(_heads(k_grad_out, s2), k_freqs, None, qkv_format, interleaved, None, cp_size, cp_rank, True)
    return torch.cat([gq.reshape(lead + (h, s0)), gk.reshape(lead + (h, s1)), v_grad_out.reshape(lead + (h, s2))],
                     dim=-1)
