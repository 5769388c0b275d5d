"""TransformerEngine's own entry points onto tex: ``NVTE_PLUGIN=tensor_ops.tex`` and
:func:`import_transformer_engine` for machines without TE's native library.

TE 2.20's ``transformer_engine.common.load_framework_extension("torch")`` loads the native
``transformer_engine_torch`` and then, when ``NVTE_PLUGIN=<module>`` is set, registers it as
``transformer_engine_torch_nv``, imports the plugin and calls its ``load_plugins()``;
:func:`load_plugins` is that hook. Without the native library (a CPU machine with
``pip install transformer-engine==2.20.2 --no-deps``) TE stops earlier, at finding the shared
object: :func:`import_transformer_engine` imports TE's Python layer with
``NVTE_PROJECT_BUILDING=1`` (TE's own switch that skips loading its native core) and gives
``load_framework_extension("torch")`` the plugin's outcome — tex as ``transformer_engine_torch``
— instead of the file search that would fail.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import os
import sys
import sysconfig
import threading
from pathlib import Path
from unittest import mock

MODULE = "transformer_engine_torch"
NV_MODULE = MODULE + "_nv"
_COMMON = "transformer_engine.common"
_lock = threading.RLock()


def _tex():
    return sys.modules[__package__]


def load_plugins():
    """TE's ``NVTE_PLUGIN`` hook: make ``transformer_engine_torch`` this module.

    TE has already registered its real extension (if any) as ``transformer_engine_torch_nv``;
    ``vendor.nvidia`` serves CUDA tensors from it from now on. Returns the tex module.
    """
    from . import _nvidia
    from ._register import manager
    tex = _tex()
    sys.modules[MODULE] = tex
    reg = manager().registry
    _nvidia.unregister(reg)   # new impl objects: availability is asked again, now with _nv present
    _nvidia.register(reg)
    return tex


def native_extension() -> Path | None:
    """The path of TE's native ``transformer_engine_torch`` shared object, or None.

    The same search as TE's ``_get_shared_object_file("torch")`` (next to the package, in it,
    in its ``wheel_lib``, then in site-packages), done without importing TE (which would try
    to load it)."""
    spec = importlib.util.find_spec("transformer_engine")
    roots = []
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent.parent)
    roots.append(Path(sysconfig.get_paths()["purelib"]))
    for root in roots:
        for d in (root, root / "transformer_engine", root / "transformer_engine" / "wheel_lib"):
            if d.is_dir():
                for f in d.iterdir():
                    if f.name.startswith(MODULE) and f.suffix == ".so" and not f.name.startswith(NV_MODULE):
                        return f
    return None


class _CommonHook(importlib.abc.MetaPathFinder):
    """Wraps ``transformer_engine.common``'s loader so that, right after the module runs, its
    ``load_framework_extension`` answers "torch" with tex (TE's Python layer imports it from
    there before anything else touches the extension)."""

    def find_spec(self, name, path=None, target=None):
        if name != _COMMON:
            return None
        from importlib.machinery import PathFinder
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch_common(module)
        spec.loader.exec_module = exec_and_patch
        return spec


def _patch_common(common) -> None:
    orig = common.load_framework_extension
    if getattr(orig, "_tensor_ops_tex", False):
        return

    @functools.lru_cache(maxsize=None)
    def load_framework_extension(framework: str) -> None:
        if framework == "torch":
            load_plugins()
            return None
        return orig(framework)

    setattr(load_framework_extension, "_tensor_ops_tex", True)  # noqa: B010 (lru_cache wrappers have no such field)
    load_framework_extension.__doc__ = (
        "tensor_ops.tex: TE's load_framework_extension with 'torch' served by tensor_ops.tex "
        "(no native transformer_engine_torch on this machine); other frameworks as before.")
    common.load_framework_extension = load_framework_extension


def import_transformer_engine():
    """Import ``transformer_engine.pytorch`` on top of tex and return it.

    - TE's native extension present: imports with ``NVTE_PLUGIN=tensor_ops.tex`` (TE's own
      plugin entry point; the real module becomes ``vendor.nvidia``).
    - Absent (``pip install transformer-engine==2.20.2 --no-deps`` on a CPU machine): imports
      TE's Python layer with ``NVTE_PROJECT_BUILDING=1`` (skips loading TE's native core) and
      serves ``load_framework_extension("torch")`` with tex.

    Idempotent; raises ImportError if TE is not installed, or was already imported on
    something other than tex.
    """
    with _lock:
        te = sys.modules.get("transformer_engine.pytorch")
        if te is not None:
            if sys.modules.get(MODULE) is not _tex():
                raise ImportError(
                    "transformer_engine.pytorch is already imported on another transformer_engine_torch "
                    f"({sys.modules.get(MODULE)!r}); call tensor_ops.tex.import_transformer_engine() "
                    "before anything imports transformer_engine, or set NVTE_PLUGIN=tensor_ops.tex")
            return te
        if importlib.util.find_spec("transformer_engine") is None:
            raise ImportError("transformer_engine is not installed: pip install transformer-engine==2.20.2 "
                              "--no-deps (the pure-Python wheel; tex stands in for its native extension)")
        # TE's own switches, read once by its import: set for it, restored after (patch.dict)
        native = native_extension() is not None
        if native:
            switches = {"NVTE_PLUGIN": __package__}
        else:
            switches = {} if "NVTE_PROJECT_BUILDING" in os.environ else {"NVTE_PROJECT_BUILDING": "1"}
        hook = None
        try:
            with mock.patch.dict(os.environ, switches):
                if not native:
                    common = sys.modules.get(_COMMON)
                    if common is not None:
                        _patch_common(common)
                    else:
                        hook = _CommonHook()
                        sys.meta_path.insert(0, hook)
                te = importlib.import_module("transformer_engine.pytorch")
        finally:
            if hook is not None:
                sys.meta_path.remove(hook)
        if sys.modules.get(MODULE) is not _tex():
            raise ImportError(f"transformer_engine.pytorch imported, but {MODULE} is "
                              f"{sys.modules.get(MODULE)!r}, not tensor_ops.tex (NVTE_PLUGIN loading failed?)")
        return te
