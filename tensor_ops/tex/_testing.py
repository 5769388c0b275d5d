"""Helpers for tex's conformance tests: upstream TE's dtype tolerances and fp64 autograd oracles."""
from __future__ import annotations

import torch
import torch.nn.functional as F

#: TE's test tolerances (torch.testing defaults): dtype → (rtol, atol)
TOLS = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
        torch.float64: (1e-7, 1e-7)}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def assert_close(actual, expected, dtype=None, *, red: int = 1, msg: str = ""):
    """Compare in fp64 with TE's tolerance for ``dtype`` (default: actual's dtype).

    ``red``: the values are sums of ``red`` terms (dgamma over rows, GEMM over K); atol then
    grows like sqrt(red) times the typical term size.
    """
    dtype = dtype or actual.dtype
    rtol, atol = TOLS[dtype]
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    assert a.shape == e.shape, f"{msg} shape {tuple(a.shape)} != {tuple(e.shape)}"
    if red > 1 and e.numel():
        term = max(1.0, float(e.abs().max()) / red ** 0.5)
        atol = atol * red ** 0.5 * term
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=lambda m: f"{msg}: {m}")


def rand(shape, dtype, *, scale=1.0, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def grads(fn, inputs, grad_out):
    """fp64 autograd oracle: (out, [d out/d input_i · grad_out])."""
    xs = [t.detach().double().requires_grad_(True) for t in inputs]
    out = fn(*xs)
    gs = torch.autograd.grad(out, xs, grad_out.double(), allow_unused=True)
    return out.detach(), [g if g is not None else torch.zeros_like(x) for g, x in zip(gs, xs)]


# ---- oracles (fp64, autograd-able)

def rmsnorm(x, w, eps, zc=False):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * (w + 1 if zc else w)


def layernorm(x, w, b, eps, zc=False):
    return F.layer_norm(x, (x.shape[-1],), w + 1 if zc else w, b, eps)


ACT = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "srelu": lambda x: F.relu(x) ** 2,
    "sigmoid": torch.sigmoid,
}
GATED = {"geglu": "gelu", "reglu": "relu", "swiglu": "silu", "qgeglu": "qgelu", "sreglu": "srelu", "glu": "sigmoid"}


def gated(name, x):
    a, b = x.chunk(2, -1)
    return ACT[GATED[name]](a) * b


def clamped_swiglu(x, limit=7.0, alpha=1.702, off=1.0):
    a, b = x.chunk(2, -1)
    a = torch.clamp(a, max=limit)
    return a * torch.sigmoid(alpha * a) * (torch.clamp(b, -limit, limit) + off)


def rope(x, freqs, fmt, interleaved, start_positions=None, cu_seqlens=None, cp_size=1, cp_rank=0):
    """Straightforward per-token loop version of TE's fused RoPE (fp64)."""
    d2 = freqs.shape[-1]
    f = freqs.reshape(freqs.shape[0], d2).double()
    out = x.clone()
    if fmt == "thd":
        cu = cu_seqlens.tolist()
        seqs = [(i, range(cu[i], cu[i + 1])) for i in range(len(cu) - 1)]
    else:
        s = x.shape[0] if fmt == "sbhd" else x.shape[1]
        nb = x.shape[1] if fmt == "sbhd" else x.shape[0]
        seqs = [(b, range(s)) for b in range(nb)]
    rows = []
    for b, toks in seqs:
        n = len(toks)
        for li, t in enumerate(toks):
            if cp_size > 1:
                half = n // 2
                pos = li + cp_rank * half if li < half else n * cp_size - (cp_rank + 1) * half + li - half
            else:
                pos = li
            if start_positions is not None:
                pos += int(start_positions[b])
            if fmt == "sbhd":
                idx = (t, b)
            elif fmt == "bshd":
                idx = (b, t)
            else:
                idx = (t,)
            rows.append((idx, pos))
    for idx, pos in rows:
        v = x[idx][..., :d2]
        c, s_ = torch.cos(f[pos]), torch.sin(f[pos])
        if interleaved:
            rot = torch.stack([-v[..., 1::2], v[..., 0::2]], -1).flatten(-2)
        else:
            h = d2 // 2
            rot = torch.cat([-v[..., h:], v[..., :h]], -1)
        out[idx] = torch.cat([v * c + rot * s_, x[idx][..., d2:]], -1)
    return out


# ---- backend parametrization

def backends_for(op):
    """pytest params: every non-vendor tex backend registered for ``op``; unavailable ones skip
    with their recorded reason."""
    import pytest

    from tensor_ops._registry import BackendImplKind

    from ._dispatch import manager
    mgr = manager()
    params = []
    seen = set()
    for impl in mgr.registry.get_impls(op, "tex"):
        if impl.kind is BackendImplKind.VENDOR or impl.backend in seen:
            continue
        seen.add(impl.backend)
        reason = mgr._exclusion(impl)
        marks = (pytest.mark.skip(reason=f"{impl.impl_id} {reason}"),) if reason else ()
        params.append(pytest.param(impl.backend, marks=marks, id=impl.backend))
    try:
        from . import _cpp_adapters
        hot = op in _cpp_adapters.HOT_OPS
    except ImportError:
        hot = False
    if hot and "cpp" not in seen:
        params.append(pytest.param("cpp", id="cpp", marks=(pytest.mark.skip(
            reason=f"no default.cpp impl of {op} registered (tensor_ops._cpp lacks the kernel)"),)))
    return params


class forced:
    """Context: tex ops forced onto ``backend``; a fallback away from it is an error."""

    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        import warnings

        from tensor_ops import BackendFallbackWarning

        from ._backends import use_backend
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error", BackendFallbackWarning)
        self._u = use_backend(self.backend)
        self._u.__enter__()
        return self

    def __exit__(self, *exc):
        self._u.__exit__(*exc)
        self._w.__exit__(*exc)
        return False
