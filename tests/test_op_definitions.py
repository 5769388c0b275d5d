"""One definition per op: everything that lists ops reads ``tensor_ops._ops.SPECS``, and the
public ``tensor_ops.testing`` suite works on a plugin in one call."""
from __future__ import annotations

import doctest
import inspect

import numpy as np
import pytest

import tensor_ops as to
import tensor_ops.testing as tt
from tensor_ops import _config, _ops
from tensor_ops._registry import OpImpl, OpRegistry
from tensor_ops.backends import _contract
from tensor_ops.backends import cpp as cpp_backend
from tensor_ops.backends import numpy as numpy_backend


def test_public_api_covers_every_spec():
    assert set(_ops.FACADE_OPS) <= set(to.__all__)
    for name, spec in _ops.SPECS.items():
        fn = getattr(to, name)
        params = list(inspect.signature(fn).parameters)
        assert params == list(spec.signature.parameters) + ["out", "backend"], name
        assert fn.__doc__.startswith(spec.stub.__doc__.rstrip()), name


@pytest.mark.parametrize("name", list(_ops.SPECS))
def test_docstring_examples_run(name):
    fn = getattr(to, name)
    tests = doctest.DocTestFinder().find(fn, name, globs={})
    assert tests and tests[0].examples, f"{name} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    assert runner.failures == 0


def test_backend_op_tables_come_from_the_specs():
    assert set(numpy_backend.BACKEND.ops) == set(_ops.FACADE_OPS)
    assert set(cpp_backend.BACKEND.ops) == set(_ops.KERNEL_OPS)
    assert "matmul" not in _ops.KERNEL_OPS          # GEMM is never hand-written
    assert set(_ops.FACADE_OPS) <= _ops.KNOWN_OPS
    with pytest.raises(ValueError, match="unknown op 'rmsnorm'"):
        _config.check_op("rmsnorm", "test")


def test_name_rule():
    names = cpp_backend.BACKEND.names()
    assert names == {"module": "tensor_ops.backends.cpp", "sources": "cpp_ext/", "config_key": "cpp",
                     "token": "cpp", "env_prefix": "TENSOR_OPS_CPP_", "marker": "cpp",
                     "info_getter": "get_cpp_info", "impl_id": "default.cpp"}
    for name in ("numpy", "cpp", "opencl", "cuda"):
        info = getattr(to, f"get_{name}_info")()
        assert "available" in info and (info["available"] or info["reason"])


def test_registration_refuses_a_function_that_cannot_take_the_ops_arguments():
    reg = OpRegistry()

    def rms_norm(x, w, out):       # a vendor's kernel missing eps
        return out
    with pytest.raises(TypeError) as err:
        reg.register_impl(OpImpl(op_name="rms_norm", impl_id="vendor.acme", kind="vendor", fn=rms_norm))
    msg = str(err.value)
    assert "'vendor.acme'" in msg and "'rms_norm'" in msg and "fn(x, weight, eps, out)" in msg and "(x, w, out)" in msg
    # *args, defaults and C functions without a readable signature are accepted
    reg.register_impl(OpImpl(op_name="rms_norm", impl_id="vendor.ok", kind="vendor", fn=lambda *a: None))
    reg.register_impl(OpImpl(op_name="silu", impl_id="vendor.c", kind="vendor", fn=np.negative))


def _vendor(name, silu):
    return _contract.Backend(name=name, ops={"silu": silu}, probe=lambda: "test device",
                             kind="vendor", supports=lambda x, *r: type(x) is np.ndarray)


def test_run_conformance_on_a_plugin_in_one_call():
    good = _vendor("acmegood", lambda x, out: to.silu(x, out=out, backend="numpy"))
    bad = _vendor("acmebad", lambda x, out: np.maximum(x, 0) if out is None else np.maximum(x, 0, out=out))
    reg = to.get_registry()
    impls = good.register(reg) + bad.register(reg)
    try:
        rep = tt.run_conformance("vendor:acmegood", ops=["silu", "relu"], dtypes=["float32"])
        assert rep.ok and rep.passed and rep.skipped == [("relu", "vendor:acmegood does not implement relu")]
        rep = tt.run_conformance("acmebad", ops=["silu"], dtypes=["float32"])
        assert not rep.ok and all("elements off" in why for _, why in rep.failed)
        with pytest.raises(AssertionError, match="conformance case"):
            rep.raise_for_failures()
    finally:
        for i in impls:
            reg.unregister_impl(i.op_name, i.impl_id, i.api)


def test_tolerance_table_is_the_one_everyone_reads():
    assert tt.tolerance("silu", "float32") == (1.3e-6, 1e-5)
    r, a = tt.tolerance("rms_norm", "float32", n=4096)
    assert r == 1.3e-6 and a == pytest.approx(1e-5 * 8)
    assert tt.tolerance("rms_norm", "float32", n=4096, level="fuzz")[0] == pytest.approx(2e-5 * 8)
    with pytest.raises(ValueError, match="tolerance level"):
        tt.tolerance("silu", "float32", level="loose")


def test_cases_cover_edge_shapes_and_are_reproducible():
    a = [(c.id, c.x.tobytes()) for c in tt.cases(["rope"], ["float32"])]
    b = [(c.id, c.x.tobytes()) for c in tt.cases(["rope"], ["float32"])]
    assert a == b
    ids = {c.shape_id for c in tt.cases(["silu"], ["float32"])}
    assert {"1x1", "3x4097", "empty", "empty_last", "strided"} <= ids
    assert all(c.x.shape[-1] % 2 == 0 for c in tt.cases(["swiglu"], ["float32"]))
