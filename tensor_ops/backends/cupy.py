"""The CuPy reference backend (``reference.cupy``): what the CUDA kernels do not serve, on
device arrays, computed by CuPy on the arrays' own device and stream.

- float64 of every kernel op, in float64 (the kernels take float32, float16 and bfloat16),
  the fused add + norm included (two results);
- ``matmul`` in any float dtype: cuBLAS through ``cupy.matmul`` (``torch.matmul``, also
  cuBLAS, for torch CUDA tensors). GEMM is never hand-written.

It takes CuPy arrays and torch CUDA tensors (zero-copy CuPy views, on torch's current
stream: :class:`tensor_ops.backends.cuda.arrays.Call`), never host arrays (the NumPy
reference serves those), so its place among the references changes no result; it sorts
after ``reference.numpy`` (``priority=-1``) so the NumPy reference stays the first
reference everywhere orders are shown. Importing it imports neither cupy nor torch.
"""
from __future__ import annotations

from .._registry import BackendImplKind
from ._contract import Backend, ops_from
from .cuda.arrays import Call, cupy_with_device, dtype_name, guard, kind

NAME = "cupy"
_GELU_TANH_K = 0.7978845608028654   # sqrt(2 / pi)


def _run(op, x, others, names, compute):
    """``compute(cupy, *views of x and others)`` on x's device and stream, written into
    ``out`` (the last of ``others``) or returned as an array of x's kind."""
    c = Call(op, x, *others, names=names)
    with guard(op, NAME), c.on_device():
        import cupy
        r = compute(cupy, *[c.cupy_view(a) if a is not None else None for a in (x, *others[:-1])])
        out = others[-1]
        if out is None:
            if c.kind == "cupy":
                return r
            import torch
            out = torch.empty(tuple(r.shape), dtype=x.dtype, device=x.device)
        c.cupy_view(out)[...] = r
        return out


def rms_norm(x, weight, eps, out):
    return _run("rms_norm", x, (weight, out), ("weight", "out"),
                lambda cp, x, w: x / cp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w)


def layer_norm(x, weight, bias, eps, out):
    def f(cp, x, w, b):
        d = x - x.mean(-1, keepdims=True)
        y = d / cp.sqrt((d * d).mean(-1, keepdims=True) + eps) * w
        return y if b is None else y + b
    return _run("layer_norm", x, (weight, bias, out), ("weight", "bias", "out"), f)


def _run_pair(op, x, others, names, compute):
    """:func:`_run` for the fused add + norm: ``compute`` gives (y, s), both new arrays (so
    out=x / residual_out=residual, the in-place form, are written only after both exist),
    written into the last two of ``others`` (out, residual_out) or returned."""
    c = Call(op, x, *others, names=names)
    with guard(op, NAME), c.on_device():
        import cupy
        rs = compute(cupy, *[c.cupy_view(a) if a is not None else None for a in (x, *others[:-2])])
        res = []
        for r, out in zip(rs, others[-2:]):
            if out is None:
                if c.kind == "cupy":
                    res.append(r)
                    continue
                import torch
                out = torch.empty(tuple(r.shape), dtype=x.dtype, device=x.device)
            c.cupy_view(out)[...] = r
            res.append(out)
        return tuple(res)


def add_rms_norm(x, residual, weight, eps, out, residual_out):
    def f(cp, x, r, w):
        s = x + r
        return s / cp.sqrt((s * s).mean(-1, keepdims=True) + eps) * w, s
    return _run_pair("add_rms_norm", x, (residual, weight, out, residual_out),
                     ("residual", "weight", "out", "residual_out"), f)


def add_layer_norm(x, residual, weight, bias, eps, out, residual_out):
    def f(cp, x, r, w, b):
        s = x + r
        d = s - s.mean(-1, keepdims=True)
        y = d / cp.sqrt((d * d).mean(-1, keepdims=True) + eps) * w
        return (y if b is None else y + b), s
    return _run_pair("add_layer_norm", x, (residual, weight, bias, out, residual_out),
                     ("residual", "weight", "bias", "out", "residual_out"), f)


def softmax(x, out):
    def f(cp, x):
        e = cp.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return _run("softmax", x, (out,), ("out",), f)


def _act(cp, name: str, v):
    if name == "silu":
        return v / (1.0 + cp.exp(-v))
    if name == "relu":
        return cp.maximum(v, 0)
    if name == "gelu":
        import cupyx.scipy.special as sp
        return 0.5 * v * (1.0 + sp.erf(v * 0.7071067811865476))
    return 0.5 * v * (1.0 + cp.tanh(_GELU_TANH_K * (v + 0.044715 * v ** 3)))   # gelu_tanh


def silu(x, out):
    return _run("silu", x, (out,), ("out",), lambda cp, x: _act(cp, "silu", x))


def relu(x, out):
    return _run("relu", x, (out,), ("out",), lambda cp, x: _act(cp, "relu", x))


def gelu(x, approximate, out):
    name = "gelu_tanh" if approximate == "tanh" else "gelu"
    return _run("gelu", x, (out,), ("out",), lambda cp, x: _act(cp, name, x))


def swiglu(x, out):
    h = x.shape[-1] // 2
    return _run("swiglu", x, (out,), ("out",), lambda cp, x: _act(cp, "silu", x[:, :h]) * x[:, h:])


def geglu(x, approximate, out):
    h = x.shape[-1] // 2
    name = "gelu_tanh" if approximate == "tanh" else "gelu"
    return _run("geglu", x, (out,), ("out",), lambda cp, x: _act(cp, name, x[:, :h]) * x[:, h:])


def rope(x, cos, sin, interleaved, out):
    def f(cp, x, cos, sin):
        rows, n = x.shape
        pos = cp.arange(rows) % cos.shape[0]
        if interleaved:
            rot = cp.empty_like(x)
            rot[:, 0::2] = -x[:, 1::2]
            rot[:, 1::2] = x[:, 0::2]
        else:
            rot = cp.concatenate([-x[:, n // 2:], x[:, :n // 2]], axis=-1)
        return x * cos[pos] + rot * sin[pos]
    return _run("rope", x, (cos, sin, out), ("cos", "sin", "out"), f)


def matmul(a, b, out):
    """cuBLAS through ``cupy.matmul`` (torch tensors: ``torch.matmul``, also cuBLAS)."""
    c = Call("matmul", a, b, out, names=("b", "out"))
    with guard("matmul", NAME), c.on_device():
        if c.kind == "torch":
            import torch
            return torch.matmul(a, b, out=out)
        import cupy
        return cupy.matmul(a, b, out=out)


_F64 = frozenset(("float64",))
_FLOATS = frozenset(("float16", "bfloat16", "float32", "float64"))


def _supports(dtypes):
    def supports(x, *rest) -> bool:
        k = kind(x)
        return k in ("cupy", "torch") and dtype_name(x, k) in dtypes
    return supports


def _probe() -> str:
    """CuPy and a device; then a float64 rms_norm checked against NumPy."""
    import numpy as np
    cupy, count = cupy_with_device()
    x = (np.arange(3 * 7, dtype=np.float64).reshape(3, 7) - 10.0) / 4.0
    w = np.linspace(0.5, 1.5, 7)
    got = rms_norm(cupy.asarray(x), cupy.asarray(w), 1e-6, None).get()
    err = float(np.abs(got - x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w).max())
    if not err < 1e-12:
        from ._contract import Unavailable
        raise Unavailable(f"probe rms_norm (float64) returned wrong numbers (max abs error {err:.3g})")
    return f"cupy {cupy.__version__}, {count} device(s)"


def info() -> dict:
    import cupy
    return {"cupy": cupy.__version__, "float64": "CuPy elementwise/reductions", "matmul": "cuBLAS"}


_OPS = ops_from(globals())
# dtypes=None: they differ per op (float64 for the kernel ops, every float dtype for matmul),
# so supports() says
BACKEND = Backend(name=NAME, ops=_OPS, probe=_probe, kind=BackendImplKind.REFERENCE,
                  array_kinds=("cupy", "torch-cuda"), dtypes=None, device_only=True,
                  supports={op: _supports(_FLOATS if op == "matmul" else _F64) for op in _OPS},
                  info=info, priority=-1)


def availability() -> tuple[bool, str]:
    """(True, summary) or (False, reason); decided once, never raises."""
    return BACKEND.availability()


def get_cupy_info() -> dict:
    """Availability (or the reason), array kinds, ops and the CuPy version of the CuPy
    reference backend.

    Example:
        >>> from tensor_ops.backends import cupy as cupy_backend
        >>> cupy_backend.get_cupy_info()["available"] in (True, False)
        True
    """
    return BACKEND.describe()
