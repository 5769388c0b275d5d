"""Turn benchmark figures into backend.json's ``tuning`` table and merge it into the file.

Per op and dtype, each measured size ranks the impls that passed validation by median time
(a backend within 5 % of a faster one keeps its default-order rank); neighbouring sizes with
the same fastest impl merge into one bucket (a lone size whose winner beats both agreeing
neighbours' by less than 25 % counts as noise) whose ``max_bytes`` is the geometric middle
between the last size in it and the next one; the rest of a bucket's order follows the
geometric mean of each impl's time over the best. Sizes are
the resolver's ``nbytes`` (``x.nbytes``; for matmul ``a.nbytes + b.nbytes``). The NumPy
reference always ends an order; impls excluded by validation never appear, and each bucket's
``why`` says what was measured and what was left out.

Writing reads the file as it is, replaces ``tuning``, merges ``detected`` and leaves every
other key (``per_op``, ``priority``, ``force``, ``strict``, ``disabled``, vendor lists,
``built``) untouched; the result is validated as a whole before the atomic write.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
from pathlib import Path
from typing import Iterable, Optional

from . import _config, _global
from ._policy import cuda_device_id, machine_fingerprint, opencl_device_id

TIE = 1.05
NOISE = 1.25
_RANK = {"cuda": 0, "opencl": 1, "cpp": 2, "numpy": 9}
USER_KEYS = ("priority", "force", "strict", "per_op", "disabled", "allow_vendors", "deny_vendors")


def fingerprint(detected: Optional[dict] = None) -> dict:
    """``machine_fingerprint()`` plus the GPU device ids (checked lazily, when a tuned order
    names that backend: Settings.tuned_gpu_mismatch) and CUDA driver/runtime versions."""
    fp = machine_fingerprint()
    d = detected or {}
    cu = d.get("cuda") or {}
    fp["cuda_devices"] = [cuda_device_id(x.get("name"), x.get("cc")) for x in cu.get("devices", [])] \
        if cu.get("available") else []
    try:   # driver/runtime versions come from the CUDA backend, only when it is available
        mod = _global.builtins().get("cuda")
        if mod is not None and not isinstance(mod, str) and mod.availability()[0]:
            ci = mod.info()
            for k in ("driver_version", "runtime_version"):
                if ci.get(k) is not None:
                    fp[f"cuda_{k}"] = ci[k]
    except Exception:  # the fingerprint must never fail the run
        pass
    cl = d.get("opencl") or {}
    fp["opencl_devices"] = [opencl_device_id(x.get("device"), x.get("platform"), x.get("driver"))
                            for x in cl.get("devices", [])] if cl.get("available") else []
    return fp


def _rank(token: str) -> int:
    return _RANK.get(token, 5)


def rank(rows: list) -> list:
    """Rows (one per impl, with ``median_s``) fastest first; near-ties keep the default order."""
    rows = sorted(rows, key=lambda r: r["median_s"])
    changed = True
    while changed:
        changed = False
        for i in range(len(rows) - 1):
            a, b = rows[i], rows[i + 1]
            if b["median_s"] <= a["median_s"] * TIE and _rank(b["token"]) < _rank(a["token"]):
                rows[i], rows[i + 1] = b, a
                changed = True
    return rows


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)


def exclusions(validation: dict) -> dict:
    """{op: {impl_id: reason}} from :func:`tensor_ops._bench_impls.validate`'s result."""
    out: dict = {}
    for impl_id, rec in validation.items():
        for op, why in rec.get("excluded_ops", {}).items():
            out.setdefault(op, {})[impl_id] = why
    return out


def build_tuning(results: list, validation: dict, copy_gbps: Optional[float], source: str,
                 detected: Optional[dict] = None) -> dict:
    """The ``tuning`` object (schema of ``_config.validate_tuning``) from benchmark rows."""
    excluded = exclusions(validation)
    ops: dict = {}
    for op in sorted({r["op"] for r in results}):
        for dt in sorted({r["dtype"] for r in results if r["op"] == op}):
            buckets = _buckets(op, dt, [r for r in results if r["op"] == op and r["dtype"] == dt],
                               excluded.get(op, {}))
            if buckets:
                ops.setdefault(op, {})[dt] = buckets
    notes = [f"{iid} excluded from {op}: {why}" for op, d in sorted(excluded.items()) for iid, why in d.items()]
    src = source + ("; " + "; ".join(notes) if notes else "; every validated impl passed the fp64 checks")
    return {"fingerprint": fingerprint(detected),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "copy_gbps": round(float(copy_gbps), 3) if copy_gbps else 0.0,
            "source": src[:4000], "ops": ops,
            **({"excluded": excluded} if excluded else {})}


def _buckets(op: str, dt: str, rows: list, excluded: dict) -> list:
    by_size: dict = {}
    for r in rows:
        # only impls timed with out= rank: baselines, fresh-output twins and the ceiling do not
        if r.get("kind", "impl") != "impl" or r["token"] == "reference row" or not r.get("median_s") \
                or r["impl_id"] in excluded:
            continue
        by_size.setdefault(r["nbytes"], []).append(r)
    sizes = sorted(by_size)
    if not sizes:
        return []
    ranked = [rank(by_size[nb]) for nb in sizes]
    win = [rk[0]["token"] for rk in ranked]
    # One size whose winner differs from both neighbours, which agree and are within NOISE of it
    # there, is noise (a busy machine), not a crossover.
    for i in range(1, len(sizes) - 1):
        if win[i - 1] == win[i + 1] != win[i]:
            alt = next((r["median_s"] for r in ranked[i] if r["token"] == win[i - 1]), None)
            if alt is not None and alt <= NOISE * ranked[i][0]["median_s"]:
                win[i] = win[i - 1]
    groups: list = []                      # [winner, [indexes]]
    for i, w in enumerate(win):
        if groups and groups[-1][0] == w:
            groups[-1][1].append(i)
        else:
            groups.append([w, [i]])
    out = []
    prev = -1
    for g, (w, idx) in enumerate(groups):
        order = [w] + _rest_order(w, [ranked[i] for i in idx])
        if "numpy" not in order:
            order.append("numpy")
        last = g == len(groups) - 1
        mb = None if last else max(prev + 1, int(math.sqrt(sizes[idx[-1]] * sizes[groups[g + 1][1][0]])))
        prev = mb if mb is not None else prev
        out.append({"max_bytes": mb, "order": order,
                    "why": _why(sizes[idx[0]], sizes[idx[-1]], [ranked[i] for i in idx], excluded)})
    return out


def _rest_order(winner: str, rankeds: list) -> list:
    """The other impls of a bucket by the geometric mean of their time over the best time."""
    score: dict = {}
    for rk in rankeds:
        best = rk[0]["median_s"]
        for r in rk:
            score.setdefault(r["token"], []).append(math.log(r["median_s"] / best))
    toks = [t for t in score if t != winner]
    return sorted(toks, key=lambda t: (sum(score[t]) / len(score[t]), _rank(t)))


def _why(lo: int, hi: int, rankeds: list, excluded: dict) -> str:
    span = _human(lo) if lo == hi else f"{_human(lo)}..{_human(hi)}"
    parts = []
    for ranked in (rankeds[0], rankeds[-1]) if len(rankeds) > 1 else rankeds[:1]:
        parts.append(f"x {_human(ranked[0]['nbytes'])}: " +
                     ", ".join(f"{r['token']} {r['gbps']:.2f} GB/s" for r in ranked))
    text = f"measured x {span}: fastest first; " + " | ".join(parts)
    if excluded:
        text += "; excluded: " + "; ".join(f"{k} ({v})" for k, v in excluded.items())
    return text


def write_tuning(tuning: dict, detected: Optional[dict] = None, path: Optional[Path] = None,
                 extra_names: Iterable[str] = ()) -> tuple[Path, list]:
    """Merge ``tuning`` (and ``detected``) into the config file atomically.

    Returns (path written, user keys that were kept). Raises ConfigError when the existing
    file or the merged result is invalid; the file is then left untouched.
    """
    path = Path(path) if path else _config.write_target(os.environ)
    data = _config.read_raw(path)
    data["tuning"] = tuning
    if detected:
        old = data.get("detected")
        sec = dict(old) if isinstance(old, dict) else {}
        sec.update(detected)
        data["detected"] = sec
    names = list(extra_names) or _global.get_registry().backends()
    _config.write_config(data, path, names)
    return path, [k for k in USER_KEYS if data.get(k) not in (None, [], {})]


def serving(ops: Iterable[str], sizes: dict) -> list[dict]:
    """After ``reload_config()``: which impl serves each op (float32) at each size, and why.

    ``sizes`` maps a label to ``x.nbytes``. Uses the manager's resolution and
    ``get_backend_info()`` (tuning status, per-op source).
    """
    from ._info import get_backend_info
    m = _global.manager()
    info = get_backend_info()
    out = []
    for op in ops:
        at = []
        for label, nb in sizes.items():
            res = m.resolve(op, None, "facade", "float32", nb)
            first = res.candidates[0].impl_id if res.candidates else None
            at.append({"size": label, "nbytes": nb, "impl": first, "source": res.source})
        entry = info.get("ops", {}).get(op, {})
        out.append({"op": op, "at": at, "selected_large": entry.get("selected"),
                    "source": entry.get("source"), "tuning_status": info.get("tuning", {}).get("status")})
    return out
