"""The ops tensor_ops knows: one :class:`OpSpec` per facade op (the single source of truth),
plus the TransformerEngine (tex) op names.

Every list of facade ops in the project is derived from :data:`SPECS`: the facade functions,
the registry's name check, the config validator, each backend's op table, the benchmark
engine, ``get_backend_info()`` and the test harness. Adding an op = one spec in its family
module (``norm``, ``softmax``, ``activation``, ``rope``, ``matmul``) plus its kernels; see
CONTRIBUTING.md "Adding an op".
"""
from __future__ import annotations

from ._spec import OpSpec, Prepared, XRule
from ._tolerance import TOLERANCES, tolerance
from .activation import GEGLU, GELU, RELU, SILU, SWIGLU
from .matmul import MATMUL
from .norm import ADD_LAYER_NORM, ADD_RMS_NORM, LAYER_NORM, RMS_NORM
from .rope import ROPE
from .softmax import SOFTMAX

#: name -> spec, in the order the docs and tables list them
SPECS: dict[str, OpSpec] = {s.name: s for s in (
    RMS_NORM, LAYER_NORM, ADD_RMS_NORM, ADD_LAYER_NORM, SOFTMAX, SILU, GELU, RELU, SWIGLU, GEGLU, ROPE, MATMUL)}
FACADE_OPS = tuple(SPECS)
#: the ops with hand-written kernels (every native backend's op table); matmul goes to BLAS
KERNEL_OPS = tuple(n for n, s in SPECS.items() if s.kernel)


def spec(name: str) -> OpSpec:
    """The spec of facade op ``name`` (ValueError naming the known ops otherwise)."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known facade ops: {sorted(SPECS)}") from None


_ACTS = ("gelu", "relu", "silu", "qgelu", "srelu")
_GATED = ("geglu", "reglu", "swiglu", "qgeglu", "sreglu", "glu")

TEX_OPS = tuple(
    [
        "rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_bwd_add", "layernorm_fwd", "layernorm_bwd",
        "generic_gemm",
        *_ACTS, *_GATED,
        *("d" + a for a in _ACTS), *("d" + g for g in _GATED),
        "clamped_swiglu", "clamped_dswiglu",
        *("dbias_d" + a for a in _ACTS),
        "bgrad_quantize",
        "scaled_softmax_forward", "scaled_softmax_backward",
        "scaled_masked_softmax_forward", "scaled_masked_softmax_backward",
        "scaled_upper_triang_masked_softmax_forward", "scaled_upper_triang_masked_softmax_backward",
        "scaled_aligned_causal_masked_softmax_forward", "scaled_aligned_causal_masked_softmax_backward",
        "fused_rope_forward", "fused_rope_backward",
        "multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm",
        "multi_tensor_adam", "multi_tensor_sgd",
        "dropout_fwd", "dropout_bwd",
        "get_fused_attn_backend",
        # TE 2.20's ops that need no FP8 (issue 16)
        "multi_tensor_scale_tensor", "multi_tensor_compute_scale_and_scale_inv",
        "multi_tensor_compute_scale_inv_e8m0", "multi_tensor_adam_capturable",
        "multi_tensor_adam_capturable_master",
        "fused_qkv_rope_forward", "fused_qkv_rope_backward",
        "moe_permute_fwd", "moe_permute_bwd", "moe_unpermute_fwd", "moe_unpermute_bwd",
        "fused_topk_with_score_function_fwd", "fused_topk_with_score_function_bwd",
        "fused_score_for_moe_aux_loss_fwd", "fused_score_for_moe_aux_loss_bwd",
        "fused_moe_aux_loss_fwd", "fused_moe_aux_loss_bwd",
        "fused_multi_row_padding", "fused_multi_row_unpadding", "splits_to_offsets",
        "thd_read_half_tensor", "thd_second_half_lse_correction", "thd_read_second_half_lse",
        "thd_out_correction", "thd_grad_correction", "thd_get_partitioned_indices",
        "thd_sequence_order_to_cp_rank_order", "thd_cp_rank_order_to_sequence_order",
        "thd_copy_valid_tokens_from_per_split_to_rank_local", "convert_thd_to_bshd", "convert_bshd_to_thd",
        "te_general_grouped_gemm",
    ]
)

KNOWN_OPS = frozenset(FACADE_OPS) | frozenset(TEX_OPS)

__all__ = ["OpSpec", "Prepared", "XRule", "SPECS", "FACADE_OPS", "KERNEL_OPS", "TEX_OPS", "KNOWN_OPS",
           "BUILTIN_BACKENDS", "REFERENCE_BACKENDS", "ALL_BUILTIN_NAMES", "TOLERANCES", "spec", "tolerance"]

# Built-in backends in their default order; "torch" is tex's reference backend.
BUILTIN_BACKENDS = ("cuda", "opencl", "cpp", "numpy")
REFERENCE_BACKENDS = ("numpy", "torch")
ALL_BUILTIN_NAMES = BUILTIN_BACKENDS + ("torch",)
