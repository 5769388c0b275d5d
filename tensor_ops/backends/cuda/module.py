"""The CUDA kernels as one loaded module: the fatbin (``python setup.py build_cuda``) or, when
there is none, it is stale (``cuda_ext/`` changed since it was built) or it has no code for
this GPU, the same sources compiled by NVRTC through CuPy (cached by CuPy). Loaded once per
process with ``cupy.RawModule``; kernels are looked up by their exported symbol,
``to_<op>_<f32|f16|bf16>`` (the project's one kernel symbol prefix, shared with OpenCL).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tensor_ops._errors import backend_failure

from . import state

_PKG = Path(__file__).resolve().parents[2]          # tensor_ops/
FATBIN_PATH = _PKG / "_cuda_kernels.fatbin"
FATBIN_RECORD = _PKG / "_cuda_kernels.fatbin.json"
SOURCE_DIRS = (_PKG.parent / "cuda_ext", _PKG / "cuda_ext")   # source checkout, packaged copy
HEADER = "common.cuh"
NVRTC_OPTIONS = ("-std=c++17",)
#: every exported kernel is ``to_<name>`` (cuda_ext/common.cuh; _build/cuda_build.SYMBOL_PREFIX)
SYMBOL_PREFIX = "to_"
PROBE_SYMBOL = SYMBOL_PREFIX + "rms_norm_f32"

#: where the kernels came from: "fatbin" or "nvrtc" (and why not the fatbin)
INFO: dict = {"source": None, "fatbin": str(FATBIN_PATH), "nvrtc_reason": None}
KERNELS: dict = {}      # (device, kernel name) -> CuPy kernel
_MODULE = None


def _fail(msg: str, cause: BaseException | None = None):
    return backend_failure("cuda", msg, cause)


def source_dir() -> Path | None:
    for d in SOURCE_DIRS:
        if (d / HEADER).is_file():
            return d
    return None


def nvrtc_source(src_dir: Path | None = None) -> str:
    """All kernels as one NVRTC translation unit: common.cuh inlined, then every .cu."""
    d = src_dir or source_dir()
    if d is None:
        raise _fail(f"CUDA sources not found (looked in {', '.join(map(str, SOURCE_DIRS))})")
    parts = [(d / HEADER).read_text()]
    for p in sorted(d.glob("*.cu")):
        text = p.read_text().replace(f'#include "{HEADER}"', f"// {HEADER} inlined above")
        parts.append(f"\n// ---- {p.name}\n{text}")
    return "\n".join(parts)


def sources_digest(d: Path) -> str:
    """The hash build_cuda records (``sources_sha256``): names and contents of the sources."""
    h = hashlib.sha256()
    for p in [d / HEADER, *sorted(d.glob("*.cu"))]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def fatbin_record() -> dict:
    """What build_cuda wrote next to the fatbin (archs, nvcc version, source hash), or {}."""
    try:
        return json.loads(FATBIN_RECORD.read_text())
    except (OSError, ValueError):
        return {}


def fatbin_problem(cc: int) -> str | None:
    """Why the fatbin can't serve a device of compute capability ``cc`` (e.g. 90), or None."""
    if not FATBIN_PATH.is_file():
        return f"no fatbin at {FATBIN_PATH} (run `python setup.py build_cuda`)"
    rec = fatbin_record()
    d = source_dir()
    if rec.get("sources_sha256") and d is not None and rec["sources_sha256"] != sources_digest(d):
        return "the fatbin is stale (cuda_ext/ changed since it was built; rerun `python setup.py build_cuda`)"
    sms = [int(a[3:]) for a in rec.get("archs", []) if a[3:].isdigit()]
    ptx = rec.get("ptx", "compute_0")[8:]
    if sms and cc not in sms and not (ptx.isdigit() and int(ptx) <= cc):
        return f"the fatbin has no code for sm_{cc} (it holds {', '.join(rec['archs'])} + {rec.get('ptx')})"
    return None


def load_module():
    """The RawModule with every kernel, from the fatbin or else NVRTC; loaded once."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    with state.LOCK:
        if _MODULE is not None:
            return _MODULE
        import cupy
        cc = int(cupy.cuda.Device().compute_capability)
        reason = fatbin_problem(cc)
        mod = None
        if reason is None:
            try:
                mod = cupy.RawModule(path=str(FATBIN_PATH))
                mod.get_function(PROBE_SYMBOL)  # forces the load: no image for this GPU fails here
                INFO.update(source="fatbin", nvrtc_reason=None)
            except Exception as exc:
                reason = f"the fatbin did not load on sm_{cc}: {type(exc).__name__}: {exc}"
                mod = None
        if mod is None:
            try:
                mod = cupy.RawModule(code=nvrtc_source(), options=NVRTC_OPTIONS)
                mod.get_function(PROBE_SYMBOL)
            except Exception as exc:
                raise _fail(f"{reason}; NVRTC compilation of cuda_ext/ failed too: "
                            f"{type(exc).__name__}: {exc}", exc) from exc
            INFO.update(source="nvrtc", nvrtc_reason=reason)
        _MODULE = mod
        return mod


def kernel(name: str, dev: int = 0):
    """The kernel ``to_<name>`` (e.g. ``name="rms_norm_f32"``) for device ``dev`` (the caller
    has made it current); cached."""
    if state.fault() == "launch":
        raise _fail(f"injected launch failure for {SYMBOL_PREFIX}{name} "
                    f"(tensor_ops.backends.cuda.BACKEND.inject_fault('launch'))")
    k = KERNELS.get((dev, name))
    if k is None:
        k = KERNELS[(dev, name)] = load_module().get_function(SYMBOL_PREFIX + name)
    return k


def reset() -> None:
    """Forget the loaded module and kernels (tests only)."""
    global _MODULE
    with state.LOCK:
        _MODULE = None
        KERNELS.clear()
        INFO.update(source=None, nvrtc_reason=None)
