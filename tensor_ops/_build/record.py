"""Atomically record build/detection results in backend.json (no tensor_ops import).

The runtime validates the whole file (``tensor_ops._config``); this helper only touches the
``built`` and ``detected`` sections the setup.py commands own, and keeps everything else the
user wrote. Writes are atomic (temp file in the same directory + ``os.replace``), so a crash
never leaves a torn file.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

SCHEMA_VERSION = 1
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def config_path() -> Path:
    """Where setup.py commands write: $TENSOR_OPS_CONFIG, else the project's backend.json."""
    env = os.environ.get("TENSOR_OPS_CONFIG")
    return Path(env) if env else PROJECT_ROOT / "backend.json"


def atomic_write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> dict:
    """Read the file; a missing file is an empty config, a corrupt one is an error."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"schema_version": SCHEMA_VERSION}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); fix or delete the file") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a JSON object, got {type(data).__name__}")
    return data


def update_section(section: str, name: str, value, path: Path | None = None) -> Path:
    """Set ``config[section][name] = value`` (section is 'built' or 'detected') atomically."""
    if section not in ("built", "detected"):
        raise ValueError(f"section must be 'built' or 'detected', got {section!r}")
    path = Path(path) if path else config_path()
    data = read_json(path)
    data.setdefault("schema_version", SCHEMA_VERSION)
    sec = data.get(section)
    if not isinstance(sec, dict):
        sec = {}
    sec[name] = value
    data[section] = sec
    atomic_write_json(path, data)
    return path
