"""What a new user meets on a fresh machine: setup.py commands in a venv where pybind11 lived
only in pip's isolated build environment, no tracked file touched by builds, no setuptools
warnings, the example configuration valid, and the README's quick start as CI runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensor_ops import _config
from tensor_ops._build import cpp_build, jsonfile

ROOT = Path(__file__).resolve().parent.parent

# A directory put first on PYTHONPATH whose pybind11 package fails to import: what a venv made
# by `pip install -e .` looks like at run time (pybind11 was only in the build environment).
_BLOCK = "raise ImportError('pybind11 blocked by the test: a fresh venv has none')\n"


def _no_pybind11(tmp_path: Path) -> dict:
    block = tmp_path / "block"
    (block / "pybind11").mkdir(parents=True)
    (block / "pybind11" / "__init__.py").write_text(_BLOCK)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(block), str(ROOT)]),
               TENSOR_OPS_CONFIG=str(tmp_path / "backend.json"))
    env.pop("TENSOR_OPS_BACKEND", None)
    return env


def _setup(args, env):
    return subprocess.run([sys.executable, "setup.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_blocker_really_hides_pybind11(tmp_path):
    p = subprocess.run([sys.executable, "-c", "import pybind11"], env=_no_pybind11(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "blocked by the test" in p.stderr


@pytest.mark.parametrize("args", [
    ["configure_backend", "--priority=numpy"],
    ["configure_backend", "--show"],
    ["test_capabilities"],
])
def test_commands_that_do_not_build_record_no_cpp_build(tmp_path, args):
    env = _no_pybind11(tmp_path)
    p = _setup(args, env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pybind11" not in p.stdout + p.stderr
    cfg = tmp_path / "backend.json"
    data = json.loads(cfg.read_text()) if cfg.exists() else {}
    assert "cpp" not in data.get("built", {}), data


def test_configure_backend_round_trip_in_a_fresh_venv(tmp_path):
    """The round trip that failed for a new user: the file holds what was asked, nothing else."""
    env = _no_pybind11(tmp_path)
    p = _setup(["-q", "configure_backend", "--priority=numpy", "--show"], env)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "backend.json").read_text()) == {"schema_version": 1, "priority": ["numpy"]}
    assert "rms_norm       -> numpy" in p.stdout


def test_extensions_imports_and_records_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(tmp_path / "backend.json"))
    monkeypatch.setitem(sys.modules, "pybind11", None)        # import pybind11 -> ImportError
    monkeypatch.delenv("TENSOR_OPS_SKIP_CPP", raising=False)
    exts = cpp_build.extensions()
    assert [e.name for e in exts] == ["tensor_ops._cpp"]
    assert not (tmp_path / "backend.json").exists()
    with pytest.raises(RuntimeError, match="pybind11 is not importable"):
        cpp_build._pybind11_include()


def test_failed_rebuild_keeps_the_record_of_a_working_build(monkeypatch, tmp_path):
    cfg = tmp_path / "backend.json"
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(cfg))
    jsonfile.update_section("built", "cpp", {"ok": True, "variants": ["scalar", "avx2"]}, cfg)
    monkeypatch.setattr(cpp_build, "_importable_build", lambda: "/x/tensor_ops/_cpp.so")
    cpp_build._record_failure("RuntimeError: pybind11 is not importable")
    built = json.loads(cfg.read_text())["built"]["cpp"]
    assert built == {"ok": True, "variants": ["scalar", "avx2"],
                     "last_failed_build": "RuntimeError: pybind11 is not importable"}


def test_failed_build_without_a_working_one_is_recorded(monkeypatch, tmp_path):
    cfg = tmp_path / "backend.json"
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(cfg))
    monkeypatch.setattr(cpp_build, "_importable_build", lambda: "")
    cpp_build._record_failure("CompileError: boom")
    assert json.loads(cfg.read_text())["built"]["cpp"] == {"ok": False, "reason": "CompileError: boom"}


def test_setup_py_prints_no_setuptools_warning_and_lists_our_commands(tmp_path):
    p = _setup(["--help-commands"], _no_pybind11(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr and "deprecated" not in p.stderr.lower(), p.stderr
    listed = {ln.split()[0]: ln.split(None, 1)[1] for ln in p.stdout.splitlines()
              if ln.startswith("  ") and len(ln.split()) > 1}
    for cmd in ("test_capabilities", "configure_backend", "build_ext", "build_cuda", "build_opencl"):
        assert cmd in listed and "no description" not in listed[cmd], (cmd, p.stdout)


def test_backend_json_is_not_tracked_and_is_ignored():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "backend.json"], cwd=ROOT, capture_output=True, text=True)
    assert tracked.stdout.strip() == ""
    for path in ("backend.json", "bench_results/bench.json"):
        ign = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert ign.returncode == 0, f"{path} is not ignored by git"


def test_example_config_is_valid():
    data = json.loads((ROOT / "backend.example.json").read_text())
    cfg = _config.validate_config(data, "backend.example.json")
    assert cfg.priority and cfg.per_op


def test_one_version_source():
    from tensor_ops._version import __version__
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "\nversion =" not in text.split("[tool.setuptools.dynamic]")[0]
    from importlib.metadata import PackageNotFoundError, version
    try:
        assert version("tensor_ops") == __version__
    except PackageNotFoundError:
        pytest.skip("tensor_ops is not installed (metadata absent)")


def test_ci_runs_the_readme_quick_start():
    """.ci/run reads the two commands from README.md itself (so they cannot drift) and runs
    them in a new venv."""
    sys.path.insert(0, str(ROOT / ".ci"))
    try:
        import readme_commands
    finally:
        sys.path.pop(0)
    install, test = readme_commands.quick_start(ROOT / "README.md")
    assert install.startswith("pip install -e ") and "detect_and_benchmark.py" in install
    assert test == "python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-m venv" in ci and "readme_commands.py" in ci


@pytest.mark.parametrize("line", [
    "     STT_FUNC         STB_GLOBAL STO_ENTRY      rms_norm_f32",      # cuobjdump <= 13.0
    "FUNC          GLOBAL  DEFAULT    ENTRY                                rms_norm_f32",   # 13.5
])
def test_fatbin_check_reads_both_cuobjdump_formats(monkeypatch, tmp_path, line):
    """A fresh venv gets the newest cuobjdump wheel, whose symbol table is spelled differently."""
    import types
    from tensor_ops._build import cuda_build
    out = f"Fatbin elf code:\narch = sm_90\n{line}\nFUNC          WEAK    DEFAULT    -    $__internal_0\n"
    monkeypatch.setattr(cuda_build, "_run", lambda cmd, timeout=None: types.SimpleNamespace(
        returncode=0, stdout=out if "-symbols" in cmd else ""))
    fatbin = tmp_path / "x.fatbin"
    fatbin.write_bytes(b"\0")
    got = cuda_build.fatbin_contents(fatbin, cuobjdump="cuobjdump")
    assert got["symbols"] == {"sm_90": {"rms_norm_f32"}}
