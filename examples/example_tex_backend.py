"""A complete small vendor backend for tensor_ops.tex ("acme"), built on tensor_ops' own kernels.

It implements rmsnorm_fwd, gelu, silu, swiglu and scaled_softmax_forward for CPU tensors by
handing zero-copy NumPy views to the tensor_ops facade (which runs the C++ SIMD backend when
it is built, NumPy otherwise); everything else, and any tensor it does not take (CUDA,
bfloat16 math is done in fp32 here), is left to the next candidate.

Run it:  python examples/example_tex_backend.py
"""
from __future__ import annotations

import numpy as np
import torch

import tensor_ops
import tensor_ops.tex as tex
from tensor_ops.tex import TEXBackendBase, register_backend


def _np(t: torch.Tensor) -> np.ndarray:
    """Zero-copy NumPy view of a CPU tensor (bf16 → an fp32 copy: NumPy has no bfloat16)."""
    if t.device.type != "cpu":
        raise NotImplementedError("acme handles CPU tensors only")
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().contiguous().numpy()


# TE_BACKEND names a *tex* backend ("acme"); the facade calls below state their own order so a
# tex-level selection never leaks into them.
_ORDER = "default,reference"


def _back(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(a).to(dtype)


class AcmeBackend(TEXBackendBase):
    NAME = "acme"
    VENDOR = "Acme Corp."
    PRIORITY = 90

    def is_available(self) -> bool:
        return True  # a real vendor probes its device / library here

    def rmsnorm_fwd(self, input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
        x = _np(input.reshape(-1, input.shape[-1]))
        w = _np(weight).astype(x.dtype) + (1 if zero_centered_gamma else 0)
        y = tensor_ops.rms_norm(x, w, eps, backend=_ORDER)
        x32 = x.astype(np.float32)
        rsigma = torch.from_numpy(1.0 / np.sqrt((x32 * x32).mean(-1) + np.float32(eps)))
        out = _back(y, otype).reshape(input.shape)
        if ln_out is not None:
            ln_out.copy_(out)
            out = ln_out
        return [out, None, rsigma.float()]

    def gelu(self, input, quantizer):
        return _back(tensor_ops.gelu(_np(input), approximate="tanh", backend=_ORDER), input.dtype)

    def silu(self, input, quantizer):
        return _back(tensor_ops.silu(_np(input), backend=_ORDER), input.dtype)

    def swiglu(self, input, quantizer):
        return _back(tensor_ops.swiglu(_np(input), backend=_ORDER), input.dtype)

    def scaled_softmax_forward(self, input, scale):
        return _back(tensor_ops.softmax(_np(input) * np.float32(scale), backend=_ORDER), input.dtype)


def register(registry) -> None:
    """Plugin entry point: TE_FL_PLUGIN_MODULES=example_tex_backend (with examples/ on sys.path)."""
    register_backend(AcmeBackend, registry=registry)


def main() -> int:
    register_backend(AcmeBackend)
    try:
        print("backends:", [(b["name"], b["available"]) for b in tex.list_backends()])
        x = torch.randn(4, 64)
        w = torch.rand(64) + 0.5
        with tex.use_backend("torch"):  # the pure-torch reference
            ref, _, ref_rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tex.DType.kFloat32, 0, False)
        tex.set_backend("acme")
        assert tex.get_backend().name == "acme"
        out, _, rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tex.DType.kFloat32, 0, False)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rs, ref_rs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(tex.swiglu(torch.ones(2, 8), None), torch.nn.functional.silu(torch.ones(2, 4)))
        # acme has no layernorm: served by the next candidate
        tex.layernorm_fwd(x, w, torch.zeros(64), 1e-5, None, None, tex.DType.kFloat32, 0, False)
        info = tensor_ops.get_manager().op_info()
        print("rmsnorm_fwd served by:", info["rmsnorm_fwd"]["calls"])
        print("layernorm_fwd order:", info["layernorm_fwd"]["order"])
        print("acme OK")
        return 0
    finally:
        tex.set_backend(None)
        tex.unregister_backend("acme")


if __name__ == "__main__":
    raise SystemExit(main())
