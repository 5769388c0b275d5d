"""Fault injection (issue 8): broken plugins, misbehaving impls and native backend failures.

The contract under test (BACKEND_CONFIG.md, "Fallback and strict"): a backend failure — any
exception other than ValueError/TypeError, or a wrongly shaped/typed result — moves to the
next candidate with **one** ``BackendFallbackWarning`` per (op, impl), every failure is
counted in ``get_backend_info()["ops"][op]["failures"]``, strict mode raises
``BackendError`` instead, and the caller gets the reference's numbers.

Native faults go through the one fault hook of the backend contract,
``BACKEND.inject_fault(kind)`` (opencl: ``build`` / ``device_lost`` / ``oom``; cuda: ``oom`` /
``launch``), or replace the native entry points; each such scenario runs in a fresh
interpreter so the once-per-process warning and the availability cache start clean.
Python-level faults register vendor impls with unique ids into the live registry and remove
them afterwards.
"""
from __future__ import annotations

import itertools
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import BackendError, BackendFallbackWarning, BackendImplKind, OpImpl
from tests._helpers import run_python
from tests.conftest import BACKENDS, forced_backend

# run once per forced backend in CI (TENSOR_OPS_BACKEND=<name> pytest -m <name>)
pytestmark = pytest.mark.every_backend

ROOT = Path(__file__).resolve().parent.parent
X = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
_ids = itertools.count()


# --------------------------------------------------------------------------- Python-level faults
class Vendor:
    """A vendor impl of one facade op with a unique id, registered for the test's duration."""

    def __init__(self, op, fn, supports=None, available=None):
        self.name = f"fault{os.getpid()}x{next(_ids)}"
        self.impl_id = f"vendor.{self.name}"
        self.impl = OpImpl(op_name=op, impl_id=self.impl_id, kind=BackendImplKind.VENDOR, fn=fn,
                           supports=supports, available=available, api="facade", priority=50)
        self.op = op

    def __enter__(self):
        to.get_registry().register_impl(self.impl)
        return self

    def __exit__(self, *exc):
        to.get_registry().unregister_impl(self.op, self.impl_id, "facade")
        return False

    @property
    def order(self) -> str:
        return f"{self.name},numpy"


def _silu_ref(x):
    return to.silu(x, backend="numpy")


def _calls(v: Vendor, n=3, x=X):
    """n calls through the vendor-first order; returns (results, fallback warning texts)."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = [to.silu(x, backend=v.order) for _ in range(n)]
    return res, [str(w.message) for w in rec if issubclass(w.category, BackendFallbackWarning)]


def _failures(op, impl_id):
    return to.get_backend_info()["ops"][op].get("failures", {}).get(impl_id)


def _raise_runtime(*a, **k):
    raise RuntimeError("injected: vendor kernel crashed")


FAULTY_FNS = {
    "raises-runtime": (_raise_runtime, "RuntimeError: injected: vendor kernel crashed"),
    "raises-notimpl": (lambda x, out: (_ for _ in ()).throw(NotImplementedError("injected: no such kernel")),
                       "NotImplementedError"),
    "raises-memory": (lambda x, out: (_ for _ in ()).throw(MemoryError("injected: host OOM")), "MemoryError"),
    "wrong-shape": (lambda x, out: np.zeros((x.shape[0], x.shape[1] - 1), x.dtype), "shape (3, 7)"),
    "wrong-dtype": (lambda x, out: np.zeros(x.shape, np.float64), "dtype float64"),
    "wrong-type": (lambda x, out: x.tolist(), "returned list"),
    "returns-none": (lambda x, out: None, "returned NoneType"),
    "transposed": (lambda x, out: np.ascontiguousarray(x.T), "shape (8, 3)"),
}


@pytest.mark.parametrize("kind", sorted(FAULTY_FNS))
def test_faulty_impl_falls_back_once_and_is_counted(kind):
    fn, frag = FAULTY_FNS[kind]
    with Vendor("silu", fn) as v:
        res, warns = _calls(v, n=4)
        for r in res:
            np.testing.assert_array_equal(r, _silu_ref(X))
        assert len(warns) == 1, warns                          # one warning per (op, impl)
        assert v.impl_id in warns[0] and frag in warns[0], warns[0]
        f = _failures("silu", v.impl_id)
        assert f["count"] == 4 and frag in f["last_error"], f
        assert to.get_backend_info()["ops"]["silu"]["fallbacks"] >= 4


@pytest.mark.parametrize("kind", ["raises-runtime", "wrong-shape"])
def test_strict_mode_raises_instead_of_falling_back(monkeypatch, kind):
    fn, frag = FAULTY_FNS[kind]
    monkeypatch.setenv("TENSOR_OPS_STRICT", "1")
    to.reload_config()
    with Vendor("silu", fn) as v:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BackendFallbackWarning)   # strict never warns
            with pytest.raises(BackendError) as err:
                to.silu(X, backend=v.order)
        msg = str(err.value)
        assert "strict mode forbids fallback" in msg and v.impl_id in msg and frag in msg, msg
        assert _failures("silu", v.impl_id)["count"] == 1


def test_impl_lying_in_supports_falls_back():
    """supports() says yes to float16, the kernel then reports it cannot: a backend failure."""
    def fn(x, out):
        if x.dtype != np.float32:
            raise NotImplementedError(f"injected: kernel has no {x.dtype} variant")
        return _silu_ref(x)
    x16 = X.astype(np.float16)
    with Vendor("silu", fn, supports=lambda x, out=None: True) as v:
        res, warns = _calls(v, n=2, x=x16)
        np.testing.assert_array_equal(res[0], to.silu(x16, backend="numpy"))
        assert len(warns) == 1 and "no float16 variant" in warns[0]


def test_impl_lying_about_dtype_is_caught_by_the_result_check():
    """supports() accepts float16 but the kernel silently returns float32: the manager's
    result check (shape and dtype) turns it into a fallback, not a wrong dtype for the user."""
    with Vendor("silu", lambda x, out: _silu_ref(x.astype(np.float32)), supports=lambda x, out=None: True) as v:
        res, warns = _calls(v, n=1, x=X.astype(np.float16))
        assert res[0].dtype == np.float16 and len(warns) == 1 and "dtype float32" in warns[0]


@pytest.mark.parametrize("exc", [TypeError, ValueError])
def test_user_error_types_raised_inside_an_impl_are_its_failure(exc):
    """A facade call is fully validated by its op definition before dispatch, so a
    TypeError/ValueError from inside an impl (e.g. a plugin kernel that cannot take the
    arguments) is that impl's failure: fall back with one warning, count it."""
    def fn(x, out):
        raise exc("injected: vendor rejects this input")
    with Vendor("silu", fn, supports=lambda x, out=None: True) as v:
        res, warns = _calls(v, n=2)
        np.testing.assert_array_equal(res[0], _silu_ref(X))
        assert len(warns) == 1 and "vendor rejects" in warns[0]
        assert _failures("silu", v.impl_id)["count"] == 2


def test_declining_supports_is_not_a_failure():
    """supports() declining is not a failure (nothing counted under failures); with a call's
    own order the next backend serves with one BackendFallbackWarning saying what the first
    one does not support, counted under 'substituted'; under the default order it is silent."""
    with Vendor("silu", _raise_runtime, supports=lambda x, out=None: False) as v:
        res, warns = _calls(v, n=2)
        assert len(warns) == 1 and "does not support float32" in warns[0], warns
        assert _failures("silu", v.impl_id) is None
        info = to.get_backend_info()["ops"]["silu"]
        assert v.impl_id not in info["calls"] and info["substituted"][v.name]["count"] == 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            to.silu(X)          # default order: the vendor is first but declines, silently


def test_supports_raising_is_a_backend_failure():
    """A bug inside supports() is that impl's failure: fall back, warn once, count it."""
    def bad_supports(x, out=None):
        raise AttributeError("injected: supports() bug")
    with Vendor("silu", lambda x, out: _silu_ref(x), supports=bad_supports) as v:
        res, warns = _calls(v, n=2)
        np.testing.assert_array_equal(res[0], _silu_ref(X))
        assert len(warns) == 1 and "supports() bug" in warns[0]
        assert _failures("silu", v.impl_id)["count"] == 2


def test_availability_raising_is_recorded_as_unavailable():
    def boom():
        raise OSError("injected: driver missing")
    with Vendor("silu", _raise_runtime, available=boom) as v:
        res, warns = _calls(v, n=1)
        assert not warns
        info = to.get_backend_info()
        assert "availability check raised OSError: injected: driver missing" in info["vendors"][v.name]["reason"]
        assert "OSError" in info["ops"]["silu"]["excluded"][v.impl_id]


def test_availability_false_without_reason_gets_one():
    with Vendor("silu", _raise_runtime, available=lambda: (False, "")) as v:
        _calls(v, n=1)
        assert to.get_backend_info()["vendors"][v.name]["reason"] == "reported unavailable"


def test_every_candidate_failing_is_a_backend_error(monkeypatch):
    """Forced vendor, fallback another failing vendor, the reference disabled: BackendError with
    the last error, never a wrong result."""
    with Vendor("silu", _raise_runtime) as a, Vendor("silu", _raise_runtime) as b:
        monkeypatch.setenv("TENSOR_OPS_FALLBACK_BACKEND", f"vendor:{b.name}")
        monkeypatch.setenv("TENSOR_OPS_DISABLE", "numpy")
        to.reload_config()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendFallbackWarning)
            with pytest.raises(BackendError, match="every candidate failed; last error RuntimeError"):
                to.silu(X, backend=a.name)
        assert _failures("silu", a.impl_id)["count"] == 1 and _failures("silu", b.impl_id)["count"] == 1


# --------------------------------------------------------------------------- plugins
PLUGINS = {
    "p_import_fails": "raise ImportError('injected: vendor SDK missing')\n",
    "p_syntax_error": "def register(:\n",
    "p_register_raises": ("from tensor_ops.plugin import OpImpl\n"
                          "def register(registry):\n"
                          "    registry.register_impl(OpImpl(op_name='silu', impl_id='vendor.halfway', kind='vendor',\n"
                          "                                  fn=print, api='facade'))\n"
                          "    raise RuntimeError('injected: init failed after one registration')\n"),
    "p_register_exits": "import sys\ndef register(registry):\n    sys.exit(3)\n",
    "p_no_register": "VALUE = 1\n",
    "p_unknown_op": ("from tensor_ops.plugin import OpImpl\n"
                     "def register(registry):\n"
                     "    registry.register_impl(OpImpl(op_name='rmsnorm', impl_id='vendor.typo', kind='vendor',\n"
                     "                                  fn=print))\n"),
    "p_duplicate": ("from tensor_ops.plugin import OpImpl\n"
                    "def register(registry):\n"
                    "    registry.register_impl(OpImpl(op_name='silu', impl_id='reference.numpy', kind='reference',\n"
                    "                                  fn=print, api='facade'))\n"),
    "p_good": ("import numpy as np\nfrom tensor_ops.plugin import OpImpl\n"
               "def register(registry):\n"
               "    registry.register_impl(OpImpl(op_name='relu', impl_id='vendor.good', kind='vendor',\n"
               "        fn=lambda x, out: np.maximum(x, 0) if out is None else np.maximum(x, 0, out=out),\n"
               "        api='facade'))\n"),
}
EXPECT_PLUGIN = {
    "p_import_fails": "ImportError: injected: vendor SDK missing",
    "p_syntax_error": "SyntaxError",
    "p_register_raises": "RuntimeError: injected: init failed after one registration",
    "p_register_exits": "SystemExit: 3",
    "p_no_register": "has no register(registry) function",
    "p_unknown_op": "unknown op 'rmsnorm'",
    "p_duplicate": "duplicate registration of op 'silu' impl 'reference.numpy'",
}


def _python(code: str, env_extra: dict, timeout=300, blocked=()) -> dict:
    path = os.pathsep.join(env_extra.pop("_path", []))
    env = dict(PYTHONWARNINGS="ignore::DeprecationWarning", TENSOR_OPS_BACKEND="", TENSOR_OPS_STRICT="",
               **({"PYTHONPATH": path} if path else {}), **env_extra)
    p = run_python(code, env=env, timeout=timeout, blocked=blocked)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_broken_plugins_are_isolated_and_reported(tmp_path, isolated_config):
    for name, src in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(src)
    code = """
    import json, numpy as np, tensor_ops as to
    info = to.get_backend_info()
    x = np.array([[-1.0, 2.0]], np.float32)
    out = {"failed": {p["name"]: p["reason"] for p in info["plugins"]["failed"]},
           "loaded": {p["name"]: p["impl_ids"] for p in info["plugins"]["loaded"]},
           "ids": to.get_registry().impl_ids(),
           "relu": to.relu(x, backend="good").tolist(), "silu": to.silu(x).tolist()}
    print(json.dumps(out))
    """
    got = _python(code, {"TENSOR_OPS_PLUGINS": ",".join(PLUGINS), "TENSOR_OPS_CONFIG": str(isolated_config),
                         "_path": [str(tmp_path)]})
    for name, frag in EXPECT_PLUGIN.items():
        assert frag in got["failed"][name], (name, got["failed"].get(name))
    assert got["loaded"] == {"p_good": ["vendor.good"]}
    assert "vendor.halfway" not in got["ids"] and "vendor.typo" not in got["ids"]   # partial work undone
    assert got["relu"] == [[0.0, 2.0]]
    assert got["silu"][0][1] == pytest.approx(2 / (1 + np.exp(-2.0)), rel=1e-6)


# --------------------------------------------------------------------------- native backends
NATIVE_RUNTIME = """
import json, os, sys, warnings, numpy as np, tensor_ops as to
from tensor_ops import BackendError, BackendFallbackWarning
backend, hook = sys.argv[1], sys.argv[2]
m = to.get_manager()
impls = [i for i in m.registry.all_impls() if i.backend == backend and i.api == "facade"]
if not impls:
    print(json.dumps({"skip": f"{backend} registers no facade ops here"})); sys.exit(0)
ok, reason = m.availability(impls[0])
if not ok:
    print(json.dumps({"skip": f"{backend} unavailable: {reason}"})); sys.exit(0)
ops = sorted(i.op_name for i in impls if i.op_name != "matmul")
if hook == "fn":                      # replace every native entry point with a failing one
    def dead(*a, **k):
        raise BackendError(f"{backend}: injected native failure")
    for i in impls:
        i.fn = dead
    expect = "injected native failure"
else:                                 # the contract's one hook, on for the rest of this process
    import importlib
    mod = importlib.import_module(f"tensor_ops.backends.{backend}")
    if backend == "cuda":
        for op in ops:
            mod.set_host_copy_policy(op, 0)  # send host arrays to the GPU, so the hook is reached
    fault = mod.BACKEND.inject_fault(hook)   # kept referenced: a collected hook undoes itself
    fault.__enter__()
    expect = {("opencl", "device_lost"): "DEVICE_NOT_AVAILABLE", ("opencl", "oom"): "out of device memory",
              ("cuda", "oom"): "out of memory", ("cuda", "launch"): "injected launch failure"}[backend, hook]
rng = np.random.default_rng(0)
x = rng.standard_normal((5, 16)).astype(np.float32)
w = np.linspace(0.5, 1.5, 16).astype(np.float32)
cs = np.cos(rng.standard_normal((5, 8))).astype(np.float32)
args = {"rms_norm": (x, w), "layer_norm": (x, w, w), "softmax": (x,), "silu": (x,), "relu": (x,),
        "gelu": (x,), "swiglu": (x,), "geglu": (x,), "rope": (x, cs, cs),
        "add_rms_norm": (x, x[::-1].copy(), w), "add_layer_norm": (x, x[::-1].copy(), w, w)}
order = f"{backend},numpy"
bad = []
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    for op in ops:
        f = getattr(to, op)
        want = f(*args[op], backend="numpy")
        for _ in range(3):
            got = f(*args[op], backend=order)
            if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
                bad.append(op)
fw = [str(w.message) for w in rec if issubclass(w.category, BackendFallbackWarning)]
info = to.get_backend_info()
iid = impls[0].impl_id
fails = {op: info["ops"][op].get("failures", {}).get(iid, {}) for op in ops}
calls = {op: info["ops"][op]["calls"] for op in ops}
os.environ["TENSOR_OPS_STRICT"] = "1"
to.reload_config()
try:
    to.silu(x, backend=order)
    strict = None
except BackendError as e:
    strict = str(e)
print(json.dumps({"ops": ops, "bad": bad, "warnings": fw, "fails": fails, "calls": calls, "strict": strict,
                  "expect": expect, "iid": iid}))
"""

NATIVE_CASES = [("cpp", "fn"), ("opencl", "fn"), ("opencl", "device_lost"), ("opencl", "oom"),
                ("cuda", "fn"), ("cuda", "oom"), ("cuda", "launch")]


@pytest.mark.parametrize("backend,hook", NATIVE_CASES, ids=[f"{b}-{h}" for b, h in NATIVE_CASES])
def test_native_runtime_failure_falls_back(backend, hook, isolated_config, tmp_path):
    forced = forced_backend()
    if forced and "," not in forced and forced != backend:
        pytest.skip(f"TENSOR_OPS_BACKEND={forced}: only {forced}'s faults run")
    got = _python(NATIVE_RUNTIME.replace("sys.argv[1], sys.argv[2]", f"{backend!r}, {hook!r}"),
                  {"TENSOR_OPS_CONFIG": str(isolated_config)})
    if "skip" in got:
        pytest.skip(got["skip"])
    assert not got["bad"], f"wrong results after fallback: {got['bad']}"
    assert len(got["warnings"]) == len(got["ops"]), got["warnings"]          # exactly one per op
    assert all(got["expect"] in w and got["iid"] in w for w in got["warnings"]), got["warnings"]
    for op in got["ops"]:
        fails = got["fails"][op]
        assert fails["count"] == 3 and got["expect"] in fails["last_error"], (op, fails)
        assert got["calls"][op].get("reference.numpy", 0) >= 3 and got["iid"] not in got["calls"][op]
    assert got["strict"] and "strict mode forbids fallback" in got["strict"] and got["expect"] in got["strict"]


OPENCL_BUILD = """
import json, warnings, numpy as np, tensor_ops as to
import tensor_ops.backends.opencl as ocl
fault = ocl.BACKEND.inject_fault("build")   # on for the rest of this process (kept referenced)
fault.__enter__()
x = np.ones((2, 8), np.float32)
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    y = to.silu(x)
info = to.get_backend_info()
try:
    to.silu(x, backend="opencl")
    forced = None
except to.BackendUnavailableError as e:
    forced = str(e)
print(json.dumps({"opencl": info["backends"]["opencl"], "served": info["ops"]["silu"]["calls"],
                  "ok": bool(np.allclose(y, x / (1 + np.exp(-x)))), "forced": forced,
                  "warnings": [str(w.message) for w in rec if issubclass(w.category, to.BackendFallbackWarning)]}))
"""


def test_opencl_build_error_makes_it_unavailable_with_the_log(isolated_config, tmp_path):
    pytest.importorskip("pyopencl", reason="pyopencl not installed")
    got = _python(OPENCL_BUILD, {"TENSOR_OPS_CONFIG": str(isolated_config),
                                 "TENSOR_OPS_OPENCL_CACHE": str(tmp_path / "clcache")})
    oc = got["opencl"]
    if oc["available"]:
        pytest.fail("opencl stayed available with an injected build error")
    if "injected build failure" not in (oc["reason"] or ""):
        pytest.skip(f"opencl unavailable here for another reason: {oc['reason']}")
    assert "build" in oc["reason"]
    assert got["ok"] and "default.opencl" not in got["served"]
    assert not got["warnings"], "an unavailable backend is not a failure: no fallback warning"
    assert got["forced"] and "injected build failure" in got["forced"]


CPP_MISSING = """
import sys, json, numpy as np
import tensor_ops as to
y = to.rms_norm(np.ones((2, 8), np.float32), np.ones(8, np.float32))
info = to.get_backend_info()
try:
    to.rms_norm(np.ones((2, 8), np.float32), np.ones(8, np.float32), backend="cpp")
    forced = None
except to.BackendUnavailableError as e:
    forced = str(e)
print(json.dumps({"cpp": info["backends"]["cpp"], "ok": bool(np.allclose(y, 1, atol=1e-5)), "forced": forced}))
"""


def test_cpp_native_module_missing_is_unavailable_with_reason(isolated_config):
    got = _python(CPP_MISSING, {"TENSOR_OPS_CONFIG": str(isolated_config)}, blocked=("tensor_ops._cpp",))
    cpp = got["cpp"]
    if "not shipped" in (cpp["reason"] or ""):
        pytest.skip(f"cpp backend: {cpp['reason']}")
    assert not cpp["available"] and "blocked by the test" in cpp["reason"], cpp
    assert got["ok"]
    assert got["forced"] and "'cpp' was forced" in got["forced"] and "blocked by the test" in got["forced"]


def test_cuda_oom_hook_is_a_backend_failure_at_function_level():
    """No GPU needed: the hook raises CuPy's OutOfMemoryError inside the backend's guard, which
    must turn it into a BackendError (a RuntimeError the manager falls back on), not a user error."""
    cuda = pytest.importorskip("tensor_ops.backends.cuda")
    pytest.importorskip("cupy", reason="CuPy not installed")
    call = object.__new__(cuda.arrays.Call)
    call.op, call.kind, call.dev, call.dtype = "rms_norm", "cupy", 0, "float32"
    with cuda.BACKEND.inject_fault("oom"):
        with pytest.raises(BackendError, match="rms_norm out of memory: OutOfMemoryError") as err:
            with cuda.arrays.guard("rms_norm"):
                call.empty(None, (1 << 20, 1024))
    assert not isinstance(err.value, (ValueError, TypeError))
    assert cuda.BACKEND.fault is None                              # the hook undoes itself
    with pytest.raises(ValueError, match="backend 'cuda' injects faults"):
        with cuda.BACKEND.inject_fault("disk_full"):
            pass


def test_every_declared_fault_kind_has_a_scenario():
    """The fault kinds each built-in backend declares (``BACKEND.faults``) are exactly the
    kinds the scenarios above inject (opencl's "build" by its own test)."""
    import importlib
    covered = {(b, h) for b, h in NATIVE_CASES if h != "fn"} | {("opencl", "build")}
    for name in BACKENDS:
        declared = set(importlib.import_module(f"tensor_ops.backends.{name}").BACKEND.faults)
        assert declared == {h for b, h in covered if b == name}, name


def test_native_backends_are_all_covered():
    """Every built-in backend has at least one runtime fault scenario above."""
    assert {b for b, _ in NATIVE_CASES} | {"numpy"} == set(BACKENDS)
