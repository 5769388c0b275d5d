"""What the benchmark engine (``_bench.py``) runs, per op: the case builders (inputs at the
ladder's sizes, output shape, bytes moved, the pages the ceiling copy reads) and the baselines
(the NumPy formula, torch eager, torch.compile).

The fp64 oracle, the variants and the tolerance come from the op definitions
(:mod:`tensor_ops._ops`), the same ones the conformance harness reads; presets
(``benchmarks/*.py``) never build inputs or formulas of their own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from . import _facade
from ._ops import SPECS, tolerance
from .testing import np_dtype

COLS = 4096                       # feature width of the ladder: (rows, 4096)
HEAD_DIM = 128                    # rope runs on (heads, T, 128): LLM shapes, same element count
GATED = tuple(n for n, s in SPECS.items() if s.out_width(2) == 1)
VALIDATION_SHAPES = ((1, 8), (3, 4098), (5, 18), (2, 3, 66))
# the spec's variants, plus layer_norm without bias (a different kernel path)
VARIANTS = {**{n: s.variants for n, s in SPECS.items() if len(s.variants) > 1}, "layer_norm": ("", "nobias")}
# Benchmark names for a variant of an op (bench_cpp's "gelu_tanh" column).
ALIASES = {f"{op}_{v}": (op, v) for op, vs in VARIANTS.items() for v in vs if v}


def split_name(name: str) -> tuple[str, str]:
    """(facade op, variant) of a benchmark name: ``"gelu_tanh"`` -> ``("gelu", "tanh")``."""
    return ALIASES.get(name, (name, ""))


def reference(op: str, x, *args, **kw):
    """The op from its definition in float64 (the spec's oracle)."""
    return SPECS[op].oracle(x, *args, **kw)


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    """One op call: inputs, the output shape, bytes moved, the resolver's nbytes and the
    arrays the kernel must read (the ceiling copy reads the same pages)."""

    op: str
    variant: str
    dtype: str
    x: Any                  # np.ndarray, or a torch tensor (torch_case)
    args: tuple
    out_shape: tuple
    bytes_moved: int
    nbytes: int
    shape_label: str
    ref_args: tuple = ()
    reads: tuple = ()

    @property
    def name(self) -> str:
        """The benchmark name (``gelu_tanh`` for gelu's tanh variant)."""
        return next((k for k, v in ALIASES.items() if v == (self.op, self.variant)), self.op)

    def run(self, backend: Optional[str], out=None):
        return getattr(_facade, self.op)(self.x, *self.args, out=out, backend=backend)

    def empty_out(self):
        """An output for ``out=``: NumPy, or a torch tensor on x's device (a tuple of them for
        a two-output op: the fused add + norm's (normed, s))."""
        def one():
            if isinstance(self.x, np.ndarray):
                return np.empty(self.out_shape, self.dtype)
            return self.x.new_empty(self.out_shape)
        k = SPECS[self.op].outputs
        return one() if k == 1 else tuple(one() for _ in range(k))

    def expected(self):
        return reference(self.op, self.x, *(self.ref_args or self.args))

    def tolerance(self) -> tuple[float, float]:
        return tolerance(self.dtype, SPECS[self.op].tolerance, max(1, self.x.shape[-1]))


def make_case(op: str, dtype: str, shape, variant: str = "", seed: int = 0) -> Case:
    """Inputs for ``op`` with x of ``shape`` (for rope: (..., T, n); for matmul: (m, k)).

    Bytes moved = the big tensors read + written: x and the output (gated ops read 2h and
    write h), rope's two (T, n) float32 tables (given whole, HF style, so the facade passes
    them to the kernel as they are), matmul's b; the fused add + norm reads x and residual and
    writes normed and s (2 reads + 2 writes per element)."""
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)  # 'bfloat16' is ml_dtypes' (imported here: NumPy knows the name only then)
    shape = tuple(shape)
    # float32 draws: half the memory and time of float64 ones at the ladder's 256 MiB sizes
    draw = np.asarray(rng.standard_normal(shape, dtype=np.float64 if dt == np.float64 else np.float32))
    draw *= 2
    x = draw.astype(dt, copy=False)
    n = shape[-1]
    label = "x".join(map(str, shape))
    args: tuple = ()
    ref_args: tuple = ()
    reads: tuple = (x,)
    out_shape = shape
    if op == "rms_norm":
        args = ((rng.standard_normal(n) * 0.5 + 1).astype(dt), 1e-6)
    elif op == "layer_norm":
        b = None if variant == "nobias" else rng.standard_normal(n).astype(dt)
        args = ((rng.standard_normal(n) * 0.5 + 1).astype(dt), b, 1e-5)
    elif op in ("gelu", "geglu"):
        args = ("tanh" if variant == "tanh" else "none",)
    elif op == "rope":
        ang = rng.uniform(-4, 4, (shape[-2], n // 2))
        c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        inter = variant == "interleaved"
        whole = (lambda a: np.repeat(a, 2, -1)) if inter else (lambda a: np.concatenate([a, a], -1))
        cf, sf = np.ascontiguousarray(whole(c)), np.ascontiguousarray(whole(s))
        args, ref_args, reads = (cf, sf, inter), (c, s, inter), (x, cf, sf)
    elif op == "matmul":
        b = (rng.standard_normal((n, shape[0])) / math.sqrt(n)).astype(dt)
        args, reads = (b,), (x, b)
        out_shape = shape[:-1] + (b.shape[1],)
    elif op in ("add_rms_norm", "add_layer_norm"):
        r = np.asarray(rng.standard_normal(shape, dtype=np.float64 if dt == np.float64 else np.float32)).astype(dt)
        w = (rng.standard_normal(n) * 0.5 + 1).astype(dt)
        args = (r, w, 1e-6) if op == "add_rms_norm" else (r, w, rng.standard_normal(n).astype(dt), 1e-5)
        reads = (x, r)
    if op in GATED:
        out_shape = shape[:-1] + (n // 2,)
    out_bytes = int(np.prod(out_shape)) * dt.itemsize * SPECS[op].outputs
    moved = sum(a.nbytes for a in reads) + out_bytes
    nbytes = x.nbytes + (args[0].nbytes if op == "matmul" else 0)
    return Case(op, variant, dt.name, x, args, out_shape, moved, nbytes, label, ref_args, reads)


def bench_case(name: str, dtype: str, rows: int, cols: int = COLS) -> Case:
    """The case for ``rows`` of (rows, cols) (matmul: ``rows`` is the side of a square
    product; rope: x is (cols/128 heads, rows positions, 128) with (rows, 128) tables)."""
    op, variant = split_name(name)
    if op == "matmul":
        return make_case(op, dtype, (rows, rows), variant)
    if op == "rope":
        shape = (cols // HEAD_DIM, rows, HEAD_DIM) if cols % HEAD_DIM == 0 else (1, rows, cols)
        return make_case(op, dtype, shape, variant)
    return make_case(op, dtype, (rows, cols), variant)


def on_torch(case: Case, device: str = "cuda", dtype: Optional[str] = None) -> Case:
    """``case`` with torch tensors on ``device`` (x and its same-dtype arguments in ``dtype``,
    e.g. bfloat16; rope's float32 tables stay float32), for device presets."""
    import torch
    td = getattr(torch, dtype or case.dtype)
    tables = {id(a) for a in case.args} if case.op == "rope" else set()
    conv = {id(a): torch.from_numpy(a).to(device=device, dtype=None if id(a) in tables else td)
            for a in (case.x, *case.args, *case.reads) if isinstance(a, np.ndarray)}
    args = tuple(conv.get(id(a), a) for a in case.args)
    reads = tuple(conv[id(a)] for a in case.reads)
    out_bytes = int(np.prod(case.out_shape)) * td.itemsize * SPECS[case.op].outputs
    moved = sum(r.numel() * r.element_size() for r in reads) + out_bytes
    return Case(case.op, case.variant, dtype or case.dtype, conv[id(case.x)], args, case.out_shape, moved,
                case.nbytes, case.shape_label, case.ref_args, reads)


# ----------------------------------------------------------------------------- baselines
def numpy_formula(case: Case) -> Callable[[], object]:
    """The NumPy formula with a fresh output, as a user would write it: the NumPy backend's
    own function called directly (no dispatch, no ``out=`` copy)."""
    from .backends.numpy import BACKEND
    fn = BACKEND.ops[case.op]
    x = case.x.reshape(-1, case.x.shape[-1]) if case.op == "rope" else case.x
    args = (x,) + tuple(case.args) + (None,) * SPECS[case.op].outputs
    return lambda: fn(*args)


def _torch_math(case: Case):
    """(math function of tensors, its tensors) for torch eager / torch.compile, or None."""
    import torch
    import torch.nn.functional as F
    x = torch.from_numpy(case.x) if isinstance(case.x, np.ndarray) else case.x
    a: list[Any] = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in case.args]
    op, n, h = case.op, case.x.shape[-1], case.x.shape[-1] // 2
    if op == "rms_norm":
        return (lambda x, w: F.rms_norm(x, (n,), w, a[1])), (x, a[0])
    if op == "layer_norm":
        ln_args = (x, a[0]) + ((a[1],) if a[1] is not None else ())
        return (lambda x, w, b=None: F.layer_norm(x, (n,), w, b, a[2])), ln_args
    if op == "add_rms_norm":       # torch.add then F.rms_norm (two passes; vLLM fuses them)
        def add_rms(x, r, w):
            s = torch.add(x, r)
            return F.rms_norm(s, (n,), w, a[2]), s
        return add_rms, (x, a[0], a[1])
    if op == "add_layer_norm":
        def add_ln(x, r, w, b):
            s = torch.add(x, r)
            return F.layer_norm(s, (n,), w, b, a[3]), s
        return add_ln, (x, a[0], a[1], a[2])
    if op == "softmax":
        return (lambda x: torch.softmax(x, -1)), (x,)
    if op in ("silu", "relu"):
        return (F.silu if op == "silu" else torch.relu), (x,)
    if op == "gelu":
        return (lambda x: F.gelu(x, approximate=a[0])), (x,)
    if op == "swiglu":
        return (lambda x: F.silu(x[..., :h]) * x[..., h:]), (x,)
    if op == "geglu":
        return (lambda x: F.gelu(x[..., :h], approximate=a[0]) * x[..., h:]), (x,)
    if op == "rope" and not case.args[2]:
        def rope(x, c, s):
            return x * c.to(x.dtype) + torch.cat([-x[..., h:], x[..., :h]], -1) * s.to(x.dtype)
        return rope, (x, a[0], a[1])
    if op == "matmul":
        return torch.matmul, (x, a[0])
    return None


def torch_eager(case: Case) -> tuple[Optional[Callable], str]:
    """(torch eager equivalent on CPU tensors sharing NumPy memory, or None, why not)."""
    try:
        got = _torch_math(case)
    except ImportError as exc:
        return None, f"torch not importable: {exc}"
    if got is None:
        return None, f"no torch equivalent of {case.name}"
    fn, t = got
    return (lambda: fn(*t)), ""


def torch_compiled(case: Case) -> tuple[Optional[Callable], str]:
    """(torch.compile (Inductor, CPU) of the same math, compiled and run once here, outside
    any timing, or None, the reason it could not be compiled)."""
    try:
        import torch
        got = _torch_math(case)
    except ImportError as exc:
        return None, f"torch not importable: {exc}"
    if got is None:
        return None, f"no torch equivalent of {case.name}"
    fn, t = got
    try:
        cf = torch.compile(fn, dynamic=False)
        cf(*t)
    except Exception as exc:  # Inductor needs a working C++ toolchain; report, keep measuring
        return None, f"torch.compile failed: {type(exc).__name__}: {str(exc).strip()[:160]}"
    return (lambda: cf(*t)), ""
