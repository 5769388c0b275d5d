"""TE's own entry points onto tex, each in a fresh interpreter:

- ``NVTE_PLUGIN=tensor_ops.tex``: TE 2.20's real ``load_framework_extension("torch")`` (from the
  installed wheel) registers the native module as ``transformer_engine_torch_nv``, imports tex and
  calls ``tex.load_plugins()``; tex becomes ``transformer_engine_torch`` and ``vendor.nvidia``
  serves from the ``_nv`` module. No native library exists here, so TE's shared-object lookup is
  pointed at a stand-in Python file (the one thing the test fakes).
- ``tex.import_transformer_engine()`` on a machine without TE's native library.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.tex


def _need_te():
    if importlib.util.find_spec("transformer_engine") is None:
        pytest.skip('transformer_engine is not installed (pip install -e ".[te]")')


def _run(code, tmp_path, **env_extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               TENSOR_OPS_CONFIG=str(tmp_path / "backend.json"), NVTE_TORCH_COMPILE="0", **env_extra)
    for var in ("NVTE_PLUGIN", "NVTE_PROJECT_BUILDING", "TE_BACKEND", "TE_PLUGIN"):
        if var not in env_extra:
            env.pop(var, None)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_load_plugins_alone(tmp_path):
    """What TE's loader does, by hand: a real module at _nv, then load_plugins()."""
    out = _run("""
        import sys, types, torch
        nv = types.ModuleType("transformer_engine_torch_nv")
        nv.gelu = lambda x, q: "nvidia"
        sys.modules["transformer_engine_torch_nv"] = nv
        import tensor_ops.tex as tex
        assert tex.load_plugins() is tex
        assert sys.modules["transformer_engine_torch"] is tex
        from tensor_ops.tex import _nvidia
        assert _nvidia.module() is nv and _nvidia.availability() == (True, "")
        names = [b["name"] for b in tex.list_backends() if b["available"]]
        assert "nvidia" in names, names
        print("ok")
    """, tmp_path)
    assert out.strip() == "ok"


def test_nvte_plugin_through_te_loader(tmp_path):
    """TE's own load_framework_extension with NVTE_PLUGIN=tensor_ops.tex."""
    _need_te()
    fake = tmp_path / "fake_te_torch.py"
    fake.write_text("def get_cudnn_version():\n    return 91200\n\nKIND = 'the native stand-in'\n")
    out = _run(f"""
        import sys
        import tensor_ops.tex as tex
        # import transformer_engine.common without its native core and without importing its pytorch part
        import importlib.util, types
        spec = importlib.util.find_spec("transformer_engine")
        pkg = types.ModuleType("transformer_engine"); pkg.__path__ = spec.submodule_search_locations
        sys.modules["transformer_engine"] = pkg
        import os; os.environ["NVTE_PROJECT_BUILDING"] = "1"
        import transformer_engine.common as common
        common._get_shared_object_file = lambda library: {str(fake)!r}
        common.load_framework_extension.__wrapped__("torch")
        te_torch = sys.modules["transformer_engine_torch"]
        assert te_torch is tex, te_torch
        assert sys.modules["transformer_engine_torch_nv"].KIND == "the native stand-in"
        from tensor_ops.tex import _nvidia
        assert _nvidia.module().KIND == "the native stand-in"
        print("ok")
    """, tmp_path, NVTE_PLUGIN="tensor_ops.tex")
    assert out.strip().endswith("ok")


def test_import_transformer_engine_without_native_library(tmp_path):
    _need_te()
    out = _run("""
        import os, sys
        import tensor_ops.tex as tex
        try:
            te = tex.import_transformer_engine()
        except ModuleNotFoundError as exc:
            print("skip", exc.name); raise SystemExit(0)
        assert sys.modules["transformer_engine_torch"] is tex
        assert te.LayerNormMLP and te.RMSNorm
        assert tex.import_transformer_engine() is te          # idempotent
        assert "NVTE_PROJECT_BUILDING" not in os.environ      # restored after the import
        import transformer_engine.pytorch.cpp_extensions as ext
        assert ext.rmsnorm_fwd is tex.rmsnorm_fwd             # TE's `from transformer_engine_torch import *`
        print("ok")
    """, tmp_path)
    if out.startswith("skip"):
        pytest.skip(f"transformer_engine.pytorch needs {out.split()[1]!r} (pip install -e \".[te]\")")
    assert out.strip() == "ok"


def test_import_transformer_engine_refuses_a_foreign_te(tmp_path):
    """TE already imported on something else: a clear ImportError, not a half-working mix."""
    out = _run("""
        import sys, types
        sys.modules["transformer_engine.pytorch"] = types.ModuleType("transformer_engine.pytorch")
        sys.modules["transformer_engine_torch"] = types.ModuleType("transformer_engine_torch")
        import tensor_ops.tex as tex
        try:
            tex.import_transformer_engine()
        except ImportError as exc:
            assert "NVTE_PLUGIN=tensor_ops.tex" in str(exc), exc
            print("ok")
    """, tmp_path)
    assert out.strip() == "ok"
