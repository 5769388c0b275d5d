"""OpenCL backend (tensor_ops.backends.opencl) on whatever OpenCL device is here (PoCL in CI).

Covers what the conformance harness does not: the three kernel storage variants (aligned
float4, unaligned vload4, half), both host-array strategies and the buffer pool, pyopencl
arrays staying on the device (also from a foreign context), device selection, the binary
cache (corrupt entry rebuilt, a second process loads without building), the build_opencl
command, and injected faults (build error, device lost, OOM) falling back through the
resolver or raising in strict mode.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import BackendError
from tensor_ops._ops._tolerance import TOLERANCES
from tensor_ops.backends import opencl as ocl
from tests import _reference as ref

pytestmark = pytest.mark.opencl
ROOT = Path(__file__).resolve().parents[1]
#: the one tolerance table's conformance level (tensor_ops/_ops/_tolerance.py)
TOL = {np.float32: TOLERANCES["conformance"]["float32"], np.float16: TOLERANCES["conformance"]["float16"]}


@pytest.fixture(scope="module")
def cl_ok(tmp_path_factory):
    """The backend is available here (else every test skips with its reason)."""
    ok, reason = ocl.availability()
    if not ok:
        pytest.skip(f"opencl unavailable: {reason}")
    return True


@pytest.fixture
def fresh(tmp_path, monkeypatch, cl_ok):
    """A private binary cache and a fresh device state; restored afterwards."""
    monkeypatch.setenv("TENSOR_OPS_OPENCL_CACHE", str(tmp_path / "clcache"))
    ocl._reset_for_tests()
    yield tmp_path / "clcache"
    ocl.set_host_mode(None)
    ocl._reset_for_tests()


def _host(shape, dtype, rng, misalign=False):
    """A C-contiguous array; misalign=True puts its base 4 bytes off a 16-byte boundary."""
    n = int(np.prod(shape))
    if misalign:
        base = np.empty(n + 8, dtype)
        off = next(i for i in range(1, 8) if (base.ctypes.data + i * base.itemsize) % 16)
        a = base[off:off + n].reshape(shape)
        assert a.ctypes.data % 16 and a.flags.c_contiguous
    else:
        a = np.empty(shape, dtype)
    a[...] = rng.standard_normal(shape) * 2
    return a


def _cases(x, rng):
    """(kernel-call, oracle) per op, called with the backend contract's signatures."""
    n = x.shape[1]
    w = (rng.standard_normal(n) * 0.5 + 1).astype(x.dtype)
    b = rng.standard_normal(n).astype(x.dtype)
    ang = rng.uniform(-4, 4, (x.shape[0], n // 2))
    c2, s2 = np.cos(ang), np.sin(ang)
    cn = np.ascontiguousarray(np.concatenate([c2, c2], -1), np.float32)
    sn = np.ascontiguousarray(np.concatenate([s2, s2], -1), np.float32)
    ci = np.ascontiguousarray(np.repeat(c2, 2, -1), np.float32)
    si = np.ascontiguousarray(np.repeat(s2, 2, -1), np.float32)
    return {
        "rms_norm": (lambda o: ocl.rms_norm(x, w, 1e-6, o), ref.rms_norm(x, w, 1e-6)),
        "layer_norm": (lambda o: ocl.layer_norm(x, w, b, 1e-5, o), ref.layer_norm(x, w, b, 1e-5)),
        "layer_norm_nobias": (lambda o: ocl.layer_norm(x, w, None, 1e-5, o),
                              ref.layer_norm(x, w, None, 1e-5)),
        "softmax": (lambda o: ocl.softmax(x, o), ref.softmax(x)),
        "silu": (lambda o: ocl.silu(x, o), ref.silu(x)),
        "relu": (lambda o: ocl.relu(x, o), ref.relu(x)),
        "gelu": (lambda o: ocl.gelu(x, "none", o), ref.gelu(x)),
        "gelu_tanh": (lambda o: ocl.gelu(x, "tanh", o), ref.gelu(x, "tanh")),
        "swiglu": (lambda o: ocl.swiglu(x, o), ref.swiglu(x)),
        "geglu": (lambda o: ocl.geglu(x, "none", o), ref.geglu(x)),
        "geglu_tanh": (lambda o: ocl.geglu(x, "tanh", o), ref.geglu(x, "tanh")),
        "rope": (lambda o: ocl.rope(x, cn, sn, False, o), ref.rope(x, c2.astype(np.float32),
                                                                   s2.astype(np.float32))),
        "rope_interleaved": (lambda o: ocl.rope(x, ci, si, True, o),
                             ref.rope(x, c2.astype(np.float32), s2.astype(np.float32), True)),
    }


def _check(y, want, x, name):
    rtol, atol = TOL[x.dtype.type]
    if name.split("_")[0] in ("rms", "layer", "softmax"):
        atol *= max(1.0, np.sqrt(x.shape[-1]) / 8)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=rtol, atol=atol, err_msg=name)


VARIANTS = [(np.float32, "aligned"), (np.float32, "unaligned"), (np.float32, "streaming"),
            (np.float16, "aligned")]


@pytest.mark.parametrize("shape", [(1, 2), (3, 8), (2, 4096), (5, 18), (7, 1030), (4, 24)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype,variant", VARIANTS, ids=["f32a", "f32-unaligned", "f32n", "f16"])
def test_kernels_all_variants(cl_ok, monkeypatch, shape, dtype, variant):
    """Every kernel in each storage variant (dtype.cl) against the fp64 oracle."""
    if variant == "streaming":     # the non-temporal-store kernels, normally for > 8 MiB
        monkeypatch.setattr(ocl.launch, "NT_MIN_BYTES", 0)
    rng = np.random.default_rng(7)
    x = _host(shape, dtype, rng, variant == "unaligned")
    for name, (call, want) in _cases(x, rng).items():
        y = call(None)
        assert type(y) is np.ndarray and y.dtype == dtype
        _check(y, want, x, name)
        out = np.full(y.shape, np.nan, dtype)
        assert call(out) is out
        np.testing.assert_array_equal(out, y, err_msg=name)


@pytest.mark.parametrize("dtype,variant", VARIANTS, ids=["f32a", "f32-unaligned", "f32n", "f16"])
def test_row_kernels_cut_into_column_pieces(cl_ok, monkeypatch, dtype, variant):
    """CPU layout: with fewer rows than work-items the gated and rope kernels cut each row
    into ncut column pieces (the last one also does the scalar tail)."""
    monkeypatch.setattr(ocl.launch, "MIN_CUT_ELEMS", 16)
    if variant == "streaming":
        monkeypatch.setattr(ocl.launch, "NT_MIN_BYTES", 0)
    st = ocl.device.get()
    if st.cpu_layout:
        assert ocl.launch.row_grid2(st, 1030 // 8, 1030, 1)[1] > 1
        assert ocl.launch.row_grid(st, 3) == (3 * st.lws,)
    rng = np.random.default_rng(11)
    for shape in ((1, 1030), (3, 2060), (2, 4096), (5, 18)):
        x = _host(shape, dtype, rng, variant == "unaligned")
        cases = _cases(x, rng)
        for name in ("swiglu", "geglu", "geglu_tanh", "rope", "rope_interleaved"):
            call, want = cases[name]
            _check(call(None), want, x, name)


def test_copy_mode_and_buffer_pool(fresh):
    ocl.set_host_mode("copy")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 256)).astype(np.float32)
    w = np.ones(256, np.float32)
    y1 = ocl.rms_norm(x, w, 1e-6, None)
    st = ocl.device.get()
    assert st.pool.get(x.nbytes), "buffers go back to the pool after a call"
    pooled = list(st.pool[x.nbytes])
    y2 = ocl.rms_norm(x, w, 1e-6, None)
    assert all(any(b is p for p in st.pool[x.nbytes]) for b in pooled), "pooled buffers reused"
    _check(y1, ref.rms_norm(x, w, 1e-6), x, "rms_norm")
    np.testing.assert_array_equal(y1, y2)


def test_relu_propagates_nan(cl_ok):
    x = np.array([[np.nan, -1.0, 2.0, -np.inf, np.inf]], np.float32)
    y = ocl.relu(x, None)
    np.testing.assert_array_equal(y, [[np.nan, 0.0, 2.0, 0.0, np.inf]])


def test_softmax_large_and_inf(cl_ok):
    x = np.array([[1e4, 1e4 - 1, -np.inf, 0.0] * 3], np.float32)
    _check(ocl.softmax(x, None), ref.softmax(x), x, "softmax")


# ----------------------------------------------------------------------------- facade
def test_facade_uses_opencl(cl_ok):
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    y = to.rms_norm(x, w, backend="opencl")
    calls = to.get_backend_info()["ops"]["rms_norm"]["calls"]
    assert calls.get("default.opencl", 0) >= 1
    _check(y, ref.rms_norm(x, w), x, "rms_norm")
    info = to.get_backend_info()["backends"]["opencl"]
    assert info["available"], info


def test_supports_declines_what_it_cannot_run(cl_ok):
    reg = to.get_registry()
    sup = reg.get_impl("silu", "default.opencl", "facade").supports
    assert sup(np.zeros((2, 4), np.float32), None)
    assert sup(np.zeros((2, 4), np.float16), None)
    assert not sup(np.zeros((2, 4), np.float64), None)
    assert not sup([[1.0]], None)
    rope_sup = reg.get_impl("rope", "default.opencl", "facade").supports
    x = np.zeros((2, 4), np.float32)
    assert not rope_sup(x, np.zeros((2, 4)), np.zeros((2, 4)), False, None)   # float64 angles
    import pyopencl.array as cla
    wd = cla.to_device(ocl.get_queue(), np.ones(4, np.float32))
    rms_sup = reg.get_impl("rms_norm", "default.opencl", "facade").supports
    assert not rms_sup(x, wd, 1e-6, None)            # host x with a device weight: declined
    assert rms_sup(cla.to_device(ocl.get_queue(), x), np.ones(4, np.float32), 1e-6, None)


def test_import_and_register_do_not_load_pyopencl():
    code = ("import sys; import tensor_ops.backends.opencl as m; "
            "from tensor_ops._registry import OpRegistry; m.BACKEND.register(OpRegistry()); "
            "print('pyopencl' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# ----------------------------------------------------------------------------- device arrays
def test_pyopencl_arrays_stay_on_device(cl_ok):
    import pyopencl.array as cla
    q = ocl.get_queue()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 40)).astype(np.float32)
    w = (rng.standard_normal(40) + 1).astype(np.float32)
    xd, wd = cla.to_device(q, x), cla.to_device(q, w)
    y = to.rms_norm(xd, wd, 1e-6, backend="opencl")
    assert isinstance(y, cla.Array) and y.shape == x.shape
    _check(y.get(), ref.rms_norm(x, w, 1e-6), x, "rms_norm")
    out = cla.empty(q, (5, 20), np.float32)
    r = to.swiglu(xd, out=out, backend="opencl")
    assert r is out
    _check(out.get(), ref.swiglu(x), x, "swiglu")
    # a host weight with a device x is uploaded; the result stays a device array
    y2 = ocl.rms_norm(xd, w, 1e-6, None)
    assert isinstance(y2, cla.Array)
    np.testing.assert_allclose(y2.get(), y.get(), rtol=0, atol=0)


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
def test_add_norm_on_pyopencl_arrays_and_in_place(cl_ok, op):
    """The fused add + norm on device arrays: a pair of device results, out= a pair, and vLLM's
    in-place form out=(x, residual) (the same buffers passed as input and output); on host
    arrays in place too (computed into temporaries: USE_HOST_PTR buffers must not alias)."""
    import pyopencl.array as cla
    warnings.simplefilter("error", to.BackendFallbackWarning)    # the opencl impl itself must serve
    q = ocl.get_queue()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 40)).astype(np.float32)
    r = rng.standard_normal((6, 40)).astype(np.float32)
    w = (rng.standard_normal(40) + 1).astype(np.float32)
    extra = (w,) if op == "add_rms_norm" else (w, w)
    want = getattr(to, op)(x, r, *extra, backend="numpy")
    f = getattr(to, op)
    xd, rd = cla.to_device(q, x), cla.to_device(q, r)
    wd = tuple(cla.to_device(q, a) for a in extra)
    got = f(xd, rd, *wd, backend="opencl")
    assert all(isinstance(g, cla.Array) for g in got)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.get(), e, rtol=2e-5, atol=2e-5)
    got = f(xd, rd, *wd, out=(xd, rd), backend="opencl")
    assert got[0] is xd and got[1] is rd
    for g, e in zip(got, want):
        np.testing.assert_allclose(g.get(), e, rtol=2e-5, atol=2e-5)
    xh, rh = x.copy(), r.copy()
    got = f(xh, rh, *extra, out=(xh, rh), backend="opencl")
    assert got[0] is xh and got[1] is rh
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5)


def test_pyopencl_array_from_foreign_context(cl_ok):
    import pyopencl as cl
    import pyopencl.array as cla
    dev = ocl.device.get().device
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    x = np.random.default_rng(4).standard_normal((3, 33)).astype(np.float32)
    y = ocl.softmax(cla.to_device(q, x), None)
    assert isinstance(y, cla.Array) and y.context == ctx
    _check(y.get(), ref.softmax(x), x, "softmax")


# ----------------------------------------------------------------------------- device choice
def test_device_env_selection(cl_ok, monkeypatch):
    monkeypatch.setenv("TENSOR_OPS_OPENCL_DEVICE", "0:0")
    d = ocl.select_device()
    assert d.name == ocl.all_devices()[0][2].name
    monkeypatch.setenv("TENSOR_OPS_OPENCL_DEVICE", d.name.strip()[-6:].lower())
    assert ocl.select_device().name == d.name
    monkeypatch.setenv("TENSOR_OPS_OPENCL_DEVICE", "no-such-device-xyz")
    with pytest.raises(BackendError, match="matches no device; choices"):
        ocl.select_device()


def test_unmatched_device_makes_backend_unavailable_with_reason(fresh, monkeypatch):
    monkeypatch.setenv("TENSOR_OPS_OPENCL_DEVICE", "no-such-device-xyz")
    ok, reason = ocl.availability()
    assert not ok and "TENSOR_OPS_OPENCL_DEVICE='no-such-device-xyz'" in reason


def test_get_opencl_info(cl_ok):
    info = ocl.get_opencl_info()
    assert info["available"] is True
    assert info["platforms"] and info["platforms"][0]["devices"]
    assert info["array_kinds"] == ["numpy", "torch-cpu", "pyopencl"] and info["device_only"] is True
    assert info["ops"] == sorted(ocl.BACKEND.ops) and info["module"] == "tensor_ops.backends.opencl"
    ch = info["chosen"]
    assert ch["name"] and ch["local_size"] >= 1 and "cl_khr_fp16" in ch
    assert set(ch["programs"]) == set(ocl.FAMILIES)
    assert {"dir", "hits", "misses", "builds", "corrupt"} <= set(info["cache"])
    json.dumps(info)   # must be serialisable for get_backend_info / the CLI


# ----------------------------------------------------------------------------- binary cache
def test_corrupt_cache_entry_is_rebuilt_not_loaded(fresh):
    ocl.device.get()
    assert ocl.state.STATS["builds"] == len(ocl.FAMILIES)
    files = sorted(fresh.glob("*.bin"))
    assert len(files) == len(ocl.FAMILIES)
    victim = files[0]
    blob = bytearray(victim.read_bytes())
    blob[-100] ^= 0xFF          # flip a byte of the payload: the hash no longer matches
    victim.write_bytes(bytes(blob))
    ocl._reset_for_tests()
    ocl.device.get()
    assert ocl.state.STATS["corrupt"] == 1
    assert ocl.state.STATS["builds"] == 1 and ocl.state.STATS["hits"] == len(ocl.FAMILIES) - 1
    x = np.random.default_rng(5).standard_normal((2, 12)).astype(np.float32)
    _check(ocl.silu(x, None), ref.silu(x), x, "silu")
    ocl._reset_for_tests()
    ocl.device.get()                # the rebuilt entry is valid again
    assert ocl.state.STATS["corrupt"] == 0 and ocl.state.STATS["hits"] == len(ocl.FAMILIES)


def test_truncated_cache_entry_is_rebuilt(fresh):
    ocl.device.get()
    victim = sorted(fresh.glob("*.bin"))[-1]
    victim.write_bytes(victim.read_bytes()[:20])
    ocl._reset_for_tests()
    ocl.device.get()
    assert ocl.state.STATS["corrupt"] == 1 and ocl.state.STATS["builds"] == 1


_CHILD = ("import json, numpy as np; from tensor_ops.backends import opencl as m; "
          "ok, why = m.availability(); assert ok, why; "
          "y = m.rms_norm(np.ones((2, 8), np.float32), np.ones(8, np.float32), 1e-6, None); "
          "print(json.dumps(dict(m.state.STATS, y=float(y.sum()))))")


def test_second_process_loads_from_cache_without_building(cl_ok, tmp_path):
    env = dict(os.environ, TENSOR_OPS_OPENCL_CACHE=str(tmp_path / "c"))
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["builds"] == len(ocl.FAMILIES) and first["hits"] == 0
    assert second["builds"] == 0 and second["misses"] == 0
    assert second["hits"] == len(ocl.FAMILIES)
    assert abs(second["y"] - 16.0) < 1e-4


# ----------------------------------------------------------------------------- build command
def _load_build_module():
    path = ROOT / "tensor_ops" / "_build" / "opencl_build.py"
    spec = importlib.util.spec_from_file_location("_t_opencl_build", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_opencl_command_builds_caches_and_records(cl_ok, tmp_path):
    cfg = tmp_path / "backend.json"
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(cfg), TENSOR_OPS_OPENCL_CACHE=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_opencl"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    built = json.loads(cfg.read_text())["built"]["opencl"]
    assert built["ok"] and built["devices"]
    assert all(p["status"] in ("built", "cached")
               for d in built["devices"] for p in d["programs"].values())
    assert len(list((tmp_path / "c").glob("*.bin"))) >= len(ocl.FAMILIES)


def test_build_opencl_fails_with_build_log(cl_ok, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in (ROOT / "opencl_ext").glob("*.cl"):
        (src / f.name).write_text(f.read_text())
    (src / "rope.cl").write_text((src / "rope.cl").read_text() + "\nthis is not OpenCL C;\n")
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(tmp_path / "b.json"),
               TENSOR_OPS_OPENCL_CACHE=str(tmp_path / "c"), TENSOR_OPS_OPENCL_SRC=str(src))
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_opencl"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "building program 'rope'" in r.stderr and "build log" in r.stderr
    assert "this is not OpenCL C" in r.stderr or "error" in r.stderr.lower()


def test_build_opencl_without_pyopencl_exits_nonzero(monkeypatch, capsys):
    mod = _load_build_module()
    monkeypatch.setitem(sys.modules, "pyopencl", None)     # import pyopencl -> ImportError
    assert mod.build() == 1
    assert "pyopencl is not importable" in capsys.readouterr().err


def test_build_opencl_without_platform_exits_nonzero(cl_ok, monkeypatch, capsys):
    import pyopencl as cl
    mod = _load_build_module()

    def no_platform():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")
    monkeypatch.setattr(cl, "get_platforms", no_platform)
    assert mod.build() == 1
    assert "no OpenCL platform/device found" in capsys.readouterr().err


# ----------------------------------------------------------------------------- faults
def test_injected_build_failure(fresh):
    with ocl.BACKEND.inject_fault("build"):
        ok, reason = ocl.availability()
        assert not ok and "build log" in reason and "injected build failure" in reason
        x = np.ones((2, 8), np.float32)
        with pytest.raises(BackendError, match="building program"):
            ocl.silu(x, None)
    assert ocl.BACKEND.fault is None                      # the hook undoes itself
    with pytest.raises(ValueError, match="injects faults"):
        with ocl.BACKEND.inject_fault("launch"):          # not an OpenCL fault kind
            pass


@pytest.mark.parametrize("fault,match", [("device_lost", "DEVICE_NOT_AVAILABLE"),
                                         ("oom", "out of device memory")])
@pytest.mark.parametrize("mode", ["hostptr", "copy"])
def test_runtime_faults_fall_back_or_raise_in_strict(cl_ok, monkeypatch, fault, match, mode):
    x = np.random.default_rng(6).standard_normal((3, 16)).astype(np.float32)
    w = np.ones(16, np.float32)
    want = ref.rms_norm(x, w)
    monkeypatch.setattr(ocl.state, "host_mode", mode)

    def failures():
        ops = to.get_backend_info()["ops"]
        return ops.get("rms_norm", {}).get("failures", {}).get("default.opencl", {"count": 0})
    with ocl.BACKEND.inject_fault(fault):
        with pytest.raises(BackendError, match=match) as ei:
            ocl.rms_norm(x, w, 1e-6, None)
        assert not isinstance(ei.value, (ValueError, TypeError))
        # through the resolver: the NumPy reference answers (one warning per process and
        # (op, impl)), and the failure with its reason shows in get_backend_info()
        before = failures()["count"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = to.rms_norm(x, w, backend="opencl,numpy")
        _check(y, want, x, "rms_norm")
        fails = failures()
        assert fails["count"] == before + 1 and match in fails["last_error"]
        # strict: the failure is an error, not a silent fallback
        monkeypatch.setenv("TENSOR_OPS_STRICT", "1")
        to.reload_config()
        with pytest.raises(BackendError, match=match):
            to.rms_norm(x, w, backend="opencl,numpy")
    _check(ocl.rms_norm(x, w, 1e-6, None), want, x, "rms_norm")   # recovers afterwards


def test_user_errors_are_not_backend_failures(cl_ok):
    x = np.ones((2, 7), np.float32)
    with pytest.raises(ValueError):
        to.swiglu(x, backend="opencl")          # odd width: the facade rejects it first


def test_activations_at_extreme_inputs(cl_ok):
    # exp4's clamping: no inf/nan where the true result is finite
    x = np.array([[-100.0, -88.5, -87.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 87.0, 88.5, 100.0, 3.0]],
                 np.float32)
    for name, got, want in [("silu", ocl.silu(x, None), ref.silu(x)),
                            ("gelu", ocl.gelu(x, "none", None), ref.gelu(x)),
                            ("gelu_tanh", ocl.gelu(x, "tanh", None), ref.gelu(x, "tanh")),
                            ("softmax", ocl.softmax(x, None), ref.softmax(x))]:
        assert np.isfinite(got).all(), (name, got)
        _check(got, want, x, name)
    big = np.array([[-100.0, 100.0, -1e30, 1e30, np.inf, np.nan, -np.inf, 0.0]], np.float32)
    np.testing.assert_array_equal(ocl.silu(big, None)[0, :5],
                                  np.array([-0.0, 100.0, -0.0, 1e30, np.inf], np.float32))
    assert np.isnan(ocl.silu(big, None)[0, 5])
    for approx in ("none", "tanh"):   # erf / exp saturate exactly: 0 and x, not ~1e23
        np.testing.assert_array_equal(ocl.gelu(big, approx, None)[0, :5],
                                      np.array([0.0, 100.0, 0.0, 1e30, np.inf], np.float32))
        assert np.isnan(ocl.gelu(big, approx, None)[0, 5])
    sm = ocl.softmax(np.array([[1.0, np.inf, 2.0] * 4, [0.0, -np.inf, 1.0] * 4], np.float32), None)
    assert np.isnan(sm[0]).all() and (sm[1, 1::3] == 0).all()


def test_softmax_row_with_nan_is_all_nan(cl_ok):
    x = np.array([[1.0, np.nan, 2.0] + [0.5] * 9, [1.0, 2.0, 3.0] + [0.5] * 9], np.float32)
    for dt in (np.float32, np.float16):
        y = ocl.softmax(x.astype(dt), None).astype(np.float64)
        assert np.isnan(y[0]).all() and not np.isnan(y[1]).any()
        _check(y[1:], ref.softmax(x[1:]), x[1:].astype(dt), "softmax")


def test_layer_norm_special_rows(cl_ok):
    """Huge finite values (squares overflow fp32) are rescaled; inf/NaN rows give NaN."""
    big = np.finfo(np.float32).max
    x = np.array([[big, 0.5, -1.0, 2.0], [big, big / 2, -big, 1.0], [np.inf, 1.0, 2.0, 3.0],
                  [np.nan, 1.0, 2.0, 3.0], [1e4 + 1, 1e4 - 1, 1e4 + 2, 1e4 - 2],
                  [3.0, 3.0, 3.0, 3.0]], np.float32)
    w = np.array([1.0, 0.5, 2.0, -1.0], np.float32)
    b = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    for cols in (4, 12):     # 12: a float8 step plus a scalar tail
        xx = np.ascontiguousarray(np.tile(x, (1, cols // 4)))
        ww, bb = np.tile(w, cols // 4), np.tile(b, cols // 4)
        y = ocl.layer_norm(xx, ww, bb, 1e-5, None).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            want = ref.layer_norm(xx, ww, bb, 1e-5)
        assert np.isnan(y[2:4]).all()
        np.testing.assert_allclose(y[[0, 1, 4, 5]], want[[0, 1, 4, 5]], rtol=1e-5, atol=1e-4)


def test_rebuild_drops_stale_entries_of_the_same_device(fresh):
    st = ocl.device.get()
    tag = sorted(fresh.glob("norm-*.bin"))[0].name.split("-")[1]
    stale = fresh / f"norm-{tag}-{'0' * 24}.bin"
    other = fresh / f"norm-{'f' * 12}-{'0' * 24}.bin"     # another device: kept
    legacy = fresh / f"norm-{'a' * 32}.bin"                 # pre-release naming: dropped
    renamed = fresh / f"norms-{tag}-{'0' * 24}.bin"          # a family before the rename: dropped
    renamed_other = fresh / f"norms-{'f' * 12}-{'0' * 24}.bin"   # ... of another device: kept
    for f in (stale, other, legacy, renamed, renamed_other):
        f.write_bytes(b"old")
    ocl.load_program(st.ctx, st.device, "norm", force_build=True)
    assert not stale.exists() and not legacy.exists() and other.exists()
    assert not renamed.exists() and renamed_other.exists()
    assert len(list(fresh.glob(f"norm-{tag}-*.bin"))) == 1
    assert {p.name.split("-")[0] for p in fresh.glob(f"*-{tag}-*.bin")} == set(ocl.FAMILIES)


def test_cache_key_follows_the_source(cl_ok):
    """An edited (or renamed) source never loads an old binary: the file name hashes the
    full program text and the build options."""
    dev = ocl.device.get().device
    src = ocl.program_source("norm")
    opts = ocl.build_options(dev)
    path = ocl.cache_path(dev, "norm", src, opts)
    assert path.name.startswith(f"norm-{ocl.programs.device_tag(dev)}-")
    assert ocl.cache_path(dev, "norm", src.replace("to_", "xx_"), opts) != path
    assert ocl.cache_path(dev, "norm", src, opts + " -DX=1") != path


def test_cache_off_reads_and_writes_no_binary(fresh, monkeypatch):
    """TENSOR_OPS_OPENCL_CACHE=off: every process builds each program from source, reads and
    writes no binary, computes the same, and info() says where the binaries are: nowhere."""
    monkeypatch.setenv("TENSOR_OPS_OPENCL_CACHE", "off")
    for _ in range(2):   # a second start builds again: nothing was kept
        ocl._reset_for_tests()
        st = ocl.device.get()
        assert ocl.state.STATS["builds"] == len(ocl.FAMILIES) and ocl.state.STATS["hits"] == 0
    assert ocl.cache_dir() is None and ocl.cache_path(st.device, "norm", "src", "") is None
    assert not fresh.exists()   # the fixture's directory, had the variable still named it
    assert ocl.info()["cache"]["dir"] == "off"
    rng = np.random.default_rng(3)
    x = _host((3, 1030), np.float32, rng)
    call, want = _cases(x, rng)["rms_norm"]
    _check(call(None), want, x, "rms_norm")


def test_every_kernel_carries_the_one_prefix(cl_ok):
    """Every program exports exactly to_<kernel><storage> for the kernels the host launches."""
    import pyopencl as cl
    st = ocl.device.get()
    exported = set()
    for prg in st.programs.values():
        exported |= set(prg.get_info(cl.program_info.KERNEL_NAMES).split(";"))
    want = {f"to_{k}{s}" for k in ocl.programs.KERNELS for s in ("_f32a", "_f32", "_f16", "_f32n")}
    assert exported == want
    assert {fam for fam, _ in ocl.programs.KERNELS.values()} == set(ocl.FAMILIES) == set(st.programs)


@pytest.mark.parametrize("lws", [16, 64, 256])
def test_gpu_layout_and_copy_mode_on_this_device(fresh, monkeypatch, lws):
    """The GPU code path (a work-group per row, local-memory reductions, strided loops,
    pooled copies) computed here with local sizes 16, 64 and 256: rows shorter and longer
    than the group, and tails that leave items idle."""
    monkeypatch.setenv("TENSOR_OPS_OPENCL_LAYOUT", "gpu")
    monkeypatch.setenv("TENSOR_OPS_OPENCL_LWS", str(lws))
    # No binary cache: PoCL's binary export compiles every kernel of every storage for the group
    # size, 143 s of the GPU layout's barrier loops per size on a fresh machine (PoCL's own cache
    # cold); run from source, PoCL compiles only what is launched here (the cache has its tests).
    monkeypatch.setenv("TENSOR_OPS_OPENCL_CACHE", "off")
    monkeypatch.setattr(ocl.state, "host_mode", "copy")
    assert "-DCPU_LAYOUT=0" in ocl.build_options(ocl.select_device())
    rng = np.random.default_rng(9)
    for dtype, misalign in ((np.float32, False), (np.float32, True), (np.float16, False)):
        for shape in ((3, 1030), (2, 4096), (1, 18)):
            x = _host(shape, dtype, rng, misalign)
            for name, (call, want) in _cases(x, rng).items():
                _check(call(None), want, x, name)
    assert ocl.device.get().lws == lws
