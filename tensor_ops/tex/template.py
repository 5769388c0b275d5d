"""Template for a vendor tex backend: copy this file, rename the class and NAME, fill in kernels.

Register it with ``@register_backend`` (or ``register_backend(MyBackend)`` from a plugin's
``register(registry)``); every method you define becomes an OpImpl ``vendor.<name>`` of
kind VENDOR at ``PRIORITY``. Methods you leave out are served by the next candidate
(another backend, then ``reference.torch``). Select it with ``tex.set_backend("<name>")``,
``TE_BACKEND=<name>``, or ``TE_FL_PREFER=vendor``.

What a method receives: the tex function's arguments positionally, already validated
(shapes, devices, counts), with ``otype``/``output_dtype`` as a ``torch.dtype`` and
``quantizer`` None. Return exactly what TE returns (see shared/TEX_API.md). Raise
``NotImplementedError`` (or any non-ValueError/TypeError) for a case you do not handle: the
manager falls back to the next candidate with one warning. This template runs as-is on CPU
(it computes with plain torch) so the tests can exercise the wiring.
"""
from __future__ import annotations

import torch

from ._backends import TEXBackendBase


class TemplateBackend(TEXBackendBase):
    NAME = "template"          # what set_backend()/TE_BACKEND use (case-insensitive)
    VENDOR = "Template Inc."   # shown by list_backends()
    PRIORITY = 10              # higher runs first among vendor backends

    def is_available(self) -> bool:
        # Probe your device/library here (asked once per process); never raise.
        return True

    # -- normalization ------------------------------------------------------------------
    def rmsnorm_fwd(self, input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
        x = input.reshape(-1, input.shape[-1]).float()
        rsigma = torch.rsqrt(x.square().mean(-1) + eps)          # fp32 [N], as TE
        g = weight.float() + (1.0 if zero_centered_gamma else 0.0)
        y = (x * rsigma[:, None] * g).reshape(input.shape)
        if ln_out is not None:
            ln_out.copy_(y)
            return [ln_out, None, rsigma]
        return [y.to(otype), None, rsigma]

    # -- activations --------------------------------------------------------------------
    def gelu(self, input, quantizer):
        return torch.nn.functional.gelu(input.float(), approximate="tanh").to(input.dtype)

    # Add more: generic_gemm, layernorm_fwd/bwd, rmsnorm_bwd, swiglu, dswiglu, softmax, rope,
    # multi_tensor_adam, ... (the full list is tensor_ops._ops.TEX_OPS).
