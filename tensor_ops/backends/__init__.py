"""Built-in backends. Each module here follows CONTRIBUTING.md's backend contract
(``NAME``, ``availability()``, ``register(registry)``, ``info()``) and is registered into the
global registry exactly like a plugin. A device backend sets ``HOST_ARRAYS = "when-named"``:
it then serves NumPy input only when an order names it (see OpImpl.host_arrays). Importing them is cheap: toolkits (cupy, pyopencl)
and native modules are loaded only by ``availability()``.
"""
from __future__ import annotations

import importlib
import logging

log = logging.getLogger("tensor_ops")

BUILTIN_MODULES = {
    "numpy": "tensor_ops.backends.numpy_backend",
    "cpp": "tensor_ops.backends.cpp",
    "opencl": "tensor_ops.backends.opencl",
    "cuda": "tensor_ops.backends.cuda",
}


def load_builtin(name: str):
    """The backend module, or None when this build does not ship it."""
    try:
        return importlib.import_module(BUILTIN_MODULES[name])
    except ModuleNotFoundError as exc:
        if exc.name == BUILTIN_MODULES[name]:
            return None
        raise


def register_builtins(registry) -> dict:
    """Register every shipped backend; returns {name: module or error string}."""
    out: dict = {}
    for name in ("numpy", "cpp", "opencl", "cuda"):
        try:
            mod = load_builtin(name)
            if mod is None:
                out[name] = "not shipped in this version"
                continue
            mod.register(registry)
            policy = getattr(mod, "HOST_ARRAYS", "always")
            for impl in registry.all_impls():
                if impl.backend == name and impl.api == "facade":
                    impl.host_arrays = policy
            out[name] = mod
        except Exception as exc:  # a broken backend module must not break the others
            log.warning("tensor_ops: backend %r failed to register: %s: %s", name, type(exc).__name__, exc)
            out[name] = f"registration failed: {type(exc).__name__}: {exc}"
    return out
