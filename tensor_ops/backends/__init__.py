"""Built-in backends, one module or package each, named by the backend (the name rule,
CONTRIBUTING.md): ``numpy``, ``cpp``, ``opencl/``, ``cuda/`` and ``cupy`` (the CuPy
reference: float64 and matmul on device arrays). Each defines its op functions under the op
names and a ``BACKEND`` (:class:`~tensor_ops.backends._contract.Backend`), registered by
:func:`~tensor_ops.backends._contract.register_backend` exactly like a plugin's. Importing
them is cheap: toolkits (cupy, pyopencl) and native modules are loaded by the backend's
probe, the first time an order reaches it.
"""
from __future__ import annotations

import importlib
import logging

from .._ops import BUILTIN_BACKENDS
from ._contract import Backend, register_backend

log = logging.getLogger("tensor_ops")

#: registration order (the default *order* is BUILTIN_BACKENDS, fastest first; references,
#: "numpy" and "cupy", come after every other impl of an op whatever the order says)
BUILTIN_NAMES = ("numpy", "cpp", "opencl", "cuda", "cupy")
#: built-in references that are not in the default order (they serve only what the others don't)
EXTRA_REFERENCES = ("cupy",)
assert set(BUILTIN_NAMES) == set(BUILTIN_BACKENDS) | set(EXTRA_REFERENCES)


def load_builtin(name: str):
    """The backend module ``tensor_ops.backends.<name>``, or None when this build lacks it."""
    modname = f"{__name__}.{name}"
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name == modname:
            return None
        raise


def register_builtins(registry) -> dict:
    """Register every shipped backend; returns {name: module or error string}."""
    out: dict = {}
    for name in BUILTIN_NAMES:
        try:
            mod = load_builtin(name)
            if mod is None:
                out[name] = "not shipped in this version"
                continue
            backend = getattr(mod, "BACKEND", None)
            if not isinstance(backend, Backend):
                raise TypeError(f"tensor_ops.backends.{name} defines no BACKEND (a _contract.Backend)")
            register_backend(registry, backend)
            out[name] = mod
        except Exception as exc:  # a broken backend module must not break the others
            log.warning("tensor_ops: backend %r failed to register: %s: %s", name, type(exc).__name__, exc)
            out[name] = f"registration failed: {type(exc).__name__}: {exc}"
    return out
