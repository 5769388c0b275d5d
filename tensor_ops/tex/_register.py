"""Put every tex op into the global OpRegistry: reference.torch, default.cpp / default.cuda
adapters where kernels exist, vendor.nvidia passthrough."""
from __future__ import annotations

from tensor_ops._ops import TEX_OPS

from ._common import log
from ._dispatch import REFERENCE

_done = False


def register_all(registry) -> None:
    global _done
    if _done:
        return
    from tensor_ops._registry import BackendImplKind, OpImpl

    missing = sorted(set(TEX_OPS) - set(REFERENCE))
    if missing:  # every declared tex op must have a reference
        raise RuntimeError(f"tensor_ops.tex: no reference.torch implementation for {missing}")
    have = {i.impl_id for i in registry.get_impls("rmsnorm_fwd", "tex")}
    if "reference.torch" not in have:
        for op in TEX_OPS:
            registry.register_impl(OpImpl(op_name=op, impl_id="reference.torch", kind=BackendImplKind.REFERENCE,
                                          fn=REFERENCE[op], backend="torch", priority=0, api="tex"))
    for modname in ("_cpp_adapters", "_cuda_adapters", "_nvidia"):
        try:
            mod = __import__(f"tensor_ops.tex.{modname}", fromlist=["register"])
        except ImportError as exc:
            log.debug("tensor_ops.tex: %s not loaded: %s", modname, exc)
            continue
        impl_id = getattr(mod, "IMPL_ID", f"vendor.{getattr(mod, 'NAME', '')}")
        if impl_id not in have:
            mod.register(registry)
    _done = True
