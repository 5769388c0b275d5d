"""``setup.py configure_backend``: show or edit backend.json, validated, written atomically.

Runs the real validator (``tensor_ops._config``), so the command and the runtime can never
disagree about what is valid. Any invalid name exits non-zero with the valid choices and
leaves the file untouched.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from setuptools import Command

ROOT = Path(__file__).resolve().parents[2]


def _import_tensor_ops():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import tensor_ops  # noqa: F401  (needs NumPy: configure_backend runs after install)
    from tensor_ops import _config
    return tensor_ops, _config


def configure(show=False, backend=None, priority=None, op=None, strict=None, reset=False, out=sys.stdout) -> int:
    """Apply the options; return the exit status (0 ok, 1 invalid input or I/O error)."""
    try:
        to, cfgmod = _import_tensor_ops()
    except ImportError as exc:
        print(f"configure_backend: cannot import tensor_ops ({exc}); run `pip install -e .` first", file=sys.stderr)
        return 1
    path = cfgmod.write_target()
    changing = any(v is not None for v in (backend, priority, op, strict)) or reset
    try:
        names = to.get_registry().backends()
    except ValueError as exc:  # an invalid file: only --reset can proceed
        if not reset:
            print(f"configure_backend: {exc}", file=sys.stderr)
            return 1
        names = []
    if changing:
        try:
            data = {} if reset else cfgmod.read_raw(path)
        except ValueError as exc:
            print(f"configure_backend: {exc}", file=sys.stderr)
            return 1
        if reset:
            old = {}
            try:
                old = cfgmod.read_raw(path)
            except ValueError:
                pass
            data = {"schema_version": cfgmod.SCHEMA_VERSION,
                    **{k: old[k] for k in ("detected", "built") if isinstance(old.get(k), dict)}}
        try:
            if backend is not None:
                if backend.strip().lower() in ("auto", "none", ""):
                    data.pop("force", None)
                else:
                    tok = cfgmod.check_token(backend, "--backend", cfgmod.known_names(names))
                    avail = _availability(to, tok)
                    if avail is not None and not avail[0]:
                        print(f"configure_backend: --backend={backend!r} is not available here: {avail[1]}; "
                              f"nothing written", file=sys.stderr)
                        return 1
                    data["force"] = tok
            if priority is not None:
                data["priority"] = cfgmod.parse_order(priority, "--priority", cfgmod.known_names(names))
                if data.get("tuning"):
                    print("note: backend.json has a tuning table, which takes precedence over 'priority' "
                          "for the ops it covers; use --op to override one op", file=out)
            if op is not None:
                per = dict(data.get("per_op") or {})
                for part in [p for p in op.split(";") if p.strip()]:
                    if "=" not in part:
                        raise cfgmod.ConfigError(f"--op: {part!r} must look like 'op=backend,backend'")
                    name, order = part.split("=", 1)
                    name = cfgmod.check_op(name.strip(), "--op")
                    if order.strip().lower() in ("", "auto", "none"):
                        per.pop(name, None)
                    else:
                        per[name] = cfgmod.parse_order(order, f"--op {name}", cfgmod.known_names(names))
                data["per_op"] = per
            if strict is not None:
                data["strict"] = bool(strict)
            cfgmod.write_config(data, path, names)
        except ValueError as exc:
            print(f"configure_backend: {exc}; {path} left unchanged", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"configure_backend: cannot write {path}: {exc}; file left unchanged", file=sys.stderr)
            return 1
        print(f"wrote {path}", file=out)
        to.reload_config()
    if show or not changing:
        try:
            to.reload_config()
            info = to.get_backend_info()
        except ValueError as exc:
            print(f"configure_backend: {exc}", file=sys.stderr)
            return 1
        print(f"config file: {info['config'].get('path') or '(none)'} [{info['config'].get('location')}]", file=out)
        for k, v in info["settings"].items():
            if k != "runtime_override":
                print(f"  {k:<14} = {json.dumps(v['value'])}   ({v['source'] if not isinstance(v['source'], dict) else v['source'] or 'default'})", file=out)
        print(f"  tuning         : {info['tuning']['status']}", file=out)
        from tensor_ops._ops import FACADE_OPS
        for op in FACADE_OPS:
            try:
                print(f"  {op:<14} -> {to.get_backend(op)}", file=out)
            except Exception as exc:  # show, don't crash, when e.g. a forced backend is missing
                print(f"  {op:<14} -> error: {exc}", file=out)
    return 0


def _availability(to, tok):
    m = to.get_manager()
    impls = [i for i in m.registry.all_impls() if i.backend == tok]
    if not impls:
        return None
    return m.availability(impls[0])


class ConfigureBackend(Command):
    description = "show or change the backend configuration (backend.json)"
    user_options = [
        ("show", None, "print the effective configuration and where each value came from"),
        ("backend=", None, "force one backend for every op (e.g. cpp); 'auto' clears it"),
        ("priority=", None, "backend order, e.g. \"cpp,cuda,opencl,numpy\""),
        ("op=", None, "per-op order, e.g. \"rms_norm=cpp,numpy;softmax=numpy\" ('op=auto' clears)"),
        ("strict", None, "turn fallback on backend failure into an error"),
        ("no-strict", None, "allow fallback (default)"),
        ("reset", None, "drop user settings and tuning (keeps 'detected' and 'built')"),
    ]
    boolean_options = ["show", "strict", "reset"]
    negative_opt = {"no-strict": "strict"}

    def initialize_options(self):
        self.show = False
        self.backend = None
        self.priority = None
        self.op = None
        self.strict = None
        self.reset = False

    def finalize_options(self):
        pass

    def run(self):
        rc = configure(show=self.show, backend=self.backend, priority=self.priority, op=self.op,
                       strict=self.strict, reset=self.reset)
        if rc:
            raise SystemExit(rc)
