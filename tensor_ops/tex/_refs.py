"""The pure-torch reference implementation of every tex op, by op name.

A leaf on purpose: each op family (``_norms``, ``_activations``, …) fills the table with
:func:`reference` when it is imported, and ``_register`` reads it to register
``reference.torch``. The table used to live in ``_dispatch``, which also needed ``_register``
to register on first use, so the two imported each other (resolved by function-level imports).
"""
from __future__ import annotations

from typing import Callable

#: op name → pure-torch reference implementation (registered as ``reference.torch``)
REFERENCE: dict[str, Callable] = {}


def reference(op: str):
    """Decorator: ``fn`` is the reference implementation of tex op ``op``."""
    def deco(fn):
        REFERENCE[op] = fn
        return fn
    return deco
