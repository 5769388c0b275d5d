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
- the norms' autograd forward and backward take native entries (``_fast_*_stats``,
  ``_fast_*_bwd``) for the plain case: bit for bit the Python path's results, declines for the
  rest, never in place of an override (2026-11-29);
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
    y = to.rms_norm(x, p)                         # grad on, p requires grad: autograd records it,
    assert _entry_calls("rms_norm") == n + 1 and y.grad_fn is not None   # its forward by the stats entry
    torch.testing.assert_close(y.detach(), want)
    p.requires_grad_(False)
    y = to.rms_norm(x, p)                         # grad on, nothing requires grad: plain
    assert _entry_calls("rms_norm") == n + 2 and y.grad_fn is None


# ----------------------------------------------------------------- the norms' autograd entries

def _norm_inputs(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x, dy = (torch.randn(*shape, generator=g).to(dtype) for _ in "ab")
    w, b = (torch.randn(n, generator=g).to(dtype) for _ in "ab")
    return x, dy, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(3, 40), (2, 3, 64), (5, 4097)], ids=str)
def test_norm_autograd_entries_equal_the_python_path(dtype, shape, monkeypatch):
    """The forward with statistics (``_fast_*_stats``) and the backward from them
    (``_fast_*_bwd``) give bit for bit what the Python path gives: the resolver's cpp kernel
    with ``rsigma=``/``mu=`` (taken when ``backend=`` is given) and the tex backward bindings
    with their outputs (taken when the entry is missing)."""
    from tensor_ops.torch import _kernels as K
    C = cpp_native()
    to.rms_norm(torch.ones(1, 4), torch.ones(4))       # hands the module torch's objects
    x, dy, w, b = _norm_inputs(dtype, shape)
    n = _entry_calls("rms_norm")
    got = K.rms_norm_fwd(x, w, 1e-5, None)
    assert _entry_calls("rms_norm") == n + 1           # the entry served it (and it is counted)
    want = K.rms_norm_fwd(x, w, 1e-5, "cpp")
    assert _entry_calls("rms_norm") == n + 1           # backend= given: never the entry
    got_ln, want_ln = K.layer_norm_fwd(x, w, b, 1e-5, None), K.layer_norm_fwd(x, w, b, 1e-5, "cpp")
    for g, r in zip(got + got_ln, want + want_ln):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert torch.equal(g, r)
    rs, (mu_ln, rs_ln) = got[1], got_ln[1:]
    assert rs.dtype == torch.float32 and rs.shape == x.shape[:-1]
    bwd = K.rms_norm_bwd(dy, x, rs, w), K.layer_norm_bwd(dy, x, mu_ln, rs_ln, w)
    assert C._fast_rms_norm_bwd(dy, x, rs, w) is not None
    monkeypatch.setattr(K, "_ENTRIES", {"_fast_rms_norm_bwd": lambda *a: None, "_fast_layer_norm_bwd": lambda *a: None})
    ref = K.rms_norm_bwd(dy, x, rs, w), K.layer_norm_bwd(dy, x, mu_ln, rs_ln, w)
    for g, r in zip(bwd[0] + bwd[1], ref[0] + ref[1]):
        assert g.dtype == r.dtype == dtype and torch.equal(g, r)


def test_norm_autograd_entries_decline_what_is_not_plain():
    """None (and nothing computed) for everything the Python path must handle: the caller
    then takes it, with the facade's checks and messages."""
    C = cpp_native()
    to.rms_norm(torch.ones(1, 4), torch.ones(4))
    x, dy, w, b = _norm_inputs(torch.float32, (4, 16))
    rs = torch.ones(4)
    assert C._fast_rms_norm_stats(x, w, 1e-5) is not None and C._fast_rms_norm_bwd(dy, x, rs, w) is not None
    declined = [
        C._fast_rms_norm_stats(x.t().contiguous().t(), w, 1e-5),         # not C-contiguous
        C._fast_rms_norm_stats(x, w.half(), 1e-5),                        # weight of another dtype
        C._fast_rms_norm_stats(x, w, 1),                                  # eps not a float
        C._fast_rms_norm_stats(x, w, 1e-5, None),                         # no out= here
        C._fast_rms_norm_stats(x.requires_grad_(), w, 1e-5),              # grad on: autograd records it
        C._fast_layer_norm_stats(x.detach(), w, b[:8], 1e-5),             # bias of another length
        C._fast_rms_norm_stats(x.double(), w.double(), 1e-5),             # float64
        C._fast_rms_norm_bwd(dy, x.detach(), torch.ones(3), w),           # statistics for 3 rows of 4
        C._fast_rms_norm_bwd(dy, x.detach(), rs.double(), w),             # statistics not float32
        C._fast_rms_norm_bwd(dy[:2], x.detach(), rs, w),                  # dy of another shape
        C._fast_rms_norm_bwd(dy[0], x.detach()[0], torch.ones(()), w),    # 1-D x: 0-d statistics
        C._fast_layer_norm_bwd(dy, x.detach(), rs, w),                    # mu missing
    ]
    assert all(r is None for r in declined)


@pytest.mark.parametrize("op", ["rms_norm", "silu", "add_rms_norm"])
def test_autograd_forward_never_bypasses_an_override(op):
    """An autograd forward takes the op's native entry (the norms' with statistics, the
    others' plain one, inside the Function where grad mode is off) only as a plain call would:
    ``backend=`` and ``use_backend()`` reach the named backend (the NumPy reference here), and
    gradients agree with the entry's."""
    x, dy, w, _ = _norm_inputs(torch.float32, (3, 32))
    p = torch.nn.Parameter(w.clone())
    fn = {"rms_norm": lambda **k: to.rms_norm(x, p, **k), "silu": lambda **k: to.silu(p.view(1, 32), **k),
          "add_rms_norm": lambda **k: sum(to.add_rms_norm(x, x, p, **k))}[op]
    to.rms_norm(x, w), to.silu(x), to.add_rms_norm(x, x, w)
    grads = []
    for how in ("entry", "backend", "context"):
        p.grad = None
        n = _entry_calls(op)
        if how == "entry":
            y = fn()
        elif how == "backend":
            y = fn(backend="numpy")
        else:
            with to.use_backend("numpy"):
                y = fn()
        assert _entry_calls(op) == n + (how == "entry"), how
        assert y.grad_fn is not None
        y.backward(torch.ones_like(y))
        grads.append((y.detach(), p.grad.clone()))
    for y, g in grads[1:]:
        torch.testing.assert_close(y, grads[0][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(g, grads[0][1], rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_backward_entries_equal_the_python_path(dtype, monkeypatch):
    """``_fast_act_bwd``, ``_fast_glu_bwd`` and ``_fast_softmax_bwd`` give bit for bit what
    the Python path gives (the native bindings on views, tex's adapters for silu, tanh-GELU,
    relu and softmax), and decline what is not plain."""
    from tensor_ops.torch import _kernels as K
    C = cpp_native()
    to.rms_norm(torch.ones(1, 4), torch.ones(4))       # hands the module torch's objects
    g = torch.Generator().manual_seed(1)
    x, dy = (torch.randn(3, 5, 66, generator=g).to(dtype) for _ in "ab")
    dyh = torch.randn(3, 5, 33, generator=g).to(dtype)
    y = torch.softmax(x.float(), -1).to(dtype)
    calls = [(K.act_bwd, (a, dy, x)) for a in ("silu", "gelu", "gelu_tanh", "relu")]
    calls += [(K.glu_bwd, (a, dyh, x)) for a in ("silu", "gelu", "gelu_tanh")]
    calls += [(K.softmax_bwd, (dy, y, -1, s)) for s in (1.0, 0.125)] + [(K.softmax_bwd, (dy, y, 2))]
    got = [f(*a) for f, a in calls]
    monkeypatch.setattr(K, "_ENTRIES", {k: (lambda *a: None) for k in
                                        ("_fast_act_bwd", "_fast_glu_bwd", "_fast_softmax_bwd")})
    for (f, a), r in zip(calls, got):
        want = f(*a)
        assert r.dtype == want.dtype == dtype and torch.equal(r, want), (f.__name__, a[0], a[3:])
    assert C._fast_act_bwd(dy, x, "silu") is not None and C._fast_glu_bwd(dyh, x, "silu") is not None
    declined = [
        C._fast_act_bwd(dy, x, "tanh"),                    # not an activation of these ops
        C._fast_act_bwd(dy[:2], x, "silu"),                # dy of another shape
        C._fast_act_bwd(dy.float() if dtype != torch.float32 else dy.half(), x, "silu"),  # another dtype
        C._fast_act_bwd(dy, x.transpose(0, 1), "silu"),    # not C-contiguous
        C._fast_glu_bwd(dyh, x, "relu"),                   # no gated relu
        C._fast_glu_bwd(dy, x, "silu"),                    # dy not halved
        C._fast_glu_bwd(dyh[..., :32], x[..., :65].contiguous(), "silu"),   # odd last axis
        C._fast_softmax_bwd(dy, y, 1),                     # scale not a float
        C._fast_softmax_bwd(dy, y.double(), 1.0),          # float64
    ]
    assert all(r is None for r in declined)
