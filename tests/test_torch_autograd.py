"""Autograd and torch.compile on the torch ops (issue 15, item 3).

- ``torch.autograd.gradcheck`` in float64 on every op and variant (the facade's float64 path
  is the NumPy reference, the backward the float64 torch formulas: exact derivatives);
- gradients of float32/float16/bfloat16 calls (native kernels on CPU where cpp is available)
  against float64 torch autograd of the defining formula, within the dtype's tolerance;
- ``torch.library.opcheck`` (schema, fake kernel, autograd registration, AOT dispatch) on every
  op, the forward-with-statistics ops and the backward ops;
- a Llama block written with the facade functions and tensor_ops.nn under
  ``torch.compile(fullgraph=True)``: no graph break, the eager numbers, the eager gradients.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch not installed: the torch suite skips")
F = torch.nn.functional

import tensor_ops as to  # noqa: E402
import tensor_ops.nn as tnn  # noqa: E402
import tensor_ops.torch as tot  # noqa: E402
from tensor_ops._ops import tolerance  # noqa: E402

OPS = torch.ops.tensor_ops


def _t(*shape, dtype=torch.float64, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return t.requires_grad_() if grad else t


def _rope_tables(t, half, seed=3):
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(t, half, generator=g, dtype=torch.float64) * 8 - 4
    return ang.cos(), ang.sin()


#: name -> (our call, the defining formula in torch, the inputs' shapes); x first
def _halves(x):
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:]


CASES = {
    "rms_norm": (lambda x, w: to.rms_norm(x, w, 1e-6), lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
                 [(3, 7, 10), (10,)]),
    "layer_norm": (lambda x, w, b: to.layer_norm(x, w, b, 1e-5),
                   lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), [(5, 9), (9,), (9,)]),
    "layer_norm_nobias": (lambda x, w: to.layer_norm(x, w, None, 1e-5),
                          lambda x, w: F.layer_norm(x, (x.shape[-1],), w, None, 1e-5), [(5, 9), (9,)]),
    # the fused residual add + norm: both results (normed, s) side by side, so both gradients
    # flow (d(normed) through the norm into s, plus d(s)); "_sum": only s used (no d(normed))
    "add_rms_norm": (lambda x, r, w: torch.cat(to.add_rms_norm(x, r, w, 1e-6), -1),
                     lambda x, r, w: torch.cat([F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), x + r], -1),
                     [(3, 7, 10), (3, 7, 10), (10,)]),
    "add_rms_norm_sum": (lambda x, r: to.add_rms_norm(x, r, torch.ones(10, dtype=x.dtype), 1e-6)[1] * 2,
                         lambda x, r: (x + r) * 2, [(4, 10), (4, 10)]),
    "add_layer_norm": (lambda x, r, w, b: torch.cat(to.add_layer_norm(x, r, w, b, 1e-5), -1),
                       lambda x, r, w, b: torch.cat([F.layer_norm(x + r, (x.shape[-1],), w, b, 1e-5), x + r], -1),
                       [(5, 9), (5, 9), (9,), (9,)]),
    "add_layer_norm_nobias": (lambda x, r, w: to.add_layer_norm(x, r, w, None, 1e-5)[0],
                              lambda x, r, w: F.layer_norm(x + r, (x.shape[-1],), w, None, 1e-5),
                              [(5, 9), (5, 9), (9,)]),
    "softmax": (lambda x: to.softmax(x), lambda x: torch.softmax(x, -1), [(4, 11)]),
    "softmax_axis0": (lambda x: to.softmax(x, axis=0), lambda x: torch.softmax(x, 0), [(4, 11)]),
    "silu": (to.silu, F.silu, [(4, 11)]),
    "relu": (to.relu, torch.relu, [(4, 11)]),
    "gelu": (to.gelu, F.gelu, [(4, 11)]),
    "gelu_tanh": (lambda x: to.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"), [(4, 11)]),
    "swiglu": (to.swiglu, lambda x: F.silu(_halves(x)[0]) * _halves(x)[1], [(2, 3, 12)]),
    "geglu": (to.geglu, lambda x: F.gelu(_halves(x)[0]) * _halves(x)[1], [(4, 12)]),
    "geglu_tanh": (lambda x: to.geglu(x, "tanh"),
                   lambda x: F.gelu(_halves(x)[0], approximate="tanh") * _halves(x)[1], [(4, 12)]),
    "silu_mul": (tot.silu_mul, lambda a, b: F.silu(a) * b, [(4, 11), (4, 11)]),
    "gelu_mul": (tot.gelu_mul, lambda a, b: F.gelu(a) * b, [(4, 11), (4, 11)]),
    "gelu_mul_tanh": (lambda a, b: tot.gelu_mul(a, b, "tanh"), lambda a, b: F.gelu(a, approximate="tanh") * b,
                      [(4, 11), (4, 11)]),
    "matmul": (to.matmul, torch.matmul, [(2, 3, 5), (5, 4)]),
    "matmul_vec": (to.matmul, torch.matmul, [(5,), (2, 5, 3)]),
}


def _rope_case(interleaved, half):
    def ours(x, c, s):
        return to.rope(x, c, s, interleaved)

    def ref(x, c, s):
        if half:
            c, s = ((c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)) if interleaved
                    else (torch.cat([c, c], -1), torch.cat([s, s], -1)))
        if interleaved:
            rot = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
        else:
            h = x.shape[-1] // 2
            rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * c + rot * s
    return ours, ref


for _il in (False, True):
    for _half in (False, True):
        CASES[f"rope{'_il' if _il else ''}{'_half' if _half else ''}"] = (*_rope_case(_il, _half), "rope")


def _inputs(name, dtype, grad=True):
    ours, ref, shapes = CASES[name]
    if shapes == "rope":
        x = _t(2, 5, 8, dtype=dtype, grad=grad)
        c, s = _rope_tables(5, 4 if name.endswith("half") else 8)
        return [x, c.to(dtype).requires_grad_(grad), s.to(dtype).requires_grad_(grad)]
    return [_t(*s, dtype=dtype, grad=grad, seed=i) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_float64(name):
    ours = CASES[name][0]
    assert torch.autograd.gradcheck(ours, tuple(_inputs(name, torch.float64)), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_float64_autograd(name, dtype):
    ours, ref, _ = CASES[name]
    xs = _inputs(name, dtype)
    x64 = [a.detach().double().requires_grad_() for a in xs]
    y, y64 = ours(*xs), ref(*x64)
    assert y.dtype == dtype and y.shape == y64.shape
    g = torch.randn(y64.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    y.backward(g.to(dtype))
    y64.backward(g)
    dt = str(dtype).replace("torch.", "")
    rtol, atol = tolerance(dt, "reduction", xs[0].shape[-1], level="differential")
    torch.testing.assert_close(y.double(), y64.detach(), rtol=rtol, atol=atol)
    for i, (a, a64) in enumerate(zip(xs, x64)):
        scale = max(1.0, float(a64.grad.abs().max()))
        torch.testing.assert_close(a.grad.double(), a64.grad, rtol=rtol, atol=atol * scale,
                                   msg=lambda m, i=i: f"grad of input {i}: {m}")


def _T(*s, dtype=torch.float32, grad=True):
    return _t(*s, dtype=dtype, grad=grad)


OPCHECK = [
    ("rms_norm", lambda: (_T(3, 8), _T(8), 1e-6)),
    ("layer_norm", lambda: (_T(3, 8), _T(8), _T(8), 1e-5)),
    ("layer_norm", lambda: (_T(3, 8), _T(8), None, 1e-5)),
    ("softmax", lambda: (_T(3, 8), -1)),
    ("softmax", lambda: (_T(3, 8), 0)),
    ("silu", lambda: (_T(3, 8),)),
    ("relu", lambda: (_T(3, 8),)),
    ("gelu", lambda: (_T(3, 8), "none")),
    ("gelu", lambda: (_T(3, 8), "tanh")),
    ("swiglu", lambda: (_T(3, 8),)),
    ("geglu", lambda: (_T(3, 8), "tanh")),
    ("silu_mul", lambda: (_T(3, 8), _T(3, 8))),
    ("gelu_mul", lambda: (_T(3, 8), _T(3, 8), "none")),
    ("rope", lambda: (_T(2, 3, 8), _T(3, 4, grad=False), _T(3, 4, grad=False), False)),
    ("matmul", lambda: (_T(3, 8), _T(8, 2))),
    ("add_rms_norm", lambda: (_T(3, 8), _T(3, 8), _T(8), 1e-6)),
    ("add_layer_norm", lambda: (_T(3, 8), _T(3, 8), _T(8), _T(8), 1e-5)),
    ("add_layer_norm", lambda: (_T(3, 8), _T(3, 8), _T(8), None, 1e-5)),
    ("add_rms_norm_fwd", lambda: (_T(3, 8), _T(3, 8), _T(8), 1e-6)),
    ("add_layer_norm_fwd", lambda: (_T(3, 8), _T(3, 8), _T(8), _T(8), 1e-5)),
    ("rms_norm_fwd", lambda: (_T(3, 8), _T(8), 1e-6)),
    ("layer_norm_fwd", lambda: (_T(3, 8), _T(8), _T(8), 1e-5)),
    ("rms_norm_bwd", lambda: (_T(3, 8, grad=False), _T(3, 8, grad=False), _T(3, grad=False), _T(8, grad=False))),
    ("layer_norm_bwd", lambda: tuple(_T(*s, grad=False) for s in ((3, 8), (3, 8), (3,), (3,), (8,)))),
    ("softmax_bwd", lambda: (_T(3, 8, grad=False), _T(3, 8, grad=False), -1)),
    ("act_bwd", lambda: (_T(3, 8, grad=False), _T(3, 8, grad=False), "gelu")),
    ("glu_bwd", lambda: (_T(3, 4, grad=False), _T(3, 8, grad=False), "silu")),
    ("glu2_bwd", lambda: (_T(3, 4, grad=False), _T(3, 4, grad=False), _T(3, 4, grad=False), "gelu_tanh")),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op,make", OPCHECK, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPCHECK)])
def test_opcheck(op, make, dtype):
    args = tuple(a.detach().to(dtype).requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
                 and a.dtype.is_floating_point else a for a in make())
    torch.library.opcheck(getattr(OPS, op), args)


class Block(torch.nn.Module):
    """A Llama block on tensor_ops: RMSNorm modules and the facade function, RoPE, softmax
    attention, a gated MLP (two-operand SwiGLU)."""

    def __init__(self, d=64, heads=4, ff=128):
        super().__init__()
        self.n1, self.n2 = tnn.RMSNorm(d, eps=1e-6), torch.nn.RMSNorm(d, eps=1e-6)
        self.qkv, self.o = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.mlp = tnn.GatedMLP(*(torch.nn.Linear(a, b, bias=False) for a, b in ((d, ff), (d, ff), (ff, d))))
        self.heads = heads

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = to.rope(q, cos, sin), to.rope(k, cos, sin)
        a = to.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5)
        x = x + self.o((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(to.rms_norm(x, self.n2.weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_llama_block_has_no_graph_break_and_matches_eager(dtype):
    torch.manual_seed(0)
    m = Block().to(dtype)
    x = torch.randn(2, 16, 64, dtype=dtype, requires_grad=True)
    ang = torch.randn(16, 8)
    cos, sin = ang.cos(), ang.sin()
    explained = torch._dynamo.explain(m)(x, cos, sin)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    y = m(x, cos, sin)
    y.float().square().sum().backward()
    g_eager, gw_eager = x.grad.clone(), m.n1.weight.grad.clone()
    x.grad = None
    m.zero_grad()
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True)
    y2 = cm(x, cos, sin)
    y2.float().square().sum().backward()
    tol = dict(rtol=0, atol=0) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y2, y, **tol)
    torch.testing.assert_close(x.grad, g_eager, **tol)
    torch.testing.assert_close(m.n1.weight.grad, gw_eager, **tol)


def test_compiled_graph_holds_the_tensor_ops_nodes():
    """The facade functions are traced as the torch ops (torch.compiler.substitute_in_graph)."""
    seen = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda x, w: to.silu(to.rms_norm(x, w) * 2), backend=backend, fullgraph=True)
    x, w = torch.randn(4, 8), torch.ones(8)
    torch.testing.assert_close(f(x, w), to.silu(to.rms_norm(x, w) * 2))
    assert any("tensor_ops.rms_norm" in s for s in seen) and any("tensor_ops.silu" in s for s in seen), seen


def test_out_with_autograd_is_refused_like_torch():
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match=r"out= cannot be used when an argument requires grad \(x has"):
        to.silu(x, out=torch.empty(2, 4))
    with pytest.raises(RuntimeError):        # torch's own refusal, for comparison
        torch.add(x, 1, out=torch.empty(2, 4))


def test_autograd_errors_keep_the_facade_wording():
    x = torch.randn(2, 4, requires_grad=True)
    to.silu(x)           # registered: later calls may leave validation to the op's own body
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\) to match x.shape\[-1\] = 4, got \(3,\)"):
        to.rms_norm(x, torch.ones(3))
    with pytest.raises(TypeError, match="weight is a numpy array but x is a torch array"):
        to.rms_norm(x, torch.ones(4).numpy())
    with pytest.raises(TypeError, match="x must have dtype float16, bfloat16, float32 or float64, got int64"):
        to.silu(torch.ones(2, 4, dtype=torch.int64))
    # scalars the schema would convert (float(True), int(1.5), bool(1)) are refused as without grad
    w = torch.ones(4)
    with pytest.raises(TypeError, match="eps must be a real number, got True"):
        to.rms_norm(x, w, True)
    with pytest.raises(TypeError, match="eps must be a real number, got '1e-6'"):
        to.layer_norm(x, w, None, "1e-6")
    with pytest.raises(TypeError, match="axis must be an int, got 1.5"):
        to.softmax(x, 1.5)
    with pytest.raises(TypeError, match="interleaved must be a bool, got 1"):
        to.rope(x.view(1, 2, 4), torch.ones(2, 4), torch.ones(2, 4), 1)
    with pytest.raises(ValueError, match="approximate must be 'none'"):
        to.gelu(x, 5)
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\)"):
        to.rms_norm(x, torch.nn.Parameter(torch.ones(3)))     # the op's own body validates this one
