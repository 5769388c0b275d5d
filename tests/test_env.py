"""The environment-variable registry (tensor_ops/_env.py) and the backend.json file module
(tensor_ops/_build/jsonfile.py): every variable the source mentions is declared, the table
in BACKEND_CONFIG.md is the registry's, readers go through it, errors follow the formula,
and the build helpers still load by path without the package."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tensor_ops import ConfigError, _env, _policy
from tensor_ops._build import jsonfile

ROOT = Path(__file__).resolve().parent.parent

SOURCE_SUFFIXES = {".py", ".pyi", ".cpp", ".h", ".cl", ".cu", ".cuh", ".sh"}
SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".hypothesis", ".pytest_cache", "node_modules"}
NAME = re.compile(r"\b(?:TENSOR_OPS|TE|TEFL)_[A-Z0-9_]*[A-Z0-9]\b")
# Names of the project's shape that are not environment variables.
NOT_VARIABLES = {"TENSOR_OPS_COMMON_CUH": "include guard of cuda_ext/common.cuh"}
# Files allowed to touch os.environ directly (path prefixes, so that a module split into a
# package stays covered). The opencl and cuda packages read through _env in their settings.py.
PENDING_READERS = {
    "tensor_ops/_bench": "saves, sets and restores TENSOR_OPS_STRICT around a run (a write)",
}
DIRECT_READ = re.compile(r"\b(?:environ\.get|getenv)\(|\benviron\[")


def _source_files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
                       and not d.startswith("bench_results")
                       and not (Path(dirpath) / d / "pyvenv.cfg").exists()]
        for f in filenames:
            p = Path(dirpath) / f
            if p.suffix in SOURCE_SUFFIXES or p.relative_to(ROOT).as_posix() == ".ci/run":
                yield p


def _mentions() -> dict:
    """{name: [files]} of every project-shaped name in the source tree but _env.py itself."""
    found: dict = {}
    for p in _source_files():
        if p == ROOT / "tensor_ops" / "_env.py":
            continue
        for name in set(NAME.findall(p.read_text(encoding="utf-8", errors="replace"))):
            found.setdefault(name, []).append(p.relative_to(ROOT).as_posix())
    return found


def test_every_variable_in_the_source_is_declared():
    undeclared = {n: files for n, files in _mentions().items()
                  if n not in _env._BY_NAME and n not in NOT_VARIABLES}
    assert not undeclared, (f"declare these in tensor_ops/_env.py VARS (or, if not a variable, in "
                            f"NOT_VARIABLES here): {undeclared}")


def test_every_declared_variable_is_used_somewhere():
    mentioned = set(_mentions())
    for p in _source_files():   # the standard variables (CXX, …) are not project-shaped names
        text = p.read_text(encoding="utf-8", errors="replace")
        mentioned |= {v for v in _env.names(external=True) if v in text and p.name != "_env.py"}
    unused = sorted(set(_env.names(external=True)) - mentioned)
    assert not unused, f"declared in tensor_ops/_env.py but read nowhere: {unused}"


def test_docs_table_is_generated_from_the_registry():
    doc = (ROOT / "BACKEND_CONFIG.md").read_text(encoding="utf-8")
    assert _env.docs_region(doc) == _env.render_table(), \
        "BACKEND_CONFIG.md's environment table is stale: run `python tensor_ops/_env.py --write-docs`"
    for v in _env.VARS:   # the build switches used to be missing from it
        assert f"`{v.name}`" in _env.docs_region(doc)


def test_write_docs_replaces_only_the_marked_region(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# head\n{_env.START}\nold\n{_env.END}\ntail\n")
    assert _env.write_docs(doc) is True
    text = doc.read_text()
    assert text.startswith("# head\n") and text.endswith(f"{_env.END}\ntail\n")
    assert _env.docs_region(text) == _env.render_table()
    assert _env.write_docs(doc) is False
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="restore the markers"):
        _env.write_docs(doc)


def test_readers_go_through_the_registry():
    direct = []
    for p in _source_files():
        rel = p.relative_to(ROOT).as_posix()
        if p.suffix != ".py" or not (rel.startswith("tensor_ops/") or rel == "setup.py"):
            continue
        if rel == "tensor_ops/_env.py" or any(rel.startswith(k) for k in PENDING_READERS):
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if DIRECT_READ.search(line):
                direct.append(f"{rel}:{i}: {line.strip()}")
    assert not direct, "read environment variables through tensor_ops._env (get/lookup/raw/enabled):\n" \
        + "\n".join(direct)


def test_resolver_variables_are_the_documented_set():
    """_policy.ALL_ENV (what get_backend_info() used to list, what tests clear) is unchanged."""
    assert set(_policy.ALL_ENV) == {
        "TENSOR_OPS_BACKEND", "TENSOR_OPS_PRIORITY", "TENSOR_OPS_PER_OP", "TE_FL_PER_OP", "TENSOR_OPS_STRICT",
        "TE_FL_STRICT", "TENSOR_OPS_DISABLE", "TENSOR_OPS_PLUGINS", "TE_FL_PLUGIN_MODULES",
        "TENSOR_OPS_LOG_LEVEL", "TEFL_LOG_LEVEL", "TENSOR_OPS_ALLOW_VENDORS", "TE_FL_ALLOW_VENDORS",
        "TENSOR_OPS_DENY_VENDORS", "TE_FL_DENY_VENDORS", "TENSOR_OPS_FALLBACK_BACKEND", "TE_FALLBACK_BACKEND",
        "TENSOR_OPS_CONFIG", "TE_BACKEND", "TE_PLUGIN", "TE_FL_PREFER", "TE_FL_PREFER_VENDOR", "TE_FL_DEBUG",
        "TE_FL_SKIP_CUDA"}


# ---------------------------------------------------------------------------- accessors
def test_aliases_canonical_first_and_blank_is_unset():
    env = {"TENSOR_OPS_STRICT": " ", "TE_FL_STRICT": "on"}
    assert _env.lookup("TENSOR_OPS_STRICT", env) == (True, "TE_FL_STRICT")
    assert _env.lookup("TE_FL_STRICT", {"TENSOR_OPS_STRICT": "0", "TE_FL_STRICT": "1"}) == (False, "TENSOR_OPS_STRICT")
    assert _env.raw("TE_BACKEND", {"TE_PLUGIN": " cpp "}) == ("cpp", "TE_PLUGIN")
    assert _env.lookup("TENSOR_OPS_LOG_LEVEL", {}) == ("WARNING", None)


def test_raw_reads_os_environ_as_it_is_now(monkeypatch):
    """raw() skips names absent from os.environ's key dict (a fast miss); a name set, changed or
    deleted after import is seen at the next read, blank still means unset."""
    monkeypatch.delenv("TE_BACKEND", raising=False)
    monkeypatch.delenv("TE_PLUGIN", raising=False)
    assert _env.raw("TE_BACKEND") == (None, None)
    monkeypatch.setenv("TE_PLUGIN", " cpp ")
    assert _env.raw("TE_BACKEND") == ("cpp", "TE_PLUGIN")
    monkeypatch.setenv("TE_BACKEND", "torch")
    assert _env.raw("TE_BACKEND") == ("torch", "TE_BACKEND")
    monkeypatch.setenv("TE_BACKEND", "  ")
    assert _env.raw("TE_BACKEND") == ("cpp", "TE_PLUGIN")
    monkeypatch.delenv("TE_PLUGIN")
    assert _env.raw("TE_BACKEND") == (None, None)


@pytest.mark.parametrize("name,value,want", [
    ("TENSOR_OPS_STRICT", "YES", True), ("TENSOR_OPS_STRICT", "off", False),
    ("TENSOR_OPS_LOG_LEVEL", "info", "INFO"), ("TE_FL_PREFER", "Default", "flagos"),
    ("TENSOR_OPS_ALLOW_VENDORS", "Acme, ,NVIDIA", ["acme", "nvidia"]),
    ("TENSOR_OPS_PLUGINS", "a.b, MyPlugin", ["a.b", "MyPlugin"]),
    ("TENSOR_OPS_CPP_CACHE_MB", "256", 256), ("TENSOR_OPS_MAX_ISA", "AVX2", "avx2"),
    ("TENSOR_OPS_SKIP_CPP", "1", True), ("TENSOR_OPS_SKIP_CPP", "true", False),
    ("TENSOR_OPS_OPENCL_LWS", "64", 64), ("TENSOR_OPS_OPENCL_LWS", "lots", None),
    ("TENSOR_OPS_OPENCL_LAYOUT", "GPU", "gpu"), ("TENSOR_OPS_OPENCL_LAYOUT", "tpu", None),
    ("TENSOR_OPS_CONFIG", "/x/b.json", Path("/x/b.json")),
    ("TENSOR_OPS_OPENCL_CACHE", "/x/cl", Path("/x/cl")), ("TENSOR_OPS_OPENCL_CACHE", "Off", False),
], ids=lambda v: str(v))
def test_parsers(name, value, want):
    assert _env.get(name, {name: value}) == want


@pytest.mark.parametrize("name,value,frags", [
    ("TENSOR_OPS_STRICT", "maybe",
     ["TENSOR_OPS_STRICT='maybe'", "['0', '1', 'false', 'no', 'off', 'on', 'true', 'yes']"]),
    ("TEFL_LOG_LEVEL", "loud", ["TEFL_LOG_LEVEL='loud'", "['CRITICAL', 'DEBUG', 'ERROR', 'INFO', 'WARNING']"]),
    ("TE_FL_PREFER", "cpp", ["TE_FL_PREFER='cpp'", "['flagos', 'reference', 'vendor']"]),
    ("TENSOR_OPS_CPP_CACHE_MB", "-1", ["TENSOR_OPS_CPP_CACHE_MB='-1'", "whole number"]),
], ids=lambda v: str(v))
def test_invalid_values_follow_the_error_formula(name, value, frags):
    with pytest.raises(ConfigError) as err:
        _env.get(name, {name: value}, error=ConfigError)
    msg = str(err.value)
    for frag in frags + ["unset it or set an accepted value"]:
        assert frag in msg, (frag, msg)


def test_enabled_never_raises_and_unknown_names_are_refused():
    assert _env.enabled("TE_FL_SKIP_CUDA", {"TE_FL_SKIP_CUDA": "Yes"})
    assert not _env.enabled("TE_FL_SKIP_CUDA", {"TE_FL_SKIP_CUDA": "maybe"})
    nope = "TENSOR_OPS_" + "NOPE"      # spelled apart: the source scan above would flag it
    with pytest.raises(KeyError, match=f"{nope}.*add it to VARS"):
        _env.get(nope)


def test_info_lists_every_project_variable_set(monkeypatch):
    import tensor_ops as to
    monkeypatch.setenv("TENSOR_OPS_OPENCL_LWS", "64")
    monkeypatch.setenv("CXX", "clang++")       # a standard variable: not ours to list
    env = to.get_backend_info()["env"]
    assert env["TENSOR_OPS_OPENCL_LWS"] == "64" and "CXX" not in env
    assert "TENSOR_OPS_CONFIG" in env


# ---------------------------------------------------------------------------- by path
def test_build_helpers_load_by_path_without_the_package(tmp_path):
    """setup.py's view: tensor_ops and NumPy unimportable, each helper loaded by file path; they
    share the runtime's location rule and read variables through the registry."""
    code = textwrap.dedent("""
        import importlib.util, sys
        sys.modules["tensor_ops"] = sys.modules["numpy"] = None      # any import of them fails
        mods = {}
        for name in ("jsonfile", "capabilities", "cpp_build", "cuda_build", "opencl_build"):
            spec = importlib.util.spec_from_file_location("_t_" + name, "tensor_ops/_build/" + name + ".py")
            mods[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mods[name])
        jf = mods["jsonfile"]
        assert jf.write_target() == jf.locate()[0], jf.locate()
        assert jf.env.get("TENSOR_OPS_SKIP_CPP") is True
        assert mods["cpp_build"].extensions() == []
        path = jf.update_section("built", "cpp", {"ok": False, "reason": "test"})
        assert jf.recorded("built", "cpp") == {"ok": False, "reason": "test"}, path
        print(path)
    """)
    cfg = tmp_path / "b.json"
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(cfg), TENSOR_OPS_SKIP_CPP="1")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith(str(cfg))


def test_one_reader_one_error_formula(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text('{"priority": [')
    with pytest.raises(ValueError, match=r"not valid JSON \(.*line 1 column .*\); fix it or run"):
        jsonfile.read(bad)
    bad.write_text("[1]")
    with pytest.raises(ConfigError, match="top level must be a JSON object, got list"):
        jsonfile.read(bad, error=ConfigError)
    assert jsonfile.read(tmp_path / "none.json") is None
    assert jsonfile.read_document(tmp_path / "none.json") == {"schema_version": jsonfile.SCHEMA_VERSION}
    with pytest.raises(ValueError, match="disappeared while loading; run again"):
        jsonfile.read(tmp_path / "none.json", missing_ok=False)
    with pytest.raises(ValueError, match=r"section must be one of \['built', 'detected'\], got 'user'"):
        jsonfile.update_section("user", "x", 1, tmp_path / "c.json")


def test_no_second_version_or_schema_source():
    """One version (tensor_ops/_version.py) and one schema version (jsonfile)."""
    from tensor_ops import _config
    from tensor_ops._version import __version__
    assert _config.SCHEMA_VERSION is jsonfile.SCHEMA_VERSION
    pattern = re.compile(r"""(?:__version__|SCHEMA_VERSION)\s*=|version\s*=\s*["']\d""")
    owners = {"tensor_ops/_version.py", "tensor_ops/_build/jsonfile.py"}
    stray = [f"{p.relative_to(ROOT)}:{i}" for p in _source_files() if p.suffix == ".py"
             and p.relative_to(ROOT).as_posix() not in owners
             and not p.relative_to(ROOT).as_posix().startswith("tests/")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not stray, stray
    assert __version__ not in (ROOT / "setup.py").read_text()
