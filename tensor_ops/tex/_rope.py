"""fused_rope_forward / fused_rope_backward (sbhd, bshd, thd; interleaved; start positions; CP)."""
from __future__ import annotations

import torch

from ._common import check_same_device, check_tensor, nargs_error
from ._dispatch import call
from ._enums import NVTE_QKV_Format
from ._refs import reference

__all__ = ["fused_rope_forward", "fused_rope_backward"]

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


def fused_rope_forward(*args):
    """``fused_rope_forward(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size, cp_rank)``."""
    return call("fused_rope_forward", _check("fused_rope_forward", args))


def fused_rope_backward(*args):
    """``fused_rope_backward(output_grads, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size,
    cp_rank)``; TE v2.9's 7-argument form (no start_positions) is accepted too."""
    return call("fused_rope_backward", _check("fused_rope_backward", args))


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
