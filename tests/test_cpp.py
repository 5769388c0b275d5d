"""Backend-specific tests of the C++ SIMD backend (tensor_ops._cpp, cpp_ext/).

The cross-backend conformance harness (test_conformance.py) covers the facade ops for
every backend; this file checks what only the C++ backend has: ISA variants (each one run
in a subprocess with TENSOR_OPS_MAX_ISA), SIMD tails, very long rows, bfloat16 uint16
views, the binding's refusals, the vectorised math accuracy, the tex kernels (norm stats,
backward, Adam, scale, l2norm) and get_optimization_info(). Timings are never asserted.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tensor_ops.testing import oracles as ref
from tests._helpers import bf16_bits, bf16_float, cpp_native, run_python
from tensor_ops._ops import tolerance

pytestmark = pytest.mark.cpp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.fixture(scope="module")
def C():
    return cpp_native()


# ---------------------------------------------------------------------------- helpers


def as_dtype(a, dt):
    """(array passed to the kernel, float64 value it holds, kwargs)."""
    if dt == "bfloat16":
        bits = bf16_bits(a)
        return bits, bf16_float(bits).astype(np.float64), {"dtype": "bfloat16"}
    arr = np.ascontiguousarray(a, dt)
    return arr, arr.astype(np.float64), {}


def value(y, dt):
    return bf16_float(y).astype(np.float64) if dt == "bfloat16" else y.astype(np.float64)


DTYPES = ["float32", "float16", "bfloat16"]


def check(got, want, dt, scale=1.0):
    """Within the project's one tolerance table; ``scale`` widens atol for sums over a row."""
    rtol, atol = tolerance(dt)
    np.testing.assert_allclose(value(got, dt), want, rtol=rtol, atol=atol * scale, equal_nan=True)


def rope_tables(T, n, seed=3):
    rng = np.random.default_rng(seed)
    ang = rng.uniform(-3, 3, (T, n)).astype(np.float32)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def ref_rope(x, cos, sin, interleaved):
    """The oracle on (rows, n) rows whose position is row % T (the kernel's layout)."""
    rows, n = x.shape
    t = cos.shape[0]
    reps = -(-rows // t)
    y = ref.rope(np.resize(np.asarray(x, np.float64), (reps * t, n)).reshape(reps, t, n), cos, sin, interleaved)
    return y.reshape(reps * t, n)[:rows]


# ---------------------------------------------------------------------------- ops, tails
WIDTHS = list(range(1, 18)) + [31, 33, 64, 100, 1027]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", WIDTHS, ids=lambda n: f"n{n}")
def test_norms_and_softmax_tails(C, n, dt):
    rng = np.random.default_rng(n)
    x0 = rng.standard_normal((3, n)) * 2 + 0.5
    w0, b0 = rng.standard_normal(n), rng.standard_normal(n)
    x, xv, kw = as_dtype(x0, dt)
    w, wv, _ = as_dtype(w0, dt)
    b, bv, _ = as_dtype(b0, dt)
    check(C.rms_norm(x, w, 1e-6, None, **kw), ref.rms_norm(xv, wv, 1e-6), dt, math.sqrt(n))
    check(C.layer_norm(x, w, b, 1e-5, None, **kw), ref.layer_norm(xv, wv, bv, 1e-5), dt, math.sqrt(n))
    check(C.layer_norm(x, w, None, 1e-5, None, **kw), ref.layer_norm(xv, wv, None, 1e-5), dt, math.sqrt(n))
    check(C.softmax(x, None, **kw), ref.softmax(xv), dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", WIDTHS, ids=lambda n: f"n{n}")
def test_elementwise_tails(C, n, dt):
    rng = np.random.default_rng(100 + n)
    x, xv, kw = as_dtype(rng.standard_normal((3, n)) * 4, dt)
    check(C.silu(x, None, **kw), ref.silu(xv), dt)
    check(C.relu(x, None, **kw), ref.relu(xv), dt)
    check(C.gelu(x, "none", None, **kw), ref.gelu(xv), dt)
    check(C.gelu(x, "tanh", None, **kw), ref.gelu(xv, "tanh"), dt)
    x2, x2v, _ = as_dtype(rng.standard_normal((3, 2 * n)) * 3, dt)
    check(C.swiglu(x2, None, **kw), ref.swiglu(x2v), dt, 4)
    check(C.geglu(x2, "none", None, **kw), ref.geglu(x2v), dt, 4)
    check(C.geglu(x2, "tanh", None, **kw), ref.geglu(x2v, "tanh"), dt, 4)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("n", [2, 4, 6, 8, 10, 16, 18, 34, 66, 128], ids=lambda n: f"n{n}")
def test_rope(C, n, interleaved, dt):
    rng = np.random.default_rng(n)
    cos, sin = rope_tables(5, n)
    x, xv, kw = as_dtype(rng.standard_normal((7, n)), dt)
    check(C.rope(x, cos, sin, interleaved, None, **kw), ref_rope(xv, cos, sin, interleaved), dt)


def test_rope_odd_output_alignment(C):
    # out shifted by one element: interleaved pairs straddle vector lanes in the body.
    old = C.build_info()["nontemporal_threshold_bytes"]
    C._set_tuning(-1, 0)  # force the non-temporal path with its alignment head
    try:
        n = 64
        cos, sin = rope_tables(3, n)
        x = np.random.default_rng(0).standard_normal((4, n)).astype(np.float32)
        buf = np.zeros(4 * n + 1, np.float32)
        out = buf[1:].reshape(4, n)
        for il in (False, True):
            C.rope(x, cos, sin, il, out)
            np.testing.assert_allclose(out, ref_rope(x, cos, sin, il), rtol=2e-6, atol=2e-6)
    finally:
        C._set_tuning(-1, old)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("shift", [1, 2, 4, 8, 15, 16])
@pytest.mark.parametrize("n", [128, 2048])
def test_rope_misaligned_out_every_shift(C, dt, shift, n):
    """Rows into an out= `shift` elements past a 64-byte line, streaming stores forced, each
    writer of rope.cpp: spliced (AVX2: rows of whole vectors, out off the vector alignment -
    fp32 shifts 1, 2, 4, 15, fp16 1, 2, 4, 15), staged (short rows on a vector but not a line
    boundary - fp32 8, fp16 8 and 16 on AVX2) and direct (fp32 16: on a line; fp32 rows of 2048,
    long, on a vector boundary: 8 and 16). Many rows, so lines carry across rows, drains and
    splices; nothing outside out is written."""
    old = C.build_info()["nontemporal_threshold_bytes"]
    C._set_tuning(-1, 0)
    try:
        rows = 300 if n == 128 else 40
        cos, sin = rope_tables(37, n)
        x = np.random.default_rng(shift).standard_normal((rows, n)).astype(dt)
        pad = 64
        buf = np.full(rows * n + 2 * pad, 7, dt)
        start = (-buf.ctypes.data % 64) // buf.itemsize + shift
        out = buf[start:start + rows * n].reshape(rows, n)
        for il in (False, True):
            C.rope(x, cos, sin, il, out)
            want = ref_rope(x.astype(np.float64), cos, sin, il)
            np.testing.assert_allclose(out, want, rtol=2e-6 if dt == "float32" else 1e-3,
                                       atol=2e-6 if dt == "float32" else 2e-3)
            assert (buf[:start] == 7).all() and (buf[start + rows * n:] == 7).all()
    finally:
        C._set_tuning(-1, old)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("heads,T,n", [(6, 37, 128), (5, 16, 64), (9, 3, 8), (2, 11, 130)])
@pytest.mark.parametrize("shift", [0, 4], ids=["aligned", "shifted"])
@pytest.mark.parametrize("group,block", [(0, 0), (3, 4096), (8, 1)], ids=["default", "g3-blocks", "g8-rows"])
def test_rope_head_groups(C, dt, heads, T, n, shift, group, block):
    """(heads, T, n) x with (T, n) tables: heads go through the kernel in groups sharing each
    table row (bind_facade.cpp rope), a head count that is not a multiple of the group, the
    direct and a misaligned out= (spliced on AVX2; streaming stores forced), both layouts, on 2 threads
    (the (block, group) units split between them); the default group and block of positions, and
    (_set_tuning) groups of 3 over blocks of a few positions and groups of 8 over single
    positions, so that blocks end inside the table and groups inside the heads."""
    info, nt = C.build_info(), C.get_num_threads()
    C._set_tuning(0, 0, rope_group=group or -1, rope_block=block or -1)
    C.set_num_threads(2)
    try:
        cos, sin = rope_tables(T, n, seed=heads)
        x = np.random.default_rng(T + n).standard_normal((heads, T, n)).astype(dt)
        buf = np.full(x.size + 64, 7, dt)
        start = (-buf.ctypes.data % 64) // buf.itemsize + shift
        out = buf[start:start + x.size].reshape(x.shape)
        for il in (False, True):
            C.rope(x, cos, sin, il, out)
            want = ref_rope(x.reshape(-1, n).astype(np.float64), cos, sin, il).reshape(x.shape)
            tol = 2e-6 if dt == "float32" else 1e-3
            np.testing.assert_allclose(out, want, rtol=tol, atol=2 * tol)
            assert (buf[:start] == 7).all() and (buf[start + x.size:] == 7).all()
    finally:
        C._set_tuning(info["parallel_threshold_bytes"], info["nontemporal_threshold_bytes"],
                      rope_group=info["rope_group"], rope_block=info["rope_block_bytes"])
        C.set_num_threads(nt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("heads,T,n", [(3, 7, 16), (2, 5, 32), (5, 9, 1024)])
@pytest.mark.parametrize("shift", [1, 3, 8])
def test_rope_staged_out_head_groups_every_dtype(C, dt, heads, T, n, shift):
    """Head groups into an out= off its vector alignment (the spliced path on AVX2 where the
    rows are whole vectors, else the staged one, one stage per head of a group), bfloat16
    included, rows from 16 to 1024 wide (the stage's fp32 limit): every element right, both
    layouts, on 2 threads (each thread's part starts and ends with a partial line), nothing
    outside out written (shift = elements past a 64-byte line)."""
    info, nt = C.build_info(), C.get_num_threads()
    C._set_tuning(0, 0)
    C.set_num_threads(2)
    try:
        cos, sin = rope_tables(T, n, seed=n)
        x, x64, kw = as_dtype(np.random.default_rng(heads + n).standard_normal((heads, 3 * T, n)), dt)
        buf = np.full(x.size + 128, 7, x.dtype)
        start = (-buf.ctypes.data % 64) // buf.itemsize + shift
        out = buf[start:start + x.size].reshape(x.shape)
        for il in (False, True):
            C.rope(x, cos, sin, il, out, **kw)
            want = ref_rope(x64.reshape(-1, n), cos, sin, il).reshape(x.shape)
            tol = {"float32": 2e-6, "float16": 1e-3, "bfloat16": 8e-3}[dt]
            np.testing.assert_allclose(value(out, dt), want, rtol=tol, atol=2 * tol)
            assert (buf[:start] == 7).all() and (buf[start + x.size:] == 7).all()
    finally:
        C._set_tuning(info["parallel_threshold_bytes"], info["nontemporal_threshold_bytes"])
        C.set_num_threads(nt)


def test_out_is_written_in_place_and_returned(C):
    x = np.random.default_rng(1).standard_normal((4, 40)).astype(np.float32)
    w = np.ones(40, np.float32)
    for fn, args in [(C.rms_norm, (x, w, 1e-6)), (C.softmax, (x,)), (C.silu, (x,)), (C.relu, (x,))]:
        out = np.full_like(x, np.nan)
        assert fn(*args, out) is out
        assert not np.isnan(out).any()
    out = np.empty((4, 20), np.float32)
    assert C.swiglu(x, out) is out


def test_nontemporal_path_matches(C):
    """Big-output stores (streaming, with an alignment head) give the same numbers."""
    x = np.random.default_rng(2).standard_normal((33, 257)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal(257).astype(np.float32)
    want = [C.rms_norm(x, w, 1e-6), C.silu(x), C.softmax(x), C.gelu(x, "tanh")]
    old = C.build_info()["nontemporal_threshold_bytes"]
    C._set_tuning(-1, 0)
    try:
        buf = np.empty(x.size + 3, np.float32)
        for k, f in enumerate([lambda o: C.rms_norm(x, w, 1e-6, o), lambda o: C.silu(x, o),
                               lambda o: C.softmax(x, o), lambda o: C.gelu(x, "tanh", o)]):
            for off in (0, 1, 3):
                o = buf[off:off + x.size].reshape(x.shape)
                np.testing.assert_array_equal(f(o), want[k])
    finally:
        C._set_tuning(-1, old)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", ["silu", "gelu", "relu"])
def test_gated_bwd_streaming_matches(C, dt, kind):
    """TE's gated derivatives (dglu: backward.cpp gated_bwd_k, also the autograd's glu2_bwd)
    write the same bits with streaming stores as with cached ones. On AVX2 the streaming form
    writes a line of da, then a line of db, from da's first line boundary on: rows of many
    lines and a partial one (h = 1096), one vector (8), rows whose db half starts off a vector
    boundary (1100, 1031: cached stores), each with the output on a line boundary, a vector
    past it (8 elements: a head up to the line) and off the vector boundary (1, 4)."""
    rng = np.random.default_rng(7)
    old = C.build_info()["nontemporal_threshold_bytes"]
    code = C.DACT_CODES[kind]
    try:
        for h in (8, 1096, 1100, 1031):
            x, _, kw = as_dtype(rng.standard_normal((5, 2 * h)) * 3, dt)
            g, _, _ = as_dtype(rng.standard_normal((5, h)), dt)
            C._set_tuning(-1, 1 << 40)
            want = np.empty_like(x)
            C.dglu(g, x, want, code, **kw)
            C._set_tuning(-1, 0)
            buf = np.empty(x.size + 64, x.dtype)
            base = (-buf.ctypes.data % 64) // x.itemsize
            for off in (0, 1, 4, 8):
                y = buf[base + off:base + off + x.size].reshape(x.shape)
                C.dglu(g, x, y, code, **kw)
                np.testing.assert_array_equal(y, want, err_msg=f"h={h}, out at +{off} elements")
    finally:
        C._set_tuning(-1, old)


def _fused_add_call(C, layer, w, b, kw):
    """add_layer_norm or add_rms_norm with these weights: call(x, r, out=None, res=None)."""
    def call(xa, ra, out=None, res=None):
        if layer:
            return C.add_layer_norm(xa, ra, w, b, 1e-5, out, res, **kw)
        return C.add_rms_norm(xa, ra, w, 1e-6, out, res, **kw)
    return call


def _check_fused_add_placements(C, call, x, r, want_y, want_s, offsets):
    """Both outputs at each (y, res_out) element offset, streaming stores forced and not, then
    in place (vLLM's form): the bits of want_y / want_s every time."""
    old = C.build_info()["nontemporal_threshold_bytes"]
    try:
        for threshold in (0, old):
            C._set_tuning(-1, threshold)
            buf_y = np.zeros(x.size + 40, x.dtype)
            buf_s = np.zeros(x.size + 40, x.dtype)
            for oy, os_ in offsets:
                y = buf_y[oy:oy + x.size].reshape(x.shape)
                s = buf_s[os_:os_ + x.size].reshape(x.shape)
                got_y, got_s = call(x, r, y, s)
                assert got_y is y and got_s is s
                np.testing.assert_array_equal(y, want_y, err_msg=f"y at +{oy}, s at +{os_}")
                np.testing.assert_array_equal(s, want_s, err_msg=f"y at +{oy}, s at +{os_}")
            xi, ri = x.copy(), r.copy()
            call(xi, ri, xi, ri)
            np.testing.assert_array_equal(xi, want_y)
            np.testing.assert_array_equal(ri, want_s)
    finally:
        C._set_tuning(-1, old)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("layer", [False, True], ids=["add_rms_norm", "add_layer_norm"])
def test_fused_add_outputs_at_every_placement(C, dt, layer):
    """add_rms_norm / add_layer_norm write both outputs in one pass where they share their
    offset within a vector (norm.cpp write_pair) and in two write_row passes where they do
    not (and for 16-bit outputs off a vector): every combination, streaming stores forced
    and not, in place too, gives the bits of the fresh-output call."""
    rng = np.random.default_rng(11)
    x, _, kw = as_dtype(rng.standard_normal((9, 203)), dt)
    r, _, _ = as_dtype(rng.standard_normal((9, 203)), dt)
    w, _, _ = as_dtype(rng.standard_normal(203), dt)
    b, _, _ = as_dtype(rng.standard_normal(203), dt)

    call = _fused_add_call(C, layer, w, b, kw)
    want_y, want_s = call(x, r)
    _check_fused_add_placements(C, call, x, r, want_y, want_s,
                                [(0, 0), (1, 1), (8, 8), (3, 3), (0, 1), (2, 13), (16, 0)])


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [7, 203, 2100])
def test_add_layer_norm_rows_of_every_kind(C, dt, n):
    """add_layer_norm's statistics of s = x + r (the add's pass sums s from x and r, the
    centred squares come from the scratch row) on rows of every kind, against the float64
    oracle of the stored residual s (which must be x + r rounded to the dtype once, through
    the 16-bit scratch copy res_out is streamed from), each row bitwise the row passed alone.
    Rows: typical; s's head far from its mean; s offset far from zero, x and r each further;
    x's and r's heads far off but cancelling in s; a huge value (fp32 sums overflow: the
    double redo); inf (NaN out, as NumPy). (Written for a one-pass form of these statistics
    that measured slower and was not kept; CONTRIBUTING "The fused adds' 16-bit forms".)"""
    rng = np.random.default_rng(17)
    xs = rng.standard_normal((7, n))
    rs = rng.standard_normal((7, n))
    xs[1, :64] += 40                               # s's head far from its mean (n > 64)
    xs[2] += 300
    rs[2] -= 200                                   # s about 100 + noise
    xs[3, :64] += 50
    rs[3, :64] -= 50                               # heads cancel in s
    if dt != "float16":
        xs[4, :2] = (1e20, -3e19)
    xs[5, n // 2] = np.inf
    x, xv, kw = as_dtype(xs, dt)
    r, rv, _ = as_dtype(rs, dt)
    w, wv, _ = as_dtype(rng.standard_normal(n), dt)
    b, bv, _ = as_dtype(rng.standard_normal(n), dt)
    y, s = C.add_layer_norm(x, r, w, b, 1e-5, None, None, **kw)
    sv = value(s, dt)
    _, want_s, _ = as_dtype(xv + rv, dt)            # x + r rounded once to the dtype
    np.testing.assert_array_equal(sv, want_s)
    ok = np.r_[0:5, 6]
    check(y[ok], ref.layer_norm(sv[ok], wv, bv, 1e-5), dt, math.sqrt(n))
    assert np.isnan(value(y[5], dt)).all()
    for i in range(len(x)):
        yi, si = C.add_layer_norm(x[i:i + 1], r[i:i + 1], w, b, 1e-5, None, None, **kw)
        np.testing.assert_array_equal(yi[0], y[i], err_msg=f"row {i}")
        np.testing.assert_array_equal(si[0], s[i], err_msg=f"row {i}")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm"])
def test_norm_weights_at_every_placement(C, dt, op):
    """The norms' weight and bias reach the kernel as fp32 copies, or for fp16 as they are
    (norm.cpp with_w: half the L1 footprint), copied only to align them on large calls: the
    output is the same bits whatever the weights' placement (64-byte aligned or not), the
    call's size class (one thread and cached stores, or the parallel streaming path forced),
    and it matches the float64 oracle."""
    rng = np.random.default_rng(23)
    n = 203
    x, xv, kw = as_dtype(rng.standard_normal((9, n)), dt)
    r, rv, _ = as_dtype(rng.standard_normal((9, n)), dt)
    w0, wv, _ = as_dtype(rng.standard_normal(n), dt)
    b0, bv, _ = as_dtype(rng.standard_normal(n), dt)

    def call(w, b):
        if op == "rms_norm":
            return C.rms_norm(x, w, 1e-6, **kw)
        if op == "layer_norm":
            return C.layer_norm(x, w, b, 1e-5, **kw)
        if op == "add_rms_norm":
            return C.add_rms_norm(x, r, w, 1e-6, **kw)[0]
        return C.add_layer_norm(x, r, w, b, 1e-5, **kw)[0]

    want = call(w0, b0)
    if op.startswith("add_"):
        sv = value(C.add_rms_norm(x, r, w0, 1e-6, **kw)[1], dt)
    else:
        sv = xv
    oracle = ref.rms_norm(sv, wv, 1e-6) if op.endswith("rms_norm") else ref.layer_norm(sv, wv, bv, 1e-5)
    check(want, oracle, dt, math.sqrt(n))
    buf_w = np.zeros(n + 40, w0.dtype)
    buf_b = np.zeros(n + 40, b0.dtype)
    old = C.build_info()
    try:
        for par, nt in ((-1, -1), (0, 0)):  # as configured; everything "large"
            C._set_tuning(par, nt)
            for ow, ob in [(0, 0), (1, 1), (8, 3), (32, 0)]:
                w = buf_w[ow:ow + n]
                b = buf_b[ob:ob + n]
                w[:] = w0
                b[:] = b0
                np.testing.assert_array_equal(call(w, b), want, err_msg=f"w at +{ow}, b at +{ob}, par {par}")
    finally:
        C._set_tuning(old["parallel_threshold_bytes"], old["nontemporal_threshold_bytes"])


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [203, 1024])
def test_column_partials_at_every_output_placement(C, dt, n):
    """The column partials of TE's dbias_d* and of the norm backward's dgamma / dbeta sit on the
    output's phase within a line (runtime.h Scratch `beside`, slots padded to 16 floats): the
    bits of every output are those of the line-aligned call at each element offset of the arrays
    and in both size classes (cached stores, or the parallel streaming path forced)."""
    rng = np.random.default_rng(29)
    rows = 40
    g0, _, kw = as_dtype(rng.standard_normal((rows, n)), dt)
    x0, _, _ = as_dtype(rng.standard_normal((rows, n)), dt)
    gamma, _, _ = as_dtype(rng.standard_normal(n), dt)
    rs = (np.abs(rng.standard_normal(rows)) + 0.5).astype(np.float32)
    mu = rng.standard_normal(rows).astype(np.float32)

    def placed(a, off):  # a copy of a, `off` elements past a 64-byte line
        v = _line_aligned(a.shape, a.dtype, off)
        v[...] = a
        return v

    def run(off):
        g, x = placed(g0, off), placed(x0, off)
        out = []
        for kind in ("gelu", "relu"):
            y, db = placed(np.zeros_like(x0), off), np.zeros(n, np.float32)
            C.dact(g, x, y, C.DACT_CODES[kind], db, **kw)
            np.testing.assert_allclose(db, value(y, dt).sum(0), rtol=1e-5, atol=1e-4, err_msg=f"dbias_d{kind}")
            out += [y.copy(), db]
        dx, dg = placed(np.zeros_like(x0), off), np.zeros_like(gamma)
        C.rms_norm_bwd(g, x, rs, gamma, dx, dg, **kw)
        out += [dx.copy(), dg]
        dx, dg, dbt = placed(np.zeros_like(x0), off), np.zeros_like(gamma), np.zeros_like(gamma)
        C.layer_norm_bwd(g, x, mu, rs, gamma, dx, dg, dbt, **kw)
        return out + [dx.copy(), dg, dbt]

    old = C.build_info()
    try:
        for par, nt in ((-1, -1), (0, 0)):
            C._set_tuning(par, nt)
            want = run(0)
            for off in (1, 3, 4, 8, 12):
                for i, (got, w) in enumerate(zip(run(off), want)):
                    np.testing.assert_array_equal(got, w, err_msg=f"output {i}, arrays at +{off} elements, par {par}")
    finally:
        C._set_tuning(old["parallel_threshold_bytes"], old["nontemporal_threshold_bytes"])


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("n", [7, 1040])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
def test_bf16_norms_softmax_are_the_fp32_result_rounded(C, op, n, eps):
    """bf16 rms_norm and layer_norm compute in fp32 and round once, so their bits are the fp32
    kernel's on the widened operands, rounded to nearest even (softmax's 16-bit exp is its own:
    within a code), NaN quiet with its high half kept. AVX2 rounds these three without the NaN
    case (rowio.h nan_free: every NaN they can make has a zero low half), so their NaNs must
    still be the default NaN or an operand's payload, quiet: rows holding NaN (quiet and
    signalling payloads) or Inf, rows whose squares overflow fp32, NaN / Inf / zero weights and
    biases, and with eps = 0 an all-zero row
    (1/sigma = Inf, 0 * Inf = NaN)."""
    rng = np.random.default_rng(n)
    v = (rng.standard_normal((8, n)) * 3).astype(np.float32)
    x = bf16_bits(v)
    x[1, 3 % n] = 0x7FC0
    x[6, n // 2] = 0xFFA3          # a signalling payload: quiet after the first product
    x[2, 1] = 0x7F80
    x[3, :2] = bf16_bits(np.float32([1e20, -3e19]))  # squares overflow fp32: the row in double
    x[4] = 0
    x[5] = bf16_bits(v[5] * np.float32(1e-30))       # tiny: 1/sigma large, finite with eps = 0
    wcases = ("normal", "nan", "snan", "inf", "zero") if op != "softmax" else ("normal",)
    for wcase in wcases:
        wb = bf16_bits(rng.standard_normal(n).astype(np.float32))
        bb = bf16_bits(rng.standard_normal(n).astype(np.float32))
        if wcase == "nan":
            wb[n // 2] = 0x7FC0
        elif wcase == "snan":
            wb[0] = bb[-1] = 0x7F81
        elif wcase == "inf":
            wb[-1] = 0xFF80
            bb[0] = 0x7F80
        elif wcase == "zero":
            wb[:] = 0
        if op == "rms_norm":
            def call(a, w, b, **kw):
                return C.rms_norm(a, w, eps, **kw)
        elif op == "layer_norm":
            def call(a, w, b, **kw):
                return C.layer_norm(a, w, b, eps, **kw)
        else:
            def call(a, w, b, **kw):
                return C.softmax(a, **kw)
        got = call(x, wb, bb, dtype="bfloat16")
        with np.errstate(all="ignore"):
            want32 = call(bf16_float(x), bf16_float(wb), bf16_float(bb))
        want = bf16_bits(want32)
        nan = np.isnan(want32)
        assert np.array_equal(np.isnan(bf16_float(got)), nan), f"w {wcase}: NaN positions differ"
        assert nan.any(), "the cases make NaNs"
        if op == "softmax":  # its 16-bit form has its own exp (within a code of the fp32 result)
            assert np.abs(got[~nan].astype(int) - want[~nan].astype(int)).max() <= 1
        else:
            np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=f"w {wcase}")
        # which NaN meets which first differs by operand order between the kernels: each NaN
        # stored is the default one or an operand's payload, quiet, its bits not rounded
        ops = np.concatenate([x.ravel(), wb, bb])
        payloads = {0xFFC0} | {int(c) | 0x40 for c in ops[np.isnan(bf16_float(ops))]}
        odd = set(np.unique(got[nan]).tolist()) - payloads
        assert not odd, f"w {wcase}: NaNs stored as {sorted(hex(c) for c in odd)}"


@pytest.mark.parametrize("n", [7, 1040])
@pytest.mark.parametrize("layer", [False, True], ids=["add_rms_norm", "add_layer_norm"])
def test_bf16_fused_add_nans_are_operand_payloads(C, n, layer):
    """The bf16 fused adds' normed output is rounded without the NaN case on AVX2 (rowio.h
    nan_free: it is a product of the stored residual s = round(x + r) and widened weights):
    within a code of the fp32 norm of s, NaN exactly where that is NaN, each NaN the default
    one or an operand's payload, quiet (rows holding quiet / signalling NaN or Inf in x or the
    residual, NaN and Inf weights)."""
    rng = np.random.default_rng(n)
    x = bf16_bits(rng.standard_normal((6, n)).astype(np.float32))
    r = bf16_bits(rng.standard_normal((6, n)).astype(np.float32))
    x[1, 0], r[2, n - 1], x[3, n // 2], r[4, 1] = 0x7FC0, 0xFFA3, 0x7F80, 0x7F81
    w = bf16_bits(rng.standard_normal(n).astype(np.float32))
    b = bf16_bits(rng.standard_normal(n).astype(np.float32))
    w[n // 2], b[0] = 0x7FD1, 0xFF80
    kw = {"dtype": "bfloat16"}
    if layer:
        y, s = C.add_layer_norm(x, r, w, b, 1e-5, **kw)
        with np.errstate(all="ignore"):
            want32 = C.layer_norm(bf16_float(s), bf16_float(w), bf16_float(b), 1e-5)
    else:
        y, s = C.add_rms_norm(x, r, w, 1e-6, **kw)
        with np.errstate(all="ignore"):
            want32 = C.rms_norm(bf16_float(s), bf16_float(w), 1e-6)
    nan = np.isnan(want32)
    assert nan.any() and np.array_equal(np.isnan(bf16_float(y)), nan)
    want = bf16_bits(want32)
    assert np.abs(y[~nan].astype(int) - want[~nan].astype(int)).max() <= 1
    ops = np.concatenate([x.ravel(), r.ravel(), w, b])
    payloads = {0xFFC0} | {int(c) | 0x40 for c in ops[np.isnan(bf16_float(ops))]}
    odd = set(np.unique(y[nan]).tolist()) - payloads
    assert not odd, f"NaNs stored as {sorted(hex(c) for c in odd)}"


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [7, 203, 1040, 2100])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_norm_rows_pipelined_match_rows_alone(C, dt, n, op):
    """The norms take row r+1's statistics inside row r's write pass (norm.cpp, variant.h
    BlockSum): every row's output is bitwise that of the row passed alone, at every output
    placement, streaming stores forced and not, in place, with a row redone in double (its
    squares overflow fp32) between pipelined rows, and widths that end 1024-element blocks
    mid-pair. layer_norm's rows also: one whose head is far from its mean (its shifted
    moments would cancel, so it takes two passes from cache), one offset far from zero
    (moments about zero would cancel), one holding inf (NaN out, as NumPy)."""
    rng = np.random.default_rng(5)
    v = rng.standard_normal((8, n)) * 3 + 1
    if dt != "float16":
        v[2, :2] = (1e20, -3e19)    # x² overflows fp32: the double redo, then the pipeline again
    v[4, :64] += 40                 # head far from the mean
    v[5] = 100 + rng.standard_normal(n)  # unshifted, E[x²] - E[x]² would lose ~4 % in fp32
    v[6, n // 2] = np.inf
    x, xv, kw = as_dtype(v, dt)
    w, wv, _ = as_dtype(rng.standard_normal(n), dt)
    b, bv, _ = as_dtype(rng.standard_normal(n), dt)
    if op == "rms_norm":
        def call(a, out=None):
            return C.rms_norm(a, w, 1e-6, out, **kw)
    else:
        def call(a, out=None):
            return C.layer_norm(a, w, b, 1e-5, out, **kw)
        # accurate too, not only self-consistent (the inf row aside)
        ok = np.r_[0:6, 7]
        check(call(x)[ok], ref.layer_norm(xv, wv, bv, 1e-5)[ok], dt, math.sqrt(n))
    want = np.concatenate([call(x[i:i + 1]) for i in range(len(x))])
    old = C.build_info()["nontemporal_threshold_bytes"]
    try:
        for threshold in (0, old):
            C._set_tuning(-1, threshold)
            buf = np.zeros(x.size + 40, x.dtype)
            for off in (0, 1, 3, 8, 16):
                y = buf[off:off + x.size].reshape(x.shape)
                assert call(x, y) is y
                np.testing.assert_array_equal(y, want, err_msg=f"out at +{off}")
            xi = x.copy()
            call(xi, xi)
            np.testing.assert_array_equal(xi, want)
    finally:
        C._set_tuning(-1, old)


def _line_aligned(shape, dtype, off=0):
    """A zeroed array of `shape` starting `off` elements past a 64-byte line."""
    size = int(np.prod(shape))
    buf = np.zeros(size + 64 + off, dtype)
    start = (-buf.ctypes.data % 64) // buf.itemsize + off
    return buf[start:start + size].reshape(shape)


@pytest.mark.parametrize("n", [16, 48, 1040, 2064, 4096])
@pytest.mark.parametrize("scale,masked", [(None, False), (0.3, False), (0.3, True), (0.3, "causal")],
                         ids=["softmax", "tex_scaled", "tex_masked", "tex_causal"])
def test_softmax_pipelined_rows_match_rows_alone(C, n, scale, masked):
    """fp32 softmax (and TE's plain scaled softmax) with x and y on line boundaries takes row
    r+1's exp pass inside row r's write (softmax.cpp softmax_rows_pipelined, ExpSteps; a second
    scratch row): every row bitwise what the unpipelined form (softmax_row, which x off a line
    takes) gives, streaming stores forced and not, y off a line (the unpipelined form again), in
    place; rows that run their exp pass twice (a max far above the first 256 logits, +Inf, NaN)
    between pipelined ones, widths that end 1024-element blocks mid-pair, and an all -Inf row
    (NaN, as the float64 formula); TE's masked form with a fully masked row (zeros) between;
    TE's causal form (row r: its first r + coff + 1 logits, zeros after) over an offset that
    gives rows of no column (zeros), of one, of lengths ending mid-vector and of the whole row."""
    mask = np.random.default_rng(n).random((9, n)) < 0.3
    mask[6] = True                   # every element masked: zeros
    mask[8] = False
    mask[2, -1] = mask[3, n // 2] = mask[4, 1] = False   # the 60, +Inf and NaN count
    mask = mask.astype(np.uint8)
    # causal: 9 rows of one sequence, row r's columns j <= r + coff: narrow widths from two empty
    # rows (zeros) up, wide ones from rows ending mid-vector (n - 6 ..) to whole rows (the last 3)
    coff = -2 if n < 64 else n - 7
    lens = np.clip(np.arange(9) + coff + 1, 0, n)
    if masked == "causal":
        def call(a, out=None, rows=slice(None)):
            out = np.empty_like(a) if out is None else out
            r0 = range(9)[rows][0]   # row r alone: the first of its call, limit r0 + coff
            C.tex_softmax(a, out, scale, 2, None, 1, len(a), r0 + coff)
            return out
    elif masked:
        def call(a, out=None, rows=slice(None)):
            out = np.empty_like(a) if out is None else out
            m = np.ascontiguousarray(mask[rows])
            C.tex_softmax(a, out, scale, 1, m, 1, len(m))
            return out
    elif scale is None:
        def call(a, out=None):
            return C.softmax(a, out)
    else:
        def call(a, out=None):
            out = np.empty_like(a) if out is None else out
            C.tex_softmax(a, out, scale, 0)
            return out
    rng = np.random.default_rng(11)
    v = rng.standard_normal((9, n)) * 4
    v[2, -1 if masked != "causal" else lens[2] - 1] = 60.0   # far above the head's shift: the exp pass again
    v[3, n // 2] = np.inf            # NaN row
    v[4, 1] = np.nan                 # NaN row
    v[5] -= 1e4                      # far below zero, e^(x - c) still well scaled
    v[7] = -np.inf                   # all -Inf: NaN row
    x = _line_aligned(v.shape, np.float32)
    x[...] = v
    xo = _line_aligned(v.shape, np.float32, off=4)   # off a line: softmax_row's loop
    xo[...] = v
    want = call(xo)
    alone = [call(x[i:i + 1], rows=slice(i, i + 1)) if masked else call(x[i:i + 1]) for i in range(len(x))]
    np.testing.assert_array_equal(np.concatenate(alone), want)
    z = (x * np.float32(scale or 1.0)).astype(np.float64)   # the logits as fp32 products, as TE's
    if masked == "causal":
        for r, ln in enumerate(lens):
            assert not want[r, ln:].any()
            if ln:
                with np.errstate(all="ignore"):
                    exp = ref.softmax(z[r:r + 1, :ln])
                if np.isnan(exp).any():
                    assert np.isnan(want[r, :ln]).all(), r
                else:
                    check(want[r:r + 1, :ln], exp, "float32")
    else:
        if masked:
            z[mask.astype(bool)] = -10000.0
        ok = np.r_[0:3, 5, 8] if masked else np.r_[0:3, 5, 6, 8]
        with np.errstate(all="ignore"):
            check(want[ok], ref.softmax(z[ok]), "float32")
        if masked:   # every element masked; all -Inf with masked ones: max -10000, TE's zeros
            assert not want[[6, 7]].any()
        assert np.isnan(want[[3, 4] if masked else [3, 4, 7]]).all()
    old = C.build_info()["nontemporal_threshold_bytes"]
    try:
        for threshold in (0, old):
            C._set_tuning(-1, threshold)
            for off in (0, 4):
                y = _line_aligned(v.shape, np.float32, off)
                assert call(x, y) is y
                np.testing.assert_array_equal(y, want, err_msg=f"out at +{off}, threshold {threshold}")
            xi = _line_aligned(v.shape, np.float32)
            xi[...] = v
            call(xi, xi)
            np.testing.assert_array_equal(xi, want)
    finally:
        C._set_tuning(-1, old)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [7, 203, 2100])
@pytest.mark.parametrize("layer", [False, True], ids=["add_rms_norm", "add_layer_norm"])
def test_fused_adds_pipelined_match_rows_alone(C, dt, n, layer):
    """The fused adds take row r+1's add and sum inside row r's write (norm.cpp add_next, a
    second scratch row): both outputs of every row bitwise those of the row passed alone, at
    every output placement, streaming stores forced and not, in place (vLLM's form: row r+1 is
    read before row r+1 is written), with a row redone in double (its squares overflow fp32)
    and one holding inf between pipelined rows."""
    rng = np.random.default_rng(6)
    v = rng.standard_normal((8, n)) * 3 + 1
    if dt != "float16":
        v[2, :2] = (1e20, -3e19)
    v[4, :64] += 40
    v[6, n // 2] = np.inf
    x, _, kw = as_dtype(v, dt)
    r, _, _ = as_dtype(rng.standard_normal((8, n)), dt)
    w, _, _ = as_dtype(rng.standard_normal(n), dt)
    b, _, _ = as_dtype(rng.standard_normal(n), dt)

    call = _fused_add_call(C, layer, w, b, kw)
    alone = [call(x[i:i + 1], r[i:i + 1]) for i in range(len(x))]
    want_y = np.concatenate([a[0] for a in alone])
    want_s = np.concatenate([a[1] for a in alone])
    _check_fused_add_placements(C, call, x, r, want_y, want_s, [(0, 0), (1, 1), (8, 8), (16, 16), (3, 0)])


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [1, 17, 33, 1040, 4099])
def test_softmax_bwd_pipelined_rows_match_rows_alone(C, dt, n):
    """TE's softmax backward takes row r+1's dot inside row r's write (softmax.cpp RowDot): every
    row bitwise what the row passed alone gives (its dot taken on its own), streaming stores
    forced and not, out at four placements, in place on dy and on y (row r+1 read before it is
    written), with a NaN row and an Inf row between; the finite rows against the float64
    formula dx = scale * y * (dy - sum(dy * y))."""
    rng = np.random.default_rng(n)
    yv = rng.random((7, n)) / n
    dv = rng.standard_normal((7, n))
    dv[2, n // 2] = np.nan
    dv[4, 0] = np.inf
    y, y64, kw = as_dtype(yv, dt)
    dy, d64, _ = as_dtype(dv, dt)

    def call(a, b, out=None):
        out = np.empty_like(a) if out is None else out
        C.tex_softmax_bwd(a, b, out, 0.5, **kw)
        return out

    want = np.concatenate([call(dy[i:i + 1], y[i:i + 1]) for i in range(len(dy))])
    ok = [0, 1, 3, 5, 6]
    with np.errstate(invalid="ignore"):   # the Inf row's inf - inf
        exp = 0.5 * y64 * (d64 - (d64 * y64).sum(axis=1, keepdims=True))
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dt]
    np.testing.assert_allclose(value(want, dt)[ok], exp[ok], rtol=tol, atol=tol * np.abs(exp[ok]).max())
    assert np.isnan(value(want, dt)[2]).all()
    old = C.build_info()["nontemporal_threshold_bytes"]
    try:
        for threshold in (0, old):
            C._set_tuning(-1, threshold)
            for off in (0, 1, 8, 16):
                out = _line_aligned(dy.shape, dy.dtype, off)
                assert call(dy, y, out) is out
                np.testing.assert_array_equal(out, want, err_msg=f"out at +{off}, threshold {threshold}")
            a, b = dy.copy(), y.copy()
            call(a, b, a)
            np.testing.assert_array_equal(a, want)
            a, b = dy.copy(), y.copy()
            call(a, b, b)
            np.testing.assert_array_equal(b, want)
    finally:
        C._set_tuning(-1, old)


def test_empty_inputs_return_at_once(C):
    for shape in [(0, 8), (3, 0), (0,)]:
        x = np.empty(shape, np.float32)
        assert C.silu(x).shape == shape
        assert C.softmax(x).shape == shape
    assert C.rms_norm(np.empty((0, 8), np.float32), np.ones(8, np.float32), 1e-6).shape == (0, 8)
    assert C.l2norm_sq(np.empty(0, np.float32)) == 0.0


def test_rows_of_length_one(C):
    x = np.array([[3.0], [-2.0], [0.0]], np.float32)
    w = np.array([2.0], np.float32)
    np.testing.assert_allclose(C.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), rtol=1e-6)
    np.testing.assert_allclose(C.softmax(x), np.ones((3, 1)))
    np.testing.assert_allclose(C.layer_norm(x, w, None, 1e-5), np.zeros((3, 1)))


def test_very_long_row(C):
    n = 1 << 24
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, n), dtype=np.float32)
    w = np.ones(n, np.float32)
    x64 = x.astype(np.float64)
    got = C.rms_norm(x, w, 1e-6)
    want = x64 / math.sqrt(float((x64 * x64).mean()) + 1e-6)
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=3e-6)
    sm = C.softmax(x)
    np.testing.assert_allclose(sm.sum(dtype=np.float64), 1.0, rtol=1e-5)
    np.testing.assert_allclose(sm[0, :1000], ref.softmax(x64)[0, :1000], rtol=1e-5, atol=0)
    np.testing.assert_allclose(C.silu(x)[0, ::4099], ref.silu(x64[0, ::4099]), rtol=2e-6, atol=2e-6)
    ln = C.layer_norm(x, w, None, 1e-5)
    np.testing.assert_allclose(ln[0, ::4099], ref.layer_norm(x64, w, None, 1e-5)[0, ::4099], rtol=3e-6, atol=3e-6)


def test_fp16_nan_inf(C):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, -65504.0, 1e-7, 3.0]], np.float16)
    xv = x.astype(np.float64)
    with np.errstate(all="ignore"):
        for got, want in [(C.silu(x), ref.silu(xv)), (C.relu(x), ref.relu(xv)),
                          (C.gelu(x, "none"), ref.gelu(xv)), (C.gelu(x, "tanh"), ref.gelu(xv, "tanh"))]:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float16).astype(np.float64),
                                       rtol=1e-3, atol=1e-3, equal_nan=True)
    # a NaN or +Inf anywhere in a softmax row makes the row NaN (as the float64 formula does)
    sm = C.softmax(np.array([[1.0, np.nan, 2.0], [1.0, np.inf, 2.0], [1.0, 2.0, 3.0]], np.float16))
    assert np.isnan(sm[:2]).all() and np.isfinite(sm[2]).all()


def test_softmax_masked_entries_are_exact_zeros(C):
    for dt in (np.float32, np.float16):
        x = np.array([[0.0, -np.inf, 1.0, -np.inf] * 5], dt)
        y = C.softmax(x)
        assert (y[0, 1::2] == 0).all()
        np.testing.assert_allclose(y[0, 0::2], ref.softmax(x.astype(np.float64))[0, 0::2], rtol=1e-3)
    big = np.array([[-100.0, 100.0, -1e30, 1e30]], np.float32)
    np.testing.assert_array_equal(C.silu(big), np.array([[-0.0, 100.0, -0.0, 1e30]], np.float32))


@pytest.mark.parametrize("n", [37, 4096], ids=lambda n: f"n{n}")
def test_softmax_fp16_exp_twice_is_bitwise_the_stored_form(C, n):
    """The AVX-512 fp16 softmax's two forms (exp computed again in the write pass, or stored in
    the scratch row and read back; chosen at import by the CPU's vendor: stored on AMD,
    build_info()["softmax_exp_twice"]) give the same bits, for the facade and
    for TE's scaled softmax, with cached and streaming stores. Elsewhere the flag changes no
    kernel and the two runs are one form twice."""
    info = C.build_info()
    if not info["selected_isa"].startswith("avx512"):
        pytest.skip(f"only the AVX-512 variants have the two forms; this one is {info['selected_isa']}")
    assert info["softmax_exp_twice"] == (not info["cpu_supports"]["vendor_amd"])
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((9, n)) * 4).astype(np.float16)
    x[2, 3] = np.inf
    x[4, :] = -np.inf
    x[5, 1] = 60000
    old = (info["parallel_threshold_bytes"], info["nontemporal_threshold_bytes"], int(info["softmax_exp_twice"]))
    try:
        got = {}
        for nt in (-1, 0):
            for twice in (0, 1):
                C._set_tuning(-1, nt, twice)
                assert C.build_info()["softmax_exp_twice"] == bool(twice)
                tex = np.empty_like(x)
                C.tex_softmax(x, tex, 0.5, 0)
                got[nt, twice] = (C.softmax(x).view(np.uint16), tex.view(np.uint16))
        base = got[-1, 0]
        for k, (y, t) in got.items():
            np.testing.assert_array_equal(y, base[0], err_msg=str(k))
            np.testing.assert_array_equal(t, base[1], err_msg=str(k))
        np.testing.assert_allclose(C.softmax(x)[[0, 1, 3]].astype(np.float64),
                                   ref.softmax(x[[0, 1, 3]].astype(np.float64)), rtol=2e-3, atol=1e-4)
    finally:
        C._set_tuning(*old)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(3, 37), (70, 4096)], ids=lambda s: "x".join(map(str, s)))
def test_norm_16bit_weights_read_either_way_are_bitwise_equal(C, dt, shape):
    """The norms read a 16-bit weight (and bias) as 16-bit data or as an fp32 copy, chosen at
    import from the CPU (build_info()["norm_weights_16bit"]; bind_facade.cpp NormParams); the
    widening is exact, so every norm and fused add gives the same bits either way, single- and
    multi-threaded (the larger shape splits rows over the threads and streams its stores)."""
    info = C.build_info()
    cpu = info["cpu_supports"]
    assert info["norm_weights_16bit"] == (not cpu["splits_512"] and not cpu["halves_256"])
    rng = np.random.default_rng(shape[1])
    kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}

    def arr(*sh, scale=1.0):
        v = (rng.standard_normal(sh) * scale + (0.5 if len(sh) == 1 else 0)).astype(np.float32)
        return bf16_bits(v) if dt == "bfloat16" else v.astype(dt)

    x, r, w, b = arr(*shape), arr(*shape), arr(shape[1]), arr(shape[1], scale=0.1)
    calls = {
        "rms_norm": lambda: (C.rms_norm(x, w, 1e-6, **kw),),
        "layer_norm": lambda: (C.layer_norm(x, w, b, 1e-5, **kw),),
        "layer_norm_nobias": lambda: (C.layer_norm(x, w, None, 1e-5, **kw),),
        "add_rms_norm": lambda: C.add_rms_norm(x, r, w, 1e-6, **kw),
        "add_layer_norm": lambda: C.add_layer_norm(x, r, w, b, 1e-5, **kw),
    }
    old = (info["nontemporal_threshold_bytes"], int(info["norm_weights_16bit"]))
    try:
        got = {}
        for w16 in (0, 1):
            C._set_tuning(nontemporal_threshold_bytes=0 if shape[0] > 8 else -1, norm_w16=w16)
            assert C.build_info()["norm_weights_16bit"] == bool(w16)
            got[w16] = {k: [np.array(a).view(np.uint16) for a in f()] for k, f in calls.items()}
        for k in calls:
            for a0, a1 in zip(got[0][k], got[1][k]):
                np.testing.assert_array_equal(a0, a1, err_msg=k)
    finally:
        C._set_tuning(nontemporal_threshold_bytes=old[0], norm_w16=old[1])
    xv = bf16_float(x) if dt == "bfloat16" else x
    wv = bf16_float(w) if dt == "bfloat16" else w
    y = got[0]["rms_norm"][0]
    want = ref.rms_norm(xv.astype(np.float64), wv.astype(np.float64), 1e-6)
    check(y if dt == "bfloat16" else y.view(np.float16), want, dt)


def test_softmax_exp_across_the_exponent_range(C):
    """Each e^(x - max) relative to float64 across fp32's exponent range: the polynomial's
    error (<= 2.3e-7 on every ISA's route) plus the argument's rounding, |x - max| * 6e-8,
    twice over as margin. Where the exact result is below 1e-36, within 2e-38 of it (AVX2 and
    scalar flush e^(x - max) to 0 below ~1e-38, AVX-512 keeps subnormals); -Inf, -1e30 and
    -150 below the max exactly 0 on every route."""
    x = np.concatenate([np.linspace(-104.0, 0.0, 4099), [-np.inf, -1e30, -150.0]]).astype(np.float32)[None, :]
    y = C.softmax(x)[0].astype(np.float64)
    xv = x[0].astype(np.float64)
    want = ref.softmax(x.astype(np.float64))[0]
    normal = want > 1e-36
    tol = 5e-7 + 1.2e-7 * np.abs(xv[normal])
    assert (np.abs(y[normal] / want[normal] - 1) <= tol).all(), np.max(np.abs(y[normal] / want[normal] - 1) / tol)
    assert (np.abs(y[~normal] - want[~normal]) <= 2e-38 + 1e-6 * want[~normal]).all()
    assert (y[-3:] == 0).all()  # -Inf, -1e30 and -150 below the max: exactly 0
    assert abs(y.sum() - 1) < 1e-6


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_shift_from_the_first_lanes(C, dt):
    """softmax_row shifts every exp by the max of the row's first 256 logits and finds the
    row's max in the same pass; a row whose max lies more than 12 above that shift (or is NaN
    or Inf) has its exp pass run again shifted by its max. Rows on both sides of the bound,
    the max past lane 256 (11.5, 12.5 and 100 above the first lanes'), a late +Inf or NaN,
    first lanes at -Inf, against float64, for the facade's softmax and TE's scaled one (scale
    0.5, the bound then applies to x * 0.5). Without the second pass the 100 row overflows."""
    rng = np.random.default_rng(7)
    n = 1000
    x0 = rng.uniform(-1.0, 1.0, (8, n))
    x0[0, 700] = 11.5   # within the bound: the first pass's shift stands
    x0[1, 700] = 12.5   # just past it: shifted again by the row's max
    x0[2, 999] = 100.0  # e^99 overflows fp32 unless shifted by the max
    x0[3, 300] = np.inf
    x0[4, 300] = np.nan
    x0[5, :256] = -np.inf  # the shift itself is -Inf
    x0[6, :] = -np.inf     # every logit -Inf: NaN, as float64 (-Inf - -Inf)
    x0[7, 256:] += 40.0    # the whole rest of the row far above the first lanes
    x, xv, kw = as_dtype(x0, dt)
    with np.errstate(invalid="ignore"):
        check(C.softmax(x, None, **kw), ref.softmax(xv), dt)
        out = np.empty_like(x)
        C.tex_softmax(x, out, 0.5, 0, **kw)
        check(out, ref.softmax(xv * 0.5), dt)


def test_fp16_overflow_to_inf_and_subnormals(C):
    with np.errstate(over="ignore"):
        xh = np.array([[70000.0, -70000.0, 1e-6, -3e-7, 6e-5]], np.float32).astype(np.float16)
    assert np.isposinf(C.relu(np.array([[np.float16(np.inf)]])))[0, 0]
    np.testing.assert_array_equal(C.relu(xh), np.maximum(xh, 0))
    # float32 -> float16 stores round to nearest even, overflow to Inf, keep subnormals
    x = np.array([70000.0, -70000.0, 65519.0, 65520.0, 1e-6, -3e-7, 6e-5, 2.0 ** -25, 1.5 * 2.0 ** -24], np.float32)
    out = np.empty(x.size, np.float16)
    C.scale(x, out, 1.0)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, x.astype(np.float16))


# ---------------------------------------------------------------------------- math accuracy
def _ulp_err(got32, want64):
    want32 = want64.astype(np.float32)
    spacing = np.spacing(np.abs(want32)).astype(np.float64)
    spacing[spacing == 0] = np.float64(np.float32(2.0 ** -149))
    return np.abs(got32.astype(np.float64) - want64) / spacing


def test_exp_within_4_ulp_over_fp32_range(C):
    x = np.concatenate([np.linspace(-104.0, 88.72, 2_000_003), np.linspace(-2, 2, 100_001),
                        np.array([-87.3, -100.0, -103.9, 88.7, 88.72, 0.0])]).astype(np.float32)
    got = C._exp(x)
    want = np.exp(x.astype(np.float64))
    err = _ulp_err(got, want)
    assert err.max() <= 4.0, f"max {err.max():.2f} ulp at x={x[err.argmax()]!r}"
    specials = np.array([np.inf, -np.inf, np.nan, 89.0, -200.0], np.float32)
    s = C._exp(specials)
    assert np.isposinf(s[0]) and s[1] == 0 and np.isnan(s[2]) and np.isposinf(s[3]) and s[4] == 0


def test_gelu_erf_within_10_eps_absolute(C):
    from scipy.special import erf
    x = np.linspace(-12, 12, 1_000_001).astype(np.float32)
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))
    err = np.abs(C.gelu(x, "none").astype(np.float64) - want) / np.maximum(1.0, np.abs(want))
    eps = float(np.finfo(np.float32).eps)
    assert err.max() <= 10 * eps, f"{err.max() / eps:.2f} eps at x={x[err.argmax()]}"


def test_gelu_erf_fp32_sign_and_saturation(C):
    """The fp32 form's erf is a rational whose last bit differs by variant (the scalar build
    rounds a*b + c twice; vmath.h vgelu_erf): its clamps must still give gelu(x) = x exactly
    from 4 sqrt2 up and -0 from -6 down (torch's and the float64 formula's signed zero), and
    its overshoot of |erf| = 1 between 4 and 6 must not turn a negative x's result positive
    (the former form did at 5942 of these points). Run under every variant by the subprocess
    test below."""
    top = np.float32(4 * np.sqrt(2))                # the kernel's upper clamp, as fp32
    x = np.concatenate([np.linspace(-8, 8, 4_000_001, dtype=np.float32),
                        np.array([-np.inf, -3.4e38, -65504, -1e4, -6, -0.0, 0.0, top, 6, 1e4, 65504,
                                  3.4e38, np.inf], np.float32)])
    y = C.gelu(x, "none")
    neg = x < 0
    assert not (y[neg] > 0).any(), f"positive gelu at x={x[neg][y[neg] > 0][:5]}"
    sat = x <= -6
    assert (y[sat & np.isfinite(x)] == 0).all() and np.signbit(y[sat & np.isfinite(x)]).all()
    assert np.isnan(y[x == -np.inf]).all()          # -inf * 0, as the float64 formula gives
    up = x >= top
    assert (y[up] == x[up]).all(), f"gelu(x) != x at x={x[up][y[up] != x[up]][:5]}"
    assert np.signbit(y[(x == 0) & np.signbit(x)]).all() and not np.signbit(y[(x == 0) & ~np.signbit(x)]).any()


def every_16bit(dt, keep):
    """Every 16-bit value of dt for which keep(value as float64) holds: (the kernel's input,
    its float64 values, the dtype keyword)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore"):
        x64 = bf16_float(bits).astype(np.float64) if dt == "bfloat16" else bits.view(np.float16).astype(np.float64)
    k = keep(x64)
    xin = bits[k] if dt == "bfloat16" else bits.view(np.float16)[k]
    return xin, x64[k], ({"dtype": "bfloat16"} if dt == "bfloat16" else {})


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_gelu_erf_16bit_every_value(C, dt):
    """Every finite 16-bit x. AVX-512 runs the 16-bit form (vmath.h vgelu_erf<LP>: Phi from
    2^P(|x|), relative in the negative tail): within 1 ulp of the exact value where |y| >=
    1e-5 and 5e-8 absolute below. The other ISAs round the fp32 form, whose 1 + erf cancels
    in the tail: an ulp plus its 10 fp32 eps absolute (test above)."""
    from scipy.special import ndtr
    from tensor_ops.backends import cpp
    xin, x64, kw = every_16bit(dt, np.isfinite)
    want = x64 * ndtr(x64)
    got = value(C.gelu(xin, "none", None, **kw), dt)
    # the 16-bit spacing at |want|: 2^(e - mantissa bits), subnormal steps below the normal range
    mant, emin = (10, -14) if dt == "float16" else (7, -126)
    e = np.floor(np.log2(np.maximum(np.abs(want), 2.0 ** emin)))
    ulp = 2.0 ** (e - mant)
    err = np.abs(got - want)
    if cpp.get_optimization_info()["selected_isa"].startswith("avx512"):
        big = np.abs(want) >= 1e-5
        assert (err[big] / ulp[big]).max() <= 1.0, f"x={x64[big][np.argmax(err[big] / ulp[big])]}"
        assert err[~big].max() <= 5e-8, f"x={x64[~big][np.argmax(err[~big])]}"
    else:
        bound = ulp + 10 * float(np.finfo(np.float32).eps) * np.maximum(1.0, np.abs(want))
        assert (err / bound).max() <= 1.0, f"x={x64[np.argmax(err / bound)]}"


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["silu", "gelu_tanh"])
def test_sigmoid_forms_16bit_every_value(C, dt, op):
    """Every finite 16-bit x through silu and tanh-GELU, on whatever ISA runs: AVX-512 and
    AVX2 take the 16-bit forms (vmath.h vdiv_1p_exp2<LP>: 2^v of degree 3, and on AVX-512 a
    reciprocal estimate), the scalar variant the fp32 form. Within 1 ulp of the exact value
    where |y| >= 1e-5 (0.65 measured on AVX2, 0.50 with the fp32 form), 5e-8 absolute below;
    NaN exactly where the float64 formula gives NaN."""
    xin, x, kw = every_16bit(dt, lambda v: ~np.isnan(v))
    with np.errstate(all="ignore"):
        if op == "silu":
            want = x / (1 + np.exp(-x))
            got = value(C.silu(xin, None, **kw), dt)
        else:
            want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
            want[np.isneginf(x)] = np.nan  # -Inf / (1 + e^Inf), as silu(-Inf)
            got = value(C.gelu(xin, "tanh", None, **kw), dt)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)])
    got, want, x = got[fin], want[fin], x[fin]
    mant, emin = (10, -14) if dt == "float16" else (7, -126)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0 ** emin))) - mant)
    err = np.abs(got - want)
    big = np.abs(want) >= 1e-5
    assert (err[big] / ulp[big]).max() <= 1.0, f"x={x[big][np.argmax(err[big] / ulp[big])]}"
    assert err[~big].max() <= 5e-8, f"x={x[~big][np.argmax(err[~big])]}"


def test_gelu_tanh_and_tanh_accuracy(C):
    x = np.linspace(-20, 20, 1_000_001).astype(np.float32)
    x64 = x.astype(np.float64)
    eps = float(np.finfo(np.float32).eps)
    want = ref.gelu(x64, "tanh")
    err = np.abs(C.gelu(x, "tanh").astype(np.float64) - want) / np.maximum(1.0, np.abs(want))
    assert err.max() <= 10 * eps
    t = C._tanh(x)
    assert _ulp_err(t, np.tanh(x64)).max() <= 4.0
    np.testing.assert_array_equal(C._tanh(np.array([np.inf, -np.inf, 0.0], np.float32)), [1.0, -1.0, 0.0])


# ---------------------------------------------------------------------------- bfloat16
def test_bf16_uint16_and_int16_views(C):
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((4, 37)).astype(np.float32)
    w0 = rng.standard_normal(37).astype(np.float32)
    xb, wb = bf16_bits(x0), bf16_bits(w0)
    want = ref.rms_norm(bf16_float(xb), bf16_float(wb), 1e-6)
    for view in (np.uint16, np.int16):
        y = C.rms_norm(xb.view(view), wb.view(view), 1e-6, None, dtype="bfloat16")
        assert y.dtype == view and y.shape == x0.shape
        check(y.view(np.uint16), want, "bfloat16", 4)
    with pytest.raises(TypeError, match="bfloat16"):
        C.rms_norm(xb, wb, 1e-6)  # uint16 without dtype="bfloat16" is refused


def test_bf16_matches_torch(C):
    torch = pytest.importorskip("torch")
    t = torch.randn(8, 70, dtype=torch.bfloat16)
    x = t.view(torch.int16).numpy()
    y = C.silu(x, None, dtype="bfloat16")
    want = torch.nn.functional.silu(t.float()).to(torch.bfloat16)
    got = torch.from_numpy(y).view(torch.bfloat16)
    assert torch.equal(got, want) or (got.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
    # rounding of the bfloat16 store is round-to-nearest-even like torch's
    v = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -3.3e38, 1e-40], dtype=torch.float32)
    bits = C.scale(v.numpy(), np.empty(4, np.uint16), 1.0, dtype="bfloat16")
    assert bits is False


def test_bf16_stores_round_every_kind_of_float(C):
    """Every kernel's bfloat16 store is simd.h bf16_pack (AVX2: integer round-to-nearest-even,
    the high halves gathered by one byte shuffle): random bit patterns of every class, ties
    either way, the largest finite values (rounding to Inf), subnormals, NaNs whose payload
    is only in the low half (must stay NaN, quiet, sign kept), through scale (x * 1.0),
    against the rounding rule itself; at lengths that leave partial vectors. The
    avx512bf16 variant's vcvtneps2bf16 flushes subnormal inputs to zero (simd.h), so those
    are left out there."""
    rng = np.random.default_rng(23)
    u = rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF808000, 0xBF818000,
                        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000,
                        0x807FFFFF, 0x00000001, 0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001,
                        0x7FC00000, 0x7F80FFFF, 0xFFFFFFFF, 0x00000000, 0x80000000], np.uint32)
    x = np.concatenate([special, u]).view(np.float32)
    if C.ISA == "avx512bf16":
        x = x[~((np.abs(x) < np.float32(2.0 ** -126)) & (x != 0))]
    want = bf16_bits(x)
    for n in (x.size, 1001, 7):
        out = np.empty(n, np.uint16)
        C.scale(x[:n], out, 1.0, dtype="bfloat16")
        np.testing.assert_array_equal(out, want[:n])


# ---------------------------------------------------------------------------- refusals
def test_binding_refuses_what_it_cannot_handle(C):
    x = np.ones((4, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="float64"):
        C.rms_norm(x.astype(np.float64), w.astype(np.float64), 1e-6)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        C.silu([[1.0, 2.0]])
    with pytest.raises(TypeError, match="weight"):
        C.rms_norm(x, w.astype(np.float16), 1e-6)
    with pytest.raises(ValueError, match="C-contiguous"):
        C.silu(np.ones((8, 8), np.float32)[:, ::2])
    mis = np.frombuffer(bytearray(4 * 33), np.uint8)[1:129].view(np.float32)  # 1-byte offset
    assert not mis.flags.aligned
    with pytest.raises(ValueError, match="aligned"):
        C.silu(mis)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        C.silu(x, ro)
    with pytest.raises(ValueError, match="shape"):
        C.silu(x, np.empty((4, 9), np.float32))
    with pytest.raises(TypeError, match="out"):
        C.silu(x, np.empty((4, 8), np.float16))
    with pytest.raises(ValueError, match="last axis"):
        C.rms_norm(x, np.ones(7, np.float32), 1e-6)
    with pytest.raises(ValueError, match="even"):
        C.swiglu(np.ones((2, 5), np.float32))
    with pytest.raises(ValueError, match="approximate"):
        C.gelu(x, "fast")
    with pytest.raises(ValueError, match="cos"):
        C.rope(x, np.ones((3, 6), np.float32), np.ones((3, 6), np.float32))
    with pytest.raises(TypeError, match="cos"):
        C.rope(x, np.ones((3, 8), np.float64), np.ones((3, 8), np.float64))
    with pytest.raises(ValueError, match="dtype"):
        C.silu(x, dtype="int8")
    with pytest.raises(ValueError, match="byte order"):
        C.silu(x.astype(">f4"))
    with pytest.raises(ValueError, match="rsigma"):
        C.rms_norm(x, w, 1e-6, rsigma=np.empty(3, np.float32))


# ---------------------------------------------------------------------------- threads
def test_threads_give_identical_results(C):
    x = np.random.default_rng(9).standard_normal((512, 1000)).astype(np.float32)
    w = np.ones(1000, np.float32)
    nt = C.get_num_threads()
    try:
        C.set_num_threads(1)
        one = [C.rms_norm(x, w, 1e-6), C.silu(x), C.softmax(x), C.l2norm_sq(x)]
        C.set_num_threads(2)
        two = [C.rms_norm(x, w, 1e-6), C.silu(x), C.softmax(x), C.l2norm_sq(x)]
    finally:
        C.set_num_threads(nt)
    for a, b in zip(one[:3], two[:3]):
        np.testing.assert_array_equal(a, b)
    assert one[3] == pytest.approx(two[3], rel=1e-12)
    with pytest.raises(ValueError):
        C.set_num_threads(0)


def test_concurrent_python_threads(C):
    """The GIL is released in kernels: several Python threads may call at once."""
    x = np.random.default_rng(10).standard_normal((256, 512)).astype(np.float32)
    want = C.silu(x)
    errors = []

    def work():
        for _ in range(20):
            if not np.array_equal(C.silu(x), want):
                errors.append("mismatch")

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


# ---------------------------------------------------------------------------- stream_copy
def _bytes_view(buf: np.ndarray, offset: int, n: int) -> np.ndarray:
    """n bytes of buf starting `offset` bytes past a 64-byte boundary (a misaligned view)."""
    start = (-buf.ctypes.data) % 64 + offset
    return buf[start:start + n]


# 0, 1, 63 (all head/tail, no vector), 4097 and odd sizes (a body with a tail), 3 MiB + 5
# (above the threading threshold: pieces on 2 threads); pages 4 and 3: blocks of pages copied
# a piece of each in turn (100_003 B holds whole blocks and a linear tail)
@pytest.mark.parametrize("pages", [1, 3, 4], ids=lambda p: f"pages{p}")
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 129, 4097, 100_003, (3 << 20) + 5],
                         ids=lambda n: f"{n}B")
@pytest.mark.parametrize("src_off,dst_off", [(0, 0), (1, 0), (0, 1), (3, 7), (13, 13)],
                         ids=["aligned", "src+1", "dst+1", "src+3,dst+7", "both+13"])
def test_stream_copy_bytes(C, n, src_off, dst_off, pages):
    rng = np.random.default_rng(n + 31 * src_off + dst_off)
    sbuf = rng.integers(0, 256, n + 128, dtype=np.uint8)
    dbuf = np.zeros(n + 128, np.uint8)
    src, dst = _bytes_view(sbuf, src_off, n), _bytes_view(dbuf, dst_off, n)
    before = dbuf.copy()
    nt = C.get_num_threads()
    try:
        C.set_num_threads(2)
        assert C.stream_copy(src, dst, pages) is None
    finally:
        C.set_num_threads(nt)
    np.testing.assert_array_equal(dst, src)
    # nothing outside dst was written
    lo = dst.ctypes.data - dbuf.ctypes.data
    np.testing.assert_array_equal(dbuf[:lo], before[:lo])
    np.testing.assert_array_equal(dbuf[lo + n:], before[lo + n:])


def test_stream_copy_any_dtypes_same_nbytes(C):
    x = np.random.default_rng(32).standard_normal((37, 41)).astype(np.float32)
    y = np.empty(x.nbytes, np.uint8)
    C.stream_copy(x, y)
    np.testing.assert_array_equal(y.view(np.float32).reshape(x.shape), x)
    z = np.empty(2 * x.size, np.float16)  # same nbytes, another dtype and shape
    C.stream_copy(x, z)
    assert z.tobytes() == x.tobytes()
    # float32 arrays 1 byte off their itemsize alignment, as src and as dst
    sbuf, dbuf = np.zeros(41, np.uint8), np.zeros(41, np.uint8)
    src = np.frombuffer(sbuf, np.float32, count=10, offset=1)
    dst = np.frombuffer(dbuf, np.float32, count=10, offset=1)
    assert not src.flags.aligned and not dst.flags.aligned
    sbuf[1:] = np.arange(10, dtype=np.float32).view(np.uint8)
    C.stream_copy(src, dst)
    np.testing.assert_array_equal(dst, np.arange(10, dtype=np.float32))
    d = np.zeros((), np.float64)  # 0-d arrays are C-contiguous too
    C.stream_copy(np.array(2.5), d)
    assert d == 2.5


def test_stream_copy_refusals(C):
    a = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match=r"src has 40 bytes but dst has 44 bytes"):
        C.stream_copy(a, np.zeros(11, np.float32))
    with pytest.raises(ValueError, match=r"src has 40 bytes but dst has 20 bytes"):
        C.stream_copy(a, np.zeros(10, np.float16))
    ro = np.zeros(10, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dst is read-only"):
        C.stream_copy(a, ro)
    with pytest.raises(ValueError, match="dst is read-only"):
        C.stream_copy(a, np.broadcast_to(np.zeros(10, np.float32), (10,)))  # read-only view
    C.stream_copy(ro, np.zeros(10, np.float32))  # a read-only src is fine
    with pytest.raises(ValueError, match="src must be C-contiguous"):
        C.stream_copy(np.zeros(20, np.float32)[::2], a)
    with pytest.raises(ValueError, match="dst must be C-contiguous"):
        C.stream_copy(a, np.zeros(20, np.float32)[::2])
    with pytest.raises(TypeError, match="src must be a numpy.ndarray"):
        C.stream_copy(b"x" * 40, a)
    with pytest.raises(TypeError, match="dst has dtype object"):
        C.stream_copy(np.zeros(10, np.int64), np.zeros(10, object))
    x = np.arange(100, dtype=np.float32)
    with pytest.raises(ValueError, match="overlap"):
        C.stream_copy(x[:50], x[25:75])
    C.stream_copy(x, x)  # the very same bytes: nothing to do
    np.testing.assert_array_equal(x, np.arange(100, dtype=np.float32))
    d = np.zeros(10, np.float32)
    for bad in (0, 17, -4):
        with pytest.raises(ValueError, match=rf"pages must be an int in \[1, 16\].*got {bad}"):
            C.stream_copy(a + 1, d, bad)
        assert not d.any()  # refused before a byte was written


# ---------------------------------------------------------------------------- tex kernels
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zero_centered"])
def test_norm_stats_and_backward(C, dt, zc):
    rng = np.random.default_rng(11)
    rows, n = 6, 45
    x, xv, kw = as_dtype(rng.standard_normal((rows, n)) * 1.5 + 0.3, dt)
    g, gv, _ = as_dtype(rng.standard_normal(n) * 0.5, dt)
    b, bv, _ = as_dtype(rng.standard_normal(n), dt)
    dz, dzv, _ = as_dtype(rng.standard_normal((rows, n)), dt)
    ge = gv + 1.0 if zc else gv

    rs = np.empty(rows, np.float32)
    y = C.rms_norm(x, g, 1e-5, None, rsigma=rs, zero_centered_gamma=zc, **kw)
    want_rs = 1.0 / np.sqrt((xv * xv).mean(-1) + 1e-5)
    np.testing.assert_allclose(rs, want_rs, rtol=2e-6)
    check(y, xv * want_rs[:, None] * ge, dt, 4)
    # backward of y = x * rs * g'
    xh = xv * want_rs[:, None]
    dy = dzv * ge
    dx_want = want_rs[:, None] * (dy - xh * (dy * xh).mean(-1, keepdims=True))
    dx, dg = C.rms_norm_bwd(dz, x, rs, g, None, None, zc, **kw)
    check(dx, dx_want, dt, 4)
    check(dg, (dzv * xh).sum(0), dt, 8)

    mu, rs2 = np.empty(rows, np.float32), np.empty(rows, np.float32)
    y = C.layer_norm(x, g, b, 1e-5, None, mu=mu, rsigma=rs2, zero_centered_gamma=zc, **kw)
    want_mu = xv.mean(-1)
    want_rs2 = 1.0 / np.sqrt(xv.var(-1) + 1e-5)
    np.testing.assert_allclose(mu, want_mu, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(rs2, want_rs2, rtol=2e-6)
    xh = (xv - want_mu[:, None]) * want_rs2[:, None]
    check(y, xh * ge + bv, dt, 4)
    dx_want = want_rs2[:, None] * (dy - dy.mean(-1, keepdims=True) - xh * (dy * xh).mean(-1, keepdims=True))
    dx, dg, db = C.layer_norm_bwd(dz, x, mu, rs2, g, None, None, None, zc, **kw)
    check(dx, dx_want, dt, 4)
    check(dg, (dzv * xh).sum(0), dt, 8)
    check(db, dzv.sum(0), dt, 8)


def test_norm_backward_many_rows_threads(C):
    """dgamma partials per thread reduce to the same sums as a float64 reference."""
    rng = np.random.default_rng(12)
    rows, n = 3000, 96
    x = rng.standard_normal((rows, n)).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    dz = rng.standard_normal((rows, n)).astype(np.float32)
    rs = np.empty(rows, np.float32)
    C.rms_norm(x, g, 1e-6, None, rsigma=rs)
    dx, dg = C.rms_norm_bwd(dz, x, rs, g)
    xh = x.astype(np.float64) * rs[:, None]
    np.testing.assert_allclose(dg, (dz * xh).sum(0), rtol=1e-5, atol=1e-4)


def _adam_ref(g, p, m, v, lr, b1, b2, eps, bc1, bc2, mode, wd):
    # the kernel takes its hyper-parameters as float32, and 1 - beta from the caller's doubles
    # rounded once (as torch.optim does): use the same values
    ob1, ob2 = float(np.float32(1 - b1)), float(np.float32(1 - b2))
    lr, b2, eps, bc1, bc2, wd = (float(np.float32(a)) for a in (lr, b2, eps, bc1, bc2, wd))
    g, p, m, v = (np.asarray(a, np.float64).copy() for a in (g, p, m, v))
    if mode == 0:
        g = g + wd * p
    m = m + ob1 * (g - m)  # torch's lerp
    v = b2 * v + ob2 * g * g
    upd = (m / bc1) / (np.sqrt(v / bc2) + eps)
    p = p - lr * (upd + wd * p) if mode == 1 else p - lr * upd
    return p, m, v


@pytest.mark.parametrize("gdt", DTYPES)
@pytest.mark.parametrize("mode", [0, 1], ids=["L2", "AdamW"])
def test_adam_step(C, gdt, mode):
    rng = np.random.default_rng(13)
    n = 1000 + 7
    g, gv, kw = as_dtype(rng.standard_normal(n), gdt)
    p = rng.standard_normal(n).astype(np.float32)
    m = rng.standard_normal(n).astype(np.float32) * 0.1
    v = rng.random(n).astype(np.float32) * 0.01
    args = (3e-3, 0.9, 0.999, 1e-8, 1 - 0.9 ** 3, 1 - 0.999 ** 3, mode, 0.01)
    pw, mw, vw = _adam_ref(gv, p, m, v, *args)
    C.adam_step(g, p, m, v, *args, **kw)
    np.testing.assert_allclose(p, pw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m, mw, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v, vw, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("pdt", ["float16", "bfloat16"])
def test_adam_step_master_weights(C, pdt):
    rng = np.random.default_rng(14)
    n = 333
    master = rng.standard_normal(n).astype(np.float32)
    p, _, kw = as_dtype(master, pdt)
    g = rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    args = (1e-2, 0.9, 0.999, 1e-8, 0.1, 0.001, 1, 0.0)
    pw, _, _ = _adam_ref(g, master, m, v, *args)
    C.adam_step(g, p, m, v, *args, master=master, **kw)
    np.testing.assert_allclose(master, pw, rtol=1e-5, atol=1e-6)
    check(p, pw.astype(np.float32), pdt)
    # without a master copy, 16-bit params are updated in their own precision (TE's FusedAdam on a
    # bf16 model with master_weights=False): the math reads p as stored
    p16, p64, kw = as_dtype(master, pdt)
    p32 = p64.astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    pw2, _, _ = _adam_ref(g, p32.copy(), m.copy(), v.copy(), *args)
    C.adam_step(g, p16, m, v, *args, **kw)
    check(p16, pw2.astype(np.float32), pdt)


@pytest.mark.parametrize("idt", DTYPES)
@pytest.mark.parametrize("odt", DTYPES)
def test_scale_and_nonfinite_flag(C, idt, odt):
    rng = np.random.default_rng(15)
    x0 = rng.standard_normal(1029)
    x, xv, kw = as_dtype(x0, idt)
    out, _, kw2 = as_dtype(np.zeros(1029), odt)
    kw.update(kw2)
    assert C.scale(x, out, 0.5, **kw) is False
    check(out, xv * 0.5, odt)
    for bad in (np.inf, -np.inf, np.nan):
        x1 = x0.copy()
        x1[1017] = bad
        xb, _, _ = as_dtype(x1, idt)
        assert C.scale(xb, out, 2.0, **kw) is True


def test_scale_in_place(C):
    x = np.arange(10, dtype=np.float32)
    assert C.scale(x, x, 3.0) is False
    np.testing.assert_array_equal(x, np.arange(10) * 3.0)
    with pytest.raises(ValueError, match="overlap"):
        C.scale(x[:8], x[2:], 1.0)


@pytest.mark.parametrize("dt", DTYPES)
def test_l2norm_sq(C, dt):
    rng = np.random.default_rng(16)
    x, xv, kw = as_dtype(rng.standard_normal(300_001), dt)
    assert C.l2norm_sq(x, **kw) == pytest.approx(float((xv * xv).sum()), rel=1e-6)
    x1, _, _ = as_dtype(np.array([1.0, np.inf, 2.0]), dt)
    assert math.isinf(C.l2norm_sq(x1, **kw))


# ---------------------------------------------------------------------------- backend module
def test_get_optimization_info(C):
    from tensor_ops.backends import cpp
    info = cpp.get_optimization_info()
    assert info["available"] is True
    assert info["selected_isa"] in info["compiled_variants"]
    assert "scalar" in info["compiled_variants"]
    assert info["num_threads"] >= 1 and isinstance(info["openmp"], bool)
    assert info["compiler"] and "common" in info["flags"]
    if info["selected_isa"] == "avx2":
        assert "-mavx2" in info["flags"]["avx2"] or "/arch:AVX2" in info["flags"]["avx2"]
    assert "-march=native" not in " ".join(info["flags"].values())
    assert cpp.info()["selected_isa"] == info["selected_isa"]


def test_registered_impls_call_native_functions(C):
    from tensor_ops.backends import cpp
    from tensor_ops._registry import OpRegistry
    reg = OpRegistry()
    cpp.BACKEND.register(reg)
    impls = {i.op_name: i for i in reg.all_impls()}
    assert set(impls) == set(cpp.BACKEND.ops)
    assert cpp.availability()[0]
    assert impls["rms_norm"].fn is C.rms_norm  # bound directly: no Python wrapper per call
    x = np.ones((2, 8), np.float32)
    assert impls["silu"].supports(x, None)
    assert not impls["silu"].supports(x.astype(np.float64), None)
    assert not impls["silu"].supports(x.astype(">f4"), None)
    assert not impls["silu"].supports([[1.0]], None)


def _run_py(code: str, timeout: int = 600, **env):
    return run_python(code, env=env, timeout=timeout)


def test_register_loads_no_native_code():
    r = _run_py("""
        import sys
        from tensor_ops.backends import cpp
        from tensor_ops._registry import OpRegistry
        cpp.BACKEND.register(OpRegistry())
        assert 'tensor_ops._cpp' not in sys.modules, 'native module loaded by register()'
        assert not any(m in sys.modules for m in ('torch', 'cupy', 'pyopencl'))
        print('ok')
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_omp_num_threads_is_respected(C):
    r = _run_py("import tensor_ops._cpp as C; print(C.get_num_threads())", OMP_NUM_THREADS="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_bad_max_isa_is_reported():
    r = _run_py("""
        from tensor_ops.backends import cpp
        ok, reason = cpp.availability()
        print(ok, reason)
    """, TENSOR_OPS_MAX_ISA="sse9")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("False") and "TENSOR_OPS_MAX_ISA" in r.stdout


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "avx512bf16"])
def test_isa_variant_in_subprocess(C, isa):
    """Run this file's kernel tests with the ISA capped (each variant must be exact)."""
    info = C.build_info()
    if isa not in info["compiled_variants"]:
        pytest.skip(f"variant {isa} not compiled here (compiled: {info['compiled_variants']})")
    if isa == "avx2" and not info["cpu_supports"]["avx2_fma_f16c"]:
        pytest.skip("this CPU has no AVX2+FMA+F16C")
    if isa == "avx512" and not info["cpu_supports"]["avx512_f_bw_dq_vl"]:
        pytest.skip("this CPU has no AVX-512 F/BW/DQ/VL")
    if isa == "avx512bf16" and not info["cpu_supports"]["avx512_bf16"]:
        pytest.skip("this CPU has no AVX512_BF16")
    if os.environ.get("TENSOR_OPS_EXPECT_ISA"):
        pytest.skip("already inside an ISA subprocess")
    env = dict(os.environ, TENSOR_OPS_MAX_ISA=isa, TENSOR_OPS_EXPECT_ISA=isa)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
                        "-k", "not subprocess and not very_long_row and not omp_num_threads and not bad_max_isa "
                              "and not loads_no_native"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_expected_isa_selected(C):
    want = os.environ.get("TENSOR_OPS_EXPECT_ISA")
    if not want:
        pytest.skip("only meaningful inside test_isa_variant_in_subprocess")
    assert C.ISA == want


def test_stub_lists_the_module_api(C):
    import re
    stub = os.path.join(ROOT, "tensor_ops", "_cpp.pyi")
    with open(stub) as a:
        text = a.read()
    declared = set(re.findall(r"^def (\w+)\(", text, re.M)) | set(re.findall(r"^(\w+): ", text, re.M))
    public = {n for n in dir(C) if not n.startswith("__")}
    assert public <= declared, f"missing from the stub: {sorted(public - declared)}"


def _params(fn) -> list:
    """(kind, name, default) per parameter of an ast function; default '-' when none."""
    import ast
    a = fn.args
    out = [("posonly", p.arg) for p in a.posonlyargs] + [("pos", p.arg) for p in a.args]
    defaults = ["-"] * (len(out) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    out = [(k, n, d) for (k, n), d in zip(out, defaults)]
    if a.vararg is not None:
        out.append(("var", a.vararg.arg, "-"))
    out += [("kwonly", p.arg, "-" if d is None else ast.literal_eval(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return out


def test_stub_signatures_match_the_bindings(C):
    """What mypy.stubtest cannot check (pybind11 functions have no inspectable signature):
    the parameter names, kinds and defaults of the stub against the signature line pybind11
    writes at the top of each function's __doc__ (and __text_signature__ of the _fast_*)."""
    import ast
    import inspect
    with open(os.path.join(ROOT, "tensor_ops", "_cpp.pyi")) as f:
        stub = {n.name: n for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "posonly", inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
             inspect.Parameter.KEYWORD_ONLY: "kwonly", inspect.Parameter.VAR_POSITIONAL: "var"}
    checked = 0
    for name in sorted(n for n in dir(C) if not n.startswith("__") and callable(getattr(C, n))):
        f = getattr(C, name)
        if getattr(f, "__text_signature__", None):
            sig = inspect.signature(f)
            runtime = [(kinds[p.kind], p.name, "-" if p.default is p.empty else p.default)
                       for p in sig.parameters.values()]
        else:
            line = (f.__doc__ or "").splitlines()[0]
            assert line.startswith(name + "("), f"{name}: no pybind11 signature line in __doc__: {line!r}"
            runtime = _params(ast.parse(f"def {line}: ...").body[0])
        assert _params(stub[name]) == runtime, f"{name}: stub {_params(stub[name])} != runtime {runtime}"
        checked += 1
    assert checked >= 30


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_fork_after_parallel_kernels_does_not_hang(C):
    """libgomp hangs in a child forked after the parent ran a parallel region; the module
    runs such a child single-threaded (and says so) instead. A child forked before any
    parallel region keeps its threads."""
    r = _run_py("""
        import json, os, warnings, numpy as np
        import tensor_ops._cpp as C
        from tensor_ops.backends import cpp

        def in_child(work):
            rd, wr = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(wr, json.dumps(work()).encode())
                os._exit(0)
            os.close(wr)
            got = json.loads(os.read(rd, 65536).decode())
            os.waitpid(pid, 0)
            return got

        def late_child():
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                cpp.set_num_threads(2)
            z = C.silu(x)
            return {"same": bool((z == y).all()), "threads": C.get_num_threads(),
                    "note": C.build_info()["threads_note"], "warned": [str(w.message) for w in rec]}

        C.set_num_threads(2)
        x = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)
        early = in_child(lambda: {"threads": C.get_num_threads(), "sum": float(C.silu(x).sum())})
        y = C.silu(x)                              # 16 MiB: a parallel region in this process
        late = in_child(late_child)
        print(json.dumps({"early": early, "late": late, "parent_threads": C.get_num_threads()}))
    """, timeout=120)   # a hang (the bug this guards against) fails in 2 minutes
    assert r.returncode == 0, r.stderr
    got = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert got["early"]["threads"] == 2 and got["parent_threads"] == 2
    late = got["late"]
    assert late["same"] and late["threads"] == 1 and "forked" in late["note"], late
    assert late["warned"] and "kept 1" in late["warned"][0], late
