"""Attention backend query and version getters (no fused attention / cuBLAS here)."""
from __future__ import annotations

from . import _nvidia
from ._backends import current_override
from ._dispatch import call
from ._enums import NVTE_Fused_Attn_Backend
from ._refs import reference

__all__ = ["get_fused_attn_backend", "get_cublasLt_version", "get_cudnn_version", "get_num_cublas_streams"]


def get_fused_attn_backend(*args):
    """Which fused-attention backend would run (TE's 19 positional args, accepted as given);
    ``NVTE_No_Backend`` until fused attention exists (a real TE answers through vendor.nvidia)."""
    return call("get_fused_attn_backend", tuple(args))


def _version(name):
    te = _nvidia.module() if current_override() in (None, "nvidia") else None
    if te is not None and _nvidia.availability()[0]:
        try:
            return int(getattr(te, name)())
        except Exception:
            return 0
    return 0


def get_cublasLt_version():
    """cuBLASLt version (0: not applicable)."""
    return _version("get_cublasLt_version")


def get_cudnn_version():
    """cuDNN version (0: not applicable)."""
    return _version("get_cudnn_version")


def get_num_cublas_streams():
    """Number of cuBLAS streams TE uses for overlap (0: not applicable)."""
    return _version("get_num_cublas_streams")


@reference("get_fused_attn_backend")
def ref_get_fused_attn_backend(*args):
    return NVTE_Fused_Attn_Backend.NVTE_No_Backend
