"""multi_tensor_* (apex/TE fused optimizer kernels): ``(chunk_size, noop_flag, tensor_lists, *args)``."""
from __future__ import annotations

import torch

from ._common import as_float, as_int, check_tensor, nargs_error
from ._dispatch import call
from ._refs import reference

__all__ = ["multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm", "multi_tensor_adam",
           "multi_tensor_sgd"]


def _check_lists(op, noop_flag, lists, allowed_counts, names):
    check_tensor(op, "noop_flag", noop_flag)
    if noop_flag.numel() < 1:
        raise ValueError(f"tex.{op}: noop_flag must have at least one element")
    if not isinstance(lists, (list, tuple)) or len(lists) not in allowed_counts:
        got = len(lists) if isinstance(lists, (list, tuple)) else type(lists).__name__
        raise ValueError(f"tex.{op}: tensor_lists must be a list of {' or '.join(map(str, allowed_counts))} "
                         f"lists ({names}), got {got}")
    n = len(lists[0])
    dev = noop_flag.device
    for li, lst in enumerate(lists):
        if len(lst) != n:
            raise ValueError(f"tex.{op}: tensor_lists[{li}] has {len(lst)} tensors, tensor_lists[0] has {n}")
        for ti, t in enumerate(lst):
            check_tensor(op, f"tensor_lists[{li}][{ti}]", t)
            if t.device != dev:
                raise ValueError(f"tex.{op}: tensor_lists[{li}][{ti}] is on {t.device} but noop_flag is on {dev}; "
                                 f"all tensors must be on one device")
            if li and t.numel() != lists[0][ti].numel():
                raise ValueError(f"tex.{op}: tensor_lists[{li}][{ti}] has shape {tuple(t.shape)}, "
                                 f"tensor_lists[0][{ti}] has {tuple(lists[0][ti].shape)}")
    return [list(lst) for lst in lists]


def multi_tensor_scale(*args):
    """``multi_tensor_scale(chunk_size, noop_flag, [inputs, outputs], scale)``: out = in·scale;
    noop_flag[0] = 1 if an input is not finite."""
    if len(args) != 4:
        raise nargs_error("multi_tensor_scale", "4 (chunk_size, noop_flag, tensor_lists, scale)", len(args))
    chunk, noop, lists, scale = args
    lists = _check_lists("multi_tensor_scale", noop, lists, (2,), "inputs, outputs")
    return call("multi_tensor_scale", (as_int("multi_tensor_scale", "chunk_size", chunk), noop, lists,
                                       as_float("multi_tensor_scale", "scale", scale)))


def multi_tensor_l2norm(*args):
    """``multi_tensor_l2norm(chunk_size, noop_flag, [tensors], per_tensor=False)`` → ``(norm[1], per_tensor)``."""
    if len(args) not in (3, 4):
        raise nargs_error("multi_tensor_l2norm", "3 or 4 (chunk_size, noop_flag, tensor_lists[, per_tensor])",
                          len(args))
    chunk, noop, lists = args[:3]
    per_tensor = bool(args[3]) if len(args) == 4 and args[3] is not None else False
    lists = _check_lists("multi_tensor_l2norm", noop, lists, (1,), "tensors")
    return call("multi_tensor_l2norm", (int(chunk), noop, lists, per_tensor))


def multi_tensor_unscale_l2norm(*args):
    """``multi_tensor_unscale_l2norm(chunk_size, noop_flag, [tensors], inv_scale, per_tensor)``."""
    if len(args) not in (4, 5):
        raise nargs_error("multi_tensor_unscale_l2norm",
                          "5 (chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor)", len(args))
    chunk, noop, lists, inv_scale = args[:4]
    per_tensor = bool(args[4]) if len(args) == 5 and args[4] is not None else False
    lists = _check_lists("multi_tensor_unscale_l2norm", noop, lists, (1,), "tensors")
    if not isinstance(inv_scale, torch.Tensor):
        inv_scale = torch.tensor([float(inv_scale)], dtype=torch.float32, device=noop.device)
    return call("multi_tensor_unscale_l2norm", (int(chunk), noop, lists, inv_scale, per_tensor))


def multi_tensor_adam(*args):
    """``multi_tensor_adam(chunk_size, noop_flag, [grads, params, exp_avg, exp_avg_sq(, master)], lr, beta1,
    beta2, eps, step, mode, bias_correction, weight_decay)``; mode 0 = L2, 1 = AdamW."""
    op = "multi_tensor_adam"
    if len(args) != 11:
        raise nargs_error(op, "11 (chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, "
                          "bias_correction, weight_decay)", len(args))
    chunk, noop, lists, lr, b1, b2, eps, step, mode, bc, wd = args
    lists = _check_lists(op, noop, lists, (4, 5), "grads, params, exp_avg, exp_avg_sq[, master_params]")
    mode = as_int(op, "mode", mode)
    if mode not in (0, 1):
        raise ValueError(f"tex.{op}: mode={mode!r}; valid: 0 (L2 regularisation), 1 (AdamW)")
    if len(lists) == 5:
        for i, t in enumerate(lists[4]):
            if t.dtype != torch.float32:
                raise ValueError(f"tex.{op}: master_params[{i}] must be float32, got {t.dtype}")
    f = [as_float(op, n, v) for n, v in (("lr", lr), ("beta1", b1), ("beta2", b2), ("eps", eps), ("weight_decay", wd))]
    return call(op, (as_int(op, "chunk_size", chunk), noop, lists, f[0], f[1], f[2], f[3], as_int(op, "step", step),
                     as_int(op, "mode", mode), as_int(op, "bias_correction", bc), f[4]))


def multi_tensor_sgd(*args):
    """``multi_tensor_sgd(chunk_size, noop_flag, [grads, params, momentum_bufs(, fp16 copy)], wd, momentum,
    dampening, lr, nesterov, first_run, wd_after_momentum, scale)``; skipped when noop_flag is set."""
    op = "multi_tensor_sgd"
    if len(args) != 11:
        raise nargs_error(op, "11 (chunk_size, noop_flag, tensor_lists, wd, momentum, dampening, lr, nesterov, "
                          "first_run, wd_after_momentum, scale)", len(args))
    chunk, noop, lists, wd, momentum, dampening, lr, nesterov, first_run, wd_after, scale = args
    lists = _check_lists(op, noop, lists, (3, 4), "grads, params, momentum_bufs[, model_copies]")
    f = [as_float(op, n, v) for n, v in (("wd", wd), ("momentum", momentum), ("dampening", dampening), ("lr", lr),
                                         ("scale", scale))]
    return call(op, (as_int(op, "chunk_size", chunk), noop, lists, f[0], f[1], f[2], f[3], bool(nesterov),
                     bool(first_run), bool(wd_after), f[4]))


# ---------------------------------------------------------------- reference.torch


def _any_nonfinite(tensors) -> bool:
    tensors = [t for t in tensors if t.numel()]
    if not tensors:
        return False
    amax = torch._foreach_norm(tensors, float("inf"))  # inf/nan survive a max-abs reduction
    return not bool(torch.isfinite(torch.stack([a.float() for a in amax])).all())


@reference("multi_tensor_scale")
def ref_multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    ins, outs = tensor_lists
    for i, o in zip(ins, outs):
        o.copy_(i.float() * scale)
    if _any_nonfinite(ins):
        noop_flag.fill_(1)


def _l2(chunk_size, noop_flag, tensors, per_tensor, inv_scale=None):
    dev = noop_flag.device
    norms = [t.float().square().sum() for t in tensors]
    per = torch.stack(norms) if norms else torch.zeros(0, dtype=torch.float32, device=dev)
    if inv_scale is not None:
        per = per * inv_scale.float().reshape(-1)[0].square()
    total = per.sum().sqrt().reshape(1)
    per = per.sqrt()
    if not bool(torch.isfinite(total).all()):
        noop_flag.fill_(1)
    return total, (per if per_tensor else torch.zeros(0, dtype=torch.float32, device=dev))


@reference("multi_tensor_l2norm")
def ref_multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False):
    return _l2(chunk_size, noop_flag, tensor_lists[0], per_tensor)


@reference("multi_tensor_unscale_l2norm")
def ref_multi_tensor_unscale_l2norm(chunk_size, noop_flag, tensor_lists, inv_scale, per_tensor=False):
    return _l2(chunk_size, noop_flag, tensor_lists[0], per_tensor, inv_scale)


@reference("multi_tensor_adam")
def ref_multi_tensor_adam(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode,
                          bias_correction, weight_decay):
    # Like upstream (apex), Adam does not skip on noop_flag: infs/nans propagate.
    bc1 = 1.0 - beta1 ** step if bias_correction == 1 else 1.0
    bc2 = 1.0 - beta2 ** step if bias_correction == 1 else 1.0
    grads, params, ms, vs = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) == 5 else None
    for i in range(len(grads)):
        g = grads[i].float()
        pt = masters[i] if masters is not None else params[i]
        p = pt.float()
        if mode == 0 and weight_decay != 0.0:
            g = g + weight_decay * p
        m = ms[i].float() * beta1 + (1.0 - beta1) * g
        v = vs[i].float() * beta2 + (1.0 - beta2) * g * g
        upd = (m / bc1) / ((v / bc2).sqrt() + eps)
        if mode == 1 and weight_decay != 0.0:
            upd = upd + weight_decay * p
        p = p - lr * upd
        ms[i].copy_(m)
        vs[i].copy_(v)
        pt.copy_(p)
        if masters is not None:
            params[i].copy_(p)


@reference("multi_tensor_sgd")
def ref_multi_tensor_sgd(chunk_size, noop_flag, tensor_lists, wd, momentum, dampening, lr, nesterov, first_run,
                         wd_after_momentum, scale):
    if bool(noop_flag.reshape(-1)[0] != 0):
        return
    grads, params, bufs = tensor_lists[:3]
    copies = tensor_lists[3] if len(tensor_lists) == 4 else None
    for i in range(len(grads)):
        p = params[i].float()
        g = grads[i].float() * scale
        if wd != 0.0 and not wd_after_momentum:
            g = g + wd * p
        if momentum != 0.0:
            buf = g if first_run else bufs[i].float() * momentum + (1.0 - dampening) * g
            bufs[i].copy_(buf)
            g = g + momentum * buf if nesterov else buf
        if wd != 0.0 and wd_after_momentum:
            g = g + wd * p
        p = p - lr * g
        params[i].copy_(p)
        if copies is not None:
            copies[i].copy_(p)
