"""The conformance harness: every backend × op × variant × dtype × shape against the fp64
oracle, read from the op definitions through the public ``tensor_ops.testing`` (the same
suite a vendor runs on a plugin with ``tensor_ops.testing.run_conformance``).

A backend that is not available here is skipped with its recorded reason; a backend that
declines an input (its ``supports()``) is skipped with that fact. Strict mode is on, so a
backend *failure* fails the test instead of silently falling back to NumPy.
"""
from __future__ import annotations

import pytest

import tensor_ops.testing as tt
from tests.conftest import BACKENDS, backend_impl

CASES = list(tt.cases())


@pytest.mark.parametrize("kind", tt.KINDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_conformance(backend, case, kind):
    """``kind`` 'torch': the same case on torch CPU tensors (zero-copy views; a torch result)."""
    backend_impl(case.op, backend)          # skips with the reason when unavailable / not implemented
    if case.dtype == "float64" and backend != "numpy":
        pytest.skip(f"{backend} computes float16/bfloat16/float32 only; float64 is served by the NumPy reference")
    if kind == "torch":
        pytest.importorskip("torch", reason="torch not installed: the torch-tensor column skips")
    with tt.strict():
        result, detail = tt.run_case(case, backend, kind)
    if result == "declined":
        pytest.skip(f"{backend} declined {case.id} ({detail})")
    assert result == "passed", f"{backend} {case.id}: {detail}"


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [37, 4096])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rms_norm_rows_whose_squares_overflow(backend, n, dtype, op):
    """|x| > ~1.8e19 overflows x² in fp32: every backend redoes such a row (in double, or
    scaled by a power of two), so finite input gives the fp64 formula's values, not the 0 that
    torch's F.rms_norm returns; rows holding inf/NaN keep NaN. Row 6 holds 3e38, where the
    scale 1/max|x| that OpenCL used was subnormal. The fuzzer compares these rows against the
    oracle too (tests/test_fuzz.py)."""
    import numpy as np

    import tensor_ops as to
    backend_impl(op, backend)
    rows = np.tile(np.linspace(-2.0, 3.0, n), (7, 1))
    rows[0, :3] = (1e20, -3e19, 2e19)
    rows[1, :2] = (3e37, -1e37)
    rows[2] *= 1e30
    rows[3, 1] = np.inf
    rows[4, 2] = np.nan
    rows[6, :2] = (3e38, -1e38)
    if dtype == "bfloat16":
        import ml_dtypes
        x = rows.astype(ml_dtypes.bfloat16)
    else:
        x = rows.astype(np.float32)
    w = np.linspace(0.5, 1.5, n).astype(x.dtype)
    try:
        with tt.strict():
            if op == "rms_norm":
                y = to.rms_norm(x, w, 1e-6, backend=backend).astype(np.float64)
            else:   # the fused add: x = a + residual, rounded exactly (the halves of x)
                half = (x.astype(np.float64) / 2).astype(x.dtype)
                y, s = to.add_rms_norm(half, half, w, 1e-6, backend=backend)
                np.testing.assert_array_equal(s.astype(np.float64), x.astype(np.float64))
                y = y.astype(np.float64)
    except to.BackendUnsupportedError as exc:
        pytest.skip(f"{backend} does not serve {dtype}: {exc}")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w64
    rtol = 2e-5 if dtype == "float32" else 1e-2
    ok = [0, 1, 2, 5, 6]
    np.testing.assert_allclose(y[ok], want[ok], rtol=rtol, atol=rtol)
    assert np.isnan(y[3]).any() and np.isnan(y[4]).all()


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_rows_keep_fp32_accuracy(backend, op):
    """A 2^22-element fp32 row: the row's sums must not lose accuracy with its length (OpenCL's
    float8 lanes added 2^19 terms each: rms_norm 5.5e-6 and softmax 3.4e-6 relative error; its
    lanes now fold into compensated totals every 128 steps, as the C++ backend's fp32 blocks
    of 1024 fold into double). Relative checks: softmax's outputs are ~2e-7 each."""
    import numpy as np

    import tensor_ops as to
    backend_impl(op, backend)
    n = 1 << 22
    x = (np.random.default_rng(3).standard_normal((1, n)) + 3.0).astype(np.float32)
    x64 = x.astype(np.float64)
    with tt.strict():
        if op == "rms_norm":
            y = to.rms_norm(x, np.ones(n, np.float32), 1e-6, backend=backend)
            want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6)
        elif op == "layer_norm":
            y = to.layer_norm(x, np.ones(n, np.float32), np.zeros(n, np.float32), 1e-6, backend=backend)
            d = x64 - x64.mean(-1, keepdims=True)
            want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-6)
        else:
            y = to.softmax(x, backend=backend)
            e = np.exp(x64 - x64.max(-1, keepdims=True))
            want = e / e.sum(-1, keepdims=True)
    atol = 1e-5 if op == "layer_norm" else 0.0    # layer_norm's outputs cross zero
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1.3e-6, atol=atol)


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("n", [37, 4096])
@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_rows_far_from_their_first_element_or_overflowing(backend, n, op):
    """Two kinds of fp32 row where a shortcut in the variance shows: (1) one element far from
    the mean (1e3 .. 3e4 in a row of N(0, 1)) - OpenCL's one-pass moments shifted by the
    row's first element lost digits there (1.8e-2 absolute error, fixed by two passes); (2)
    rows whose fp32 sum or centred squares overflow (|x - mean| > ~1.8e19, values near
    FLT_MAX), which every backend redoes (in double, or scaled by a power of two). Both must
    give the fp64 formula's values; the fused add's x and residual are the halves of the rows."""
    import numpy as np

    import tensor_ops as to
    backend_impl(op, backend)
    rows = np.random.default_rng(7).standard_normal((7, n))
    rows[0, 0], rows[1, 0], rows[2, n // 2] = 1e3, 1e4, -3e4
    rows[3, :3] = (1e20, -3e19, 2e19)
    rows[4, :2] = (3e38, -1e38)
    rows[5] *= 1e30
    rows[6] = np.linspace(1e38, 3e38, n)
    x = rows.astype(np.float32)
    w = np.linspace(0.5, 1.5, n).astype(np.float32)
    b = np.linspace(-1.0, 1.0, n).astype(np.float32)
    with tt.strict(), np.errstate(over="ignore"):
        if op == "layer_norm":
            y = to.layer_norm(x, w, b, 1e-5, backend=backend)
        else:
            half = x / np.float32(2)
            y, s = to.add_layer_norm(half, half, w, b, 1e-5, backend=backend)
            np.testing.assert_array_equal(s, x)
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-5, atol=1e-5)
