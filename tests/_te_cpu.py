"""Test-only: run TransformerEngine's PyTorch modules on CPU tensors on top of tensor_ops.tex.

TE's Python layer asks for CUDA (``torch.cuda.is_available()``, the current device, its
properties) and allocates a few buffers with ``device="cuda"``. This fixture answers those
queries as a single GPU would and sends TE's own ``device="cuda"`` allocations to the CPU, for
the duration of a test; it lives in tests/ and never in the package (tex itself patches nothing
of TE's but ``load_framework_extension``, see ``tensor_ops/tex/_te.py``).
"""
from __future__ import annotations

import contextlib
import types
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

#: why the real-client tests skip when TE's Python layer cannot be imported here
PINNED_TE = "transformer-engine==2.20.2"
INSTALL = 'pip install -e ".[te]"'


def import_te():
    """``transformer_engine.pytorch`` imported on tex, or a skip with the reason."""
    import importlib.util
    if importlib.util.find_spec("transformer_engine") is None:   # importing it bare would need its native core
        pytest.skip(f"TE's Python layer is not installed ({INSTALL})")
    import os

    import tensor_ops.tex as tex
    # TE's jit_fuser would torch.compile its bias+GELU helpers; dynamo cannot trace through the
    # CUDA answers faked below, so they stay eager (read by TE once, at import).
    os.environ.setdefault("NVTE_TORCH_COMPILE", "0")
    try:
        return tex.import_transformer_engine()
    except ModuleNotFoundError as exc:   # one of the packages TE's import needs (README: the te extra)
        pytest.skip(f"transformer_engine.pytorch needs {exc.name!r} ({INSTALL}): {exc}")


_PROPS = types.SimpleNamespace(name="tensor_ops.tex CPU stand-in", major=9, minor=0, multi_processor_count=2,
                               total_memory=1 << 34, L2_cache_size=1 << 20, warp_size=32, uuid="cpu")


def _cpu(device):
    if device is None:
        return device
    if isinstance(device, int):            # a CUDA ordinal (torch.cuda.current_device())
        return torch.device("cpu")
    d = torch.device(device) if not isinstance(device, torch.device) else device
    return torch.device("cpu") if d.type == "cuda" else d


def _redirect(fn):
    def wrapped(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return fn(*args, **kwargs)
    wrapped.__wrapped__ = fn
    return wrapped


_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "rand", "randn", "empty_like", "zeros_like",
              "ones_like", "full_like", "as_tensor", "empty_strided")


@contextlib.contextmanager
def cuda_on_cpu():
    """TE's CUDA queries answered as one sm_90 device; its device="cuda" tensors made on the CPU."""
    patches = [
        mock.patch("torch.cuda.is_available", lambda: True),
        mock.patch("torch.cuda.device_count", lambda: 1),
        mock.patch("torch.cuda.current_device", lambda: 0),
        mock.patch("torch.cuda.get_device_capability", lambda *a, **k: (9, 0)),
        mock.patch("torch.cuda.get_device_properties", lambda *a, **k: _PROPS),
        mock.patch("torch.cuda.is_current_stream_capturing", lambda: False),
        mock.patch("torch.cuda.synchronize", lambda *a, **k: None),
        mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True),
    ]
    patches += [mock.patch(f"torch.{name}", _redirect(getattr(torch, name))) for name in _FACTORIES]
    # TE checks `inp.is_cuda` and moves buffers with `.cuda()`: CPU tensors pass as "the device"
    patches += [mock.patch.object(torch.Tensor, "is_cuda", property(lambda t: t.device.type in ("cuda", "cpu"))),
                mock.patch.object(torch.Tensor, "cuda", lambda t, *a, **k: t)]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield
