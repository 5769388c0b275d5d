"""backend.json as a file: where it is, how it is read, how it is written. Standard library only.

One module for the runtime (``tensor_ops._config`` validates what :func:`read` returns) and
for the setup.py commands (which record ``built``/``detected`` with :func:`update_section`).
They used to locate the file differently — the build wrote ``$TENSOR_OPS_CONFIG`` else the
project file, while the runtime also knew the user config dir — so a build could record into
a file the runtime then preferred over the user's. Now there is one locator, one schema
version, one atomic write and one error formula.

Lookup order (BACKEND_CONFIG.md "backend.json"): ``$TENSOR_OPS_CONFIG`` (a missing file there
means "empty") → the project's ``backend.json`` in a source checkout → the user's
``<config dir>/tensor_ops/backend.json`` → built-in defaults. Commands write to the located
file, else to the project's file in a checkout, else to the user's.

Loadable by file path (setup.py, ``detect_and_benchmark.py``, ``cuda_build.py`` as a script):
it never imports the ``tensor_ops`` package, and reads environment variables through
``tensor_ops/_env.py``, itself loaded by path when the package is not being imported.

Example:
    >>> from tensor_ops._build import jsonfile
    >>> jsonfile.locate({"TENSOR_OPS_CONFIG": "/tmp/x.json"})
    (PosixPath('/tmp/x.json'), 'TENSOR_OPS_CONFIG')
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Optional

SCHEMA_VERSION = 1
FILE_NAME = "backend.json"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
RESET_HINT = "fix it or run `python setup.py configure_backend --reset`"


def _load_env():
    """``tensor_ops._env`` when this file is part of the imported package, else the same file
    loaded by path (once per process, under a private name)."""
    if __package__ == "tensor_ops._build":
        from .. import _env
        return _env
    name = "_tensor_ops_env"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "_env.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod          # dataclasses look their module up while it executes
        spec.loader.exec_module(mod)
    return sys.modules[name]


env = _load_env()


# --------------------------------------------------------------------------- where
def is_source_checkout(root: Optional[Path] = None) -> bool:
    """Whether ``root`` (default: the project root) is a source checkout / editable install."""
    return ((root or PROJECT_ROOT) / "setup.py").is_file()


def user_config_path() -> Path:
    """The per-user location (platformdirs; ``$XDG_CONFIG_HOME`` or ``~/.config`` without it)."""
    try:
        from platformdirs import user_config_dir
        base = Path(user_config_dir("tensor_ops", appauthor=False))
    except ImportError:  # a dependency, but pip's isolated build environment lacks it
        base = (env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "tensor_ops"
    return base / FILE_NAME


def locate(environ: Optional[Mapping[str, str]] = None) -> tuple:
    """``(path, location)``: location is 'TENSOR_OPS_CONFIG', 'project', 'user' or 'defaults'
    (then path is None)."""
    explicit = env.get("TENSOR_OPS_CONFIG", environ)
    if explicit is not None:
        return explicit, "TENSOR_OPS_CONFIG"
    project = PROJECT_ROOT / FILE_NAME
    if project.is_file() and is_source_checkout():
        return project, "project"
    user = user_config_path()
    if user.is_file():
        return user, "user"
    return None, "defaults"


def write_target(environ: Optional[Mapping[str, str]] = None) -> Path:
    """Where commands write: the located file, else the project's (source checkout), else the user's."""
    found, _ = locate(environ)
    if found is not None:
        return found
    if is_source_checkout():
        return PROJECT_ROOT / FILE_NAME
    return user_config_path()


# --------------------------------------------------------------------------- read / write
def new_document() -> dict:
    """What a file that does not exist yet holds."""
    return {"schema_version": SCHEMA_VERSION}


def read(path: Path, *, missing_ok: bool = True, error: type = ValueError) -> Optional[dict]:
    """The file's top-level JSON object; None when it does not exist and ``missing_ok``.

    Every problem raises ``error`` (the runtime passes ``ConfigError``) with one formula: the
    path, what is wrong, what to do."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise error(f"{path}: disappeared while loading; run again") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror}); fix its permissions or set "
                    f"TENSOR_OPS_CONFIG to another file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); "
                    f"{RESET_HINT}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: top level must be a JSON object, got {type(data).__name__}; {RESET_HINT}")
    return data


def read_document(path: Path, *, error: type = ValueError) -> dict:
    """The file's JSON object for editing; a fresh document when the file does not exist."""
    data = read(path, error=error)
    return new_document() if data is None else data


def atomic_write(path: Path, data: dict) -> None:
    """Write ``data`` so that readers see the old file or the new one, never half: a temp file
    in the same directory, fsync, then a rename."""
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


SECTIONS = ("built", "detected")


def update_section(section: str, name: str, value, path: Optional[Path] = None) -> Path:
    """Set ``config[section][name] = value`` atomically, keeping everything else the user wrote;
    ``section`` is one the setup.py commands own (:data:`SECTIONS`). Returns the path written."""
    if section not in SECTIONS:
        raise ValueError(f"section must be one of {sorted(SECTIONS)}, got {section!r}")
    path = Path(path) if path else write_target()
    data = read_document(path)
    data.setdefault("schema_version", SCHEMA_VERSION)
    sec = data.get(section)
    if not isinstance(sec, dict):
        sec = {}
    sec[name] = value
    data[section] = sec
    atomic_write(path, data)
    return path


def recorded(section: str, name: str, path: Optional[Path] = None):
    """``config[section][name]`` from the write target (None when absent or unreadable): what a
    setup.py command recorded, e.g. ``recorded('built', 'cpp')``."""
    try:
        sec = read_document(Path(path) if path else write_target()).get(section)
    except ValueError:
        return None
    return sec.get(name) if isinstance(sec, dict) else None
