"""Attention backend query and version getters (no fused attention / cuBLAS here)."""
from __future__ import annotations

from . import _nvidia
from ._backends import current_override
from ._dispatch import call
from ._enums import NVTE_Fused_Attn_Backend
from ._refs import reference

__all__ = ["get_fused_attn_backend", "get_cublasLt_version", "get_cudnn_version", "get_num_cublas_streams",
           "device_supports_multicast", "get_stream_priority_range", "ubuf_built_with_mpi", "nvte_built_with_cublasmp",
           "ep_zero_copy_supported", "copy_data_ptrs_to_device", "swap_first_dims"]


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


def _real_or(name, default):
    def fn(*args, **kwargs):
        te = _nvidia.module()
        if te is not None and hasattr(te, name):
            return getattr(te, name)(*args, **kwargs)
        return default
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"NVIDIA's answer when its extension is loaded beside tex, else {default!r} (no CUDA features here)."
    return fn


device_supports_multicast = _real_or("device_supports_multicast", False)
get_stream_priority_range = _real_or("get_stream_priority_range", (0, 0))
ubuf_built_with_mpi = _real_or("ubuf_built_with_mpi", False)
nvte_built_with_cublasmp = _real_or("nvte_built_with_cublasmp", False)
ep_zero_copy_supported = _real_or("ep_zero_copy_supported", False)


def copy_data_ptrs_to_device(tensors, device):
    """The tensors' data pointers as an int64 tensor on ``device`` (grouped GEMM pointer arrays)."""
    import torch
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("tex.copy_data_ptrs_to_device: tensors must be a list of torch.Tensor")
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)


def swap_first_dims(tensor, out=None):
    """``tensor`` with its first two dims swapped, contiguous (into ``out`` when given)."""
    import torch
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tex.swap_first_dims: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() < 2:
        raise ValueError(f"tex.swap_first_dims: tensor needs >= 2 dims, got shape {tuple(tensor.shape)}")
    t = tensor.transpose(0, 1)
    if out is None:
        return t.contiguous()
    if not isinstance(out, torch.Tensor) or out.shape != t.shape or out.dtype != t.dtype:
        raise ValueError(f"tex.swap_first_dims: out must be a {t.dtype} tensor of shape {tuple(t.shape)}")
    with torch.no_grad():
        out.copy_(t)
    return out


@reference("get_fused_attn_backend")
def ref_get_fused_attn_backend(*args):
    return NVTE_Fused_Attn_Backend.NVTE_No_Backend
