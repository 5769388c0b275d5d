"""Eager autograd without the op dispatcher: the custom ops' own formulas as ``autograd.Function``s.

An eager call that autograd must record (``to.rms_norm(x, w)`` with ``w`` a Parameter, an
``nn.RMSNorm`` in training) went through ``torch.ops.tensor_ops.<op>``: for the norms a
CompositeImplicitAutograd op, then the custom op's autograd wrapper, its redispatch below
autograd and its ``torch._dynamo`` disable guard. On a (1, 4096) rms_norm that machinery cost
~150-200 µs of a ~270 µs forward (an empty custom op with a registered backward: ~50 µs; an
empty ``autograd.Function``: ~10 µs), so a small training step spent its time in dispatch.

Here each custom op that has a registered backward gets an ``autograd.Function`` built from the
same three functions the custom op was given (:data:`._library.IMPLS` for the forward,
:data:`._library.AUTOGRAD` for setup_context and backward): one definition, two ways in. The
forward takes ``ctx`` (the classic form: with a separate ``setup_context`` staticmethod
``Function.apply`` binds its arguments through ``inspect.signature`` on every call). Its
backward calls the backward ops' bodies, not the ops (``_library._bwd``), and is
``once_differentiable``: the native backward kernels record no graph, so a double backward
must raise rather than return a second derivative that silently treats them as constants
(the custom ops' backward ops have no autograd either). rope and matmul, whose backward is
differentiable (``_library.TWICE_DIFFERENTIABLE``), keep it: it calls the ops, as the
dispatcher's does, and a double backward goes through them.

The dispatcher is still taken whenever it does something the Function would not: under
``torch.compile`` (dynamo must see the op), under a ``TorchDispatchMode`` or ``TorchFunctionMode``
(FakeTensorMode, make_fx, FlopCounterMode, ...), under functorch transforms (vmap/grad wrap
the tensors), under ``torch.jit.trace`` (a Function would be recorded as an opaque PythonOp),
and for tensor subclasses (anything but ``torch.Tensor`` and ``nn.Parameter``).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _library as L

_C = torch._C
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FNS: dict = {}
_COMPOSITE: dict = {"rms_norm": L.rms_norm, "layer_norm": L.layer_norm, "add_rms_norm": L.add_rms_norm,
              "add_layer_norm": L.add_layer_norm}
_peek = getattr(getattr(_C, "_functorch", None), "peek_interpreter_stack", None)
_dispatch_depth = getattr(_C, "_len_torch_dispatch_stack", None)
_function_mode = getattr(_C, "_is_torch_function_mode_enabled", None)
_tracing = getattr(_C, "_get_tracing_state", None)


def usable(args) -> bool:
    """Whether an eager call on ``args`` may skip the dispatcher (see the module docstring)."""
    if _peek is None or _dispatch_depth is None or _function_mode is None:
        return False            # a torch without these probes: always the dispatcher
    if torch.compiler.is_compiling() or _dispatch_depth() or _function_mode() or _peek() is not None:
        return False
    if _tracing is not None and _tracing() is not None:
        return False            # torch.jit.trace records the custom op, not a Python Function
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) not in _PLAIN:
            return False
    return True


def function(name: str):
    """The ``autograd.Function`` of custom op ``name`` (built once)."""
    fn = _FNS.get(name)
    if fn is None:
        impl = L.IMPLS[name]
        setup, backward = L.AUTOGRAD[name]
        once = name not in L.TWICE_DIFFERENTIABLE

        def forward(ctx, *inputs):
            out = impl(*inputs)
            setup(ctx, inputs, out)
            ctx.eager = once      # the backward calls its ops' bodies directly (_library._bwd)
            ctx.n_inputs = len(inputs)
            return out

        def grads(ctx, *dys):
            """The registered backward, padded with None to one gradient per input (the custom
            op pads what a backward leaves off; a Function must return them all)."""
            g = backward(ctx, *dys)
            g = g if type(g) is tuple else (g,)
            return g + (None,) * (ctx.n_inputs - len(g))

        fn = _FNS[name] = type(f"tensor_ops_{name}", (torch.autograd.Function,),
                               {"forward": staticmethod(forward), "__module__": __name__,
                                "backward": staticmethod(once_differentiable(grads) if once else grads)})
    return fn


def _apply(name: str):
    return function(name).apply


def call(name: str, args: tuple, backend=None, plain=None):
    """``torch.ops.tensor_ops.<name>(*args, backend=backend)`` for eager autograd; ``args`` are
    every positional argument of the op's schema but ``backend`` (``plain``: ``usable(args)``
    when the caller knows it)."""
    if not (usable(args) if plain is None else plain):
        return getattr(torch.ops.tensor_ops, name)(*args, backend=backend)
    comp = _COMPOSITE.get(name)
    if comp is not None:
        return comp(*args, backend, _apply)
    return function(name).apply(*args, backend)


def facade_call(op: str, args: tuple, backend=None, check=None):
    """A facade call that autograd records: ``args`` are the facade function's, its scalars
    converted as the op's schema types them. ``check()`` validates them as the facade does.

    It runs unless the call takes the Function with the arguments as given: every scalar
    already of its schema type (``float(eps)`` would accept a bool or a str of digits,
    ``int(axis)`` a 1.5) and every tensor of x's dtype (the composite norms cast the weight
    to it). Then the Function's body validates the very same arguments before it computes
    (the stats entry declines anything but the plain case, and the facade's ``prepare``
    explains the rest, as every body reaches it), and a (1, 4096) rms_norm forward spares
    ~12 µs of a second validation."""
    conv = L.schema_args(op, args)
    plain = usable(args)
    if check is not None and not (plain and _as_given(args, conv)):
        check()
    return call(op, conv, backend, plain)


def _as_given(args: tuple, conv: tuple) -> bool:
    """Tensors (exactly Tensor or Parameter) of x's dtype, scalars of their schema types, None."""
    dt = args[0].dtype
    for a, c in zip(args, conv):
        t = type(a)
        if t is not type(c):
            return False
        if t in _PLAIN:
            if a.dtype is not dt:
                return False
        elif a is not None and t not in _SCALARS:
            return False        # e.g. a NumPy array: the facade names it
    return True


_SCALARS = (float, int, bool, str)
