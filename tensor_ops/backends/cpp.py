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

from typing import Any

import numpy as np

from .._arrays import is_bf16
from .._ops import KERNEL_OPS
from ._contract import Backend, PlainEntry, Unavailable

_MOD: Any = None
_BUILD_HINT = "run `pip install -e .` or `python setup.py build_ext --inplace`"


def _error(msg: str) -> Exception:
    from tensor_ops._errors import BackendError
    return BackendError(f"cpp: {msg}")


def _recorded_build_failure() -> str:
    """The reason setup.py recorded in backend.json when it could not build the module."""
    from tensor_ops._build.jsonfile import recorded
    built = recorded("built", "cpp")
    if isinstance(built, dict) and built.get("ok") is False and built.get("reason"):
        return f"; the last build recorded: {built['reason']}"
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
        "softmax": (lambda e: e / e.sum(-1, keepdims=True))(np.exp(x64 - x64.max(-1, keepdims=True))),
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
    return BACKEND.availability()


def _bind_native() -> None:
    """Point every registered impl at the native function and offer the manager its
    plain-call entry (runs once, when the probe succeeded)."""
    for impl in BACKEND.impls:
        op = impl.op_name
        impl.fn = getattr(_MOD, op)
        entry = getattr(_MOD, "_fast_" + op, None)   # fast_entry.cpp's plain-call entry
        if entry is not None:
            impl.plain_entry = PlainEntry(impl.fn, entry, _served_counter(op), takes_out=True,
                                          stats=getattr(_MOD, f"_fast_{op}_stats", None))


def _served_counter(op: str):
    def calls() -> int:
        return int(_MOD._fast_calls().get(op, 0))
    return calls


def _probe_backend() -> str:
    try:
        mod = _load()
    except ImportError as exc:
        raise Unavailable(f"tensor_ops._cpp is not built: {_BUILD_HINT} "
                          f"(ImportError: {exc}){_recorded_build_failure()}") from None
    except Exception as exc:  # e.g. a bad TENSOR_OPS_MAX_ISA value raised at import
        raise Unavailable(f"tensor_ops._cpp failed to load: {type(exc).__name__}: {exc}") from None
    try:
        problem = _probe(mod)
    except Exception as exc:
        raise Unavailable(f"probe kernel raised {type(exc).__name__}: {exc}") from None
    if problem:
        raise Unavailable(problem)
    return f"isa={mod.ISA}, threads={mod.get_num_threads()}"


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
    # Host NumPy arrays of native float32/float16/bfloat16 only (float64 goes to the reference); the
    # facade already made them 2-D and C-contiguous. Identity first: the builtin dtype
    # singletons are what nearly every array carries, and `is` costs nothing.
    if type(x) is not _ndarray:
        return False
    d = x.dtype
    return d is _F32 or d is _F16 or d in _DTYPES or is_bf16(d)


_ndarray = np.ndarray
_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
_DTYPES = frozenset((_F32, _F16))


def info() -> dict:
    """What get_backend_info() shows for cpp."""
    return dict(_MOD.build_info())


BACKEND = Backend(name="cpp", ops={op: _stub(op) for op in KERNEL_OPS}, probe=_probe_backend,
                  array_kinds=("numpy", "torch-cpu"), dtypes=("float16", "bfloat16", "float32"), supports=_supports,
                  info=info)
BACKEND.availability.on_ok.append(_bind_native)


def get_cpp_info() -> dict:
    """Availability, array kinds, ops, compiled variants, selected ISA, CPU support, OpenMP
    threads, compiler and flags.

    Example:
        >>> from tensor_ops.backends import cpp
        >>> cpp.get_cpp_info()["available"] in (True, False)
        True
    """
    return BACKEND.describe()


get_optimization_info = get_cpp_info   # the name of the seed's guide, kept


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
    global _MOD
    BACKEND.availability.reset()
    _MOD = None
