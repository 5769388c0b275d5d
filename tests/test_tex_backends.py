"""tex vendor API: TEXBackendBase / @register_backend / list/set/get_backend, TE_* env vars,
vendor.nvidia passthrough (against a fake transformer_engine_torch), template and example."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

torch = pytest.importorskip("torch")
import tensor_ops  # noqa: E402
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops import _state  # noqa: E402
from tensor_ops.tex import _nvidia  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X = torch.randn(3, 16)
W = torch.rand(16) + 0.5


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for v in ("TE_BACKEND", "TE_PLUGIN", "TE_FALLBACK_BACKEND", "TE_FL_SKIP_CUDA"):
        monkeypatch.delenv(v, raising=False)
    yield
    tex.set_backend(None)
    for name in ("hygon", "half", "template", "acme"):
        try:
            tex.unregister_backend(name)
        except KeyError:
            pass


def _hygon(calls, priority=90):
    class HygonBackend(tex.TEXBackendBase):
        NAME = "Hygon"
        PRIORITY = priority

        def is_available(self):
            return True

        def rmsnorm_fwd(self, input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
            calls.append(("rmsnorm_fwd", otype))
            with tex.use_backend("torch"):
                return tex.rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma)
    return HygonBackend


def test_base_is_abstract_and_has_every_op():
    from tensor_ops._ops import TEX_OPS
    with pytest.raises(TypeError):
        tex.TEXBackendBase()
    for op in TEX_OPS:
        assert callable(getattr(tex.TEXBackendBase, op))
    assert _hygon([]).implemented_ops() == ["rmsnorm_fwd"]


def test_register_set_get_list():
    calls = []
    cls = tex.register_backend(_hygon(calls))
    reg = tensor_ops.get_registry()
    impl = reg.get_impl("rmsnorm_fwd", "vendor.hygon", "tex")
    assert impl.kind.value == "vendor" and impl.priority == 90 and impl.vendor == "hygon"
    with pytest.raises(KeyError):
        reg.get_impl("layernorm_fwd", "vendor.hygon", "tex")   # only overridden methods become impls
    names = {b["name"]: b for b in tex.list_backends()}
    assert set(names["hygon"]) == {"name", "vendor", "priority", "available", "current"}
    assert names["hygon"]["available"]
    assert sum(b["current"] for b in names.values()) == 1  # auto: the resolver's first choice
    facade_before = _state.global_backend
    tex.set_backend("HYGON")  # case-insensitive
    assert _state.global_backend == facade_before  # the facade's selection is untouched
    assert tex.get_backend() is cls._tex_instance
    assert [b["name"] for b in tex.list_backends() if b["current"]] == ["hygon"]
    out, _, rs = tex.rmsnorm_fwd(X, W, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    assert calls == [("rmsnorm_fwd", torch.bfloat16)] and out.dtype == torch.bfloat16
    # hygon lacks layernorm_fwd: the op goes to the next candidate
    tex.layernorm_fwd(X, W, torch.zeros(16), 1e-5, None, None, None, 0, False)
    assert len(calls) == 1
    tex.set_backend(None)
    with pytest.raises(ValueError, match="already registered"):
        tex.register_backend(_hygon(calls))


def test_unknown_backend_message():
    with pytest.raises(RuntimeError) as ei:
        tex.set_backend("hygon")
    msg = str(ei.value)
    assert msg.startswith("Backend 'hygon' not found. Available backends: [")
    assert "'torch'" in msg


def test_env_te_backend_and_te_plugin(monkeypatch):
    calls = []
    tex.register_backend(_hygon(calls))
    monkeypatch.setenv("TE_BACKEND", "hygon")
    tex.rmsnorm_fwd(X, W, 1e-5, None, None, None, 0, False)
    assert len(calls) == 1
    monkeypatch.delenv("TE_BACKEND")
    monkeypatch.setenv("TE_PLUGIN", "hygon")
    tex.rmsnorm_fwd(X, W, 1e-5, None, None, None, 0, False)
    assert len(calls) == 2
    tex.set_backend("torch")  # set_backend beats the environment
    tex.rmsnorm_fwd(X, W, 1e-5, None, None, None, 0, False)
    assert len(calls) == 2
    tex.set_backend(None)
    monkeypatch.setenv("TE_PLUGIN", "nosuch")
    with pytest.raises(RuntimeError, match=r"Backend 'nosuch' not found\. Available backends: \["):
        tex.gelu(X, None)


def test_vendor_failure_falls_back_with_one_warning():
    class Half(tex.TEXBackendBase):
        NAME = "half"

        def is_available(self):
            return True

        def gelu(self, input, quantizer):
            raise NotImplementedError("half: gelu only for fp8")

    tex.register_backend(Half)
    tex.set_backend("half")
    with pytest.warns(tensor_ops.BackendFallbackWarning, match="vendor.half"):
        y = tex.gelu(X, None)
    with tex.use_backend("torch"):
        torch.testing.assert_close(y, tex.gelu(X, None))


def test_unavailable_vendor_is_not_found():
    class Off(tex.TEXBackendBase):
        NAME = "hygon"

        def is_available(self):
            return False

        def gelu(self, input, quantizer):
            raise AssertionError("must not run")

    tex.register_backend(Off)
    assert {b["name"]: b["available"] for b in tex.list_backends()}["hygon"] is False
    with pytest.raises(RuntimeError, match="Backend 'hygon' not found"):
        tex.set_backend("hygon")
    tex.gelu(X, None)  # auto order skips it


def test_builtin_get_backend_object():
    tex.set_backend("torch")
    b = tex.get_backend()
    assert b.name == "torch" and b.is_available()
    out = b.gelu(X, None)
    torch.testing.assert_close(out, tex.gelu(X, None))


def test_template_runs():
    from tensor_ops.tex.template import TemplateBackend
    tex.register_backend(TemplateBackend)
    tex.set_backend("template")
    out, none, rs = tex.rmsnorm_fwd(X, W, 1e-5, None, None, tex.DType.kFloat16, 0, True)
    with tex.use_backend("torch"):
        ref, _, ref_rs = tex.rmsnorm_fwd(X, W, 1e-5, None, None, tex.DType.kFloat16, 0, True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(rs, ref_rs)
    assert tex.get_backend().vendor == "Template Inc."


def test_example_backend_runs():
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import example_tex_backend
        assert example_tex_backend.main() == 0
    finally:
        sys.path.pop(0)


# ---- vendor.nvidia against a fake transformer_engine_torch

def _fake_te():
    import enum
    te = types.ModuleType("transformer_engine_torch")
    te.DType = enum.IntEnum("DType", {m.name: int(m) for m in tex.DType})
    te.NVTE_QKV_Format = enum.IntEnum("NVTE_QKV_Format", {m.name: int(m) for m in tex.NVTE_QKV_Format})
    te.calls = []

    def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
        te.calls.append(("rmsnorm_fwd", otype))
        return ["fake-out", None, "fake-rsigma"]

    def generic_gemm(*args, **kw):
        te.calls.append(("generic_gemm", len(args), kw))
        return ["D", None, None, None]

    def fused_rope_forward(*args):
        te.calls.append(("fused_rope_forward", args[3]))
        return "rope"

    def get_cublasLt_version():
        return 120304

    te.rmsnorm_fwd, te.generic_gemm, te.fused_rope_forward = rmsnorm_fwd, generic_gemm, fused_rope_forward
    te.get_cublasLt_version = get_cublasLt_version
    return te


@pytest.fixture
def fake_te(monkeypatch):
    te = _fake_te()
    monkeypatch.setitem(sys.modules, "transformer_engine_torch", te)
    monkeypatch.setattr(_nvidia, "_on_device", lambda t: True)  # pretend CPU tensors are CUDA ones
    reg = tensor_ops.get_registry()
    _nvidia.unregister(reg)
    _nvidia.register(reg)  # fresh impls: availability is decided once per impl
    yield te
    _nvidia.unregister(reg)
    monkeypatch.undo()
    _nvidia.register(reg)


def test_nvidia_passthrough(fake_te):
    assert {b["name"]: b["available"] for b in tex.list_backends()}["nvidia"] is True
    tex.set_backend("nvidia")
    out = tex.rmsnorm_fwd(X, W, 1e-5, None, None, tex.DType.kBFloat16, 0, False)
    assert out == ["fake-out", None, "fake-rsigma"]
    name, otype = fake_te.calls[-1]
    assert otype is fake_te.DType.kBFloat16  # torch.dtype/our DType → the real module's DType
    tex.generic_gemm(W.reshape(1, 16), True, X, False, None, None, None, None, None, False, None, False,
                     torch.empty(0), 0, False, False, alpha=2.0)
    assert fake_te.calls[-1] == ("generic_gemm", 16, {"alpha": 2.0})
    freqs = torch.zeros(3, 1, 1, 16)
    tex.fused_rope_forward(X.reshape(3, 1, 1, 16), freqs, None, tex.NVTE_QKV_Format.NVTE_SBHD, False, None, 1, 0)
    assert fake_te.calls[-1][1] is fake_te.NVTE_QKV_Format.NVTE_SBHD
    assert tex.get_cublasLt_version() == 120304
    # ops the fake module lacks fail inside the passthrough → served by the reference, with a warning
    with pytest.warns(tensor_ops.BackendFallbackWarning):
        tex.gelu(X, None)


def test_nvidia_not_selected_for_cpu_tensors(fake_te, monkeypatch):
    monkeypatch.setattr(_nvidia, "_on_device", lambda t: t.is_cuda)
    out, _, rs = tex.rmsnorm_fwd(X, W, 1e-5, None, None, None, 0, False)
    assert isinstance(out, torch.Tensor) and not fake_te.calls


def test_nvidia_skipped_by_te_fl_skip_cuda(fake_te, monkeypatch):
    monkeypatch.setenv("TE_FL_SKIP_CUDA", "1")
    reg = tensor_ops.get_registry()
    _nvidia.unregister(reg)
    _nvidia.register(reg)
    assert {b["name"]: b["available"] for b in tex.list_backends()}["nvidia"] is False
    with pytest.raises(RuntimeError, match="Backend 'nvidia' not found"):
        tex.set_backend("nvidia")


def test_install_keeps_real_te(fake_te):
    assert tex.install().startswith("kept existing")
    assert sys.modules["transformer_engine_torch"] is fake_te


# ---- environment, end to end in a fresh process

def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TE_", "TENSOR_OPS_"))}
    e["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "examples")])
    e.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          cwd=REPO, timeout=180)


def test_env_fresh_process_te_backend_torch():
    r = _run("""
        import torch, tensor_ops, tensor_ops.tex as tex
        tex.gelu(torch.randn(4, 4), None)
        print(tensor_ops.get_manager().op_info()['tex:gelu']['calls'])
    """, TE_BACKEND="torch")
    assert r.returncode == 0, r.stderr
    assert "'reference.torch': 1" in r.stdout


def test_env_fresh_process_unknown_backend():
    r = _run("""
        import torch, tensor_ops.tex as tex
        try:
            tex.gelu(torch.randn(4, 4), None)
        except RuntimeError as e:
            print('ERR', e)
    """, TE_BACKEND="hygon")
    assert "Backend 'hygon' not found. Available backends: [" in r.stdout + r.stderr, (r.stdout, r.stderr)


def test_env_plugin_vendor_and_fallback():
    """TE_FL_PLUGIN_MODULES loads a vendor; TE_BACKEND picks it; TE_FALLBACK_BACKEND serves what it lacks."""
    r = _run("""
        import torch, tensor_ops, tensor_ops.tex as tex
        x = torch.randn(4, 8)
        tex.rmsnorm_fwd(x, torch.ones(8), 1e-5, None, None, None, 0, False)
        tex.layernorm_fwd(x, torch.ones(8), torch.zeros(8), 1e-5, None, None, None, 0, False)
        info = tensor_ops.get_manager().op_info()
        print('RMS', info['rmsnorm_fwd']['calls'])
        print('LN', info['layernorm_fwd']['calls'])
    """, TE_FL_PLUGIN_MODULES="example_tex_backend", TE_BACKEND="acme", TE_FALLBACK_BACKEND="torch")
    assert r.returncode == 0, r.stderr
    assert "RMS {'vendor.acme': 1}" in r.stdout and "LN {'reference.torch': 1}" in r.stdout, r.stdout


def test_env_debug_logging():
    r = _run("""
        import torch, tensor_ops.tex as tex
        tex.set_backend('torch')
        tex.gelu(torch.randn(4, 4), None)
    """, TE_FL_DEBUG="1")
    assert r.returncode == 0, r.stderr
    assert "DEBUG" in r.stderr and "gelu" in r.stderr, r.stderr


# ---- default.cuda adapter wiring (the real kernels run only on a CUDA machine)

def test_cuda_adapters_wiring(monkeypatch):
    """With a fake CUDA backend and CPU tensors taken as CUDA ones: the adapters flatten to the
    backend's 2-D contract, pass approximate='tanh', and shape gated outputs."""
    from tensor_ops.backends import cuda
    from tensor_ops.tex import _cuda_adapters as C
    seen = []

    def fake(name, fn):
        def call(x, *a, out=None, **kw):
            seen.append((name, tuple(x.shape), kw.get("approximate")))
            out.copy_(fn(x))
            return out
        monkeypatch.setattr(cuda, name, call)

    fake("gelu", lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
    fake("swiglu", lambda x: torch.nn.functional.silu(x[:, : x.shape[1] // 2]) * x[:, x.shape[1] // 2:])
    fake("softmax", lambda x: torch.softmax(x, -1))
    monkeypatch.setattr(C, "_on_cuda", lambda t: True)
    x = torch.randn(2, 3, 8)
    assert C._sup_act(x) and not C._sup_act(x.transpose(0, 1))
    torch.testing.assert_close(C.ADAPTERS["gelu"][0](x, None), tex.gelu(x, None))
    torch.testing.assert_close(C.ADAPTERS["swiglu"][0](x, None), tex.swiglu(x, None))
    s = torch.randn(1, 2, 3, 5)
    torch.testing.assert_close(C.scaled_softmax_forward(s, 0.5), torch.softmax(s * 0.5, -1))
    assert seen[0] == ("gelu", (6, 8), "tanh") and seen[1] == ("swiglu", (6, 8), None)
    assert not C._sup_softmax(s.half(), 0.5)  # 16-bit logits would be scaled in 16 bits: declined


def test_env_fallback_backend_then_reference():
    """TE_FALLBACK_BACKEND=cpp: ops acme lacks go to cpp; ops neither has still reach reference.torch."""
    r = _run("""
        import torch, tensor_ops, tensor_ops.tex as tex
        from tensor_ops.backends import cpp
        x = torch.randn(4, 8)
        tex.layernorm_fwd(x, torch.ones(8), torch.zeros(8), 1e-5, None, None, None, 0, False)
        tex.clamped_dswiglu(x[:, :4], x, None)     # neither acme nor cpp has it
        info = tensor_ops.get_manager().op_info()
        print('CPP', cpp.availability()[0])
        print('LN', info['layernorm_fwd']['calls'])
        print('DGELU', info['clamped_dswiglu']['calls'])
    """, TE_FL_PLUGIN_MODULES="example_tex_backend", TE_BACKEND="acme", TE_FALLBACK_BACKEND="cpp")
    assert r.returncode == 0, r.stderr
    ln = "LN {'default.cpp': 1}" if "CPP True" in r.stdout else "LN {'reference.torch': 1}"
    assert ln in r.stdout and "DGELU {'reference.torch': 1}" in r.stdout, r.stdout
