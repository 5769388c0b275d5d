"""The OpenCL backend's op functions, named after the ops (the name rule of
:func:`tensor_ops.backends._contract.ops_from`), with the facade contract's signatures
(``fn(*spec.kernel_params)``, ``out`` last), and their per-call ``supports`` checks."""
from __future__ import annotations

import numpy as np

from .launch import cols, device_of, is_clarray, launch, row_grid, row_grid2


def rms_norm(x, weight, eps, out):
    st = device_of(x)
    rows, n = x.shape
    return launch(st, "rms_norm", x.dtype, [x, weight], out, x.shape,
                  [np.int32(n), np.float32(eps), np.int32(rows)], row_grid(st, rows), n % 4 == 0)


def layer_norm(x, weight, bias, eps, out):
    st = device_of(x)
    rows, n = x.shape
    return launch(st, "layer_norm", x.dtype, [x, weight, bias], out, x.shape,
                  [np.int32(n), np.float32(eps), np.int32(bias is not None), np.int32(rows)],
                  row_grid(st, rows), n % 4 == 0)


def _add_norm(kname, x, residual, weights, out, residual_out, scalars):
    """The fused add + norm kernels: two outputs. Host arrays are wrapped in place (USE_HOST_PTR)
    on CPU devices, and two buffers over one host array are undefined in OpenCL: a host
    output that is its input (the in-place form) is computed into a new array and copied."""
    st = device_of(x)
    rows, n = x.shape
    host = type(x) is np.ndarray
    given = (out, residual_out)
    outs = tuple(None if host and o is not None and (np.may_share_memory(o, x) or np.may_share_memory(o, residual))
                 else o for o in given)
    res = launch(st, kname, x.dtype, [x, residual, *weights], outs, x.shape,
                 [np.int32(n), *scalars, np.int32(rows)], row_grid(st, rows), n % 4 == 0)
    if all(o is g for o, g in zip(outs, given)):
        return res
    for g, r in zip(given, res):
        if g is not None and g is not r:
            np.copyto(g, r)
    return tuple(g if g is not None else r for g, r in zip(given, res))


def add_rms_norm(x, residual, weight, eps, out, residual_out):
    return _add_norm("add_rms_norm", x, residual, [weight], out, residual_out, [np.float32(eps)])


def add_layer_norm(x, residual, weight, bias, eps, out, residual_out):
    return _add_norm("add_layer_norm", x, residual, [weight, bias], out, residual_out,
                     [np.float32(eps), np.int32(bias is not None)])


def softmax(x, out):
    st = device_of(x)
    rows, n = x.shape
    return launch(st, "softmax", x.dtype, [x], out, x.shape, [np.int32(n), np.int32(rows)],
                  row_grid(st, rows), n % 4 == 0)


def _eltwise(kname, x, out):
    st = device_of(x)
    total = int(np.prod(x.shape))
    return launch(st, kname, x.dtype, [x], out, x.shape, [np.int64(total)], (cols(st, total // 8, 1),))


def silu(x, out):
    return _eltwise("silu", x, out)


def relu(x, out):
    return _eltwise("relu", x, out)


def gelu(x, approximate, out):
    return _eltwise("gelu_tanh" if approximate == "tanh" else "gelu", x, out)


def _gated(kname, x, out):
    st = device_of(x)
    rows, n2 = x.shape
    h = n2 // 2
    grid, ncut = row_grid2(st, h // 8, h, rows)
    return launch(st, kname, x.dtype, [x], out, (rows, h),
                  [np.int32(h), np.int32(rows), np.int32(ncut)], grid, h % 4 == 0)


def swiglu(x, out):
    return _gated("swiglu", x, out)


def geglu(x, approximate, out):
    return _gated("geglu_tanh" if approximate == "tanh" else "geglu", x, out)


def rope(x, cos, sin, interleaved, out):
    st = device_of(x)
    rows, n = x.shape
    kname = "rope_interleaved" if interleaved else "rope"
    grid, ncut = row_grid2(st, n // 4 if interleaved else n // 8, n, rows)
    return launch(st, kname, x.dtype, [x, cos, sin], out, x.shape,
                  [np.int32(n), np.int32(cos.shape[0]), np.int32(rows), np.int32(ncut)], grid,
                  n % 4 == 0 if interleaved else n % 8 == 0)


# ----------------------------------------------------------------------------- supports
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
_F32 = (np.dtype(np.float32),)


def _ok(a, dtypes=_DTYPES) -> bool:
    """A host float32/float16 ndarray, or a pyopencl array (any context)."""
    if type(a) is np.ndarray or is_clarray(a):
        return a.dtype in dtypes
    return False


def _with(x, a, dtypes=_DTYPES) -> bool:
    """Operand ``a`` usable next to ``x``: host x takes host operands only (they are
    wrapped, not copied); device x also takes small host operands (uploaded)."""
    if type(x) is np.ndarray:
        return type(a) is np.ndarray and a.dtype in dtypes
    return _ok(a, dtypes)


def _same_kind(x, out) -> bool:
    return out is None or (is_clarray(out) == is_clarray(x) and _ok(out))


def supports_for(op: str):
    """The cheap per-call check of ``op``: what this backend can run without copying."""
    if op == "rms_norm":
        return lambda x, w, eps, out=None: _ok(x) and _with(x, w) and _same_kind(x, out)
    if op == "layer_norm":
        return lambda x, w, b, eps, out=None: (_ok(x) and _with(x, w) and (b is None or _with(x, b))
                                               and _same_kind(x, out))
    if op == "add_rms_norm":
        return lambda x, r, w, eps, out=None, ro=None: (_ok(x) and _with(x, r) and _with(x, w) and _same_kind(x, out)
                                                         and _same_kind(x, ro))
    if op == "add_layer_norm":
        return lambda x, r, w, b, eps, out=None, ro=None: (_ok(x) and _with(x, r) and _with(x, w)
                                                            and (b is None or _with(x, b)) and _same_kind(x, out)
                                                            and _same_kind(x, ro))
    if op == "rope":
        return lambda x, c, s, il, out=None: (_ok(x) and _with(x, c, _F32) and _with(x, s, _F32)
                                              and _same_kind(x, out))
    if op in ("gelu", "geglu"):
        return lambda x, approximate, out=None: _ok(x) and _same_kind(x, out)
    return lambda x, out=None: _ok(x) and _same_kind(x, out)
