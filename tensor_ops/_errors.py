"""Exception and warning types shared by every layer.

User errors are plain ``ValueError``/``TypeError`` raised by validation before dispatch;
everything in this module is about the *environment*, so the resolver can tell a backend
failure (fall back) from a user mistake (propagate).
"""
from __future__ import annotations


class BackendError(RuntimeError):
    """A backend failed to run an op (driver error, build error, OOM, missing symbol)."""


class BackendUnavailableError(RuntimeError):
    """A backend that was explicitly required (forced, strict) cannot be used here."""


class BackendUnsupportedError(NotImplementedError):
    """A forced backend cannot serve this call (an op or dtype it lacks) and no fallback was
    asked for: the error names the backend, the op, what the call needed and what it serves."""


class BackendFallbackWarning(RuntimeWarning):
    """Emitted once per (op, impl) when a failing impl is skipped for the next candidate."""


class ConfigError(ValueError):
    """backend.json or a TENSOR_OPS_* / TE_* variable holds an invalid value."""


def backend_failure(backend: str, msg: str, cause: BaseException | None = None) -> BackendError:
    """A BackendError prefixed with the backend's name, chained to the toolkit's exception."""
    err = BackendError(f"{backend}: {msg}")
    if cause is not None:
        err.__cause__ = cause
    return err
