"""backend.json: validate, load, write (atomically).

One validating function (:func:`validate_config`) is the only way a configuration enters the
process; every error names the file and the key, shows the bad value and lists what is
accepted. Where the file is, how it is read and how it is written (temp file + rename, so a
failed or concurrent write never leaves a torn file) is ``_build/jsonfile.py``, shared with
the setup.py commands so the two can never disagree about the location.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from ._build import jsonfile
from ._build.jsonfile import SCHEMA_VERSION, user_config_path, write_target  # noqa: F401 (API)
from ._build.jsonfile import locate as locate_config
from ._errors import ConfigError
from ._ops import ALL_BUILTIN_NAMES, KNOWN_OPS

KIND_TOKENS = ("default", "flagos", "vendor", "reference")
KEYS = (
    "schema_version", "priority", "force", "strict", "per_op", "disabled", "allow_vendors",
    "deny_vendors", "fallback", "tuning", "detected", "built",
)


@dataclass
class FileConfig:
    """A validated backend.json (or the defaults when there is none)."""

    path: Optional[Path] = None
    location: str = "defaults"          # 'TENSOR_OPS_CONFIG', 'project', 'user' or 'defaults'
    priority: Optional[list] = None
    force: Optional[str] = None
    strict: Optional[bool] = None
    per_op: dict = field(default_factory=dict)
    disabled: list = field(default_factory=list)
    allow_vendors: Optional[list] = None
    deny_vendors: list = field(default_factory=list)
    fallback: Optional[list] = None
    tuning: dict = field(default_factory=dict)
    detected: dict = field(default_factory=dict)
    built: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)


# -- token validation -------------------------------------------------------------------
def known_names(extra: Iterable[str] = ()) -> list[str]:
    return sorted(set(ALL_BUILTIN_NAMES) | {str(e).lower() for e in extra})


def check_token(tok: Any, where: str, names: Iterable[str]) -> str:
    """Validate one order token and return it normalised (lower-case names)."""
    names = list(names)
    accepted = (f"a backend name {names}, a kind {list(KIND_TOKENS)}, "
                f"'vendor:<name>' or 'impl:<impl_id>'")
    if not isinstance(tok, str) or not tok.strip():
        raise ConfigError(f"{where}: order entries must be non-empty strings, got {tok!r}; accepted: {accepted}")
    t = tok.strip()
    low = t.lower()
    if low.startswith("vendor:"):
        if not low[7:]:
            raise ConfigError(f"{where}: 'vendor:' needs a vendor name, got {tok!r}")
        return low
    if low.startswith("impl:"):
        if not t[5:]:
            raise ConfigError(f"{where}: 'impl:' needs an impl_id, got {tok!r}")
        return "impl:" + t[5:]
    if low in KIND_TOKENS:
        return "default" if low == "flagos" else low
    if low in names:
        return low
    raise ConfigError(f"{where}: unknown backend {tok!r}; accepted: {accepted}")


def parse_order(value: Any, where: str, names: Iterable[str]) -> list[str]:
    """A list of tokens, or a comma/'|'-separated string of them."""
    if isinstance(value, str):
        parts = [p for p in value.replace("|", ",").split(",") if p.strip()]
        if not parts:
            raise ConfigError(f"{where}: empty order {value!r}; give at least one backend name")
        value = parts
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of backend names, got {value!r}")
    out: list[str] = []
    for tok in value:
        t = check_token(tok, where, names)
        if t not in out:
            out.append(t)
    return out


def check_op(op: Any, where: str) -> str:
    if not isinstance(op, str) or op not in KNOWN_OPS:
        raise ConfigError(f"{where}: unknown op {op!r}; known ops: {sorted(KNOWN_OPS)}")
    return op


def _name_list(value: Any, where: str, names: Optional[list]) -> list[str]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{where} must be a list of names, got {value!r}")
    out = [v.strip().lower() for v in value]
    if names is not None:
        for v in out:
            if v not in names:
                raise ConfigError(f"{where}: unknown backend {v!r}; accepted: {names}")
    return out


def _check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


def validate_tuning(tuning: Any, where: str, names: Iterable[str]) -> dict:
    """Schema: {fingerprint: {...}, created: str, ops: {op: {dtype: [{max_bytes: int|null, order: [...]}, ...]}}}."""
    if tuning in (None, {}):
        return {}
    if not isinstance(tuning, dict):
        raise ConfigError(f"{where} must be an object, got {tuning!r}")
    unknown = set(tuning) - {"fingerprint", "created", "ops", "copy_gbps", "source", "excluded"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; accepted: "
                          f"['copy_gbps', 'created', 'excluded', 'fingerprint', 'ops', 'source']")
    excluded = tuning.get("excluded", {})
    if not isinstance(excluded, dict) or not all(
            isinstance(d, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in d.items())
            for d in excluded.values()):
        raise ConfigError(f"{where}.excluded must be {{op: {{impl_id: reason}}}}, got {excluded!r}")
    for op in excluded:
        check_op(op, f"{where}.excluded")
    fp = tuning.get("fingerprint")
    if not isinstance(fp, dict):
        raise ConfigError(f"{where}.fingerprint must be an object describing the machine, got {fp!r}")
    ops = tuning.get("ops", {})
    if not isinstance(ops, dict):
        raise ConfigError(f"{where}.ops must be an object {{op: {{dtype: [buckets]}}}}, got {ops!r}")
    clean: dict = {}
    for op, per_dtype in ops.items():
        check_op(op, f"{where}.ops")
        if not isinstance(per_dtype, dict):
            raise ConfigError(f"{where}.ops.{op} must be an object {{dtype: [buckets]}}, got {per_dtype!r}")
        clean[op] = {}
        for dt, buckets in per_dtype.items():
            if dt not in ("float16", "float32", "float64", "bfloat16"):
                raise ConfigError(f"{where}.ops.{op}: unknown dtype {dt!r}; accepted: "
                                  f"['bfloat16', 'float16', 'float32', 'float64']")
            w = f"{where}.ops.{op}.{dt}"
            if not isinstance(buckets, list) or not buckets:
                raise ConfigError(f"{w} must be a non-empty list of {{max_bytes, order}}, got {buckets!r}")
            prev = -1
            out = []
            for i, b in enumerate(buckets):
                if not isinstance(b, dict) or set(b) - {"max_bytes", "order", "why"} or "order" not in b:
                    raise ConfigError(f"{w}[{i}] must be {{'max_bytes': int|null, 'order': [...]}}, got {b!r}")
                mb = b.get("max_bytes")
                last = i == len(buckets) - 1
                if mb is None and not last:
                    raise ConfigError(f"{w}[{i}]: only the last bucket may have max_bytes null")
                if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb <= prev):
                    raise ConfigError(f"{w}[{i}].max_bytes must be an int increasing across buckets, got {mb!r}")
                prev = mb if mb is not None else prev
                out.append({"max_bytes": mb, "order": parse_order(b["order"], f"{w}[{i}].order", names),
                            **({"why": str(b["why"])} if "why" in b else {})})
            clean[op][dt] = out
    result = dict(tuning)
    result["ops"] = clean
    return result


def validate_config(data: Any, source: str = "backend.json", extra_names: Iterable[str] = ()) -> FileConfig:
    """Validate a parsed backend.json; raise ConfigError naming ``source`` and the key."""
    names = known_names(extra_names)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; accepted keys: {sorted(KEYS)}")
    ver = data.get("schema_version", SCHEMA_VERSION)
    if ver != SCHEMA_VERSION:
        raise ConfigError(f"{source}: 'schema_version' must be {SCHEMA_VERSION}, got {ver!r}")
    cfg = FileConfig(raw=dict(data))
    if data.get("priority") is not None:
        if not isinstance(data["priority"], list):
            raise ConfigError(f"{source}: 'priority' must be a list of backend names, got {data['priority']!r}")
        cfg.priority = parse_order(data["priority"], f"{source}: 'priority'", names)
    if data.get("force") is not None:
        f = data["force"]
        if not isinstance(f, str):
            raise ConfigError(f"{source}: 'force' must be one backend name or null, got {f!r}")
        cfg.force = check_token(f, f"{source}: 'force'", names)
    if data.get("strict") is not None:
        cfg.strict = _check_bool(data["strict"], f"{source}: 'strict'")
    per_op = data.get("per_op", {})
    if not isinstance(per_op, dict):
        raise ConfigError(f"{source}: 'per_op' must be an object {{op: [backends]}}, got {per_op!r}")
    for op, order in per_op.items():
        check_op(op, f"{source}: 'per_op'")
        if not isinstance(order, list):
            raise ConfigError(f"{source}: 'per_op.{op}' must be a list of backend names, got {order!r}")
        cfg.per_op[op] = parse_order(order, f"{source}: 'per_op.{op}'", names)
    cfg.disabled = _name_list(data.get("disabled", []), f"{source}: 'disabled'", names)
    if data.get("allow_vendors") is not None:
        cfg.allow_vendors = _name_list(data["allow_vendors"], f"{source}: 'allow_vendors'", None)
    cfg.deny_vendors = _name_list(data.get("deny_vendors", []), f"{source}: 'deny_vendors'", None)
    if data.get("fallback") is not None:
        if not isinstance(data["fallback"], list):
            raise ConfigError(f"{source}: 'fallback' must be a list of backend names, got {data['fallback']!r}")
        cfg.fallback = parse_order(data["fallback"], f"{source}: 'fallback'", names)
    cfg.tuning = validate_tuning(data.get("tuning"), f"{source}: 'tuning'", names)
    for key in ("detected", "built"):
        val = data.get(key, {})
        if not isinstance(val, dict):
            raise ConfigError(f"{source}: {key!r} must be an object, got {val!r}")
        setattr(cfg, key, val)
    return cfg


def load_config(environ=None, extra_names: Iterable[str] = ()) -> FileConfig:
    """Locate and validate the configuration file (defaults if there is none)."""
    path, location = locate_config(environ)
    if path is None:
        return FileConfig(location="defaults")
    # An explicit path that does not exist yet means "empty config here"; a located project or
    # user file that vanished was replaced non-atomically under us.
    data = jsonfile.read(path, missing_ok=location == "TENSOR_OPS_CONFIG", error=ConfigError)
    if data is None:
        return FileConfig(path=path, location=location)
    cfg = validate_config(data, str(path), extra_names)
    cfg.path, cfg.location = path, location
    return cfg


def read_raw(path: Path) -> dict:
    """The file's JSON object for editing (missing → a fresh one); ConfigError when unreadable."""
    return jsonfile.read_document(path, error=ConfigError)


def write_config(data: dict, path: Path, extra_names: Iterable[str] = ()) -> FileConfig:
    """Validate ``data`` completely, then write it atomically. Invalid data never reaches disk."""
    data = dict(data)
    data.setdefault("schema_version", SCHEMA_VERSION)
    cfg = validate_config(data, str(path), extra_names)
    jsonfile.atomic_write(Path(path), data)
    cfg.path = Path(path)
    return cfg
