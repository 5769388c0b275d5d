"""The op names the registry knows: the facade ops and the TransformerEngine (tex) ops.

A registration for an unknown op name is refused on the global registry, so a typo in a
plugin fails when it registers, not silently at call time.
"""
from __future__ import annotations

FACADE_OPS = (
    "rms_norm", "layer_norm", "softmax", "silu", "gelu", "relu",
    "swiglu", "geglu", "rope", "matmul",
)

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
    ]
)

KNOWN_OPS = frozenset(FACADE_OPS) | frozenset(TEX_OPS)

# Built-in backends in their default order; "torch" is tex's reference backend.
BUILTIN_BACKENDS = ("cuda", "opencl", "cpp", "numpy")
REFERENCE_BACKENDS = ("numpy", "torch")
ALL_BUILTIN_NAMES = BUILTIN_BACKENDS + ("torch",)
