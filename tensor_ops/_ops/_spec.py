"""``OpSpec``: everything tensor_ops knows about one facade op, in one object.

An op is defined once, in its family module (``norm.py``, ``softmax.py``, ``activation.py``,
``rope.py``, ``matmul.py``; the same family names as the kernel files in ``cpp_ext/``,
``opencl_ext/`` and ``cuda_ext/``). Its spec holds:

- ``stub``: the public signature and docstring (the facade function is generated from it);
- ``kernel_params``: the backend contract, i.e. the positional arguments every impl's ``fn``
  receives after validation (2-D C-contiguous ``x``, weights cast to ``x``'s dtype, the
  output view or ``None`` last); registration checks impls against it;
- ``prepare``: the validators and the normalisation, run once before dispatch, the same for
  every backend (it returns a :class:`Prepared`);
- ``oracle``: the op written from its definition in float64, independent of every backend;
- ``make_args`` / ``variants`` / ``x_rule``: the conformance cases (tests, ``detect_and_benchmark``
  validation, ``tensor_ops.testing``);
- ``tolerance``: the tolerance class (``"elementwise"`` or ``"reduction"``) that, with the
  one table in :mod:`tensor_ops._ops._tolerance`, gives (rtol, atol) per dtype.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional


class Prepared(NamedTuple):
    """A validated call, ready for dispatch (what ``OpSpec.prepare`` returns)."""

    args: Optional[tuple]  # the kernel arguments, ``kernel_params`` order, ``out`` last; None: empty
    kind: str              # array kind of x: 'numpy', 'torch', 'cupy', 'pyopencl'
    x: Any                 # the caller's x (empty results are allocated like it)
    dtype: Any             # numpy dtype of the result
    shape: tuple           # the result's shape as the caller sees it
    shape2: Optional[tuple]  # the impl's result shape (a wrong one is a backend failure); None: unchecked
    user_out: Any          # the caller's ``out=`` or None (a tuple for a two-output op)
    kern_out: Any          # the view the impl writes into (None: the result is copied into user_out;
                           # a two-output op: a tuple of such views, or None)
    nbytes: int            # the resolver's size (tuning buckets)
    finish: Optional[Callable[[Any], Any]] = None   # applied to the impl's result (e.g. an axis moved back)


@dataclass(frozen=True)
class XRule:
    """Shape constraints on ``x`` for conformance cases."""

    even: bool = False      # the last axis is split in halves (gated ops, rope pairs)
    min_ndim: int = 1       # rope needs (..., T, n)


@dataclass(frozen=True, eq=False)
class OpSpec:
    """One facade op. ``name`` and ``signature`` come from ``stub``."""

    stub: Callable[..., Any]
    kernel_params: tuple
    prepare: Callable[..., Any]
    oracle: Callable[..., Any]
    make_args: Callable[..., tuple]
    tolerance: str = "elementwise"
    variants: tuple = ("",)
    x_rule: XRule = field(default_factory=XRule)
    kernel: bool = True                 # hand-written kernels (False: matmul goes to BLAS)
    out_width: Callable[[int], int] = lambda n: n   # the result's last axis from x's
    bench_variants: tuple = ("",)       # the variants the benchmark times
    outputs: int = 1                    # 2: the op returns a tuple of two x-shaped arrays, ``out=`` is a
                                        # tuple too and the kernel params end in two outputs

    @property
    def single(self) -> bool:
        return self.outputs == 1

    @property
    def name(self) -> str:
        return self.stub.__name__

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.stub)

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.stub) or ""

    def case_args(self, x, rng, variant: str = "") -> tuple:
        """The facade arguments after ``x`` for one conformance case."""
        return self.make_args(x, rng, variant)

    def __repr__(self) -> str:
        return f"OpSpec({self.name}{self.signature})"
