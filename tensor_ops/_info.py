"""get_backend_info(): why each op runs where it runs, as a dict and as a readable table."""
from __future__ import annotations

from typing import Any

from . import _env, _global, _version
from ._errors import ConfigError
from ._policy import DEFAULT_ORDER


def _backend_info(name: str, mod: Any, m) -> dict:
    if isinstance(mod, str):
        return {"available": False, "reason": mod, "kind": "default"}
    impls = [i for i in m.registry.all_impls() if i.backend == name]
    kind = impls[0].kind.value if impls else "default"
    ok, reason = (m.availability(impls[0]) if impls else (False, "registers no ops"))
    out = {"available": ok, "reason": None if ok else reason, "kind": kind,
           "disabled": m.settings.disabled.get(name) if m.settings else None,
           "ops": sorted({i.op_name for i in impls if i.api == "facade"})}
    backend = getattr(mod, "BACKEND", None)
    if backend is not None:
        out["array_kinds"] = list(backend.array_kinds)
        out["device_only"] = backend.device_only
    if ok and hasattr(mod, "info"):
        try:
            out["info"] = mod.info()
        except Exception as exc:  # info must never break introspection
            out["info"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def torch_status() -> dict:
    """Whether the torch ops (autograd, torch.compile) are registered, without importing torch:
    tensor_ops.torch's own status once it was imported, else what the installed torch allows."""
    import importlib.util
    import sys
    mod = sys.modules.get("tensor_ops.torch")
    if mod is not None:
        return mod.status()
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return {"ok": False, "torch": None,
                "reason": "torch is not installed: torch tensors, autograd and torch.compile need it"}
    from importlib import metadata
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        version = "unknown"
    from ._torch_facade import MIN_TORCH, version_tuple
    if version != "unknown" and version_tuple(version) < MIN_TORCH:
        return {"ok": False, "torch": version, "reason": f"torch {version} is too old: tensor_ops.torch needs "
                                                         f"torch >= {'.'.join(map(str, MIN_TORCH))}"}
    return {"ok": None, "torch": version, "reason": "not registered yet: on the first torch tensor that needs "
                                                    "autograd, or `import tensor_ops.torch`"}


def get_backend_info() -> dict:
    """Everything about the current selection.

    Returns a dict with: ``version``; ``config`` (path, location, error if invalid);
    ``settings`` (value and source of each); ``backends`` (available, reason, kind, info);
    ``vendors`` (non-built-in impls); ``torch`` (whether the torch ops for autograd and
    torch.compile are registered, or why not); ``ops`` (order, selected impl, calls, fallbacks,
    source, and ``native_entry`` when plain calls go straight to a native entry, see
    CONTRIBUTING.md "The fast path for plain calls"); ``plugins`` (loaded/failed with reasons);
    ``tuning`` status; ``env`` (the project's variables that are set: every TENSOR_OPS_* /
    TE_* name declared in ``_env.py``).

    Example:
        >>> import tensor_ops as to
        >>> sorted(to.get_backend_info()["backends"])
        ['cpp', 'cuda', 'cupy', 'numpy', 'opencl']
    """
    info: dict = {"version": _version.__version__,
                  "env": _env.set_in()}
    try:
        m = _global.manager()
    except ConfigError as exc:
        info["config"] = {"error": str(exc)}
        return info
    s = m.settings
    f = s.file
    info["config"] = {"path": str(f.path) if f.path else None, "location": f.location}
    info["settings"] = {
        "force": {"value": s.force or f.force,
                  "source": s.force_source if s.force else ("backend.json 'force'" if f.force else "default")},
        "priority": {"value": s.env_priority or f.priority or list(DEFAULT_ORDER),
                     "source": s.env_priority_source if s.env_priority else
                     ("backend.json 'priority'" if f.priority else "built-in default")},
        "per_op": {"value": {**f.per_op, **s.env_per_op},
                   "source": s.env_per_op_source or ("backend.json 'per_op'" if f.per_op else "default")},
        "strict": {"value": s.strict, "source": s.strict_source},
        "disabled": {"value": sorted(s.disabled), "source": dict(s.disabled)},
        "allow_vendors": {"value": s.allow_vendors, "source": s.allow_source},
        "deny_vendors": {"value": s.deny_vendors, "source": s.deny_source},
        "fallback": {"value": s.fallback, "source": s.fallback_source},
        "log_level": {"value": s.log_level, "source": s.log_source},
        "runtime_override": {"set_backend": _global._state.global_backend,
                             "use_backend": _global._state.context_backend.get()},
    }
    info["tuning"] = {"status": s.tuning_status, "ops": sorted(s.tuning_ops),
                      # tuned orders not followed because a GPU backend sees other devices now
                      "gpu_mismatch": {b: why for b, why in s.gpu_mismatch_notes.items() if why}}
    info["backends"] = {name: _backend_info(name, mod, m) for name, mod in _global.builtins().items()}
    vendors: dict = {}
    for impl in m.registry.all_impls():
        if impl.backend not in info["backends"]:
            v = vendors.setdefault(impl.backend, {"kind": impl.kind.value, "vendor": impl.vendor, "ops": []})
            ok, reason = m.availability(impl)
            v["available"], v["reason"] = ok, (None if ok else reason)
            v["ops"].append(impl.op_name)
    info["vendors"] = vendors
    info["ops"] = m.op_info()
    info["plugins"] = {"loaded": [p for p in _global.plugins() if p["ok"]],
                       "failed": [p for p in _global.plugins() if not p["ok"]]}
    info["torch"] = torch_status()
    return info


def format_info(info: dict) -> str:
    """Plain-text tables for ``python -m tensor_ops info``."""
    lines = [f"tensor_ops {info['version']}"]
    cfg = info.get("config", {})
    if "error" in cfg:
        return "\n".join(lines + [f"configuration error: {cfg['error']}"])
    lines.append(f"config: {cfg.get('path') or '(none: built-in defaults)'}  [{cfg.get('location')}]")
    lines.append(f"tuning: {info['tuning']['status']}")
    lines.append("")
    lines.append(f"{'setting':<16} {'value':<40} source")
    for k, v in info["settings"].items():
        if k == "runtime_override":
            continue
        val = v["value"]
        lines.append(f"{k:<16} {str(val):<40} {v['source']}")
    ro = info["settings"]["runtime_override"]
    lines.append(f"{'set_backend':<16} {str(ro['set_backend']):<40} runtime")
    lines.append("")
    lines.append(f"{'backend':<10} {'available':<10} {'array kinds':<40} details")
    for name, b in info["backends"].items():
        det = b.get("reason") or ", ".join(f"{k}={v}" for k, v in (b.get("info") or {}).items()
                                           if not isinstance(v, (dict, list)))[:100]
        kinds = ",".join(b.get("array_kinds") or []) + (" (host: when named)" if b.get("device_only") else "")
        lines.append(f"{name:<10} {'yes' if b['available'] else 'no':<10} {kinds:<40} {det}")
    ts = info.get("torch") or {}
    state = {True: "registered", False: "unavailable", None: "not registered yet"}[ts.get("ok")]
    lines.append(f"torch ops (autograd, torch.compile): {state}"
                 + (f" (torch {ts['torch']})" if ts.get("torch") else "")
                 + (f": {ts['reason']}" if ts.get("reason") else "")
                 + (f"; compile: {'ok' if ts['compile'].get('ok') else ts['compile'].get('reason')}"
                    if isinstance(ts.get("compile"), dict) else ""))
    for name, v in info["vendors"].items():
        lines.append(f"{name:<10} {'yes' if v['available'] else 'no':<10} {v['kind']} ({len(v['ops'])} ops)")
    lines.append("")
    lines.append("op selection (resolved so far in this process):")
    lines.append(f"{'op':<22} {'selected':<18} {'calls':<24} source / order")
    ops = info["ops"]
    if not ops:
        lines.append("  (no op resolved yet; `python -m tensor_ops info` resolves the facade ops)")
    for op, o in sorted(ops.items()):
        calls = ", ".join(f"{k}:{n}" for k, n in o.get("calls", {}).items()) or "-"
        lines.append(f"{op:<22} {str(o.get('selected')):<18} {calls:<24} {o.get('source')}: {o.get('order')}")
        if o.get("native_entry"):
            lines.append(f"{'':<22} plain calls: {o['native_entry']} (validates in C, declines the rest)")
        for iid, why in o.get("excluded", {}).items():
            lines.append(f"{'':<22} excluded {iid}: {why}")
        if o.get("fallbacks"):
            lines.append(f"{'':<22} fallbacks: {o['fallbacks']} {o.get('failures', {})}")
    pl = info["plugins"]
    if pl["loaded"] or pl["failed"]:
        lines.append("")
        for p in pl["loaded"]:
            lines.append(f"plugin {p['name']} ({p['source']}): {p.get('impl_ids')}")
        for p in pl["failed"]:
            lines.append(f"plugin {p['name']} ({p['source']}) FAILED: {p['reason']}")
    return "\n".join(lines)


def backend_info(name: str) -> dict:
    """``get_<name>_info()`` of a built-in backend (the name rule): availability with the
    reason, the array kinds it serves, its ops and what the backend reports about itself."""
    mod = _global.builtins().get(name)
    if mod is None:
        raise ValueError(f"unknown backend {name!r}; built-in backends: {sorted(_global.builtins())}")
    if isinstance(mod, str):
        return {"available": False, "reason": mod}
    backend = getattr(mod, "BACKEND", None)
    if backend is not None:
        return backend.describe()
    return getattr(mod, f"get_{name}_info")()


def get_numpy_info() -> dict:
    """The NumPy reference backend: availability, array kinds, ops, versions."""
    return backend_info("numpy")


def get_cpp_info() -> dict:
    """The C++ SIMD backend: availability (or why not), ISA variants, threads, flags."""
    return backend_info("cpp")


def get_opencl_info() -> dict:
    """The OpenCL backend: availability (or why not), device, program cache, layout."""
    return backend_info("opencl")


def get_cuda_info() -> dict:
    """The CUDA backend: availability (or why not), devices, fatbin or NVRTC."""
    return backend_info("cuda")


def get_cupy_info() -> dict:
    """The CuPy reference backend (float64 and matmul on device arrays): availability (or why not)."""
    return backend_info("cupy")
