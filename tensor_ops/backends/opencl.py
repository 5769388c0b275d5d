"""OpenCL backend: ``opencl_ext/*.cl`` kernels run through pyopencl.

One context, queue and set of programs per process, created on first use for the chosen
device (``TENSOR_OPS_OPENCL_DEVICE`` = ``"<platform>:<device>"`` or a name substring, else
the best GPU, else a CPU device) and cached; no program is built after that. Program
binaries are cached on disk (``TENSOR_OPS_OPENCL_CACHE``, else the user cache dir), keyed by
device, driver version, source hash and build options, each file carrying a SHA-256 of its
payload so a corrupt entry is detected, deleted and rebuilt, never loaded.

fp16 is storage only (core ``vload_half``/``vstore_half``, fp32 math), so it works on every
device; ``cl_khr_fp16`` is reported but not needed. Each kernel exists in four storage
variants (``opencl_ext/dtype.cl``); the host picks one per call from dtype, alignment and
size. Host arrays on CPU devices are wrapped with ``USE_HOST_PTR`` (no copies); on other
devices they go through a small pool of device buffers keyed by size. ``pyopencl.array``
inputs stay on their device, on their own queue, and come back as pyopencl arrays.
Importing this module imports NumPy only; pyopencl is imported by ``availability()``.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np

from tensor_ops._errors import backend_failure

NAME = "opencl"
# Host (NumPy) arrays go to OpenCL only when an order names it (keyword, env, per_op,
# priority, or a tuning bucket where it measured faster): a GPU needs copies, and on a CPU
# device (PoCL) the C++ backend is faster. pyopencl arrays are always served here.
HOST_ARRAYS = "when-named"
OPS = ("rms_norm", "layer_norm", "softmax", "silu", "relu", "gelu", "swiglu", "geglu", "rope")
FAMILIES = ("norm", "softmax", "activation", "rope")
CACHE_FORMAT = b"TOCLBIN1"  # magic + sha256(payload) + payload

#: Test hook: ``None`` or one of ``"build"`` (programs fail to compile), ``"device_lost"``
#: (every enqueue fails as if the device was lost), ``"oom"`` (buffer allocation fails).
_FAULT: str | None = None
#: Outputs at least this large use the streaming-store kernels (``_f32n``) on CPU devices:
#: bigger than the caches, so write-allocating the output lines would only cost bandwidth.
NT_MIN_BYTES = 8 << 20
#: Host-array strategy: ``None`` = decided per device ("hostptr" on CPU/unified-memory
#: devices, "copy" otherwise); the benchmark sets it to compare both.
_HOST_MODE: str | None = None

_LOCK = threading.RLock()
_STATE = None                      # _Device once created
_AVAIL: tuple[bool, str] | None = None
_STATS = {"hits": 0, "misses": 0, "builds": 0, "corrupt": 0, "load_ms": 0.0}
_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
_SUFFIX = {np.dtype(np.float32): "_f32", np.dtype(np.float16): "_f16"}


# ----------------------------------------------------------------------------- errors
def _fail(msg: str, cause: BaseException | None = None):
    return backend_failure(NAME, msg, cause)


def _cl_fail(what: str, exc: BaseException):
    """Wrap a pyopencl error (or anything not a user error) as a backend failure."""
    return _fail(f"{what} failed on {_device_label()}: {type(exc).__name__}: {exc}", exc)


def _device_label() -> str:
    st = _STATE
    return repr(st.device.name.strip()) if st is not None else "<no device>"


# ----------------------------------------------------------------------------- sources
def source_dir() -> Path:
    """The directory holding the .cl sources (source checkout, or packaged copy)."""
    env = os.environ.get("TENSOR_OPS_OPENCL_SRC")
    here = Path(__file__).resolve()
    for cand in ([Path(env)] if env else []) + [here.parents[2] / "opencl_ext",
                                                 here.parents[1] / "opencl_ext"]:
        if (cand / "common.cl").is_file():
            return cand
    raise _fail(f"OpenCL sources not found (looked in {here.parents[2] / 'opencl_ext'} and "
                f"{here.parents[1] / 'opencl_ext'}); reinstall tensor_ops")


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
    if _FAULT == "build":
        src += "\n#error injected build failure (tensor_ops.backends.opencl._FAULT='build')\n"
    return src


def source_hash() -> str:
    h = hashlib.sha256()
    for fam in FAMILIES:
        h.update(program_source(fam).encode())
    return h.hexdigest()


def cache_dir() -> Path:
    env = os.environ.get("TENSOR_OPS_OPENCL_CACHE")
    if env:
        return Path(env)
    try:
        import platformdirs
        return Path(platformdirs.user_cache_dir("tensor_ops")) / "opencl"
    except ImportError:
        return Path.home() / ".cache" / "tensor_ops" / "opencl"


def _is_cpu(device) -> bool:
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
    env = os.environ.get("TENSOR_OPS_OPENCL_LWS", "").strip()
    want = int(env) if env.isdigit() and int(env) > 0 else (4 if _is_cpu(device) else 256)
    want = max(want, 4)
    lws = 1
    while lws * 2 <= min(want, device.max_work_group_size):
        lws *= 2
    return lws


def _cpu_layout(device) -> bool:
    """Loop layout of the kernels (common.cl): on CPUs each work-item streams whole rows (or
    one contiguous chunk), with no work-group reduction; on GPUs one work-group per row with
    a local-memory reduction and strided (coalesced) loops. TENSOR_OPS_OPENCL_LAYOUT=cpu|gpu
    overrides (tests run the GPU layout on PoCL with it)."""
    env = os.environ.get("TENSOR_OPS_OPENCL_LAYOUT", "").strip().lower()
    return env == "cpu" if env in ("cpu", "gpu") else _is_cpu(device)


def build_options(device) -> str:
    return f"-DLWS={local_size(device)} -DCPU_LAYOUT={int(_cpu_layout(device))}"


def _device_tag(device) -> str:
    """Short hash of what identifies a device and its compiler (name, driver, versions)."""
    p = device.platform
    parts = [p.name, p.version, device.name, device.vendor, device.version,
             device.driver_version]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def cache_path(device, family: str, src: str, options: str) -> Path:
    """``<cache>/<family>-<device tag>-<hash of source and options>.bin``."""
    key = hashlib.sha256("\0".join([src, options]).encode()).hexdigest()[:24]
    return cache_dir() / f"{family}-{_device_tag(device)}-{key}.bin"


def _drop_stale(path: Path) -> None:
    """Remove older entries of the same family and device (previous source versions), and
    entries in the pre-release naming ``<family>-<32 hex>.bin``, which nothing reads."""
    family, tag, _ = path.name.split("-", 2)
    olds = list(path.parent.glob(f"{family}-{tag}-*.bin"))
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
        _STATS["corrupt"] += 1
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
    t0 = time.perf_counter()
    payload = None if force_build else _read_cached(path)
    if payload is not None:
        try:
            prg = cl.Program(ctx, [device], [payload]).build(options=options)
            _STATS["hits"] += 1
            return prg, "cached", time.perf_counter() - t0
        except cl.Error:
            _STATS["corrupt"] += 1   # the driver refused it: treat as stale, rebuild
    _STATS["misses"] += 1
    try:
        prg = cl.Program(ctx, src).build(options=options, devices=[device], cache_dir=False)
    except cl.Error as exc:
        raise _fail(f"building program {family!r} for {device.name.strip()!r} failed; "
                    f"build log:\n{exc}", exc) from None
    _STATS["builds"] += 1
    try:
        _write_cached(path, prg.get_info(cl.program_info.BINARIES)[0])
        _drop_stale(path)
    except OSError:
        pass  # an unwritable cache only costs a rebuild next time
    return prg, "built", time.perf_counter() - t0


# ----------------------------------------------------------------------------- devices
def _all_devices():
    import pyopencl as cl
    out = []
    for pi, plat in enumerate(cl.get_platforms()):
        try:
            devs = plat.get_devices()
        except cl.Error:
            devs = []
        for di, dev in enumerate(devs):
            out.append((pi, di, dev))
    return out


def select_device():
    """The device to use: TENSOR_OPS_OPENCL_DEVICE, else the best GPU, else a CPU."""
    import pyopencl as cl
    try:
        devs = _all_devices()
    except cl.Error as exc:
        raise _fail(f"no OpenCL platform ({exc}); install an ICD, e.g. "
                    "pip install pocl-binary-distribution") from None
    if not devs:
        raise _fail("no OpenCL device found on any platform")
    spec = os.environ.get("TENSOR_OPS_OPENCL_DEVICE", "").strip()
    if spec:
        found = []
        if ":" in spec and all(p.strip().isdigit() for p in spec.split(":", 1)):
            pi, di = (int(p) for p in spec.split(":", 1))
            found = [d for (p, i, d) in devs if (p, i) == (pi, di)]
        else:
            found = [d for (_, _, d) in devs
                     if spec.lower() in f"{d.platform.name} {d.name}".lower()]
        if not found:
            choices = sorted(f"{p}:{i} {d.name.strip()}" for (p, i, d) in devs)
            raise _fail(f"TENSOR_OPS_OPENCL_DEVICE={spec!r} matches no device; choices: "
                        f"{choices}")
        return found[0]
    gpus = [d for (_, _, d) in devs if d.type & cl.device_type.GPU]
    if gpus:
        return max(gpus, key=lambda d: d.max_compute_units * d.max_clock_frequency)
    cpus = [d for (_, _, d) in devs if d.type & cl.device_type.CPU]
    return (cpus or [d for (_, _, d) in devs])[0]


_I32, _I64, _F32S = np.int32, np.int64, np.float32
_ARG_TYPES = {   # kernel name without storage suffix -> pyopencl scalar arg dtypes
    # (row kernels take the row count last: on CPUs each work-item loops over its rows)
    "rms_norm": [None, None, None, _I32, _F32S, _I32],
    "layer_norm": [None, None, None, None, _I32, _F32S, _I32, _I32],
    "softmax": [None, None, _I32, _I32],
    **{k: [None, None, _I64] for k in ("silu", "relu", "gelu", "gelu_tanh")},
    **{k: [None, None, _I32, _I32, _I32] for k in ("swiglu", "geglu", "geglu_tanh")},
    **{k: [None, None, None, None, _I32, _I32, _I32, _I32] for k in ("rope", "rope_interleaved")},
}

_KERNEL_FAMILY = {"rms_norm": "norm", "layer_norm": "norm", "softmax": "softmax",
                  "rope": "rope", "rope_interleaved": "rope",
                  **{k: "activation" for k in ("silu", "relu", "gelu", "gelu_tanh", "swiglu",
                                                "geglu", "geglu_tanh")}}


class _Device:
    """Context, queue, programs, kernels and buffer pool of one device (and context)."""

    def __init__(self, device, ctx=None, queue=None):
        import pyopencl as cl
        t0 = time.perf_counter()
        self.device = device
        self.ctx = ctx if ctx is not None else cl.Context([device])
        self.queue = queue if queue is not None else cl.CommandQueue(self.ctx)
        self.lws = local_size(device)
        self.cpu_layout = _cpu_layout(device)   # as built into the programs (build_options)
        self.fp16_ext = "cl_khr_fp16" in device.extensions
        self.cpu = _is_cpu(device)
        unified = bool(device.type & cl.device_type.CPU) or bool(
            getattr(device, "host_unified_memory", False))
        self.host_mode = "hostptr" if unified else "copy"
        self.groups = max(1, device.max_compute_units) * (4 if unified else 32)
        self.programs, self.kernels, self.program_status = {}, {}, {}
        for fam in FAMILIES:
            prg, status, secs = load_program(self.ctx, device, fam)
            self.programs[fam] = prg
            self.program_status[fam] = {"status": status, "seconds": round(secs, 4)}
        self.load_ms = (time.perf_counter() - t0) * 1e3
        _STATS["load_ms"] = round(self.load_ms, 2)
        self.pool: dict[int, list] = {}
        self.pool_bytes = 0
        self.pool_limit = 256 << 20

    def kernel(self, name: str):
        """The cl.Kernel ``name`` (e.g. ``rms_norm_f32a``), created on first use: creating
        all 72 up front (with pyopencl's generated argument setters) costs ~60 ms on PoCL."""
        k = self.kernels.get(name)
        if k is None:
            import pyopencl as cl
            base = name.rsplit("_", 1)[0]
            with _LOCK:
                k = self.kernels.get(name)
                if k is None:
                    k = cl.Kernel(self.programs[_KERNEL_FAMILY[base]], "to_" + name)
                    # declared scalar types let pyopencl use its fast generated arg setter
                    # (~30 us per call saved against set_args' per-argument inspection)
                    k.set_scalar_arg_dtypes(_ARG_TYPES[base])
                    self.kernels[name] = k
        return k

    # --- buffers -------------------------------------------------------------------
    def alloc(self, nbytes: int):
        import pyopencl as cl
        if _FAULT == "oom":
            raise cl.MemoryError(f"clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE "
                                 f"(injected, {nbytes} bytes)")
        with _LOCK:
            lst = self.pool.get(nbytes)
            if lst:
                self.pool_bytes -= nbytes
                return lst.pop()
        return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size=max(nbytes, 1))

    def release(self, buf, nbytes: int):
        """Keep ``buf`` for the next call of the same size (the pool holds <= 256 MiB)."""
        with _LOCK:
            if self.pool_bytes + nbytes > self.pool_limit:
                self.pool.clear()
                self.pool_bytes = 0
            if nbytes <= self.pool_limit:
                self.pool.setdefault(nbytes, []).append(buf)
                self.pool_bytes += nbytes


def _state() -> _Device:
    global _STATE
    st = _STATE
    if st is not None:
        return st
    with _LOCK:
        if _STATE is None:
            import pyopencl as cl
            try:
                _STATE = _Device(select_device())
            except cl.Error as exc:
                raise _cl_fail("creating the OpenCL context", exc) from None
        return _STATE


_CTX_STATES: dict = {}   # context int_ptr -> _Device, for pyopencl arrays of other contexts


def _state_for(a) -> _Device:
    """The state whose context owns pyopencl array ``a`` (programs loaded once per context,
    from the binary cache)."""
    st = _state()
    ctx = a.context
    if ctx == st.ctx:
        return st
    key = ctx.int_ptr
    other = _CTX_STATES.get(key)
    if other is None:
        with _LOCK:
            other = _CTX_STATES.get(key)
            if other is None:
                import pyopencl as cl
                dev = a.queue.device if a.queue is not None else ctx.devices[0]
                try:
                    other = _CTX_STATES[key] = _Device(dev, ctx, a.queue)
                except cl.Error as exc:
                    raise _cl_fail("loading programs for a pyopencl array's context",
                                   exc) from None
    return other


def _reset_for_tests() -> None:
    """Forget the device state, availability and counters (tests only)."""
    global _STATE, _AVAIL
    with _LOCK:
        _STATE, _AVAIL = None, None
        _CTX_STATES.clear()
        _STATS.update(hits=0, misses=0, builds=0, corrupt=0, load_ms=0.0)


# ----------------------------------------------------------------------------- launching
def _is_clarray(a) -> bool:
    return type(a).__module__.startswith("pyopencl")


def _aligned(a) -> bool:
    if a is None:
        return True
    if type(a) is np.ndarray:
        return a.ctypes.data % 16 == 0
    return a.offset % 16 == 0


def _launch(kname: str, dtype, arrays, out, out_shape, scalars, gsize, vec_ok=True):
    """Run one kernel. ``arrays`` are the inputs (host or pyopencl arrays; None = an
    absent optional input), ``out`` the output (None = allocate). ``vec_ok``: every row
    start is a multiple of 4 elements, so aligned bases allow the float4-pointer variant.
    NumPy in -> NumPy out, pyopencl.array in -> pyopencl.array out."""
    import pyopencl as cl
    x = arrays[0]
    st = _state_for(x) if _is_clarray(x) else _state()
    try:
        if _FAULT == "device_lost":
            raise cl.RuntimeError("clEnqueueNDRangeKernel failed: DEVICE_NOT_AVAILABLE "
                                  "(injected device lost)")
        on_device = _is_clarray(x)
        if out is None:
            if on_device:
                import pyopencl.array as cla
                out = cla.empty(x.queue or st.queue, out_shape, dtype)
            else:
                out = np.empty(out_shape, dtype=dtype)
        suffix = _SUFFIX[dtype]
        if (suffix == "_f32" and vec_ok and _aligned(out)
                and all(_aligned(a) for a in arrays)):
            suffix = "_f32n" if st.cpu and out.nbytes >= NT_MIN_BYTES else "_f32a"
        knl = st.kernel(kname + suffix)
        if on_device:
            return _launch_device(st, knl, arrays, out, scalars, gsize)
        return _launch_host(st, knl, arrays, out, scalars, gsize)
    except (ValueError, TypeError):
        raise
    except cl.MemoryError as exc:
        st.pool.clear()
        st.pool_bytes = 0
        raise _cl_fail(f"{kname}: out of device memory", exc) from None
    except cl.Error as exc:
        raise _cl_fail(kname, exc) from None


def _launch_host(st, knl, arrays, out, scalars, gsize):
    import pyopencl as cl
    mf = cl.mem_flags
    mode = _HOST_MODE or st.host_mode
    q = st.queue
    if mode == "hostptr":
        # CPU devices use the host memory in place: no copy in, one map (no copy) out.
        if _FAULT == "oom":
            st.alloc(out.nbytes)
        bufs = [cl.Buffer(st.ctx, mf.READ_ONLY | mf.USE_HOST_PTR, hostbuf=a)
                if a is not None else None for a in arrays]
        bufs = [b if b is not None else bufs[0] for b in bufs]
        obuf = cl.Buffer(st.ctx, mf.WRITE_ONLY | mf.USE_HOST_PTR, hostbuf=out)
        with _LOCK:
            knl(q, gsize, (st.lws,) + (1,) * (len(gsize) - 1), *bufs, obuf, *scalars)
        mapped, _ = cl.enqueue_map_buffer(q, obuf, cl.map_flags.READ, 0, out.shape, out.dtype,
                                          is_blocking=True)
        mapped.base.release()
        return out
    # "copy": pooled device buffers, one write per input, one blocking read back.
    held, bufs = [], []
    try:
        for a in arrays:
            if a is None:
                bufs.append(bufs[0])
                continue
            b = st.alloc(a.nbytes)
            held.append((b, a.nbytes))
            cl.enqueue_copy(q, b, a, is_blocking=False)
            bufs.append(b)
        obuf = st.alloc(out.nbytes)
        held.append((obuf, out.nbytes))
        with _LOCK:
            knl(q, gsize, (st.lws,) + (1,) * (len(gsize) - 1), *bufs, obuf, *scalars)
        cl.enqueue_copy(q, out, obuf, is_blocking=True)
    finally:
        for b, n in held:
            st.release(b, n)
    return out


def _launch_device(st, knl, arrays, out, scalars, gsize):
    """pyopencl arrays: everything stays on the device; enqueued on the input's queue and
    not waited for (the result carries the event, as pyopencl's own kernels do)."""
    import pyopencl as cl
    import pyopencl.array as cla
    q = arrays[0].queue or st.queue
    bufs, waits = [], []
    for a in arrays:
        if a is None:
            bufs.append(bufs[0])
            continue
        if not _is_clarray(a):
            a = cla.to_device(q, np.ascontiguousarray(a))   # small host operands (weight, cos)
        elif a.offset:
            a = a.copy(queue=q)
        waits.extend(a.events)
        bufs.append(a.base_data)
    dst = out if not out.offset else cla.empty(q, out.shape, out.dtype)
    waits.extend(dst.events)
    with _LOCK:
        evt = knl(q, gsize, (st.lws,) + (1,) * (len(gsize) - 1), *bufs, dst.base_data,
                  *scalars, wait_for=waits or None)
    if dst is not out:
        evt = cl.enqueue_copy(q, out.base_data, dst.base_data, dst_offset=out.offset,
                              byte_count=dst.nbytes, wait_for=[evt])
    out.add_event(evt)
    return out


# ----------------------------------------------------------------------------- ops
def _st(x) -> _Device:
    """The state _launch will run ``x`` on (a foreign pyopencl context has its own)."""
    return _state_for(x) if _is_clarray(x) else _state()


def _cols(st, ncols4: int, rows: int):
    """Global x size for column-looping kernels: enough groups to fill the device."""
    per_row = max(1, st.groups // max(rows, 1))
    g = min(-(-max(ncols4, 1) // st.lws), per_row)
    return g * st.lws


def _row_grid(st, rows: int):
    """Grid of the reduction row kernels (norms, softmax): one work-group per row on GPUs;
    on CPUs (CPU layout, common.cl FOR_BLOCKS_) a flat grid of up to st.groups groups, no
    more groups than rows, each taking a block of whole rows (PoCL runs a group on one
    thread: groups, not items, spread the rows over the threads)."""
    if st.cpu_layout:
        return (min(st.groups, max(rows, 1)) * st.lws,)
    return (rows * st.lws,)


#: CPU layout: a row is cut into column pieces (to use every thread when there are fewer
#: rows than work-groups) only down to this many elements per piece.
MIN_CUT_ELEMS = 8192


def _row_grid2(st, ncols: int, n: int, rows: int):
    """(grid, ncut) of the 2D row kernels (gated activations, rope), ``ncols`` float4/8
    steps and ``n`` elements per row: (column groups * LWS, rows) on GPUs; on CPUs the flat
    grid of _row_grid over rows * ncut units, ncut column pieces per row (common.cl)."""
    if not st.cpu_layout:
        return (_cols(st, ncols, rows), rows), 1
    g = st.groups
    ncut = 1 if rows >= g else max(1, min(-(-g // max(rows, 1)), n // MIN_CUT_ELEMS))
    return _row_grid(st, rows * ncut), ncut


def rms_norm(x, weight, eps, out):
    st = _st(x)
    rows, n = x.shape
    return _launch("rms_norm", x.dtype, [x, weight], out, x.shape,
                   [np.int32(n), np.float32(eps), np.int32(rows)], _row_grid(st, rows),
                   n % 4 == 0)


def layer_norm(x, weight, bias, eps, out):
    st = _st(x)
    rows, n = x.shape
    return _launch("layer_norm", x.dtype, [x, weight, bias], out, x.shape,
                   [np.int32(n), np.float32(eps), np.int32(bias is not None), np.int32(rows)],
                   _row_grid(st, rows), n % 4 == 0)


def softmax(x, out):
    st = _st(x)
    rows, n = x.shape
    return _launch("softmax", x.dtype, [x], out, x.shape, [np.int32(n), np.int32(rows)],
                   _row_grid(st, rows), n % 4 == 0)


def _eltwise(kname, x, out):
    st = _st(x)
    total = int(np.prod(x.shape))
    return _launch(kname, x.dtype, [x], out, x.shape, [np.int64(total)],
                   (_cols(st, total // 8, 1),))


def silu(x, out):
    return _eltwise("silu", x, out)


def relu(x, out):
    return _eltwise("relu", x, out)


def gelu(x, approximate, out):
    return _eltwise("gelu_tanh" if approximate == "tanh" else "gelu", x, out)


def _gated(kname, x, out):
    st = _st(x)
    rows, n2 = x.shape
    h = n2 // 2
    grid, ncut = _row_grid2(st, h // 8, h, rows)
    return _launch(kname, x.dtype, [x], out, (rows, h),
                   [np.int32(h), np.int32(rows), np.int32(ncut)], grid, h % 4 == 0)


def swiglu(x, out):
    return _gated("swiglu", x, out)


def geglu(x, approximate, out):
    return _gated("geglu_tanh" if approximate == "tanh" else "geglu", x, out)


def rope(x, cos, sin, interleaved, out):
    st = _st(x)
    rows, n = x.shape
    kname = "rope_interleaved" if interleaved else "rope"
    grid, ncut = _row_grid2(st, n // 4 if interleaved else n // 8, n, rows)
    return _launch(kname, x.dtype, [x, cos, sin], out, x.shape,
                   [np.int32(n), np.int32(cos.shape[0]), np.int32(rows), np.int32(ncut)], grid,
                   n % 4 == 0 if interleaved else n % 8 == 0)


_FNS = {"rms_norm": rms_norm, "layer_norm": layer_norm, "softmax": softmax, "silu": silu,
        "relu": relu, "gelu": gelu, "swiglu": swiglu, "geglu": geglu, "rope": rope}


# ----------------------------------------------------------------------------- supports
def _ok(a, dtypes=_DTYPES) -> bool:
    """A host float32/float16 ndarray, or a pyopencl array (any context)."""
    if type(a) is np.ndarray or _is_clarray(a):
        return a.dtype in dtypes
    return False


def _with(x, a, dtypes=_DTYPES) -> bool:
    """Operand ``a`` usable next to ``x``: host x takes host operands only (they are
    wrapped, not copied); device x also takes small host operands (uploaded)."""
    if type(x) is np.ndarray:
        return type(a) is np.ndarray and a.dtype in dtypes
    return _ok(a, dtypes)


def _same_kind(x, out) -> bool:
    return out is None or (_is_clarray(out) == _is_clarray(x) and _ok(out))


_F32 = (np.dtype(np.float32),)


def _supports_for(op: str):
    if op == "rms_norm":
        return lambda x, w, eps, out=None: _ok(x) and _with(x, w) and _same_kind(x, out)
    if op == "layer_norm":
        return lambda x, w, b, eps, out=None: (_ok(x) and _with(x, w)
                                               and (b is None or _with(x, b))
                                               and _same_kind(x, out))
    if op == "rope":
        return lambda x, c, s, il, out=None: (_ok(x) and _with(x, c, _F32)
                                              and _with(x, s, _F32) and _same_kind(x, out))
    if op in ("gelu", "geglu"):
        return lambda x, approximate, out=None: _ok(x) and _same_kind(x, out)
    return lambda x, out=None: _ok(x) and _same_kind(x, out)


# ----------------------------------------------------------------------------- contract
def availability() -> tuple[bool, str]:
    """(True, device) or (False, reason); decided once, never raises."""
    global _AVAIL
    if _AVAIL is not None:
        return _AVAIL
    with _LOCK:
        if _AVAIL is None:
            _AVAIL = _probe()
        return _AVAIL


def _probe() -> tuple[bool, str]:
    try:
        import pyopencl  # noqa: F401
    except Exception as exc:
        return False, f"pyopencl not importable ({exc}); pip install 'tensor_ops[opencl]'"
    try:
        st = _state()
        x = (np.arange(3 * 7, dtype=np.float32).reshape(3, 7) - 10.0) / 4.0
        w = np.linspace(0.5, 1.5, 7, dtype=np.float32)
        got = rms_norm(x, w, 1e-6, None)
        x64 = x.astype(np.float64)
        want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w
        got2 = silu(x, None)
        want2 = x64 / (1.0 + np.exp(-x64))
        err = max(float(np.abs(got - want).max()), float(np.abs(got2 - want2).max()))
        if not err < 1e-5:
            return False, f"probe kernel on {st.device.name.strip()!r} returned wrong numbers " \
                          f"(max abs error {err:.3g})"
        return True, f"{st.device.name.strip()} ({st.device.platform.name.strip()})"
    except Exception as exc:
        return False, str(exc)


def register(registry) -> None:
    """Register one ``default.opencl`` OpImpl per op (imports nothing native)."""
    from tensor_ops._registry import BackendImplKind, OpImpl
    for op in OPS:
        registry.register_impl(OpImpl(op_name=op, impl_id=f"default.{NAME}",
                                      kind=BackendImplKind.DEFAULT, fn=_FNS[op], backend=NAME,
                                      supports=_supports_for(op), available=availability,
                                      api="facade"))


def get_queue():
    """The backend's pyopencl CommandQueue (create pyopencl arrays on it to stay on device)."""
    return _state().queue


def device_ids() -> list:
    """Every OpenCL device of every platform, named as a tuning fingerprint records them
    (``_policy.opencl_device_id``): the resolver compares the two before following a tuned
    order that names opencl."""
    import pyopencl as cl
    from tensor_ops._policy import opencl_device_id
    return [opencl_device_id(d.name, p.name, d.driver_version) for p in cl.get_platforms() for d in p.get_devices()]


def get_opencl_info() -> dict:
    """Platforms, devices, chosen device, fp16 support, cache location and hit counts.

    Decides availability (creating the device state) if that has not happened yet."""
    ok, reason = availability()
    info: dict = {"available": ok, "reason": None if ok else reason, "platforms": [],
                  "chosen": None, "cache": {"dir": str(cache_dir()), **_STATS}}
    try:
        import pyopencl as cl
        info["pyopencl"] = cl.VERSION_TEXT
        plats = {}
        for pi, di, d in _all_devices():
            plats.setdefault(pi, {"index": pi, "name": d.platform.name.strip(),
                                  "version": d.platform.version.strip(), "devices": []})
            plats[pi]["devices"].append({
                "index": f"{pi}:{di}", "name": d.name.strip(),
                "type": cl.device_type.to_string(d.type), "version": d.version.strip(),
                "driver": d.driver_version.strip(), "compute_units": d.max_compute_units,
                "global_mem": d.global_mem_size, "cl_khr_fp16": "cl_khr_fp16" in d.extensions})
        info["platforms"] = list(plats.values())
    except Exception as exc:
        info["error"] = str(exc)
    st = _STATE
    if st is not None:
        info["chosen"] = {"name": st.device.name.strip(),
                          "platform": st.device.platform.name.strip(),
                          "local_size": st.lws, "host_mode": _HOST_MODE or st.host_mode,
                          "fp16": "storage (vload_half), fp32 math",
                          "cl_khr_fp16": st.fp16_ext, "programs": st.program_status,
                          "load_ms": round(st.load_ms, 2)}
    return info


def info() -> dict:
    return get_opencl_info()


# ----------------------------------------------------------------------------- build
def build_all(force: bool = False) -> list[dict]:
    """Build (or load from cache) every program for every device; used by build_opencl.

    Raises the backend failure (with the build log) of the first program that fails."""
    import pyopencl as cl
    results = []
    for pi, di, dev in _all_devices():
        ctx = cl.Context([dev])
        progs = {}
        for fam in FAMILIES:
            _, status, secs = load_program(ctx, dev, fam, force_build=force)
            progs[fam] = {"status": status, "seconds": round(secs, 3)}
        results.append({"index": f"{pi}:{di}", "device": dev.name.strip(),
                        "platform": dev.platform.name.strip(),
                        "driver": dev.driver_version.strip(), "local_size": local_size(dev),
                        "programs": progs})
    return results
