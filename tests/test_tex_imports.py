"""tensor_ops.tex's import structure: every module imports alone in a fresh interpreter, the
package has no import cycle (module-level, nor through function-level imports), and a plugin
that imports tex while the global registry is being built is told so by a public flag
(``_global.building()``), not by a lock's private state."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="tensor_ops.tex needs torch")

ROOT = Path(__file__).resolve().parent.parent
TEX = ROOT / "tensor_ops" / "tex"
PKG = "tensor_ops.tex"
MODULES = sorted(p.stem for p in TEX.glob("*.py") if p.stem != "__init__")


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for var in ("TE_BACKEND", "TE_PLUGIN", "TE_FL_PLUGIN_MODULES", "TENSOR_OPS_PLUGINS"):
        env.pop(var, None)
    return env


# Each module imported alone, one forked child each: a fresh interpreter per module spent ~4 s
# of its ~4.2 importing torch (27 modules: 113 s of the suite on a 2-core VM, now ~23 s). The
# children fork from one fresh interpreter that has imported only NumPy and torch, no
# tensor_ops module: what a module fails to import itself still fails (its names are its own).
_FORKED = r"""
import importlib, json, os, sys, traceback
import numpy, torch  # noqa: F401
assert not [m for m in sys.modules if m.split(".")[0] == "tensor_ops"]
out = {}
for mod in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            name = importlib.import_module("tensor_ops.tex." + mod).__name__
            msg = "ok" if name == "tensor_ops.tex." + mod else "imported as " + name
        except BaseException:
            msg = traceback.format_exc()
        with os.fdopen(w, "w") as f:
            f.write(msg)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    _, status = os.waitpid(pid, 0)
    out[mod] = msg if status == 0 else f"child exited with status {status}: {msg}"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def imported_alone(tmp_path_factory):
    """{module: "ok" or the child's traceback}, every tex module imported in its own child."""
    env = _env()
    env["TENSOR_OPS_CONFIG"] = str(tmp_path_factory.mktemp("imports") / "backend.json")
    if not hasattr(os, "fork"):   # one fresh interpreter per module where there is no fork
        out = {}
        for mod in MODULES:
            c = subprocess.run([sys.executable, "-c", f"import {PKG}.{mod} as m; assert m.__name__ == '{PKG}.{mod}'"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
            out[mod] = "ok" if c.returncode == 0 else c.stderr or f"exited with status {c.returncode}"
        return out
    p = subprocess.run([sys.executable, "-c", _FORKED, *MODULES], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mod", MODULES)
def test_each_module_imports_alone(mod, imported_alone):
    assert imported_alone[mod] == "ok", imported_alone[mod]


def _targets(node: ast.AST, here: str) -> set:
    """The tex modules an import statement names ('__init__' for the package itself)."""
    out: set = set()
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = PKG if node.level == 1 else None   # `..` leaves the package
            if base is None:
                return out
            full = f"{base}.{node.module}" if node.module else base
        else:
            full = node.module or ""
        if full == PKG:   # `from . import x, y` / `from tensor_ops.tex import x`: submodules or names
            for a in node.names:
                out.add(a.name if a.name in MODULES else "__init__")
        elif full.startswith(PKG + "."):
            out.add(full[len(PKG) + 1:].split(".")[0])
    elif isinstance(node, ast.Import):
        for a in node.names:
            if a.name == PKG:
                out.add("__init__")
            elif a.name.startswith(PKG + "."):
                out.add(a.name[len(PKG) + 1:].split(".")[0])
    out.discard(here)
    return out


def _graph(module_level_only: bool) -> dict:
    graph: dict = {}
    for mod in MODULES + ["__init__"]:
        tree = ast.parse((TEX / f"{mod}.py").read_text(encoding="utf-8"))
        edges: set = set()
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)

        def visit(node, in_function, funcs=funcs, edges=edges, mod=mod):
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, funcs)
                if isinstance(child, (ast.Import, ast.ImportFrom)) and not (module_level_only and inner):
                    edges.update(_targets(child, mod))
                visit(child, inner)
        visit(tree, False)
        graph[mod] = edges
    return graph


def _cycle(graph: dict):
    state: dict = {}
    stack: list = []

    def dfs(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = dfs(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = dfs(n)
            if found:
                return found
    return None


def test_graph_parser_sees_the_imports():
    g = _graph(module_level_only=True)
    assert {"_dispatch", "_refs", "_common"} <= g["_norms"]
    assert {"_backends", "_register"} <= g["_dispatch"] and "_register" in g["_backends"]
    assert "_activations" in g["__init__"] and "__init__" in _graph(False)["_testing"]
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


@pytest.mark.parametrize("module_level_only", [True, False], ids=["module-level", "all-levels"])
def test_no_import_cycles(module_level_only):
    cycle = _cycle(_graph(module_level_only))
    assert cycle is None, f"import cycle in tensor_ops.tex: {' -> '.join(cycle)}"


def test_no_private_lock_state_read():
    for p in TEX.glob("*.py"):
        assert "_is_owned" not in p.read_text(encoding="utf-8"), p


def test_plugin_importing_tex_during_the_build(tmp_path):
    """A plugin that imports tex while the global registry is built sees building() True on
    that thread; tex registers on its first call and works; afterwards building() is False."""
    (tmp_path / "tex_probe_plugin.py").write_text(textwrap.dedent("""
        from tensor_ops import _global
        BUILDING_AT_IMPORT = _global.building()
        import tensor_ops.tex  # noqa: F401  (must not re-enter the build)
        def register(registry):
            pass
    """))
    code = textwrap.dedent("""
        import threading, torch, tensor_ops
        from tensor_ops import _global
        assert not _global.building()
        tensor_ops.get_registry()
        import tex_probe_plugin, tensor_ops.tex as tex
        assert tex_probe_plugin.BUILDING_AT_IMPORT is True
        assert not _global.building()
        seen = []
        t = threading.Thread(target=lambda: seen.append(_global.building())); t.start(); t.join()
        assert seen == [False]
        out, _, rs = tex.rmsnorm_fwd(torch.ones(2, 4), torch.ones(4), 1e-5, None, None,
                                     tex.DType.kFloat32, 0, False)
        assert torch.allclose(out, torch.ones(2, 4), atol=1e-4)
        ids = [i.impl_id for i in tensor_ops.get_registry().get_impls("rmsnorm_fwd", "tex")]
        assert "reference.torch" in ids, ids
        print("ok")
    """)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    env["TENSOR_OPS_PLUGINS"] = "tex_probe_plugin"
    env["TENSOR_OPS_CONFIG"] = str(tmp_path / "backend.json")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr
