"""CUDA backend: ``cuda_ext/*.cu`` kernels launched through CuPy.

The kernels come from ``tensor_ops/_cuda_kernels.fatbin`` (``python setup.py build_cuda``),
or from NVRTC when the fatbin is missing, stale or has no code for the GPU (:mod:`.module`);
:func:`get_cuda_info` says which. CuPy arrays and torch CUDA tensors are computed in place,
on the caller's stream (:mod:`.arrays`); NumPy input is copied to the GPU only when an order
names cuda (``device_only``), never by default. The kernels take float32, float16 and
bfloat16; float64 and matmul on device arrays are the CuPy reference backend's
(:mod:`tensor_ops.backends.cupy`, ``reference.cupy``).

The package, one job per module:

- :mod:`.settings`: every environment variable it reads (``TE_FL_SKIP_CUDA``);
- :mod:`.state`: the process-wide state (host-copy thresholds, SM counts, torch streams);
- :mod:`.module`: the fatbin / NVRTC module and kernel lookup;
- :mod:`.arrays`: CuPy / torch CUDA array interop, the device and stream of a call, launch shapes;
- :mod:`.ops`: the op functions (named after the ops) and their ``supports`` checks;
- here: the :data:`BACKEND` (the contract), its probe and info, and the public helpers.

Importing it imports neither cupy nor torch; the probe (``availability()``) does, once.
"""
from __future__ import annotations

import numpy as np

from .._contract import Backend, Unavailable, ops_from
from . import arrays, module, ops, settings, state  # noqa: F401 - the package's parts
from .module import FATBIN_PATH, FATBIN_RECORD, NVRTC_OPTIONS, fatbin_record, nvrtc_source, source_dir  # noqa: F401
from .ops import (add_layer_norm, add_rms_norm, geglu, gelu, layer_norm, relu, rms_norm, rope, silu,  # noqa: F401
                  softmax, swiglu)

NAME = "cuda"
CUPY_MISSING = arrays.CUPY_MISSING
#: {op: minimum x.nbytes} for NumPy input (the same dict as ``state.HOST_COPY_MIN_BYTES``;
#: this name is what the benchmark engine saves and restores)
_HOST_COPY_MIN_BYTES = state.HOST_COPY_MIN_BYTES


def _probe() -> str:
    """TE_FL_SKIP_CUDA, CuPy, a device, the kernel module; then rms_norm on known inputs
    through its scalar (odd width) and vectorised paths, checked against NumPy."""
    if settings.skip_requested():
        raise Unavailable("disabled by TE_FL_SKIP_CUDA")
    cupy, count = arrays.cupy_with_device()
    try:
        module.load_module()
    except Exception as exc:
        raise Unavailable(f"CUDA kernels could not be loaded: {exc}") from None
    rng = np.random.default_rng(0)
    for rows, n in ((3, 37), (2, 64), (2, 1000), (1, 9001)):  # warp/block, vector/scalar, cached/streaming
        xh = rng.standard_normal((rows, n)).astype(np.float32)
        wh = rng.standard_normal(n).astype(np.float32)
        try:
            y = rms_norm(cupy.asarray(xh), cupy.asarray(wh), 1e-6, None).get()
        except Exception as exc:
            raise Unavailable(f"probe kernel {module.PROBE_SYMBOL} {rows}x{n} failed: "
                              f"{type(exc).__name__}: {exc}") from None
        x64 = xh.astype(np.float64)
        err = float(np.max(np.abs(y - x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * wh)))
        if not err <= 1e-4:
            raise Unavailable(f"probe kernel {module.PROBE_SYMBOL} {rows}x{n} returned wrong numbers "
                              f"(max error {err:.3g})")
    d = cupy.cuda.Device(0)
    return f"{count} device(s), device 0 sm_{d.compute_capability}; kernels from {module.INFO['source']}"


def availability() -> tuple[bool, str]:
    """(True, description) or (False, reason); decided once, never raises."""
    return BACKEND.availability()


def set_host_copy_policy(op: str, min_bytes: int | None) -> None:
    """Keep NumPy input of ``op`` smaller than ``min_bytes`` off the GPU even where an order
    names cuda; ``None`` removes the threshold (tests and tuning experiments use it)."""
    if op not in OPS:
        raise ValueError(f"set_host_copy_policy: unknown op {op!r}; choose from {sorted(OPS)}")
    if min_bytes is None:
        state.HOST_COPY_MIN_BYTES.pop(op, None)
    elif isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"set_host_copy_policy: min_bytes must be an int >= 0 or None, got {min_bytes!r}")
    else:
        state.HOST_COPY_MIN_BYTES[op] = min_bytes


def device_ids() -> list:
    """Every CUDA device, named as a tuning fingerprint records them
    (``_policy.cuda_device_id``); see opencl.device_ids."""
    import cupy
    from tensor_ops._policy import cuda_device_id
    out = []
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        p = cupy.cuda.runtime.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        out.append(cuda_device_id(name, f"{p['major']}.{p['minor']}"))
    return out


def info() -> dict:
    """Fatbin path and archs, where the kernels came from (NVRTC fallback and why), CuPy,
    runtime and driver versions, devices; never raises (shown even when unavailable)."""
    rec = fatbin_record()
    out: dict = {
        "fatbin": {"path": str(FATBIN_PATH), "exists": FATBIN_PATH.is_file(),
                   "archs": rec.get("archs"), "ptx": rec.get("ptx"),
                   "nvcc_version": rec.get("nvcc_version"), "built_at": rec.get("built_at")},
        "kernels_from": module.INFO["source"],
        "nvrtc_fallback": module.INFO["source"] == "nvrtc",
        "nvrtc_reason": module.INFO["nvrtc_reason"],
        "host_copy_min_bytes": dict(state.HOST_COPY_MIN_BYTES),
        "devices": [],
    }
    try:
        import cupy
        out["cupy"] = cupy.__version__
    except Exception:
        out["cupy"] = None
        return out
    try:
        rt = cupy.cuda.runtime
        out["runtime_version"] = rt.runtimeGetVersion()
        out["driver_version"] = rt.driverGetVersion()
        for i in range(rt.getDeviceCount()):
            p = rt.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            out["devices"].append({"index": i, "name": name, "compute_capability": f"{p['major']}.{p['minor']}",
                                   "memory_bytes": int(p["totalGlobalMem"]),
                                   "multiprocessors": int(p["multiProcessorCount"])})
    except Exception as exc:
        out["device_error"] = f"{type(exc).__name__}: {exc}"
    return out


def get_cuda_info() -> dict:
    """Availability, array kinds, ops, devices, runtime/driver versions, fatbin path and
    archs, NVRTC fallback; never raises.

    Example:
        >>> from tensor_ops.backends import cuda
        >>> cuda.get_cuda_info()["available"] in (True, False)
        True
    """
    out = BACKEND.describe()
    if not out["available"]:
        out.update(info())
    return out


_OPS = ops_from(vars(ops))
#: the ops with CUDA kernels (the benchmark engine iterates them for set_host_copy_policy)
OPS = tuple(_OPS)
BACKEND = Backend(name=NAME, ops=_OPS, probe=_probe, array_kinds=("cupy", "torch-cuda", "numpy", "torch-cpu"),
                  dtypes=("bfloat16", "float16", "float32"), device_only=True,
                  supports={op: ops.supports_for(op) for op in _OPS}, info=info, faults=("launch", "oom"))


def _reset_for_tests() -> None:
    """Forget availability and the loaded kernels (tests only)."""
    BACKEND.availability.reset()
    module.reset()
