"""The names of ``transformer_engine_torch`` 2.20 that tex does not compute.

They exist so that TE's Python layer imports (it takes them at module level), and fail only
when called: with the real extension loaded beside tex (``NVTE_PLUGIN=tensor_ops.tex`` puts it
at ``transformer_engine_torch_nv``) the call goes to it; otherwise a ``NotImplementedError``
names the op and what to use instead. Nothing here runs at import.
"""
from __future__ import annotations

import types

from . import _nvidia

_FP8 = ("FP8/MXFP8/NVFP4 quantization is not implemented by tensor_ops.tex; run in high precision "
        "(no te.autocast / fp8_autocast recipe, quantizer=None) or load NVIDIA's extension with "
        "NVTE_PLUGIN=tensor_ops.tex on a CUDA machine")
_UB = ("userbuffers communication/GEMM overlap needs NVIDIA's extension and CUDA devices; build the "
       "model without ub_overlap_* / initialize_ub, or load it with NVTE_PLUGIN=tensor_ops.tex")
_ATTN = ("fused attention (cuDNN) is not implemented by tensor_ops.tex; use DotProductAttention with "
         "NVTE_FUSED_ATTN=0 NVTE_FLASH_ATTN=0 (the unfused PyTorch path), or NVIDIA's extension")
_EP = ("NCCL expert parallelism (libnccl_ep) needs NVIDIA's extension and CUDA devices; use torch.distributed "
       "all-to-all for token dispatch, or load NVIDIA's extension with NVTE_PLUGIN=tensor_ops.tex")
_NVSHMEM = "NVSHMEM needs NVIDIA's extension and CUDA devices"
_MP = ("cuSolverMp (distributed Newton-Schulz) needs NVIDIA's extension and CUDA devices; "
       "use transformer_engine.pytorch.optimizers.newton_schulz's single-device form")
_SCALED = ("the per-row act_scales activations (MoE FP8 recipes) are not implemented by tensor_ops.tex; "
           "use the plain activation times the scales, or NVIDIA's extension")

#: name → what to use instead (the reason shown in the NotImplementedError)
FUNCTIONS = {
    # quantization (FP8, MXFP8, NVFP4, block scaling)
    **{n: _FP8 for n in (
        "quantize", "dequantize", "create_empty_quantized_tensor", "multi_tensor_quantize", "group_quantize",
        "group_dequantize", "bgrad_group_quantize", "group_requantize_inplace", "split_quantize", "compute_amax",
        "fp8_transpose", "fused_amax_and_scale_update_after_reduction", "fp8_block_scaling_compute_partial_amax",
        "fp8_block_scaling_partial_cast", "mxfp8_scaling_compute_partial_amax", "mxfp8_scaling_partial_cast",
        "nvfp4_quantize_with_amax", "nvfp4_group_quantize_with_amax", "nvfp4_data_transpose",
        "nvfp4_2d_scale_transpose", "nvfp4_expand_scale_to_fp8", "nvfp4_compute_per_block_scale",
        "nvfp4_compute_global_scale", "nvfp4_fused_scale", "nvfp4_multi_tensor_fused_scale",
        "nvfp4_2d_multi_tensor_transpose", "nvfp4_2d_compute_partial_amax", "nvfp4_multi_tensor_compute_partial_amax",
        "nvfp4_2d_partial_cast", "nvfp4_multi_tensor_2d_partial_cast", "multi_tensor_adam_fp8",
        "swizzle_scales_for_gemm_", "multi_tensor_swizzle_scales_for_gemm_",
        "multi_tensor_swizzle_scales_for_gemm_unchecked_", "grouped_swizzle_for_gemm",
        "te_general_grouped_gemm_for_grouped_tensor", "te_general_grouped_gemm_for_discrete_in",
        "te_general_grouped_gemm_for_discrete_out", "fused_topk_with_score_function_qb_fwd",
        "multi_tensor_transpose_to_bhsd", "multi_tensor_pad_last_dim", "bulk_allocate")},
    "multi_tensor_adam_param_remainder": ("FusedAdam(store_param_remainders=True) (bf16 params + int16 remainders) "
                                          "is not implemented by tensor_ops.tex; use master_weights=True or "
                                          "store_param_remainders=False"),
    **{n: _SCALED for n in ("scaled_swiglu", "scaled_dswiglu", "scaled_situglu", "scaled_dsituglu",
                            "scaled_clamped_swiglu", "scaled_clamped_dswiglu", "scaled_srelu", "scaled_dsrelu",
                            "situglu", "dsituglu")},
    # fused attention
    **{n: _ATTN for n in ("fused_attn_fwd", "fused_attn_bwd", "fa_prepare_fwd", "fa_prepare_bwd",
                          "copy_to_kv_cache")},
    # comm overlap
    "bulk_overlap_ag_with_external_gemm": _UB,
    # expert parallelism (NCCL EP)
    **{n: _EP for n in ("ep_initialize", "ep_prepare", "ep_dispatch", "ep_combine", "ep_dispatch_bwd",
                        "ep_combine_bwd", "ep_finalize", "ep_get_zero_copy", "ep_handle_mem_size",
                        "ep_prepare_and_dispatch")},
    **{n: _NVSHMEM for n in ("init_nvshmem_backend", "create_nvshmem_tensor", "nvshmem_send_on_current_stream",
                             "nvshmem_wait_on_current_stream", "nvshmem_finalize")},
    **{n: _MP for n in ("cusolvermp_ctx_create", "cusolvermp_ctx_destroy", "newton_schulz")},
}


def _stub(name: str, instead: str):
    def fn(*args, **kwargs):
        real = _nvidia.module()
        if real is not None and hasattr(real, name):
            return getattr(real, name)(*args, **kwargs)
        raise NotImplementedError(f"tex.{name}: {instead}")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Not computed by tensor_ops.tex ({instead}). Forwarded to NVIDIA's extension when loaded."
    return fn


class _ForwardedClass:
    """A class of NVIDIA's extension: constructing one builds the real object when the extension is
    loaded beside tex, else raises NotImplementedError."""

    _INSTEAD = _UB

    def __new__(cls, *args, **kwargs):
        real = _nvidia.module()
        if real is not None and hasattr(real, cls.__name__):
            return getattr(real, cls.__name__)(*args, **kwargs)
        raise NotImplementedError(f"tex.{cls.__name__}: {cls._INSTEAD}")


class CommOverlapCore(_ForwardedClass):
    pass


class CommOverlapBase(CommOverlapCore):
    pass


class CommOverlapP2PBase(CommOverlapCore):
    pass


class CommOverlapHelper(_ForwardedClass):
    pass


class CommOverlap(CommOverlapBase):
    pass


class CommOverlapP2P(CommOverlapP2PBase):
    pass


class FP8TensorMeta:
    """TE's FP8 scaling state: ``scale``, ``scale_inv``, ``amax_history`` (tensors, set by the caller).

    A plain container (TE's is a struct with these three read-write fields); with NVIDIA's
    extension loaded beside tex, the real class is built so that its FP8 kernels accept it."""

    def __new__(cls, *args, **kwargs):
        real = _nvidia.module()
        if real is not None and hasattr(real, "FP8TensorMeta"):
            return real.FP8TensorMeta(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self):
        self.scale = None
        self.scale_inv = None
        self.amax_history = None


#: ``tex.grouped_mlp_experimental.<fn>`` (a submodule of NVIDIA's extension)
grouped_mlp_experimental = types.SimpleNamespace(
    swizzle_scales_and_pack_ptrs_for_discrete_weights=_stub(
        "grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights", _FP8))

CLASSES = ["FP8TensorMeta", "CommOverlapCore", "CommOverlapBase", "CommOverlapP2PBase", "CommOverlapHelper",
           "CommOverlap", "CommOverlapP2P"]

for _n, _why in FUNCTIONS.items():
    globals()[_n] = _stub(_n, _why)

__all__ = sorted(FUNCTIONS) + CLASSES + ["grouped_mlp_experimental"]
