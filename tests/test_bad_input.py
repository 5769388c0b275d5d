"""Bad-input catalogue: every case on every available backend (issue 8).

Each case is either

- ``raises(exc, fragment, arg)``: every backend raises exactly ``exc`` (not a subclass
  picked by accident), the message contains ``fragment`` and names ``arg``, and the message
  is the same one the reference backend gives (validation happens once, before dispatch); or
- ``same``: every backend returns the reference backend's result (same shape and dtype,
  values within the dtype's tolerance, NaN where the reference has NaN) — and, for the
  reference itself, the fp64 oracle of ``tests/_reference.py`` where one is given.

Facade cases run on ``numpy``, ``cpp``, ``opencl`` and ``cuda`` (the reference is
``numpy``); tex cases on every tex backend (reference ``torch``). A backend that is not
available here, or does not implement the case's op, is a skip with its reason. Under
``TENSOR_OPS_BACKEND=<name>`` only that backend runs. Cases marked ``bug`` document a known
defect (see CONTRIBUTING.md) and are ``xfail`` until the fix lands.

The table in CONTRIBUTING.md ("Bad-input catalogue") is generated from ``CASES`` by
``python -m tests.test_bad_input`` and checked by ``test_contributing_table_is_current``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import BackendFallbackWarning
from tensor_ops.testing import oracles as R
from tests.conftest import BACKENDS, backend_impl, forced_backend

ROOT = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(8)
X = RNG.standard_normal((4, 8)).astype(np.float32)
X16 = X.astype(np.float16)
W = (1.0 + 0.25 * RNG.standard_normal(8)).astype(np.float32)
B = (0.5 * RNG.standard_normal(8)).astype(np.float32)
CS = np.cos(RNG.standard_normal((4, 4))).astype(np.float32)
SN = np.sin(RNG.standard_normal((4, 4))).astype(np.float32)
BIG = RNG.standard_normal((8, 16)).astype(np.float32)          # parent of strided views


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose data pointer is 1 byte off its dtype's alignment."""
    raw = np.zeros(a.nbytes + a.itemsize + 1, np.uint8)
    off = 1 if raw.ctypes.data % a.itemsize == 0 else 2
    out = np.ndarray(a.shape, a.dtype, buffer=raw, offset=off)
    out[...] = a
    assert not out.flags.aligned
    return out


def _readonly(shape, dtype=np.float32) -> np.ndarray:
    a = np.zeros(shape, dtype)
    a.setflags(write=False)
    return a


def _torch():
    return pytest.importorskip("torch", reason="torch not installed: torch cases skip")


# --------------------------------------------------------------------------- the catalogue
@dataclass
class Case:
    id: str
    api: str                         # "facade" or "tex"
    op: str                          # op that would be dispatched (availability / skip)
    what: str                        # one line for the table
    call: Callable                   # call(backend) -> result
    exc: Optional[type] = None       # expected exception type, or None for "same result"
    frag: str = ""                   # fragment of the message
    arg: str = ""                    # argument the message must name
    oracle: Optional[Callable] = None   # fp64 expected result (for "same" cases)
    bug: str = ""                    # known defect: xfail with this reason
    kw_only: bool = False            # exercises the backend= keyword itself

    @property
    def expect(self) -> str:
        if self.exc is None:
            return "same result as reference"
        return f"`{self.exc.__name__}` naming `{self.arg}`"


CASES: list[Case] = []


def raises(id, op, what, call, exc, frag, arg, api="facade", bug="", kw_only=False):
    CASES.append(Case(id, api, op, what, call, exc, frag, arg, bug=bug, kw_only=kw_only))


def same(id, op, what, call, oracle=None, api="facade", bug=""):
    CASES.append(Case(id, api, op, what, call, oracle=oracle, bug=bug))


# ---- facade: dtypes and kinds
raises("x-int32", "rms_norm", "x of dtype int32", lambda b: to.rms_norm(X.astype(np.int32), W, backend=b),
       TypeError, "x must have dtype float16, bfloat16, float32 or float64, got int32", "x")
raises("x-bool", "silu", "x of dtype bool", lambda b: to.silu(X > 0, backend=b), TypeError, "got bool", "x")
raises("x-complex", "silu", "x of dtype complex64", lambda b: to.silu(X.astype(np.complex64), backend=b),
       TypeError, "got complex64", "x")
raises("x-uint16-bf16-bits", "gelu", "bfloat16 bit pattern passed as uint16",
       lambda b: to.gelu(X.view(np.uint16), backend=b), TypeError, "got uint16", "x")
raises("x-object", "relu", "x of dtype object", lambda b: to.relu(np.array([1.0, None]), backend=b),
       TypeError, "got object", "x")
raises("x-list", "rms_norm", "x a Python list", lambda b: to.rms_norm([[1.0] * 8], W, backend=b),
       TypeError, "x must be an array", "x")
raises("x-none", "softmax", "x is None", lambda b: to.softmax(None, backend=b), TypeError, "got NoneType", "x")
raises("w-int32", "rms_norm", "weight of dtype int32", lambda b: to.rms_norm(X, W.astype(np.int32), backend=b),
       TypeError, "weight must have dtype float16, bfloat16, float32 or float64, got int32", "weight")
raises("w-short", "rms_norm", "weight length n-1", lambda b: to.rms_norm(X, W[:7], backend=b),
       ValueError, "weight must have shape (8,) to match x.shape[-1] = 8, got (7,)", "weight")
raises("w-long", "layer_norm", "weight length n+1", lambda b: to.layer_norm(X, np.ones(9, np.float32), backend=b),
       ValueError, "got (9,)", "weight")
raises("w-2d", "rms_norm", "weight of shape (1, n)", lambda b: to.rms_norm(X, W[None], backend=b),
       ValueError, "got (1, 8)", "weight")
raises("w-0d", "rms_norm", "weight a NumPy scalar", lambda b: to.rms_norm(X, np.float32(1), backend=b),
       TypeError, "weight must be an array", "weight")
raises("w-list", "layer_norm", "weight a Python list", lambda b: to.layer_norm(X, [1.0] * 8, backend=b),
       TypeError, "weight must be an array", "weight")
raises("bias-short", "layer_norm", "bias length n+1", lambda b: to.layer_norm(X, W, np.ones(9, np.float32), backend=b),
       ValueError, "bias must have shape (8,)", "bias")
raises("bias-int", "layer_norm", "bias of dtype int64", lambda b: to.layer_norm(X, W, np.ones(8, np.int64), backend=b),
       TypeError, "bias must have dtype", "bias")
# ---- facade: shapes
raises("x-0d-silu", "silu", "0-d x (elementwise)", lambda b: to.silu(np.array(1.0, np.float32), backend=b),
       ValueError, "x must have at least 1 dimension", "x")
raises("x-0d-norm", "rms_norm", "0-d x (norm)", lambda b: to.rms_norm(np.array(1.0, np.float32), W[:1], backend=b),
       ValueError, "at least 1 dimension", "x")
raises("swiglu-odd", "swiglu", "odd last dim for a gated op", lambda b: to.swiglu(np.ones((2, 7), np.float32), backend=b),
       ValueError, "x.shape[-1] must be even for swiglu", "x")
raises("geglu-odd-empty", "geglu", "odd last dim, zero rows (checked before the empty shortcut)",
       lambda b: to.geglu(np.ones((0, 7), np.float32), backend=b), ValueError, "must be even for geglu", "x")
raises("w-short-empty", "rms_norm", "wrong weight with zero rows", lambda b: to.rms_norm(X[:0], W[:5], backend=b),
       ValueError, "weight must have shape (8,)", "weight")
raises("softmax-axis-range", "softmax", "axis out of range", lambda b: to.softmax(X, axis=2, backend=b),
       ValueError, "axis must be in [-2, 1]", "axis")
raises("softmax-axis-float", "softmax", "axis a float", lambda b: to.softmax(X, axis=1.0, backend=b),
       TypeError, "axis must be an int", "axis")
raises("softmax-axis-bool", "softmax", "axis a bool", lambda b: to.softmax(X, axis=True, backend=b),
       TypeError, "axis must be an int, got True", "axis")
raises("rope-1d", "rope", "rope of a 1-D x", lambda b: to.rope(X[0], CS[:1], SN[:1], backend=b),
       ValueError, "x must have shape (..., T, n) with at least 2 dims", "x")
raises("rope-odd", "rope", "rope with odd n", lambda b: to.rope(X[:, :7], CS, SN, backend=b),
       ValueError, "x.shape[-1] must be even for rope", "x")
raises("rope-cos-T", "rope", "cos with the wrong T", lambda b: to.rope(X, CS[:3], SN[:3], backend=b),
       ValueError, "cos must have shape (T, n) = (4, 8) or (T, n/2) = (4, 4)", "cos")
raises("rope-cos-sin", "rope", "cos and sin of different shapes",
       lambda b: to.rope(X, CS, np.ones((4, 8), np.float32), backend=b), ValueError, "cos and sin must have the same shape", "sin")
raises("rope-cos-int", "rope", "cos of dtype int32", lambda b: to.rope(X, CS.astype(np.int32), SN, backend=b),
       TypeError, "cos must have dtype", "cos")
raises("rope-interleaved", "rope", "interleaved a str", lambda b: to.rope(X, CS, SN, interleaved="yes", backend=b),
       TypeError, "interleaved must be a bool", "interleaved")
raises("matmul-k", "matmul", "matmul inner dims differ", lambda b: to.matmul(X, np.ones((7, 2), np.float32), backend=b),
       ValueError, "a.shape (4, 8) and b.shape (7, 2) are not compatible", "a.shape")
raises("matmul-batch", "matmul", "matmul batch dims do not broadcast",
       lambda b: to.matmul(np.ones((2, 3, 4), np.float32), np.ones((5, 4, 2), np.float32), backend=b),
       ValueError, "do not broadcast", "b.shape")
raises("matmul-int", "matmul", "matmul of int32", lambda b: to.matmul(np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), backend=b),
       TypeError, "a must have dtype", "a")
# ---- facade: eps and enum arguments
raises("eps-neg", "rms_norm", "eps = -1", lambda b: to.rms_norm(X, W, eps=-1.0, backend=b),
       ValueError, "eps must be a finite number >= 0, got -1.0", "eps")
raises("eps-nan", "layer_norm", "eps = NaN", lambda b: to.layer_norm(X, W, eps=float("nan"), backend=b),
       ValueError, "eps must be a finite number >= 0, got nan", "eps")
raises("eps-inf", "rms_norm", "eps = inf", lambda b: to.rms_norm(X, W, eps=float("inf"), backend=b),
       ValueError, "got inf", "eps")
raises("eps-str", "rms_norm", "eps a str", lambda b: to.rms_norm(X, W, eps="1e-5", backend=b),
       TypeError, "eps must be a real number, got '1e-5'", "eps")
raises("eps-none", "layer_norm", "eps None", lambda b: to.layer_norm(X, W, eps=None, backend=b),
       TypeError, "eps must be a real number, got None", "eps")
raises("eps-bool", "rms_norm", "eps True", lambda b: to.rms_norm(X, W, eps=True, backend=b),
       TypeError, "got True", "eps")
raises("eps-complex", "rms_norm", "eps complex", lambda b: to.rms_norm(X, W, eps=1j, backend=b),
       TypeError, "got 1j", "eps")
raises("gelu-approx", "gelu", "approximate='erf'", lambda b: to.gelu(X, "erf", backend=b),
       ValueError, "approximate must be 'none' (exact erf) or 'tanh', got 'erf'", "approximate")
raises("geglu-approx-none", "geglu", "approximate=None", lambda b: to.geglu(X, approximate=None, backend=b),
       ValueError, "got None", "approximate")
# ---- facade: out=
raises("out-shape", "silu", "out of the wrong shape", lambda b: to.silu(X, out=np.empty((4, 9), np.float32), backend=b),
       ValueError, "out must have shape (4, 8), got (4, 9)", "out")
raises("out-dtype", "silu", "out of the wrong dtype", lambda b: to.silu(X, out=np.empty((4, 8), np.float16), backend=b),
       TypeError, "out must have dtype float32 (the dtype of x), got float16", "out")
raises("out-gated-shape", "swiglu", "gated out with x's shape", lambda b: to.swiglu(X, out=np.empty((4, 8), np.float32), backend=b),
       ValueError, "out must have shape (4, 4)", "out")
raises("out-readonly", "rms_norm", "read-only out", lambda b: to.rms_norm(X, W, out=_readonly((4, 8)), backend=b),
       ValueError, "out is read-only", "out")
raises("out-broadcast", "relu", "out a broadcast (read-only) view",
       lambda b: to.relu(X, out=np.broadcast_to(np.zeros(8, np.float32), (4, 8)), backend=b), ValueError, "out is read-only", "out")
raises("out-list", "relu", "out a Python list", lambda b: to.relu(X, out=[0.0] * 32, backend=b),
       TypeError, "out must be an array", "out")
# ---- facade: mixed devices / kinds
raises("mixed-torch-x-numpy-w", "rms_norm", "torch CPU tensor x with a NumPy weight",
       lambda b: to.rms_norm(_torch().from_numpy(X), W, backend=b), TypeError,
       "weight is a numpy array but x is a torch array: pass both on the same device", "weight")
raises("mixed-numpy-x-torch-w", "rms_norm", "NumPy x with a torch weight",
       lambda b: to.rms_norm(X, _torch().from_numpy(W), backend=b), TypeError,
       "weight is a torch array but x is a numpy array", "weight")
raises("mixed-numpy-x-torch-out", "silu", "NumPy x with a torch out",
       lambda b: to.silu(X, out=_torch().empty(4, 8), backend=b), TypeError, "out is a torch array", "out")
raises("mixed-rope-torch-cos", "rope", "NumPy x with torch CPU cos",
       lambda b: to.rope(X, _torch().from_numpy(CS), SN, backend=b), TypeError,
       "cos is a torch array but x is a numpy array", "cos")
same("torch-cpu-x", "silu", "torch CPU tensor x (zero-copy; a torch tensor comes back)",
     lambda b: to.silu(_torch().from_numpy(X), backend=b), lambda: R.silu(X))
# ---- facade: torch tensors (CPU: zero-copy views through the NumPy path, the same wording)
def _tt(a, dtype=None, grad=False):
    t = _torch().from_numpy(np.ascontiguousarray(a))
    t = t if dtype is None else t.to(dtype)
    return t.requires_grad_() if grad else t


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


raises("torch-int", "rms_norm", "torch int32 tensor x", lambda b: to.rms_norm(_tt(X.astype(np.int32)), _tt(W), backend=b),
       TypeError, "x must have dtype float16, bfloat16, float32 or float64, got int32", "x")
raises("torch-bool", "silu", "torch bool tensor x", lambda b: to.silu(_tt(X > 0), backend=b), TypeError, "got bool", "x")
raises("torch-complex", "silu", "torch complex64 tensor x", lambda b: to.silu(_tt(X.astype(np.complex64)), backend=b),
       TypeError, "got complex64", "x")
raises("torch-int-weight", "layer_norm", "torch int64 weight", lambda b: to.layer_norm(_tt(X), _tt(np.ones(8, np.int64)),
       backend=b), TypeError, "weight must have dtype float16, bfloat16, float32 or float64, got int64", "weight")
raises("torch-two-devices", "rms_norm", "torch x on cpu, weight on meta",
       lambda b: to.rms_norm(_tt(X), _torch().ones(8, device="meta"), backend=b), ValueError,
       "weight is on meta but x is on cpu: pass both on the same device", "weight")
raises("torch-out-device", "silu", "torch out on another device (meta)",
       lambda b: to.silu(_tt(X), out=_torch().empty(4, 8, device="meta"), backend=b), ValueError,
       "out is on meta but x is on cpu", "out")
raises("torch-out-dtype", "silu", "torch out of another dtype", lambda b: to.silu(_tt(X), out=_torch().empty(4, 8,
       dtype=_torch().float16), backend=b), TypeError, "out must have dtype float32 (the dtype of x), got float16", "out")
raises("torch-out-numpy", "silu", "torch x with a NumPy out", lambda b: to.silu(_tt(X), out=np.empty((4, 8), np.float32),
       backend=b), TypeError, "out is a numpy array but x is a torch array", "out")
raises("torch-out-grad", "gelu", "out= with an input that requires grad (torch refuses it too)",
       lambda b: to.gelu(_tt(X, grad=True), out=_torch().empty(4, 8), backend=b), ValueError,
       "out= cannot be used when an argument requires grad (x has requires_grad=True)", "x")
raises("torch-meta-x", "silu", "torch tensor on a device nothing serves (meta)",
       lambda b: to.silu(_torch().ones(4, 8, device="meta"), backend=b), ValueError,
       "x is a torch tensor on device 'meta'", "x")
raises("bf16-out-f32", "relu", "bfloat16 out for a float32 x", lambda b: to.relu(X, out=np.empty((4, 8), _bf16()), backend=b),
       TypeError, "out must have dtype float32 (the dtype of x), got bfloat16", "out")
raises("torch-bf16-bits-int16", "silu", "bfloat16 bits in an int16 tensor", lambda b: to.silu(_tt(X.view(np.int16)),
       backend=b), TypeError, "got int16", "x")
same("torch-strided", "layer_norm", "torch column-strided x and negative-stride weight",
     lambda b: to.layer_norm(_tt(BIG)[:, ::2], _tt(BIG[0, ::-2]), backend=b),
     lambda: R.layer_norm(BIG[:, ::2], BIG[0, ::-2]))
same("torch-out-strided", "rms_norm", "torch non-contiguous out (written through the view)",
     lambda b: _torch_out_strided(b), lambda: R.rms_norm(X, W))
same("torch-out-is-x", "swiglu", "torch gated out is x's gate half (in place)",
     lambda b: _torch_out_gate(b), lambda: R.swiglu(X))
same("torch-bf16", "rms_norm", "torch bfloat16 x and weight", lambda b: to.rms_norm(_tt(X, _torch().bfloat16),
     _tt(W, _torch().bfloat16), backend=b))
same("torch-f64", "softmax", "torch float64 x, softmax over axis 0", lambda b: to.softmax(_tt(X.astype(np.float64)), axis=0,
     backend=b), lambda: R.softmax(X, axis=0))
same("torch-rope-half-table", "rope", "torch rope with (T, n/2) tables", lambda b: to.rope(_tt(X), _tt(CS), _tt(SN),
     backend=b), lambda: R.rope(X, CS, SN))
same("torch-matmul-bf16", "matmul", "torch bfloat16 matmul", lambda b: to.matmul(_tt(BIG[:4, :8], _torch().bfloat16),
     _tt(BIG[:, :3], _torch().bfloat16), backend=b))
same("torch-empty", "gelu", "torch tensor with zero rows", lambda b: to.gelu(_tt(X[:0]), backend=b))
# ---- facade: bfloat16 NumPy arrays (ml_dtypes)
same("bf16-np", "swiglu", "ml_dtypes bfloat16 x", lambda b: to.swiglu(X.astype(_bf16()), backend=b),
     lambda: R.swiglu(X.astype(_bf16())))
same("bf16-f32-weight", "rms_norm", "bfloat16 x with a float32 weight (cast to bfloat16)",
     lambda b: to.rms_norm(X.astype(_bf16()), W, backend=b), lambda: R.rms_norm(X.astype(_bf16()), W.astype(_bf16())))
same("bf16-matmul-f16", "matmul", "bfloat16 @ float16 (no common NumPy type: float32)",
     lambda b: to.matmul(X.astype(_bf16()), BIG[:8, :3].astype(np.float16), backend=b))
same("bf16-nan-inf", "gelu", "NaN/±Inf through bfloat16 gelu",
     lambda b: to.gelu(np.array([[np.nan, 1.0, np.inf, -np.inf, -2.0, 0.0, -0.0, 3.0]], _bf16()), backend=b))


def _torch_out_strided(b):
    torch = _torch()
    big = torch.full((4, 16), 7.0)
    r = to.rms_norm(_tt(X), _tt(W), out=big[:, ::2], backend=b)
    assert (big[:, 1::2] == 7.0).all(), "out= wrote outside its view"
    assert r.data_ptr() == big.data_ptr()
    return r


def _torch_out_gate(b):
    x = _tt(X).clone()
    return to.swiglu(x, out=x[:, 4:], backend=b)


same("x-matrix-subclass", "silu", "np.matrix x (ndarray subclass): computed as a plain ndarray",
     lambda b: to.silu(np.matrix(X), backend=b))
raises("x-masked-array", "silu", "numpy.ma.MaskedArray x (its mask would be silently dropped)",
       lambda b: to.silu(np.ma.masked_array(X, X < 0), backend=b), TypeError, "x is a numpy.ma.MaskedArray", "x")
# ---- facade: argument counts and the backend argument
raises("nargs-extra", "silu", "silu(x, x): one positional too many", lambda b: to.silu(X, X, backend=b),
       TypeError, "takes 1 positional argument", "silu()")
raises("nargs-missing", "rms_norm", "rms_norm(x): weight missing", lambda b: to.rms_norm(X, backend=b),
       TypeError, "missing 1 required positional argument: 'weight'", "weight")
raises("kw-unknown", "gelu", "unknown keyword", lambda b: to.gelu(X, approx="tanh", backend=b),
       TypeError, "unexpected keyword argument 'approx'", "approx")
raises("backend-unknown", "silu", "backend order naming an unknown backend", lambda b: to.silu(X, backend=b + ",gpu"),
       ValueError, "unknown backend 'gpu'", "backend", kw_only=True)
raises("backend-int", "silu", "backend=3", lambda b: to.silu(X, backend=3),
       TypeError, "backend must be a str", "backend", kw_only=True)


def _alias_same(b):
    x = X.copy()
    return to.silu(x, out=x, backend=b)


def _alias_partial(b):
    buf = BIG.copy()
    return to.gelu(buf[:, :8], out=buf[:, 4:12], backend=b)


def _alias_softmax(b):
    x = X.copy()
    return to.softmax(x, axis=0, out=x, backend=b)


def _out_strided(b):
    big = np.full((4, 16), 7.0, np.float32)
    r = to.silu(X, out=big[:, ::2], backend=b)
    assert (big[:, 1::2] == 7.0).all(), "out= wrote outside its view"
    return r


def _out_misaligned(b):
    o = _misaligned(np.zeros((4, 8), np.float32))
    r = to.rms_norm(X, W, out=o, backend=b)
    assert r is o
    return r


def _out_aliases_weight(b):
    w = W.copy()
    return to.rms_norm(X[:1], w, out=w.reshape(1, 8), backend=b)


def _out_aliases_bias(b):
    bias = B.copy()
    return to.layer_norm(X[:1], W, bias, out=bias.reshape(1, 8), backend=b)


def _out_row0_is_weight(b):
    """Several rows, out's first row is the weight: rows after the first must still see the
    weight as it was (a kernel writing row 0 in place would corrupt them)."""
    buf = np.zeros((4, 8), np.float32)
    buf[0] = W
    return to.rms_norm(X, buf[0], out=buf, backend=b)


def _out_row0_is_bias(b):
    buf = np.zeros((4, 8), np.float32)
    buf[0] = B
    return to.layer_norm(X, W, buf[0], out=buf, backend=b)


def _out_row0_is_sin(b):
    buf = np.zeros((4, 8), np.float32)
    buf[:, :] = np.concatenate([SN, SN], -1)
    return to.rope(X, np.concatenate([CS, CS], -1), buf, out=buf, backend=b)


def _out_is_gate_half(b):
    x = X.copy()
    return to.swiglu(x, out=x[:, 4:], backend=b)


def _out_is_matmul_a(b):
    a = BIG[:8, 8:].copy()
    return to.matmul(a, BIG[:8, :8].copy(), out=a, backend=b)


def _cos_full():
    return np.concatenate([CS, CS], -1)


def _out_aliases_cos(b):
    c = _cos_full()
    return to.rope(X, c, np.concatenate([SN, SN], -1), out=c, backend=b)


def _out_aliases_matmul_b(b):
    m = BIG[:8, :8].copy()
    return to.matmul(BIG[:8, 8:].copy(), m, out=m, backend=b)


# ---- facade: views and buffers (same result as the reference)
same("view-rows", "rms_norm", "row-strided view x[::2]", lambda b: to.rms_norm(BIG[::2, :8], W, backend=b),
     lambda: R.rms_norm(BIG[::2, :8], W))
same("view-cols", "silu", "column-strided view x[:, ::2]", lambda b: to.silu(BIG[:, ::2], backend=b),
     lambda: R.silu(BIG[:, ::2]))
same("view-neg", "layer_norm", "negative strides x[::-1, ::-1]",
     lambda b: to.layer_norm(BIG[::-1, ::-1], np.ones(16, np.float32), backend=b),
     lambda: R.layer_norm(BIG[::-1, ::-1], np.ones(16), eps=1e-5))
same("view-fortran", "softmax", "Fortran-ordered (transposed) x", lambda b: to.softmax(BIG.T, backend=b),
     lambda: R.softmax(BIG.T))
same("view-neg-gated", "swiglu", "negative-stride x for a gated op", lambda b: to.swiglu(BIG[::-1], backend=b),
     lambda: R.swiglu(BIG[::-1]))
same("view-w-strided", "rms_norm", "strided weight w[::2]", lambda b: to.rms_norm(BIG[:, :8], BIG[0, ::2], backend=b),
     lambda: R.rms_norm(BIG[:, :8], BIG[0, ::2]))
same("view-rope-neg", "rope", "negative-stride x and cos for rope", lambda b: to.rope(X[::-1], CS[::-1], SN, backend=b),
     lambda: R.rope(X[::-1], CS[::-1], SN))
same("misaligned-x", "silu", "x 1 byte off alignment", lambda b: to.silu(_misaligned(X), backend=b), lambda: R.silu(X))
same("misaligned-w", "layer_norm", "weight and bias 1 byte off alignment",
     lambda b: to.layer_norm(X, _misaligned(W), _misaligned(B), backend=b), lambda: R.layer_norm(X, W, B))
same("out-strided", "silu", "non-contiguous out (written through the view only)", _out_strided, lambda: R.silu(X))
same("out-misaligned", "rms_norm", "misaligned out", _out_misaligned, lambda: R.rms_norm(X, W))
same("out-is-x", "silu", "out is x (in place)", _alias_same, lambda: R.silu(X))
same("out-overlap", "gelu", "out partially overlaps x", _alias_partial, lambda: R.gelu(BIG[:, :8]))
same("out-softmax-axis0", "softmax", "out is x, softmax over axis 0", _alias_softmax, lambda: R.softmax(X, axis=0))
same("out-aliases-weight", "rms_norm", "out aliases weight (one row)", _out_aliases_weight, lambda: R.rms_norm(X[:1], W))
same("out-row0-weight", "rms_norm", "out's first row is weight (4 rows)", _out_row0_is_weight, lambda: R.rms_norm(X, W))
same("out-row0-bias", "layer_norm", "out's first row is bias (4 rows)", _out_row0_is_bias, lambda: R.layer_norm(X, W, B))
same("out-is-sin", "rope", "out is the (T, n) sin table", _out_row0_is_sin, lambda: R.rope(X, CS, SN))
same("out-is-gate", "swiglu", "gated out is x's second half (the gate)", _out_is_gate_half, lambda: R.swiglu(X))
same("out-is-matmul-a", "matmul", "matmul out is a", _out_is_matmul_a, lambda: R.matmul(BIG[:8, 8:], BIG[:8, :8]))
same("out-aliases-bias", "layer_norm", "out aliases bias (one row)", _out_aliases_bias,
     lambda: R.layer_norm(X[:1], W, B))
same("out-aliases-cos", "rope", "out aliases cos (HF-style (T, n) angles)", _out_aliases_cos,
     lambda: R.rope(X, CS, SN))
same("out-aliases-matmul-b", "matmul", "matmul out aliases b", _out_aliases_matmul_b,
     lambda: R.matmul(BIG[:8, 8:], BIG[:8, :8]))
same("w-f64-on-f32", "rms_norm", "float64 weight for float32 x (cast to x's dtype)",
     lambda b: to.rms_norm(X, W.astype(np.float64), backend=b), lambda: R.rms_norm(X, W))
same("w-f32-on-f16", "layer_norm", "float32 weight/bias for float16 x",
     lambda b: to.layer_norm(X16, W, B, backend=b), lambda: R.layer_norm(X16, W.astype(np.float16), B.astype(np.float16)))
same("x-1d", "rms_norm", "1-D x (one row)", lambda b: to.rms_norm(X[0], W, backend=b), lambda: R.rms_norm(X[0], W))
same("x-4d", "gelu", "4-D x", lambda b: to.gelu(BIG.reshape(2, 2, 2, 16), "tanh", backend=b),
     lambda: R.gelu(BIG.reshape(2, 2, 2, 16), "tanh"))
same("x-odd-width", "softmax", "width 4097 (not a multiple of any SIMD width)",
     lambda b: to.softmax(np.linspace(-3, 3, 2 * 4097, dtype=np.float32).reshape(2, 4097), backend=b),
     lambda: R.softmax(np.linspace(-3, 3, 2 * 4097, dtype=np.float32).reshape(2, 4097)))
same("empty-rows", "rms_norm", "zero rows (0, n)", lambda b: to.rms_norm(X[:0], W, backend=b))
same("empty-width", "layer_norm", "zero width (rows, 0) with weight (0,)",
     lambda b: to.layer_norm(np.empty((3, 0), np.float32), np.empty(0, np.float32), backend=b))
same("empty-rope", "rope", "rope with T = 0", lambda b: to.rope(np.empty((0, 8), np.float32), CS[:0], SN[:0], backend=b))
same("empty-matmul", "matmul", "matmul with k = 0 (zeros)",
     lambda b: to.matmul(np.ones((3, 0), np.float32), np.ones((0, 2), np.float32), backend=b),
     lambda: np.zeros((3, 2)))
# ---- facade: values
_NANINF = np.array([[np.nan, 1.0, np.inf, -np.inf, -2.0, 0.0, -0.0, 3.0]], np.float32)
same("nan-inf-silu", "silu", "NaN/±Inf through silu", lambda b: to.silu(_NANINF, backend=b), lambda: R.silu(_NANINF))
same("nan-inf-relu", "relu", "NaN/±Inf through relu (NaN propagates)", lambda b: to.relu(_NANINF, backend=b), lambda: R.relu(_NANINF))
same("nan-inf-gelu", "gelu", "NaN/±Inf through gelu tanh", lambda b: to.gelu(_NANINF, "tanh", backend=b))
same("nan-row-norm", "rms_norm", "a NaN poisons only its row", lambda b: to.rms_norm(np.vstack([_NANINF, X[:1]]), W, backend=b))
same("softmax-neg-inf-row", "softmax", "softmax of an all -inf row (NaN, like torch)",
     lambda b: to.softmax(np.array([[-np.inf] * 4, [0.0, 1.0, 2.0, 3.0]], np.float32), backend=b))
same("softmax-huge", "softmax", "softmax of ±1e30 (max-subtracted: finite)",
     lambda b: to.softmax(np.array([[1e30, 0.0, -1e30, 1e30]], np.float32), backend=b),
     lambda: R.softmax(np.array([[1e30, 0.0, -1e30, 1e30]])))
same("eps-zero-zero-row", "rms_norm", "eps=0 on an all-zero row (0/0 = NaN)",
     lambda b: to.rms_norm(np.zeros((2, 8), np.float32), W, eps=0.0, backend=b))
same("eps-huge", "rms_norm", "eps=1e30", lambda b: to.rms_norm(X, W, eps=1e30, backend=b), lambda: R.rms_norm(X, W, 1e30))
same("eps-np-types", "layer_norm", "eps as np.float32 / int",
     lambda b: to.layer_norm(X, W, B, eps=np.float32(1e-3), backend=b) + to.layer_norm(X, W, B, eps=0, backend=b),
     lambda: R.layer_norm(X, W, B, float(np.float32(1e-3))) + R.layer_norm(X, W, B, 0.0))
same("denormal", "rms_norm", "denormal inputs (1e-40)", lambda b: to.rms_norm(np.full((2, 8), 1e-40, np.float32), W, backend=b),
     lambda: R.rms_norm(np.full((2, 8), 1e-40, np.float32), W))
same("f16-extreme", "layer_norm", "float16 values near 65504 (fp32 math: no overflow)",
     lambda b: to.layer_norm(np.array([[60000, -60000, 65504, 1.0] * 2], np.float16), np.ones(8, np.float16), backend=b),
     lambda: R.layer_norm(np.array([[60000, -60000, 65504, 1.0] * 2], np.float16), np.ones(8)))
same("interleaved-np-bool", "rope", "interleaved as np.bool_", lambda b: to.rope(X, CS, SN, np.bool_(True), backend=b),
     lambda: R.rope(X, CS, SN, True))
same("softmax-axis-np-int", "softmax", "axis as np.int64(0)", lambda b: to.softmax(X, axis=np.int64(0), backend=b),
     lambda: R.softmax(X, axis=0))


# ---- facade: the fused residual add + norm (residual, out=(out_normed, out_sum))
RES = (0.5 * RNG.standard_normal((4, 8))).astype(np.float32)


def _pair_out():
    return np.empty((4, 8), np.float32), np.empty((4, 8), np.float32)


def _add_in_place(b):
    x, r = X.copy(), RES.copy()
    got = to.add_rms_norm(x, r, W, out=(x, r), backend=b)
    assert got[0] is x and got[1] is r
    return got


def _add_in_place_strided(b):
    """out=(x, residual) with column-strided x and residual (written through the views)."""
    bx, br = np.full((4, 16), 7.0, np.float32), np.full((4, 16), 7.0, np.float32)
    x, r = bx[:, ::2], br[:, ::2]
    x[...], r[...] = X, RES
    got = to.add_layer_norm(x, r, W, B, out=(x, r), backend=b)
    assert (bx[:, 1::2] == 7.0).all() and (br[:, 1::2] == 7.0).all(), "out= wrote outside its view"
    return got


def _add_out_is(b, which):
    x, r, w = X.copy(), RES.copy(), W.copy()
    o = {"same": None, "swapped": (r, x), "weight": (w.reshape(1, 8), np.empty((1, 8), np.float32)),
         "x-partial": None}[which]
    if which == "same":
        buf = np.empty((4, 8), np.float32)
        o = (buf, buf)
    if which == "x-partial":
        big = np.zeros((5, 8), np.float32)
        big[:4] = X
        return to.add_rms_norm(big[:4], r, w, out=(big[1:], np.empty((4, 8), np.float32)), backend=b)
    if which == "weight":
        return to.add_rms_norm(x[:1], r[:1], w, out=o, backend=b)
    return to.add_rms_norm(x, r, w, out=o, backend=b)


def _add_torch_in_place(b):
    torch = _torch()
    x, r = torch.from_numpy(X.copy()), torch.from_numpy(RES.copy())
    got = to.add_rms_norm(x, r, torch.from_numpy(W), out=(x, r), backend=b)
    assert got[0] is x and got[1] is r
    return got


raises("add-residual-shape", "add_rms_norm", "residual of another shape than x",
       lambda b: to.add_rms_norm(X, RES[:2], W, backend=b), ValueError,
       "residual must have the shape of x, (4, 8), got (2, 8)", "residual")
raises("add-residual-int", "add_layer_norm", "residual of dtype int32",
       lambda b: to.add_layer_norm(X, RES.astype(np.int32), W, backend=b), TypeError,
       "residual must have dtype float16, bfloat16, float32 or float64, got int32", "residual")
raises("add-residual-list", "add_rms_norm", "residual a Python list",
       lambda b: to.add_rms_norm(X, RES.tolist(), W, backend=b), TypeError, "residual must be an array", "residual")
raises("add-out-array", "add_rms_norm", "out one array, not a tuple of two",
       lambda b: to.add_rms_norm(X, RES, W, out=np.empty((4, 8), np.float32), backend=b), TypeError,
       "out must be a tuple of two arrays", "out")
raises("add-out-three", "add_layer_norm", "out a tuple of three arrays",
       lambda b: to.add_layer_norm(X, RES, W, out=(*_pair_out(), np.empty((4, 8), np.float32)), backend=b),
       TypeError, "got a tuple of 3", "out")
raises("add-out-shape", "add_rms_norm", "out[1] of the wrong shape",
       lambda b: to.add_rms_norm(X, RES, W, out=(_pair_out()[0], np.empty((4, 9), np.float32)), backend=b),
       ValueError, "out[1] must have shape (4, 8)", "out[1]")
raises("add-out-dtype", "add_rms_norm", "out[0] of another dtype",
       lambda b: to.add_rms_norm(X, RES, W, out=(np.empty((4, 8), np.float16), _pair_out()[1]), backend=b),
       TypeError, "out[0] must have dtype float32", "out[0]")
raises("add-out-readonly", "add_layer_norm", "read-only out[1]",
       lambda b: to.add_layer_norm(X, RES, W, B, out=(_pair_out()[0], _readonly((4, 8))), backend=b),
       ValueError, "out[1] is read-only", "out[1]")
raises("add-out-same", "add_rms_norm", "out[0] and out[1] the same array",
       lambda b: _add_out_is(b, "same"), ValueError, "out[0] and out[1] share memory", "out[1]")
raises("add-out-swapped", "add_rms_norm", "out=(residual, x): the in-place pairs swapped",
       lambda b: _add_out_is(b, "swapped"), ValueError, "out[0] shares memory with residual", "out[0]")
raises("add-out-weight", "add_rms_norm", "out[0] aliases weight (one row)",
       lambda b: _add_out_is(b, "weight"), ValueError, "out[0] shares memory with weight", "out[0]")
raises("add-out-x-partial", "add_rms_norm", "out[0] partially overlaps x (shifted by a row)",
       lambda b: _add_out_is(b, "x-partial"), ValueError, "out[0] shares memory with x", "out[0]")
same("add-in-place", "add_rms_norm", "out=(x, residual): vLLM's in-place form", _add_in_place,
     lambda: R.add_rms_norm(X, RES, W))
same("add-in-place-strided", "add_layer_norm", "in place on column-strided x and residual", _add_in_place_strided,
     lambda: R.add_layer_norm(X, RES, W, B))
same("add-torch-in-place", "add_rms_norm", "torch CPU tensors, out=(x, residual)", _add_torch_in_place)
same("add-residual-f32-on-f16", "add_rms_norm", "float32 residual and weight for float16 x (cast to float16)",
     lambda b: to.add_rms_norm(X16, RES, W, backend=b),
     lambda: R.add_rms_norm(X16, RES.astype(np.float16), W.astype(np.float16)))
same("add-f16-sum-overflow", "add_layer_norm", "float16 x + residual beyond 65504 (the sum is inf, the row NaN)",
     lambda b: to.add_layer_norm(np.array([[60000.0, 1.0, 2.0, 3.0] * 2, [1.0] * 8], np.float16),
                                 np.array([[60000.0, 0.0, 0.0, 0.0] * 2, [2.0] * 8], np.float16),
                                 np.ones(8, np.float16), backend=b))
same("add-empty", "add_rms_norm", "zero rows (0, n): two empty results", lambda b: to.add_rms_norm(X[:0], RES[:0], W, backend=b))


# ---- tex (TransformerEngine names on torch tensors)
def _t(a, dtype=None):
    torch = _torch()
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


def _tx():
    import tensor_ops.tex as tex
    return tex


def _rms(x, w, eps=1e-5, ln_out=None, q=None, otype=None):
    tex = _tx()
    return tex.rmsnorm_fwd(x, w, eps, ln_out, q, otype if otype is not None else tex.DType.kFloat32, 0, False)


def _tex_misaligned():
    torch = _torch()
    buf = torch.zeros(33)
    x = buf[1:].view(4, 8)            # storage offset 4 bytes: off every 16-byte vector boundary
    x.copy_(_t(X))
    return x


def _tex_ln_out_alias(b):
    x = _t(X).clone()
    return _rms(x, _t(W), ln_out=x)


raises("tex-input-int", "rmsnorm_fwd", "tex: input of dtype int32", lambda b: _rms(_t(X).int(), _t(W)),
       TypeError, "input has dtype torch.int32", "input", api="tex")
raises("tex-numpy-weight", "rmsnorm_fwd", "tex: torch input with a NumPy weight (mixed kinds)",
       lambda b: _rms(_t(X), W), TypeError, "weight must be a torch.Tensor, got ndarray", "weight", api="tex")
raises("tex-meta-weight", "rmsnorm_fwd", "tex: weight on another device (meta)",
       lambda b: _rms(_t(X), _torch().ones(8, device="meta")), ValueError, "tensors are on different devices", "weight",
       api="tex")
raises("tex-weight-len", "rmsnorm_fwd", "tex: weight length n-1", lambda b: _rms(_t(X), _t(W[:7])),
       ValueError, "weight has shape (7,) but input's last dim is 8", "weight", api="tex")
raises("tex-bias-len", "layernorm_fwd", "tex: bias length n+1",
       lambda b: _tx().layernorm_fwd(_t(X), _t(W), _torch().ones(9), 1e-5, None, None, _tx().DType.kFloat32, 0, False),
       ValueError, "bias has shape (9,)", "bias", api="tex")
raises("tex-0d", "rmsnorm_fwd", "tex: 0-d input", lambda b: _rms(_torch().tensor(1.0), _torch().ones(1)),
       ValueError, "input must have at least 1 dimension", "input", api="tex")
raises("tex-gelu-0d", "gelu", "tex: 0-d input to an activation", lambda b: _tx().gelu(_torch().tensor(1.0), None),
       ValueError, "input must have at least 1 dimension", "input", api="tex")
raises("tex-swiglu-odd", "swiglu", "tex: odd last dim for swiglu", lambda b: _tx().swiglu(_torch().ones(2, 7), None),
       ValueError, "the last dim of input (7) must be even", "input", api="tex")
raises("tex-ln-out-shape", "rmsnorm_fwd", "tex: ln_out of the wrong shape",
       lambda b: _rms(_t(X), _t(W), ln_out=_torch().empty(4, 9)), ValueError, "ln_out has shape (4, 9), expected (4, 8)",
       "ln_out", api="tex")
raises("tex-quantizer", "rmsnorm_fwd", "tex: an FP8 quantizer (out of scope)", lambda b: _rms(_t(X), _t(W), q=object()),
       NotImplementedError, "quantizer builtins.object is not supported", "quantizer", api="tex")
raises("tex-otype", "rmsnorm_fwd", "tex: otype not a DType", lambda b: _rms(_t(X), _t(W), otype=12345),
       ValueError, "otype=12345 is not a tex.DType value", "otype", api="tex")
raises("tex-nargs-bwd", "rmsnorm_bwd", "tex: rmsnorm_bwd with 4 arguments",
       lambda b: _tx().rmsnorm_bwd(_t(X), _t(X), _torch().ones(4), _t(W)), TypeError,
       "takes 6 (dz, x, rsigma, gamma, sm_margin, zero_centered_gamma) or 7 (+ eps) positional arguments but 4 were given",
       "rmsnorm_bwd", api="tex")
raises("tex-nargs-fwd", "rmsnorm_fwd", "tex: rmsnorm_fwd with 3 arguments", lambda b: _tx().rmsnorm_fwd(_t(X), _t(W), 1e-5),
       TypeError, "missing 5 required positional arguments", "ln_out", api="tex")
raises("tex-rsigma-len", "rmsnorm_bwd", "tex: rsigma with the wrong number of rows",
       lambda b: _tx().rmsnorm_bwd(_t(X), _t(X), _torch().ones(3), _t(W), 0, False), ValueError,
       "rsigma has 3 elements, expected N=4", "rsigma", api="tex")
raises("tex-dgelu-shape", "dgelu", "tex: grad shape differs from fwd_input",
       lambda b: _tx().dgelu(_torch().ones(2, 3), _torch().ones(2, 4), None), ValueError,
       "grad has shape (2, 3), expected (2, 4)", "grad", api="tex")
raises("tex-softmax-3d", "scaled_softmax_forward", "tex: 3-D input to the 4-D softmax",
       lambda b: _tx().scaled_softmax_forward(_torch().ones(2, 3, 4), 1.0), ValueError, "input must be 4-D", "input", api="tex")
raises("tex-mask-dtype", "scaled_masked_softmax_forward", "tex: float mask",
       lambda b: _tx().scaled_masked_softmax_forward(_torch().ones(1, 2, 3, 4), _torch().ones(1, 1, 3, 4), 1.0),
       TypeError, "mask must be uint8 (or bool), got torch.float32", "mask", api="tex")
raises("tex-mask-shape", "scaled_masked_softmax_forward", "tex: mask of the wrong shape",
       lambda b: _tx().scaled_masked_softmax_forward(_torch().ones(1, 2, 3, 4), _torch().ones(1, 1, 3, 5, dtype=_torch().uint8), 1.0),
       ValueError, "mask has shape (1, 1, 3, 5)", "mask", api="tex")
raises("tex-causal-nonsquare", "scaled_upper_triang_masked_softmax_forward", "tex: causal softmax of a non-square input",
       lambda b: _tx().scaled_upper_triang_masked_softmax_forward(_torch().ones(2, 3, 4), 1.0), ValueError,
       "input must be square in its last two dims", "input", api="tex")
raises("tex-eps-str", "rmsnorm_fwd", "tex: eps a str", lambda b: _rms(_t(X), _t(W), eps="1e-5x"),
       ValueError, "eps='1e-5x' is not a number", "eps", api="tex")
raises("tex-scale-none", "scaled_softmax_forward", "tex: scale None",
       lambda b: _tx().scaled_softmax_forward(_torch().ones(1, 2, 3, 4), None), TypeError,
       "scale must be a real number, got NoneType None", "scale", api="tex")
same("tex-strided", "rmsnorm_fwd", "tex: row-strided input", lambda b: _rms(_t(BIG)[::2, :8], _t(W)), api="tex")
same("tex-transposed", "gelu", "tex: transposed (non-contiguous) input", lambda b: _tx().gelu(_t(BIG).t(), None), api="tex")
same("tex-misaligned", "rmsnorm_fwd", "tex: input at a 4-byte storage offset", lambda b: _rms(_tex_misaligned(), _t(W)),
     api="tex")
same("tex-empty", "rmsnorm_fwd", "tex: zero rows", lambda b: _rms(_t(X[:0]), _t(W)), api="tex")
same("tex-nan-inf", "gelu", "tex: NaN/±Inf through gelu", lambda b: _tx().gelu(_t(_NANINF), None), api="tex")
same("tex-eps-neg", "rmsnorm_fwd", "tex: eps = -1 (accepted, like TE: NaN where mean(x²) < 1)",
     lambda b: _rms(_t(X), _t(W), eps=-1.0), api="tex")
same("tex-eps-nan", "layernorm_fwd", "tex: eps = NaN (accepted, like TE: NaN out)",
     lambda b: _tx().layernorm_fwd(_t(X), _t(W), _t(B), float("nan"), None, None, _tx().DType.kFloat32, 0, False), api="tex")
same("tex-eps-huge", "rmsnorm_fwd", "tex: eps = 1e30", lambda b: _rms(_t(X), _t(W), eps=1e30), api="tex")
same("tex-ln-out-alias", "rmsnorm_fwd", "tex: ln_out is the input (in place)", _tex_ln_out_alias, api="tex")
same("tex-bf16-f32-weight", "rmsnorm_fwd", "tex: bfloat16 input with a float32 weight",
     lambda b: _rms(_t(X, _torch().bfloat16), _t(W), otype=_tx().DType.kBFloat16), api="tex")


# --------------------------------------------------------------------------- running
FACADE_REF = "numpy"
TEX_REF = "torch"
TEX_BACKENDS = ("torch", "cpp", "cuda", "nvidia")


def _facade_backend(case: Case, backend: str) -> None:
    forced = forced_backend()
    if forced and backend not in (forced, FACADE_REF) and "," not in forced:
        pytest.skip(f"TENSOR_OPS_BACKEND={forced}: only {forced} (and the reference) run")
    op = case.op
    backend_impl(op, backend)              # skips with the recorded reason


def _tex_backend(backend: str):
    torch = _torch()  # noqa: F841
    import tensor_ops.tex as tex
    from tensor_ops.tex._backends import _backend_available, _tex_impls
    if backend not in _tex_impls():
        pytest.skip(f"tex backend {backend!r} is not registered here")
    if not _backend_available(backend):
        why = to.get_manager()._exclusion(_tex_impls()[backend][0])
        pytest.skip(f"tex backend {backend!r} unavailable: {why}")
    return tex.use_backend(backend)


def _run(case: Case, backend: str):
    """Call the case on ``backend``; a fallback away from it is an error, a dtype the forced
    backend does not compute (bfloat16 on OpenCL, ...) is a skip with its reason."""
    try:
        return _run_strict(case, backend)
    except to.BackendUnsupportedError as exc:
        if case.exc is None:
            pytest.skip(f"{backend} does not serve {case.id}: {exc}")
        raise


def _run_strict(case: Case, backend: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)
        warnings.simplefilter("ignore", RuntimeWarning)    # NumPy's overflow/invalid notes on NaN cases
        warnings.simplefilter("ignore", PendingDeprecationWarning)   # np.matrix
        if case.api == "tex":
            with _tex_backend(backend):
                return case.call(backend)
        return case.call(backend)


def _as_numpy(r):
    if isinstance(r, (list, tuple)):
        return [_as_numpy(v) for v in r]
    if r is None:
        return None
    if type(r).__module__.split(".")[0] == "torch":
        return r.detach().cpu().double().numpy()
    return r


def _tol(dtype) -> tuple[float, float]:
    name = str(dtype)
    if "16" in name:
        return (1.6e-2, 1.6e-2) if "bfloat" in name else (2e-3, 2e-3)
    if "64" in name:
        return 1e-12, 1e-12
    return 2e-5, 2e-5


def assert_same(got, want, where: str) -> None:
    """Same structure, shape and dtype; values within tolerance; NaN exactly where want has NaN."""
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
        return
    if want is None:
        assert got is None, where
        return
    assert type(got) is type(want), (where, type(got), type(want))
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype, (where, got.shape, want.shape, got.dtype, want.dtype)
    g, w = _as_numpy(got), _as_numpy(want)
    g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
    assert (np.isnan(g64) == np.isnan(w64)).all(), f"{where}: NaN positions differ\n{g64}\n{w64}"
    rtol, atol = _tol(want.dtype)
    np.testing.assert_allclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)


def _check_raises(case: Case, backend: str) -> str:
    with pytest.raises(Exception) as info:
        _run(case, backend)
    err = info.value
    assert type(err) is case.exc, f"{case.id} on {backend}: {type(err).__name__}: {err}"
    msg = str(err)
    assert case.frag in msg, f"{case.id} on {backend}: {msg!r} lacks {case.frag!r}"
    assert case.arg in msg, f"{case.id} on {backend}: {msg!r} does not name {case.arg!r}"
    return msg


def _same_message(msg: str, backend: str, ref_msg: str, ref: str) -> None:
    """Validation runs before dispatch, so the text is the reference's (up to the backend's own name)."""
    if msg != ref_msg:
        assert msg.replace(repr(backend), "<b>") == ref_msg.replace(repr(ref), "<b>"), \
            f"message on {backend} differs from the reference's:\n{msg}\n{ref_msg}"


def _marks(case: Case):
    return (pytest.mark.xfail(reason=f"known defect: {case.bug}", strict=False),) if case.bug else ()


FACADE = [pytest.param(c, id=c.id, marks=_marks(c)) for c in CASES if c.api == "facade"]
TEX = [pytest.param(c, id=c.id, marks=_marks(c)) for c in CASES if c.api == "tex"]


def _warm_fast_path() -> None:
    """One plain call per op, so the next plain calls take the facade's fast path (the cached
    resolution of the configured policy) instead of the general one."""
    x = np.ones((2, 8), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in ("silu", "relu", "gelu", "swiglu", "geglu", "softmax"):
            getattr(to, op)(x)
        to.rms_norm(x, np.ones(8, np.float32))
        to.layer_norm(x, np.ones(8, np.float32))


@pytest.mark.parametrize("mode", ["keyword", "policy"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", FACADE)
def test_facade_bad_input(case: Case, backend: str, mode: str, monkeypatch):
    """``keyword``: ``backend=<b>`` on the call (general path). ``policy``: the backend forced by
    TENSOR_OPS_BACKEND and no keyword, after a warm-up (plain inputs take the fast path)."""
    _facade_backend(case, backend)
    call = case.call
    if mode == "policy":
        if case.kw_only:
            pytest.skip("case exercises the backend= keyword itself")
        monkeypatch.setenv("TENSOR_OPS_BACKEND", backend)
        to.reload_config()
        _warm_fast_path()
        case = Case(**{**case.__dict__, "call": lambda b: call(None)})
    if case.exc is not None:
        msg = _check_raises(case, backend)
        if backend != FACADE_REF:
            _same_message(msg, backend, _check_raises(Case(**{**case.__dict__, "call": call}), FACADE_REF),
                          FACADE_REF)
        return
    got = _run(case, backend)
    if backend == FACADE_REF:
        if case.oracle is not None:
            with np.errstate(all="ignore"):
                want = case.oracle()
            pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]   # two-output ops
            for g, w in pairs:
                assert g.shape == np.shape(w), (g.shape, np.shape(w))
                rtol, atol = _tol(g.dtype)
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol, equal_nan=True)
        return
    assert_same(got, _run(Case(**{**case.__dict__, "call": call}), FACADE_REF), f"{case.id} on {backend} ({mode})")


@pytest.mark.tex
@pytest.mark.parametrize("backend", TEX_BACKENDS)
@pytest.mark.parametrize("case", TEX)
def test_tex_bad_input(case: Case, backend: str):
    if case.exc is not None:
        msg = _check_raises(case, backend)
        if backend != TEX_REF:
            _same_message(msg, backend, _check_raises(case, TEX_REF), TEX_REF)
        return
    got = _run(case, backend)
    if backend != TEX_REF:
        assert_same(got, _run(case, TEX_REF), f"{case.id} on {backend}")


def test_catalogue_size():
    """Issue 8 asks for at least 40 cases across the facade and tex, covering every category."""
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
    assert sum(c.api == "tex" for c in CASES) >= 10


# --------------------------------------------------------------------------- the table
TABLE_BEGIN = "<!-- bad-input-table:begin (generated: python -m tests.test_bad_input) -->"
TABLE_END = "<!-- bad-input-table:end -->"


def markdown_table() -> str:
    rows = ["| id | api | op | input | expected |", "|---|---|---|---|---|"]
    for c in CASES:
        exp = c.expect + (" — **known defect, xfail**" if c.bug else "")
        rows.append(f"| `{c.id}` | {c.api} | {c.op} | {c.what.replace('|', '/')} | {exp} |")
    return "\n".join([TABLE_BEGIN, *rows, TABLE_END])


def test_contributing_table_is_current():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    if TABLE_BEGIN not in text:
        pytest.skip("CONTRIBUTING.md has no generated bad-input table yet")
    have = text[text.index(TABLE_BEGIN):text.index(TABLE_END) + len(TABLE_END)]
    assert have == markdown_table(), "regenerate the table: python -m tests.test_bad_input"


if __name__ == "__main__":
    print(markdown_table())
