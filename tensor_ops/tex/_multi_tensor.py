"""multi_tensor_* (apex/TE fused optimizer kernels): ``(chunk_size, noop_flag, tensor_lists, *args)``."""
from __future__ import annotations

import torch

from ._common import as_float, as_int, check_tensor, nargs_error
from ._dispatch import call
from ._refs import reference

__all__ = ["multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm", "multi_tensor_adam",
           "multi_tensor_sgd", "multi_tensor_scale_tensor", "multi_tensor_compute_scale_and_scale_inv",
           "multi_tensor_compute_scale_inv_e8m0", "multi_tensor_adam_capturable",
           "multi_tensor_adam_capturable_master"]


def _call(op, args):
    # The extension updates parameters outside autograd: an in-place update of a leaf that
    # requires grad would otherwise raise (TE's FusedSGD/FusedAdam call these with grad mode on).
    with torch.no_grad():
        return call(op, args)


def _scalar_tensor(op, name, t, dtypes, device):
    check_tensor(op, name, t)
    if t.numel() != 1:
        raise ValueError(f"tex.{op}: {name} must have exactly one element, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"tex.{op}: {name} has dtype {t.dtype}; expected one of {sorted(map(str, dtypes))}")
    if t.device != device:
        raise ValueError(f"tex.{op}: {name} is on {t.device} but noop_flag is on {device}; "
                         f"all tensors must be on one device")


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
    return _call("multi_tensor_scale", (as_int("multi_tensor_scale", "chunk_size", chunk), noop, lists,
                                       as_float("multi_tensor_scale", "scale", scale)))


def multi_tensor_l2norm(*args):
    """``multi_tensor_l2norm(chunk_size, noop_flag, [tensors], per_tensor=False)`` → ``(norm[1], per_tensor)``."""
    if len(args) not in (3, 4):
        raise nargs_error("multi_tensor_l2norm", "3 or 4 (chunk_size, noop_flag, tensor_lists[, per_tensor])",
                          len(args))
    chunk, noop, lists = args[:3]
    per_tensor = bool(args[3]) if len(args) == 4 and args[3] is not None else False
    lists = _check_lists("multi_tensor_l2norm", noop, lists, (1,), "tensors")
    return _call("multi_tensor_l2norm", (int(chunk), noop, lists, per_tensor))


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
    return _call("multi_tensor_unscale_l2norm", (int(chunk), noop, lists, inv_scale, per_tensor))


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
    return _call(op, (as_int(op, "chunk_size", chunk), noop, lists, f[0], f[1], f[2], f[3], as_int(op, "step", step),
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
    return _call(op, (as_int(op, "chunk_size", chunk), noop, lists, f[0], f[1], f[2], f[3], bool(nesterov),
                     bool(first_run), bool(wd_after), f[4]))


def multi_tensor_scale_tensor(*args):
    """``multi_tensor_scale_tensor(chunk_size, noop_flag, [inputs, outputs], scale)``: as
    :func:`multi_tensor_scale` with ``scale`` a one-element float32 tensor (CUDA-graph safe)."""
    op = "multi_tensor_scale_tensor"
    if len(args) != 4:
        raise nargs_error(op, "4 (chunk_size, noop_flag, tensor_lists, scale)", len(args))
    chunk, noop, lists, scale = args
    lists = _check_lists(op, noop, lists, (2,), "inputs, outputs")
    _scalar_tensor(op, "scale", scale, (torch.float32,), noop.device)
    return _call(op, (as_int(op, "chunk_size", chunk), noop, lists, scale))


def multi_tensor_compute_scale_and_scale_inv(*args):
    """``multi_tensor_compute_scale_and_scale_inv(chunk_size, noop_flag, [amaxes, scales, scale_invs], max_fp8,
    force_pow_2_scales, epsilon)``: per element, ``scale = max_fp8 / max(amax, epsilon)`` (1 where amax is
    0, inf or NaN; FLT_MAX where the quotient overflows; the exponent alone with
    ``force_pow_2_scales``), ``scale_inv = 1 / scale``. All float32; noop_flag is not read."""
    op = "multi_tensor_compute_scale_and_scale_inv"
    if len(args) != 6:
        raise nargs_error(op, "6 (chunk_size, noop_flag, tensor_lists, max_fp8, force_pow_2_scales, epsilon)",
                          len(args))
    chunk, noop, lists, max_fp8, pow2, eps = args
    lists = _check_lists(op, noop, lists, (3,), "amaxes, scales, scale_invs")
    for li, name in enumerate(("amaxes", "scales", "scale_invs")):
        for i, t in enumerate(lists[li]):
            if t.dtype != torch.float32:
                raise TypeError(f"tex.{op}: {name}[{i}] has dtype {t.dtype}; expected torch.float32")
    return _call(op, (as_int(op, "chunk_size", chunk), noop, lists, as_float(op, "max_fp8", max_fp8), bool(pow2),
                      as_float(op, "epsilon", eps)))


def multi_tensor_compute_scale_inv_e8m0(*args):
    """``multi_tensor_compute_scale_inv_e8m0(chunk_size, None, [amaxes (bfloat16), scale_invs (uint8)])``: the
    MXFP8 E8M0 scale ``2^ceil(log2(amax / 448))`` as its biased exponent byte (0xFF for NaN, 0xFE for inf)."""
    op = "multi_tensor_compute_scale_inv_e8m0"
    if len(args) != 3:
        raise nargs_error(op, "3 (chunk_size, None, tensor_lists)", len(args))
    chunk, dummy, lists = args
    if dummy is not None:
        raise ValueError(f"tex.{op}: the no-op flag is not supported (pass None), got {type(dummy).__name__}")
    if not isinstance(lists, (list, tuple)) or len(lists) != 2 or len(lists[0]) != len(lists[1]):
        raise ValueError(f"tex.{op}: tensor_lists must be [amaxes, scale_invs] of equal lengths")
    lists = [list(lists[0]), list(lists[1])]
    for i, (a, s) in enumerate(zip(*lists)):
        check_tensor(op, f"tensor_lists[0][{i}]", a)
        check_tensor(op, f"tensor_lists[1][{i}]", s)
        if a.dtype != torch.bfloat16:
            raise TypeError(f"tex.{op}: amaxes[{i}] has dtype {a.dtype}; expected torch.bfloat16")
        if s.dtype != torch.uint8:
            raise TypeError(f"tex.{op}: scale_invs[{i}] has dtype {s.dtype}; expected torch.uint8 (E8M0 bytes)")
        if s.numel() != a.numel() or s.device != a.device:
            raise ValueError(f"tex.{op}: scale_invs[{i}] ({tuple(s.shape)}, {s.device}) must match amaxes[{i}] "
                             f"({tuple(a.shape)}, {a.device})")
    return _call(op, (as_int(op, "chunk_size", chunk), None, lists))


def _adam_capturable(op, args, counts, names):
    if len(args) != 12:
        raise nargs_error(op, "12 (chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, "
                          "bias_correction, weight_decay, inv_scale)", len(args))
    chunk, noop, lists, lr, b1, b2, eps, step, mode, bc, wd, inv_scale = args
    lists = _check_lists(op, noop, lists, counts, names)
    _scalar_tensor(op, "lr", lr, (torch.float32,), noop.device)
    _scalar_tensor(op, "step", step, (torch.int32, torch.int64, torch.float32), noop.device)
    _scalar_tensor(op, "inv_scale", inv_scale, (torch.float32,), noop.device)
    mode = as_int(op, "mode", mode)
    if mode not in (0, 1):
        raise ValueError(f"tex.{op}: mode={mode!r}; valid: 0 (L2 regularisation), 1 (AdamW)")
    if len(lists) == 5:
        for i, t in enumerate(lists[4]):
            if t.dtype != torch.float32:
                raise TypeError(f"tex.{op}: master_params[{i}] must be float32, got {t.dtype}")
    f = [as_float(op, n, v) for n, v in (("beta1", b1), ("beta2", b2), ("eps", eps), ("weight_decay", wd))]
    return _call(op, (as_int(op, "chunk_size", chunk), noop, lists, lr, f[0], f[1], f[2], step, mode,
                      as_int(op, "bias_correction", bc), f[3], inv_scale))


def multi_tensor_adam_capturable(*args):
    """``multi_tensor_adam_capturable(chunk_size, noop_flag, [grads, params, exp_avg, exp_avg_sq], lr, beta1,
    beta2, eps, step, mode, bias_correction, weight_decay, inv_scale)``: Adam with ``lr``, ``step`` and
    ``inv_scale`` one-element tensors (CUDA-graph safe); grads are unscaled in place (``g *= inv_scale``)
    and the whole step is skipped while ``noop_flag`` is set."""
    return _adam_capturable("multi_tensor_adam_capturable", args, (4,), "grads, params, exp_avg, exp_avg_sq")


def multi_tensor_adam_capturable_master(*args):
    """As :func:`multi_tensor_adam_capturable` with a fifth list of float32 master params: the math runs
    on the master, which is written, then params = cast(master)."""
    return _adam_capturable("multi_tensor_adam_capturable_master", args, (5,),
                            "grads, params, exp_avg, exp_avg_sq, master_params")


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
    # Like upstream (apex), Adam does not skip on noop_flag: infs/nans propagate. The math is TE's,
    # in torch.optim.AdamW/Adam(foreach=True)'s op order and scalars (as the cpp kernel,
    # cpp_ext/optim.cpp), so that both stay on torch's trajectory.
    bc1 = 1.0 - beta1 ** step if bias_correction == 1 else 1.0
    bc2 = 1.0 - beta2 ** step if bias_correction == 1 else 1.0
    grads, params, ms, vs = tensor_lists[:4]
    masters = tensor_lists[4] if len(tensor_lists) == 5 else None
    for i in range(len(grads)):
        g = grads[i].float()
        pt = masters[i] if masters is not None else params[i]
        p = pt.float()
        if weight_decay != 0.0:
            if mode == 0:
                g = g.add(p, alpha=weight_decay)
            else:
                p = p * (1.0 - lr * weight_decay)
        m = ms[i].float().lerp(g, 1.0 - beta1)
        v = (vs[i].float() * beta2).addcmul(g, g, value=1.0 - beta2)
        denom = (v.sqrt() / bc2 ** 0.5).add(eps)
        p = p.addcdiv(m, denom, value=-(lr / bc1))
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


@reference("multi_tensor_scale_tensor")
def ref_multi_tensor_scale_tensor(chunk_size, noop_flag, tensor_lists, scale):
    ref_multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale.float().reshape(()))


_FLT_MAX = torch.finfo(torch.float32).max


@reference("multi_tensor_compute_scale_and_scale_inv")
def ref_multi_tensor_compute_scale_and_scale_inv(chunk_size, noop_flag, tensor_lists, max_fp8, force_pow_2_scales,
                                                 epsilon):
    for amax, scale, scale_inv in zip(*tensor_lists):
        a = amax.float()
        a = torch.where(a < epsilon, torch.full_like(a, epsilon), a)   # NaN < eps is false: NaN stays
        s = torch.full_like(a, max_fp8) / a
        s = torch.where(torch.isinf(s), torch.full_like(s, _FLT_MAX), s)
        if force_pow_2_scales:
            s = (s.view(torch.int32) & -8388608).view(torch.float32)     # & 0xFF800000: sign + exponent
        s = torch.where(torch.isinf(a) | (a == 0) | torch.isnan(a), torch.ones_like(s), s)
        scale.copy_(s)
        scale_inv.copy_(torch.reciprocal(s))


_E4M3_MAX_RCP = float(torch.tensor(1.0 / 448.0, dtype=torch.float32))


@reference("multi_tensor_compute_scale_inv_e8m0")
def ref_multi_tensor_compute_scale_inv_e8m0(chunk_size, dummy, tensor_lists):
    for amax, scale_inv in zip(*tensor_lists):
        v = amax.float() * _E4M3_MAX_RCP
        bits = v.view(torch.int32).long() & 0xFFFFFFFF
        exp = (bits >> 23) & 0xFF
        man = bits & 0x7FFFFF
        up = (man > 0) & (exp != 0xFE) & ~((exp == 0) & (man <= 0x400000))   # round the scale up
        e = exp + up.long()
        e = torch.where(v == 0, torch.zeros_like(e), e)
        e = torch.where(torch.isinf(v), torch.full_like(e, 0xFE), e)
        e = torch.where(torch.isnan(v), torch.full_like(e, 0xFF), e)
        scale_inv.copy_(e.to(torch.uint8).reshape(scale_inv.shape))


def _ref_adam_capturable(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, bias_correction,
                         weight_decay, inv_scale):
    if bool(noop_flag.reshape(-1)[0] == 1):
        return
    s = inv_scale.float().reshape(())
    unscaled = [g.float() * s for g in tensor_lists[0]]   # the math uses the fp32 product
    for g, u in zip(tensor_lists[0], unscaled):           # and the kernel writes it back rounded
        g.copy_(u)
    ref_multi_tensor_adam(chunk_size, noop_flag, [unscaled] + list(tensor_lists[1:]), float(lr.reshape(())), beta1,
                          beta2, eps, int(step.reshape(())), mode, bias_correction, weight_decay)


reference("multi_tensor_adam_capturable")(_ref_adam_capturable)
reference("multi_tensor_adam_capturable_master")(_ref_adam_capturable)
