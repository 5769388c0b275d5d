"""The CUDA backend's op functions, named after the ops (the name rule of
:func:`tensor_ops.backends._contract.ops_from`), with the facade contract's signatures
(``fn(*spec.kernel_params)``, ``out`` last; ``out`` and the op options also as keywords, as
tensor_ops.tex's adapters call them), and their per-call ``supports`` checks.

The kernels take float32, float16 and bfloat16; float64 and matmul (cuBLAS) are served by
the CuPy reference backend (:mod:`tensor_ops.backends.cupy`).
"""
from __future__ import annotations

import numpy as np

from . import module as _module
from . import state
from .arrays import (ITEMSIZE, VEC_BYTES, aligned, dtype_name, flat_launch, kind, p, ptr, row_launch,
                     rows_cols_launch, run)

#: storage suffix of each dtype the kernels take (``to_<kernel>_<suffix>``)
SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
#: the kernels this module launches (``_build/cuda_build.KERNEL_OPS`` builds and checks them)
KERNEL_NAMES = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm", "softmax", "silu", "relu", "gelu",
                "gelu_tanh", "swiglu", "geglu", "geglu_tanh", "rope")


def _launch(c, kname: str, grid, block, args) -> None:
    sfx = SUFFIX.get(c.dtype)
    if sfx is None:   # supports() declines these: only a direct call gets here
        raise _module._fail(f"{c.op}: the kernels take {sorted(SUFFIX)}, got {c.dtype} "
                            f"(float64 is served by the CuPy reference backend)")
    _module.kernel(f"{kname}_{sfx}", c.dev)(grid, block, args)


def _vec(c, n: int) -> bool:
    return n % (VEC_BYTES // ITEMSIZE[c.dtype]) == 0


def rms_norm(x, weight, eps, out=None):
    def body(c, x=x, weight=weight, out=out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        vec = _vec(c, n) and aligned(c.kind, x, weight, y)
        grid, block = row_launch(rows, n, c.dev, ITEMSIZE[c.dtype])
        _launch(c, "rms_norm", grid, block, (p(x, c.kind), p(weight, c.kind), p(y, c.kind), np.int64(rows),
                                             np.int32(n), np.float32(eps), np.int32(vec)))
        return y
    return run("rms_norm", x, (weight, out), ("weight", "out"), body)


def layer_norm(x, weight, bias, eps, out=None):
    def body(c, x=x, weight=weight, bias=bias, out=out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        vec = _vec(c, n) and aligned(c.kind, x, weight, bias, y)
        grid, block = row_launch(rows, n, c.dev, ITEMSIZE[c.dtype])
        _launch(c, "layer_norm", grid, block, (p(x, c.kind), p(weight, c.kind), p(bias, c.kind), p(y, c.kind),
                                               np.int64(rows), np.int32(n), np.float32(eps), np.int32(vec)))
        return y
    return run("layer_norm", x, (weight, bias, out), ("weight", "bias", "out"), body)


def _add_norm(op, x, residual, weight, bias, eps, out, residual_out):
    """The fused add + norm kernels: (normed, s) with s = x + residual; out may be x and
    residual_out may be residual (the in-place form: the kernels read each element of x and
    residual before writing it)."""
    layer = op == "add_layer_norm"

    def body(c, x=x, residual=residual, weight=weight, bias=bias, out=out, residual_out=residual_out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        s = residual_out if residual_out is not None else c.empty(x, (rows, n))
        vec = _vec(c, n) and aligned(c.kind, x, residual, weight, bias, y, s)
        grid, block = row_launch(rows, n, c.dev, ITEMSIZE[c.dtype])
        ws = (p(weight, c.kind), p(bias, c.kind)) if layer else (p(weight, c.kind),)
        _launch(c, op, grid, block, (p(x, c.kind), p(residual, c.kind), *ws, p(y, c.kind), p(s, c.kind),
                                     np.int64(rows), np.int32(n), np.float32(eps), np.int32(vec)))
        return y, s
    return run(op, x, (residual, weight, bias, out, residual_out),
               ("residual", "weight", "bias", "out", "residual_out"), body)


def add_rms_norm(x, residual, weight, eps, out=None, residual_out=None):
    return _add_norm("add_rms_norm", x, residual, weight, None, eps, out, residual_out)


def add_layer_norm(x, residual, weight, bias, eps, out=None, residual_out=None):
    return _add_norm("add_layer_norm", x, residual, weight, bias, eps, out, residual_out)


def softmax(x, out=None):
    def body(c, x=x, out=out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        vec = _vec(c, n) and aligned(c.kind, x, y)
        grid, block = row_launch(rows, n, c.dev, ITEMSIZE[c.dtype])
        _launch(c, "softmax", grid, block, (p(x, c.kind), p(y, c.kind), np.int64(rows), np.int32(n),
                                            np.int32(vec)))
        return y
    return run("softmax", x, (out,), ("out",), body)


def _unary(op, kname, x, out):
    def body(c, x=x, out=out):
        y = out if out is not None else c.empty(x, tuple(x.shape))
        numel = int(np.prod(x.shape))
        vec = aligned(c.kind, x, y)
        grid, block = flat_launch(numel // (VEC_BYTES // ITEMSIZE[c.dtype]) if vec else numel, c.dev)
        _launch(c, kname, grid, block, (p(x, c.kind), p(y, c.kind), np.int64(numel), np.int32(vec)))
        return y
    return run(op, x, (out,), ("out",), body)


def silu(x, out=None):
    return _unary("silu", "silu", x, out)


def relu(x, out=None):
    return _unary("relu", "relu", x, out)


def gelu(x, approximate="none", out=None):
    return _unary("gelu", "gelu_tanh" if approximate == "tanh" else "gelu", x, out)


def _gated(op, kname, x, out):
    def body(c, x=x, out=out):
        rows, n2 = x.shape
        h = n2 // 2
        y = out if out is not None else c.empty(x, (rows, h))
        v = VEC_BYTES // ITEMSIZE[c.dtype]
        vec = h % v == 0 and aligned(c.kind, x, y)
        grid, block = rows_cols_launch(rows, h // v if vec else h)
        _launch(c, kname, grid, block, (p(x, c.kind), p(y, c.kind), np.int64(rows), np.int32(h), np.int32(vec)))
        return y
    return run(op, x, (out,), ("out",), body)


def swiglu(x, out=None):
    return _gated("swiglu", "swiglu", x, out)


def geglu(x, approximate="none", out=None):
    return _gated("geglu", "geglu_tanh" if approximate == "tanh" else "geglu", x, out)


def rope(x, cos, sin, interleaved=False, out=None):
    def body(c, x=x, cos=cos, sin=sin, out=out):
        rows, n = x.shape
        t = int(cos.shape[0])
        y = out if out is not None else c.empty(x, (rows, n))
        if dtype_name(cos, c.kind) != "float32" or dtype_name(sin, c.kind) != "float32":
            raise TypeError(f"cuda rope: cos/sin must be float32 for {c.dtype} x, got "
                            f"{dtype_name(cos, c.kind)}/{dtype_name(sin, c.kind)}")
        # 4 elements per vector step (cos/sin are float32: 16 bytes); the scalar path steps
        # one pair (interleaved) or one i of the (i, i + n/2) pairs.
        vec = (n % 8 == 0 if not interleaved else n % 4 == 0) and aligned(c.kind, cos, sin) and \
            all(ptr(a, c.kind) % (4 * ITEMSIZE[c.dtype]) == 0 for a in (x, y))
        units = (n // 4 if vec else n // 2) if interleaved else (n // 8 if vec else n // 2)
        grid, block = rows_cols_launch(rows, units)
        _launch(c, "rope", grid, block, (p(x, c.kind), p(cos, c.kind), p(sin, c.kind), p(y, c.kind),
                                         np.int64(rows), np.int32(n), np.int32(t), np.int32(bool(interleaved)),
                                         np.int32(vec)))
        return y
    return run("rope", x, (cos, sin, out), ("cos", "sin", "out"), body)


_KERNEL_DTYPES = frozenset(SUFFIX)
#: the NumPy dtypes copied to the GPU and back (CuPy cannot hold ml_dtypes' bfloat16)
HOST_DTYPES = ("float32", "float16")


def supports_for(op: str):
    """The cheap per-call check of ``op``: CuPy arrays / torch CUDA tensors of a dtype the
    kernels take; NumPy float32/float16 (the resolver lets them reach this check only when an
    order names cuda) at or above the op's host-copy threshold."""
    def supports(x, *rest, **kw) -> bool:
        k = kind(x)
        if k in ("cupy", "torch"):
            return dtype_name(x, k) in _KERNEL_DTYPES
        if k == "numpy":
            return x.nbytes >= state.HOST_COPY_MIN_BYTES.get(op, 0) and x.dtype.name in HOST_DTYPES
        return False
    supports.__name__ = f"cuda_supports_{op}"
    return supports
