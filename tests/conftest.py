"""Shared fixtures: every test runs against a private backend.json (never the project's) and
with the runtime overrides cleared, so results do not depend on what a developer configured.

The suite can be run with one backend forced: ``TENSOR_OPS_BACKEND=cpp python -m pytest``;
that variable is left alone here.
"""
from __future__ import annotations

import os
import warnings

import pytest

import tensor_ops as to
from tensor_ops import _state
from tensor_ops._ops import BUILTIN_BACKENDS

#: the built-in facade backends, reference first (the name rule: each is also a pytest marker)
BACKENDS = ("numpy",) + tuple(b for b in BUILTIN_BACKENDS if b != "numpy")[::-1]


@pytest.fixture(autouse=True)
def isolated_config(tmp_path, monkeypatch):
    """A fresh, empty config file per test; runtime overrides and caches reset."""
    cfg = tmp_path / "backend.json"
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(cfg))
    _state.global_backend = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to.reload_config()
    yield cfg
    _state.global_backend = None
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            to.reload_config()
        except ValueError:
            pass


def forced_backend():
    """The backend forced for the whole run via TENSOR_OPS_BACKEND, if any."""
    return os.environ.get("TENSOR_OPS_BACKEND") or None


def backend_impl(op: str, backend: str):
    """The facade OpImpl of ``backend`` for ``op``, or pytest.skip with the reason."""
    reg = to.get_registry()
    impl_id = "reference.numpy" if backend == "numpy" else f"default.{backend}"
    try:
        impl = reg.get_impl(op, impl_id, "facade")
    except KeyError:
        mod = to._global.builtins().get(backend)
        why = mod if isinstance(mod, str) else f"{backend} does not implement {op}"
        pytest.skip(f"{backend}: {why}")
    ok, reason = to.get_manager().availability(impl)
    if not ok:
        pytest.skip(f"{backend} unavailable: {reason}")
    return impl


def pytest_configure(config):
    for b in BACKENDS:
        config.addinivalue_line("markers", f"{b}: tests of the {b} backend (every row that runs on it)")
    config.addinivalue_line("markers", "every_backend: a module meant to run once per forced backend "
                                       "(TENSOR_OPS_BACKEND=<name>); selected by every backend's marker")


def pytest_collection_modifyitems(config, items):
    """Mark every item with the backend(s) it exercises, so ``pytest -m cpp`` runs every cpp
    row of every suite (conformance, bad input, fuzz, ...), not just tests/test_cpp.py:

    - a ``backend`` parameter names it;
    - a module ``tests/test_<backend>.py`` is that backend's;
    - a module marked ``every_backend`` runs on whichever backend is forced, so it gets all.
    """
    for item in items:
        names = set()
        spec = getattr(item, "callspec", None)
        b = spec.params.get("backend") if spec is not None else None
        if isinstance(b, str) and b in BACKENDS:
            names.add(b)
        stem = item.path.stem if hasattr(item, "path") else ""
        if stem.startswith("test_") and stem[5:] in BACKENDS:
            names.add(stem[5:])
        if item.get_closest_marker("every_backend") is not None:
            names.update(BACKENDS)
        for n in sorted(names):
            item.add_marker(getattr(pytest.mark, n))


def pytest_addoption(parser):
    """``--fuzz-long``: tests/test_fuzz.py runs 25,000 fresh random examples instead of CI's
    2,000 derandomized ones."""
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="run the differential fuzzer long (25,000 random examples)")


@pytest.fixture
def unforced(monkeypatch):
    """For tests about the resolver's own ordering: drop a suite-wide TENSOR_OPS_BACKEND."""
    monkeypatch.delenv("TENSOR_OPS_BACKEND", raising=False)
    to.reload_config()
