"""Running one OpenCL kernel: the storage variant per call, the grids, and the host / device
launch paths.

Each kernel exists in four storage variants (``opencl_ext/dtype.cl``); :func:`launch` picks
one per call from dtype, alignment and size. Host arrays on CPU devices are wrapped with
``USE_HOST_PTR`` (no copies); on other devices they go through the Device's pool of buffers
keyed by size. ``pyopencl.array`` inputs stay on their device, on their own queue, and come
back as pyopencl arrays.
"""
from __future__ import annotations

import numpy as np

from . import device as _device
from . import state
from .device import Device, cl_fail

#: Outputs at least this large use the streaming-store kernels (``_f32n``) on CPU devices:
#: bigger than the caches, so write-allocating the output lines would only cost bandwidth.
NT_MIN_BYTES = 8 << 20
#: CPU layout: a row is cut into column pieces (to use every thread when there are fewer
#: rows than work-groups) only down to this many elements per piece.
MIN_CUT_ELEMS = 8192

_SUFFIX = {np.dtype(np.float32): "_f32", np.dtype(np.float16): "_f16"}


def is_clarray(a) -> bool:
    return type(a).__module__.startswith("pyopencl")


def device_of(x) -> Device:
    """The Device :func:`launch` runs ``x`` on (a foreign pyopencl context has its own)."""
    return _device.for_array(x) if is_clarray(x) else _device.get()


def _aligned(a) -> bool:
    if a is None:
        return True
    if type(a) is np.ndarray:
        return a.ctypes.data % 16 == 0
    return a.offset % 16 == 0


# ----------------------------------------------------------------------------- grids
def cols(st: Device, ncols4: int, rows: int):
    """Global x size for column-looping kernels: enough groups to fill the device."""
    per_row = max(1, st.groups // max(rows, 1))
    g = min(-(-max(ncols4, 1) // st.lws), per_row)
    return g * st.lws


def row_grid(st: Device, rows: int):
    """Grid of the reduction row kernels (norms, softmax): one work-group per row on GPUs;
    on CPUs (CPU layout, common.cl FOR_BLOCKS_) a flat grid of up to st.groups groups, no
    more groups than rows, each taking a block of whole rows (PoCL runs a group on one
    thread: groups, not items, spread the rows over the threads)."""
    if st.cpu_layout:
        return (min(st.groups, max(rows, 1)) * st.lws,)
    return (rows * st.lws,)


def row_grid2(st: Device, ncols: int, n: int, rows: int):
    """(grid, ncut) of the 2D row kernels (gated activations, rope), ``ncols`` float4/8
    steps and ``n`` elements per row: (column groups * LWS, rows) on GPUs; on CPUs the flat
    grid of row_grid over rows * ncut units, ncut column pieces per row (common.cl)."""
    if not st.cpu_layout:
        return (cols(st, ncols, rows), rows), 1
    g = st.groups
    ncut = 1 if rows >= g else max(1, min(-(-g // max(rows, 1)), n // MIN_CUT_ELEMS))
    return row_grid(st, rows * ncut), ncut


# ----------------------------------------------------------------------------- launching
def launch(st: Device, kname: str, dtype, arrays, out, out_shape, scalars, gsize, vec_ok=True):
    """Run kernel ``kname`` on ``st``. ``arrays`` are the inputs (host or pyopencl arrays;
    None = an absent optional input), ``out`` the output (None = allocate; a tuple of
    outputs, each maybe None, for a kernel with several: a tuple comes back). ``vec_ok``:
    every row start is a multiple of 4 elements, so aligned bases allow the float4-pointer
    variant. NumPy in -> NumPy out, pyopencl.array in -> pyopencl.array out."""
    import pyopencl as cl
    x = arrays[0]
    try:
        if state.fault() == "device_lost":
            raise cl.RuntimeError("clEnqueueNDRangeKernel failed: DEVICE_NOT_AVAILABLE "
                                  "(injected device lost)")
        on_device = is_clarray(x)
        outs = list(out) if type(out) is tuple else [out]
        for k, o in enumerate(outs):
            if o is None:
                if on_device:
                    import pyopencl.array as cla
                    outs[k] = cla.empty(x.queue or st.queue, out_shape, dtype)
                else:
                    outs[k] = np.empty(out_shape, dtype=dtype)
        suffix = _SUFFIX[dtype]
        if suffix == "_f32" and vec_ok and all(_aligned(a) for a in (*outs, *arrays)):
            suffix = "_f32n" if st.cpu and outs[0].nbytes >= NT_MIN_BYTES else "_f32a"
        knl = st.kernel(kname, suffix)
        run = _launch_device if on_device else _launch_host
        res = run(st, knl, arrays, outs, scalars, gsize)
        return tuple(res) if type(out) is tuple else res[0]
    except (ValueError, TypeError):
        raise
    except cl.MemoryError as exc:
        st.drop_pool()
        raise cl_fail(f"{kname}: out of device memory", exc) from None
    except cl.Error as exc:
        raise cl_fail(kname, exc) from None


def _launch_host(st: Device, knl, arrays, outs, scalars, gsize):
    """Host arrays; ``outs`` the (allocated) outputs, returned."""
    import pyopencl as cl
    mf = cl.mem_flags
    mode = state.host_mode or st.host_mode
    q = st.queue
    if mode == "hostptr":
        # CPU devices use the host memory in place: no copy in, one map (no copy) out.
        if state.fault() == "oom":
            st.alloc(outs[0].nbytes)
        bufs = [cl.Buffer(st.ctx, mf.READ_ONLY | mf.USE_HOST_PTR, hostbuf=a)
                if a is not None else None for a in arrays]
        bufs = [b if b is not None else bufs[0] for b in bufs]
        obufs = [cl.Buffer(st.ctx, mf.WRITE_ONLY | mf.USE_HOST_PTR, hostbuf=o) for o in outs]
        with state.LOCK:
            knl(q, gsize, (st.lws,) + (1,) * (len(gsize) - 1), *bufs, *obufs, *scalars)
        for o, obuf in zip(outs, obufs):
            mapped, _ = cl.enqueue_map_buffer(q, obuf, cl.map_flags.READ, 0, o.shape, o.dtype,
                                              is_blocking=True)
            mapped.base.release()
        return outs
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
        obufs = []
        for o in outs:
            obufs.append(st.alloc(o.nbytes))
            held.append((obufs[-1], o.nbytes))
        with state.LOCK:
            knl(q, gsize, (st.lws,) + (1,) * (len(gsize) - 1), *bufs, *obufs, *scalars)
        for o, obuf in zip(outs, obufs):
            cl.enqueue_copy(q, o, obuf, is_blocking=True)
    finally:
        for b, n in held:
            st.release(b, n)
    return outs


def _launch_device(st: Device, knl, arrays, outs, scalars, gsize):
    """pyopencl arrays: everything stays on the device; enqueued on the input's queue and
    not waited for (the result carries the event, as pyopencl's own kernels do)."""
    import pyopencl as cl
    import pyopencl.array as cla
    q = arrays[0].queue or st.queue
    bufs: list = []
    waits: list = []
    for a in arrays:
        if a is None:
            bufs.append(bufs[0])
            continue
        if not is_clarray(a):
            a = cla.to_device(q, np.ascontiguousarray(a))   # small host operands (weight, cos)
        elif a.offset:
            a = a.copy(queue=q)
        waits.extend(a.events)
        bufs.append(a.base_data)
    dsts = [o if not o.offset else cla.empty(q, o.shape, o.dtype) for o in outs]
    for d in dsts:
        waits.extend(d.events)
    with state.LOCK:
        evt = knl(q, gsize, (st.lws,) + (1,) * (len(gsize) - 1), *bufs, *(d.base_data for d in dsts),
                  *scalars, wait_for=waits or None)
    for o, d in zip(outs, dsts):
        e = evt
        if d is not o:
            e = cl.enqueue_copy(q, o.base_data, d.base_data, dst_offset=o.offset,  # type: ignore[arg-type]
                                byte_count=d.nbytes, wait_for=[evt])
        o.add_event(e)
    return outs
