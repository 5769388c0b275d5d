"""The public ops, generated from their :class:`~tensor_ops._ops.OpSpec` (one definition per op).

NumPy in → NumPy out, torch in → torch out (device arrays come back as the same kind), dtype
preserved (float16, bfloat16, float32, float64), the last axis is the feature axis. Every op
takes ``out=`` and ``backend=``.

Each function is compiled from its spec's stub (the way ``dataclasses`` writes ``__init__``)
so it has the stub's exact signature and docstring and costs one Python frame:

1. a plain call (no ``out=``, no ``backend=``, no ``use_backend()``) goes to the native
   plain-call entry when the policy always picks an impl that has one
   (``_state.fast_fns``; e.g. ``tensor_ops._cpp._fast_rms_norm``). The entry validates the
   plain case itself and returns the result, or None to decline (a (1, 4096) call costs ~1 µs
   in the kernel, so validation in Python would cost more than the work). A call with
   ``out=`` (and no ``backend=``) goes to the same entry with ``out`` appended when it takes
   one (``_state.fast_out_fns``): the entry also checks ``out`` (result shape and dtype,
   contiguous, writeable, no memory shared with an input) or declines;
2. everything else takes :func:`general`: the spec's ``prepare`` (validation, once, the same
   for every backend), then the resolver.
"""
from __future__ import annotations

import inspect

import numpy as np

from . import _global as _g
from . import _state
from ._ops import SPECS, OpSpec

_NAMES = {np.dtype(t): np.dtype(t).name for t in (np.float16, np.float32, np.float64)}


def _dtype_name(dt) -> str:
    """The resolver's dtype label, cached: NumPy's ``str(dtype)`` is Python code costing ~3 µs,
    a sixth of a general-path call; ``_NAMES.get(dt, str(dt))`` paid it on every call."""
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = str(dt)
    return name

_COMMON_DOC = """
    Every op also takes, keyword-only:
        out: an output array of the result's shape and dtype, written and returned.
        backend: a backend name (forces it for this call) or an order, e.g. ``"cpp,numpy"``.
"""


def _alloc(kind, x, shape, dt):
    if kind == "numpy":
        return np.empty(shape, dt)
    if kind == "torch":
        import torch
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if kind == "cupy":
        import cupy
        return cupy.empty(shape, dt)
    import pyopencl.array as cla
    return cla.empty(x.queue, shape, dt)


def general(spec: OpSpec, args: tuple, out, backend):
    """Validate (``spec.prepare``), dispatch through the resolver, shape the result back.

    A torch tensor ``x`` goes to :mod:`tensor_ops._torch_facade` (CPU tensors as zero-copy
    NumPy views through this same path, autograd through the custom ops). An empty input
    returns at once (the same result on every backend); a result whose shape or dtype is
    wrong counts as a backend failure inside the manager."""
    x = args[0]
    if type(x) is not np.ndarray and type(x).__module__.startswith("torch"):
        from . import _torch_facade
        return _torch_facade.route(spec, args, out, backend, _general_arrays)
    return _general_arrays(spec, args, out, backend)


def _general_arrays(spec: OpSpec, args: tuple, out, backend, kind: str = "numpy"):
    """:func:`general` for NumPy, CuPy, pyopencl arrays and device torch tensors (``kind``
    'torch-cpu': NumPy views of torch CPU tensors, served by the backends declaring it)."""
    p = spec.prepare(*args, out)
    if not spec.single:
        return _pair(spec, p, backend, kind)
    if p.args is None:
        res = p.user_out if p.user_out is not None else _alloc(p.kind, p.x, p.shape, p.dtype)
        if p.finish is not None:
            r = p.finish(res)
            if p.user_out is not None and r is not p.user_out:
                p.user_out[...] = r
                return p.user_out
            return r
        return res
    expect = (p.shape2, p.args[0].dtype) if p.shape2 is not None else None
    res = _g.manager().dispatch(spec.name, p.args, None, backend, "facade", _dtype_name(p.dtype),
                                p.nbytes, expect, kind)
    if p.finish is not None:
        res = p.finish(res)
    user_out = p.user_out
    if user_out is not None:
        if p.kern_out is None:
            user_out[...] = res.reshape(p.shape) if res.shape != p.shape else res
        return user_out
    return res.reshape(p.shape) if res.shape != p.shape else res


def _pair(spec: OpSpec, p, backend, kind: str):
    """:func:`_general_arrays` for an op with two x-shaped results (``out=(out0, out1)``)."""
    user_out = p.user_out
    if p.args is None:
        return user_out if user_out is not None else tuple(_alloc(p.kind, p.x, p.shape, p.dtype) for _ in "ab")
    expect = (p.shape2, p.args[0].dtype, 2)
    res = _g.manager().dispatch(spec.name, p.args, None, backend, "facade", _dtype_name(p.dtype),
                                p.nbytes, expect, kind)
    res = tuple(r.reshape(p.shape) if r.shape != p.shape else r for r in res)
    if user_out is None:
        return res
    kern = p.kern_out or (None, None)
    for u, k, r in zip(user_out, kern, res):
        if k is None:
            u[...] = r
    return user_out


_TEMPLATE = '''\
def {name}({params}, *, out=None, backend=None):
    if backend is None:
        if out is None:
            f = _native({name!r})
            if f is not None and _ctx_get() is None:
                r = f({args})
                if r is not None:
                    return r
        else:
            f = _native_out({name!r})
            if f is not None and _ctx_get() is None:
                r = f({args}, out)
                if r is not None:
                    return r
    return _general(_spec, ({args},), out, backend)
'''


def make_op(spec: OpSpec):
    """The public function of ``spec`` (see the module docstring)."""
    sig = spec.signature
    names = list(sig.parameters)
    defaults = {f"_d_{k}": p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    params = ", ".join(k if f"_d_{k}" not in defaults else f"{k}=_d_{k}" for k in names)
    src = _TEMPLATE.format(name=spec.name, params=params, args=", ".join(names))
    ns = {"_native": _state.fast_fns.get, "_native_out": _state.fast_out_fns.get,
          "_ctx_get": _state.context_backend.get, "_general": general, "_spec": spec, **defaults}
    exec(compile(src, f"<tensor_ops facade {spec.name}>", "exec"), ns)   # noqa: S102 - generated from the spec
    fn = ns[spec.name]
    fn.__module__ = "tensor_ops"
    fn.__qualname__ = spec.name
    fn.__doc__ = (spec.stub.__doc__ or "").rstrip() + "\n" + _COMMON_DOC
    fn.__wrapped_spec__ = spec
    return fn


OPS = {name: make_op(s) for name, s in SPECS.items()}
rms_norm = OPS["rms_norm"]
layer_norm = OPS["layer_norm"]
add_rms_norm = OPS["add_rms_norm"]
add_layer_norm = OPS["add_layer_norm"]
softmax = OPS["softmax"]
silu = OPS["silu"]
gelu = OPS["gelu"]
relu = OPS["relu"]
swiglu = OPS["swiglu"]
geglu = OPS["geglu"]
rope = OPS["rope"]
matmul = OPS["matmul"]
