"""The facade's native fast path and the C++ fresh-output block cache.

A plain facade call (no out=, no backend=, no override) goes straight to the native entry of
the policy's first choice (``tensor_ops._cpp._fast_<op>``), which computes only what needs no
normalisation and returns None for everything else. These tests pin down that contract: every
non-plain input is declined (so the general path gives its result or its error), results are
bit-identical to the pybind11 binding, calls are counted in get_backend_info(), and overrides
or a replaced impl.fn are never bypassed. Timings are never asserted (benchmarks/bench_cpp.py
--small measures the overhead).
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import _state
from tests._helpers import cpp_native

pytestmark = pytest.mark.cpp    # the plain-call entries are the cpp backend's

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("rms_norm", "layer_norm", "softmax", "silu", "relu", "gelu", "swiglu", "geglu")


@pytest.fixture
def C(isolated_config, unforced):
    return cpp_native()


def _args(op, x):
    """Facade positional args of a plain call, and the binding call that must match it."""
    n = x.shape[-1]
    w = np.linspace(0.5, 1.5, n).astype(x.dtype)
    b = np.linspace(-1, 1, n).astype(x.dtype)
    return {
        "rms_norm": ((x, w, 1e-6), lambda C: C.rms_norm(x, w, 1e-6)),
        "layer_norm": ((x, w, b, 1e-5), lambda C: C.layer_norm(x, w, b, 1e-5)),
        "softmax": ((x, -1), lambda C: C.softmax(x)),
        "silu": ((x,), lambda C: C.silu(x)),
        "relu": ((x,), lambda C: C.relu(x)),
        "gelu": ((x, "tanh"), lambda C: C.gelu(x, "tanh")),
        "swiglu": ((x,), lambda C: C.swiglu(x)),
        "geglu": ((x, "none"), lambda C: C.geglu(x, "none")),
    }[op]


def plain_cases(test):
    """op x dtype x shape: the calls every entry test makes (tests/test_fast_out.py too)."""
    test = pytest.mark.parametrize("shape", [(1, 4096), (3, 18), (2, 3, 8), (10,)])(test)
    test = pytest.mark.parametrize("dt", [np.float32, np.float16])(test)
    return pytest.mark.parametrize("op", OPS)(test)


@plain_cases
def test_native_entry_matches_binding_and_facade(C, op, dt, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(dt)
    args, binding = _args(op, x)
    got = getattr(C, f"_fast_{op}")(*args)
    want = binding(C)
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    facade = getattr(to, op)(*args)           # the same entry, through the facade
    np.testing.assert_array_equal(facade, want)
    general = getattr(to, op)(*args, backend="cpp")   # the general path, same kernel
    np.testing.assert_array_equal(general, want)


def _declined_cases():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = np.ones(16, np.float32)
    raw = np.zeros(4 * 16 * 4 + 4, np.uint8)
    mis = raw[1:1 + 4 * 16 * 4].view(np.float32).reshape(4, 16)       # misaligned view
    sub = x.view(type("Sub", (np.ndarray,), {}))
    xs = [("float64", x.astype(np.float64)), ("non-contiguous", x[:, ::2]), ("misaligned", mis),
          ("subclass", sub), ("list", x.tolist()), ("0-d", np.float32(1.0)), ("empty", x[:0]),
          ("byte-swapped", x.astype(">f4")), ("fortran", np.asfortranarray(x)), ("int", x.astype(np.int32))]
    cases = []
    for why, bad in xs:
        cases += [(f"rms_norm x {why}", "rms_norm", (bad, w, 1e-6)), (f"silu x {why}", "silu", (bad,)),
                  (f"softmax x {why}", "softmax", (bad, -1))]
    for why, ww in [("dtype", w.astype(np.float16)), ("length", w[:8]), ("2-d", w.reshape(1, 16)),
                    ("non-contiguous", np.ones(32, np.float32)[::2]), ("list", [1.0] * 16), ("none", None)]:
        cases.append((f"rms_norm weight {why}", "rms_norm", (x, ww, 1e-6)))
        cases.append((f"layer_norm weight {why}", "layer_norm", (x, ww, w, 1e-5)))
    cases.append(("layer_norm bias dtype", "layer_norm", (x, w, w.astype(np.float16), 1e-5)))
    cases.append(("layer_norm bias length", "layer_norm", (x, w, w[:4], 1e-5)))
    for eps in (0, -1e-6, float("nan"), float("inf"), np.float32(1e-6), "1e-6", None, True, 1e300):
        cases.append((f"rms_norm eps {eps!r}", "rms_norm", (x, w, eps)))
    for axis in (0, True, np.int64(-1), -1.0, 2, -3, 10**30):
        cases.append((f"softmax axis {axis!r}", "softmax", (x, axis)))
    for ap in ("exact", "TANH", None, b"tanh", 1):
        cases.append((f"gelu approximate {ap!r}", "gelu", (x, ap)))
        cases.append((f"geglu approximate {ap!r}", "geglu", (x, ap)))
    cases.append(("swiglu odd last axis", "swiglu", (x[:, :15].copy(),)))
    cases.append(("silu extra arguments", "silu", (x, None, None)))
    cases.append(("rms_norm missing eps", "rms_norm", (x, w)))
    return cases


DECLINED = _declined_cases()


@pytest.mark.parametrize("why,op,args", DECLINED, ids=[c[0] for c in DECLINED])
def test_native_entry_declines_what_needs_normalisation(C, why, op, args):
    """None means: take the general path (which normalises, or raises its own clear error)."""
    assert getattr(C, f"_fast_{op}")(*args) is None
    assert not isinstance(getattr(C, f"_fast_{op}")(*args), np.ndarray)


def test_declined_inputs_get_the_general_paths_answer(C):
    x = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    w = np.ones(16, np.float32)
    np.testing.assert_allclose(to.rms_norm(x[:, ::2], w[:8]), to.rms_norm(x[:, ::2].copy(), w[:8]), rtol=1e-6)
    assert to.rms_norm(x.astype(np.float64), w.astype(np.float64)).dtype == np.float64
    with pytest.raises(ValueError, match="eps"):
        to.rms_norm(x, w, float("nan"))
    with pytest.raises(ValueError, match="approximate"):
        to.gelu(x, "exact")
    with pytest.raises(ValueError, match="even"):
        to.swiglu(x[:, :15])


def _counts(op):
    return to.get_backend_info()["ops"].get(op, {}).get("calls", {})


def test_plain_calls_go_native_and_are_counted(C):
    x = np.ones((2, 8), np.float32)
    to.silu(x)                                  # first call resolves (general path)
    assert _state.fast_fns.get("silu") is C._fast_silu
    before, info_before = C._fast_calls()["silu"], _counts("silu").get("default.cpp", 0)
    for _ in range(5):
        to.silu(x)
    assert C._fast_calls()["silu"] == before + 5
    assert _counts("silu").get("default.cpp", 0) == info_before + 5
    assert to.get_backend_info()["ops"]["silu"]["native_entry"] == "tensor_ops._cpp._fast_silu"


def test_overrides_are_never_bypassed(C):
    x = np.ones((2, 8), np.float32)
    to.relu(x)
    assert "relu" in _state.fast_fns
    n = C._fast_calls()["relu"]
    ref_before = _counts("relu").get("reference.numpy", 0)
    with to.use_backend("numpy"):
        to.relu(x)
    to.set_backend("numpy")
    try:
        assert "relu" not in _state.fast_fns
        to.relu(x)
        to.relu(x)
        assert "relu" not in _state.fast_fns    # no resolution re-installs it under set_backend
    finally:
        to.set_backend(None)
    to.relu(x, backend="numpy")
    assert C._fast_calls()["relu"] == n
    assert _counts("relu").get("reference.numpy", 0) == ref_before + 4
    to.relu(x)
    to.relu(x)
    assert C._fast_calls()["relu"] == n + 2     # set_backend(None) re-installed the entries


def test_replaced_fn_is_called_not_the_native_entry(C):
    """A fault hook (or a wrapper) put on impl.fn must see the calls."""
    impl = to.get_registry().get_impl("silu", "default.cpp", "facade")
    native = impl.fn
    seen = []

    def wrapper(*a):
        seen.append(a[0].shape)
        return native(*a)

    impl.fn = wrapper
    try:
        to.reload_config()
        to.silu(np.ones((2, 8), np.float32))
        to.silu(np.ones((2, 8), np.float32))
        assert seen == [(2, 8), (2, 8)] and "silu" not in _state.fast_fns
    finally:
        impl.fn = native
        to.reload_config()


def test_private_managers_do_not_feed_the_facade(C):
    from tensor_ops.plugin import OpManager
    m = OpManager(to.get_registry())
    m.resolve("rms_norm", None, "facade")
    assert m.fast_fns is not _state.fast_fns


def _tuned(cfg, table):
    import json
    from tensor_ops._policy import machine_fingerprint
    cfg.write_text(json.dumps({"schema_version": 1, "tuning": {"fingerprint": machine_fingerprint(), "ops": table}}))
    to.reload_config()


def test_tuned_ops_go_native_when_every_bucket_picks_cpp(C, isolated_config):
    """detect_and_benchmark writes a tuning table for every op: that must not turn the native
    path off when cpp wins everywhere (the usual outcome on a CPU-only machine)."""
    cpp_all = [{"max_bytes": 65536, "order": ["cpp", "numpy"]}, {"max_bytes": None, "order": ["cpp", "numpy"]}]
    _tuned(isolated_config, {"silu": {"float32": cpp_all, "float16": cpp_all}})
    x = np.ones((2, 8), np.float32)
    to.silu(x)
    assert _state.fast_fns.get("silu") is C._fast_silu
    n = C._fast_calls()["silu"]
    to.silu(x)
    to.silu(np.ones((512, 1024), np.float32))     # the other bucket: cpp as well
    assert C._fast_calls()["silu"] == n + 2


def test_tuned_ops_stay_on_the_resolver_when_a_bucket_picks_another_backend(C, isolated_config):
    _tuned(isolated_config, {"silu": {"float32": [{"max_bytes": 65536, "order": ["cpp", "numpy"]},
                                                  {"max_bytes": None, "order": ["numpy"]}]}})
    small, big = np.ones((2, 8), np.float32), np.ones((512, 1024), np.float32)
    to.silu(small)
    assert "silu" not in _state.fast_fns
    before = dict(_counts("silu"))
    to.silu(small)
    to.silu(big)
    after = _counts("silu")
    assert after.get("default.cpp", 0) == before.get("default.cpp", 0) + 1
    assert after.get("reference.numpy", 0) == before.get("reference.numpy", 0) + 1


# ---------------------------------------------------------------------------- block cache
def test_fresh_output_blocks_are_reused_never_shared(C):
    rng = np.random.default_rng(4)
    x1 = rng.standard_normal((512, 1024)).astype(np.float32)      # 2 MiB outputs: cached
    x2 = rng.standard_normal((512, 1024)).astype(np.float32)
    C.empty_cache()
    y1 = C.silu(x1)
    assert type(y1.base).__name__ == "PyCapsule" and y1.flags.c_contiguous and y1.flags.writeable
    assert y1.ctypes.data % (2 << 20) == 0
    y2 = C.silu(x2)                                               # y1 alive: a different block
    assert y2.ctypes.data != y1.ctypes.data
    np.testing.assert_array_equal(y1, C.silu(x1, np.empty_like(x1)))
    addr, hits = y1.ctypes.data, C.cache_info()["hits"]
    del y1
    assert C.cache_info()["cached_bytes"] >= 2 << 20
    y3 = to.relu(x2)                                              # the facade gets the same block
    assert y3.ctypes.data == addr and C.cache_info()["hits"] == hits + 1
    np.testing.assert_array_equal(y3, np.maximum(x2, 0))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(y3)), y3)
    view = y3[::2]
    del y3
    np.testing.assert_array_equal(view, np.maximum(x2, 0)[::2])   # a view keeps its block
    y2[...] = 0
    assert C.empty_cache() >= 0


def test_cache_cap_and_small_outputs(C):
    x = np.ones((512, 1024), np.float32)
    info = C.cache_info()
    try:
        C._set_cache(cap_bytes=0)
        y = C.silu(x)
        del y
        assert C.cache_info()["cached_bytes"] == 0
        C._set_cache(cap_bytes=4 << 20)
        ys = [C.silu(x) for _ in range(3)]                       # 3 x 2 MiB > 4 MiB cap
        del ys
        assert C.cache_info()["cached_bytes"] == 4 << 20
        assert C.empty_cache() == 4 << 20 and C.cache_info()["cached_bytes"] == 0
    finally:
        C._set_cache(cap_bytes=info["cap_bytes"])
    small = C.silu(np.ones((4, 16), np.float32))
    assert small.base is None or type(small.base).__name__ != "PyCapsule"


def test_bad_cache_env_is_reported():
    code = "from tensor_ops.backends import cpp; print(cpp.availability())"
    env = dict(os.environ, TENSOR_OPS_CPP_CACHE_MB="lots", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "False" in r.stdout and "TENSOR_OPS_CPP_CACHE_MB=lots" in r.stdout, r.stdout
    env["TENSOR_OPS_CPP_CACHE_MB"] = "0"
    r = subprocess.run([sys.executable, "-c", "import tensor_ops._cpp as C; print(C.cache_info()['cap_bytes'])"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr


def test_empty_serves_callers_that_allocate_their_own_outputs(C):
    a = C.empty((512, 1024), "float32")
    assert a.shape == (512, 1024) and a.dtype == np.float32 and type(a.base).__name__ == "PyCapsule"
    assert C.empty(8, np.float16).shape == (8,) and C.empty(8, np.float16).base is None
    assert C.empty((0, 3), "int16").shape == (0, 3)
    with pytest.raises(ValueError, match="negative dimension -1"):
        C.empty((2, -1), "float32")
    with pytest.raises(TypeError):
        C.empty((2, 2), "no-such-dtype")


def test_tex_outputs_reuse_cached_blocks(C):
    torch = pytest.importorskip("torch")
    from tensor_ops import tex
    x = torch.randn(512, 1024)
    w = torch.ones(1024)
    otype = tex.DType.kFloat32
    hits = C.cache_info()["hits"]
    outs = [tex.rmsnorm_fwd(x, w, 1e-6, None, None, otype, 0, False)[0] for _ in range(3)]
    torch.testing.assert_close(outs[0], outs[2])
    del outs
    tex.rmsnorm_fwd(x, w, 1e-6, None, None, otype, 0, False)
    assert C.cache_info()["hits"] > hits
