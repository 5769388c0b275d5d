"""Packed-sequence (THD) and context-parallel helpers, multi-row padding, split offsets.

THD: tokens of all sequences packed along one dim, ``cu_seqlens`` int32 [b+1] their offsets.
Context parallelism splits each sequence into 2·cp chunks; rank r holds chunks r and
2·cp−1−r (load balancing), so its local THD tensor holds, per sequence, a first and a second
half. Semantics as upstream's kernels (``common/fused_attn/context_parallel.cu``,
``common/util/padding.cu``, ``common/util/splits_to_offsets.cu``).
"""
from __future__ import annotations

import torch

from ._common import as_int, check_same_device, check_tensor
from ._dispatch import call
from ._refs import reference

__all__ = ["thd_read_half_tensor", "thd_second_half_lse_correction", "thd_read_second_half_lse",
           "thd_out_correction", "thd_grad_correction", "thd_get_partitioned_indices",
           "thd_sequence_order_to_cp_rank_order", "thd_cp_rank_order_to_sequence_order",
           "thd_copy_valid_tokens_from_per_split_to_rank_local", "convert_thd_to_bshd", "convert_bshd_to_thd",
           "fused_multi_row_padding", "fused_multi_row_unpadding", "splits_to_offsets", "splits_to_offsets_multi"]

_GRAD_MODES = ("none", "copy", "add")


def _cu(op, name, cu, dev):
    check_tensor(op, name, cu)
    if cu.dtype not in (torch.int32, torch.int64) or cu.dim() != 1 or cu.numel() < 1:
        raise TypeError(f"tex.{op}: {name} must be a 1-D int32 tensor [b+1], got {cu.dtype} {tuple(cu.shape)}")
    if cu.device != dev:
        raise ValueError(f"tex.{op}: {name} is on {cu.device}, the data on {dev}; move them to one device")
    return cu


def _seq_dim(op, name, t):
    check_tensor(op, name, t)
    if t.dim() not in (3, 4):
        raise ValueError(f"tex.{op}: {name} must be [t, h, d] or [n, t, h, d], got shape {tuple(t.shape)}")
    return 0 if t.dim() == 3 else 1


def _even_total(op, cu, t_len, div):
    total = int(cu[-1])
    if total != t_len:
        raise ValueError(f"tex.{op}: cu_seqlens ends at {total}, the tensor has {t_len} tokens")
    lens = (cu[1:] - cu[:-1]).tolist()
    if any(n % div for n in lens):
        raise ValueError(f"tex.{op}: every sequence length must be a multiple of {div}, got {lens}")


def thd_read_half_tensor(tensor, cu_seqlens, half_idx):
    """The first (``half_idx=0``) or second half of every sequence of a THD tensor ([t, h, d] or
    [n, t, h, d]) → its tokens halved."""
    op = "thd_read_half_tensor"
    sd = _seq_dim(op, "tensor", tensor)
    _cu(op, "cu_seqlens", cu_seqlens, tensor.device)
    half_idx = as_int(op, "half_idx", half_idx)
    if half_idx not in (0, 1):
        raise ValueError(f"tex.{op}: half_idx={half_idx}; valid: 0, 1")
    _even_total(op, cu_seqlens, tensor.shape[sd], 2)
    return call(op, (tensor, cu_seqlens, half_idx))


def _lse_dims(op, lse, cu_seqlens, lse_packed):
    check_tensor(op, "lse", lse)
    if lse.dtype != torch.float32:
        raise TypeError(f"tex.{op}: lse has dtype {lse.dtype}; expected torch.float32")
    if lse.dim() != (2 if lse_packed else 3):
        raise ValueError(f"tex.{op}: lse must be {'[h, t]' if lse_packed else '[b, h, s]'} "
                         f"(lse_packed={lse_packed}), got shape {tuple(lse.shape)}")
    _cu(op, "cu_seqlens", cu_seqlens, lse.device)


def thd_second_half_lse_correction(lse, lse_per_step, cu_seqlens, lse_packed):
    """In place: ``lse = log(exp(lse) + exp(lse_per_step))`` on the second half of every sequence."""
    op = "thd_second_half_lse_correction"
    lse_packed = bool(lse_packed)
    _lse_dims(op, lse, cu_seqlens, lse_packed)
    check_tensor(op, "lse_per_step", lse_per_step)
    if lse_per_step.dtype != torch.float32 or lse_per_step.dim() != lse.dim():
        raise ValueError(f"tex.{op}: lse_per_step must be float32 with lse's rank, got {lse_per_step.dtype} "
                         f"{tuple(lse_per_step.shape)}")
    with torch.no_grad():
        call(op, (lse, lse_per_step, cu_seqlens, lse_packed))


def thd_read_second_half_lse(lse, cu_seqlens, lse_packed, second_half_lse_seqlen):
    """The second half of every sequence's lse → [h, second_half_lse_seqlen] (packed) or
    [b, h, second_half_lse_seqlen] (zeros past each half)."""
    op = "thd_read_second_half_lse"
    lse_packed = bool(lse_packed)
    _lse_dims(op, lse, cu_seqlens, lse_packed)
    return call(op, (lse, cu_seqlens, lse_packed, as_int(op, "second_half_lse_seqlen", second_half_lse_seqlen)))


def thd_out_correction(out, out_per_step, lse, lse_per_step, cu_seqlens, only_second_half, lse_packed):
    """In place: ``out += out_per_step · exp(lse_per_step − lse)`` (per token and head; exact zeros of
    out_per_step add nothing), over every token or only the second half of each sequence."""
    op = "thd_out_correction"
    lse_packed = bool(lse_packed)
    check_tensor(op, "out", out, float_only=True)
    check_tensor(op, "out_per_step", out_per_step, float_only=True)
    if out.dim() != 3 or out_per_step.dim() != 3:
        raise ValueError(f"tex.{op}: out and out_per_step must be [t, h, d], got {tuple(out.shape)} and "
                         f"{tuple(out_per_step.shape)}")
    _lse_dims(op, lse, cu_seqlens, lse_packed)
    check_tensor(op, "lse_per_step", lse_per_step)
    check_same_device(op, out=out, out_per_step=out_per_step, lse=lse, lse_per_step=lse_per_step)
    with torch.no_grad():
        call(op, (out, out_per_step, lse, lse_per_step, cu_seqlens, bool(only_second_half), lse_packed))


def thd_grad_correction(grad, grad_per_step, cu_seqlens, first_half, second_half):
    """In place on ``grad``: per half of every sequence, ``"copy"`` grad_per_step there, ``"add"`` it, or
    ``"none"``. With one half ``"none"``, grad_per_step holds only the other half's tokens."""
    op = "thd_grad_correction"
    sd = _seq_dim(op, "grad", grad)
    check_tensor(op, "grad_per_step", grad_per_step, float_only=True)
    _cu(op, "cu_seqlens", cu_seqlens, grad.device)
    for name, v in (("first_half", first_half), ("second_half", second_half)):
        if v not in _GRAD_MODES:
            raise ValueError(f"tex.{op}: {name}={v!r}; valid: {list(_GRAD_MODES)}")
    if first_half == "none" and second_half == "none":
        raise ValueError(f"tex.{op}: first_half and second_half cannot both be 'none'")
    if first_half == "copy" and second_half != "none" or second_half == "add" and first_half == "copy":
        raise ValueError(f"tex.{op}: ({first_half!r}, {second_half!r}) is not a combination upstream has; valid: "
                         f"('add'|'copy', 'none'), ('none', 'add'|'copy'), ('add', 'copy')")
    _even_total(op, cu_seqlens, grad.shape[sd], 2)
    half = "none" in (first_half, second_half)
    want = list(grad.shape)
    if half:
        want[sd] //= 2
    if list(grad_per_step.shape) != want:
        raise ValueError(f"tex.{op}: grad_per_step has shape {tuple(grad_per_step.shape)}, expected {tuple(want)}")
    with torch.no_grad():
        call(op, (grad, grad_per_step, cu_seqlens, first_half, second_half))


def thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank):
    """The global token indices context-parallel rank ``rank`` holds → int32 [total_tokens / world_size]."""
    op = "thd_get_partitioned_indices"
    _cu(op, "cu_seqlens", cu_seqlens, cu_seqlens.device)
    total_tokens, world_size, rank = (as_int(op, n, v) for n, v in
                                      (("total_tokens", total_tokens), ("world_size", world_size), ("rank", rank)))
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"tex.{op}: rank={rank} must be in [0, world_size={world_size})")
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if any(n % (2 * world_size) for n in lens) or total_tokens % world_size:
        raise ValueError(f"tex.{op}: every sequence length must be a multiple of 2*world_size={2 * world_size}, "
                         f"got {lens}")
    return call(op, (cu_seqlens, total_tokens, world_size, rank))


def _reorder_args(op, inp, cu_seqlens, cp_size, total_tokens):
    check_tensor(op, "inp", inp)
    if inp.dim() < 1:
        raise ValueError(f"tex.{op}: inp must have a token dim, got a 0-d tensor")
    _cu(op, "cu_seqlens", cu_seqlens, inp.device)
    cp_size, total_tokens = as_int(op, "cp_size", cp_size), as_int(op, "total_tokens", total_tokens)
    if cp_size < 1 or total_tokens != inp.shape[0]:
        raise ValueError(f"tex.{op}: cp_size={cp_size} must be >= 1 and total_tokens={total_tokens} equal inp's "
                         f"first dim {inp.shape[0]}")
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if any(n % (2 * cp_size) for n in lens):
        raise ValueError(f"tex.{op}: every sequence length must be a multiple of 2*cp_size={2 * cp_size}, got {lens}")
    return (inp, cu_seqlens, cp_size, total_tokens)


def thd_sequence_order_to_cp_rank_order(inp, cu_seqlens, cp_size, total_tokens):
    """Reorder tokens from sequence order into rank-major order (rank 0's tokens first, …)."""
    op = "thd_sequence_order_to_cp_rank_order"
    return call(op, _reorder_args(op, inp, cu_seqlens, cp_size, total_tokens))


def thd_cp_rank_order_to_sequence_order(inp, cu_seqlens, cp_size, total_tokens):
    """Inverse of :func:`thd_sequence_order_to_cp_rank_order`."""
    op = "thd_cp_rank_order_to_sequence_order"
    return call(op, _reorder_args(op, inp, cu_seqlens, cp_size, total_tokens))


def thd_copy_valid_tokens_from_per_split_to_rank_local(out, inp, cu_seqlens_padded, cu_seqlens):
    """In place: copy each sequence's first ``len_i`` tokens (``cu_seqlens``) at its padded offset
    (``cu_seqlens_padded``) from ``inp`` to ``out`` (the padding rows of ``out`` are kept)."""
    op = "thd_copy_valid_tokens_from_per_split_to_rank_local"
    check_tensor(op, "out", out)
    check_tensor(op, "inp", inp)
    if out.shape != inp.shape or out.dtype != inp.dtype or not out.is_contiguous():
        raise ValueError(f"tex.{op}: out must be contiguous with inp's shape and dtype, got {tuple(out.shape)} "
                         f"{out.dtype} vs {tuple(inp.shape)} {inp.dtype}")
    _cu(op, "cu_seqlens_padded", cu_seqlens_padded, inp.device)
    _cu(op, "cu_seqlens", cu_seqlens, inp.device)
    if cu_seqlens.numel() != cu_seqlens_padded.numel():
        raise ValueError(f"tex.{op}: cu_seqlens and cu_seqlens_padded differ in length")
    with torch.no_grad():
        call(op, (out, inp, cu_seqlens_padded, cu_seqlens))


def convert_thd_to_bshd(tensor, cu_seqlens, b, max_seq_len):
    """[t, h, d] packed → [b, max_seq_len, h, d], zero past each sequence."""
    op = "convert_thd_to_bshd"
    check_tensor(op, "tensor", tensor)
    if tensor.dim() != 3:
        raise ValueError(f"tex.{op}: tensor must be [t, h, d], got {tuple(tensor.shape)}")
    _cu(op, "cu_seqlens", cu_seqlens, tensor.device)
    b, max_seq_len = as_int(op, "b", b), as_int(op, "max_seq_len", max_seq_len)
    if cu_seqlens.numel() != b + 1:
        raise ValueError(f"tex.{op}: cu_seqlens has {cu_seqlens.numel()} entries, expected b+1 = {b + 1}")
    return call(op, (tensor, cu_seqlens, b, max_seq_len))


def convert_bshd_to_thd(tensor, cu_seqlens, t):
    """[b, s, h, d] → [t, h, d]: each sequence's first len_i tokens packed."""
    op = "convert_bshd_to_thd"
    check_tensor(op, "tensor", tensor)
    if tensor.dim() != 4:
        raise ValueError(f"tex.{op}: tensor must be [b, s, h, d], got {tuple(tensor.shape)}")
    _cu(op, "cu_seqlens", cu_seqlens, tensor.device)
    if cu_seqlens.numel() != tensor.shape[0] + 1:
        raise ValueError(f"tex.{op}: cu_seqlens has {cu_seqlens.numel()} entries, expected b+1 = {tensor.shape[0] + 1}")
    return call(op, (tensor, cu_seqlens, as_int(op, "t", t)))


def _padding_args(op, inp, out, rows, out_rows, out_name):
    check_tensor(op, "input", inp)
    check_tensor(op, "output", out)
    check_same_device(op, input=inp, output=out)
    if inp.dim() != 2 or out.dim() != 2 or inp.shape[1] != out.shape[1] or inp.dtype != out.dtype:
        raise ValueError(f"tex.{op}: input and output must be 2-D with the same width and dtype, got "
                         f"{tuple(inp.shape)} {inp.dtype} and {tuple(out.shape)} {out.dtype}")
    if not inp.is_contiguous() or not out.is_contiguous():
        raise ValueError(f"tex.{op}: input and output must be contiguous")
    rows = [as_int(op, "input_row_list", r) for r in rows]
    out_rows = [as_int(op, out_name, r) for r in out_rows]
    if len(rows) != len(out_rows):
        raise ValueError(f"tex.{op}: input_row_list has {len(rows)} entries, {out_name} {len(out_rows)}")
    if sum(rows) > inp.shape[0] or sum(out_rows) > out.shape[0]:
        raise ValueError(f"tex.{op}: the row lists ({sum(rows)} in, {sum(out_rows)} out) exceed the tensors "
                         f"({inp.shape[0]}, {out.shape[0]} rows)")
    return rows, out_rows


def fused_multi_row_padding(input, output, input_row_list, padded_input_row_list):
    """In place: chunk i of ``input`` (``input_row_list[i]`` rows) copied to chunk i of ``output``
    (``padded_input_row_list[i]`` rows), the rows past it zeroed."""
    op = "fused_multi_row_padding"
    rows, out_rows = _padding_args(op, input, output, input_row_list, padded_input_row_list, "padded_input_row_list")
    if any(o < r for r, o in zip(rows, out_rows)):
        raise ValueError(f"tex.{op}: padded_input_row_list {out_rows} has an entry below input_row_list {rows}")
    with torch.no_grad():
        call(op, (input, output, rows, out_rows))


def fused_multi_row_unpadding(input, output, input_row_list, unpadded_input_row_list):
    """In place: the first ``unpadded_input_row_list[i]`` rows of chunk i of ``input`` copied to ``output``."""
    op = "fused_multi_row_unpadding"
    rows, out_rows = _padding_args(op, input, output, input_row_list, unpadded_input_row_list,
                                   "unpadded_input_row_list")
    if any(o > r for r, o in zip(rows, out_rows)):
        raise ValueError(f"tex.{op}: unpadded_input_row_list {out_rows} has an entry above input_row_list {rows}")
    with torch.no_grad():
        call(op, (input, output, rows, out_rows))


def splits_to_offsets(first_dims, logical_last_dim):
    """``[0, cumsum(first_dims · logical_last_dim)]`` → int64 [n+1] (element offsets of grouped tensors)."""
    op = "splits_to_offsets"
    check_tensor(op, "first_dims", first_dims)
    if first_dims.dtype != torch.int64 or first_dims.dim() != 1:
        raise TypeError(f"tex.{op}: first_dims must be a 1-D int64 tensor, got {first_dims.dtype} "
                        f"{tuple(first_dims.shape)}")
    last = as_int(op, "logical_last_dim", logical_last_dim)
    if last <= 0:
        raise ValueError(f"tex.{op}: logical_last_dim={last} must be > 0")
    return call(op, (first_dims, last))


def splits_to_offsets_multi(split_sizes, device, strides, include_leading_zero, dtypes, bulk_allocate=False):
    """Several prefix sums of ``split_sizes · stride_i`` at once → ``(split_sizes as int64 on device,
    [offsets_i])``, offsets_i with a leading 0 when ``include_leading_zero[i]``, in ``dtypes[i]``."""
    op = "splits_to_offsets_multi"
    if not isinstance(split_sizes, torch.Tensor):
        split_sizes = torch.as_tensor(split_sizes, dtype=torch.int64)
    check_tensor(op, "split_sizes", split_sizes)
    if split_sizes.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"tex.{op}: split_sizes must be int32/int64, got {split_sizes.dtype}")
    strides, include_leading_zero, dtypes = list(strides), list(include_leading_zero), list(dtypes)
    if not len(strides) == len(include_leading_zero) == len(dtypes):
        raise ValueError(f"tex.{op}: strides, include_leading_zero and dtypes must have matching lengths, got "
                         f"{len(strides)}, {len(include_leading_zero)} and {len(dtypes)}")
    for i, d in enumerate(dtypes):
        if d not in (torch.int32, torch.int64):
            raise TypeError(f"tex.{op}: dtypes[{i}]={d!r}; expected torch.int32 or torch.int64")
    sizes = split_sizes.to(device=torch.device(device), dtype=torch.int64)
    outs = []
    for stride, lead, dt in zip(strides, include_leading_zero, dtypes):
        c = torch.cumsum(sizes * int(stride), 0)
        if lead:
            c = torch.cat([c.new_zeros(1), c])
        outs.append(c.to(dt))
    return sizes, outs


# ---------------------------------------------------------------- reference.torch


def _seq_info(cu, div, device):
    """Per token of the divided layout: (seq id, local index, divided length, divided offset)."""
    cu_s = cu.to(device=device, dtype=torch.long) // div
    lens = cu_s[1:] - cu_s[:-1]
    n = int(cu_s[-1])
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=device), lens, output_size=n)
    local = torch.arange(n, device=device) - cu_s[seq]
    return seq, local, lens, cu_s


@reference("thd_read_half_tensor")
def ref_thd_read_half_tensor(tensor, cu_seqlens, half_idx):
    sd = 0 if tensor.dim() == 3 else 1
    seq, local, lens, cu_s = _seq_info(cu_seqlens, 2, tensor.device)
    src = local + cu_s[seq] + cu_s[seq + half_idx]      # the kernel's token_id + cu_s[seq + half_idx]
    return tensor.index_select(sd, src).contiguous()


def _lse_index(cu_seqlens, lse_packed, nh, lse_seqlen, half_seqlen, device, second_offset=True):
    seq, local, lens, cu_s = _seq_info(cu_seqlens, 2, device)
    token = local + cu_s[seq]
    h = torch.arange(nh, device=device)[:, None]
    if lse_packed:
        idx = h * lse_seqlen + token[None] + cu_s[seq + 1][None]
        half = h * half_seqlen + token[None]
    else:
        row = seq[None] * nh + h
        idx = row * lse_seqlen + local[None] + lens[seq][None]
        half = row * half_seqlen + local[None]
    return idx.reshape(-1), half.reshape(-1)


@reference("thd_second_half_lse_correction")
def ref_thd_second_half_lse_correction(lse, lse_per_step, cu_seqlens, lse_packed):
    nh = lse.shape[0] if lse_packed else lse.shape[1]
    idx, half = _lse_index(cu_seqlens, lse_packed, nh, lse.shape[-1], lse_per_step.shape[-1], lse.device)
    flat, per = lse.view(-1), lse_per_step.reshape(-1)
    a, b = flat[idx], per[half]
    mx, mn = torch.maximum(a, b), torch.minimum(a, b)
    flat[idx] = mx + torch.log1p(torch.exp(mn - mx))


@reference("thd_read_second_half_lse")
def ref_thd_read_second_half_lse(lse, cu_seqlens, lse_packed, second_half_lse_seqlen):
    nh = lse.shape[0] if lse_packed else lse.shape[1]
    shape = (nh, second_half_lse_seqlen) if lse_packed else (lse.shape[0], nh, second_half_lse_seqlen)
    out = torch.zeros(shape, dtype=lse.dtype, device=lse.device)
    idx, half = _lse_index(cu_seqlens, lse_packed, nh, lse.shape[-1], second_half_lse_seqlen, lse.device)
    out.view(-1)[half] = lse.reshape(-1)[idx]
    return out


@reference("thd_out_correction")
def ref_thd_out_correction(out, out_per_step, lse, lse_per_step, cu_seqlens, only_second_half, lse_packed):
    div = 2 if only_second_half else 1
    seq, local, lens, cu_s = _seq_info(cu_seqlens, div, out.device)
    nh = out.shape[1]
    token = local + cu_s[seq]
    h = torch.arange(nh, device=out.device)[None, :]
    sh = 1 if only_second_half else 0
    if lse_packed:
        idx = h * lse.shape[-1] + (token + cu_s[seq + 1] * sh)[:, None]
        idx_step = h * lse_per_step.shape[-1] + token[:, None]
    else:
        row = seq[:, None] * nh + h
        idx = row * lse.shape[-1] + (local + lens[seq] * sh)[:, None]
        idx_step = row * lse_per_step.shape[-1] + local[:, None]
    scale = torch.exp(lse_per_step.reshape(-1)[idx_step] - lse.reshape(-1)[idx])   # [tokens, h]
    dst = token + cu_s[seq + 1] * sh
    step = out_per_step[: token.numel()]
    add = torch.where(step == 0, torch.zeros_like(step), (step.float() * scale[..., None]).to(out.dtype))
    out[dst] = out[dst] + add


@reference("thd_grad_correction")
def ref_thd_grad_correction(grad, grad_per_step, cu_seqlens, first_half, second_half):
    g = grad if grad.dim() == 4 else grad.unsqueeze(0)
    gs = grad_per_step if grad_per_step.dim() == 4 else grad_per_step.unsqueeze(0)
    halves = [("first", first_half, 0), ("second", second_half, 1)]
    if "none" in (first_half, second_half):
        seq, local, lens, cu_s = _seq_info(cu_seqlens, 2, grad.device)
        for _, mode, hi in halves:
            if mode == "none":
                continue
            dst = local + cu_s[seq] + cu_s[seq + hi]
            src = torch.arange(dst.numel(), device=grad.device)
            _apply(g, gs, dst, src, mode)
    else:
        seq, local, lens, cu_s = _seq_info(cu_seqlens, 1, grad.device)
        first = local < lens[seq] // 2
        tok = torch.arange(seq.numel(), device=grad.device)
        for _, mode, hi in halves:
            sel = tok[first] if hi == 0 else tok[~first]
            _apply(g, gs, sel, sel, mode)


def _apply(g, gs, dst, src, mode):
    if mode == "copy":
        g[:, dst] = gs[:, src]
    else:
        g[:, dst] = g[:, dst] + gs[:, src]


def _partition_src(token_id, cu_s, world_size, rank):
    """The kernel's thd_partition_src_index for local token ids of rank ``rank``."""
    seq = torch.searchsorted(cu_s[1:], token_id, right=True)
    seq_len = cu_s[seq + 1] - cu_s[seq]
    index = token_id - cu_s[seq]
    offset = torch.where(index < seq_len // 2, torch.full_like(index, rank), (world_size - 1) * 2 - rank)
    return index + cu_s[seq] * world_size + seq_len // 2 * offset


@reference("thd_get_partitioned_indices")
def ref_thd_get_partitioned_indices(cu_seqlens, total_tokens, world_size, rank):
    cu_s = cu_seqlens.long() // world_size
    tok = torch.arange(total_tokens // world_size, device=cu_seqlens.device)
    return _partition_src(tok, cu_s, world_size, rank).to(torch.int32)


def _cp_src_all(cu_seqlens, cp_size, total_tokens):
    cu_s = cu_seqlens.long() // cp_size
    tpr = total_tokens // cp_size
    gi = torch.arange(total_tokens, device=cu_seqlens.device)
    rank = gi // tpr
    tok = gi % tpr
    seq = torch.searchsorted(cu_s[1:], tok, right=True)
    seq_len = cu_s[seq + 1] - cu_s[seq]
    index = tok - cu_s[seq]
    offset = torch.where(index < seq_len // 2, rank, (cp_size - 1) * 2 - rank)
    return index + cu_s[seq] * cp_size + seq_len // 2 * offset


@reference("thd_sequence_order_to_cp_rank_order")
def ref_thd_sequence_order_to_cp_rank_order(inp, cu_seqlens, cp_size, total_tokens):
    return inp.contiguous()[_cp_src_all(cu_seqlens, cp_size, total_tokens)]


@reference("thd_cp_rank_order_to_sequence_order")
def ref_thd_cp_rank_order_to_sequence_order(inp, cu_seqlens, cp_size, total_tokens):
    src = _cp_src_all(cu_seqlens, cp_size, total_tokens)
    out = torch.empty_like(inp.contiguous())
    out[src] = inp
    return out


@reference("thd_copy_valid_tokens_from_per_split_to_rank_local")
def ref_thd_copy_valid_tokens_from_per_split_to_rank_local(out, inp, cu_seqlens_padded, cu_seqlens):
    pad = cu_seqlens_padded.long().tolist()
    val = cu_seqlens.long().tolist()
    for i in range(len(pad) - 1):
        n = min(val[i + 1] - val[i], pad[i + 1] - pad[i], max(inp.shape[0] - pad[i], 0))
        if n > 0:
            out[pad[i]:pad[i] + n] = inp[pad[i]:pad[i] + n]


@reference("convert_thd_to_bshd")
def ref_convert_thd_to_bshd(tensor, cu_seqlens, b, max_seq_len):
    out = tensor.new_zeros((b, max_seq_len) + tuple(tensor.shape[1:]))
    cu = cu_seqlens.long().tolist()
    for i in range(b):
        n = min(cu[i + 1] - cu[i], max_seq_len)
        out[i, :n] = tensor[cu[i]:cu[i] + n]
    return out


@reference("convert_bshd_to_thd")
def ref_convert_bshd_to_thd(tensor, cu_seqlens, t):
    out = tensor.new_zeros((t,) + tuple(tensor.shape[2:]))
    cu = cu_seqlens.long().tolist()
    for i in range(tensor.shape[0]):
        n = min(cu[i + 1] - cu[i], tensor.shape[1], max(t - cu[i], 0))
        out[cu[i]:cu[i] + n] = tensor[i, :n]
    return out


@reference("fused_multi_row_padding")
def ref_fused_multi_row_padding(input, output, input_row_list, padded_input_row_list):
    i = o = 0
    for r, p in zip(input_row_list, padded_input_row_list):
        output[o:o + r] = input[i:i + r]
        output[o + r:o + p] = 0
        i, o = i + r, o + p


@reference("fused_multi_row_unpadding")
def ref_fused_multi_row_unpadding(input, output, input_row_list, unpadded_input_row_list):
    i = o = 0
    for r, u in zip(input_row_list, unpadded_input_row_list):
        output[o:o + u] = input[i:i + u]
        i, o = i + r, o + u


@reference("splits_to_offsets")
def ref_splits_to_offsets(first_dims, logical_last_dim):
    c = torch.cumsum(first_dims.long() * logical_last_dim, 0)
    return torch.cat([c.new_zeros(1), c])
