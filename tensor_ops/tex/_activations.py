"""Activations (plain, gated, their derivatives, dbias forms): fp32 math, output in input dtype."""
from __future__ import annotations

import torch

from ._common import as_float, check_quantizer, check_same_device, check_tensor, rows_2d
from ._dispatch import call
from ._refs import reference

_K0 = 0.7978845608028654  # sqrt(2/pi)
_K1 = 0.044715 * _K0      # 0.03567741...

# ---- elementwise math on fp32 tensors (shared with _gemm and the cpp adapters)


def _gelu_tanh(x):
    return x * (0.5 + 0.5 * torch.tanh(x * (_K0 + _K1 * x * x)))


def _gelu_tanh_grad(x):
    t = torch.tanh(x * (_K0 + _K1 * x * x))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (_K0 + 3.0 * _K1 * x * x)


def _silu(x):
    return x * torch.sigmoid(x)


def _silu_grad(x):
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def _qgelu(x):
    return x * torch.sigmoid(1.702 * x)


def _qgelu_grad(x):
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1.0 - s)


def _relu(x):
    return torch.clamp_min(x, 0.0)


def _relu_grad(x):
    return (x > 0).to(x.dtype)


def _srelu(x):
    r = torch.clamp_min(x, 0.0)
    return r * r


def _srelu_grad(x):
    return 2.0 * torch.clamp_min(x, 0.0)


def _sigmoid_grad(x):
    s = torch.sigmoid(x)
    return s * (1.0 - s)


#: name → (act, act') for the plain activations
ACTS = {
    "gelu": (_gelu_tanh, _gelu_tanh_grad),
    "relu": (_relu, _relu_grad),
    "silu": (_silu, _silu_grad),
    "qgelu": (_qgelu, _qgelu_grad),
    "srelu": (_srelu, _srelu_grad),
}
#: gated name → plain activation applied to the first half
GATED = {"geglu": "gelu", "reglu": "relu", "swiglu": "silu", "qgeglu": "qgelu", "sreglu": "srelu", "glu": "sigmoid"}
_ACT_OF = dict(ACTS, sigmoid=(torch.sigmoid, _sigmoid_grad))

PLAIN_OPS = list(ACTS)
GATED_OPS = list(GATED)
DACT_OPS = ["d" + n for n in PLAIN_OPS]
DGATED_OPS = ["d" + n for n in GATED_OPS]
DBIAS_OPS = ["dbias_d" + n for n in PLAIN_OPS]
ACTIVATION_OPS = (PLAIN_OPS + GATED_OPS + DACT_OPS + DGATED_OPS + DBIAS_OPS
                  + ["clamped_swiglu", "clamped_dswiglu", "bgrad_quantize"])


def _check_in(op, input, quantizer, gated=False):
    check_quantizer(op, quantizer)
    check_tensor(op, "input", input, float_only=True)
    if input.dim() == 0:
        raise ValueError(f"tex.{op}: input must have at least 1 dimension")
    if gated and input.shape[-1] % 2:
        raise ValueError(f"tex.{op}: the last dim of input ({input.shape[-1]}) must be even "
                         f"(it holds the two halves a, b)")


def _check_grad(op, grad, fwd_input, quantizer, gated=False):
    _check_in(op, fwd_input, quantizer, gated)
    check_tensor(op, "grad", grad, float_only=True)
    check_same_device(op, grad=grad, fwd_input=fwd_input)
    want = tuple(fwd_input.shape[:-1]) + ((fwd_input.shape[-1] // 2,) if gated else (fwd_input.shape[-1],))
    if tuple(grad.shape) != want:
        raise ValueError(f"tex.{op}: grad has shape {tuple(grad.shape)}, expected {want} for fwd_input "
                         f"{tuple(fwd_input.shape)}")


# ---- references


def _ref_plain(name):
    act = ACTS[name][0]

    def fn(input, quantizer):
        return act(input.float()).to(input.dtype)
    return fn


def _ref_dplain(name):
    grad_fn = ACTS[name][1]

    def fn(grad, fwd_input, quantizer):
        return (grad.float() * grad_fn(fwd_input.float())).to(fwd_input.dtype)
    return fn


def _ref_gated(name):
    act = _ACT_OF[GATED[name]][0]

    def fn(input, quantizer):
        a, b = input.float().chunk(2, dim=-1)
        return (act(a) * b).to(input.dtype)
    return fn


def _ref_dgated(name):
    act, act_grad = _ACT_OF[GATED[name]]

    def fn(grad, fwd_input, quantizer):
        a, b = fwd_input.float().chunk(2, dim=-1)
        g = grad.float()
        return torch.cat([g * b * act_grad(a), g * act(a)], dim=-1).to(fwd_input.dtype)
    return fn


def _ref_dbias(name):
    dfn = _ref_dplain(name)

    def fn(grad, fwd_input, quantizer):
        gi = dfn(grad, fwd_input, None)
        return [rows_2d(gi).sum(0, dtype=torch.float32).to(grad.dtype), gi]
    return fn


def _clamped_parts(x, limit, alpha, off):
    a, b = x.float().chunk(2, dim=-1)
    ac = torch.clamp_max(a, limit)
    s = torch.sigmoid(alpha * ac)
    return a, b, ac, s, torch.clamp(b, -limit, limit) + off


@reference("clamped_swiglu")
def ref_clamped_swiglu(input, quantizer, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    _, _, ac, s, bb = _clamped_parts(input, limit, alpha, glu_linear_offset)
    return (ac * s * bb).to(input.dtype)


@reference("clamped_dswiglu")
def ref_clamped_dswiglu(grad, fwd_input, quantizer, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    a, b, ac, s, bb = _clamped_parts(fwd_input, limit, alpha, glu_linear_offset)
    g = grad.float()
    dact = s * (1.0 + alpha * ac * (1.0 - s))
    da = torch.where(a <= limit, g * bb * dact, torch.zeros_like(a))
    db = torch.where((b >= -limit) & (b <= limit), g * ac * s, torch.zeros_like(b))
    return torch.cat([da, db], dim=-1).to(fwd_input.dtype)


@reference("bgrad_quantize")
def ref_bgrad_quantize(input, quantizer):
    return [rows_2d(input).sum(0, dtype=torch.float32).to(input.dtype), input]


for _n in PLAIN_OPS:
    reference(_n)(_ref_plain(_n))
    reference("d" + _n)(_ref_dplain(_n))
    reference("dbias_d" + _n)(_ref_dbias(_n))
for _n in GATED_OPS:
    reference(_n)(_ref_gated(_n))
    reference("d" + _n)(_ref_dgated(_n))


# ---- public functions (generated: same signature per family, TE keyword names)


def _make_plain(op, gated):
    def fn(input, quantizer=None):
        _check_in(op, input, quantizer, gated)
        return call(op, (input, None))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"tex.{op}(input, quantizer) → tensor ({'last dim halved, ' if gated else ''}input dtype)."
    return fn


def _make_d(op, gated):
    def fn(grad, fwd_input, quantizer=None):
        _check_grad(op, grad, fwd_input, quantizer, gated)
        return call(op, (grad, fwd_input, None))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"tex.{op}(grad, fwd_input, quantizer) → grad_input (shape of fwd_input)."
    return fn


def _make_dbias(op):
    def fn(grad, fwd_input, quantizer=None):
        _check_grad(op, grad, fwd_input, quantizer)
        return call(op, (grad, fwd_input, None))
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"tex.{op}(grad, fwd_input, quantizer) → [grad_bias (sum of grad_input rows), grad_input]."
    return fn


def clamped_swiglu(input, quantizer=None, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    """GPT-OSS clamped SwiGLU: ``min(a,l)·σ(α·min(a,l)) · (clamp(b,-l,l) + offset)``."""
    _check_in("clamped_swiglu", input, quantizer, True)
    op = "clamped_swiglu"
    return call(op, (input, None, as_float(op, "limit", limit), as_float(op, "alpha", alpha),
                     as_float(op, "glu_linear_offset", glu_linear_offset)))


def clamped_dswiglu(grad, fwd_input, quantizer=None, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    """Backward of :func:`clamped_swiglu` → ``cat([d/da, d/db], -1)``."""
    _check_grad("clamped_dswiglu", grad, fwd_input, quantizer, True)
    op = "clamped_dswiglu"
    return call(op, (grad, fwd_input, None, as_float(op, "limit", limit), as_float(op, "alpha", alpha),
                     as_float(op, "glu_linear_offset", glu_linear_offset)))


def bgrad_quantize(input, quantizer=None):
    """``[input.reshape(-1, H).sum(0), input]`` (quantizer=None)."""
    _check_in("bgrad_quantize", input, quantizer)
    return call("bgrad_quantize", (input, None))


_PUBLIC = {}
for _n in PLAIN_OPS:
    _PUBLIC[_n] = _make_plain(_n, False)
    _PUBLIC["d" + _n] = _make_d("d" + _n, False)
    _PUBLIC["dbias_d" + _n] = _make_dbias("dbias_d" + _n)
for _n in GATED_OPS:
    _PUBLIC[_n] = _make_plain(_n, True)
    _PUBLIC["d" + _n] = _make_d("d" + _n, True)
globals().update(_PUBLIC)

__all__ = sorted(_PUBLIC) + ["clamped_swiglu", "clamped_dswiglu", "bgrad_quantize"]
