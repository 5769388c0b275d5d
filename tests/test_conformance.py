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
