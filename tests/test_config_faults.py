"""Configuration faults (issue 8): a broken backend.json or environment variable is a
``ConfigError`` (a ValueError) naming the file or variable and the key, the previous
configuration stays in force, and concurrent writers never leave a torn file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import ConfigError, _config
from tensor_ops._build.jsonfile import atomic_write as atomic_write_json

ROOT = Path(__file__).resolve().parent.parent
X = np.ones((2, 8), np.float32)


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _reload_error(path: Path, text: str) -> str:
    _write(path, text)
    with pytest.raises(ConfigError) as err:
        to.reload_config()
    return str(err.value)


BAD_FILES = [  # (id, file text, fragments the message must contain)
    ("truncated", '{"schema_version": 1, "priority": ["cpp", "num', ["not valid JSON", "line 1"]),
    ("empty-file", "", ["not valid JSON"]),
    ("top-level-list", '["cpp"]', ["top level must be a JSON object, got list"]),
    ("priority-str", '{"priority": "cpp"}', ["'priority' must be a list of backend names, got 'cpp'"]),
    ("priority-empty", '{"priority": []}', ["'priority'", "non-empty list"]),
    ("priority-int-entry", '{"priority": ["cpp", 3]}', ["'priority'", "got 3"]),
    ("strict-str", '{"strict": "yes"}', ["'strict' must be true or false, got 'yes'"]),
    ("force-int", '{"force": 3}', ["'force' must be one backend name or null, got 3"]),
    ("per-op-list", '{"per_op": ["cpp"]}', ["'per_op' must be an object"]),
    ("per-op-str-order", '{"per_op": {"rms_norm": "cpp"}}', ["'per_op.rms_norm' must be a list"]),
    ("disabled-int", '{"disabled": 1}', ["'disabled' must be a list of names, got 1"]),
    ("schema-2", '{"schema_version": 2}', ["'schema_version' must be 1, got 2"]),
    ("unknown-key", '{"priorty": ["cpp"]}', ["unknown keys ['priorty']", "accepted keys"]),
    ("unknown-backend", '{"priority": ["cpp", "gpu"]}', ["unknown backend 'gpu'", "accepted"]),
    ("unknown-force", '{"force": "tpu"}', ["'force'", "unknown backend 'tpu'"]),
    ("unknown-disabled", '{"disabled": ["gpu"]}', ["'disabled'", "unknown backend 'gpu'"]),
    ("unknown-op", '{"per_op": {"rmsnorm": ["cpp"]}}', ["unknown op 'rmsnorm'", "known ops"]),
    ("tuning-no-fingerprint", '{"tuning": {"ops": {}}}', ["'tuning'.fingerprint must be an object"]),
    ("tuning-bad-bucket", '{"tuning": {"fingerprint": {}, "ops": {"silu": {"float32": [{"max_bytes": 10}]}}}}',
     ["'tuning'.ops.silu.float32[0]"]),
    ("tuning-unknown-dtype",
     '{"tuning": {"fingerprint": {}, "ops": {"silu": {"int8": [{"max_bytes": null, "order": ["cpp"]}]}}}}',
     ["unknown dtype 'int8'"]),
    ("detected-list", '{"detected": []}', ["'detected' must be an object"]),
]


@pytest.mark.parametrize("text,frags", [pytest.param(t, f, id=i) for i, t, f in BAD_FILES])
def test_bad_file_is_a_config_error_naming_file_and_key(isolated_config, text, frags):
    msg = _reload_error(isolated_config, text)
    assert str(isolated_config) in msg, msg
    for frag in frags:
        assert frag in msg, (frag, msg)


def test_previous_configuration_stays_in_force(isolated_config, monkeypatch):
    monkeypatch.delenv("TENSOR_OPS_BACKEND", raising=False)      # a forced run would outrank the file
    _write(isolated_config, json.dumps({"priority": ["numpy"], "strict": True}))
    to.reload_config()
    assert to.get_backend("silu") == "numpy"
    _reload_error(isolated_config, '{"priority": ["numpy"], "strict": tru')
    info = to.get_backend_info()
    assert info["settings"]["strict"]["value"] is True
    assert info["settings"]["priority"]["value"] == ["numpy"]
    assert to.silu(X)[0, 0] == pytest.approx(0.7310586)        # ops keep working on the old settings


BAD_ENV = [  # (variable, value, fragments)
    ("TENSOR_OPS_STRICT", "maybe", ["TENSOR_OPS_STRICT='maybe'", "expected one of"]),
    ("TE_FL_STRICT", "2", ["TE_FL_STRICT='2'"]),
    ("TENSOR_OPS_PRIORITY", "cpp,gpu", ["TENSOR_OPS_PRIORITY", "unknown backend 'gpu'"]),
    ("TENSOR_OPS_BACKEND", "tpu", ["TENSOR_OPS_BACKEND", "unknown backend 'tpu'"]),
    ("TENSOR_OPS_PER_OP", "rms_norm:cpp", ["TENSOR_OPS_PER_OP", "must look like 'op=backend|backend'"]),
    ("TE_FL_PER_OP", "rmsnorm=cpp", ["TE_FL_PER_OP", "unknown op 'rmsnorm'"]),
    ("TENSOR_OPS_DISABLE", "gpu", ["TENSOR_OPS_DISABLE", "unknown backend 'gpu'"]),
    ("TENSOR_OPS_LOG_LEVEL", "LOUD", ["TENSOR_OPS_LOG_LEVEL='LOUD'"]),
    ("TE_FL_PREFER", "cpp", ["TE_FL_PREFER", "'cpp'"]),
    ("TENSOR_OPS_FALLBACK_BACKEND", "gpu", ["TENSOR_OPS_FALLBACK_BACKEND", "unknown backend 'gpu'"]),
]


@pytest.mark.parametrize("var,value,frags", BAD_ENV, ids=[f"{v}={x}" for v, x, _ in BAD_ENV])
def test_bad_environment_variable_names_it(monkeypatch, var, value, frags):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as err:
        to.reload_config()
    for frag in frags:
        assert frag in str(err.value), (frag, str(err.value))


def test_te_fl_prefer_lists_its_choices(monkeypatch):
    monkeypatch.setenv("TE_FL_PREFER", "cpp")
    with pytest.raises(ConfigError, match=r"\['flagos', 'reference', 'vendor'\]"):
        to.reload_config()


def test_unreadable_file_is_a_config_error(isolated_config):
    isolated_config.mkdir()                         # a directory where the file should be: EISDIR
    with pytest.raises(ConfigError) as err:
        to.reload_config()
    assert str(isolated_config) in str(err.value) and "cannot be read" in str(err.value)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads mode-000 files")
def test_mode_000_file_is_a_config_error(isolated_config):
    _write(isolated_config, "{}")
    isolated_config.chmod(0)
    try:
        with pytest.raises(ConfigError, match="cannot be read"):
            to.reload_config()
    finally:
        isolated_config.chmod(0o644)


def test_file_vanishing_between_locate_and_read(monkeypatch, tmp_path):
    """A project/user file deleted after it was located (replaced non-atomically) is reported, not a crash."""
    gone = tmp_path / "gone" / "backend.json"
    monkeypatch.setattr(_config, "locate_config", lambda environ=os.environ: (gone, "project"))
    with pytest.raises(ConfigError, match="disappeared while loading; run again"):
        _config.load_config()


def test_missing_explicit_path_means_empty(isolated_config):
    assert not isolated_config.exists()
    to.reload_config()
    assert to.get_backend_info()["config"]["location"] == "TENSOR_OPS_CONFIG"


def test_file_replaced_while_loading(isolated_config):
    """A writer atomically replacing the file in a loop: every concurrent load sees one complete
    version (never a torn or empty file)."""
    versions = [{"schema_version": 1, "priority": ["numpy"], "per_op": {"silu": ["numpy"]}},
                {"schema_version": 1, "priority": ["cpp", "numpy"], "strict": False,
                 "disabled": ["cuda"], "per_op": {op: ["numpy"] for op in ("rms_norm", "softmax", "gelu")}}]
    atomic_write_json(isolated_config, versions[0])
    stop = threading.Event()
    writes = [0]

    def writer():
        while not stop.is_set():
            atomic_write_json(isolated_config, versions[writes[0] % 2])
            writes[0] += 1

    t = threading.Thread(target=writer)
    t.start()
    seen = set()
    loads = 0
    deadline = time.monotonic() + 30
    try:
        while (loads < 300 or writes[0] < 20) and time.monotonic() < deadline:   # loaded machines are slow
            cfg = _config.load_config()
            seen.add(tuple(cfg.priority))
            to.reload_config()                      # the full path, through the global manager
            loads += 1
    finally:
        stop.set()
        t.join()
    assert writes[0] >= 20 and loads >= 300, (writes[0], loads)
    assert seen <= {("numpy",), ("cpp", "numpy")}
    assert not list(isolated_config.parent.glob(".backend.json.*.tmp")), "temp files left behind"


def test_non_atomic_writer_is_caught_not_crashed(isolated_config):
    """What atomic writes protect against: a reader racing a truncate-then-write writer gets
    either a valid config or a ConfigError naming the file, never another exception."""
    good = json.dumps({"schema_version": 1, "priority": ["numpy"], "per_op": {"silu": ["numpy"]}}) * 1
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            with open(isolated_config, "w", encoding="utf-8") as fh:
                fh.write(good[: len(good) // 2])
                fh.flush()
                fh.write(good[len(good) // 2:])

    _write(isolated_config, good)
    t = threading.Thread(target=writer)
    t.start()
    outcomes = {"ok": 0, "error": 0}
    try:
        for _ in range(300):
            try:
                _config.load_config()
                outcomes["ok"] += 1
            except ConfigError as exc:
                assert str(isolated_config) in str(exc)
                outcomes["error"] += 1
    finally:
        stop.set()
        t.join()
    assert outcomes["ok"] + outcomes["error"] == 300


def _configure(cfg: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(cfg), PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    return subprocess.Popen([sys.executable, "setup.py", "-q", "configure_backend", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_configure_backend_processes_at_once(isolated_config):
    """Two writers at once: both exit 0 saying what they wrote, the file is valid and equals one
    complete write (last one wins); a third, invalid, exits 1 and changes nothing."""
    a = _configure(isolated_config, "--priority=numpy,opencl")
    b = _configure(isolated_config, "--priority=opencl,numpy", "--strict")
    c = _configure(isolated_config, "--priority=numpy,gpu")
    outs = [p.communicate(timeout=120) + (p.returncode,) for p in (a, b, c)]
    for out, err, rc in outs[:2]:
        assert rc == 0, err
        assert f"wrote {isolated_config}" in out
    assert outs[2][2] == 1 and "unknown backend 'gpu'" in outs[2][1] and "left unchanged" in outs[2][1]
    data = json.loads(isolated_config.read_text())         # not torn
    _config.validate_config(data, str(isolated_config))
    assert data in ({"schema_version": 1, "priority": ["numpy", "opencl"]},
                    {"schema_version": 1, "priority": ["opencl", "numpy"], "strict": True},
                    {"schema_version": 1, "priority": ["numpy", "opencl"], "strict": True}), data
    assert not list(isolated_config.parent.glob(".backend.json.*.tmp"))


def test_configure_backend_refuses_a_corrupt_file_until_reset(isolated_config):
    _write(isolated_config, '{"priority": ["cpp"')
    p = _configure(isolated_config, "--strict")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "not valid JSON" in err and str(isolated_config) in err
    assert isolated_config.read_text() == '{"priority": ["cpp"'       # untouched
    p = _configure(isolated_config, "--reset")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert json.loads(isolated_config.read_text()) == {"schema_version": 1}


def test_broken_config_in_a_fresh_process_is_reported(isolated_config):
    """First use in a new process: the op raises ConfigError naming the file; `info` says so."""
    _write(isolated_config, '{"priority": "cpp"}')
    env = dict(os.environ, TENSOR_OPS_CONFIG=str(isolated_config), PYTHONPATH=str(ROOT))
    code = ("import numpy as np, tensor_ops as to\n"
            "try:\n    to.silu(np.ones(2, np.float32))\n"
            "except to.ConfigError as e:\n    print('ConfigError:', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "ConfigError:" in p.stdout and str(isolated_config) in p.stdout and "'priority'" in p.stdout
    p = subprocess.run([sys.executable, "-m", "tensor_ops", "info"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert "configuration error" in p.stdout + p.stderr
