"""Mixture-of-experts ops: token permutation (index map) and the fused router (top-k with a score
function, scores for the aux loss, the aux loss), with upstream TE's semantics.

Permutation (``row_id_map[k·N + t]`` = the permuted row of token t's k-th choice, -1 if dropped):
the (token, choice) pairs are sorted stably by expert id; the first ``num_out_tokens`` of them
are kept. Router: TE's ``fused_topk_with_score_function`` as in its PyTorch reference
(``tests/pytorch/test_fused_router.py``); the routing map is a bool [T, E] (BYTEMAP) or uint8
[T, ceil(E/8)] bitmap (expert e in byte e//8, bit e%8), or dense indices written into
``topk_indices``. The ``intermediate_output`` tex returns is the fp32 logits (an opaque buffer
to TE's Python, handed back to the backward, which differentiates the same function with the
selection fixed by the routing map).
"""
from __future__ import annotations

import torch

from ._common import as_float, as_int, check_same_device, check_tensor, nargs_error
from ._dispatch import call
from ._enums import NVTERoutingMapFormat, to_torch_dtype
from ._refs import reference

__all__ = ["moe_permute_fwd", "moe_permute_bwd", "moe_unpermute_fwd", "moe_unpermute_bwd",
           "fused_topk_with_score_function_fwd", "fused_topk_with_score_function_bwd",
           "fused_score_for_moe_aux_loss_fwd", "fused_score_for_moe_aux_loss_bwd",
           "fused_moe_aux_loss_fwd", "fused_moe_aux_loss_fwd_graph_safe", "fused_moe_aux_loss_bwd"]

_SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")
_INT_DTYPES = (torch.int32, torch.int64)


def _check_2d(op, name, t, *, dtypes=None, float_only=False):
    check_tensor(op, name, t, float_only=float_only)
    if t.dim() != 2:
        raise ValueError(f"tex.{op}: {name} must be 2-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"tex.{op}: {name} has dtype {t.dtype}; expected one of {sorted(map(str, dtypes))}")


def _check_dtype_arg(op, dtype, t):
    want = to_torch_dtype(dtype, None, what="dtype")
    if want is not None and want != t.dtype:
        raise ValueError(f"tex.{op}: dtype={dtype!r} does not match the input's {t.dtype}")


def _check_row_id_map(op, row_id_map, n):
    check_tensor(op, "row_id_map", row_id_map)
    if row_id_map.dtype not in _INT_DTYPES or row_id_map.dim() != 1:
        raise TypeError(f"tex.{op}: row_id_map must be a 1-D int32 tensor, got {row_id_map.dtype} "
                        f"{tuple(row_id_map.shape)}")
    if row_id_map.numel() != n:
        raise ValueError(f"tex.{op}: row_id_map has {row_id_map.numel()} elements, expected num_tokens*topK = {n}")


def _check_prob(op, prob, n, topk):
    check_tensor(op, "prob", prob)
    if prob.numel() and (prob.dtype != torch.float32 or tuple(prob.shape) != (n, topk)):
        raise ValueError(f"tex.{op}: prob must be float32 ({n}, {topk}) or empty, got {prob.dtype} "
                         f"{tuple(prob.shape)}")


# ---------------------------------------------------------------- permutation


def moe_permute_fwd(*args):
    """``moe_permute_fwd(input [N, C], dtype, indices [N, topK] int32, num_out_tokens, workspace,
    max_expanded_token_num)`` → ``(permuted [num_out_tokens or N·topK, C], row_id_map [N·topK] int32,
    workspace)``."""
    op = "moe_permute_fwd"
    if len(args) != 6:
        raise nargs_error(op, "6 (input, dtype, indices, num_out_tokens, workspace, max_expanded_token_num)",
                          len(args))
    x, dtype, indices, num_out, workspace, max_exp = args
    _check_2d(op, "input", x, float_only=True)
    _check_dtype_arg(op, dtype, x)
    _check_2d(op, "indices", indices, dtypes=_INT_DTYPES)
    check_same_device(op, input=x, indices=indices)
    if indices.shape[0] != x.shape[0]:
        raise ValueError(f"tex.{op}: indices has {indices.shape[0]} rows, input {x.shape[0]}")
    num_out = as_int(op, "num_out_tokens", num_out)
    if num_out > x.shape[0] * indices.shape[1]:
        raise ValueError(f"tex.{op}: num_out_tokens={num_out} exceeds N*topK = {x.shape[0] * indices.shape[1]}")
    if not isinstance(workspace, (list, tuple)):
        raise TypeError(f"tex.{op}: workspace must be a list of tensors, got {type(workspace).__name__}")
    return tuple(call(op, (x, None, indices, num_out, list(workspace), as_int(op, "max_expanded_token_num", max_exp))))


def _unpermute_args(op, args):
    if len(args) != 6:
        raise nargs_error(op, "6 (input, dtype, row_id_map, prob, num_tokens, topK)", len(args))
    x, dtype, row_id_map, prob, num_tokens, topk = args
    _check_2d(op, "input", x, float_only=True)
    _check_dtype_arg(op, dtype, x)
    num_tokens, topk = as_int(op, "num_tokens", num_tokens), as_int(op, "topK", topk)
    if num_tokens < 0 or topk < 1:
        raise ValueError(f"tex.{op}: num_tokens={num_tokens} must be >= 0 and topK={topk} >= 1")
    _check_row_id_map(op, row_id_map, num_tokens * topk)
    _check_prob(op, prob, num_tokens, topk)
    check_same_device(op, input=x, row_id_map=row_id_map, prob=prob if prob.numel() else None)
    return (x, None, row_id_map, prob, num_tokens, topk)


def moe_unpermute_fwd(*args):
    """``moe_unpermute_fwd(input [M, C], dtype, row_id_map, prob [N, topK] float32 or empty, num_tokens,
    topK)`` → ``[N, C]``: each token's rows summed, weighted by ``prob`` when given (fp32 math)."""
    return call("moe_unpermute_fwd", _unpermute_args("moe_unpermute_fwd", args))


def moe_permute_bwd(*args):
    """The backward of :func:`moe_permute_fwd` (the same gather-and-sum as :func:`moe_unpermute_fwd`)."""
    return call("moe_permute_bwd", _unpermute_args("moe_permute_bwd", args))


def moe_unpermute_bwd(*args):
    """``moe_unpermute_bwd(input_bwd [N, C], input_fwd [M, C], dtype, row_id_map, prob)`` →
    ``(act_grad [M, C], prob_grad [N, topK] float32)``."""
    op = "moe_unpermute_bwd"
    if len(args) != 5:
        raise nargs_error(op, "5 (input_bwd, input_fwd, dtype, row_id_map, prob)", len(args))
    gy, x, dtype, row_id_map, prob = args
    _check_2d(op, "input_bwd", gy, float_only=True)
    _check_2d(op, "input_fwd", x, float_only=True)
    _check_dtype_arg(op, dtype, gy)
    if gy.shape[1] != x.shape[1]:
        raise ValueError(f"tex.{op}: input_bwd has {gy.shape[1]} columns, input_fwd {x.shape[1]}")
    check_tensor(op, "prob", prob)
    topk = prob.shape[1] if prob.numel() and prob.dim() == 2 else 1
    n = prob.shape[0] if prob.numel() and prob.dim() == 2 else row_id_map.numel()
    _check_prob(op, prob, n, topk)
    _check_row_id_map(op, row_id_map, n * topk)
    if gy.shape[0] != n:
        raise ValueError(f"tex.{op}: input_bwd has {gy.shape[0]} rows, expected num_tokens = {n}")
    check_same_device(op, input_bwd=gy, input_fwd=x, row_id_map=row_id_map)
    return tuple(call(op, (gy, x, None, row_id_map, prob)))


@reference("moe_permute_fwd")
def ref_moe_permute_fwd(input, dtype, indices, num_out_tokens, workspace, max_expanded_token_num):
    n, topk = indices.shape
    total = n * topk
    num_out = num_out_tokens if num_out_tokens > 0 else total
    flat = indices.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices           # position idx → flattened (token, choice)
    row_id_map = torch.empty(total, dtype=torch.int32, device=input.device)
    slot = torch.arange(total, device=input.device)
    dest = torch.where(slot < num_out, slot, torch.full_like(slot, -1)).to(torch.int32)
    src_token, src_k = order // topk, order % topk
    row_id_map[src_k * n + src_token] = dest
    out = input.new_empty((num_out, input.shape[1]))
    keep = order[:num_out]
    out.copy_(input[keep // topk])
    return [out, row_id_map, workspace]


def _gather_sum(input, row_id_map, prob, num_tokens, topk):
    rows = row_id_map.long().reshape(topk, num_tokens)       # [k, t]
    valid = rows >= 0
    x = input.float()[rows.clamp_min(0)]                     # [k, t, C]
    w = valid.float()
    if prob.numel():
        w = w * prob.float().t()
    return (x * w.unsqueeze(-1)).sum(0)


@reference("moe_unpermute_fwd")
def ref_moe_unpermute_fwd(input, dtype, row_id_map, prob, num_tokens, topK):
    return _gather_sum(input, row_id_map, prob, num_tokens, topK).to(input.dtype)


@reference("moe_permute_bwd")
def ref_moe_permute_bwd(input, dtype, row_id_map, prob, num_tokens, topK):
    return _gather_sum(input, row_id_map, prob, num_tokens, topK).to(input.dtype)


@reference("moe_unpermute_bwd")
def ref_moe_unpermute_bwd(input_bwd, input_fwd, dtype, row_id_map, prob):
    has_prob = prob.numel() > 0
    topk = prob.shape[1] if has_prob else 1
    n = prob.shape[0] if has_prob else row_id_map.numel()
    rows = row_id_map.long().reshape(topk, n)
    g = input_bwd.float()
    act_grad = torch.zeros(input_fwd.shape, dtype=torch.float32, device=input_bwd.device)
    prob_grad = torch.zeros((n, topk), dtype=torch.float32, device=input_bwd.device)
    for k in range(topk):
        valid = rows[k] >= 0
        r = rows[k][valid]
        gk = g[valid]
        act_grad[r] = gk * prob[valid, k].float().unsqueeze(-1) if has_prob else gk
        if has_prob:
            prob_grad[valid, k] = (gk * input_fwd[r].float()).sum(-1)
    return [act_grad.to(input_bwd.dtype), prob_grad]


# ---------------------------------------------------------------- router


def _score_function(op, sf):
    if sf not in _SCORE_FUNCTIONS:
        raise ValueError(f"tex.{op}: score_function={sf!r}; valid: {list(_SCORE_FUNCTIONS)}")
    return sf


def _map_format(op, fmt):
    try:
        return NVTERoutingMapFormat(int(fmt))
    except (TypeError, ValueError):
        raise ValueError(f"tex.{op}: routing_map_format={fmt!r}; valid: "
                         f"{[(m.name, int(m)) for m in NVTERoutingMapFormat]}") from None


def _opt_float(op, name, v):
    return None if v is None else as_float(op, name, v)


def fused_topk_with_score_function_fwd(logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
                                       score_function, expert_bias, routing_map_format=0, topk_indices=None):
    """Top-k routing → ``(probs [T, E] logits' dtype, routing_map, intermediate_output)``.

    ``probs`` holds the routing weights of the chosen experts (0 elsewhere): softmax over the
    top-k logits (or top-k of the softmax with ``use_pre_softmax``), or sigmoid/sqrt-softplus
    scores normalised over the top k (k > 1); ``expert_bias`` shifts the choice only;
    ``num_groups``/``group_topk`` restrict it to the best groups; times ``scaling_factor``.
    With ``topk_indices`` ([T, topk] int), the chosen expert ids are written there and it is
    the routing output."""
    op = "fused_topk_with_score_function_fwd"
    _check_2d(op, "logits", logits, float_only=True)
    t, e = logits.shape
    topk = as_int(op, "topk", topk)
    if not 1 <= topk <= e:
        raise ValueError(f"tex.{op}: topk={topk} must be in [1, num_experts={e}]")
    sf = _score_function(op, score_function)
    num_groups = None if num_groups is None else as_int(op, "num_groups", num_groups)
    group_topk = None if group_topk is None else as_int(op, "group_topk", group_topk)
    if group_topk:
        if not num_groups or e % num_groups or not 1 <= group_topk <= num_groups or topk % group_topk:
            raise ValueError(f"tex.{op}: num_groups={num_groups}, group_topk={group_topk} must divide "
                             f"num_experts={e} and topk={topk} (group_topk <= num_groups)")
    if expert_bias is not None:
        check_tensor(op, "expert_bias", expert_bias, float_only=True)
        if expert_bias.numel() != e:
            raise ValueError(f"tex.{op}: expert_bias has {expert_bias.numel()} elements, expected {e}")
        if sf == "softmax":
            raise ValueError(f"tex.{op}: expert_bias needs score_function sigmoid or sqrtsoftplus")
    fmt = _map_format(op, routing_map_format)
    if topk_indices is not None:
        _check_2d(op, "topk_indices", topk_indices, dtypes=(torch.int16, torch.int32, torch.int64))
        if tuple(topk_indices.shape) != (t, topk):
            raise ValueError(f"tex.{op}: topk_indices has shape {tuple(topk_indices.shape)}, expected {(t, topk)}")
    check_same_device(op, logits=logits, expert_bias=expert_bias, topk_indices=topk_indices)
    return tuple(call(op, (logits, topk, bool(use_pre_softmax), num_groups, group_topk,
                           _opt_float(op, "scaling_factor", scaling_factor), sf, expert_bias, int(fmt),
                           topk_indices)))


def fused_topk_with_score_function_bwd(routing_map, intermediate_output, grad_probs, grad_logits, topk,
                                       use_pre_softmax, scaling_factor, score_function, use_dense_indices=False,
                                       routing_map_format=0):
    """Backward of the router: writes d(loss)/d(logits) into ``grad_logits`` (returns None)."""
    op = "fused_topk_with_score_function_bwd"
    _check_2d(op, "intermediate_output", intermediate_output, dtypes=(torch.float32,))
    _check_2d(op, "grad_probs", grad_probs, float_only=True)
    _check_2d(op, "grad_logits", grad_logits, float_only=True)
    shape = tuple(intermediate_output.shape)
    for name, x in (("grad_probs", grad_probs), ("grad_logits", grad_logits)):
        if tuple(x.shape) != shape:
            raise ValueError(f"tex.{op}: {name} has shape {tuple(x.shape)}, expected {shape}")
    check_tensor(op, "routing_map", routing_map)
    check_same_device(op, routing_map=routing_map, intermediate_output=intermediate_output, grad_probs=grad_probs,
                      grad_logits=grad_logits)
    fmt = _map_format(op, routing_map_format)
    args = (routing_map, intermediate_output, grad_probs, grad_logits, as_int(op, "topk", topk),
            bool(use_pre_softmax), _opt_float(op, "scaling_factor", scaling_factor),
            _score_function(op, score_function),
            bool(use_dense_indices), int(fmt))
    with torch.no_grad():
        call(op, args)


def fused_score_for_moe_aux_loss_fwd(logits, topk, score_function, routing_map_format=0):
    """Scores for the aux loss → ``(scores [T, E] float32, routing_map, intermediate_output)``: softmax, or
    sigmoid / sqrt-softplus normalised over all experts; the map marks each token's top k."""
    op = "fused_score_for_moe_aux_loss_fwd"
    _check_2d(op, "logits", logits, float_only=True)
    topk = as_int(op, "topk", topk)
    if not 1 <= topk <= logits.shape[1]:
        raise ValueError(f"tex.{op}: topk={topk} must be in [1, num_experts={logits.shape[1]}]")
    fmt = _map_format(op, routing_map_format)
    return tuple(call(op, (logits, topk, _score_function(op, score_function), int(fmt))))


def fused_score_for_moe_aux_loss_bwd(intermediate_output, grad_scores, grad_logits, topk, score_function):
    """Backward of :func:`fused_score_for_moe_aux_loss_fwd`: writes into ``grad_logits`` (returns None)."""
    op = "fused_score_for_moe_aux_loss_bwd"
    _check_2d(op, "intermediate_output", intermediate_output, dtypes=(torch.float32,))
    _check_2d(op, "grad_scores", grad_scores, float_only=True)
    _check_2d(op, "grad_logits", grad_logits, float_only=True)
    for name, x in (("grad_scores", grad_scores), ("grad_logits", grad_logits)):
        if x.shape != intermediate_output.shape:
            raise ValueError(f"tex.{op}: {name} has shape {tuple(x.shape)}, expected "
                             f"{tuple(intermediate_output.shape)}")
    check_same_device(op, intermediate_output=intermediate_output, grad_scores=grad_scores, grad_logits=grad_logits)
    with torch.no_grad():
        call(op, (intermediate_output, grad_scores, grad_logits, as_int(op, "topk", topk),
                  _score_function(op, score_function)))


def _aux_args(op, probs, tokens_per_expert, num_experts, num_rows, num_cols, topk, coeff):
    _check_2d(op, "probs", probs, float_only=True)
    check_tensor(op, "tokens_per_expert", tokens_per_expert)
    num_rows, num_cols = as_int(op, "num_rows", num_rows), as_int(op, "num_cols", num_cols)
    if tuple(probs.shape) != (num_rows, num_cols):
        raise ValueError(f"tex.{op}: probs has shape {tuple(probs.shape)}, expected (num_rows, num_cols) = "
                         f"{(num_rows, num_cols)}")
    if tokens_per_expert.numel() != num_cols:
        raise ValueError(f"tex.{op}: tokens_per_expert has {tokens_per_expert.numel()} elements, expected "
                         f"num_cols = {num_cols}")
    check_same_device(op, probs=probs, tokens_per_expert=tokens_per_expert)
    topk = as_int(op, "topk", topk)
    if topk < 1:
        raise ValueError(f"tex.{op}: topk={topk} must be >= 1")
    return as_int(op, "num_experts", num_experts), num_rows, num_cols, topk, as_float(op, "coeff", coeff)


def fused_moe_aux_loss_fwd(probs, tokens_per_expert, total_num_tokens, num_experts, num_rows, num_cols, topk,
                           coeff):
    """Load-balancing loss → ``(aux_loss (0-d, probs' dtype), Const_buf float32 [2])``:
    ``C · Σ_e (Σ_t probs[t, e]) · tokens_per_expert[e]``, ``C = E·coeff / (topk · total²)``;
    ``Const_buf = [C, loss in fp32]``."""
    op = "fused_moe_aux_loss_fwd"
    rest = _aux_args(op, probs, tokens_per_expert, num_experts, num_rows, num_cols, topk, coeff)
    total = as_int(op, "total_num_tokens", total_num_tokens)
    if total < 1:
        raise ValueError(f"tex.{op}: total_num_tokens={total} must be >= 1")
    return tuple(call(op, (probs, tokens_per_expert, total) + rest))


def fused_moe_aux_loss_fwd_graph_safe(probs, tokens_per_expert, total_num_tokens, num_experts, num_rows, num_cols,
                                      topk, coeff):
    """:func:`fused_moe_aux_loss_fwd` with ``total_num_tokens`` a one-element int tensor (CUDA-graph safe)."""
    op = "fused_moe_aux_loss_fwd_graph_safe"
    rest = _aux_args(op, probs, tokens_per_expert, num_experts, num_rows, num_cols, topk, coeff)
    check_tensor(op, "total_num_tokens", total_num_tokens)
    if total_num_tokens.numel() != 1 or total_num_tokens.dtype not in _INT_DTYPES:
        raise TypeError(f"tex.{op}: total_num_tokens must be a one-element int tensor, got "
                        f"{total_num_tokens.dtype} {tuple(total_num_tokens.shape)}")
    return tuple(call("fused_moe_aux_loss_fwd", (probs, tokens_per_expert, total_num_tokens) + rest))


def fused_moe_aux_loss_bwd(Const_buf, tokens_per_expert, num_rows, num_cols, grad_aux_loss):
    """``grad_probs[t, e] = Const_buf[0] · tokens_per_expert[e] · grad_aux_loss`` → [num_rows, num_cols]."""
    op = "fused_moe_aux_loss_bwd"
    check_tensor(op, "Const_buf", Const_buf)
    check_tensor(op, "tokens_per_expert", tokens_per_expert)
    check_tensor(op, "grad_aux_loss", grad_aux_loss, float_only=True)
    if Const_buf.dtype != torch.float32 or Const_buf.numel() < 1:
        raise TypeError(f"tex.{op}: Const_buf must be the float32 buffer fused_moe_aux_loss_fwd returned")
    if grad_aux_loss.numel() != 1:
        raise ValueError(f"tex.{op}: grad_aux_loss must have one element, got shape {tuple(grad_aux_loss.shape)}")
    num_rows, num_cols = as_int(op, "num_rows", num_rows), as_int(op, "num_cols", num_cols)
    if tokens_per_expert.numel() != num_cols:
        raise ValueError(f"tex.{op}: tokens_per_expert has {tokens_per_expert.numel()} elements, expected {num_cols}")
    check_same_device(op, Const_buf=Const_buf, tokens_per_expert=tokens_per_expert, grad_aux_loss=grad_aux_loss)
    return call(op, (Const_buf, tokens_per_expert, num_rows, num_cols, grad_aux_loss))


def _scores(logits32, score_function):
    if score_function == "softmax":
        return torch.softmax(logits32, -1)
    if score_function == "sigmoid":
        return torch.sigmoid(logits32)
    return torch.nn.functional.softplus(logits32).sqrt()


def _group_limited_topk(scores, topk, num_groups, group_topk):
    t, e = scores.shape
    group_scores = scores.view(t, num_groups, -1).topk(topk // group_topk, dim=-1)[0].sum(-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(t, num_groups, e // num_groups).reshape(t, -1)
    return torch.topk(scores.masked_fill(~score_mask.bool(), float("-inf")), k=topk, dim=-1)[1]


def _select(scores, topk, num_groups, group_topk):
    if group_topk:
        return _group_limited_topk(scores, topk, num_groups, group_topk)
    return torch.topk(scores, k=topk, dim=-1)[1]


def _probs_given_selection(logits32, mask, topk, use_pre_softmax, scaling_factor, score_function):
    """probs [T, E] (0 off the selection) as a differentiable function of the logits."""
    if score_function == "softmax":
        if use_pre_softmax:
            p = torch.softmax(logits32, -1) * mask
        else:
            p = torch.softmax(logits32.masked_fill(~mask, float("-inf")), -1)
            p = torch.where(mask, p, torch.zeros_like(p))
    else:
        s = _scores(logits32, score_function) * mask
        p = s / (s.sum(-1, keepdim=True) + 1e-20) if topk > 1 else s
    if scaling_factor:
        p = p * scaling_factor
    return p


def _pack_bitmap(mask):
    t, e = mask.shape
    nb = (e + 7) // 8
    padded = torch.zeros((t, nb * 8), dtype=torch.int32, device=mask.device)
    padded[:, :e] = mask.to(torch.int32)
    weights = (1 << torch.arange(8, device=mask.device, dtype=torch.int32))
    return (padded.view(t, nb, 8) * weights).sum(-1).to(torch.uint8)


def _unpack_bitmap(bits, e):
    b = bits.to(torch.int32).unsqueeze(-1) >> torch.arange(8, device=bits.device, dtype=torch.int32)
    return (b & 1).bool().reshape(bits.shape[0], -1)[:, :e]


def _mask_output(mask, fmt):
    return _pack_bitmap(mask) if fmt == NVTERoutingMapFormat.BITMAP_U8 else mask


@reference("fused_topk_with_score_function_fwd")
def ref_fused_topk_with_score_function_fwd(logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
                                           score_function, expert_bias, routing_map_format, topk_indices):
    x = logits.float()
    if score_function == "softmax":
        idx = _select(torch.softmax(x, -1) if use_pre_softmax else x, topk, num_groups, group_topk)
    else:
        s = _scores(x, score_function)
        idx = _select(s + expert_bias.float() if expert_bias is not None else s, topk, num_groups, group_topk)
    mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter_(1, idx, True)
    probs = _probs_given_selection(x, mask, topk, use_pre_softmax, scaling_factor, score_function).to(logits.dtype)
    if topk_indices is not None:
        topk_indices.copy_(idx)
        routing = topk_indices
    else:
        routing = _mask_output(mask, routing_map_format)
    return [probs, routing, x.clone()]


@reference("fused_topk_with_score_function_bwd")
def ref_fused_topk_with_score_function_bwd(routing_map, intermediate_output, grad_probs, grad_logits, topk,
                                           use_pre_softmax, scaling_factor, score_function, use_dense_indices,
                                           routing_map_format):
    t, e = intermediate_output.shape
    if use_dense_indices:
        mask = torch.zeros((t, e), dtype=torch.bool, device=grad_probs.device).scatter_(1, routing_map.long(), True)
    elif routing_map_format == NVTERoutingMapFormat.BITMAP_U8:
        mask = _unpack_bitmap(routing_map, e)
    else:
        mask = routing_map.bool()
    with torch.enable_grad():
        x = intermediate_output.detach().float().requires_grad_(True)
        p = _probs_given_selection(x, mask, topk, use_pre_softmax, scaling_factor, score_function)
        (g,) = torch.autograd.grad(p, x, grad_probs.float())
    grad_logits.copy_(g)


def _aux_scores(x, score_function):
    s = _scores(x, score_function)
    return s if score_function == "softmax" else s / (s.sum(-1, keepdim=True) + 1e-20)


@reference("fused_score_for_moe_aux_loss_fwd")
def ref_fused_score_for_moe_aux_loss_fwd(logits, topk, score_function, routing_map_format):
    x = logits.float()
    scores = _aux_scores(x, score_function)
    idx = torch.topk(scores, k=topk, dim=-1)[1]
    mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter_(1, idx, True)
    return [scores, _mask_output(mask, routing_map_format), x.clone()]


@reference("fused_score_for_moe_aux_loss_bwd")
def ref_fused_score_for_moe_aux_loss_bwd(intermediate_output, grad_scores, grad_logits, topk, score_function):
    with torch.enable_grad():
        x = intermediate_output.detach().float().requires_grad_(True)
        (g,) = torch.autograd.grad(_aux_scores(x, score_function), x, grad_scores.float())
    grad_logits.copy_(g)


@reference("fused_moe_aux_loss_fwd")
def ref_fused_moe_aux_loss_fwd(probs, tokens_per_expert, total_num_tokens, num_experts, num_rows, num_cols, topk,
                               coeff):
    total = total_num_tokens.to(torch.float64).reshape(()) if isinstance(total_num_tokens, torch.Tensor) else \
        float(total_num_tokens)
    c = torch.as_tensor(num_experts * coeff / topk, dtype=torch.float64, device=probs.device) / total / total
    c = c.float()
    loss = (probs.float().sum(0) * tokens_per_expert.float()).sum() * c
    return [loss.to(probs.dtype).reshape(()), torch.stack([c, loss]).reshape(2)]


@reference("fused_moe_aux_loss_bwd")
def ref_fused_moe_aux_loss_bwd(Const_buf, tokens_per_expert, num_rows, num_cols, grad_aux_loss):
    g = Const_buf.reshape(-1)[0] * tokens_per_expert.float() * grad_aux_loss.float().reshape(())
    return g.reshape(1, num_cols).expand(num_rows, num_cols).to(grad_aux_loss.dtype).contiguous()
