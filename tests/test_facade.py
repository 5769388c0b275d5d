"""Facade behaviour: dtypes, out=, views, NaN, bad input (identical on every backend),
import isolation, the info command and the examples."""
from __future__ import annotations

import os


import numpy as np
import pytest

import tensor_ops as to
from tests._helpers import ROOT, run_python
from tests.conftest import BACKENDS

# run once per forced backend in CI (TENSOR_OPS_BACKEND=<name> pytest -m <name>)
pytestmark = pytest.mark.every_backend

X = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
W = np.ones(8, np.float32)
CS = np.ones((4, 4), np.float32)


def available_backends():
    out = []
    for b in BACKENDS:
        impl_id = "reference.numpy" if b == "numpy" else f"default.{b}"
        try:
            impl = to.get_registry().get_impl("rms_norm", impl_id, "facade")
        except KeyError:
            continue
        if to.get_manager().availability(impl)[0]:
            out.append(b)
    return out


BAD = [  # (call, exception type, message fragment)
    (lambda b: to.rms_norm(X.astype(np.int32), W, backend=b), TypeError, "x must have dtype float16, bfloat16, float32 or float64, got int32"),
    (lambda b: to.rms_norm(X > 0, W, backend=b), TypeError, "got bool"),
    (lambda b: to.silu(X.astype(np.complex64), backend=b), TypeError, "got complex64"),
    (lambda b: to.rms_norm([[1.0]], W, backend=b), TypeError, "x must be an array"),
    (lambda b: to.rms_norm(X, np.ones(7, np.float32), backend=b), ValueError, "weight must have shape (8,) to match x.shape[-1] = 8, got (7,)"),
    (lambda b: to.layer_norm(X, W, np.ones(9, np.float32), backend=b), ValueError, "bias must have shape (8,)"),
    (lambda b: to.rms_norm(X, W, eps=-1.0, backend=b), ValueError, "eps must be a finite number >= 0, got -1.0"),
    (lambda b: to.rms_norm(X, W, eps=float("nan"), backend=b), ValueError, "eps must be a finite number"),
    (lambda b: to.rms_norm(X, W, eps="1e-5", backend=b), TypeError, "eps must be a real number, got '1e-5'"),
    (lambda b: to.silu(np.array(1.0, np.float32), backend=b), ValueError, "at least 1 dimension"),
    (lambda b: to.swiglu(np.ones((2, 7), np.float32), backend=b), ValueError, "x.shape[-1] must be even for swiglu"),
    (lambda b: to.geglu(X, approximate="fast", backend=b), ValueError, "approximate must be 'none' (exact erf) or 'tanh', got 'fast'"),
    (lambda b: to.gelu(X, "erf", backend=b), ValueError, "approximate must be"),
    (lambda b: to.rope(X, CS, np.ones((4, 8), np.float32), backend=b), ValueError, "cos and sin must have the same shape"),
    (lambda b: to.rope(X, np.ones((3, 4), np.float32), np.ones((3, 4), np.float32), backend=b), ValueError, "cos must have shape (T, n) = (4, 8) or (T, n/2) = (4, 4)"),
    (lambda b: to.rope(X[:, :7], CS, CS, backend=b), ValueError, "must be even for rope"),
    (lambda b: to.rope(X, CS, CS, interleaved="yes", backend=b), TypeError, "interleaved must be a bool"),
    (lambda b: to.softmax(X, axis=2, backend=b), ValueError, "axis must be in [-2, 1]"),
    (lambda b: to.softmax(X, axis=1.0, backend=b), TypeError, "axis must be an int"),
    (lambda b: to.silu(X, out=np.empty((4, 9), np.float32), backend=b), ValueError, "out must have shape (4, 8), got (4, 9)"),
    (lambda b: to.silu(X, out=np.empty((4, 8), np.float16), backend=b), TypeError, "out must have dtype float32 (the dtype of x), got float16"),
    (lambda b: to.silu(X, out=np.frombuffer(np.empty(32, np.float32).tobytes(), np.float32).reshape(4, 8), backend=b), ValueError, "out is read-only"),
    (lambda b: to.matmul(X, np.ones((7, 2), np.float32), backend=b), ValueError, "a.shape (4, 8) and b.shape (7, 2) are not compatible"),
    (lambda b: to.silu(X, backend=b + ",gpu"), ValueError, "unknown backend 'gpu'"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input_same_error_on_every_backend(case):
    call, exc, frag = BAD[case]
    messages = set()
    for b in available_backends():
        with pytest.raises(exc) as err:
            call(b)
        assert frag in str(err.value), (b, str(err.value))
        messages.add(str(err.value))
    assert len(messages) == 1, messages


def test_nan_and_inf_propagate_like_numpy():
    x = np.array([[np.nan, 1.0, np.inf, -np.inf]], np.float32)
    for b in available_backends():
        with np.errstate(all="ignore"):
            assert np.isnan(to.relu(x, backend=b)[0, 0]) and to.relu(x, backend=b)[0, 2] == np.inf
            assert np.isnan(to.rms_norm(x, np.ones(4, np.float32), backend=b)).all()
            s = to.silu(x, backend=b)
            assert np.isnan(s[0, 0]) and s[0, 2] == np.inf and np.isnan(s[0, 3])   # -inf·σ(-inf) = -inf·0, as NumPy and torch


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_preserved_and_shapes(dtype):
    x = np.ones((2, 3, 8), dtype)
    forced = os.environ.get("TENSOR_OPS_BACKEND") or None
    if forced not in (None, "numpy") and np.dtype(dtype) == np.float64:
        # a forced backend that computes fp16/fp32 only says so instead of handing the call on
        with pytest.raises(to.BackendUnsupportedError, match="float64"):
            to.rms_norm(x, np.ones(8, np.float32))
        return
    assert to.rms_norm(x, np.ones(8, np.float32)).dtype == dtype      # weight cast to x's dtype
    assert to.swiglu(x).shape == (2, 3, 4)
    assert to.softmax(x, axis=0).shape == x.shape
    if forced is None or any(i.backend == forced for i in to.get_registry().get_impls("matmul", "facade")):
        assert to.matmul(x, np.ones((8, 2), dtype)).shape == (2, 3, 2)
    else:
        with pytest.raises(to.BackendUnsupportedError, match="op 'matmul'"):
            to.matmul(x, np.ones((8, 2), dtype))


def test_softmax_other_axis_and_noncontiguous_out():
    x = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    y = to.softmax(x, axis=1)
    assert np.allclose(y.sum(axis=1), 1, atol=1e-6)
    big = np.zeros((3, 10), np.float32)
    out = big[:, ::2]
    r = to.silu(x[:, :, 0][:, :5], out=out)
    assert r is out and np.allclose(big[:, ::2], to.silu(np.ascontiguousarray(x[:, :, 0][:, :5])))


def test_empty_inputs_return_at_once():
    for b in available_backends():
        assert to.rms_norm(np.empty((0, 8), np.float32), W, backend=b).shape == (0, 8)
        assert to.swiglu(np.empty((3, 0), np.float32), backend=b).shape == (3, 0)
        assert to.matmul(np.empty((0, 8), np.float32), np.ones((8, 2), np.float32)).shape == (0, 2)


def test_get_backend(unforced):
    assert to.get_backend() in BACKENDS
    assert to.get_backend("matmul") == "numpy"
    with to.use_backend("numpy"):
        assert to.get_backend("rms_norm") == "numpy"


def test_builtin_backends_register_without_error():
    """A shipped backend module must register cleanly; 'unavailable' is fine, 'broken' is not."""
    for name, mod in to._global.builtins().items():
        assert not (isinstance(mod, str) and mod.startswith("registration failed")), (name, mod)


def test_backend_info_explains_everything(unforced):
    to.rms_norm(X, W)
    info = to.get_backend_info()
    assert info["version"] == to.__version__
    from tensor_ops.backends import BUILTIN_NAMES
    assert set(info["backends"]) == set(BUILTIN_NAMES) == set(BACKENDS) | {"cupy"}
    for b in info["backends"].values():
        assert b["available"] or b["reason"]
    op = info["ops"]["rms_norm"]
    assert op["selected"] and op["order"][-1] == "reference.numpy" and sum(op["calls"].values()) >= 1
    assert info["settings"]["priority"]["source"] == "built-in default"


def test_import_without_torch_cupy_pyopencl(monkeypatch):
    monkeypatch.delenv("TENSOR_OPS_BACKEND", raising=False)   # a forced device backend can't run with its toolkit blocked
    p = run_python("""
        import sys, numpy as np, tensor_ops as to
        assert not any(m.split('.')[0] in ('torch', 'cupy', 'pyopencl') for m in sys.modules)
        y = to.rms_norm(np.ones((2, 4), np.float32), np.ones(4, np.float32))
        info = to.get_backend_info()
        assert not info['backends']['cuda']['available'] and info['backends']['cuda']['reason']
        assert not info['backends']['opencl']['available'] and info['backends']['opencl']['reason']
        print('OK', to.get_backend('rms_norm'))
    """, blocked=("torch", "cupy", "pyopencl"), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("OK")


def test_plain_import_does_not_import_toolkits():
    p = run_python("import sys, tensor_ops; "
                   "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch','cupy','pyopencl')))", timeout=60)
    assert p.stdout.strip() == "[]", p.stdout + p.stderr


def test_info_command():
    p = run_python("", "-m", "tensor_ops", "info")
    assert p.returncode == 0, p.stderr
    assert "rms_norm" in p.stdout and "backend    available" in p.stdout and "source" in p.stdout


@pytest.mark.parametrize("example", ["example_intree.py", "example_outtree.py"])
def test_examples_run(example):
    p = run_python("", str(ROOT / "examples" / example))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith("OK")


def test_plugin_isolation(monkeypatch, tmp_path):
    (tmp_path / "broken_import_plugin.py").write_text("raise ImportError('missing vendor SDK')\n")
    (tmp_path / "raising_plugin.py").write_text(
        "from tensor_ops.plugin import OpImpl\n"
        "def register(registry):\n"
        "    registry.register_impl(OpImpl(op_name='silu', impl_id='vendor.half', kind='vendor', fn=print, api='facade'))\n"
        "    raise RuntimeError('vendor init failed')\n")
    code = ("import numpy as np, tensor_ops as to\n"
            "info = to.get_backend_info()\n"
            "failed = {p['name']: p['reason'] for p in info['plugins']['failed']}\n"
            "assert 'missing vendor SDK' in failed['broken_import_plugin'], failed\n"
            "assert 'vendor init failed' in failed['raising_plugin'], failed\n"
            "assert 'vendor.half' not in to.get_registry().impl_ids()\n"
            "assert to.silu(np.zeros(2, np.float32))[0] == 0\n"
            "print('OK')\n")
    env = dict(PYTHONPATH=str(tmp_path), TE_FL_PLUGIN_MODULES="broken_import_plugin,raising_plugin",
               TENSOR_OPS_CONFIG=str(tmp_path / "c.json"))
    p = run_python(code, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_plain_install_serves_numpy_input_from_cpp(unforced):
    """Issue 3's promise: with the C++ backend built, NumPy input goes to it by default, not
    to a device backend that would need copies (or, on PoCL, is slower)."""
    if "cpp" not in available_backends():
        pytest.skip(f"cpp unavailable: {to.get_backend_info()['backends']['cpp']['reason']}")
    for op in ("rms_norm", "layer_norm", "softmax", "silu", "gelu", "swiglu", "rope"):
        assert to.get_backend(op) == "cpp", op
    assert to.get_backend() == "cpp"
    to.rms_norm(X, W)
    assert to.get_backend_info()["ops"]["rms_norm"]["calls"].get("default.cpp", 0) >= 1
