"""The torch facade's cheaper ways in (2026-11-28): the same numbers as the ways they replace.

- eager autograd calls run the custom ops' own formulas as ``autograd.Function``s
  (``tensor_ops/torch/_eager.py``) instead of going through the op dispatcher: outputs and
  gradients must equal, bit for bit, the dispatcher's (forced here by a pass-through
  ``TorchDispatchMode``, which is also a case where the dispatcher must be kept), and a
  double backward must raise instead of returning a second derivative that misses the native
  kernels;
- CPU tensors reach the NumPy path as views made by the cpp module (``_cpp._torch_views``):
  strides, dtypes, Parameters and lifetimes as ``t.numpy()`` gives them, and a decline (the
  Python conversion) for anything it cannot view;
- tensors whose negative bit is set (``z.conj().imag``) are computed on their values, not on
  their memory (they raised a RuntimeError from ``t.numpy()`` before).
"""
from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: the torch suite skips")
F = torch.nn.functional

import tensor_ops as to  # noqa: E402
import tensor_ops.nn as tnn  # noqa: E402
from tensor_ops.torch import _eager  # noqa: E402
from tests._helpers import cpp_native  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from .test_torch_autograd import CASES, _inputs  # noqa: E402


class _Record(TorchDispatchMode):
    """Pass-through: records the ops the dispatcher saw (and so keeps the facade off _eager)."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _run(name, dtype):
    ours = CASES[name][0]
    xs = _inputs(name, dtype)
    y = ours(*xs)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64).to(dtype)
    y.backward(g)
    return y.detach(), [None if a.grad is None else a.grad.clone() for a in xs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_eager_function_equals_the_dispatcher_bitwise(name, dtype):
    y, grads = _run(name, dtype)
    with _Record() as rec:
        y2, grads2 = _run(name, dtype)
    assert any(op.startswith("tensor_ops.") for op in rec.ops), rec.ops    # the dispatcher ran the op
    assert torch.equal(y, y2)
    for a, b in zip(grads, grads2):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b)


def _graph(t) -> set:
    """The class names of the autograd nodes behind ``t``."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        n = todo.pop()
        if n is not None and type(n).__name__ not in seen:
            seen.add(type(n).__name__)
            todo.extend(f for f, _ in n.next_functions)
    return seen


def test_eager_calls_skip_the_dispatcher_and_modes_keep_it():
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16))
    assert type(to.rms_norm(x, w).grad_fn).__name__ == "tensor_ops_rms_norm_fwdBackward"
    assert type(to.silu(x).grad_fn).__name__ == "tensor_ops_siluBackward"
    assert "tensor_ops_rms_norm_fwdBackward" in _graph(tnn.RMSNorm(16)(x))
    with _Record():
        assert not type(to.rms_norm(x, w).grad_fn).__name__.startswith("tensor_ops_")
    assert _eager.usable((x, w, 1e-6, None))
    with torch.overrides.TorchFunctionMode():
        assert not _eager.usable((x, w))


def test_bfloat16_arguments_make_no_python_calls():
    """A bfloat16 tensor on the native entry becomes an ml_dtypes array, which checks.cpp
    recognises by its type number once recorded: ``str(dtype)`` (a Python function in NumPy)
    per bfloat16 argument cost every such call ~4-6 µs."""
    x = torch.randn(8, 1, 128).bfloat16()
    c, s = torch.randn(1, 128), torch.randn(1, 128)
    xr, w = torch.randn(1, 256).bfloat16(), torch.randn(256).bfloat16()
    to.rope(x, c, s)
    to.rms_norm(xr, w)                           # both seen once: ml_dtypes' dtype recorded
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_filename) if event == "call" else None)
    try:
        to.rope(x, c, s)
        to.rms_norm(xr, w)
    finally:
        sys.setprofile(None)
    assert not [f for f in calls if f.endswith("_dtype.py")], calls


def test_jit_trace_keeps_the_dispatcher():
    """Under torch.jit.trace the custom op is what gets recorded (a Function would be an opaque
    PythonOp in the graph), so the eager shortcut stands aside."""
    seen = []

    def f(x):
        seen.append(_eager.usable((x,)))
        return x * 2

    torch.jit.trace(f, torch.randn(2), check_trace=False)
    assert seen == [False]
    assert _eager.usable((torch.randn(2),))


def test_eager_double_backward_raises():
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16))
    (gx,) = torch.autograd.grad(to.rms_norm(x, w).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gx.sum().backward()


@pytest.mark.parametrize("name", ["rope", "rope_il_half", "matmul", "matmul_vec"])
def test_twice_differentiable_ops_keep_their_double_backward(name):
    ours = CASES[name][0]
    xs = tuple(_inputs(name, torch.float64))
    assert torch.autograd.gradgradcheck(ours, xs, eps=1e-6, atol=1e-6)
    with _Record():
        assert torch.autograd.gradgradcheck(ours, xs, eps=1e-6, atol=1e-6)


def test_eager_backward_without_grad_for_some_inputs():
    x = torch.randn(4, 8)
    w = torch.nn.Parameter(torch.randn(8))
    y = to.rms_norm(x, w)
    y.sum().backward()
    ref = torch.nn.Parameter(w.detach().clone())
    F.rms_norm(x, (8,), ref, 1e-6).sum().backward()
    torch.testing.assert_close(w.grad, ref.grad, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- Parameters on the native entry

def _entry_calls(op):
    return cpp_native()._fast_calls()[op]


def test_parameters_take_the_native_entry_when_autograd_does_not_record():
    x = torch.randn(2, 32)
    p = torch.nn.Parameter(torch.randn(32))
    to.rms_norm(x, p.detach())                   # hands torch to the entries
    want = to.rms_norm(x, p.detach(), backend="numpy")
    with torch.no_grad():
        n = _entry_calls("rms_norm")
        y = to.rms_norm(x, p)
        assert _entry_calls("rms_norm") == n + 1 and y.grad_fn is None
        torch.testing.assert_close(y, want)
        m = tnn.RMSNorm(32)
        n = _entry_calls("rms_norm")
        m(x)
        assert _entry_calls("rms_norm") == n + 1      # tensor_ops.nn in inference: the entry too
    n = _entry_calls("rms_norm")
    y = to.rms_norm(x, p)                         # grad on, p requires grad: autograd records it
    assert _entry_calls("rms_norm") == n and y.grad_fn is not None
    torch.testing.assert_close(y.detach(), want)
    p.requires_grad_(False)
    y = to.rms_norm(x, p)                         # grad on, nothing requires grad: plain
    assert _entry_calls("rms_norm") == n + 1 and y.grad_fn is None


# ----------------------------------------------------------------- _torch_views

def _views(*args):
    C = cpp_native()
    to.rms_norm(torch.ones(1, 4), torch.ones(4))       # hands the module torch's objects
    return C._torch_views(*args)


@pytest.mark.parametrize("make", [
    lambda x: x, lambda x: x.t(), lambda x: x[:, ::3], lambda x: x[1:], lambda x: x.unsqueeze(0).expand(2, -1, -1),
    lambda x: x.bfloat16(), lambda x: x.half()[::2], lambda x: torch.nn.Parameter(x.clone()), lambda x: x[0, 0]],
    ids=["plain", "t", "step", "offset", "expand", "bf16", "f16-step", "parameter", "0-d"])
def test_torch_views_are_numpys_views(make):
    t = make(torch.randn(6, 9))
    (v,) = _views(t)
    with torch.no_grad():
        ref = t.view(torch.int16).numpy() if t.dtype is torch.bfloat16 else t.detach().numpy()
    assert v.base is t and v.shape == ref.shape
    assert v.strides == ref.strides and v.__array_interface__["data"][0] == ref.__array_interface__["data"][0]
    if t.dtype is torch.bfloat16:
        assert v.dtype.name == "bfloat16" and np.array_equal(v.view(np.int16), ref)
    else:
        assert v.dtype == ref.dtype and np.array_equal(v, ref)
        assert v.flags.c_contiguous == ref.flags.c_contiguous and v.flags.writeable


def test_torch_views_pass_scalars_and_decline_the_rest():
    x = torch.randn(2, 3)
    got = _views(x, None, True, 3, 1.5, "tanh")
    assert got[1:] == (None, True, 3, 1.5, "tanh")
    for bad in (x.double(), torch._neg_view(x), torch.empty(0, 3), np.ones(3), [1.0], np.float32(1), x.int()):
        assert _views(x, bad) is None, bad


def test_torch_views_keep_the_tensor_alive():
    (v,) = _views(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    gc.collect()
    assert np.array_equal(v, np.arange(12, dtype=np.float32).reshape(3, 4))


# ----------------------------------------------------------------- negative-bit tensors

def _neg_inputs():
    z = torch.complex(torch.randn(4, 16), torch.randn(4, 16))
    return [torch._neg_view(torch.randn(4, 16)), z.conj().imag]


@pytest.mark.parametrize("backend", [None, "numpy", "cpp"])
def test_negative_bit_inputs_are_their_values(backend):
    if backend == "cpp":
        _views()
    w = torch.randn(16)
    for x in _neg_inputs():
        assert x.is_neg()
        plain = x.resolve_neg()
        for a, b in ((to.rms_norm(x, w, backend=backend), to.rms_norm(plain, w, backend=backend)),
                     (to.silu(x, backend=backend), to.silu(plain, backend=backend)),
                     (to.rms_norm(plain, torch._neg_view(w), backend=backend),
                      to.rms_norm(plain, -w, backend=backend))):
            assert torch.equal(a, b)


def test_negative_bit_out_is_refused():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="out is a tensor with its negative bit set"):
        to.silu(x, out=torch._neg_view(torch.empty(4, 16)))
