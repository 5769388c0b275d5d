"""CUDA backend: ``cuda_ext/*.cu`` kernels launched through CuPy.

The kernels come from ``tensor_ops/_cuda_kernels.fatbin`` (``python setup.py build_cuda``),
loaded once per process with ``cupy.RawModule`` on first use. When there is no fatbin, it is
stale (the sources changed since it was built) or it has no code for this GPU, the same
sources are compiled with NVRTC through CuPy (cached by CuPy) and :func:`get_cuda_info`
says so.

CuPy arrays and torch CUDA tensors are computed in place on their device with no copy (raw
device pointers, on the caller's current stream: CuPy's current stream for CuPy arrays,
``torch.cuda.current_stream()`` for torch tensors); the result is the same kind. NumPy
input is copied to the GPU only when an order names cuda (:data:`HOST_ARRAYS`; e.g. a
tuning bucket where the copies were measured to pay), never by default.

Importing this module imports neither cupy nor torch; ``availability()`` does, once.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from pathlib import Path

import numpy as np

from tensor_ops._errors import BackendError, backend_failure

NAME = "cuda"
OPS = ("rms_norm", "layer_norm", "softmax", "silu", "relu", "gelu", "swiglu", "geglu", "rope", "matmul")
CUPY_MISSING = "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"

_PKG = Path(__file__).resolve().parents[1]
FATBIN_PATH = _PKG / "_cuda_kernels.fatbin"
FATBIN_RECORD = _PKG / "_cuda_kernels.fatbin.json"
SOURCE_DIRS = (_PKG.parent / "cuda_ext", _PKG / "cuda_ext")
HEADER = "common.cuh"
NVRTC_OPTIONS = ("-std=c++17",)

#: Test hook: ``None`` or ``"oom"`` (every device allocation of this backend fails with
#: CuPy's OutOfMemoryError, as a full GPU would) or ``"launch"`` (every kernel launch fails).
_FAULT: str | None = None

#: {op: minimum x.nbytes} for which NumPy input is copied to the GPU and back. Empty by
#: default (host arrays stay on the host backends); set from the tuned configuration.
_HOST_COPY_MIN_BYTES: dict[str, int] = {}
# NumPy input is copied to the GPU only when an order names cuda (keyword, env, per_op,
# priority, or a tuning bucket where detect_and_benchmark measured that the copies pay).
HOST_ARRAYS = "when-named"

_LOCK = threading.RLock()
_AVAIL: tuple[bool, str] | None = None
_MODULE = None
_MODULE_INFO: dict = {"source": None, "fatbin": str(FATBIN_PATH), "nvrtc_reason": None}
_SM_COUNT: dict[int, int] = {}
_KERNELS: dict = {}      # (device, kernel name) -> CuPy kernel
_EXT_STREAMS: dict = {}  # (device, torch stream handle) -> cupy.cuda.ExternalStream

_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_VEC_BYTES = 16


# ----------------------------------------------------------------------------- errors
def _fail(msg: str, cause: BaseException | None = None):
    return backend_failure(NAME, msg, cause)


@contextlib.contextmanager
def _guard(op: str):
    """User errors propagate; anything else from CuPy/the driver becomes a BackendError."""
    try:
        yield
    except (ValueError, TypeError):
        raise
    except Exception as exc:
        if isinstance(exc, BackendError):
            raise
        what = "out of memory" if "OutOfMemory" in type(exc).__name__ else "failed"
        raise _fail(f"{op} {what}: {type(exc).__name__}: {exc}", exc) from exc


@contextlib.contextmanager
def inject_fault(kind: str | None):
    """Test hook: make allocations (``"oom"``) or launches (``"launch"``) fail inside the block."""
    global _FAULT
    if kind not in (None, "oom", "launch"):
        raise ValueError(f"inject_fault: kind must be None, 'oom' or 'launch', got {kind!r}")
    old, _FAULT = _FAULT, kind
    try:
        yield
    finally:
        _FAULT = old


def set_host_copy_policy(op: str, min_bytes: int | None) -> None:
    """Keep NumPy input of ``op`` smaller than ``min_bytes`` off the GPU even where an order
    names cuda; ``None`` removes the threshold (tests and tuning experiments use it)."""
    if op not in OPS:
        raise ValueError(f"set_host_copy_policy: unknown op {op!r}; choose from {sorted(OPS)}")
    if min_bytes is None:
        _HOST_COPY_MIN_BYTES.pop(op, None)
    elif isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"set_host_copy_policy: min_bytes must be an int >= 0 or None, got {min_bytes!r}")
    else:
        _HOST_COPY_MIN_BYTES[op] = min_bytes


# ----------------------------------------------------------------------------- sources / module
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


def _sources_digest(d: Path) -> str:
    import hashlib
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


def _fatbin_problem(cc: int) -> str | None:
    """Why the fatbin can't serve a device of compute capability ``cc`` (e.g. 90), or None."""
    if not FATBIN_PATH.is_file():
        return f"no fatbin at {FATBIN_PATH} (run `python setup.py build_cuda`)"
    rec = fatbin_record()
    d = source_dir()
    if rec.get("sources_sha256") and d is not None and rec["sources_sha256"] != _sources_digest(d):
        return "the fatbin is stale (cuda_ext/ changed since it was built; rerun `python setup.py build_cuda`)"
    sms = [int(a[3:]) for a in rec.get("archs", []) if a[3:].isdigit()]
    ptx = rec.get("ptx", "compute_0")[8:]
    if sms and cc not in sms and not (ptx.isdigit() and int(ptx) <= cc):
        return f"the fatbin has no code for sm_{cc} (it holds {', '.join(rec['archs'])} + {rec.get('ptx')})"
    return None


def _load_module():
    """The RawModule with every kernel, from the fatbin or else NVRTC; loaded once."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    with _LOCK:
        if _MODULE is not None:
            return _MODULE
        import cupy
        dev = cupy.cuda.Device()
        cc = int(dev.compute_capability)
        reason = _fatbin_problem(cc)
        mod = None
        if reason is None:
            try:
                mod = cupy.RawModule(path=str(FATBIN_PATH))
                mod.get_function("to_rms_norm_f32")  # forces the load: no image for this GPU fails here
                _MODULE_INFO.update(source="fatbin", nvrtc_reason=None)
            except Exception as exc:
                reason = f"the fatbin did not load on sm_{cc}: {type(exc).__name__}: {exc}"
                mod = None
        if mod is None:
            try:
                mod = cupy.RawModule(code=nvrtc_source(), options=NVRTC_OPTIONS)
                mod.get_function("to_rms_norm_f32")
            except Exception as exc:
                raise _fail(f"{reason}; NVRTC compilation of cuda_ext/ failed too: "
                            f"{type(exc).__name__}: {exc}", exc) from exc
            _MODULE_INFO.update(source="nvrtc", nvrtc_reason=reason)
        _MODULE = mod
        return mod


def _kernel(name: str, dev: int = 0):
    """The kernel ``name`` for device ``dev`` (the caller has made it current); cached."""
    if _FAULT == "launch":
        raise _fail(f"injected launch failure for {name} (tensor_ops.backends.cuda._FAULT='launch')")
    k = _KERNELS.get((dev, name))
    if k is None:
        k = _KERNELS[(dev, name)] = _load_module().get_function("to_" + name)
    return k


# ----------------------------------------------------------------------------- availability
def availability() -> tuple[bool, str]:
    """(True, description) or (False, reason); decided once, never raises."""
    global _AVAIL
    if _AVAIL is not None:
        return _AVAIL
    with _LOCK:
        if _AVAIL is None:
            try:
                _AVAIL = _probe()
            except Exception as exc:  # never raise from availability
                _AVAIL = (False, f"probe failed: {type(exc).__name__}: {exc}")
        return _AVAIL


def _reset_for_tests() -> None:
    global _AVAIL, _MODULE
    with _LOCK:
        _AVAIL, _MODULE = None, None
        _KERNELS.clear()
        _MODULE_INFO.update(source=None, nvrtc_reason=None)


def _probe() -> tuple[bool, str]:
    if os.environ.get("TE_FL_SKIP_CUDA", "").strip().lower() in ("1", "true", "yes", "on"):
        return False, "disabled by TE_FL_SKIP_CUDA"
    try:
        import cupy
    except ImportError as exc:
        return False, f"{CUPY_MISSING}: {exc}"
    except Exception as exc:
        return False, f"CuPy failed to import: {type(exc).__name__}: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no CUDA device: cupy.cuda.runtime.getDeviceCount() failed: {exc}"
    if count < 1:
        return False, "no CUDA device: cupy.cuda.runtime.getDeviceCount() returned 0"
    try:
        _load_module()
    except Exception as exc:
        return False, f"CUDA kernels could not be loaded: {exc}"
    # Probe: the scalar (odd width) and vectorised paths of one kernel, checked against NumPy.
    rng = np.random.default_rng(0)
    for rows, n in ((3, 37), (2, 64), (2, 1000), (1, 9001)):  # warp/block, vector/scalar, cached/streaming
        xh = rng.standard_normal((rows, n)).astype(np.float32)
        wh = rng.standard_normal(n).astype(np.float32)
        try:
            y = rms_norm(cupy.asarray(xh), cupy.asarray(wh), 1e-6, None).get()
        except Exception as exc:
            return False, f"probe kernel rms_norm_f32 {rows}x{n} failed: {type(exc).__name__}: {exc}"
        x64 = xh.astype(np.float64)
        ref = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * wh
        err = float(np.max(np.abs(y - ref)))
        if not err <= 1e-4:
            return False, f"probe kernel rms_norm_f32 {rows}x{n} returned wrong numbers (max error {err:.3g})"
    d = cupy.cuda.Device(0)
    return True, (f"{count} device(s), device 0 sm_{d.compute_capability}; kernels from "
                  f"{_MODULE_INFO['source']}")


# ----------------------------------------------------------------------------- arrays
def _kind(a) -> str:
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


def _dtype_name(a, kind: str) -> str:
    if kind.startswith("torch"):
        return str(a.dtype).replace("torch.", "")
    return np.dtype(a.dtype).name


def _device_id(a, kind: str) -> int:
    return a.device.id if kind == "cupy" else a.device.index


def _ptr(a, kind: str) -> int:
    return a.data.ptr if kind == "cupy" else a.data_ptr()


def _is_contig(a, kind: str) -> bool:
    return a.flags.c_contiguous if kind == "cupy" else a.is_contiguous()


class _Call:
    """One op call: checks that every array is on x's device, then holds device + stream."""

    def __init__(self, op: str, x, *others, names=()):
        self.op = op
        self.kind = _kind(x)
        if self.kind not in ("cupy", "torch"):
            raise TypeError(f"cuda {op}: x must be a CuPy array or a torch CUDA tensor, got {type(x).__name__}")
        self.dev = _device_id(x, self.kind)
        self.dtype = _dtype_name(x, self.kind)
        if not _is_contig(x, self.kind):
            raise ValueError(f"cuda {op}: x must be C-contiguous (the facade makes a contiguous copy)")
        for a, name in zip(others, names):
            if a is None:
                continue
            k = _kind(a)
            if k != self.kind:
                where = "a torch CPU tensor" if k == "torch-cpu" else type(a).__name__
                raise TypeError(f"cuda {op}: {name} is {where} but x is a {self.kind} array on cuda:{self.dev}; "
                                f"pass every array as the same kind on the same device")
            if _device_id(a, k) != self.dev:
                raise ValueError(f"cuda {op}: {name} is on cuda:{_device_id(a, k)} but x is on cuda:{self.dev}; "
                                 f"move it to x's device")
            if not _is_contig(a, k):
                raise ValueError(f"cuda {op}: {name} must be C-contiguous")

    @contextlib.contextmanager
    def on_device(self):
        import cupy
        with cupy.cuda.Device(self.dev):
            if self.kind == "torch":
                import torch
                ptr = torch.cuda.current_stream(self.dev).cuda_stream
                stream = _EXT_STREAMS.get((self.dev, ptr))
                if stream is None:  # one wrapper per torch stream: creating it costs µs per call
                    stream = _EXT_STREAMS[(self.dev, ptr)] = cupy.cuda.ExternalStream(ptr, self.dev)
                with stream:
                    yield
            else:
                yield

    def empty(self, like, shape):
        if _FAULT == "oom":
            import cupy
            nbytes = int(np.prod(shape)) * _ITEMSIZE.get(self.dtype, 4)
            raise cupy.cuda.memory.OutOfMemoryError(nbytes, 0, 0)
        if self.kind == "torch":
            import torch
            return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        import cupy
        return cupy.empty(tuple(shape), dtype=like.dtype)

    def cupy_view(self, a):
        """A CuPy view of a device array (float64/fallback math only): no copy."""
        import cupy
        return a if self.kind == "cupy" else cupy.asarray(a)


def _aligned(kind: str, *arrays) -> bool:
    return all(a is None or _ptr(a, kind) % _VEC_BYTES == 0 for a in arrays)


def _sm_count(dev: int) -> int:
    if dev not in _SM_COUNT:
        import cupy
        _SM_COUNT[dev] = int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"])
    return _SM_COUNT[dev]


def _row_launch(rows: int, n: int, dev: int):
    """One warp per row up to 512 columns (16 cached floats x 32 lanes), else one block per
    row of up to 512 threads (16 cached floats each: rows of 8192 stay in registers)."""
    if n <= 512:
        return (min(math.ceil(rows / 4), _sm_count(dev) * 64), 1, 1), (32, 4, 1)
    threads = min(512, max(64, 1 << max(0, math.ceil(math.log2(math.ceil(n / 16))))))
    return (min(rows, 1 << 20), 1, 1), (threads, 1, 1)


def _flat_launch(units: int, dev: int):
    return (max(1, min(math.ceil(units / 256), _sm_count(dev) * 16)), 1, 1), (256, 1, 1)


def _rows_cols_launch(rows: int, units: int):
    return (max(1, min(math.ceil(units / 256), 64)), min(rows, 65535), 1), (256, 1, 1)


def _p(a, kind):
    return np.uint64(_ptr(a, kind)) if a is not None else np.uint64(0)


# ----------------------------------------------------------------------------- ops
def _run(op, x, args_others, names, body, host_args=None):
    """Common path: NumPy input (only when the policy allows) goes to the GPU and back."""
    if _kind(x) == "numpy":
        return _via_device(op, x, args_others, names, body)
    call = _Call(op, x, *args_others, names=names)
    with _guard(op), call.on_device():
        return body(call)


def _via_device(op, x, others, names, body):
    import cupy
    with _guard(op):
        dx = cupy.asarray(x)
        dothers = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in others]
        out = dothers[-1] if names and names[-1] == "out" else None
        call = _Call(op, dx, *dothers, names=names)
        res = body(call, dx, *dothers)
        host = res.get()
        if out is not None and others[-1] is not None:
            np.copyto(others[-1], host)
            return others[-1]
        return host


def _f64_rms(xc, wc, eps):
    return xc / (((xc * xc).mean(-1, keepdims=True) + eps) ** 0.5) * wc


def rms_norm(x, weight, eps, out=None):
    def body(c, x=x, weight=weight, out=out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        if c.dtype == "float64":
            c.cupy_view(y)[...] = _f64_rms(c.cupy_view(x), c.cupy_view(weight), eps)
            return y
        vec = n % (_VEC_BYTES // _ITEMSIZE[c.dtype]) == 0 and _aligned(c.kind, x, weight, y)
        grid, block = _row_launch(rows, n, c.dev)
        _kernel(f"rms_norm_{_SUFFIX[c.dtype]}", c.dev)(grid, block, (
            _p(x, c.kind), _p(weight, c.kind), _p(y, c.kind), np.int64(rows), np.int32(n),
            np.float32(eps), np.int32(vec)))
        return y
    return _run("rms_norm", x, (weight, out), ("weight", "out"), body)


def layer_norm(x, weight, bias, eps, out=None):
    def body(c, x=x, weight=weight, bias=bias, out=out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        if c.dtype == "float64":
            xc = c.cupy_view(x)
            mu = xc.mean(-1, keepdims=True)
            d = xc - mu
            r = d / (((d * d).mean(-1, keepdims=True) + eps) ** 0.5) * c.cupy_view(weight)
            if bias is not None:
                r += c.cupy_view(bias)
            c.cupy_view(y)[...] = r
            return y
        vec = n % (_VEC_BYTES // _ITEMSIZE[c.dtype]) == 0 and _aligned(c.kind, x, weight, bias, y)
        grid, block = _row_launch(rows, n, c.dev)
        _kernel(f"layer_norm_{_SUFFIX[c.dtype]}", c.dev)(grid, block, (
            _p(x, c.kind), _p(weight, c.kind), _p(bias, c.kind), _p(y, c.kind), np.int64(rows),
            np.int32(n), np.float32(eps), np.int32(vec)))
        return y
    return _run("layer_norm", x, (weight, bias, out), ("weight", "bias", "out"), body)


def softmax(x, out=None):
    def body(c, x=x, out=out):
        rows, n = x.shape
        y = out if out is not None else c.empty(x, (rows, n))
        if c.dtype == "float64":
            xc = c.cupy_view(x)
            e = (xc - xc.max(-1, keepdims=True))
            import cupy
            e = cupy.exp(e)
            c.cupy_view(y)[...] = e / e.sum(-1, keepdims=True)
            return y
        vec = n % (_VEC_BYTES // _ITEMSIZE[c.dtype]) == 0 and _aligned(c.kind, x, y)
        grid, block = _row_launch(rows, n, c.dev)
        _kernel(f"softmax_{_SUFFIX[c.dtype]}", c.dev)(grid, block, (
            _p(x, c.kind), _p(y, c.kind), np.int64(rows), np.int32(n), np.int32(vec)))
        return y
    return _run("softmax", x, (out,), ("out",), body)


def _f64_act(name, xc):
    import cupy
    import cupyx.scipy.special as sp
    if name == "silu":
        return xc / (1.0 + cupy.exp(-xc))
    if name == "relu":
        return cupy.maximum(xc, 0)
    if name == "gelu":
        return 0.5 * xc * (1.0 + sp.erf(xc * 0.7071067811865476))
    return 0.5 * xc * (1.0 + cupy.tanh(0.7978845608028654 * (xc + 0.044715 * xc ** 3)))


def _unary(op, kname, x, out):
    def body(c, x=x, out=out):
        y = out if out is not None else c.empty(x, tuple(x.shape))
        if c.dtype == "float64":
            c.cupy_view(y)[...] = _f64_act(kname, c.cupy_view(x))
            return y
        numel = int(np.prod(x.shape))
        vec = _aligned(c.kind, x, y)
        grid, block = _flat_launch(numel // (_VEC_BYTES // _ITEMSIZE[c.dtype]) if vec else numel, c.dev)
        _kernel(f"{kname}_{_SUFFIX[c.dtype]}", c.dev)(grid, block, (
            _p(x, c.kind), _p(y, c.kind), np.int64(numel), np.int32(vec)))
        return y
    return _run(op, x, (out,), ("out",), body)


def silu(x, out=None):
    return _unary("silu", "silu", x, out)


def relu(x, out=None):
    return _unary("relu", "relu", x, out)


def gelu(x, approximate="none", out=None):
    return _unary("gelu", "gelu_tanh" if approximate == "tanh" else "gelu", x, out)


def _gated(op, kname, x, out):
    def body(c, x=x, out=out):
        rows, n2 = x.shape
        h = n2 // 2
        y = out if out is not None else c.empty(x, (rows, h))
        if c.dtype == "float64":
            xc = c.cupy_view(x)
            c.cupy_view(y)[...] = _f64_act(kname.replace("swiglu", "silu").replace("geglu", "gelu"),
                                           xc[:, :h]) * xc[:, h:]
            return y
        v = _VEC_BYTES // _ITEMSIZE[c.dtype]
        vec = h % v == 0 and _aligned(c.kind, x, y)
        grid, block = _rows_cols_launch(rows, h // v if vec else h)
        _kernel(f"{kname}_{_SUFFIX[c.dtype]}", c.dev)(grid, block, (
            _p(x, c.kind), _p(y, c.kind), np.int64(rows), np.int32(h), np.int32(vec)))
        return y
    return _run(op, x, (out,), ("out",), body)


def swiglu(x, out=None):
    return _gated("swiglu", "swiglu", x, out)


def geglu(x, approximate="none", out=None):
    return _gated("geglu", "geglu_tanh" if approximate == "tanh" else "geglu", x, out)


def rope(x, cos, sin, interleaved=False, out=None):
    def body(c, x=x, cos=cos, sin=sin, out=out):
        rows, n = x.shape
        t = int(cos.shape[0])
        y = out if out is not None else c.empty(x, (rows, n))
        if c.dtype == "float64":
            import cupy
            xc = c.cupy_view(x)
            pos = cupy.arange(rows) % t
            cc, ss = c.cupy_view(cos)[pos], c.cupy_view(sin)[pos]
            if interleaved:
                rot = cupy.empty_like(xc)
                rot[:, 0::2] = -xc[:, 1::2]
                rot[:, 1::2] = xc[:, 0::2]
            else:
                rot = cupy.concatenate([-xc[:, n // 2:], xc[:, :n // 2]], axis=-1)
            c.cupy_view(y)[...] = xc * cc + rot * ss
            return y
        if _dtype_name(cos, c.kind) != "float32" or _dtype_name(sin, c.kind) != "float32":
            raise TypeError(f"cuda rope: cos/sin must be float32 for {c.dtype} x, got "
                            f"{_dtype_name(cos, c.kind)}/{_dtype_name(sin, c.kind)}")
        # 4 elements per vector step (cos/sin are float32: 16 bytes); the scalar path steps
        # one pair (interleaved) or one i of the (i, i + n/2) pairs.
        vec = (n % 8 == 0 if not interleaved else n % 4 == 0) and \
            _aligned(c.kind, cos, sin) and all(_ptr(a, c.kind) % (4 * _ITEMSIZE[c.dtype]) == 0 for a in (x, y))
        units = (n // 4 if vec else n // 2) if interleaved else (n // 8 if vec else n // 2)
        grid, block = _rows_cols_launch(rows, units)
        _kernel(f"rope_{_SUFFIX[c.dtype]}", c.dev)(grid, block, (
            _p(x, c.kind), _p(cos, c.kind), _p(sin, c.kind), _p(y, c.kind), np.int64(rows),
            np.int32(n), np.int32(t), np.int32(bool(interleaved)), np.int32(vec)))
        return y
    return _run("rope", x, (cos, sin, out), ("cos", "sin", "out"), body)


def matmul(a, b, out=None):
    """cuBLAS through ``cupy.matmul`` (torch tensors: ``torch.matmul``, also cuBLAS)."""
    def body(c, a=a, b=b, out=out):
        if c.kind == "torch":
            import torch
            if _FAULT == "oom":
                c.empty(a, (1,))
            return torch.matmul(a, b, out=out)
        import cupy
        if out is None and _FAULT == "oom":
            c.empty(a, (1,))
        return cupy.matmul(a, b, out=out)
    return _run("matmul", a, (b, out), ("b", "out"), body)


_FNS = {"rms_norm": rms_norm, "layer_norm": layer_norm, "softmax": softmax, "silu": silu,
        "relu": relu, "gelu": gelu, "swiglu": swiglu, "geglu": geglu, "rope": rope, "matmul": matmul}
_DEVICE_DTYPES = frozenset(("float32", "float16", "bfloat16", "float64"))


def _supports_for(op: str):
    def supports(x, *rest, **kw) -> bool:
        k = _kind(x)
        if k in ("cupy", "torch"):
            return _dtype_name(x, k) in _DEVICE_DTYPES
        if k == "numpy":
            # The resolver only lets host arrays reach this check when an order names cuda
            # (HOST_ARRAYS below); a per-op threshold can still keep small copies off the GPU.
            return x.nbytes >= _HOST_COPY_MIN_BYTES.get(op, 0) and x.dtype.name in ("float32", "float16")
        return False
    supports.__name__ = f"cuda_supports_{op}"
    return supports


def register(registry) -> None:
    """Register one ``default.cuda`` OpImpl per op (imports nothing native)."""
    from tensor_ops._registry import BackendImplKind, OpImpl
    for op in OPS:
        registry.register_impl(OpImpl(op_name=op, impl_id=f"default.{NAME}", kind=BackendImplKind.DEFAULT,
                                      fn=_FNS[op], backend=NAME, supports=_supports_for(op),
                                      available=availability, api="facade"))


# ----------------------------------------------------------------------------- info
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


def get_cuda_info() -> dict:
    """Devices, runtime/driver versions, fatbin path and archs, NVRTC fallback; never raises."""
    ok, reason = availability()
    rec = fatbin_record()
    info: dict = {
        "available": ok, "reason": reason,
        "fatbin": {"path": str(FATBIN_PATH), "exists": FATBIN_PATH.is_file(),
                   "archs": rec.get("archs"), "ptx": rec.get("ptx"),
                   "nvcc_version": rec.get("nvcc_version"), "built_at": rec.get("built_at")},
        "kernels_from": _MODULE_INFO["source"],
        "nvrtc_fallback": _MODULE_INFO["source"] == "nvrtc",
        "nvrtc_reason": _MODULE_INFO["nvrtc_reason"],
        "host_copy_min_bytes": dict(_HOST_COPY_MIN_BYTES),
        "devices": [],
    }
    try:
        import cupy
        info["cupy"] = cupy.__version__
    except Exception:
        info["cupy"] = None
        return info
    try:
        rt = cupy.cuda.runtime
        info["runtime_version"] = rt.runtimeGetVersion()
        info["driver_version"] = rt.driverGetVersion()
        for i in range(rt.getDeviceCount()):
            p = rt.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            info["devices"].append({"index": i, "name": name,
                                    "compute_capability": f"{p['major']}.{p['minor']}",
                                    "memory_bytes": int(p["totalGlobalMem"]),
                                    "multiprocessors": int(p["multiProcessorCount"])})
    except Exception as exc:
        info["device_error"] = f"{type(exc).__name__}: {exc}"
    return info


def info() -> dict:
    return get_cuda_info()
