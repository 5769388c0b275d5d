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


_VIEWS: list = [None]  # the cpp module's _torch_views, bound on the first _views call
_EXACT = (torch.Tensor, torch.nn.Parameter)


def _views(*ts) -> tuple:
    """NumPy views of the tensors ``ts`` (None stays None), as :func:`_np` makes them (bfloat16
    as ml_dtypes' bfloat16, which the kernels take as they take int16 bits), in one native call
    (``tensor_ops._cpp._torch_views``, cpp_ext/torch_entry.cpp). Why: ``t.detach().numpy()``
    costs ~1.5-2.4 us a tensor in torch 2.13 and a layernorm_fwd makes six views, ~12 of its
    ~31 us on an 8-row call; the native call made them in 3.3 us (Zen 4, timeit). Where it
    declines (an empty tensor, a negative bit, another dtype: see torch_entry.cpp), or where a
    tensor is of a subclass other than ``nn.Parameter`` (a wrapper subclass's ``data_ptr`` need
    not hold its values), each tensor goes through :func:`_np`, which raises as before."""
    if not all(t is None or type(t) in _EXACT for t in ts):
        return tuple(None if t is None else _np(t) for t in ts)
    tv = _VIEWS[0]
    if tv is None:
        from tensor_ops import _torch_facade
        _native()
        if not _torch_facade._NATIVE[0]:
            _torch_facade._native_entries()
        tv = _VIEWS[0] = _torch_facade._VIEWS[0] or (lambda *a: None)
    r = tv(*ts)
    return r if r is not None else tuple(None if t is None else _np(t) for t in ts)


def _vec(a):
    """A 1-D view of an ndarray (a weight given as (1, h))."""
    return a if a.ndim == 1 else a.reshape(-1)


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
    return (type(t) is torch.Tensor or isinstance(t, torch.Tensor)) and t.is_cpu and \
        (t.dtype is dtype if dtype is not None else t.dtype in _OK) and t.is_contiguous()


def _flat(t):
    return _np(t).reshape(-1)
