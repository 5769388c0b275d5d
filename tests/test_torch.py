"""torch tensors through the facade, the torch ops (autograd, opcheck, torch.compile), and what
get_backend_info() says about them (issue 15, items 1, 3 and 5).

The numbers of every op on torch tensors are checked by the conformance harness (its
``torch`` column) and the fuzzer; here: the torch-specific contract (kinds, devices, zero-copy,
the native plain path), gradients against fp64 torch autograd and ``gradcheck``, ``opcheck``
on every op, a Llama block under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: the torch suite skips")
F = torch.nn.functional

import tensor_ops as to  # noqa: E402
import tensor_ops.torch as tot  # noqa: E402
from tests._helpers import run_python  # noqa: E402
from tests.conftest import BACKENDS, backend_impl  # noqa: E402

OPS = torch.ops.tensor_ops
RNG = torch.Generator().manual_seed(15)


def _t(*shape, dtype=torch.float32, grad=False, scale=1.0):
    t = (torch.randn(*shape, generator=RNG, dtype=torch.float64) * scale).to(dtype)
    return t.requires_grad_() if grad else t


# ------------------------------------------------------------------ facade on torch tensors
def test_import_registers_nothing_until_asked():
    r = run_python("""
        import sys, tensor_ops as to
        assert 'torch' not in sys.modules
        info = to.get_backend_info()["torch"]
        assert info["ok"] is None and "not registered yet" in info["reason"], info
        import torch
        y = to.silu(torch.ones(2, 4))                 # no grad needed: the ops stay unregistered
        assert type(y) is torch.Tensor and 'tensor_ops.torch' not in sys.modules
        y = to.silu(torch.ones(2, 4, requires_grad=True))
        assert y.grad_fn is not None and to.get_backend_info()["torch"]["ok"] is True
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_torch_in_torch_out(dtype):
    x, w = _t(3, 8, dtype=dtype), _t(8, dtype=dtype)
    y = to.rms_norm(x, w)
    assert type(y) is torch.Tensor and y.dtype == dtype and y.device == x.device and y.shape == x.shape
    ref = to.rms_norm(x.double().numpy(), w.double().numpy())
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=2e-2, atol=2e-2)


def test_out_is_written_in_place_and_returned():
    x = _t(4, 8)
    out = torch.empty(4, 8)
    assert to.silu(x, out=out) is out
    torch.testing.assert_close(out, F.silu(x))
    big = torch.zeros(4, 16)
    r = to.relu(x, out=big[:, ::2])                 # a strided out: written through the view
    assert r.data_ptr() == big.data_ptr() and (big[:, 1::2] == 0).all()
    torch.testing.assert_close(big[:, ::2], torch.relu(x))


def test_strided_tensors_behave_as_strided_numpy_views():
    base = _t(6, 32)
    x = base[::2, ::3]
    got = to.softmax(x)
    want = to.softmax(base.numpy()[::2, ::3])
    np.testing.assert_array_equal(got.numpy(), want)
    assert base.is_contiguous()                       # the caller's tensor is untouched


def test_plain_calls_take_the_native_entry():
    backend_impl("rms_norm", "cpp")
    x, w = _t(2, 64), _t(64)
    to.rms_norm(x.numpy(), w.numpy())                 # resolve once: the entry is installed
    to.rms_norm(x, w)                                 # the first torch call hands torch to _cpp
    from tensor_ops.backends import cpp
    before = cpp.native()._fast_calls()["rms_norm"]
    y = to.rms_norm(x, w)
    assert cpp.native()._fast_calls()["rms_norm"] == before + 1
    np.testing.assert_array_equal(y.numpy(), to.rms_norm(x.numpy(), w.numpy()))
    yb = to.swiglu(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    np.testing.assert_array_equal(yb.view(torch.int16).numpy(),
                                  to.swiglu(tot_numpy(x.bfloat16())).view(np.int16))


def tot_numpy(t):
    from tensor_ops._torch_facade import to_numpy
    return to_numpy(t, "x")


def test_requires_grad_without_grad_mode_is_a_plain_call():
    x = _t(3, 8, grad=True)
    with torch.no_grad():
        y = to.gelu(x)
        assert y.grad_fn is None and not y.requires_grad
        out = torch.empty(3, 8)
        assert to.gelu(x, out=out) is out            # out= is fine without autograd (as in torch)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_takes_torch_cpu_tensors(backend):
    backend_impl("layer_norm", backend)
    x, w, b = _t(5, 33), _t(33), _t(33)
    try:
        y = to.layer_norm(x, w, b, backend=backend)
    except to.BackendUnsupportedError as exc:
        pytest.skip(str(exc))
    torch.testing.assert_close(y, F.layer_norm(x, (33,), w, b, 1e-5), rtol=2e-5, atol=2e-5)


def test_a_plugin_serves_another_device():
    """A backend declaring ``torch-meta`` serves meta tensors; unregistered, the error names it."""
    from tensor_ops.backends._contract import Backend, register_backend

    def silu(x, out):
        assert x.device.type == "meta"
        return torch.empty_like(x)

    with pytest.raises(ValueError, match=r"x is a torch tensor on device 'meta'.*torch-meta"):
        to.silu(torch.ones(2, 4, device="meta"))
    be = Backend(name="metaplug", ops={"silu": silu}, probe=lambda: "ok", array_kinds=("torch-meta",),
                 kind="vendor", vendor="metaplug")
    reg = to.get_registry()
    register_backend(reg, be)
    try:
        y = to.silu(torch.ones(2, 4, device="meta"))
        assert y.device.type == "meta" and y.shape == (2, 4)
        info = to.get_backend_info()
        assert info["ops"]["silu"]["calls"].get("vendor.metaplug") == 1
        # the plugin is not offered CPU tensors: it does not declare torch-cpu
        assert type(to.silu(torch.ones(2, 4))) is torch.Tensor
    finally:
        reg.unregister_impl("silu", "vendor.metaplug", "facade")
        to.reload_config()


def test_unknown_array_kind_is_refused_at_declaration():
    from tensor_ops.backends._contract import Backend
    with pytest.raises(ValueError, match="unknown array kinds.*torch-<device type>"):
        Backend(name="x", ops={}, probe=lambda: "", array_kinds=("jax",))


def test_info_lists_array_kinds_and_the_torch_registration():
    tot.register()
    info = to.get_backend_info()
    assert info["backends"]["cpp"]["array_kinds"] == ["numpy", "torch-cpu"]
    assert "torch-cpu" in info["backends"]["numpy"]["array_kinds"]
    t = info["torch"]
    assert t["ok"] is True and t["torch"] == torch.__version__ and t["compile"]["ok"] is True
    assert set(t["ops"]) >= {"rms_norm", "layer_norm", "softmax", "silu", "gelu", "relu", "swiglu", "geglu",
                             "rope", "matmul", "silu_mul", "gelu_mul"}
    text = to.format_info(info)
    assert "torch ops (autograd, torch.compile): registered" in text and "numpy,torch-cpu" in text


def test_info_says_why_when_torch_is_missing():
    r = run_python("""
        import tensor_ops as to
        print(to.get_backend_info()["torch"])
    """, blocked=("torch",))
    assert r.returncode == 0 and "'ok': False" in r.stdout and "torch is not installed" in r.stdout, r.stderr


def test_registration_reports_an_old_torch():
    r = run_python("""
        import torch
        torch.__version__ = "2.4.1+cpu"
        import tensor_ops as to, tensor_ops.torch as tot
        st = tot.status()
        assert st["ok"] is False and "torch 2.4.1+cpu is too old" in st["reason"], st
        assert to.get_backend_info()["torch"] == st
        try:
            to.silu(torch.ones(2, requires_grad=True))
        except RuntimeError as exc:
            assert "torch.no_grad()" in str(exc) and "too old" in str(exc), exc
        else:
            raise AssertionError("autograd without the torch ops must raise")
        print(to.silu(torch.ones(2)).tolist())      # no autograd needed: computed
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    # silu(1) = 1/(1 + e^-1) to fp32's tolerance (1.3e-6 relative; the kernels' polynomials differ
    # by ISA, so not the correctly rounded bits)
    got = [float(v) for v in r.stdout.strip().strip("[]").split(",")]
    np.testing.assert_allclose(got, [1.0 / (1.0 + np.exp(-1.0))] * 2, rtol=1.3e-6, atol=0)
