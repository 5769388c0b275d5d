"""tensor_ops: memory-bound tensor ops (rms_norm, layer_norm, the fused residual add + norm
add_rms_norm / add_layer_norm, softmax, silu, gelu, relu,
swiglu, geglu, rope, matmul) on the best backend of the machine — CUDA, OpenCL, C++ SIMD or
NumPy — chosen per op by a configurable resolver, and explained by ``get_backend_info()``.

``import tensor_ops`` never imports torch, cupy or pyopencl, and never fails because a
native piece is missing; backends are probed lazily, the first time an order reaches them.
"""
from __future__ import annotations

from ._errors import (BackendError, BackendFallbackWarning, BackendUnavailableError, BackendUnsupportedError,
                      ConfigError)
from ._facade import (add_layer_norm, add_rms_norm, gelu, geglu, layer_norm, matmul, relu, rms_norm, rope, silu,
                      softmax, swiglu)
from ._global import get_backend, get_manager, get_registry, reload_config, set_backend, use_backend
from ._info import (format_info, get_backend_info, get_cpp_info, get_cuda_info, get_cupy_info, get_numpy_info,
                    get_opencl_info)
from ._registry import BackendImplKind, OpImpl, OpRegistry
from ._manager import OpManager
from ._version import __version__

__all__ = [
    "rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm", "softmax", "silu", "gelu", "relu", "swiglu", "geglu",
    "rope", "matmul",
    "get_backend", "get_backend_info", "set_backend", "use_backend", "reload_config",
    "get_registry", "get_manager", "format_info",
    "get_numpy_info", "get_cpp_info", "get_opencl_info", "get_cuda_info", "get_cupy_info",
    "OpImpl", "OpRegistry", "OpManager", "BackendImplKind",
    "BackendError", "BackendUnavailableError", "BackendUnsupportedError", "BackendFallbackWarning", "ConfigError",
    "__version__",
]
