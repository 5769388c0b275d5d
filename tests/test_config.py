"""backend.json: validation messages, location, atomic writes, configure_backend round trip."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tensor_ops as to
from tensor_ops import _config
from tensor_ops._build import jsonfile

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("content,msg", [
    ('{"schema_version": 1, "priority": "cpp"}', "'priority' must be a list of backend names, got 'cpp'"),
    ('{"schema_version": 1, "priority": ["cpp", "gpu"]}', "unknown backend 'gpu'"),
    ('{"schema_version": 1, "prioritty": ["cpp"]}', "unknown keys ['prioritty']; accepted keys"),
    ('{"schema_version": 2}', "'schema_version' must be 1, got 2"),
    ('{"schema_version": 1, "strict": "yes"}', "'strict' must be true or false, got 'yes'"),
    ('{"schema_version": 1, "per_op": {"rmsnorm": ["cpp"]}}', "unknown op 'rmsnorm'"),
    ('{"schema_version": 1, "per_op": {"rms_norm": "cpp"}}', "'per_op.rms_norm' must be a list"),
    ('{"schema_version": 1, "force": 3}', "'force' must be one backend name"),
    ('{"schema_version": 1, "disabled": ["cuda", "tpu"]}', "'disabled': unknown backend 'tpu'"),
    ('{"schema_version": 1, "tuning": {"ops": {}}}', "'tuning'.fingerprint must be an object"),
    ('{"schema_version": 1, "priority": ["cpp"]', "not valid JSON"),
    ('[1, 2]', "top level must be a JSON object"),
])
def test_invalid_config_names_file_and_key(isolated_config, content, msg):
    isolated_config.write_text(content)
    with pytest.raises(ValueError) as err:
        to.reload_config()
    assert str(isolated_config) in str(err.value)
    assert msg in str(err.value)


def test_invalid_config_keeps_previous_settings(isolated_config):
    isolated_config.write_text('{"schema_version": 1, "priority": ["numpy"]}')
    to.reload_config()
    isolated_config.write_text('{"schema_version": 1, "priority": "numpy"}')
    with pytest.raises(to.ConfigError):
        to.reload_config()
    assert to.get_manager().settings.file.priority == ["numpy"]


def test_unreadable_config_is_a_clear_error(isolated_config):
    if os.geteuid() == 0:
        isolated_config.mkdir()       # root can read anything: a directory is unreadable as a file
    else:
        isolated_config.write_text("{}")
        isolated_config.chmod(0)
    with pytest.raises(to.ConfigError, match="cannot be read"):
        to.reload_config()


def test_location_precedence(monkeypatch, tmp_path):
    """$TENSOR_OPS_CONFIG → the project file (source checkout) → the user file → defaults;
    commands write to the located file, else the project's (checkout), else the user's. One
    rule for the runtime and the setup.py commands (jsonfile)."""
    assert jsonfile.PROJECT_ROOT == ROOT and _config.locate_config is jsonfile.locate
    proj, user = tmp_path / "proj", tmp_path / "user" / "backend.json"
    proj.mkdir()
    monkeypatch.setattr(jsonfile, "PROJECT_ROOT", proj)
    monkeypatch.setattr(jsonfile, "user_config_path", lambda: user)
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(tmp_path / "x.json"))
    assert _config.locate_config() == (tmp_path / "x.json", "TENSOR_OPS_CONFIG")
    assert _config.write_target() == tmp_path / "x.json"
    monkeypatch.delenv("TENSOR_OPS_CONFIG")
    assert _config.locate_config() == (None, "defaults")       # no checkout, no user file
    assert _config.write_target() == user
    (proj / "setup.py").write_text("")
    assert _config.write_target() == proj / "backend.json"     # a checkout writes its own file
    user.parent.mkdir()
    user.write_text("{}")
    assert _config.locate_config() == (user, "user")
    assert _config.write_target() == user                       # ... unless the user's is in use
    (proj / "backend.json").write_text("{}")
    assert _config.locate_config() == (proj / "backend.json", "project")
    assert jsonfile.write_target() == proj / "backend.json"


def test_atomic_write_leaves_old_file_on_failure(isolated_config, monkeypatch):
    isolated_config.write_text('{"schema_version": 1, "priority": ["numpy"]}\n')
    before = isolated_config.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        jsonfile.atomic_write(isolated_config, {"schema_version": 1, "priority": ["cpp"]})
    assert isolated_config.read_text() == before
    assert [p.name for p in isolated_config.parent.iterdir()] == ["backend.json"]   # no temp left


def test_write_config_validates_before_writing(isolated_config):
    isolated_config.write_text('{"schema_version": 1}\n')
    with pytest.raises(ValueError, match="unknown backend 'cdua'"):
        _config.write_config({"priority": ["cdua"]}, isolated_config)
    assert json.loads(isolated_config.read_text()) == {"schema_version": 1}


def _setup(args, cfg):
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(cfg), PYTHONPATH=str(ROOT))
    env.pop("TENSOR_OPS_BACKEND", None)     # the round trip is about the file, not a forced run
    return subprocess.run([sys.executable, "setup.py", "-q", "configure_backend", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_configure_backend_round_trip(tmp_path):
    cfg = tmp_path / "backend.json"
    p = _setup(["--priority=numpy", "--show"], cfg)
    assert p.returncode == 0, p.stderr
    assert json.loads(cfg.read_text())["priority"] == ["numpy"]
    assert "priority       = [\"numpy\"]" in p.stdout and "rms_norm       -> numpy" in p.stdout
    p = _setup(["--op", "softmax=numpy;silu=reference", "--strict"], cfg)
    assert p.returncode == 0, p.stderr
    data = json.loads(cfg.read_text())
    assert data["per_op"] == {"softmax": ["numpy"], "silu": ["reference"]} and data["strict"] is True
    before = cfg.read_text()
    p = _setup(["--priority=cpp,tpu"], cfg)
    assert p.returncode != 0 and "unknown backend 'tpu'" in p.stderr and "left unchanged" in p.stderr
    p = _setup(["--op", "rmsnorm=cpp"], cfg)
    assert p.returncode != 0 and "unknown op 'rmsnorm'" in p.stderr
    assert cfg.read_text() == before
    p = _setup(["--reset"], cfg)
    assert p.returncode == 0 and json.loads(cfg.read_text()) == {"schema_version": 1}


def test_configure_backend_refuses_unavailable_forced_backend(tmp_path):
    cfg = tmp_path / "backend.json"
    p = _setup(["--backend=cuda"], cfg)
    assert p.returncode != 0 and "not available here" in p.stderr
    assert not cfg.exists()


def test_configure_backend_reset_repairs_corrupt_file(tmp_path):
    cfg = tmp_path / "backend.json"
    cfg.write_text('{"priority": [')
    p = _setup(["--show"], cfg)
    assert p.returncode != 0 and "not valid JSON" in p.stderr
    p = _setup(["--reset"], cfg)
    assert p.returncode == 0, p.stderr
    assert json.loads(cfg.read_text()) == {"schema_version": 1}


def test_record_keeps_user_settings(tmp_path):
    cfg = tmp_path / "b.json"
    cfg.write_text('{"schema_version": 1, "per_op": {"softmax": ["numpy"]}}')
    jsonfile.update_section("built", "cpp", {"ok": True}, cfg)
    data = json.loads(cfg.read_text())
    assert data["per_op"] == {"softmax": ["numpy"]} and data["built"]["cpp"] == {"ok": True}


def test_test_capabilities_records_detection(tmp_path):
    cfg = tmp_path / "b.json"
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(cfg), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "setup.py", "-q", "test_capabilities"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "OpenMP" in p.stdout and "CUDA devices" in p.stdout
    det = json.loads(cfg.read_text())["detected"]
    assert set(det) >= {"cpu", "openmp", "compilers", "cuda", "opencl"}
    assert "avx2" in det["cpu"]["isa"]


def test_opencl_detection_asks_each_device_to_compile():
    """A device is usable only if its compiler builds a one-line kernel (PoCL 3.0 cannot for an
    AMD Zen 5 CPU: "unknown target CPU 'generic'"); with none usable the one-shot skips
    build_opencl with that reason instead of failing on our kernels."""
    from tensor_ops._build import capabilities
    d = capabilities.detect_opencl()
    devs = d.get("devices", [])
    assert d["available"] == any(x["compile_error"] is None for x in devs)
    if devs and not d["available"]:
        assert all(x["compile_error"] in d["reason"] for x in devs)
    sys.path.insert(0, str(ROOT))
    try:
        import detect_and_benchmark as dab
    finally:
        sys.path.remove(str(ROOT))
    plan = {name: skip for name, _, skip in dab.build_plan(
        {"compilers": {}, "cuda": {}, "opencl": {"available": False, "reason": "its compiler said no"}})}
    assert plan["opencl"] == "no usable OpenCL device: its compiler said no"
    plan = {name: skip for name, _, skip in dab.build_plan(
        {"compilers": {}, "cuda": {}, "opencl": {"available": True}})}
    assert plan["opencl"] == ""
