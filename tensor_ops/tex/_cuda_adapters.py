"""default.cuda: tex ops on CUDA tensors through tensor_ops' CUDA backend (zero-copy: the backend
takes torch CUDA tensors as they are and launches on torch's current stream).

Only ops whose TE semantics the facade kernels cover exactly are adapted: gelu (tanh), silu,
relu, swiglu, geglu (tanh) and scaled_softmax_forward. The norms need fp32 mu/rsigma outputs
the CUDA kernels do not write yet, so they stay on reference.torch (which runs on the GPU too).
"""
from __future__ import annotations

import torch

NAME = "cuda"
IMPL_ID = "default.cuda"
_OK = (torch.float32, torch.float16, torch.bfloat16)


def _backend():
    from tensor_ops.backends import cuda
    return cuda


def _on_cuda(t) -> bool:
    return t.device.type == "cuda"


def _sup_act(input, quantizer=None):
    return isinstance(input, torch.Tensor) and _on_cuda(input) and input.dtype in _OK and input.is_contiguous() \
        and input.numel() > 0


def _rows(t):
    return t.reshape(-1, t.shape[-1])


def _unary(name, **kw):
    def fn(input, quantizer):
        out = torch.empty_like(input)
        getattr(_backend(), name)(_rows(input), out=_rows(out), **kw)
        return out
    return fn


def _gated(name, **kw):
    def fn(input, quantizer):
        out = input.new_empty(input.shape[:-1] + (input.shape[-1] // 2,))
        getattr(_backend(), name)(_rows(input), out=_rows(out), **kw)
        return out
    return fn


def _sup_softmax(input, scale):
    return _sup_act(input) and (scale == 1.0 or input.dtype is torch.float32)


def scaled_softmax_forward(input, scale):
    x = input if scale == 1.0 else torch.mul(input, scale)
    out = torch.empty_like(input)
    _backend().softmax(_rows(x), out=_rows(out))
    return out


ADAPTERS = {
    "gelu": (_unary("gelu", approximate="tanh"), _sup_act),
    "silu": (_unary("silu"), _sup_act),
    "relu": (_unary("relu"), _sup_act),
    "swiglu": (_gated("swiglu"), _sup_act),
    "geglu": (_gated("geglu", approximate="tanh"), _sup_act),
    "scaled_softmax_forward": (scaled_softmax_forward, _sup_softmax),
}


def _availability():
    return _backend().availability()


def register(registry) -> None:
    from tensor_ops._registry import BackendImplKind, OpImpl
    try:
        import tensor_ops.backends.cuda  # noqa: F401
    except ImportError:
        return
    for op, (fn, sup) in ADAPTERS.items():
        registry.register_impl(OpImpl(op_name=op, impl_id=IMPL_ID, kind=BackendImplKind.DEFAULT, fn=fn, backend=NAME,
                                      supports=sup, available=_availability, api="tex"))
