"""OpenCL devices: selection, and per device (and context) its queue, programs, kernels and
buffer pool (:class:`Device`).

One Device per process for the chosen device (``TENSOR_OPS_OPENCL_DEVICE`` =
``"<platform>:<device>"`` or a name substring, else the best GPU, else a CPU device), created
on first use and cached; pyopencl arrays of another context get a Device of their own.
Programs come from the binary cache (:mod:`.programs`); nothing is built after that.
"""
from __future__ import annotations

import time

from tensor_ops._errors import backend_failure

from . import programs, settings, state
from .programs import FAMILIES, KERNELS, SYMBOL_PREFIX


def _fail(msg: str, cause: BaseException | None = None):
    return backend_failure("opencl", msg, cause)


def cl_fail(what: str, exc: BaseException):
    """Wrap a pyopencl error (or anything not a user error) as a backend failure."""
    st = state.device
    where = repr(st.device.name.strip()) if st is not None else "<no device>"
    return _fail(f"{what} failed on {where}: {type(exc).__name__}: {exc}", exc)


# ----------------------------------------------------------------------------- selection
def all_devices() -> list:
    """``(platform index, device index, device)`` for every device of every platform."""
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
        devs = all_devices()
    except cl.Error as exc:
        raise _fail(f"no OpenCL platform ({exc}); install an ICD, e.g. "
                    "pip install pocl-binary-distribution") from None
    if not devs:
        raise _fail("no OpenCL device found on any platform")
    spec = settings.device_spec()
    if spec:
        found = []
        if ":" in spec and all(p.strip().isdigit() for p in spec.split(":", 1)):
            pi, di = (int(p) for p in spec.split(":", 1))
            found = [d for (p, i, d) in devs if (p, i) == (pi, di)]
        else:
            found = [d for (_, _, d) in devs if spec.lower() in f"{d.platform.name} {d.name}".lower()]
        if not found:
            choices = sorted(f"{p}:{i} {d.name.strip()}" for (p, i, d) in devs)
            raise _fail(f"TENSOR_OPS_OPENCL_DEVICE={spec!r} matches no device; choices: {choices}")
        return found[0]
    gpus = [d for (_, _, d) in devs if d.type & cl.device_type.GPU]
    if gpus:
        return max(gpus, key=lambda d: d.max_compute_units * d.max_clock_frequency)
    cpus = [d for (_, _, d) in devs if d.type & cl.device_type.CPU]
    return (cpus or [d for (_, _, d) in devs])[0]


# ----------------------------------------------------------------------------- one device
class Device:
    """Context, queue, programs, kernels and buffer pool of one device (and context)."""

    def __init__(self, device, ctx=None, queue=None):
        import pyopencl as cl
        t0 = time.perf_counter()
        self.device = device
        self.ctx = ctx if ctx is not None else cl.Context([device])
        self.queue = queue if queue is not None else cl.CommandQueue(self.ctx)
        self.lws = programs.local_size(device)
        self.cpu_layout = programs.cpu_layout(device)   # as built into the programs (build_options)
        self.fp16_ext = "cl_khr_fp16" in device.extensions
        self.cpu = programs.is_cpu(device)
        unified = bool(device.type & cl.device_type.CPU) or bool(getattr(device, "host_unified_memory", False))
        self.host_mode = "hostptr" if unified else "copy"
        self.groups = max(1, device.max_compute_units) * (4 if unified else 32)
        self.programs, self.kernels, self.program_status = {}, {}, {}
        for fam in FAMILIES:
            prg, status, secs = programs.load_program(self.ctx, device, fam)
            self.programs[fam] = prg
            self.program_status[fam] = {"status": status, "seconds": round(secs, 4)}
        self.load_ms = (time.perf_counter() - t0) * 1e3
        state.STATS["load_ms"] = round(self.load_ms, 2)
        self.pool: dict[int, list] = {}
        self.pool_bytes = 0
        self.pool_limit = 256 << 20

    def kernel(self, base: str, suffix: str):
        """The cl.Kernel ``to_<base><suffix>`` (e.g. ``to_rms_norm_f32a``), created on first
        use: creating all 72 up front (with pyopencl's generated argument setters) costs
        ~60 ms on PoCL."""
        name = base + suffix
        k = self.kernels.get(name)
        if k is None:
            import pyopencl as cl
            family, arg_types = KERNELS[base]
            with state.LOCK:
                k = self.kernels.get(name)
                if k is None:
                    k = cl.Kernel(self.programs[family], SYMBOL_PREFIX + name)
                    # declared scalar types let pyopencl use its fast generated arg setter
                    # (~30 us per call saved against set_args' per-argument inspection)
                    k.set_scalar_arg_dtypes(arg_types)
                    self.kernels[name] = k
        return k

    # --- buffers -------------------------------------------------------------------
    def alloc(self, nbytes: int):
        import pyopencl as cl
        if state.fault() == "oom":
            raise cl.MemoryError(f"clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE "
                                 f"(injected, {nbytes} bytes)")
        with state.LOCK:
            lst = self.pool.get(nbytes)
            if lst:
                self.pool_bytes -= nbytes
                return lst.pop()
        return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, size=max(nbytes, 1))

    def release(self, buf, nbytes: int):
        """Keep ``buf`` for the next call of the same size (the pool holds <= 256 MiB)."""
        with state.LOCK:
            if self.pool_bytes + nbytes > self.pool_limit:
                self.pool.clear()
                self.pool_bytes = 0
            if nbytes <= self.pool_limit:
                self.pool.setdefault(nbytes, []).append(buf)
                self.pool_bytes += nbytes

    def drop_pool(self) -> None:
        with state.LOCK:
            self.pool.clear()
            self.pool_bytes = 0


def get() -> Device:
    """The Device of the chosen device, created (programs loaded or built) on first use."""
    st = state.device
    if st is not None:
        return st
    with state.LOCK:
        if state.device is None:
            import pyopencl as cl
            try:
                state.device = Device(select_device())
            except cl.Error as exc:
                raise cl_fail("creating the OpenCL context", exc) from None
        return state.device


def for_array(a) -> Device:
    """The Device whose context owns pyopencl array ``a`` (programs loaded once per context,
    from the binary cache)."""
    st = get()
    ctx = a.context
    if ctx == st.ctx:
        return st
    key = ctx.int_ptr
    other = state.ctx_devices.get(key)
    if other is None:
        with state.LOCK:
            other = state.ctx_devices.get(key)
            if other is None:
                import pyopencl as cl
                dev = a.queue.device if a.queue is not None else ctx.devices[0]
                try:
                    other = state.ctx_devices[key] = Device(dev, ctx, a.queue)
                except cl.Error as exc:
                    raise cl_fail("loading programs for a pyopencl array's context", exc) from None
    return other
