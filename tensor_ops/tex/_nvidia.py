"""vendor.nvidia: pass tex ops through to a real ``transformer_engine_torch`` when one is importable.

Arguments arrive canonical (validated; ``otype`` as torch.dtype; our IntEnums); they are
converted to the real module's enums by name. Selected only for CUDA tensors.
"""
from __future__ import annotations

import enum
import importlib
import sys

import torch

from tensor_ops import _env
from tensor_ops._ops import TEX_OPS

from ._enums import to_te_dtype

NAME = "nvidia"
MODULE = "transformer_engine_torch"
NV_MODULE = MODULE + "_nv"          # where TE's NVTE_PLUGIN loader puts the real module
PRIORITY = 100
_DTYPE_ARGS = {"rmsnorm_fwd": (5,), "layernorm_fwd": (6,), "generic_gemm": (6,)}
_GEMM_KW = ("comm_overlap", "comm_type", "extra_output", "bulk_overlap", "alpha", "beta")
_GEMM_DEFAULTS = (None, None, None, False, 1.0, None)


def module():
    """The real transformer_engine_torch module, or None (missing, or it is tensor_ops.tex itself).

    Under TE's ``NVTE_PLUGIN=tensor_ops.tex`` the real one is ``transformer_engine_torch_nv``."""
    mod = sys.modules.get(NV_MODULE)
    if mod is not None and not getattr(mod, "_TENSOR_OPS_TEX", False):
        return mod
    mod = sys.modules.get(MODULE)
    if mod is None:
        try:
            mod = importlib.import_module(MODULE)
        except Exception:
            return None
    if getattr(mod, "__name__", "") == "tensor_ops.tex" or getattr(mod, "_TENSOR_OPS_TEX", False):
        return None
    return mod


def availability():
    if _env.enabled("TE_FL_SKIP_CUDA"):
        return False, "disabled by TE_FL_SKIP_CUDA"
    if module() is not None:
        return True, ""
    try:
        importlib.import_module(MODULE)
    except Exception as exc:
        return False, f"import {MODULE} failed: {type(exc).__name__}: {exc}"
    if module() is None:
        return False, f"{MODULE} is tensor_ops.tex itself (tex.install()), not NVIDIA's module"
    return True, ""


def _first_tensor(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


def _on_device(t) -> bool:
    return t.device.type == "cuda"


def supports(*args) -> bool:
    t = _first_tensor(args)
    return t is not None and _on_device(t)


def _convert(te, a):
    if isinstance(a, enum.IntEnum):
        cls = getattr(te, type(a).__name__, None)
        return getattr(cls, a.name) if cls is not None else int(a)
    return a


def _passthrough(op):
    def fn(*args):
        te = module()
        if te is None:
            raise RuntimeError(f"{MODULE} is no longer importable")
        args = [_convert(te, a) for a in args]
        for i in _DTYPE_ARGS.get(op, ()):
            if isinstance(args[i], torch.dtype):
                args[i] = getattr(te.DType, to_te_dtype(args[i]).name)
        if op == "generic_gemm":
            kw = {k: v for k, v, d in zip(_GEMM_KW, args[16:], _GEMM_DEFAULTS) if v != d}
            if kw.get("beta") == (1.0 if args[14] else 0.0):  # the value implied by accumulate
                del kw["beta"]
            return getattr(te, op)(*args[:16], **kw)
        out = getattr(te, op)(*args)
        if op == "get_fused_attn_backend":
            from ._enums import NVTE_Fused_Attn_Backend
            return NVTE_Fused_Attn_Backend(int(out))
        return out
    fn.__name__ = f"nvidia_{op}"
    return fn


def register(registry):
    from tensor_ops._registry import BackendImplKind, OpImpl
    for op in TEX_OPS:
        registry.register_impl(OpImpl(op_name=op, impl_id=f"vendor.{NAME}", kind=BackendImplKind.VENDOR,
                                      vendor=NAME, fn=_passthrough(op), priority=PRIORITY,
                                      supports=None if op == "get_fused_attn_backend" else supports,
                                      available=availability, api="tex"))


def unregister(registry):
    for op in TEX_OPS:
        try:
            registry.unregister_impl(op, f"vendor.{NAME}", "tex")
        except KeyError:
            pass
