"""Every built-in backend on the one contract (tensor_ops/backends/_contract.py), the device
backends' packages (``opencl/``, ``cuda/``) in particular, and the CuPy reference
(``reference.cupy``: float64 and matmul on device arrays).

Runs without a GPU or CuPy: the CuPy reference is then registered and unavailable with its
reason, and its place in the order is checked with a stand-in probe.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import BackendImplKind, BackendUnavailableError
from tensor_ops._manager import OpManager
from tensor_ops._resolve import default_rank
from tensor_ops._ops import FACADE_OPS, KERNEL_OPS
from tensor_ops._registry import OpImpl, OpRegistry
from tensor_ops.backends import BUILTIN_NAMES
from tensor_ops.backends._contract import Backend, ops_from, register_backend

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("opencl", "cuda")
KERNEL_BACKENDS = ("cpp", "opencl", "cuda")      # hand-written kernels: ops within KERNEL_OPS


def _mod(name):
    return importlib.import_module(f"tensor_ops.backends.{name}")


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_backend_satisfies_the_contract(name):
    mod = _mod(name)
    b = mod.BACKEND
    assert isinstance(b, Backend) and b.name == name
    names = b.names()
    assert names["module"] == mod.__name__ == f"tensor_ops.backends.{name}"
    assert names["impl_id"] == f"{b.kind.value}.{name}" and names["token"] == names["config_key"] == name
    if name in KERNEL_BACKENDS:
        assert (ROOT / names["sources"]).is_dir(), names["sources"]
        assert set(b.ops) <= set(KERNEL_OPS) and b.kind is BackendImplKind.DEFAULT
    else:
        assert set(b.ops) <= set(FACADE_OPS) and b.kind is BackendImplKind.REFERENCE
    getter = getattr(mod, names["info_getter"])           # get_<name>_info at tensor_ops.backends.<name>
    got = getter()
    assert got["available"] in (True, False) and got["module"] == names["module"]
    assert got["available"] or got["reason"]
    top = getattr(to, names["info_getter"])()             # ... and at tensor_ops
    assert names["info_getter"] in to.__all__ and top["available"] == got["available"]
    if hasattr(mod, "availability"):                     # the device helpers' shortcut
        assert mod.availability() == b.availability()
    assert set(b.faults) == set(b.faults) & {"build", "device_lost", "oom", "launch"}


@pytest.mark.parametrize("name", PACKAGES)
def test_device_package_layout(name):
    """The name rule inside a package: its op functions are ``<pkg>.ops``'s functions named
    after the ops, re-exported by the package; environment variables are read in
    ``settings.py`` only; modules stay small."""
    mod = _mod(name)
    b = mod.BACKEND
    assert b.device_only and "numpy" in b.array_kinds
    # the declared dtypes are what supports() takes (host arrays: float16/float32 only)
    assert set(b.dtypes) >= {"float16", "float32"} and "float64" not in b.dtypes
    for dt in ("float16", "float32", "float64"):
        x = np.zeros((2, 8), dt)
        assert bool(b.supports["silu"](x, None)) == (dt in b.dtypes), (name, dt)
    assert b.ops == ops_from(vars(mod.ops))
    for op, fn in b.ops.items():
        assert getattr(mod, op) is fn
    pkg = Path(mod.__file__).parent
    for f in sorted(pkg.glob("*.py")):
        text = f.read_text()
        if f.name != "settings.py":
            assert "os.environ" not in text and "getenv" not in text, f"{f.name} reads the environment"
        assert len(text.splitlines()) <= 300, f"{f.name}: keep the modules small"
    env = set(re.findall(r"TENSOR_OPS_\w+", (pkg / "settings.py").read_text()))
    assert all(v.startswith(b.names()["env_prefix"]) for v in env), env


@pytest.mark.parametrize("name", ("opencl", "cuda", "cupy"))
def test_registered_impls_carry_the_declaration(name):
    b = _mod(name).BACKEND
    impls = [i for i in to.get_registry().all_impls() if i.backend == name and i.api == "facade"]
    assert {i.op_name for i in impls} == set(b.ops)
    for i in impls:
        assert i.owner is b and i.impl_id == b.impl_id and i.fn is b.ops[i.op_name]
        assert i.host_arrays == ("when-named" if b.device_only else "always")
        assert i.available is b.availability


# ----------------------------------------------------------------------------- reference.cupy
def _expected_cupy_reason():
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001
        return "no CUDA device"
    return None if n else "no CUDA device"


def test_cupy_reference_is_registered_with_its_reason():
    from tensor_ops.backends import cupy as cupy_backend
    impls = [i for i in to.get_registry().all_impls() if i.backend == "cupy"]
    assert {i.op_name for i in impls} == set(FACADE_OPS)            # float64 of every op, and matmul
    assert {i.impl_id for i in impls} == {"reference.cupy"}
    assert all(i.kind is BackendImplKind.REFERENCE for i in impls)
    assert cupy_backend.BACKEND.array_kinds == ("cupy", "torch-cuda")
    info = to.get_backend_info()["backends"]["cupy"]
    assert info["kind"] == "reference"
    want = _expected_cupy_reason()
    if want is None:
        pytest.skip("CuPy and a CUDA device are here: tests/test_cuda.py runs reference.cupy")
    ok, reason = cupy_backend.availability()
    assert not ok and reason.startswith(want), reason
    assert info["available"] is False and info["reason"] == reason
    res = to.get_manager().resolve("matmul", None, "facade", "float32", 64)
    assert res.excluded["reference.cupy"] == f"unavailable: {reason}"
    with pytest.raises(BackendUnavailableError, match="'cupy' was forced"):
        to.matmul(np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32), backend="cupy")


def test_cupy_reference_supports_only_what_the_kernels_do_not():
    from tensor_ops.backends import cupy as cupy_backend
    sup = cupy_backend.BACKEND.supports
    fake = type("ndarray", (), {})
    fake.__module__ = "cupy"
    x64, x32 = fake(), fake()
    x64.dtype, x32.dtype = np.dtype(np.float64), np.dtype(np.float32)
    assert sup["rms_norm"](x64, x64, 1e-6, None) and not sup["rms_norm"](x32, x32, 1e-6, None)
    assert sup["matmul"](x32, x32, None) and sup["matmul"](x64, x64, None)
    assert not sup["matmul"](np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), None)


def test_cupy_reference_comes_last():
    """References come after every other impl, and reference.cupy after reference.numpy, in
    the default order, a named order's fallback and a forced one (a stand-in probe makes it
    available here)."""
    from tensor_ops.backends import cupy as cupy_backend
    from tensor_ops.backends import numpy as numpy_backend
    reg = OpRegistry()
    cp = dataclasses.replace(cupy_backend.BACKEND, probe=lambda: "stand-in device")
    register_backend(reg, cp)
    register_backend(reg, dataclasses.replace(numpy_backend.BACKEND))
    reg.register_impl(OpImpl(op_name="rms_norm", impl_id="default.fake", kind="default",
                             fn=lambda x, weight, eps, out: x))
    m = OpManager(reg, None)
    for override in (None, "fake", "numpy"):
        ids = [i.impl_id for i in m.resolve("rms_norm", override, "facade", "float64", 64).candidates]
        assert ids[-2:] == ["reference.numpy", "reference.cupy"], (override, ids)
    ids = [i.impl_id for i in m.resolve("rms_norm", "reference", "facade", "float64", 64).candidates]
    assert ids == ["reference.numpy", "reference.cupy", "default.fake"]   # the kind token asked for them first
    cands = m.resolve("rms_norm", None, "facade", "float64", 64).candidates
    assert cands[-1].declines_host                  # device_only: never handed host arrays
    impls = {i.impl_id: i for i in reg.get_impls("rms_norm", "facade")}
    ranked = sorted(impls.values(), key=default_rank)
    assert [i.impl_id for i in ranked] == ["default.fake", "reference.numpy", "reference.cupy"]
    assert to.get_backend("matmul") == "numpy"      # the global order: host arrays stay on NumPy


def test_cupy_is_a_known_backend_name(isolated_config):
    from tensor_ops import _config
    assert "cupy" in _config.known_names(to.get_registry().backends())
    isolated_config.write_text('{"schema_version": 1, "priority": ["cupy", "cpp", "numpy"]}')
    to.reload_config()                                # accepted, not "unknown backend"
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(to.silu(x), x / (1 + np.exp(-x)), rtol=1e-6)
