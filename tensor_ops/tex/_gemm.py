"""generic_gemm: D = alpha * op(B) @ op(A) + beta * D (row-major view), with TE's epilogues."""
from __future__ import annotations

import math

import torch

from ._activations import _gelu_tanh, _gelu_tanh_grad
from ._common import as_float, check_quantizer, check_same_device, check_tensor
from ._dispatch import call
from ._refs import reference
from ._enums import to_torch_dtype

__all__ = ["generic_gemm"]


def _dims(t: torch.Tensor):
    """(prod(leading dims), last dim) of a tensor."""
    if t.dim() == 0:
        return 1, 1
    return math.prod(t.shape[:-1]), t.shape[-1]


def gemm_out_shape(A, transA, B, transB):
    a0, a1 = _dims(A)
    b1 = B.shape[-1]
    rows = [b1] if transB else list(B.shape[:-1])
    return rows + [a0 if transA else a1]


def generic_gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in,
                 grad, workspace, workspace_size, accumulate, use_split_accumulator,
                 comm_overlap=None, comm_type=None, extra_output=None, bulk_overlap=False,
                 alpha=1.0, beta=None):
    """TE's cuBLASLt GEMM → ``[D, bias_grad, pre_gelu_out, extra_output]``."""
    op = "generic_gemm"
    check_quantizer(op, quantizer)
    check_tensor(op, "A", A, float_only=True)
    check_tensor(op, "B", B, float_only=True)
    for name, t in (("D", D), ("bias", bias), ("gelu_in", gelu_in)):
        check_tensor(op, name, t, optional=True)
    check_same_device(op, A=A, B=B, D=D, bias=bias, gelu_in=gelu_in)
    if comm_overlap is not None:
        raise NotImplementedError(f"tex.{op}: comm_overlap (userbuffers) is not supported on this backend")
    transA, transB, gelu, grad, accumulate = map(bool, (transA, transB, gelu, grad, accumulate))
    if A.dim() < 1 or B.dim() < 1:
        raise ValueError(f"tex.{op}: A and B must have at least 1 dimension, got A{tuple(A.shape)} "
                         f"B{tuple(B.shape)}")
    a0, a1 = _dims(A)
    b0, b1 = _dims(B)
    ka = a1 if transA else a0
    kb = b0 if transB else b1
    if ka != kb:
        raise ValueError(
            f"tex.{op}: inner dimensions differ: A{tuple(A.shape)} transA={transA} gives K={ka}, "
            f"B{tuple(B.shape)} transB={transB} gives K={kb} (D = op(B) @ op(A))")
    out_shape = gemm_out_shape(A, transA, B, transB)
    n_out = out_shape[-1]
    otype = to_torch_dtype(output_dtype, None, what="output_dtype")
    if D is not None:
        if D.numel() != math.prod(out_shape) or D.dim() == 0 or D.shape[-1] != n_out or not D.is_contiguous():
            raise ValueError(f"tex.{op}: D has shape {tuple(D.shape)}, expected a contiguous {tuple(out_shape)} for "
                             f"A{tuple(A.shape)} transA={transA}, B{tuple(B.shape)} transB={transB}")
        if otype is not None and D.dtype != otype:
            raise ValueError(f"tex.{op}: D has dtype {D.dtype} but output_dtype is {otype}")
    if otype is None:
        otype = D.dtype if D is not None else A.dtype
    alpha = as_float(op, "alpha", alpha)
    if beta is None:
        beta = 1.0 if accumulate else 0.0
    beta = as_float(op, "beta", beta)
    if not accumulate and beta != 0:
        raise ValueError(f"tex.{op}: beta={beta!r} needs accumulate=True (D is overwritten otherwise)")
    if accumulate and D is None:
        raise ValueError(f"tex.{op}: accumulate=True needs an output tensor D")
    if bias is not None and not grad and bias.numel() != n_out:
        raise ValueError(f"tex.{op}: bias has {bias.numel()} elements, expected D's last dim {n_out}")
    if gelu and grad:
        if gelu_in is None:
            raise ValueError(f"tex.{op}: gelu=True, grad=True needs gelu_in (the saved pre-activation)")
        if gelu_in.numel() != math.prod(out_shape):
            raise ValueError(f"tex.{op}: gelu_in has shape {tuple(gelu_in.shape)}, expected {tuple(out_shape)}")
    elif gelu and gelu_in is not None and gelu_in.numel() != math.prod(out_shape):
        raise ValueError(f"tex.{op}: gelu_in has shape {tuple(gelu_in.shape)}, expected {tuple(out_shape)}")
    return call(op, (A, transA, B, transB, D, None, otype, bias, bias_type, gelu, gelu_in, grad, workspace,
                     workspace_size, accumulate, use_split_accumulator, None, comm_type, extra_output,
                     bool(bulk_overlap), alpha, beta))


def _compute_dtype(a, b, otype):
    """The dtype the matmul runs in: the inputs' own where BLAS is fast for it and the result is
    wanted in it; fp32 otherwise (CPU fp16 matmuls are slow; mixed inputs; a 16-bit GEMM whose
    output is fp32 must not round to 16 bits first). cuBLAS accumulates in fp32 either way, and so
    do oneDNN's bf16 kernels (8192x4096x1024 bf16: 0.56 s native vs 1.22 s upcast, 2 threads)."""
    dt = torch.promote_types(a.dtype, b.dtype)
    if a.dtype != b.dtype or (dt in (torch.float16, torch.bfloat16) and otype != dt):
        return torch.float32 if dt != torch.float64 else dt
    if a.device.type == "cpu" and dt == torch.float16:
        return torch.float32
    return dt


def _column_sums(b, otype):
    """cuBLASLt's BGRADB epilogue: B's column sums, accumulated in fp32, rounded once to otype.
    torch's CPU sum of a 16-bit tensor already accumulates in fp32 and rounds once (bit-identical to
    summing in fp32 and rounding), while ``sum(dtype=float32)`` first copies all of B to fp32: 8x the
    time at 4096x8192 bf16 (45 ms vs 5.5 ms, 2 threads). The fp32 copy is kept only where the result
    must stay fp32 (16-bit B, fp32 otype)."""
    if b.dtype == otype or b.dtype == torch.float32:
        return b.sum(0).to(otype)
    return b.sum(0, dtype=torch.float32).to(otype)


@reference("generic_gemm")
def ref_generic_gemm(*args):
    return gemm(*args)


def gemm(A, transA, B, transB, D, quantizer, otype, bias, bias_type, gelu, gelu_in, grad, workspace,
         workspace_size, accumulate, use_split_accumulator, comm_overlap, comm_type, extra_output, bulk_overlap,
         alpha, beta, *, empty=None, column_sums=_column_sums):
    """The GEMM with TE's epilogues, through torch's BLAS. ``empty(shape, dtype)`` allocates the
    results a fresh D needs (default.cpp passes its block cache: a fresh 4096x8192 fp32 result
    page-faults 128 MiB, ~30 ms of the ~430 ms fc1 GEMM, every call) and ``column_sums(x, otype)``
    computes the bias gradients (default.cpp: the native column sums), so both backends share
    this one definition of the op's semantics."""
    if empty is None:
        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=A.device)
    out_shape = gemm_out_shape(A, transA, B, transB)
    n_out = out_shape[-1]
    a2 = A.reshape(_dims(A))
    b2 = B.reshape(_dims(B))
    rows = b2.shape[1] if transB else b2.shape[0]
    ct = _compute_dtype(a2, b2, otype)
    opA = a2.to(ct).t() if transA else a2.to(ct)
    opB = b2.to(ct).t() if transB else b2.to(ct)
    plain = alpha == 1.0 and beta == 0.0 and not gelu and (bias is None or not grad)
    if plain:
        # bias folded into the GEMM (addmm, as torch.nn.Linear); written straight into D when it can
        direct = (D is not None and D.dtype == ct and D.is_contiguous()
                  and D.untyped_storage().data_ptr() not in (A.untyped_storage().data_ptr(),
                                                             B.untyped_storage().data_ptr()))
        out = D.view(rows, n_out) if direct else None
        if D is None and ct == otype:
            out, direct = empty((rows, n_out), ct), True
        if bias is not None:
            acc = torch.addmm(bias.reshape(-1).to(ct), opB, opA, out=out)
        else:
            acc = torch.mm(opB, opA, out=out)
        if direct:
            return [out.view(out_shape) if D is None else D, None, None, extra_output]
        if D is None:
            return [acc.to(otype).reshape(out_shape), None, None, extra_output]
        D.view(rows, n_out).copy_(acc)
        return [D, None, None, extra_output]
    acc = torch.mm(opB, opA, out=empty((rows, n_out), ct))
    if alpha != 1.0:
        acc = acc * alpha
    if beta != 0.0:
        acc = acc + beta * D.reshape(rows, n_out).to(acc.dtype)
    bias_grad = None
    pre_gelu_out = None
    if bias is not None and not grad:
        acc = acc + bias.reshape(-1).to(acc.dtype)
    if gelu and not grad:
        if gelu_in is not None:
            gelu_in.view(rows, n_out).copy_(acc)
            pre_gelu_out = gelu_in
        else:
            pre_gelu_out = acc.to(otype).reshape(out_shape)
        acc = _gelu_tanh(acc.float())
    elif gelu and grad:
        acc = acc.float() * _gelu_tanh_grad(gelu_in.reshape(rows, n_out).float())
        if bias is not None:  # cuBLASLt DGELU_BGRAD: bias grad of the dgelu output
            bias_grad = column_sums(acc, otype)
    if grad and bias is not None and bias_grad is None:  # BGRADB: column sums of B
        bias_grad = column_sums(b2, otype)
    if D is None:
        D = acc.to(otype).reshape(out_shape)
    else:
        D.view(rows, n_out).copy_(acc)
    return [D, bias_grad, pre_gelu_out, extra_output]
