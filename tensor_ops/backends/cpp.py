"""C++ SIMD backend: ``tensor_ops._cpp`` (cpp_ext/), AVX2 / AVX-512 / portable + OpenMP.

The native module is loaded by :func:`availability` (never at import or by ``register``),
which also runs a probe kernel and checks its numbers. From then on every registered
``OpImpl.fn`` *is* the native function: the manager calls the pybind11 binding directly,
with no Python wrapper in between (a (1, 4096) rms_norm costs ~1 µs; a wrapper would add a
noticeable fraction of that). Before availability is decided, the registered ``fn`` is a
small stub that loads the module itself.

The native signatures match the facade contract (CONTRIBUTING.md) exactly; the extra
keyword-only arguments (stats outputs, bfloat16 views, backward and optimizer kernels) are
documented in ``tensor_ops/_cpp.pyi``.
"""
from __future__ import annotations

import threading
from typing import Any

NAME = "cpp"
OPS = ("rms_norm", "layer_norm", "softmax", "silu", "relu", "gelu", "swiglu", "geglu", "rope")

_LOCK = threading.Lock()
_AVAIL: tuple[bool, str] | None = None
_MOD: Any = None
_IMPLS: list = []  # every OpImpl we registered (for the switch to native fns)

_BUILD_HINT = "run `pip install -e .` or `python setup.py build_ext --inplace`"


def _error(msg: str) -> Exception:
    try:
        from tensor_ops._errors import BackendError
        return BackendError(f"cpp: {msg}")
    except Exception:  # pragma: no cover - core not importable
        return RuntimeError(f"cpp: {msg}")


def _recorded_build_failure() -> str:
    """The reason setup.py recorded in backend.json when it could not build the module."""
    try:
        from tensor_ops._build import record
        built = record.read_json(record.config_path()).get("built", {}).get("cpp", {})
        if isinstance(built, dict) and built.get("ok") is False and built.get("reason"):
            return f"; the last build recorded: {built['reason']}"
    except Exception:
        pass
    return ""


def _load():
    """Import the native module (raises ImportError/ValueError with the cause)."""
    global _MOD
    if _MOD is None:
        from tensor_ops import _cpp  # noqa: PLC0415 - native code loads here, on purpose
        _MOD = _cpp
    return _MOD


def _probe(mod) -> str:
    """Run a few kernels on known inputs; '' when the numbers are right, else the problem."""
    import numpy as np
    x = (np.arange(3 * 19, dtype=np.float32).reshape(3, 19) - 25.0) / 7.0  # 19: body + tail
    w = np.linspace(0.5, 1.5, 19, dtype=np.float32)
    x64 = x.astype(np.float64)
    want = {
        "rms_norm": x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w,
        "silu": x64 / (1.0 + np.exp(-x64)),
        "softmax": np.exp(x64 - x64.max(-1, keepdims=True)) / np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True),
    }
    got = {
        "rms_norm": mod.rms_norm(x, w, 1e-6, None),
        "silu": mod.silu(x, None),
        "softmax": mod.softmax(x, None),
    }
    for op, ref in want.items():
        err = float(np.abs(got[op] - ref).max() / max(1.0, float(np.abs(ref).max())))
        if not err < 1e-5:
            return f"probe kernel {op} (float32, isa {mod.ISA}) is off by {err:.3g}"
    h = mod.rms_norm(x.astype(np.float16), w.astype(np.float16), 1e-6, None)
    err = float(np.abs(h.astype(np.float64) - want["rms_norm"]).max())
    if not err < 1e-2:
        return f"probe kernel rms_norm (float16, isa {mod.ISA}) is off by {err:.3g}"
    return ""


def availability() -> tuple[bool, str]:
    """(True, summary) or (False, reason); decided once, never raises."""
    global _AVAIL
    if _AVAIL is not None:
        return _AVAIL
    with _LOCK:
        if _AVAIL is None:
            _AVAIL = _decide()
            if _AVAIL[0]:
                for impl in _IMPLS:
                    _bind_native(impl)
    return _AVAIL


def _bind_native(impl) -> None:
    """Point ``impl`` at the native function, and offer the manager the facade entry."""
    op = impl.op_name
    impl.fn = getattr(_MOD, op)
    entry = getattr(_MOD, "_fast_" + op, None)   # module.cpp's plain-call entry
    if entry is not None:
        impl._fast = (impl.fn, entry, lambda: _MOD._fast_calls().get(op, 0))


def _decide() -> tuple[bool, str]:
    try:
        mod = _load()
    except ImportError as exc:
        return False, (f"tensor_ops._cpp is not built: {_BUILD_HINT} "
                       f"(ImportError: {exc}){_recorded_build_failure()}")
    except Exception as exc:  # e.g. a bad TENSOR_OPS_MAX_ISA value raised at import
        return False, f"tensor_ops._cpp failed to load: {type(exc).__name__}: {exc}"
    try:
        problem = _probe(mod)
    except Exception as exc:
        return False, f"probe kernel raised {type(exc).__name__}: {exc}"
    if problem:
        return False, problem
    return True, f"isa={mod.ISA}, threads={mod.get_num_threads()}"


def _stub(op: str):
    """fn registered before availability is known: loads the module, then calls it."""
    def call(*args, **kwargs):
        ok, reason = availability()
        if not ok:
            raise _error(reason)
        return getattr(_MOD, op)(*args, **kwargs)
    call.__name__ = op
    call.__qualname__ = f"cpp.{op}"
    return call


def _supports(x, *rest) -> bool:
    # Host NumPy arrays of native float32/float16 only (float64 goes to the reference); the
    # facade already made them 2-D and C-contiguous. Identity first: the builtin dtype
    # singletons are what nearly every array carries, and `is` costs nothing.
    if type(x) is not _ndarray:
        return False
    d = x.dtype
    return d is _F32 or d is _F16 or d in _DTYPES


def register(registry) -> None:
    """Register one ``default.cpp`` OpImpl per facade op (loads no native code)."""
    global _ndarray, _DTYPES, _F32, _F16
    import numpy as np
    from tensor_ops._registry import BackendImplKind, OpImpl
    _ndarray = np.ndarray
    _F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
    _DTYPES = frozenset((_F32, _F16))
    for op in OPS:
        impl = OpImpl(op_name=op, impl_id=f"default.{NAME}", kind=BackendImplKind.DEFAULT, fn=_stub(op),
                      backend=NAME, supports=_supports, available=availability, api="facade")
        if _AVAIL is not None and _AVAIL[0]:
            _bind_native(impl)
        registry.register_impl(impl)
        _IMPLS.append(impl)


_ndarray: Any = None
_F32: Any = None
_F16: Any = None
_DTYPES: frozenset = frozenset()


def get_optimization_info() -> dict:
    """Compiled variants, selected ISA, CPU support, OpenMP threads, compiler and flags.

    Example:
        >>> from tensor_ops.backends import cpp
        >>> info = cpp.get_optimization_info()
        >>> info["available"] in (True, False)
        True
    """
    ok, reason = availability()
    if not ok:
        return {"available": False, "reason": reason}
    return {"available": True, "reason": None, **_MOD.build_info()}


def info() -> dict:
    """What get_backend_info() shows for cpp."""
    return get_optimization_info()


def set_num_threads(n: int) -> None:
    """Threads the kernels use (default: OpenMP's, i.e. OMP_NUM_THREADS or the core count).

    In a process forked after its parent ran multi-threaded kernels this stays 1, with a
    RuntimeWarning: libgomp cannot run parallel regions there (it would hang).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_num_threads expects an int >= 1, got {n!r}")
    ok, reason = availability()
    if not ok:
        raise _error(reason)
    got = _MOD.set_num_threads(n)
    if got != n:
        import warnings
        warnings.warn(f"tensor_ops cpp: set_num_threads({n}) kept {got}: "
                      f"{_MOD.build_info()['threads_note']}", RuntimeWarning, stacklevel=2)


def get_num_threads() -> int:
    ok, reason = availability()
    if not ok:
        raise _error(reason)
    return _MOD.get_num_threads()


def native():
    """The ``tensor_ops._cpp`` module (for tensor_ops.tex adapters); BackendError if unavailable."""
    ok, reason = availability()
    if not ok:
        raise _error(reason)
    return _MOD


def _reset_for_tests() -> None:
    global _AVAIL, _MOD
    with _LOCK:
        _AVAIL = None
        _MOD = None
