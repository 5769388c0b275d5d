"""The facade for torch tensors, in one place (``import tensor_ops`` still never imports torch:
this module is reached only with a tensor in hand, so torch is already loaded).

- **CPU tensors** are computed zero-copy by the host backends: every tensor argument becomes
  a NumPy view of the same memory (bfloat16 through an int16 view read as ml_dtypes'
  bfloat16), the NumPy path runs (the same validation and messages, the same resolver, the
  backends that declare the ``torch-cpu`` array kind), and the result comes back as a torch
  tensor of x's dtype on the CPU (``torch.from_numpy``: no copy; ``out=`` is written
  through its view and returned). Strided tensors are strided views, so they behave as
  strided NumPy arrays do.
- **CUDA tensors** take the device path (the cuda backend, in place), as before.
- **Other devices** (mps, xpu, meta, ...) are served by a backend that declares the array
  kind ``torch-<device>`` (a plugin); without one, a ValueError names the device and what is
  supported.
- **Autograd**: with grad enabled and a tensor argument that requires grad, the call goes
  through the custom op ``torch.ops.tensor_ops.<op>`` (:mod:`tensor_ops.torch`), which
  records the backward. ``out=`` is refused there, as torch refuses it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import _state
from ._arrays import ACCEPTED, bfloat16, kind_of
from ._validate import same_place

#: the oldest torch whose torch.library / torch.compiler APIs tensor_ops.torch uses
MIN_TORCH = (2, 5)
_PARAMS: dict = {}      # op -> its positional parameter names (the spec's signature)
_NP: dict = {}          # torch dtype -> NumPy dtype (filled on first use)
_I16 = None


def _torch():
    import torch
    return torch


def _tables():
    global _I16
    if not _NP:
        torch = _torch()
        _NP.update({torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
                    torch.float64: np.dtype(np.float64), torch.bfloat16: bfloat16()})
        _I16 = torch.int16
    return _NP


def version_tuple(v: str) -> tuple:
    """(major, minor) of a version string such as '2.13.0+cpu'."""
    out = []
    for part in v.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def params(spec) -> tuple:
    p = _PARAMS.get(spec.name)
    if p is None:
        p = _PARAMS[spec.name] = tuple(spec.signature.parameters)
    return p


def to_numpy(t, name: str):
    """A NumPy view of CPU tensor ``t`` (no copy). bfloat16 is viewed as ml_dtypes' bfloat16;
    other dtypes NumPy has keep their dtype (validation then names them), the rest is a
    TypeError with the facade's dtype message."""
    if t.requires_grad:
        t = t.detach()
    if t.is_neg():      # e.g. ``z.conj().imag``: its memory holds the negated values
        if name.startswith("out"):
            raise ValueError(f"{name} is a tensor with its negative bit set (a view such as z.conj().imag): "
                             f"it cannot be written through; pass a plain tensor (e.g. its resolve_neg())")
        t = t.resolve_neg()
    if t.dtype in _tables():
        if t.dtype is _torch().bfloat16:
            return t.view(_I16).numpy().view(_NP[t.dtype])
        return t.numpy()
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        raise TypeError(f"{name} must have dtype {ACCEPTED}, got {str(t.dtype).replace('torch.', '')}") from None


def to_torch(a):
    """A CPU tensor sharing ``a``'s memory (bfloat16 through an int16 view)."""
    torch = _torch()
    if a.dtype.itemsize == 2 and a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _tensors(r):
    """A result (an array, or the fused add + norm's pair) as CPU tensors sharing its memory."""
    return tuple(to_torch(a) for a in r) if type(r) is tuple else to_torch(r)


def _check_places(spec, args, out, x, dev: str) -> None:
    """Every other array argument is a torch tensor on x's device (the NumPy path's formula)."""
    names = params(spec)
    ref = names[0]
    for name, a in zip(names[1:], args[1:]):
        k = kind_of(a)
        if k:
            same_place(a, k, x, "torch", name, ref)
    outs = out if type(out) is tuple else (out,)
    for i, o in enumerate(outs):
        k = kind_of(o) if o is not None else ""
        if k:
            same_place(o, k, x, "torch", "out" if type(out) is not tuple else f"out[{i}]", ref)


def _grad_args(spec, args, out):
    """The name of the first tensor argument that requires grad while grad mode is on."""
    torch = _torch()
    if not torch.is_grad_enabled():
        return None
    tensor = torch.Tensor
    for name, a in zip(params(spec), args):
        if isinstance(a, tensor) and a.requires_grad:
            return name
    for o in (out if type(out) is tuple else (out,)):
        if isinstance(o, tensor) and o.requires_grad:
            return "out"
    return None


_NATIVE = [False]
_VIEWS: list = [None]   # tensor_ops._cpp._torch_views once the cpp module is loaded
_AUTOGRAD: list = [None]  # tensor_ops.torch._eager.facade_call once the torch ops are registered


def _native_entries() -> None:
    """Once the cpp module is loaded: let its plain-call entries take torch CPU tensors directly
    (cpp_ext/torch_entry.cpp), so a plain ``to.rms_norm(x, w)`` on tensors skips this module,
    and let :func:`host` make its NumPy views there (``_torch_views``)."""
    import sys
    mod = sys.modules.get("tensor_ops._cpp")
    if mod is None or not hasattr(mod, "_set_torch"):
        return
    torch = _torch()
    mod._set_torch(torch.Tensor, torch.float32, torch.float16, torch.bfloat16, torch.from_numpy, bfloat16(),
                   parameter=torch.nn.Parameter, is_grad_enabled=torch.is_grad_enabled)
    _VIEWS[0] = getattr(mod, "_torch_views", None)
    _NATIVE[0] = True


def route(spec, args: tuple, out, backend, general_device, grad: bool = True):
    """The facade call of ``spec`` whose first argument is a torch tensor (``grad=False``:
    never through autograd; the custom ops' own bodies call it that way)."""
    if not _NATIVE[0]:
        _native_entries()
    x = args[0]
    needs_grad = _grad_args(spec, args, out) if grad else None
    if needs_grad is not None:
        if out is not None:
            raise ValueError(f"out= cannot be used when an argument requires grad ({needs_grad} has "
                             f"requires_grad=True): autograd does not record writes into out (torch refuses "
                             f"out= with autograd too); call without out=, or under torch.no_grad()")
        if not x.is_cpu:
            _check_places(spec, args, None, x, x.device.type)
        f = _AUTOGRAD[0]
        if f is None:
            validate(spec, args)            # before registering: a bad call gets the facade's error
            from . import torch as tot
            tot.require()                   # registered, or a RuntimeError saying why not
            from .torch import _eager
            f = _AUTOGRAD[0] = _eager.facade_call
        # validated there (CPU: host_views checks the places), or by the op's own body
        return f(spec.name, args, backend, lambda: validate(spec, args))
    if x.is_cpu:
        return host(spec, args, out, backend)
    dev = x.device.type
    if dev == "cuda":
        return general_device(spec, args, out, backend)
    if not served_device(dev):
        raise ValueError(unsupported_device(dev, params(spec)[0]))
    return general_device(spec, args, out, backend, f"torch-{dev}")


def validate(spec, args) -> None:
    """The NumPy path's validation of a torch call (views for CPU tensors); raises its errors."""
    if args[0].is_cpu:
        args = host_views(spec, args)
    spec.prepare(*args, None)


def host(spec, args: tuple, out, backend):
    """CPU tensors through the NumPy path on zero-copy views; the result as a torch tensor.

    The views come from the cpp module's ``_torch_views`` in one call when it can make them all
    (and the arguments need no placement check: it declines anything but CPU tensors and
    scalars); otherwise each argument is checked and viewed here. The general path on a
    (1, 4096) call cost ~33 us over NumPy's ~9 us before (``t.numpy()`` ~2 us a tensor,
    ``str(device)`` per argument)."""
    x = args[0]
    views = host_views(spec, args)
    if out is None and backend is None and _state.context_backend.get() is None:
        f = _state.fast_fns.get(spec.name)
        if f is not None:
            r = f(*views)
            if r is not None:
                return _tensors(r)
    ov: Any = None
    if out is not None:
        pair = type(out) is tuple
        mk = _VIEWS[0]
        ov = (mk(*out) if pair else mk(out)) if mk is not None else None
        if ov is None:
            _check_places(spec, args, out, x, "cpu")
            ov = _views(out, [f"out[{i}]" for i in range(len(out))]) if pair else _views((out,), ("out",))
        if not pair:
            ov = ov[0]
    r = _general(spec, views, ov, backend, "torch-cpu")
    if out is not None:
        return out
    return _tensors(r)


def host_views(spec, args: tuple) -> tuple:
    """``args`` of a call whose x is a CPU tensor, each tensor as a NumPy view of its memory
    (placement checked: every array argument a CPU tensor, else the facade's error)."""
    mk = _VIEWS[0]
    views = mk(*args) if mk is not None else None
    if views is None:
        _check_places(spec, args, None, args[0], "cpu")
        views = _views(args, params(spec))
    return views


def _views(args, names) -> tuple:
    """Each torch tensor in ``args`` as a NumPy view (:func:`to_numpy`), the rest unchanged."""
    tensor = _torch().Tensor
    return tuple(to_numpy(a, n) if isinstance(a, tensor) else a for n, a in zip(names, args))


def _general(spec, views, out, backend, kind):
    """The NumPy general path (``_facade._general_arrays``; imported on first use: _facade
    imports this module lazily, from its first torch call)."""
    f = _GENERAL[0]
    if f is None:
        from ._facade import _general_arrays as f
        _GENERAL[0] = f
    return f(spec, views, out, backend, kind)


_GENERAL: list = [None]


def served_device(dev: str) -> bool:
    """Whether a registered backend declares the array kind ``torch-<dev>``."""
    from . import _global
    kind = f"torch-{dev}"
    return any(kind in getattr(i.owner, "array_kinds", ()) for i in _global.get_registry().all_impls())


def unsupported_device(dev: str, name: str = "x") -> str:
    from . import _global
    kinds = sorted({k for i in _global.get_registry().all_impls() for k in getattr(i.owner, "array_kinds", ())
                    if k.startswith("torch-")})
    return (f"{name} is a torch tensor on device {dev!r}: tensor_ops computes torch tensors on 'cpu' (the host "
            f"backends, zero-copy) and 'cuda' (the cuda backend); no registered backend serves 'torch-{dev}' "
            f"(array kinds served here: {kinds}). Move it with {name}.to('cpu'), or register a plugin whose "
            f"Backend declares array_kinds=('torch-{dev}',)")
