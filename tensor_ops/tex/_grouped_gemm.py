"""te_general_grouped_gemm: one :func:`generic_gemm` per group (torch.matmul underneath, never a
hand-written GEMM), as upstream's multi-stream cuBLAS path."""
from __future__ import annotations

import math

import torch

from ._common import check_quantizer, check_tensor, nargs_error
from ._dispatch import call
from ._enums import to_torch_dtype
from ._gemm import _dims, gemm_out_shape, ref_generic_gemm
from ._refs import reference

__all__ = ["te_general_grouped_gemm", "get_grouped_gemm_setup_workspace_size"]


def _list(op, name, v, n=None, optional=False):
    if v is None and optional:
        return None
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"tex.{op}: {name} must be a list of tensors, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise ValueError(f"tex.{op}: {name} has {len(v)} entries, A has {n}")
    for i, t in enumerate(v):
        if not isinstance(t, torch.Tensor):
            check_quantizer(op, t)   # a quantized tensor object: NotImplementedError naming it
            check_tensor(op, f"{name}[{i}]", t)
    return list(v)


def te_general_grouped_gemm(*args):
    """``te_general_grouped_gemm(A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output,
    pre_gelu_out, grad, workspace, workspaceSize, accumulate, use_split_accumulator, math_sm_count)`` → bias.

    For each group i: ``D[i] = op(B[i]) @ op(A[i])`` with generic_gemm's epilogues (bias, or with
    ``grad`` the bias gradient written into ``bias[i]``; GELU when ``pre_gelu_out[i]`` is non-empty).
    With ``single_output`` the outputs are consecutive row blocks of ``D[0]``.
    """
    op = "te_general_grouped_gemm"
    if len(args) != 17:
        raise nargs_error(op, "17 (A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output, "
                          "pre_gelu_out, grad, workspace, workspaceSize, accumulate, use_split_accumulator, "
                          "math_sm_count)", len(args))
    (A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output, pre_gelu_out, grad, workspace,
     workspace_size, accumulate, use_split_accumulator, math_sm_count) = args
    A = _list(op, "A", A)
    n = len(A)
    B = _list(op, "B", B, n)
    bias = _list(op, "bias", bias, n)
    pre_gelu_out = _list(op, "pre_gelu_out", pre_gelu_out, n)
    transa, transb, grad, accumulate, single_output = map(bool, (transa, transb, grad, accumulate, single_output))
    otype = to_torch_dtype(D_type, None, what="D_type")
    if D is None:
        raise ValueError(f"tex.{op}: D must be given (upstream only returns the bias list)")
    D = _list(op, "D", D)
    if single_output and len(D) != 1:
        raise ValueError(f"tex.{op}: single_output=True takes D as one tensor in a list, got {len(D)}")
    if not single_output and len(D) != n:
        raise ValueError(f"tex.{op}: D has {len(D)} entries, A has {n}")
    shapes = []
    for i in range(n):
        for name, t in (("A", A[i]), ("B", B[i])):
            if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise TypeError(f"tex.{op}: {name}[{i}] has dtype {t.dtype}; expected float32/float16/bfloat16")
        if A[i].dim() < 1 or B[i].dim() < 1:
            raise ValueError(f"tex.{op}: A[{i}] and B[{i}] must have at least 1 dimension")
        a0, a1 = _dims(A[i])
        b0, b1 = _dims(B[i])
        if (a1 if transa else a0) != (b0 if transb else b1):
            raise ValueError(f"tex.{op}: group {i}: inner dimensions differ: A{tuple(A[i].shape)} transa={transa}, "
                             f"B{tuple(B[i].shape)} transb={transb}")
        shape = gemm_out_shape(A[i], transa, B[i], transb)
        shapes.append((math.prod(shape[:-1]), shape[-1]))
    devs = {t.device for t in A + B + D}
    if len(devs) > 1:
        raise ValueError(f"tex.{op}: tensors are on different devices {sorted(map(str, devs))}; move them to one")
    if single_output:
        need = sum(r * c for r, c in shapes)
        if D[0].numel() != need or not D[0].is_contiguous():
            raise ValueError(f"tex.{op}: D[0] has {D[0].numel()} elements, the groups' outputs need {need} "
                             f"(contiguous)")
    else:
        for i, (r, c) in enumerate(shapes):
            if D[i].numel() != r * c or not D[i].is_contiguous():
                raise ValueError(f"tex.{op}: D[{i}] has shape {tuple(D[i].shape)}, expected a contiguous ({r}, {c})")
    for i, (r, c) in enumerate(shapes):
        want_b = B[i].shape[-1] if grad else c      # grad: the bias gradient is B's column sums
        if bias[i].numel() and bias[i].numel() != want_b:
            raise ValueError(f"tex.{op}: bias[{i}] has {bias[i].numel()} elements, expected {want_b} "
                             f"({'B[i] last dim, grad=True' if grad else 'the output width'})")
        if pre_gelu_out[i].numel() and pre_gelu_out[i].numel() != r * c:
            raise ValueError(f"tex.{op}: pre_gelu_out[{i}] has {pre_gelu_out[i].numel()} elements, expected {r * c}")
    return call(op, (A, transa, B, transb, D, otype, list(m_splits or []), bias, bias_type, single_output,
                     pre_gelu_out, grad, workspace, workspace_size, accumulate, use_split_accumulator,
                     math_sm_count))


def get_grouped_gemm_setup_workspace_size(num_tensors) -> int:
    """Bytes of the pointer-setup workspace upstream's grouped GEMM needs; tex needs none (0)."""
    return 0


@reference("te_general_grouped_gemm")
def ref_te_general_grouped_gemm(A, transa, B, transb, D, D_type, m_splits, bias, bias_type, single_output,
                                pre_gelu_out, grad, workspace, workspace_size, accumulate, use_split_accumulator,
                                math_sm_count):
    offset = 0
    for i in range(len(A)):
        shape = gemm_out_shape(A[i], transa, B[i], transb)
        if single_output:
            size = math.prod(shape)
            out = D[0].view(-1)[offset:offset + size].view(shape)
            offset += size
        else:
            out = D[i]
        otype = D_type if D_type is not None else out.dtype
        if A[i].numel() == 0 or B[i].numel() == 0:
            if out.numel() and not accumulate:
                out.zero_()
            if bias[i].numel() and grad:
                bias[i].zero_()
            if pre_gelu_out[i].numel():
                pre_gelu_out[i].zero_()
            continue
        gelu = pre_gelu_out[i].numel() > 0
        b = bias[i] if bias[i].numel() else None
        _, bgrad, _, _ = ref_generic_gemm(A[i], transa, B[i], transb, out, None, otype, b, bias_type, gelu,
                                          pre_gelu_out[i] if gelu else None, grad, workspace, workspace_size,
                                          accumulate, use_split_accumulator, None, None, None, False, 1.0,
                                          1.0 if accumulate else 0.0)
        if grad and b is not None and bgrad is not None:
            b.copy_(bgrad.reshape(b.shape))
    return bias
