"""OpenCL backend: ``opencl_ext/*.cl`` kernels run through pyopencl.

One context, queue and set of programs per process, created on first use for the chosen
device and cached; program binaries are cached on disk. fp16 is storage only (core
``vload_half``/``vstore_half``, fp32 math), so it works on every device; ``cl_khr_fp16`` is
reported but not needed. Host (NumPy) arrays go to OpenCL only when an order names it
(``device_only``: a GPU needs copies, and on a CPU device (PoCL) the C++ backend is faster);
``pyopencl.array`` arrays are always served here, and stay on their device.

The package, one job per module:

- :mod:`.settings`: every environment variable it reads (``TENSOR_OPS_OPENCL_*``);
- :mod:`.state`: the process-wide state (device, counters, host-array mode);
- :mod:`.programs`: sources, build options, the on-disk binary cache;
- :mod:`.device`: device selection; per device its queue, programs, kernels, buffer pool;
- :mod:`.launch`: storage variants, grids, host and device launches;
- :mod:`.ops`: the op functions (named after the ops) and their ``supports`` checks;
- here: the :data:`BACKEND` (the contract), its probe and info, and the public helpers.

Importing it imports NumPy only; pyopencl is imported by the probe (``availability()``).
"""
from __future__ import annotations

import numpy as np

from .._contract import Backend, Unavailable, ops_from
from . import device, launch, ops, programs, settings, state  # noqa: F401 - the package's parts

# the op functions under the op names (the name rule) and the helpers build_opencl and tests use
from .device import all_devices, select_device  # noqa: F401
from .ops import (add_layer_norm, add_rms_norm, geglu, gelu, layer_norm, relu, rms_norm, rope, silu,  # noqa: F401
                  softmax, swiglu)
from .programs import (FAMILIES, build_options, cache_dir, cache_path, load_program, local_size,  # noqa: F401
                       program_source, source_dir, source_hash)

NAME = "opencl"


def _probe() -> str:
    """Import pyopencl, create the device (programs from the cache or built), run two
    kernels on known inputs and check their numbers."""
    try:
        import pyopencl  # noqa: F401
    except Exception as exc:
        raise Unavailable(f"pyopencl not importable ({exc}); pip install 'tensor_ops[opencl]'") from None
    try:
        st = device.get()
        x = (np.arange(3 * 7, dtype=np.float32).reshape(3, 7) - 10.0) / 4.0
        w = np.linspace(0.5, 1.5, 7, dtype=np.float32)
        x64 = x.astype(np.float64)
        err = max(float(np.abs(rms_norm(x, w, 1e-6, None)
                               - x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w).max()),
                  float(np.abs(silu(x, None) - x64 / (1.0 + np.exp(-x64))).max()))
    except Exception as exc:   # the backend failure carries the reason (e.g. the build log)
        raise Unavailable(str(exc)) from None
    if not err < 1e-5:
        raise Unavailable(f"probe kernel on {st.device.name.strip()!r} returned wrong numbers "
                          f"(max abs error {err:.3g})")
    return f"{st.device.name.strip()} ({st.device.platform.name.strip()})"


def availability() -> tuple[bool, str]:
    """(True, device) or (False, reason); decided once, never raises."""
    return BACKEND.availability()


def info() -> dict:
    """Platforms, devices, the chosen device, pyopencl version, cache location and counts;
    never raises (shown even when the backend is unavailable: it tells why)."""
    out: dict = {"platforms": [], "chosen": None, "cache": {"dir": str(cache_dir() or "off"), **state.STATS}}
    try:
        import pyopencl as cl
        out["pyopencl"] = cl.VERSION_TEXT
        plats: dict = {}
        for pi, di, d in all_devices():
            plats.setdefault(pi, {"index": pi, "name": d.platform.name.strip(),
                                  "version": d.platform.version.strip(), "devices": []})
            plats[pi]["devices"].append({
                "index": f"{pi}:{di}", "name": d.name.strip(),
                "type": cl.device_type.to_string(d.type),  # type: ignore[operator]  # (the stub's enum)
                "version": d.version.strip(),
                "driver": d.driver_version.strip(), "compute_units": d.max_compute_units,
                "global_mem": d.global_mem_size, "cl_khr_fp16": "cl_khr_fp16" in d.extensions})
        out["platforms"] = list(plats.values())
    except Exception as exc:
        out["error"] = str(exc)
    st = state.device
    if st is not None:
        out["chosen"] = {"name": st.device.name.strip(), "platform": st.device.platform.name.strip(),
                         "local_size": st.lws, "host_mode": state.host_mode or st.host_mode,
                         "fp16": "storage (vload_half), fp32 math", "cl_khr_fp16": st.fp16_ext,
                         "programs": st.program_status, "load_ms": round(st.load_ms, 2)}
    return out


def get_opencl_info() -> dict:
    """Availability, array kinds, ops, platforms, devices, the chosen device, fp16 support,
    cache location and hit counts.

    Decides availability (creating the device state) if that has not happened yet.

    Example:
        >>> from tensor_ops.backends import opencl
        >>> opencl.get_opencl_info()["available"] in (True, False)
        True
    """
    out = BACKEND.describe()
    if not out["available"]:
        out.update(info())
    return out


def get_queue():
    """The backend's pyopencl CommandQueue (create pyopencl arrays on it to stay on device)."""
    return device.get().queue


def device_ids() -> list:
    """Every OpenCL device of every platform, named as a tuning fingerprint records them
    (``_policy.opencl_device_id``): the resolver compares the two before following a tuned
    order that names opencl."""
    import pyopencl as cl
    from tensor_ops._policy import opencl_device_id
    return [opencl_device_id(d.name, p.name, d.driver_version) for p in cl.get_platforms() for d in p.get_devices()]


def set_host_mode(mode: str | None) -> None:
    """How host (NumPy) arrays reach the device: ``"hostptr"`` (wrapped in place, the default
    on CPU and unified-memory devices), ``"copy"`` (pooled device buffers, the default
    elsewhere) or ``None`` (the device's default). The benchmark compares the two."""
    if mode not in (None, "hostptr", "copy"):
        raise ValueError(f"set_host_mode: mode must be None, 'copy' or 'hostptr', got {mode!r}")
    state.host_mode = mode


def build_all(force: bool = False) -> list[dict]:
    """Build (or load from cache) every program for every device; used by build_opencl.

    Raises the backend failure (with the build log) of the first program that fails."""
    import pyopencl as cl
    results = []
    for pi, di, dev in all_devices():
        ctx = cl.Context([dev])
        progs = {}
        for fam in FAMILIES:
            _, status, secs = load_program(ctx, dev, fam, force_build=force)
            progs[fam] = {"status": status, "seconds": round(secs, 3)}
        results.append({"index": f"{pi}:{di}", "device": dev.name.strip(),
                        "platform": dev.platform.name.strip(), "driver": dev.driver_version.strip(),
                        "local_size": local_size(dev), "programs": progs})
    return results


_OPS = ops_from(vars(ops))
BACKEND = Backend(name=NAME, ops=_OPS, probe=_probe, array_kinds=("numpy", "torch-cpu", "pyopencl"),
                  dtypes=("float16", "float32"), device_only=True,
                  supports={op: ops.supports_for(op) for op in _OPS}, info=info,
                  faults=("build", "device_lost", "oom"))


def _reset_for_tests() -> None:
    """Forget the device state, availability and counters (tests only)."""
    state.reset()
    BACKEND.availability.reset()
