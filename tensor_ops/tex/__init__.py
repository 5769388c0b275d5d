"""``tensor_ops.tex``: a drop-in for TransformerEngine's ``transformer_engine_torch`` module.

Same function names, argument order and return conventions as upstream TE (see
shared/TEX_API.md), on torch tensors, dispatched per op through tensor_ops' resolver:
``reference.torch`` (pure PyTorch, any device) for every op, ``default.cpp`` adapters on CPU
tensors for the hot ops, ``vendor.nvidia`` passing through to a real TE when importable, and
vendor backends registered with :func:`register_backend`.

Example:
    >>> import torch, tensor_ops.tex as tex
    >>> x, w = torch.ones(2, 4), torch.ones(4)
    >>> out, _, rsigma = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tex.DType.kFloat32, 0, False)
    >>> rsigma.dtype, tuple(rsigma.shape)
    (torch.float32, (2,))
"""
from __future__ import annotations

import sys as _sys

try:
    import torch as _torch  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "tensor_ops.tex needs PyTorch, which is not installed: pip install torch==2.13.0 "
        "(the CPU wheel is enough); `import tensor_ops` itself works without it") from _exc

from tensor_ops import _global

from . import (_activations, _dropout, _gemm, _grouped_gemm, _misc, _moe, _multi_tensor, _norms, _rope, _softmax,
               _thd, _unsupported)
from ._activations import *  # noqa: F401,F403
from ._backends import (TEXBackendBase, get_backend, list_backends, register_backend, set_backend,  # noqa: F401
                        unregister_backend, use_backend)
from ._dropout import *  # noqa: F401,F403
from ._enums import *  # noqa: F401,F403
from ._enums import __all__ as _enum_names
from ._gemm import *  # noqa: F401,F403
from ._grouped_gemm import *  # noqa: F401,F403
from ._moe import *  # noqa: F401,F403
from ._thd import *  # noqa: F401,F403
from ._unsupported import *  # noqa: F401,F403
from ._misc import *  # noqa: F401,F403
from ._multi_tensor import *  # noqa: F401,F403
from ._norms import *  # noqa: F401,F403
from ._register import manager as _manager
from ._rope import *  # noqa: F401,F403
from ._softmax import *  # noqa: F401,F403
from ._te import import_transformer_engine, load_plugins  # noqa: F401

_TENSOR_OPS_TEX = True
_MODULE_NAME = "transformer_engine_torch"


def install() -> str:
    """Make ``import transformer_engine_torch`` give this module, if that name is free.

    Returns ``"installed"``, ``"already installed"``, or ``"kept existing <module>"`` when a
    real (or other) transformer_engine_torch is already imported. A real TE is preferred:
    this never replaces one.
    """
    me = _sys.modules[__name__]
    cur = _sys.modules.get(_MODULE_NAME)
    if cur is me:
        return "already installed"
    if cur is not None:
        return f"kept existing {getattr(cur, '__file__', None) or cur!r}"
    import importlib.util
    try:
        real = importlib.util.find_spec(_MODULE_NAME)
    except (ImportError, ValueError):
        real = None
    if real is not None:
        return f"kept existing {real.origin}"
    _sys.modules[_MODULE_NAME] = me
    return "installed"


def uninstall() -> bool:
    """Undo :func:`install` (True if this module was removed from ``sys.modules``)."""
    if _sys.modules.get(_MODULE_NAME) is _sys.modules[__name__]:
        del _sys.modules[_MODULE_NAME]
        return True
    return False


__all__ = sorted(
    list(_enum_names) + _activations.__all__ + _dropout.__all__ + _gemm.__all__ + _misc.__all__
    + _multi_tensor.__all__ + _norms.__all__ + _rope.__all__ + _softmax.__all__ + _grouped_gemm.__all__
    + _moe.__all__ + _thd.__all__ + _unsupported.__all__
    + ["TEXBackendBase", "register_backend", "unregister_backend", "list_backends", "set_backend",
       "get_backend", "use_backend", "install", "uninstall", "load_plugins", "import_transformer_engine"])


# Register tex's impls now, unless the global manager is being built on this thread (a plugin
# importing tex during plugin discovery would re-enter that build); then the first tex call
# registers them.
if not _global.building():
    _manager()
