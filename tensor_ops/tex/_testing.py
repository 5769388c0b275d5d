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

    from ._register import manager
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


# ---- a TE-style MLP block whose autograd.Functions call only tex (training-step tests)

_WS = None


def _gemm(A, B, layout, bias=None, grad=False, out_dtype=None):
    """TE's general_gemm(A, B, workspace, …, layout, bias, grad) reduced to what the MLP uses."""
    import tensor_ops.tex as tex
    global _WS
    if _WS is None:
        _WS = torch.empty(0, dtype=torch.uint8)
    D, bias_grad, _, _ = tex.generic_gemm(A, layout[0] == "T", B, layout[1] == "T", None, None, out_dtype, bias,
                                          None, False, None, grad, _WS, 0, False, False)
    return D, bias_grad


class TexRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        import tensor_ops.tex as tex
        out, _, rsigma = tex.rmsnorm_fwd(x, w, eps, None, None, tex.DType.kFloat32, 0, False)
        ctx.save_for_backward(x, rsigma, w)
        return out

    @staticmethod
    def backward(ctx, dz):
        import tensor_ops.tex as tex
        x, rsigma, w = ctx.saved_tensors
        dx, dw = tex.rmsnorm_bwd(dz.contiguous(), x, rsigma, w, 0, False)
        return dx, dw, None


class TexLinear(torch.autograd.Function):
    """Forward "TN", dgrad "NN", wgrad "NT" with grad=True and the bias (bias_grad), as TE's Linear."""

    @staticmethod
    def forward(ctx, x, W, b):
        y, _ = _gemm(W, x, "TN", bias=b)
        ctx.save_for_backward(x, W, b)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, W, b = ctx.saved_tensors
        dy = dy.contiguous()
        dx, _ = _gemm(W, dy, "NN")
        dW, db = _gemm(x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]), "NT", bias=b, grad=True)
        return dx, dW, db


class TexSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        import tensor_ops.tex as tex
        ctx.save_for_backward(x)
        return tex.swiglu(x, None)

    @staticmethod
    def backward(ctx, dy):
        import tensor_ops.tex as tex
        (x,) = ctx.saved_tensors
        return tex.dswiglu(dy.contiguous(), x, None)


def mlp_params(hidden=32, ffn=48, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [
        (1.0 + 0.1 * torch.randn(hidden, generator=g)).to(dtype),            # rmsnorm weight
        (torch.randn(2 * ffn, hidden, generator=g) / hidden ** 0.5).to(dtype),  # fc1 weight
        (0.1 * torch.randn(2 * ffn, generator=g)).to(dtype),                   # fc1 bias
        (torch.randn(hidden, ffn, generator=g) / ffn ** 0.5).to(dtype),        # fc2 weight
        (0.1 * torch.randn(hidden, generator=g)).to(dtype),                    # fc2 bias
    ]


def mlp_tex(x, p, eps=1e-5):
    h = TexRMSNorm.apply(x, p[0], eps)
    return TexLinear.apply(TexSwiGLU.apply(TexLinear.apply(h, p[1], p[2])), p[3], p[4])


def mlp_torch(x, p, eps=1e-5):
    h = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * p[0]
    a, b = F.linear(h, p[1], p[2]).chunk(2, -1)
    return F.linear(F.silu(a) * b, p[3], p[4])


def mlp_data(step, batch=4, seq=8, hidden=32, seed=100):
    g = torch.Generator().manual_seed(seed + step)
    return torch.randn(batch, seq, hidden, generator=g), torch.randn(batch, seq, hidden, generator=g)


class TexAdamW:
    """TE's FusedAdam (adam_w_mode=1) step through tex.multi_tensor_adam."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.step_no = 0
        self.noop = torch.zeros(1, dtype=torch.int32)

    @torch.no_grad()
    def step(self):
        import tensor_ops.tex as tex
        self.step_no += 1
        grads = [p.grad for p in self.params]
        tex.multi_tensor_adam(65536, self.noop, [grads, [p.data for p in self.params], self.m, self.v], self.lr,
                              self.betas[0], self.betas[1], self.eps, self.step_no, 1, 1, self.wd)
