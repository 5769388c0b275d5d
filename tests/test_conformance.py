"""The conformance harness: every backend × op × dtype × shape against the fp64 oracle.

A backend that is not available here is skipped with its recorded reason; a backend that
declines an input (its ``supports()``) is skipped with that fact. Strict mode is on, so a
backend *failure* fails the test instead of silently falling back to NumPy.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import tensor_ops as to
from tests import _reference as ref
from tests.conftest import BACKENDS, backend_impl

TOL = {  # (rtol, atol) per dtype; reductions widen atol with the row length below
    np.float64: (1e-12, 1e-12),
    np.float32: (1.3e-6, 1e-5),
    np.float16: (1e-3, 2e-3),
}

SHAPES = {
    "1x1": (1, 2), "1x4096": (1, 4096), "3x4097": (3, 4097), "5x17": (5, 17),
    "2x3x64": (2, 3, 64), "4x8x130": (4, 8, 130), "empty": (0, 8), "strided": "strided",
}
OPS = ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "gelu_tanh", "relu", "swiglu", "geglu",
       "geglu_tanh", "rope", "rope_interleaved")


def _make(shape_id, dtype, rng, even=False):
    shape = SHAPES[shape_id]
    if shape == "strided":
        base = (rng.standard_normal((6, 2 * 66)) * 2).astype(dtype)
        return base[::2, ::2]           # non-contiguous view, (3, 66)
    shape = list(shape)
    if even and shape[-1] % 2:
        shape[-1] += 1
    return (rng.standard_normal(shape) * 2).astype(dtype)


def _case(op, x, rng):
    """(facade call kwargs builder, oracle value)."""
    n = x.shape[-1]
    dt = x.dtype
    if op == "rms_norm":
        w = (rng.standard_normal(n) * 0.5 + 1).astype(dt)
        return (lambda **kw: to.rms_norm(x, w, 1e-6, **kw)), ref.rms_norm(x, w, 1e-6), x.shape
    if op == "layer_norm":
        w = (rng.standard_normal(n) * 0.5 + 1).astype(dt)
        b = rng.standard_normal(n).astype(dt)
        return (lambda **kw: to.layer_norm(x, w, b, 1e-5, **kw)), ref.layer_norm(x, w, b, 1e-5), x.shape
    if op == "softmax":
        return (lambda **kw: to.softmax(x, **kw)), ref.softmax(x), x.shape
    if op in ("silu", "relu"):
        return (lambda **kw: getattr(to, op)(x, **kw)), getattr(ref, op)(x), x.shape
    if op in ("gelu", "gelu_tanh"):
        a = "tanh" if op.endswith("tanh") else "none"
        return (lambda **kw: to.gelu(x, a, **kw)), ref.gelu(x, a), x.shape
    if op in ("swiglu", "geglu", "geglu_tanh"):
        out_shape = x.shape[:-1] + (n // 2,)
        if op == "swiglu":
            return (lambda **kw: to.swiglu(x, **kw)), ref.swiglu(x), out_shape
        a = "tanh" if op.endswith("tanh") else "none"
        return (lambda **kw: to.geglu(x, a, **kw)), ref.geglu(x, a), out_shape
    if op.startswith("rope"):
        inter = op.endswith("interleaved")
        t = x.shape[-2]
        ang = rng.uniform(-4, 4, (t, n // 2))
        c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        return (lambda **kw: to.rope(x, c, s, inter, **kw)), ref.rope(x, c, s, inter), x.shape
    raise AssertionError(op)


def _facade_op(op):
    return op.split("_tanh")[0].replace("_interleaved", "")


def _served(op, backend, dtype, x):
    res = to.get_manager().resolve(op, backend, "facade", np.dtype(dtype).name, x.nbytes)
    return dict(res.by_impl)


@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64], ids=["f32", "f16", "f64"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_conformance(backend, op, dtype, shape_id, monkeypatch):
    fop = _facade_op(op)
    impl = backend_impl(fop, backend)
    if dtype == np.float64 and backend != "numpy":
        pytest.skip(f"{backend} computes float16/float32 only; float64 is served by the NumPy reference")
    monkeypatch.setenv("TENSOR_OPS_STRICT", "1")
    to.reload_config()
    rng = np.random.default_rng(zlib.crc32(f"{op}/{shape_id}".encode()))   # same data every run
    even = fop in ("swiglu", "geglu", "rope")
    x = _make(shape_id, dtype, rng, even)
    if fop == "rope" and x.ndim < 2:
        pytest.skip("rope needs (..., T, n)")
    call, expect, out_shape = _case(op, x, rng)

    before = _served(fop, backend, dtype, x)
    y = call(backend=backend)
    after = _served(fop, backend, dtype, x)
    if x.size:
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        if impl.impl_id not in delta:
            pytest.skip(f"{backend} declined {fop} for {np.dtype(dtype).name} {x.shape} (served by {list(delta)})")
    assert isinstance(y, np.ndarray) and y.dtype == dtype and y.shape == out_shape
    rtol, atol = TOL[dtype]
    if fop in ("rms_norm", "layer_norm", "softmax"):
        atol *= max(1.0, np.sqrt(x.shape[-1]) / 8)
    np.testing.assert_allclose(y.astype(np.float64), expect, rtol=rtol, atol=atol)

    # the same op into a preallocated out= must give the same numbers, in place
    out = np.full(out_shape, np.nan, dtype)
    r2 = call(backend=backend, out=out)
    assert r2 is out
    np.testing.assert_array_equal(out, y)
