"""CuPy arrays and torch CUDA tensors, in place: kinds, raw pointers, the device and stream of
a call, launch shapes, and NumPy input copied to the GPU and back.

CuPy arrays and torch CUDA tensors are computed in place on their device with no copy (raw
device pointers, on the caller's current stream: CuPy's current stream for CuPy arrays,
``torch.cuda.current_stream()`` for torch tensors); the result is the same kind. NumPy input
reaches the GPU only when an order names cuda (the backend is ``device_only``; e.g. a tuning
bucket where the copies were measured to pay), never by default. Shared with the CuPy
reference backend (:mod:`tensor_ops.backends.cupy`).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from tensor_ops._errors import BackendError, backend_failure

from . import state

CUPY_MISSING = "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
VEC_BYTES = 16


def cupy_with_device():
    """``(cupy, device count)``; raises :class:`~tensor_ops.backends._contract.Unavailable`
    saying what is missing (CuPy, or a CUDA device)."""
    from .._contract import Unavailable
    try:
        import cupy
    except ImportError as exc:
        raise Unavailable(f"{CUPY_MISSING}: {exc}") from None
    except Exception as exc:
        raise Unavailable(f"CuPy failed to import: {type(exc).__name__}: {exc}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise Unavailable(f"no CUDA device: cupy.cuda.runtime.getDeviceCount() failed: {exc}") from None
    if count < 1:
        raise Unavailable("no CUDA device: cupy.cuda.runtime.getDeviceCount() returned 0")
    return cupy, count


# ----------------------------------------------------------------------------- kinds
def kind(a) -> str:
    """'cupy', 'torch' (a CUDA tensor), 'torch-cpu', 'numpy', 'other' or '' (None)."""
    if a is None:
        return ""
    mod = type(a).__module__.split(".", 1)[0]
    if mod == "cupy":
        return "cupy"
    if mod == "torch":
        return "torch" if getattr(a, "is_cuda", False) else "torch-cpu"
    if isinstance(a, np.ndarray):
        return "numpy"
    return "other"


def dtype_name(a, kind: str) -> str:
    if kind.startswith("torch"):
        return str(a.dtype).replace("torch.", "")
    return np.dtype(a.dtype).name


def device_id(a, kind: str) -> int:
    return a.device.id if kind == "cupy" else a.device.index


def ptr(a, kind: str) -> int:
    return a.data.ptr if kind == "cupy" else a.data_ptr()


def is_contig(a, kind: str) -> bool:
    return a.flags.c_contiguous if kind == "cupy" else a.is_contiguous()


def aligned(kind: str, *arrays) -> bool:
    return all(a is None or ptr(a, kind) % VEC_BYTES == 0 for a in arrays)


def p(a, kind):
    """A kernel pointer argument (0 for an absent optional input)."""
    return np.uint64(ptr(a, kind)) if a is not None else np.uint64(0)


# ----------------------------------------------------------------------------- one call
@contextlib.contextmanager
def guard(op: str, backend: str = "cuda"):
    """User errors propagate; anything else from CuPy/the driver becomes a BackendError."""
    try:
        yield
    except (ValueError, TypeError):
        raise
    except Exception as exc:
        if isinstance(exc, BackendError):
            raise
        what = "out of memory" if "OutOfMemory" in type(exc).__name__ else "failed"
        raise backend_failure(backend, f"{op} {what}: {type(exc).__name__}: {exc}", exc) from exc


class Call:
    """One op call: checks that every array is on x's device, then holds device + stream."""

    def __init__(self, op: str, x, *others, names=()):
        self.op = op
        self.kind = kind(x)
        if self.kind not in ("cupy", "torch"):
            raise TypeError(f"cuda {op}: x must be a CuPy array or a torch CUDA tensor, got {type(x).__name__}")
        self.dev = device_id(x, self.kind)
        self.dtype = dtype_name(x, self.kind)
        if not is_contig(x, self.kind):
            raise ValueError(f"cuda {op}: x must be C-contiguous (the facade makes a contiguous copy)")
        for a, name in zip(others, names):
            if a is None:
                continue
            k = kind(a)
            if k != self.kind:
                where = "a torch CPU tensor" if k == "torch-cpu" else type(a).__name__
                raise TypeError(f"cuda {op}: {name} is {where} but x is a {self.kind} array on cuda:{self.dev}; "
                                f"pass every array as the same kind on the same device")
            if device_id(a, k) != self.dev:
                raise ValueError(f"cuda {op}: {name} is on cuda:{device_id(a, k)} but x is on cuda:{self.dev}; "
                                 f"move it to x's device")
            if not is_contig(a, k):
                raise ValueError(f"cuda {op}: {name} must be C-contiguous")

    @contextlib.contextmanager
    def on_device(self):
        import cupy
        with cupy.cuda.Device(self.dev):
            if self.kind == "torch":
                import torch
                handle = torch.cuda.current_stream(self.dev).cuda_stream
                stream = state.EXT_STREAMS.get((self.dev, handle))
                if stream is None:  # one wrapper per torch stream: creating it costs µs per call
                    stream = state.EXT_STREAMS[(self.dev, handle)] = cupy.cuda.ExternalStream(handle, self.dev)
                with stream:
                    yield
            else:
                yield

    def empty(self, like, shape):
        """A new array of ``like``'s kind and dtype on the call's device (the CUDA backend's
        allocations: ``BACKEND.inject_fault("oom")`` makes them fail as a full GPU would)."""
        if state.fault() == "oom":
            import cupy
            nbytes = int(np.prod(shape)) * ITEMSIZE.get(self.dtype, 4)
            raise cupy.cuda.memory.OutOfMemoryError(nbytes, 0, 0)
        if self.kind == "torch":
            import torch
            return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        import cupy
        return cupy.empty(tuple(shape), dtype=like.dtype)

    def cupy_view(self, a):
        """A CuPy view of a device array (no copy)."""
        import cupy
        return a if self.kind == "cupy" else cupy.asarray(a)


def run(op, x, others, names, body, backend: str = "cuda"):
    """Run ``body(call)`` on x's device and stream; NumPy input (only when an order named the
    backend) goes to the GPU and back."""
    if kind(x) == "numpy":
        return _via_device(op, x, others, names, body, backend)
    call = Call(op, x, *others, names=names)
    with guard(op, backend), call.on_device():
        return body(call)


def _via_device(op, x, others, names, body, backend):
    import cupy
    with guard(op, backend):
        dx = cupy.asarray(x)
        dothers = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in others]
        call = Call(op, dx, *dothers, names=names)
        res = body(call, dx, *dothers)
        # the outputs: "out" last, or ("out", "residual_out") last for the fused add + norm
        outs = [others[i] for i, nm in enumerate(names) if nm in ("out", "residual_out")]
        results = res if type(res) is tuple else (res,)
        hosts = []
        for k, r in enumerate(results):
            given = outs[k] if k < len(outs) else None
            if given is not None:
                np.copyto(given, r.get())
                hosts.append(given)
            else:
                hosts.append(r.get())
        return tuple(hosts) if type(res) is tuple else hosts[0]


# ----------------------------------------------------------------------------- launch shapes
def sm_count(dev: int) -> int:
    if dev not in state.SM_COUNT:
        import cupy
        state.SM_COUNT[dev] = int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"])
    return state.SM_COUNT[dev]


CACHE_BYTES = 64  # cuda_ext/common.cuh: the row bytes a thread keeps in registers


def row_launch(rows: int, n: int, dev: int, itemsize: int = 4):
    """One warp per row while 32 lanes hold the row (CACHE_BYTES each: 512 fp32 or 1024
    16-bit columns), else one block per row of up to 512 threads, each holding CACHE_BYTES of
    it (rows of 8192 stay in registers: 512 threads fp32, 256 threads 16-bit). Sized in bytes,
    not elements, so a 16-bit row keeps as many bytes in flight per thread as an fp32 row."""
    per_thread = CACHE_BYTES // itemsize
    if n <= 32 * per_thread:
        return (min(math.ceil(rows / 4), sm_count(dev) * 64), 1, 1), (32, 4, 1)
    threads = min(512, max(64, 1 << max(0, math.ceil(math.log2(math.ceil(n / per_thread))))))
    return (min(rows, 1 << 20), 1, 1), (threads, 1, 1)


def flat_launch(units: int, dev: int):
    return (max(1, min(math.ceil(units / 256), sm_count(dev) * 16)), 1, 1), (256, 1, 1)


def rows_cols_launch(rows: int, units: int):
    """256-thread blocks of (tx, 256 / tx): tx threads over a row's ``units`` (the power of two
    that covers them, at most 256) and the rest over rows. With one row per block, rope's
    128-wide rows (16 vector units) kept 16 of 256 threads busy: 0.37 of the copy (fp32) and
    0.19 (16-bit) on an H200, 2026-11-27."""
    tx = min(256, 1 << max(0, math.ceil(math.log2(max(units, 1)))))
    ty = 256 // tx
    return (max(1, min(math.ceil(units / tx), 64)), max(1, min(math.ceil(rows / ty), 65535)), 1), (tx, ty, 1)
