"""The OpenCL programs: sources (``opencl_ext/``), build options and the on-disk binary cache.

One program per kernel family, named like the files of every backend (``norm``, ``softmax``,
``activation``, ``rope``; ``common.cl`` and ``dtype.cl`` are included in each). Binaries are
cached on disk (``TENSOR_OPS_OPENCL_CACHE``, else the user cache dir; ``off``: not at all) as
``<family>-<device tag>-<key>.bin``: the device tag hashes the device and its driver, the
key hashes the full program source and the build options, so an edited or renamed source
never loads an old binary. Each file carries a SHA-256 of its payload: a corrupt entry is
detected, deleted and rebuilt, never loaded.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from tensor_ops._errors import backend_failure

from . import settings, state

FAMILIES = ("norm", "softmax", "activation", "rope")
CACHE_FORMAT = b"TOCLBIN1"  # magic + sha256(payload) + payload
#: every exported kernel is ``to_<name><storage suffix>`` (common.cl KN; the CUDA kernels share it)
SYMBOL_PREFIX = "to_"

_I32, _I64, _F32 = np.int32, np.int64, np.float32
#: kernel name (without prefix and storage suffix) -> (family, pyopencl scalar arg dtypes);
#: row kernels take the row count last: on CPUs each work-item loops over its rows
KERNELS = {
    "rms_norm": ("norm", [None, None, None, _I32, _F32, _I32]),
    "layer_norm": ("norm", [None, None, None, None, _I32, _F32, _I32, _I32]),
    "add_rms_norm": ("norm", [None, None, None, None, None, _I32, _F32, _I32]),
    "add_layer_norm": ("norm", [None, None, None, None, None, None, _I32, _F32, _I32, _I32]),
    "softmax": ("softmax", [None, None, _I32, _I32]),
    **{k: ("activation", [None, None, _I64]) for k in ("silu", "relu", "gelu", "gelu_tanh")},
    **{k: ("activation", [None, None, _I32, _I32, _I32]) for k in ("swiglu", "geglu", "geglu_tanh")},
    **{k: ("rope", [None, None, None, None, _I32, _I32, _I32, _I32]) for k in ("rope", "rope_interleaved")},
}


def _fail(msg: str, cause: BaseException | None = None):
    return backend_failure("opencl", msg, cause)


# ----------------------------------------------------------------------------- sources
def source_dir() -> Path:
    """The directory holding the .cl sources (source checkout, or packaged copy)."""
    env = settings.source_dir()
    here = Path(__file__).resolve()       # tensor_ops/backends/opencl/programs.py
    checkout, packaged = here.parents[3] / "opencl_ext", here.parents[2] / "opencl_ext"
    for cand in ([Path(env)] if env else []) + [checkout, packaged]:
        if (cand / "common.cl").is_file():
            return cand
    raise _fail(f"OpenCL sources not found (looked in {checkout} and {packaged}); reinstall tensor_ops")


def program_source(family: str) -> str:
    """Full source of one program: common.cl, then dtype.cl + body for fp32 and fp16."""
    d = source_dir()
    common = (d / "common.cl").read_text()
    dtype = (d / "dtype.cl").read_text()
    body = (d / f"{family}.cl").read_text()
    parts = [common]
    for storage in (0, 1, 2, 3):   # _f32a, _f32, _f16, _f32n (see dtype.cl)
        parts.append(f"\n#undef STORAGE\n#define STORAGE {storage}\n{dtype}\n{body}\n")
    src = "".join(parts)
    if state.fault() == "build":
        src += "\n#error injected build failure (tensor_ops.backends.opencl.BACKEND.inject_fault('build'))\n"
    return src


def source_hash() -> str:
    h = hashlib.sha256()
    for fam in FAMILIES:
        h.update(program_source(fam).encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------- build options
def is_cpu(device) -> bool:
    import pyopencl as cl
    return bool(device.type & cl.device_type.CPU)


def local_size(device) -> int:
    """The one fixed local size of a device (a power of two): TENSOR_OPS_OPENCL_LWS, else
    4 on CPUs, 256 on GPUs; capped by the device.

    PoCL runs a group's work-items one after another in a loop on one thread, so on a CPU
    a group is only a unit of scheduling (the CPU layout of common.cl has no reductions
    across items): measured on PoCL 3.0 (8192x4096 fp32) with the earlier row-per-group
    layout, rms_norm took ~10 ms at 4, ~24 ms at 16, ~47 ms at 64. PoCL 3.0's compiler
    aborts on the (GPU layout's) barrier loops at 1 and 2, so 4 is the floor."""
    want = settings.local_size() or (4 if is_cpu(device) else 256)
    want = max(want, 4)
    lws = 1
    while lws * 2 <= min(want, device.max_work_group_size):
        lws *= 2
    return lws


def cpu_layout(device) -> bool:
    """Loop layout of the kernels (common.cl): on CPUs each work-item streams whole rows (or
    one contiguous chunk), with no work-group reduction; on GPUs one work-group per row with
    a local-memory reduction and strided (coalesced) loops. TENSOR_OPS_OPENCL_LAYOUT=cpu|gpu
    overrides (tests run the GPU layout on PoCL with it)."""
    forced = settings.layout()
    return forced == "cpu" if forced else is_cpu(device)


def build_options(device) -> str:
    return f"-DLWS={local_size(device)} -DCPU_LAYOUT={int(cpu_layout(device))}"


# ----------------------------------------------------------------------------- binary cache
def cache_dir() -> Path | None:
    """Where program binaries are cached; None when ``TENSOR_OPS_OPENCL_CACHE=off``."""
    env = settings.cache_dir()
    if env is False:
        return None
    if env:
        return Path(env)
    try:
        import platformdirs
        return Path(platformdirs.user_cache_dir("tensor_ops")) / "opencl"
    except ImportError:
        return Path.home() / ".cache" / "tensor_ops" / "opencl"


def device_tag(device) -> str:
    """Short hash of what identifies a device and its compiler (name, driver, versions)."""
    p = device.platform
    parts = [p.name, p.version, device.name, device.vendor, device.version, device.driver_version]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def cache_path(device, family: str, src: str, options: str) -> Path | None:
    """``<cache>/<family>-<device tag>-<hash of source and options>.bin``; None: the cache is off."""
    d = cache_dir()
    if d is None:
        return None
    key = hashlib.sha256("\0".join([src, options]).encode()).hexdigest()[:24]
    return d / f"{family}-{device_tag(device)}-{key}.bin"


def _drop_stale(path: Path) -> None:
    """Remove what nothing reads any more: older entries of the same family and device
    (previous sources or options), entries of the same device under a family name that no
    longer exists (e.g. ``norms`` before the files were named ``norm.cl``), and entries in
    the pre-release naming ``<family>-<32 hex>.bin``."""
    family, tag, _ = path.name.split("-", 2)
    olds = list(path.parent.glob(f"{family}-{tag}-*.bin"))
    olds += [p for p in path.parent.glob(f"*-{tag}-*.bin") if p.name.split("-", 1)[0] not in FAMILIES]
    olds += [p for p in path.parent.glob(f"{family}-*.bin") if p.name.count("-") == 1]
    for old in olds:
        if old != path:
            try:
                old.unlink()
            except OSError:
                pass


def _read_cached(path: Path) -> bytes | None:
    """Payload of a cache file, or None if missing; a corrupt file is deleted and counted."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    n = len(CACHE_FORMAT)
    payload = blob[n + 32:]
    if blob[:n] != CACHE_FORMAT or hashlib.sha256(payload).digest() != blob[n:n + 32]:
        state.STATS["corrupt"] += 1
        try:
            path.unlink()
        except OSError:
            pass
        return None
    return payload


def _write_cached(path: Path, payload: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(CACHE_FORMAT + hashlib.sha256(payload).digest() + payload)
    os.replace(tmp, path)


def load_program(ctx, device, family: str, *, force_build: bool = False):
    """Return (program, "cached" | "built", seconds) for one family on one device.

    A build failure raises a backend failure whose message carries the build log."""
    import pyopencl as cl
    options = build_options(device)
    src = program_source(family)
    path = cache_path(device, family, src, options)
    stats = state.STATS
    t0 = time.perf_counter()
    payload = None if force_build or path is None else _read_cached(path)
    if payload is not None:
        try:
            prg = cl.Program(ctx, [device], [payload]).build(options=options)
            stats["hits"] += 1
            return prg, "cached", time.perf_counter() - t0
        except cl.Error:
            stats["corrupt"] += 1   # the driver refused it: treat as stale, rebuild
    stats["misses"] += 1
    try:
        # cache_dir=False turns pyopencl's own cache off (ours is above); its stub says str | None
        prg = cl.Program(ctx, src).build(options=options, devices=[device],
                                         cache_dir=False)  # type: ignore[arg-type]
    except cl.Error as exc:
        raise _fail(f"building program {family!r} for {device.name.strip()!r} failed; "
                    f"build log:\n{exc}", exc) from None
    stats["builds"] += 1
    if path is None:   # TENSOR_OPS_OPENCL_CACHE=off: the export below is what costs on PoCL
        return prg, "built", time.perf_counter() - t0
    try:
        _write_cached(path, prg.get_info(cl.program_info.BINARIES)[0])
        _drop_stale(path)
    except OSError:
        pass  # an unwritable cache only costs a rebuild next time
    return prg, "built", time.perf_counter() - t0
