"""TransformerEngine enums: exactly the members and values of ``transformer_engine_torch`` 2.20.

Members: TE's pybind registrations (``common/util/pybind_helper.h``,
``pytorch/csrc/extensions/pybind.cpp``); values: TE's C headers (``fused_attn.h``,
``fused_router.h``, ``comm_gemm_overlap.h``, ``transformer_engine.h``) at 2.20. TE's Python
layer compares their member sets (``constants.py``, ``cpp_extensions/fused_attn.py``) and
``tests/test_tex_te_names.py`` checks every member the installed wheel uses. IntEnums here
(pybind's are not ints), so an int from TE's Python or a vendor compares equal.
"""
from __future__ import annotations

import enum

import torch

__all__ = [
    "DType", "NVTE_Fused_Attn_Backend", "NVTE_QKV_Format", "NVTE_QKV_Layout",
    "NVTE_Bias_Type", "NVTE_Mask_Type", "NVTE_Softmax_Type", "CommOverlapType",
    "CommOverlapAlgo", "FP8FwdTensors", "FP8BwdTensors", "Float8BlockScaleTensorFormat",
    "NVTEScalingMode", "NVTERoutingMapFormat", "NVTEQBHistogramMode",
]


class DType(enum.IntEnum):
    """transformer_engine::DType (TE >= 2.17 asserts exactly these 8 members)."""

    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10


class NVTE_Fused_Attn_Backend(enum.IntEnum):
    NVTE_No_Backend = -1
    NVTE_F16_arbitrary_seqlen = 1
    NVTE_FP8 = 2


class NVTE_QKV_Format(enum.IntEnum):
    NVTE_SBHD = 0
    NVTE_BSHD = 1
    NVTE_THD = 2
    NVTE_BSHD_2SBHD = 3
    NVTE_SBHD_2BSHD = 4
    NVTE_THD_2BSHD = 5
    NVTE_THD_2SBHD = 6
    NVTE_BHSD = 7
    NVTE_QKV_Format_NOT_SET = 8


class NVTE_QKV_Layout(enum.IntEnum):
    NVTE_SB3HD = 0
    NVTE_SBH3D = 1
    NVTE_SBHD_SB2HD = 2
    NVTE_SBHD_SBH2D = 3
    NVTE_SBHD_SBHD_SBHD = 4
    NVTE_BS3HD = 5
    NVTE_BSH3D = 6
    NVTE_BSHD_BS2HD = 7
    NVTE_BSHD_BSH2D = 8
    NVTE_BSHD_BSHD_BSHD = 9
    NVTE_T3HD = 10
    NVTE_TH3D = 11
    NVTE_THD_T2HD = 12
    NVTE_THD_TH2D = 13
    NVTE_THD_THD_THD = 14
    NVTE_SBHD_BSHD_BSHD = 15
    NVTE_BSHD_SBHD_SBHD = 16
    NVTE_THD_BSHD_BSHD = 17
    NVTE_THD_SBHD_SBHD = 18
    NVTE_Paged_KV_BSHD_BSHD_BSHD = 19
    NVTE_Paged_KV_BSHD_SBHD_SBHD = 20
    NVTE_Paged_KV_SBHD_BSHD_BSHD = 21
    NVTE_Paged_KV_SBHD_SBHD_SBHD = 22
    NVTE_Paged_KV_THD_BSHD_BSHD = 23
    NVTE_Paged_KV_THD_SBHD_SBHD = 24
    NVTE_BHSD_BHSD_BHSD = 25
    NVTE_QKV_Layout_NOT_SET = 26


class NVTE_Bias_Type(enum.IntEnum):
    NVTE_NO_BIAS = 0
    NVTE_PRE_SCALE_BIAS = 1
    NVTE_POST_SCALE_BIAS = 2
    NVTE_ALIBI = 3


class NVTE_Mask_Type(enum.IntEnum):
    NVTE_NO_MASK = 0
    NVTE_PADDING_MASK = 1
    NVTE_CAUSAL_MASK = 2
    NVTE_PADDING_CAUSAL_MASK = 3
    NVTE_CAUSAL_BOTTOM_RIGHT_MASK = 4
    NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5


class NVTE_Softmax_Type(enum.IntEnum):
    NVTE_VANILLA_SOFTMAX = 0
    NVTE_OFF_BY_ONE_SOFTMAX = 1
    NVTE_LEARNABLE_SOFTMAX = 2


class CommOverlapType(enum.IntEnum):
    RS = 0
    AG = 1


class CommOverlapAlgo(enum.IntEnum):
    BULK_OVERLAP_AG = 0
    BULK_OVERLAP_RS = 1
    SPLIT_PIPELINED_AG_P2P = 2
    SPLIT_PIPELINED_RS = 3
    SPLIT_PIPELINED_RS_P2P = 4
    ATOMIC_GEMM_RS = 5
    ATOMIC_GEMM_AG_P2P = 6
    ATOMIC_GEMM_RS_P2P = 7
    EXTERNAL_BULK_OVERLAP_AG = 8


class FP8FwdTensors(enum.IntEnum):
    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(enum.IntEnum):
    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


class Float8BlockScaleTensorFormat(enum.IntEnum):
    GEMM_READY = 0
    COMPACT = 1
    INVALID = 2


class NVTEScalingMode(enum.IntEnum):
    """Registered by the 2.20.2 extension (TE's Python uses the first two); the members are the
    C enum's (``transformer_engine.h``)."""

    NVTE_DELAYED_TENSOR_SCALING = 0
    NVTE_MXFP8_1D_SCALING = 1
    NVTE_BLOCK_SCALING_1D = 2
    NVTE_BLOCK_SCALING_2D = 3
    NVTE_NVFP4_1D_SCALING = 4
    NVTE_INVALID_SCALING = 100


class NVTERoutingMapFormat(enum.IntEnum):
    """MoE routing map: BYTEMAP = bool [tokens, experts]; BITMAP_U8 = uint8 [tokens, ceil(experts/8)],
    expert e in byte e//8, bit e%8."""

    BYTEMAP = 0
    BITMAP_U8 = 1


class NVTEQBHistogramMode(enum.IntEnum):
    TWO_KERNEL = 0
    FUSED_ATOMIC = 1


_TO_TORCH = {
    DType.kByte: torch.uint8,
    DType.kInt32: torch.int32,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
}
for _name, _member in (("float8_e4m3fn", DType.kFloat8E4M3), ("float8_e5m2", DType.kFloat8E5M2)):
    if hasattr(torch, _name):
        _TO_TORCH[_member] = getattr(torch, _name)
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}


def to_torch_dtype(dtype, default: torch.dtype | None = None, *, what: str = "otype") -> torch.dtype | None:
    """DType / torch.dtype / None → torch.dtype (None → ``default``)."""
    if dtype is None:
        return default
    if type(dtype) is DType:  # the common case first: one dict lookup (TE passes members)
        got = _TO_TORCH.get(dtype)
        if got is not None:
            return got
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, bool) or not isinstance(dtype, int):
        raise TypeError(f"{what} must be a tex.DType or torch.dtype, got {dtype!r}")
    try:
        member = DType(int(dtype))
    except ValueError:
        raise ValueError(
            f"{what}={dtype!r} is not a tex.DType value; valid: "
            f"{sorted((m.name, int(m)) for m in DType)}") from None
    if member not in _TO_TORCH:
        raise NotImplementedError(f"{what}=DType.{member.name} has no torch dtype here (FP4 is out of scope)")
    return _TO_TORCH[member]


def to_te_dtype(dtype: torch.dtype) -> DType:
    """torch.dtype → DType (KeyError if there is none)."""
    return _FROM_TORCH[dtype]
