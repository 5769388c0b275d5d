"""Effective settings: environment variables layered over backend.json, each with its source.

Precedence for an op's order (highest first; DESIGN.md):
call keyword ``backend=`` → ``use_backend()`` → ``set_backend()`` → environment
(force > per-op > priority > TE_FL_PREFER) → backend.json (force > per_op > tuning table >
priority) → built-in default ``cuda, opencl, cpp, numpy``.

Everything here is computed once per :func:`reload`, so the per-call path only does dict
look-ups. Variables are declared (with their TE / TE-FL aliases, parsers and meaning) in
``_env.py``; this module only layers them over the file.
"""
from __future__ import annotations

import bisect
import logging
import os
import platform
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from . import _env, _version
from ._config import FileConfig, check_op, known_names, load_config, parse_order
from ._errors import ConfigError
from ._ops import BUILTIN_BACKENDS

log = logging.getLogger("tensor_ops")

DEFAULT_ORDER = list(BUILTIN_BACKENDS)

#: Every variable (aliases included) that changes the resolver's or tex's selection: what
#: get_backend_info()["env"] used to list, and what tests clear for a clean resolver.
ALL_ENV = _env.names(("runtime", "tex"))


def _setting(name: str, environ) -> tuple[Optional[str], Optional[str]]:
    """(raw value, variable) of a setting whose parsing needs the backend names."""
    return _env.raw(name, environ)


def _typed(name: str, environ):
    """(parsed value, variable) of a self-contained setting; ConfigError naming it if invalid."""
    return _env.lookup(name, environ, error=ConfigError)


def parse_per_op(value: str, var: str, names) -> dict:
    """``op=tok|tok;op2=tok`` (TE-FL format; ',' also separates tokens)."""
    out = {}
    for part in value.split(";"):
        if not part.strip():
            continue
        if "=" not in part:
            raise ConfigError(f"environment variable {var}: entry {part!r} must look like 'op=backend|backend'")
        op, order = part.split("=", 1)
        op = check_op(op.strip(), f"environment variable {var}")
        out[op] = parse_order(order, f"environment variable {var} ({op})", names)
    return out


def machine_fingerprint() -> dict:
    """The cheap part of the machine identity that a tuning table must match."""
    model = platform.processor() or ""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name") and not model.replace("x86_64", "").strip():
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    isa = [f for f in ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f") if f in flags]
    return {"cpu": model, "machine": platform.machine(), "isa": isa,
            "package_version": _version.__version__}


def cuda_device_id(name: str, cc: str) -> str:
    """How a tuning fingerprint names a CUDA device (recorded by detect_and_benchmark,
    compared against ``tensor_ops.backends.cuda.device_ids()``)."""
    return f"{name} (cc {cc})"


def opencl_device_id(device: str, platform: str, driver: str) -> str:
    """How a tuning fingerprint names an OpenCL device (see cuda_device_id)."""
    return f"{device} [{platform}] driver {driver}"


def fingerprint_mismatch(recorded: dict) -> Optional[str]:
    """None when the recorded fingerprint matches this machine, else what differs."""
    now = machine_fingerprint()
    diffs = [f"{k}: recorded {recorded.get(k)!r}, now {now[k]!r}"
             for k in ("cpu", "machine", "isa", "package_version") if recorded.get(k) != now[k]]
    return "; ".join(diffs) or None


@dataclass
class Settings:
    """Everything the resolver needs, with where each value came from."""

    file: FileConfig
    names: list
    force: Optional[str] = None
    force_source: str = ""
    env_per_op: dict = field(default_factory=dict)
    env_per_op_source: str = ""
    env_priority: Optional[list] = None
    env_priority_source: str = ""
    strict: bool = False
    strict_source: str = "default"
    disabled: dict = field(default_factory=dict)        # name -> source
    allow_vendors: Optional[list] = None
    allow_source: str = "default"
    deny_vendors: list = field(default_factory=list)
    deny_source: str = "default"
    fallback: Optional[list] = None
    fallback_source: str = "default (reference impls)"
    plugins: list = field(default_factory=list)         # (module, source)
    log_level: str = "WARNING"
    log_source: str = "default"
    tuning_ops: dict = field(default_factory=dict)      # op -> {dtype name: (thresholds, orders)}
    tuning_status: str = "no tuning table"
    tuning_excluded: dict = field(default_factory=dict)  # op -> {impl_id: reason} (failed validation)
    # GPU part of the tuning fingerprint, checked lazily (only when a tuned order names the
    # backend, whose availability the resolver then decides anyway): backend -> recorded
    # device ids, or absent when the table did not record them (then not checked).
    tuning_gpu: dict = field(default_factory=dict)
    gpu_probe: Optional[Callable[[str], Optional[list]]] = None   # backend -> device ids now
    gpu_mismatch_notes: dict = field(default_factory=dict)        # backend -> why ('' = same)

    def order_for(self, op: str, dtype_name: Optional[str] = None, nbytes: int = 0) -> tuple[list, str, bool]:
        """(tokens, source, forced) for ``op`` below the runtime overrides."""
        if self.force:
            return [self.force], self.force_source, True
        if op in self.env_per_op:
            return self.env_per_op[op], self.env_per_op_source, False
        if self.env_priority:
            return self.env_priority, self.env_priority_source, False
        f = self.file
        where = f"backend.json ({f.path})" if f.path else "backend.json"
        if f.force:
            return [f.force], f"{where} 'force'", True
        if op in f.per_op:
            return f.per_op[op], f"{where} 'per_op.{op}'", False
        tuned = self.tuned_order(op, dtype_name, nbytes)
        if tuned is not None and self.tuned_gpu_mismatch(tuned):
            tuned = None
        if tuned is not None:
            thresholds = self.tuning_ops[op][dtype_name][0]
            i = bisect.bisect_left(thresholds, nbytes)
            span = (f"<= {thresholds[i]} bytes" if i < len(thresholds)
                    else f"> {thresholds[-1]} bytes" if thresholds else "all sizes")
            return tuned, f"{where} 'tuning' ({op}, {dtype_name}, {span})", False
        if f.priority:   # (a tuned order dropped for its GPU is explained in gpu_mismatch_notes)
            return f.priority, f"{where} 'priority'", False
        return DEFAULT_ORDER, "built-in default", False

    def tuned_gpu_mismatch(self, order: list) -> str:
        """Why a tuned ``order`` must not be followed because a GPU backend it names now
        sees other devices than the table recorded ('' when it may be)."""
        for tok in order:
            if tok not in self.tuning_gpu or self.gpu_probe is None:
                continue
            why = self.gpu_mismatch_notes.get(tok)
            if why is None:
                now = self.gpu_probe(tok)   # None: backend unavailable, its tokens match nothing
                rec = self.tuning_gpu[tok]
                why = "" if now is None or sorted(now) == sorted(rec) else \
                    f"{tok} devices were {rec} when tuned, now {now}; run `python detect_and_benchmark.py` again"
                self.gpu_mismatch_notes[tok] = why
            if why:
                return why
        return ""

    def tuned_order(self, op, dtype_name, nbytes) -> Optional[list]:
        table = self.tuning_ops.get(op)
        if not table or dtype_name not in table:
            return None
        thresholds, orders = table[dtype_name]
        return orders[bisect.bisect_left(thresholds, nbytes)]

    def bucket(self, op, dtype_name, nbytes) -> int:
        """Index of the tuning bucket (-1 when tuning does not apply): part of the cache key."""
        table = self.tuning_ops.get(op)
        if not table or dtype_name not in table:
            return -1
        return bisect.bisect_left(table[dtype_name][0], nbytes)

    def tuning_applies(self, op: str) -> bool:
        """Whether the tuning table can decide ``op`` (nothing of higher precedence is set)."""
        return (op in self.tuning_ops and not self.force and op not in self.env_per_op
                and not self.env_priority and not self.file.force and op not in self.file.per_op)


def build_settings(environ=os.environ, extra_names: Iterable[str] = ()) -> Settings:
    """Read the file and the environment; raise ConfigError on any invalid value."""
    names = known_names(extra_names)
    file = load_config(environ, names)
    s = Settings(file=file, names=names)

    v, var = _setting("TENSOR_OPS_BACKEND", environ)
    if v:
        toks = parse_order(v, f"environment variable {var}", names)
        if len(toks) == 1:
            s.force, s.force_source = toks[0], f"env {var}"
        else:
            s.env_priority, s.env_priority_source = toks, f"env {var}"
    v, var = _setting("TENSOR_OPS_PER_OP", environ)
    if v:
        s.env_per_op, s.env_per_op_source = parse_per_op(v, str(var), names), f"env {var}"
    v, var = _setting("TENSOR_OPS_PRIORITY", environ)
    if v:
        s.env_priority, s.env_priority_source = parse_order(v, f"environment variable {var}", names), f"env {var}"
    if s.env_priority is None:
        pref, var = _typed("TE_FL_PREFER", environ)
        if var:
            s.env_priority, s.env_priority_source = ["default" if pref == "flagos" else pref], f"env {var}"
        else:
            vendor, var = _typed("TE_FL_PREFER_VENDOR", environ)
            if vendor:
                s.env_priority, s.env_priority_source = ["vendor"], f"env {var}"

    strict, var = _typed("TENSOR_OPS_STRICT", environ)
    if var:
        s.strict, s.strict_source = strict, f"env {var}"
    elif file.strict is not None:
        s.strict, s.strict_source = file.strict, "backend.json 'strict'"

    for name in file.disabled:
        s.disabled[name] = "backend.json 'disabled'"
    v, var = _setting("TENSOR_OPS_DISABLE", environ)
    if v:
        for name in [p.strip().lower() for p in v.split(",") if p.strip()]:
            if name not in names:
                raise ConfigError(f"environment variable {var}: unknown backend {name!r}; accepted: {names}")
            s.disabled[name] = f"env {var}"
    skip, var = _typed("TE_FL_SKIP_CUDA", environ)
    if skip:
        s.disabled["cuda"] = s.disabled["nvidia"] = f"env {var}"

    allow, var = _typed("TENSOR_OPS_ALLOW_VENDORS", environ)
    if var:
        s.allow_vendors, s.allow_source = allow, f"env {var}"
    elif file.allow_vendors is not None:
        s.allow_vendors, s.allow_source = file.allow_vendors, "backend.json 'allow_vendors'"
    s.deny_vendors = list(file.deny_vendors)
    if file.deny_vendors:
        s.deny_source = "backend.json 'deny_vendors'"
    deny, var = _typed("TENSOR_OPS_DENY_VENDORS", environ)
    if var:
        s.deny_vendors += deny
        s.deny_source = f"env {var}" + (" + backend.json" if file.deny_vendors else "")

    v, var = _setting("TENSOR_OPS_FALLBACK_BACKEND", environ)
    if v:
        s.fallback, s.fallback_source = parse_order(v, f"environment variable {var}", names), f"env {var}"
    elif file.fallback:
        s.fallback, s.fallback_source = file.fallback, "backend.json 'fallback'"

    plugins, var = _typed("TENSOR_OPS_PLUGINS", environ)
    s.plugins = [(m, f"env {var}") for m in plugins or ()]

    debug, var = _typed("TE_FL_DEBUG", environ)
    if not debug:   # TE_FL_DEBUG=1 wins, and then the level variable is not even parsed
        level, var = _typed("TENSOR_OPS_LOG_LEVEL", environ)
    if debug or var:
        s.log_level, s.log_source = ("DEBUG" if debug else level), f"env {var}"

    tuning = file.tuning
    if tuning:
        why = fingerprint_mismatch(tuning.get("fingerprint", {}))
        if why:
            s.tuning_status = f"ignored: recorded on another machine or version ({why})"
            warnings.warn(f"tensor_ops: tuning table in {file.path} ignored, fingerprint differs ({why}); "
                          f"run `python detect_and_benchmark.py` again", RuntimeWarning, stacklevel=2)
        else:
            for op, per_dtype in tuning.get("ops", {}).items():
                s.tuning_ops[op] = {
                    dt: ([b["max_bytes"] for b in buckets[:-1]], [b["order"] for b in buckets])
                    for dt, buckets in per_dtype.items()
                }
            s.tuning_excluded = {op: dict(d) for op, d in tuning.get("excluded", {}).items()}
            fp = tuning.get("fingerprint", {})
            s.tuning_gpu = {b: list(fp[f"{b}_devices"]) for b in ("cuda", "opencl")
                            if isinstance(fp.get(f"{b}_devices"), list)}
            s.tuning_status = f"in use: fingerprint matches ({len(s.tuning_ops)} ops tuned)"
    return s
