"""The helpers default.cpp's tex adapters share (``_cpp_adapters``: norms, activations, the
multi-tensor optimizers and the registration; ``_cpp_train``: the training kernels and the GEMM):
zero-copy NumPy views of CPU tensors, outputs from the cpp module's block cache, the kernels'
dtype rules. No native code is loaded at import: ``_native()`` asks the cpp backend."""
from __future__ import annotations

import math

import torch

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


def _flat(t):
    return _np(t).reshape(-1)
