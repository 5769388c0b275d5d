"""CUDA backend: build (nvcc → fatbin, symbols via cuobjdump), NVRTC source validity,
availability reasons (no device / no CuPy), error handling, and — on a GPU — every kernel
against an fp64 NumPy reference with CuPy and torch inputs.

Without a GPU the device tests skip with the backend's recorded reason ("no CUDA device: …").
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import tensor_ops
from tensor_ops._ops._tolerance import TOLERANCES
from tensor_ops.backends import cuda
from tests._helpers import skip_if_tsan_cannot_start, tsan_toolchain

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]


def _load_build():
    path = ROOT / "tensor_ops" / "_build" / "cuda_build.py"
    spec = importlib.util.spec_from_file_location("_test_cuda_build", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


cb = _load_build()
NVCC = cb.find_tool("nvcc")
CUOBJDUMP = cb.find_tool("cuobjdump")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
needs_cuobjdump = pytest.mark.skipif(CUOBJDUMP is None,
                                     reason="cuobjdump not found (pip install nvidia-cuda-cuobjdump)")


def _entries(ptx: str) -> set:
    return set(re.findall(r"\.entry\s+(\w+)", ptx))


# ----------------------------------------------------------------------------- sources
def test_kernel_names_agree_between_build_and_runtime():
    syms = set(cb.kernel_symbols())
    assert len(syms) == len(cb.KERNEL_OPS) * 3
    # one prefix for every exported kernel, the same in the build, the runtime and OpenCL
    assert cb.SYMBOL_PREFIX == cuda.module.SYMBOL_PREFIX == "to_" and all(s.startswith("to_") for s in syms)
    from tensor_ops.backends.opencl import programs
    assert programs.SYMBOL_PREFIX == cb.SYMBOL_PREFIX
    # Every kernel name the runtime launches is one the build checks for, in every dtype.
    assert {f"to_{k}_{s}" for k in cuda.ops.KERNEL_NAMES for s in cuda.ops.SUFFIX.values()} == syms
    launched = set(re.findall(r'(?:_launch\(c, |_unary\("\w+", |_gated\("\w+", )"(\w+)"',
                              Path(cuda.ops.__file__).read_text()))
    assert launched <= set(cuda.ops.KERNEL_NAMES) and {"rms_norm", "silu", "swiglu", "rope"} <= launched
    src = cuda.nvrtc_source()
    assert "#include" not in src.replace("// common.cuh inlined above", "")


@needs_nvcc
@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "cuda_ext").glob("*.cu")))
def test_each_source_compiles_to_ptx_with_nvcc(name, tmp_path):
    out = tmp_path / "k.ptx"
    proc = subprocess.run([NVCC, "-ptx", "-std=c++17", "-arch=compute_75", "-I", str(ROOT / "cuda_ext"),
                           "-o", str(out), str(ROOT / "cuda_ext" / name)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    assert _entries(out.read_text()), f"{name} defines no kernel"


def _nvrtc():
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
        return nvrtc
    except Exception as exc:  # noqa: BLE001 - any failure means: no NVRTC here
        pytest.skip(f"NVRTC not loadable through CuPy: {type(exc).__name__}: {exc}")


def test_nvrtc_compiles_the_runtime_source():
    """The exact text and options the runtime fallback hands NVRTC compile (no GPU needed)."""
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(cuda.nvrtc_source(), "tensor_ops_kernels.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [*cuda.NVRTC_OPTIONS, "-arch=compute_75"])
        except Exception:
            pytest.fail(nvrtc.getProgramLog(prog))
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert _entries(ptx) == set(cb.kernel_symbols())


# ----------------------------------------------------------------------------- build
def test_parse_archs():
    sup = [75, 80, 90, 120]
    assert cb.parse_archs("75,90", sup) == [75, 90]
    assert cb.parse_archs("sm_90 sm_75", sup) == [75, 90]
    assert cb.parse_archs("all", sup) == sup
    with pytest.raises(ValueError, match="sm_61 is not supported"):
        cb.parse_archs("61", sup)
    with pytest.raises(ValueError, match="not an architecture"):
        cb.parse_archs("hopper", sup)


@needs_nvcc
def test_supported_archs_come_from_nvcc():
    sms, ptx = cb.supported_archs(NVCC)
    assert sms and min(sms) >= 75 and ptx >= max(sms) - 1 and ptx >= 75


def test_build_without_nvcc_says_why(monkeypatch, capsys):
    monkeypatch.setattr(cb, "find_tool", lambda name: None)
    cmd = cb.BuildCuda.__new__(cb.BuildCuda)
    cmd.initialize_options()
    cmd.finalize_options()
    with pytest.raises(SystemExit) as ei:
        cmd.run()
    assert ei.value.code == 1
    assert "nvcc not found" in capsys.readouterr().err


@needs_nvcc
def test_nvcc_failure_exits_nonzero_with_its_output(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "common.cuh").write_text((ROOT / "cuda_ext" / "common.cuh").read_text())
    (src / "broken.cu").write_text('#include "common.cuh"\nextern "C" __global__ void k() { undefined_thing(); }\n')
    with pytest.raises(cb.CudaBuildError, match="undefined_thing"):
        cb.build_fatbin(tmp_path / "x.fatbin", archs=[75], src_dir=src, record=False, log=lambda *_: None)
    assert not (tmp_path / "x.fatbin").exists()


@needs_nvcc
@needs_cuobjdump
def test_build_one_arch_records_and_holds_every_symbol(tmp_path, monkeypatch):
    cfg = tmp_path / "backend.json"
    cfg.write_text(json.dumps({"schema_version": 1, "priority": ["cpp", "numpy"]}))
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(cfg))
    out = tmp_path / "k.fatbin"
    info = cb.build_fatbin(out, archs=[75], log=lambda *_: None)
    data = json.loads(cfg.read_text())
    assert data["priority"] == ["cpp", "numpy"], "other keys must survive"
    rec = data["built"]["cuda"]
    assert rec["archs"] == ["sm_75"] and rec["ptx"] == "compute_75"
    assert rec["kernels"] == cb.kernel_symbols() and rec["nvcc_version"]
    assert json.loads(Path(str(out) + ".json").read_text())["sources_sha256"] == info["sources_sha256"]
    res = cb.check_fatbin(out, expected_archs=["sm_75"])
    assert res["archs"] == ["sm_75"] and res["ptx"]


@needs_nvcc
@needs_cuobjdump
def test_symbol_check_names_missing_kernels(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("common.cuh", "rope.cu"):
        (src / name).write_text((ROOT / "cuda_ext" / name).read_text())
    out = tmp_path / "partial.fatbin"
    cb.build_fatbin(out, archs=[75], src_dir=src, record=False, log=lambda *_: None)
    with pytest.raises(cb.CudaBuildError, match=r"sm_75 lacks .*to_rms_norm_f32"):
        cb.check_fatbin(out)
    with pytest.raises(cb.CudaBuildError, match="no SASS for sm_90"):
        cb.check_fatbin(out, expected_archs=["sm_75", "sm_90"])


@needs_cuobjdump
def test_check_without_fatbin_says_build_first(tmp_path):
    with pytest.raises(cb.CudaBuildError, match="run `python setup.py build_cuda` first"):
        cb.check_fatbin(tmp_path / "none.fatbin")


# ----------------------------------------------------------------------------- availability
def _cupy_device_reason():
    try:
        import cupy
    except ImportError:
        return None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"no CUDA device: cupy.cuda.runtime.getDeviceCount() failed: {exc}"
    return None if n else "no CUDA device: cupy.cuda.runtime.getDeviceCount() returned 0"


def test_unavailable_without_device_says_so():
    expected = _cupy_device_reason()
    if expected is None:
        pytest.skip("CuPy missing or a CUDA device is present: this checks the no-device reason")
    ok, reason = cuda.availability()
    assert not ok and reason == expected
    info = cuda.get_cuda_info()
    assert info["available"] is False and info["reason"] == expected and info["devices"] == []


def _run_py(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(ROOT), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def test_unavailable_without_cupy_says_which_wheel():
    proc = _run_py("""
        import sys
        sys.modules["cupy"] = None  # as if CuPy were not installed
        import tensor_ops.backends.cuda as c
        ok, reason = c.availability()
        assert ok is False, reason
        assert reason.startswith("CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"), reason
        info = c.get_cuda_info()
        assert info["cupy"] is None and info["available"] is False
        print("OK", reason)
    """)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout


def test_import_and_register_load_nothing_native():
    proc = _run_py("""
        import sys
        import tensor_ops
        from tensor_ops._registry import OpRegistry
        import tensor_ops.backends.cuda as c
        reg = OpRegistry()
        c.BACKEND.register(reg)
        assert {i.op_name for i in reg.all_impls()} == set(c.OPS)
        assert all(i.impl_id == "default.cuda" and i.backend == "cuda" for i in reg.all_impls())
        bad = [m for m in ("cupy", "torch") if m in sys.modules]
        assert not bad, bad
        print("OK")
    """)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout


def test_registered_in_global_registry_with_reason():
    reg = tensor_ops.get_registry()
    ids = {i.impl_id for i in reg.get_impls("rms_norm")}
    assert "default.cuda" in ids
    ok, reason = cuda.availability()
    if not ok:
        assert reason  # unavailable always carries its reason


def test_forcing_unavailable_cuda_is_an_error_with_the_reason():
    ok, reason = cuda.availability()
    if ok:
        pytest.skip("a CUDA device is present")
    x = np.ones((2, 8), np.float32)
    with pytest.raises(RuntimeError) as ei:
        tensor_ops.rms_norm(x, np.ones(8, np.float32), backend="cuda")
    assert "cuda" in str(ei.value)


def test_numpy_input_needs_cuda_named_and_respects_the_threshold():
    x = np.ones((4, 1024), np.float32)
    sup = cuda.ops.supports_for("rms_norm")
    assert cuda.BACKEND.device_only               # the resolver keeps host data off the GPU by default
    assert sup(x, np.ones(1024, np.float32), 1e-6, None)
    assert not sup(x.astype(np.float64), np.ones(1024), 1e-6, None)
    cuda.set_host_copy_policy("rms_norm", 1 << 14)
    try:
        assert sup(x, np.ones(1024, np.float32), 1e-6, None)
        assert not sup(x[:1], np.ones(1024, np.float32), 1e-6, None)  # below the threshold
    finally:
        cuda.set_host_copy_policy("rms_norm", None)
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        cuda.set_host_copy_policy("nope", 1)
    with pytest.raises(ValueError, match="min_bytes"):
        cuda.set_host_copy_policy("rms_norm", -1)


# ----------------------------------------------------------------------------- errors (no GPU)
class _FakeCudaTensor:
    """Looks like a torch CUDA tensor to the backend's checks (no GPU needed)."""

    def __init__(self, index=0, dtype="torch.float32", contiguous=True):
        self.device = types.SimpleNamespace(index=index, type="cuda")
        self.dtype = dtype
        self.is_cuda = True
        self._contig = contiguous
        self.shape = (2, 4)

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return 0


_FakeCudaTensor.__module__ = "torch.fake"


def test_cpu_tensor_mixed_with_cuda_is_a_type_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="weight is a torch CPU tensor but x is a torch array on cuda:0"):
        cuda.rms_norm(_FakeCudaTensor(), torch.ones(4), 1e-6, None)
    with pytest.raises(TypeError, match="x must be a CuPy array or a torch CUDA tensor"):
        cuda.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6, None)


def test_arrays_on_different_devices_are_a_value_error():
    with pytest.raises(ValueError, match="weight is on cuda:1 but x is on cuda:0"):
        cuda.rms_norm(_FakeCudaTensor(0), _FakeCudaTensor(1), 1e-6, None)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        cuda.softmax(_FakeCudaTensor(0), _FakeCudaTensor(0, contiguous=False))


def test_injected_oom_is_a_backend_error():
    pytest.importorskip("cupy")
    call = cuda.arrays.Call.__new__(cuda.arrays.Call)
    call.kind, call.dtype = "cupy", "float32"
    with cuda.BACKEND.inject_fault("oom"):
        with pytest.raises(tensor_ops.BackendError, match="rms_norm out of memory: OutOfMemoryError"):
            with cuda.arrays.guard("rms_norm"):
                call.empty(None, (1024, 1024))
    with pytest.raises(ValueError, match="injects faults"):
        with cuda.BACKEND.inject_fault("bogus"):
            pass
    assert cuda.BACKEND.fault is None
    # user errors pass through the guard untouched
    with pytest.raises(ValueError, match="mine"):
        with cuda.arrays.guard("rms_norm"):
            raise ValueError("mine")


def test_injected_launch_failure_is_a_backend_error():
    """No GPU needed: the launch hook fails in the kernel lookup, before CuPy is touched."""
    with cuda.BACKEND.inject_fault("launch"):
        with pytest.raises(tensor_ops.BackendError, match="injected launch failure for to_silu_f32"):
            cuda.module.kernel("silu_f32")
    assert cuda.BACKEND.fault is None


def test_float64_is_declined_and_left_to_the_cupy_reference():
    """The kernels take float32/float16/bfloat16: supports() declines float64 device arrays
    (reference.cupy serves them) and a direct call says so as a backend failure."""
    f64 = _FakeCudaTensor(dtype="torch.float64")
    assert not cuda.ops.supports_for("silu")(f64, None)
    assert cuda.ops.supports_for("silu")(_FakeCudaTensor(dtype="torch.bfloat16"), None)
    with pytest.raises(tensor_ops.BackendError, match="float64 is served by the CuPy reference"):
        cuda.ops._launch(types.SimpleNamespace(op="silu", dtype="float64", dev=0), "silu", None, None, ())
    assert "matmul" not in cuda.BACKEND.ops


# ----------------------------------------------------------------------------- on a GPU
def _require_gpu():
    ok, reason = cuda.availability()
    if not ok:
        pytest.skip(reason)
    import cupy
    return cupy


def _ref(op, x, extra):
    x = x.astype(np.float64)
    h = x.shape[-1] // 2
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    from scipy.special import erf
    gelu = lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2)))  # noqa: E731
    gelu_t = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))  # noqa: E731
    if op == "rms_norm":
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * extra["w"]
    if op == "layer_norm":
        d = x - x.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * extra["w"] + extra["b"]
    if op == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if op == "silu":
        return silu(x)
    if op == "relu":
        return np.maximum(x, 0)
    if op == "gelu":
        return gelu(x)
    if op == "gelu_tanh":
        return gelu_t(x)
    if op == "swiglu":
        return silu(x[:, :h]) * x[:, h:]
    if op == "geglu":
        return gelu(x[:, :h]) * x[:, h:]
    if op == "rope":
        c, s = extra["cos"][np.arange(x.shape[0]) % extra["cos"].shape[0]], \
            extra["sin"][np.arange(x.shape[0]) % extra["sin"].shape[0]]
        if extra["interleaved"]:
            rot = np.empty_like(x)
            rot[:, 0::2], rot[:, 1::2] = -x[:, 1::2], x[:, 0::2]
        else:
            rot = np.concatenate([-x[:, h:], x[:, :h]], -1)
        return x * c + rot * s
    raise AssertionError(op)


OPS = ["rms_norm", "layer_norm", "softmax", "silu", "relu", "gelu", "gelu_tanh", "swiglu", "geglu", "rope",
       "rope_interleaved"]
SHAPES = [(1, 8), (3, 37), (4, 64), (2, 514), (3, 1000), (2, 4096), (2, 8200), (2, 20000)]
#: the one tolerance table's conformance level (tensor_ops/_ops/_tolerance.py); reductions widen
#: atol by max(1, sqrt(n) / 8) below, as the table's reduction class does
TOL = {d: TOLERANCES["conformance"][d] for d in ("float32", "float16", "bfloat16")}


def _call(op, xd, extra_d, out=None):
    if op == "rms_norm":
        return cuda.rms_norm(xd, extra_d["w"], 1e-6, out)
    if op == "layer_norm":
        return cuda.layer_norm(xd, extra_d["w"], extra_d["b"], 1e-5, out)
    if op in ("softmax", "silu", "relu", "swiglu"):
        return getattr(cuda, op)(xd, out)
    if op in ("gelu", "gelu_tanh"):
        return cuda.gelu(xd, "tanh" if op == "gelu_tanh" else "none", out)
    if op == "geglu":
        return cuda.geglu(xd, "none", out)
    return cuda.rope(xd, extra_d["cos"], extra_d["sin"], extra_d["interleaved"], out)


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset1"])
def test_kernel_matches_fp64_reference(op, shape, dtype, lib, offset):
    cupy = _require_gpu()
    if op.startswith("rope") or op in ("swiglu", "geglu"):
        shape = (shape[0], shape[1] + shape[1] % 2)
    if lib == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16 dtype; bf16 is covered with torch tensors")
    torch = pytest.importorskip("torch") if lib == "torch" else None
    if torch is not None and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    rng = np.random.default_rng(hash((op, shape)) % 2**32)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    n = shape[1]
    extra = {"w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32),
             "cos": rng.standard_normal((5, n)).astype(np.float32),
             "sin": rng.standard_normal((5, n)).astype(np.float32),
             "interleaved": op == "rope_interleaved"}
    name = "rope" if op.startswith("rope") else op

    def dev(a, dt):
        # offset=1 puts the array one element past a 16-byte boundary: the scalar path.
        if lib == "cupy":
            buf = cupy.empty(a.size + offset, dtype=dt)
            v = buf[offset:].reshape(a.shape)
            v[...] = cupy.asarray(a.astype(dt))
            return v
        tdt = getattr(torch, dt)
        buf = torch.empty(a.size + offset, dtype=tdt, device="cuda")
        v = buf[offset:].view(a.shape)
        v.copy_(torch.from_numpy(a).to(tdt))
        return v

    xd = dev(x, dtype)
    extra_d = {k: (dev(v, "float32" if k in ("cos", "sin") else dtype) if isinstance(v, np.ndarray) else v)
               for k, v in extra.items()}
    # Reference from the rounded inputs, so only the kernel's error is measured.
    def host(a):
        return a.get().astype(np.float64) if lib == "cupy" else a.float().cpu().numpy().astype(np.float64)
    ref = _ref(name if op != "gelu_tanh" else op, host(xd),
               {k: host(v) if not isinstance(v, bool) else v for k, v in extra_d.items()})
    y = _call(op, xd, extra_d)
    assert type(y) is type(xd)
    rtol, atol = TOL[dtype]
    if name in ("rms_norm", "layer_norm", "softmax"):
        atol *= max(1.0, np.sqrt(n) / 8)
    np.testing.assert_allclose(host(y), ref, rtol=rtol, atol=atol)
    out = dev(np.zeros(ref.shape, np.float32), dtype)
    assert _call(op, xd, extra_d, out) is out
    np.testing.assert_allclose(host(out), ref, rtol=rtol, atol=atol)


def test_torch_on_a_side_stream_and_no_copy():
    _require_gpu()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    x = torch.randn(64, 4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    ptr = x.data_ptr()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = cuda.rms_norm(x, w, 1e-6, None)
        ref = torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)
    s.synchronize()
    assert x.data_ptr() == ptr and y.device == x.device
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_facade_with_cupy_and_injected_oom():
    cupy = _require_gpu()
    x = cupy.random.standard_normal((8, 256), dtype=cupy.float32)
    w = cupy.ones(256, cupy.float32)
    y = tensor_ops.rms_norm(x, w, backend="cuda")
    assert isinstance(y, cupy.ndarray)
    with cuda.BACKEND.inject_fault("oom"):
        with pytest.raises(RuntimeError, match="out of memory"):
            tensor_ops.rms_norm(x, w, backend="cuda")


def test_float64_and_matmul_on_device_arrays_go_to_the_cupy_reference():
    """What the kernels do not take (float64, matmul) is served by reference.cupy, in place."""
    cupy = _require_gpu()
    rng = np.random.default_rng(12)
    xh, wh = rng.standard_normal((4, 64)), rng.standard_normal(64)
    y = tensor_ops.rms_norm(cupy.asarray(xh), cupy.asarray(wh))
    assert isinstance(y, cupy.ndarray) and y.dtype == np.float64
    np.testing.assert_allclose(y.get(), xh / np.sqrt((xh * xh).mean(-1, keepdims=True) + 1e-6) * wh, rtol=1e-12)
    a, b = (rng.standard_normal((8, 16)).astype(np.float32) for _ in range(2))
    m = tensor_ops.matmul(cupy.asarray(a), cupy.asarray(b.T.copy()))
    np.testing.assert_allclose(m.get(), a @ b.T, rtol=1e-5, atol=1e-5)
    calls = tensor_ops.get_backend_info()["ops"]
    assert calls["rms_norm"]["calls"].get("reference.cupy", 0) >= 1
    assert calls["matmul"]["calls"].get("reference.cupy", 0) >= 1
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        t = torch.from_numpy(xh).cuda()
        yt = tensor_ops.silu(t)
        assert isinstance(yt, torch.Tensor) and yt.is_cuda and yt.dtype == torch.float64
        np.testing.assert_allclose(yt.cpu().numpy(), xh / (1 + np.exp(-xh)), rtol=1e-12)


def test_nvrtc_fallback_on_gpu(monkeypatch, tmp_path):
    _require_gpu()
    monkeypatch.setattr(cuda.module, "FATBIN_PATH", tmp_path / "missing.fatbin")
    cuda._reset_for_tests()
    try:
        ok, reason = cuda.availability()
        assert ok, reason
        info = cuda.get_cuda_info()
        assert info["nvrtc_fallback"] and "no fatbin" in info["nvrtc_reason"]
    finally:
        monkeypatch.undo()
        cuda._reset_for_tests()


# ----------------------------------------------------------------------------- CPU emulation
# No GPU in CI: the real kernel sources, compiled with g++ against a tiny CUDA emulation (a
# fiber per CUDA thread, or under ThreadSanitizer a std::thread; barriers for __syncthreads and
# warp shuffles), are launched through the backend's own Python path (launch shapes,
# vector/alignment flags, argument packing). Misaligned vector accesses are detected. This
# checks the kernels' logic; the GPU tests above remain the real verification.
EMU_HARNESS = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <functional>
#include <immintrin.h>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

struct uint3 { unsigned x = 0, y = 0, z = 0; };
struct dim3 { unsigned x = 1, y = 1, z = 1; };
#if defined(__SANITIZE_THREAD__)
// Under ThreadSanitizer: one std::thread per CUDA thread, so a missing barrier is a data race.
using EmuBar = std::barrier<>;
#else
// Otherwise the CUDA threads of a block are fibers (ucontext) on the launching thread, run in
// turn from barrier to barrier: the same results without 256-1024 OS threads per block and their
// futex handoffs (`pytest tests/test_cuda.py -k emulation`, 656 tests: 178 -> 34 s on a 2-core
// VM, the harness's ~8 s compile included; CONTRIBUTING "How long the suite takes"). The scheduler
// sets the per-thread globals below before it resumes a fiber (thread_local all the same: each
// launching OS thread runs its own fibers).
#include <ucontext.h>
void emu_yield();
struct EmuBar {  // std::barrier's two calls, cooperatively
    explicit EmuBar(long n) : expected(n) {}
    void arrive_and_wait() {
        const long g = gen;
        if (++arrived == expected) {
            arrived = 0;
            ++gen;
            return;
        }
        while (gen == g) emu_yield();
    }
    void arrive_and_drop() {
        if (--expected == arrived && arrived > 0) {
            arrived = 0;
            ++gen;
        }
    }
    long expected, arrived = 0, gen = 0;
};
#endif
thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;
thread_local EmuBar* emu_block_bar;
thread_local EmuBar* emu_warp_bar;
thread_local float* emu_warp_buf;
thread_local int emu_lane;
static std::atomic<bool> emu_misaligned{false};

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define TO_HOST_EMULATION 1
#define TO_EMU_CHECK_ALIGN(p, a) \
    do { if (reinterpret_cast<std::uintptr_t>(p) % (a)) emu_misaligned.store(true); } while (0)

inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    emu_warp_buf[emu_lane] = v;
    emu_warp_bar->arrive_and_wait();
    float r = emu_warp_buf[emu_lane ^ o];
    emu_warp_bar->arrive_and_wait();
    return r;
}
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

@INCLUDES@

template <typename... A, std::size_t... I>
void emu_call(void (*k)(A...), void** a, std::index_sequence<I...>) {
    k(*static_cast<std::remove_reference_t<A>*>(a[I])...);
}
template <typename... A>
std::function<void(void**)> emu_wrap(void (*k)(A...)) {
    return [k](void** a) { emu_call(k, a, std::index_sequence_for<A...>{}); };
}
static const std::map<std::string, std::function<void(void**)>>& emu_kernels() {
    static const std::map<std::string, std::function<void(void**)>> m = {@REGISTRY@};
    return m;
}

// One block's barriers and warp-shuffle buffers; enter(t) sets CUDA thread t's globals.
struct EmuBlock {
    EmuBlock(unsigned x, unsigned y, unsigned gx, unsigned gy, unsigned bx, unsigned by)
        : x(x), y(y), gx(gx), gy(gy), bx(bx), by(by), bar(bx * by), buf((bx * by + 31) / 32 * 32) {
        for (unsigned w = 0; w * 32 < bx * by; ++w) wbar.emplace_back(new EmuBar(std::min(32u, bx * by - 32 * w)));
    }
    void enter(unsigned t) {
        threadIdx = {t % bx, t / bx, 0};
        blockIdx = {x, y, 0};
        blockDim = {bx, by, 1};
        gridDim = {gx, gy, 1};
        emu_block_bar = &bar;
        emu_warp_bar = wbar[t / 32].get();
        emu_warp_buf = &buf[(t / 32) * 32];
        emu_lane = t % 32;
    }
    unsigned x, y, gx, gy, bx, by;
    EmuBar bar;
    std::vector<std::unique_ptr<EmuBar>> wbar;
    std::vector<float> buf;
};
using EmuFn = std::function<void(void**)>;

#if defined(__SANITIZE_THREAD__)
static void emu_run(const EmuFn& fn, void** args, unsigned gx, unsigned gy, unsigned bx, unsigned by) {
    for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
            EmuBlock blk(x, y, gx, gy, bx, by);
            std::vector<std::thread> th;
            for (unsigned t = 0; t < bx * by; ++t) {
                th.emplace_back([&, t] {
                    blk.enter(t);
                    fn(args);
                    emu_warp_bar->arrive_and_drop();
                    emu_block_bar->arrive_and_drop();
                });
            }
            for (auto& t : th) t.join();
        }
    }
}
#else
thread_local ucontext_t emu_sched;
thread_local ucontext_t* emu_cur_ctx;
void emu_yield() { swapcontext(emu_cur_ctx, &emu_sched); }
struct EmuFiber {
    ucontext_t ctx;
    bool done;
};
thread_local const EmuFn* emu_fn;
thread_local void** emu_args;
thread_local EmuFiber* emu_cur;
static void emu_fiber_main() {
    EmuFiber* f = emu_cur;
    (*emu_fn)(emu_args);
    emu_warp_bar->arrive_and_drop();
    emu_block_bar->arrive_and_drop();
    f->done = true;  // returning resumes uc_link, the scheduler
}
static void emu_run(const EmuFn& fn, void** args, unsigned gx, unsigned gy, unsigned bx, unsigned by) {
    constexpr size_t STACK = 128 << 10;
    const unsigned nt = bx * by;
    std::unique_ptr<char[]> stacks(new char[STACK * nt]);
    std::vector<EmuFiber> fib(nt);
    emu_fn = &fn;
    emu_args = args;
    for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
            EmuBlock blk(x, y, gx, gy, bx, by);
            for (unsigned t = 0; t < nt; ++t) {
                getcontext(&fib[t].ctx);
                fib[t].ctx.uc_stack.ss_sp = stacks.get() + STACK * t;
                fib[t].ctx.uc_stack.ss_size = STACK;
                fib[t].ctx.uc_link = &emu_sched;
                fib[t].done = false;
                makecontext(&fib[t].ctx, emu_fiber_main, 0);
            }
            for (unsigned live = nt; live;) {  // in turn, each to its next barrier or its end
                for (unsigned t = 0; t < nt; ++t) {
                    if (fib[t].done) continue;
                    blk.enter(t);
                    emu_cur = &fib[t];
                    emu_cur_ctx = &fib[t].ctx;
                    swapcontext(&emu_sched, &fib[t].ctx);
                    live -= fib[t].done;
                }
            }
        }
    }
}
#endif

extern "C" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned bx, unsigned by, void** args) {
    auto it = emu_kernels().find(name);
    if (it == emu_kernels().end()) return -1;
    emu_misaligned = false;
    emu_run(it->second, args, gx, gy, bx, by);
    return emu_misaligned ? 2 : 0;
}
"""


@pytest.fixture(scope="session")
def emu_lib(tmp_path_factory):
    import ctypes
    import shutil
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the CPU emulation of the CUDA kernels needs it")
    d = tmp_path_factory.mktemp("cuda_emu")
    srcs = sorted((ROOT / "cuda_ext").glob("*.cu"))
    text = EMU_HARNESS.replace("@INCLUDES@", "\n".join(f'#include "{p}"' for p in srcs))
    text = text.replace("@REGISTRY@", ", ".join(f'{{"{k}", emu_wrap(&{k})}}' for k in cb.kernel_symbols()))
    (d / "emu.cpp").write_text(text)
    so = d / "emu.so"
    proc = subprocess.run([gxx, "-std=c++20", "-O1", "-mf16c", "-fPIC", "-shared", "-pthread",
                           "-I", str(ROOT / "cuda_ext"), "-o", str(so), str(d / "emu.cpp")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:]
    lib = ctypes.CDLL(str(so))
    lib.emu_launch.restype = ctypes.c_int
    lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                               ctypes.POINTER(ctypes.c_void_p)]
    return lib


class _EmuTensor:
    """Host memory posing as a torch CUDA tensor (storage: float32 or uint16 bits)."""

    def __init__(self, arr, dtype_name):
        self.arr, self.dtype_name = arr, dtype_name
        self.dtype = f"torch.{dtype_name}"
        self.shape = arr.shape
        self.device = types.SimpleNamespace(index=0, type="cuda")
        self.is_cuda = True

    def data_ptr(self):
        return self.arr.ctypes.data

    def is_contiguous(self):
        return self.arr.flags.c_contiguous


_EmuTensor.__module__ = "torch.emu"
_STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def _emu_empty(shape, dtype_name, offset=0):
    st = np.dtype(_STORAGE[dtype_name])
    count = int(np.prod(shape))
    raw = np.zeros(count * st.itemsize + 64 + offset * st.itemsize, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset * st.itemsize
    return _EmuTensor(raw[start:start + count * st.itemsize].view(st).reshape(shape), dtype_name)


def _to_storage(a, dtype_name):
    a = np.asarray(a, np.float32)
    if dtype_name == "bfloat16":
        u = a.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return a.astype(_STORAGE[dtype_name])


def _from_storage(t):
    if t.dtype_name == "bfloat16":
        return (t.arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return t.arr.astype(np.float64)


@pytest.fixture
def emu(emu_lib, monkeypatch):
    """The backend's own path down to the loaded module: a stand-in for the RawModule whose
    ``get_function(symbol)`` launches the emulated kernel of that exported symbol (so the
    lookup by ``to_<name>_<dtype>``, the kernel cache and the launch hook are exercised)."""
    import ctypes
    import contextlib

    def get_function(symbol):
        def launch(grid, block, args):
            cargs = []
            for a in args:
                if isinstance(a, np.uint64):
                    cargs.append(ctypes.c_void_p(int(a)))
                elif isinstance(a, np.int64):
                    cargs.append(ctypes.c_longlong(int(a)))
                elif isinstance(a, np.int32):
                    cargs.append(ctypes.c_int(int(a)))
                elif isinstance(a, np.float32):
                    cargs.append(ctypes.c_float(float(a)))
                else:
                    raise AssertionError(f"{symbol}: unexpected kernel argument {a!r}")
            ptrs = (ctypes.c_void_p * len(cargs))(*[ctypes.cast(ctypes.pointer(c), ctypes.c_void_p) for c in cargs])
            assert grid[2] == 1 and block[2] == 1
            assert block[0] * block[1] <= 1024 and grid[1] <= 65535
            rc = emu_lib.emu_launch(symbol.encode(), grid[0], grid[1], block[0], block[1], ptrs)
            assert rc != -1, f"no kernel {symbol}"
            assert rc != 2, f"{symbol}: a vector access was misaligned (grid {grid}, block {block}, args {args})"
        return launch

    monkeypatch.setattr(cuda.module, "_MODULE", types.SimpleNamespace(get_function=get_function))
    monkeypatch.setattr(cuda.module, "KERNELS", {})
    monkeypatch.setattr(cuda.arrays.Call, "on_device", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(cuda.arrays.Call, "empty", lambda self, like, shape: _emu_empty(tuple(shape), like.dtype_name))
    monkeypatch.setitem(cuda.state.SM_COUNT, 0, 2)
    return get_function


# 8200: streamed fp32 rows, register-cached 16-bit ones (common.cuh CACHE_BYTES); 16400: streamed in
# every dtype.
EMU_SHAPES = [(1, 8), (3, 37), (5, 64), (2, 514), (3, 1000), (1, 8200), (1, 16400)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", EMU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset1"])
def test_kernels_on_cpu_emulation(emu, op, shape, dtype, offset):
    _emu_check(op, shape, dtype, offset)


def _emu_check(op, shape, dtype, offset):
    if op.startswith("rope") or op in ("swiglu", "geglu"):
        shape = (shape[0], shape[1] + shape[1] % 2)
    rng = np.random.default_rng(abs(hash((op, shape))) % 2**32)
    n = shape[1]
    host = {"x": (rng.standard_normal(shape) * 3).astype(np.float32),
            "w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32),
            "cos": rng.standard_normal((2, n)).astype(np.float32),
            "sin": rng.standard_normal((2, n)).astype(np.float32)}
    dev = {}
    for k, v in host.items():
        dt = "float32" if k in ("cos", "sin") else dtype
        t = _emu_empty(v.shape, dt, offset)
        t.arr[...] = _to_storage(v, dt)
        dev[k] = t
    dev["interleaved"] = op == "rope_interleaved"
    name = "rope" if op.startswith("rope") else op
    ref = _ref(name, _from_storage(dev["x"]),
               {k: (_from_storage(v) if isinstance(v, _EmuTensor) else v) for k, v in dev.items()})
    rtol, atol = TOL[dtype]
    if name in ("rms_norm", "layer_norm", "softmax"):
        atol *= max(1.0, np.sqrt(n) / 8)
    y = _call(op, dev["x"], dev)
    np.testing.assert_allclose(_from_storage(y), ref, rtol=rtol, atol=atol)
    out = _emu_empty(ref.shape, dtype, offset)
    assert _call(op, dev["x"], dev, out) is out
    np.testing.assert_allclose(_from_storage(out), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", [(37, 128), (9, 2048), (300, 8)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ["rope", "rope_interleaved", "swiglu", "geglu"])
def test_rows_per_block_launch_on_cpu_emulation(emu, monkeypatch, op, shape):
    """rope and the gated ops put blockDim.y rows in each 256-thread block; with grid.y cut to 1
    every thread row walks several rows (the loop a launch of over 65535 x blockDim.y rows takes)."""
    real = cuda.ops.rows_cols_launch
    blocks = []

    def one_block_row(rows, units):
        (gx, _, gz), block = real(rows, units)
        blocks.append(block)
        return (gx, 1, gz), block
    monkeypatch.setattr(cuda.ops, "rows_cols_launch", one_block_row)
    _emu_check(op, shape, "float32", 0)
    assert blocks and all(b[0] * b[1] == 256 for b in blocks), blocks
    if shape[1] <= 128:
        assert all(b[1] > 1 for b in blocks), blocks      # short rows: several rows per block


def test_row_launch_sizes_blocks_by_the_row_bytes_a_thread_caches(monkeypatch):
    """A thread holds CACHE_BYTES (64) of its row whatever the dtype: rows of 8192 take 512
    threads in fp32 and 256 in 16 bits (32 packed values each); a warp holds 512 fp32 or 1024
    16-bit columns."""
    monkeypatch.setitem(cuda.state.SM_COUNT, 0, 132)
    f = cuda.arrays.row_launch
    assert f(8192, 8192, 0, 4) == ((8192, 1, 1), (512, 1, 1))
    assert f(8192, 8192, 0, 2) == ((8192, 1, 1), (256, 1, 1))
    assert f(8192, 4096, 0, 2) == ((8192, 1, 1), (128, 1, 1))
    assert f(4096, 512, 0, 4) == ((1024, 1, 1), (32, 4, 1))
    assert f(4096, 1024, 0, 2) == ((1024, 1, 1), (32, 4, 1))
    assert f(10, 1025, 0, 2) == ((10, 1, 1), (64, 1, 1))
    assert f(10, 20000, 0, 2) == ((10, 1, 1), (512, 1, 1))       # past 512 x 32: streamed
    src = (ROOT / "cuda_ext" / "common.cuh").read_text()
    assert f"constexpr int CACHE_BYTES = {cuda.arrays.CACHE_BYTES};" in src


def test_rows_cols_launch_shapes():
    f = cuda.arrays.rows_cols_launch
    assert f(64 * 8192, 16) == ((1, 32768, 1), (16, 16, 1))      # rope fp32, 128-wide rows
    assert f(1 << 21, 16) == ((1, 65535, 1), (16, 16, 1))        # more rows than grid.y: rows loop
    assert f(8192, 1024) == ((4, 8192, 1), (256, 1, 1))          # swiglu fp32, h = 4096
    assert f(3, 1) == ((1, 1, 1), (1, 256, 1))
    assert f(10, 300) == ((2, 10, 1), (256, 1, 1))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [2, 37, 1000, 8200, 16400])
@pytest.mark.parametrize("special", ["nan", "inf"])
def test_softmax_special_values_on_cpu_emulation(emu, n, dtype, special):
    """A row holding a NaN or a +inf is all NaN, as NumPy and torch give, on each path: the
    scalar (n = 2, 37), cached (1000; 8200 in 16 bits) and streamed (8200 fp32, 16400) rows.
    The streamed/scalar online max skipped a NaN that was a thread's first element: the GPU fuzz run of 2026-11-27 got
    [nan, 1] for the fp16 row [nan, x]. Other rows of the launch are unaffected."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n)).astype(np.float32)
    x[0, 0] = float(special)                  # thread 0's first element
    x[2, n - 1] = float(special)              # the last element, another thread's
    xd = _emu_empty(x.shape, dtype)
    xd.arr[...] = _to_storage(x, dtype)
    xs = _from_storage(xd)
    with np.errstate(invalid="ignore"):
        e = np.exp(xs - xs.max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
    assert np.isnan(ref[[0, 2]]).all() and np.isfinite(ref[1]).all()
    y = _from_storage(_call("softmax", xd, {}))
    assert np.isnan(y[[0, 2]]).all(), (special, y[[0, 2]][~np.isnan(y[[0, 2]])][:5])
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(y[1], ref[1], rtol=rtol, atol=atol * max(1.0, np.sqrt(n) / 8))


def test_fatbin_problem_reasons(tmp_path, monkeypatch):
    fat = tmp_path / "k.fatbin"
    rec = tmp_path / "k.fatbin.json"
    m = cuda.module
    monkeypatch.setattr(m, "FATBIN_PATH", fat)
    monkeypatch.setattr(m, "FATBIN_RECORD", rec)
    assert "no fatbin at" in m.fatbin_problem(90)
    fat.write_bytes(b"\0")
    digest = m.sources_digest(m.source_dir())
    assert digest == cb.sources_digest()      # the runtime and build_cuda hash the same files
    rec.write_text(json.dumps({"archs": ["sm_75", "sm_80"], "ptx": "compute_80", "sources_sha256": digest}))
    assert m.fatbin_problem(80) is None
    assert m.fatbin_problem(90) is None  # PTX compute_80 JIT-compiles for sm_90
    assert "no code for sm_70" in m.fatbin_problem(70)
    rec.write_text(json.dumps({"archs": ["sm_75"], "ptx": "compute_75", "sources_sha256": "0" * 64}))
    assert "stale" in m.fatbin_problem(75)


def test_te_fl_skip_cuda_disables_with_reason():
    proc = _run_py("""
        import tensor_ops.backends.cuda as c
        print(c.availability())
    """, TE_FL_SKIP_CUDA="1")
    assert "(False, 'disabled by TE_FL_SKIP_CUDA')" in proc.stdout, proc.stdout


def _overflow_rows(n: int) -> np.ndarray:
    """Rows whose fp32 statistics overflow on finite input (|x| > ~1.8e19 squares; a sum past
    3.4e38; the centred squares of a row spanning 1e38), then an inf row, a NaN row, an
    ordinary one and a row whose fp32 sum overflows (values 1e38 .. 3e38)."""
    rows = np.tile(np.linspace(-2.0, 3.0, n, dtype=np.float64), (7, 1))
    rows[0, :3] = (1e20, -3e19, 2e19)
    rows[1, :2] = (3e38, -1e38)
    rows[2] *= 1e30
    rows[3, 1] = np.inf
    rows[4, 2] = np.nan
    rows[6] = np.linspace(1e38, 3e38, n)
    return rows.astype(np.float32)


def _norm64(op, x, w):
    """The float64 formula of rms_norm / layer_norm (eps 1e-6 / 1e-5, b = w)."""
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if op.endswith("rms_norm"):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w
        d = x - x.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * w + w


@pytest.mark.parametrize("n", [37, 64, 8200], ids=["scalar", "cached", "streamed"])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm"])
def test_norm_rows_whose_statistics_overflow_on_cpu_emulation(emu, op, n):
    """Finite rows whose fp32 sums overflow come out as the fp64 formula gives them (the
    kernel redoes the statistics on the row scaled by 2^-e, max|x| * 2^-e in [0.5, 1), as the
    cpp backend redoes them in fp64), not 0 (rms) or "y = bias" (layer); inf/NaN rows still
    hold NaN. The fused add's x and residual are the halves of the rows (s is the row
    exactly)."""
    rows = _overflow_rows(n)
    w = np.linspace(0.5, 1.5, n, dtype=np.float32)
    parts = {"x": rows / 2, "r": rows / 2} if op.startswith("add_") else {"x": rows}
    dev = {}
    for k, v in {**parts, "w": w, "b": w}.items():
        t = _emu_empty(v.shape, "float32", 0)
        t.arr[...] = v
        dev[k] = t
    if op.startswith("add_"):
        y, s = _add_call(op, dev)
        np.testing.assert_array_equal(_from_storage(s), rows.astype(np.float64))
    else:
        y = _call(op, dev["x"], dev)
    y = _from_storage(y).astype(np.float64)
    want = _norm64(op, rows, w)
    ok = [0, 1, 2, 5, 6]
    np.testing.assert_allclose(y[ok], want[ok], rtol=2e-5, atol=1e-6)
    assert np.isnan(y[3]).any() and np.isnan(y[4]).all()


# ------------------------------------------------------------------ ThreadSanitizer emulation
# The emulation runs every CUDA thread of a block as a std::thread and __syncthreads as a
# std::barrier, so a missing barrier is a data race between real threads: ThreadSanitizer
# sees it even when the plain emulation happens to compute the right numbers.
_TSAN_RUNNER = r"""
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
lib.emu_launch.restype = ctypes.c_int
lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                           ctypes.POINTER(ctypes.c_void_p)]
rows, n = 3, 1000
x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
w, b, y = np.ones(n, np.float32), np.zeros(n, np.float32), np.empty((rows, n), np.float32)
L, I, F = ctypes.c_longlong, ctypes.c_int, ctypes.c_float

def launch(name, *args):
    c = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else a for a in args]
    ptrs = (ctypes.c_void_p * len(c))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in c])
    assert lib.emu_launch(name.encode(), 2, 1, 128, 1, ptrs) == 0, name   # block mode: 128 threads a row

launch("to_rms_norm_f32", x, w, y, L(rows), I(n), F(1e-6), I(0))
launch("to_layer_norm_f32", x, w, b, y, L(rows), I(n), F(1e-5), I(0))
launch("to_softmax_f32", x, y, L(rows), I(n), I(0))
# the fused add + norm: streamed rows (vec 0: s reread from memory), then in place (y is x,
# s is r), streamed and cached (vec 1: 4-wide, the row in registers)
r, s = np.random.default_rng(1).standard_normal((rows, n)).astype(np.float32), np.empty((rows, n), np.float32)
launch("to_add_rms_norm_f32", x, r, w, y, s, L(rows), I(n), F(1e-6), I(0))
launch("to_add_layer_norm_f32", x, r, w, b, y, s, L(rows), I(n), F(1e-5), I(0))
for vec in (0, 1):
    xi, ri = x.copy(), r.copy()
    launch("to_add_rms_norm_f32", xi, ri, w, xi, ri, L(rows), I(n), F(1e-6), I(vec))
    launch("to_add_layer_norm_f32", xi, ri, w, b, xi, ri, L(rows), I(n), F(1e-5), I(vec))
print("launched")
"""


def _tsan_run(tmp_path, sources: dict) -> subprocess.CompletedProcess:
    """Build the emulation of ``sources`` ({name: text}, every cuda_ext file) with
    -fsanitize=thread and run block-mode rms_norm/layer_norm/softmax and add_rms_norm/add_layer_norm
    (also in place) launches under it."""
    gxx, libtsan = tsan_toolchain()
    src = tmp_path / "cuda_ext"
    src.mkdir()
    for name, text in sources.items():
        (src / name).write_text(text)
    cus = sorted(p for p in src.glob("*.cu"))
    text = EMU_HARNESS.replace("@INCLUDES@", "\n".join(f'#include "{p}"' for p in cus))
    text = text.replace("@REGISTRY@", ", ".join(f'{{"{k}", emu_wrap(&{k})}}' for k in cb.kernel_symbols()))
    (tmp_path / "emu.cpp").write_text(text)
    so = tmp_path / "emu_tsan.so"
    proc = subprocess.run([gxx, "-std=c++20", "-O1", "-g", "-fsanitize=thread", "-mf16c", "-fPIC", "-shared",
                           "-pthread", "-I", str(src), "-o", str(so), str(tmp_path / "emu.cpp")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    (tmp_path / "run.py").write_text(_TSAN_RUNNER)
    env = dict(os.environ, LD_PRELOAD=libtsan, TSAN_OPTIONS="halt_on_error=1 exitcode=66 report_signal_unsafe=0")
    return subprocess.run([sys.executable, str(tmp_path / "run.py"), str(so)], env=env,
                          capture_output=True, text=True, timeout=900)


def _cuda_sources() -> dict:
    return {p.name: p.read_text() for p in (ROOT / "cuda_ext").iterdir() if p.suffix in (".cu", ".cuh")}


def test_block_mode_kernels_race_free_under_thread_sanitizer(tmp_path):
    proc = _tsan_run(tmp_path, _cuda_sources())
    skip_if_tsan_cannot_start(proc)
    assert proc.returncode == 0 and "launched" in proc.stdout, (proc.returncode, proc.stderr[-4000:])
    assert "WARNING: ThreadSanitizer" not in proc.stderr, proc.stderr[-4000:]


def test_thread_sanitizer_catches_a_dropped_syncthreads(tmp_path):
    """The proof that the harness above can fail: the block reduction without the barrier
    that keeps the next reduction's write off the slot the previous one still reads."""
    sources = _cuda_sources()
    barrier = "        __syncthreads();  // the previous reduction may still be reading sh\n"
    assert barrier in sources["common.cuh"], "update this test: RowGroup::sum's first barrier moved"
    sources["common.cuh"] = sources["common.cuh"].replace(barrier, "", 1)
    proc = _tsan_run(tmp_path, sources)
    skip_if_tsan_cannot_start(proc)
    assert proc.returncode == 66 and "data race" in proc.stderr, (proc.returncode, proc.stderr[-2000:])


# Launch shapes where one warp or block walks several rows (rows far beyond what the launch
# computes for the pretend 2-SM device), row counts that do not divide evenly among the
# warps/blocks, and in-place launches (out is x: each row is read before it is written).
MULTI_ROW = [(514, 256), (515, 64), (37, 1000)]


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("shape", MULTI_ROW, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", [o for o in OPS if not o.startswith("rope")])
def test_emulation_several_rows_per_group(emu, op, shape, inplace):
    if inplace and op in ("swiglu", "geglu"):
        pytest.skip("a gated op's output is half as wide as x: it cannot be x")
    rng = np.random.default_rng(abs(hash((op, shape))) % 2**32)
    n = shape[1]
    host = {"x": (rng.standard_normal(shape) * 3).astype(np.float32),
            "w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}
    dev = {}
    for k, v in host.items():
        t = _emu_empty(v.shape, "float32")
        t.arr[...] = v
        dev[k] = t
    ref = _ref(op, host["x"].astype(np.float64),
               {k: v.arr.astype(np.float64) for k, v in dev.items()})
    rtol, atol = TOL["float32"]
    if op in ("rms_norm", "layer_norm", "softmax"):
        atol *= max(1.0, np.sqrt(n) / 8)
    out = dev["x"] if inplace else None
    y = _call(op, dev["x"], dev, out)
    if inplace:
        assert y is dev["x"]
    np.testing.assert_allclose(_from_storage(y), ref, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ fused residual add + norm
ADD_OPS = ["add_rms_norm", "add_layer_norm"]


def _emu_arrays(host: dict, dtype: str, offset: int = 0) -> dict:
    dev = {}
    for k, v in host.items():
        t = _emu_empty(v.shape, dtype, offset)
        t.arr[...] = _to_storage(v, dtype)
        dev[k] = t
    return dev


def _add_ref(op, dev, dtype):
    """(normed, s) from the stored inputs: s = x + r rounded to the dtype (fp32 add, one
    rounding, as the kernels do), the norm of that s in float64."""
    s32 = (_from_storage(dev["x"]) + _from_storage(dev["r"])).astype(np.float32)
    s_t = _emu_empty(s32.shape, dtype)
    s_t.arr[...] = _to_storage(s32, dtype)
    s = _from_storage(s_t)
    extra = {k: _from_storage(v) for k, v in dev.items()}
    return _ref(op[len("add_"):], s, extra), s


def _add_call(op, dev, out=None, residual_out=None):
    if op == "add_rms_norm":
        return cuda.add_rms_norm(dev["x"], dev["r"], dev["w"], 1e-6, out, residual_out)
    return cuda.add_layer_norm(dev["x"], dev["r"], dev["w"], dev["b"], 1e-5, out, residual_out)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", EMU_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ADD_OPS)
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset1"])
def test_add_norm_kernels_on_cpu_emulation(emu, op, shape, dtype, offset):
    """The fused add + norm kernels: s bit-exact (fp32 add, one rounding), the norm of the
    stored s within the conformance tolerance; warp (n <= 512), cached and streamed block rows,
    the vector and the scalar (offset) paths; then with out= and residual_out= given."""
    rng = np.random.default_rng(abs(hash((op, shape))) % 2**32)
    n = shape[1]
    host = {"x": (rng.standard_normal(shape) * 3).astype(np.float32),
            "r": (rng.standard_normal(shape) * 3).astype(np.float32),
            "w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}
    dev = _emu_arrays(host, dtype, offset)
    ref, s_ref = _add_ref(op, dev, dtype)
    rtol, atol = TOL[dtype]
    atol *= max(1.0, np.sqrt(n) / 8)
    y, s = _add_call(op, dev)
    np.testing.assert_array_equal(_from_storage(s), s_ref)
    np.testing.assert_allclose(_from_storage(y), ref, rtol=rtol, atol=atol)
    out, rout = _emu_empty(shape, dtype, offset), _emu_empty(shape, dtype, offset)
    y2, s2 = _add_call(op, dev, out, rout)
    assert y2 is out and s2 is rout
    np.testing.assert_array_equal(_from_storage(rout), s_ref)
    np.testing.assert_allclose(_from_storage(out), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", MULTI_ROW + [(3, 8200)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ADD_OPS)
def test_add_norm_in_place_on_cpu_emulation(emu, op, shape):
    """vLLM's in-place form: out is x and residual_out is residual (several rows per
    warp/block, and a streamed row that rereads s from memory)."""
    rng = np.random.default_rng(abs(hash((op, shape, "inplace"))) % 2**32)
    n = shape[1]
    host = {"x": (rng.standard_normal(shape) * 3).astype(np.float32),
            "r": (rng.standard_normal(shape) * 3).astype(np.float32),
            "w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}
    dev = _emu_arrays(host, "float32")
    ref, s_ref = _add_ref(op, dev, "float32")
    rtol, atol = TOL["float32"]
    atol *= max(1.0, np.sqrt(n) / 8)
    y, s = _add_call(op, dev, dev["x"], dev["r"])
    assert y is dev["x"] and s is dev["r"]
    np.testing.assert_array_equal(_from_storage(s), s_ref)
    np.testing.assert_allclose(_from_storage(y), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", ADD_OPS)
def test_add_norm_kernel_matches_fp64_reference(op, shape, dtype, lib, inplace):
    """On a GPU: the fused kernels against the fp64 norm of s = x + residual (rounded to the
    dtype by the device itself: torch's/CuPy's add), with fresh outputs or in place."""
    cupy = _require_gpu()
    if lib == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16 dtype; bf16 is covered with torch tensors")
    torch = pytest.importorskip("torch") if lib == "torch" else None
    if torch is not None and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    rng = np.random.default_rng(hash((op, shape)) % 2**32)
    n = shape[1]
    host = {"x": (rng.standard_normal(shape) * 3).astype(np.float32),
            "r": (rng.standard_normal(shape) * 3).astype(np.float32),
            "w": rng.standard_normal(n).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)}
    if lib == "cupy":
        dev = {k: cupy.asarray(v.astype(dtype)) for k, v in host.items()}
        s_dev = (dev["x"].astype(np.float32) + dev["r"].astype(np.float32)).astype(dtype)

        def back(a):
            return a.get().astype(np.float64)
    else:
        tdt = getattr(torch, dtype)
        dev = {k: torch.from_numpy(v).to("cuda", tdt) for k, v in host.items()}
        s_dev = (dev["x"].float() + dev["r"].float()).to(tdt)

        def back(a):
            return a.float().cpu().numpy().astype(np.float64)
    s_ref = back(s_dev)
    ref = _ref(op[len("add_"):], s_ref, {k: back(v) for k, v in dev.items()})
    out = (dev["x"], dev["r"]) if inplace else (None, None)
    y, s = _add_call(op, dev, *out)
    if inplace:
        assert y is dev["x"] and s is dev["r"]
    rtol, atol = TOL[dtype]
    atol *= max(1.0, np.sqrt(n) / 8)
    np.testing.assert_array_equal(back(s), s_ref)
    np.testing.assert_allclose(back(y), ref, rtol=rtol, atol=atol)
