"""torch.compile sees the facade functions as the torch ops.

Dynamo cannot trace the facade's Python (a ContextVar, the resolver, the native entries),
and a graph break there would split every compiled block. ``torch.compiler.substitute_in_graph``
registers, for each facade function, a polyfill with the same signature that calls
``torch.ops.tensor_ops.<op>``: dynamo traces the polyfill instead (eager calls are
untouched), so ``tensor_ops.rms_norm(x, w)`` inside ``torch.compile(fullgraph=True)`` becomes
one node of the graph.
"""
from __future__ import annotations

import inspect

STATUS: dict = {}

_TEMPLATE = '''\
def {name}({params}, *, out=None, backend=None):
    r = _call({name!r}, ({args},), backend)
    if out is not None:
        if type(out) is tuple:
            for o, v in zip(out, r):
                o.copy_(v)
            return out
        out.copy_(r)
        return out
    return r
'''


def _polyfill(spec):
    sig = spec.signature
    names = list(sig.parameters)
    defaults = {f"_d_{k}": p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    params = ", ".join(k if f"_d_{k}" not in defaults else f"{k}=_d_{k}" for k in names)
    from ._library import autograd_call
    ns = {"_call": autograd_call, **defaults}
    exec(compile(_TEMPLATE.format(name=spec.name, params=params, args=", ".join(names)),   # noqa: S102
                 f"<tensor_ops compile polyfill {spec.name}>", "exec"), ns)
    return ns[spec.name]


def install() -> None:
    """Register the polyfills once; STATUS records what happened (never raises)."""
    if STATUS:
        return
    import torch
    from .. import _facade
    sub = getattr(torch.compiler, "substitute_in_graph", None)
    if sub is None:
        STATUS.update(ok=False, reason=f"torch {torch.__version__} has no torch.compiler.substitute_in_graph: "
                                       f"inside torch.compile call torch.ops.tensor_ops.* (or tensor_ops.nn)")
        return
    done, failed = [], {}
    for name, fn in _facade.OPS.items():
        try:
            sub(fn)(_polyfill(fn.__wrapped_spec__))
            done.append(name)
        except Exception as exc:  # e.g. registered twice by a reloaded module
            failed[name] = f"{type(exc).__name__}: {exc}"
    STATUS.update(ok=not failed, reason=None if not failed else f"not substituted: {failed}", facade=done)
