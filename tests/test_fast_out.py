"""out= on the native plain-call entries (``_state.fast_out_fns``).

A facade call with ``out=`` and no ``backend=`` goes to the cpp entry with ``out`` appended
(``cpp_ext/fast_entry.cpp``); the entry takes it only when it is exactly an ndarray (or a torch
CPU tensor, through its view) of the result's shape and dtype, C-contiguous, aligned,
writeable and sharing no byte with an input, and writes it and returns it. Anything else is
declined **before anything is written**, and the general path gives its result (in-place
through a temporary) or its error. These tests pin that contract; timings are never asserted
(``benchmarks/bench_cpp.py --small`` measures the overhead).
"""
from __future__ import annotations

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import _state

from . import test_fast_path as _fp
from .test_fast_path import _args, _counts, plain_cases

pytestmark = pytest.mark.cpp
C = _fp.C       # the fixture: the cpp module (isolated config, no suite-wide forced backend), or a skip


def _out_shape(op, x):
    return x.shape[:-1] + (x.shape[-1] // 2,) if op in ("swiglu", "geglu") else x.shape


@plain_cases
def test_out_is_written_and_returned_like_the_binding(C, op, dt, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(dt)
    args, binding = _args(op, x)
    want = binding(C)
    out = np.full(_out_shape(op, x), np.nan, dt)
    assert getattr(C, f"_fast_{op}")(*args, out) is out
    np.testing.assert_array_equal(out, want)
    getattr(to, op)(*args)                                 # resolve once: installs the entries
    assert _state.fast_out_fns.get(op) is getattr(C, f"_fast_{op}")
    n, info = C._fast_calls()[op], _counts(op).get("default.cpp", 0)
    out2 = np.full_like(out, np.nan)
    assert getattr(to, op)(*args, out=out2) is out2
    np.testing.assert_array_equal(out2, want)
    assert C._fast_calls()[op] == n + 1 and _counts(op).get("default.cpp", 0) == info + 1
    assert getattr(C, f"_fast_{op}")(*args, None) is not None   # out=None: the plain call


def _declined_outs():
    """(why, op, args, out, error the facade raises or None when it computes into out)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = np.linspace(0.5, 1.5, 16).astype(np.float32)
    raw = np.zeros(4 * 16 * 4 + 4, np.uint8)
    mis = raw[1:1 + 4 * 16 * 4].view(np.float32).reshape(4, 16)
    ro = np.zeros((4, 16), np.float32)
    ro.flags.writeable = False
    big = np.zeros((8, 16), np.float32)
    xb = big[:4]
    cases = [("dtype", np.zeros((4, 16), np.float16), TypeError), ("float64", np.zeros((4, 16)), TypeError),
             ("shape", np.zeros((4, 8), np.float32), ValueError), ("ndim", np.zeros(64, np.float32), ValueError),
             ("read-only", ro, ValueError), ("list", np.zeros((4, 16)).tolist(), TypeError),
             ("non-contiguous", np.zeros((4, 32), np.float32)[:, ::2], None), ("misaligned", mis, None),
             ("fortran", np.zeros((4, 16), np.float32, order="F"), None),
             ("byte-swapped", np.zeros((4, 16), ">f4"), TypeError),
             ("subclass", np.zeros((4, 16), np.float32).view(type("Sub", (np.ndarray,), {})), None)]
    out = [(f"rms_norm out {why}", "rms_norm", (x, w, 1e-6), o, err) for why, o, err in cases]
    out += [(f"silu out {why}", "silu", (x,), o, err) for why, o, err in cases]
    out += [("rms_norm in place (out is x)", "rms_norm", (x.copy(), w, 1e-6), "x", None),
            ("rms_norm out is weight's memory", "rms_norm", (x[:1].copy(), w, 1e-6), "w", None),
            ("silu out overlaps x partly", "silu", (xb,), big[2:6], None),
            ("layer_norm out overlaps bias", "layer_norm", (x[:1].copy(), w, w.copy(), 1e-5), "b", None),
            ("swiglu out of x's shape", "swiglu", (x,), np.zeros((4, 16), np.float32), ValueError),
            ("softmax in place", "softmax", (x.copy(), -1), "x", None)]
    return out


DECLINED = _declined_outs()


@pytest.mark.parametrize("why,op,args,out,err", DECLINED, ids=[c[0] for c in DECLINED])
def test_declined_out_is_untouched_and_the_general_path_answers(C, why, op, args, out, err):
    args = tuple(a.copy() if isinstance(a, np.ndarray) and a.base is None else a for a in args)
    if isinstance(out, str):        # an input's own memory: x, or weight / bias viewed as (1, n)
        out = args[0] if out == "x" else args[1 if out == "w" else 2].reshape(1, -1)
    before = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    saved = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    assert getattr(C, f"_fast_{op}")(*args, out) is None
    if before is not None:
        np.testing.assert_array_equal(np.asarray(out), before)     # nothing written on a decline
    want = getattr(to, op)(*saved, backend="cpp")           # the general path on untouched copies
    if err is not None:
        with pytest.raises(err, match="out"):
            getattr(to, op)(*args, out=out)
        return
    assert getattr(to, op)(*args, out=out) is out
    np.testing.assert_array_equal(np.asarray(out), want)


def test_backend_and_overrides_keep_out_calls_on_the_general_path(C):
    x = np.ones((2, 8), np.float32)
    out = np.empty_like(x)
    to.relu(x)
    n = C._fast_calls()["relu"]
    to.relu(x, out=out, backend="cpp")
    with to.use_backend("numpy"):
        to.relu(x, out=out)
    to.set_backend("numpy")
    try:
        assert "relu" not in _state.fast_out_fns
        to.relu(x, out=out)
    finally:
        to.set_backend(None)
    assert C._fast_calls()["relu"] == n
    to.relu(x, out=out)
    assert C._fast_calls()["relu"] == n + 1 and "relu" in _state.fast_out_fns


def test_torch_out_tensors_are_written_and_returned(C):
    torch = pytest.importorskip("torch")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(3, 64).to(dt)
        w = torch.linspace(0.5, 1.5, 64).to(dt)
        want = to.rms_norm(x, w, 1e-6)
        n = C._fast_calls()["rms_norm"]
        out = torch.full_like(x, float("nan"))
        assert to.rms_norm(x, w, 1e-6, out=out) is out
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert C._fast_calls()["rms_norm"] == n + 1, dt
        g = torch.full((3, 32), float("nan"), dtype=dt)
        assert to.swiglu(x, out=g) is g
        torch.testing.assert_close(g, to.swiglu(x), rtol=0, atol=0)
    x = torch.randn(3, 64)
    want = to.silu(x)
    y = x.clone()
    n = C._fast_calls()["silu"]
    assert to.silu(y, out=y) is y                            # in place: the general path, exact
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    assert C._fast_calls()["silu"] == n
    with pytest.raises(TypeError, match="out must have dtype"):
        to.silu(x, out=torch.empty(3, 64, dtype=torch.float16))
    xg = x.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="out= cannot be used"):
        to.silu(xg, out=torch.empty(3, 64))


@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_fused_add_norm_plain_calls_go_native(C, layer, dt):
    """add_rms_norm / add_layer_norm have plain-call entries too (a pair back; out= declines)."""
    rng = np.random.default_rng(5)
    x, r = (rng.standard_normal((3, 40)).astype(dt) for _ in "xr")
    w, b = np.linspace(0.5, 1.5, 40).astype(dt), np.linspace(-1, 1, 40).astype(dt)
    op = "add_layer_norm" if layer else "add_rms_norm"
    args = (x, r, w, b, 1e-5) if layer else (x, r, w, 1e-6)
    want = getattr(C, op)(*args)
    got = getattr(C, f"_fast_{op}")(*args)
    assert type(got) is tuple and len(got) == 2
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)
    getattr(to, op)(*args)
    assert _state.fast_fns.get(op) is getattr(C, f"_fast_{op}")
    n = C._fast_calls()[op]
    for g, e in zip(getattr(to, op)(*args), want):
        np.testing.assert_array_equal(g, e)
    assert C._fast_calls()[op] == n + 1
    pair = (np.empty_like(x), np.empty_like(x))
    assert getattr(C, f"_fast_{op}")(*args, pair) is None            # out= pairs: the general path
    assert getattr(to, op)(*args, out=pair) is pair and C._fast_calls()[op] == n + 1
    for g, e in zip(pair, want):
        np.testing.assert_array_equal(g, e)
    for bad in [(x, r[:, :20], *args[2:]), (x, r.astype(np.float64), *args[2:]), (x, r[::2], *args[2:]),
                (x, r, w[:20], *args[3:]), (x, r, w, *args[3:-1], float("nan"))]:
        assert getattr(C, f"_fast_{op}")(*bad) is None
    torch = pytest.importorskip("torch")
    tdt = torch.float32 if dt == np.float32 else torch.float16
    targs = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args)
    res = getattr(to, op)(*targs)
    assert C._fast_calls()[op] == n + 2 and all(type(t) is torch.Tensor and t.dtype == tdt for t in res)
    for g, e in zip(res, want):
        np.testing.assert_array_equal(g.numpy(), e)
    xb, rb = (torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16) for a in (x, r))
    wb = torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16)
    bargs = (xb, rb, wb, None, 1e-5) if layer else (xb, rb, wb, 1e-6)
    got_b = getattr(to, op)(*bargs)
    want_b = getattr(to, op)(*bargs, backend="cpp")
    assert C._fast_calls()[op] == n + 3 and got_b[0].dtype == torch.bfloat16
    for g, e in zip(got_b, want_b):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def _rope_case(shape, dt, seed=6):
    """x and (T, n) float32 cos/sin tables (halves duplicated, the HF layout)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dt)
    ang = rng.uniform(-4, 4, (shape[-2], shape[-1] // 2))
    c, s = (np.concatenate([f(ang)] * 2, -1).astype(np.float32) for f in (np.cos, np.sin))
    return x, c, s


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 7, 16), (1, 4, 130)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_entry_matches_the_binding_and_the_general_path(C, dt, shape, interleaved):
    x, c, s = _rope_case(shape, dt)
    want = C.rope(x, c, s, interleaved)
    got = C._fast_rope(x, c, s, interleaved)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(to.rope(x, c, s, interleaved, backend="cpp"), want)
    to.rope(x, c, s, interleaved)
    assert _state.fast_out_fns.get("rope") is C._fast_rope
    n = C._fast_calls()["rope"]
    np.testing.assert_array_equal(to.rope(x, c, s, interleaved), want)
    out = np.full_like(x, np.nan)
    assert to.rope(x, c, s, interleaved, out=out) is out
    np.testing.assert_array_equal(out, want)
    assert C._fast_calls()["rope"] == n + 2
    # half tables (T, n/2) are prepare's to expand: declined, and the general path's answer
    xh, ch, sh = x, c[:, :shape[-1] // 2], s[:, :shape[-1] // 2]
    assert C._fast_rope(xh, ch, sh, interleaved) is None
    if not interleaved:
        np.testing.assert_array_equal(to.rope(xh, ch, sh, interleaved), want)


def test_rope_entry_declines_what_prepare_normalises(C):
    x, c, s = _rope_case((2, 6, 8), np.float32)
    for why, args in [("float64 tables", (x, c.astype(np.float64), s, False)),
                      ("leading 1-dim", (x, c[None], s[None], False)), ("T mismatch", (x, c[:5], s[:5], False)),
                      ("np.bool_", (x, c, s, np.bool_(False))), ("int interleaved", (x, c, s, 0)),
                      ("float64 x", (x.astype(np.float64), c, s, False)), ("1-d x", (x[0, 0], c[:1], s[:1], False)),
                      ("non-contiguous table", (x, c[:, ::-1], s, False)), ("missing interleaved", (x, c, s))]:
        assert C._fast_rope(*args) is None, why
        if len(args) == 4:                              # the same with an out: still declined, out untouched
            out = np.zeros_like(x)
            assert C._fast_rope(*args, out) is None and not out.any(), why
    for bad in (c.tolist(), None, 1.0, "cos"):          # not arrays: checked before out is looked at
        out = np.zeros_like(x)
        assert C._fast_rope(x, bad, s, False, out) is None and C._fast_rope(x, c, bad, False, out) is None
        assert not out.any()
    raw = np.zeros((6 + 2 * 6) * 8, np.float32)          # out overlapping the cos table: declined, untouched
    cc = raw[:48].reshape(6, 8)
    cc[...] = c
    out = raw[:96].reshape(2, 6, 8)
    before = out.copy()
    assert C._fast_rope(x, cc, s, False, out) is None
    np.testing.assert_array_equal(out, before)
    assert to.rope(x, cc, s, False, out=out) is out
    np.testing.assert_array_equal(out, C.rope(x, c, s, False))


def test_rope_entry_takes_torch_tensors_of_any_x_dtype(C):
    torch = pytest.importorskip("torch")
    x, c, s = _rope_case((2, 6, 8), np.float32)
    to.rope(x, c, s)                                    # resolve once: installs the entry
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        xt, ct, st = torch.from_numpy(x).to(dt), torch.from_numpy(c), torch.from_numpy(s)
        want = to.rope(xt, ct, st, backend="cpp")
        n = C._fast_calls()["rope"]
        got = to.rope(xt, ct, st)
        assert got.dtype == dt and C._fast_calls()["rope"] == n + 1
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        out = torch.empty_like(xt)
        assert to.rope(xt, ct, st, out=out) is out
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    xf, w16 = torch.randn(2, 8), torch.linspace(0.5, 1.5, 8, dtype=torch.float16)
    n = C._fast_calls()["rms_norm"]                     # a weight of another dtype: the general path casts it
    torch.testing.assert_close(to.rms_norm(xf, w16, 1e-6), to.rms_norm(xf, w16.float(), 1e-6), rtol=0, atol=0)
    assert C._fast_calls()["rms_norm"] == n + 1         # (the second call, with matching dtypes)
