"""tex: dropout bit-packed mask, enums, `import *`, install(), torch-free `import tensor_ops`, getters."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _testing as T  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("dtype", T.DTYPES, ids=str)
@pytest.mark.parametrize("numel", [64, 13, 1])
def test_dropout_bitpacked(dtype, numel):
    torch.manual_seed(0)
    x = T.rand((numel,), dtype) + 3
    p = 0.3
    out, mask = tex.dropout_fwd(x, p)
    assert mask.dtype == torch.uint8 and mask.numel() == (numel + 7) // 8
    bits = ((mask.reshape(-1, 1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(-1)[:numel].bool()
    T.assert_close(out, torch.where(bits, x.double() / (1 - p), torch.zeros((), dtype=torch.float64)))
    g = T.rand((numel,), dtype, seed=3)
    dg = tex.dropout_bwd(g, mask, p)
    T.assert_close(dg, torch.where(bits, g.double() / (1 - p), torch.zeros((), dtype=torch.float64)))
    buf = torch.empty_like(g)
    assert tex.dropout_bwd(g, mask, p, buf) is buf
    o2 = torch.empty_like(x)
    assert tex.dropout_fwd(x, p, o2)[0] is o2


def test_dropout_rate_and_errors():
    torch.manual_seed(1)
    x = torch.ones(80000)
    out, mask = tex.dropout_fwd(x, 0.25)
    kept = (out != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.01
    assert out.sum().item() == pytest.approx(80000, rel=0.02)
    with pytest.raises(ValueError, match="bit-packed"):
        tex.dropout_bwd(x, torch.zeros(80000, dtype=torch.uint8), 0.25)
    with pytest.raises(ValueError, match="dropout_probability"):
        tex.dropout_fwd(x, 1.5)


def test_enums():
    assert {m.name: int(m) for m in tex.DType} == {
        "kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6, "kFloat8E4M3": 7, "kFloat8E5M2": 8,
        "kFloat4E2M1": 10}
    assert int(tex.NVTE_Fused_Attn_Backend.NVTE_No_Backend) == -1
    assert int(tex.NVTE_Fused_Attn_Backend.NVTE_F16_arbitrary_seqlen) == 1
    assert int(tex.NVTE_Fused_Attn_Backend.NVTE_FP8) == 2
    for name in ("NVTE_QKV_Format", "NVTE_QKV_Layout", "NVTE_Bias_Type", "NVTE_Mask_Type", "NVTE_Softmax_Type",
                 "CommOverlapType", "CommOverlapAlgo", "FP8FwdTensors", "FP8BwdTensors"):
        assert len(getattr(tex, name)) > 1
    assert tex.NVTE_QKV_Format.NVTE_THD == 2 and tex.NVTE_Mask_Type.NVTE_CAUSAL_MASK == 2


def test_fused_attn_backend_and_versions():
    args = (True, torch.bfloat16, torch.bfloat16, tex.NVTE_QKV_Layout.NVTE_SBHD_SBHD_SBHD,
            tex.NVTE_Bias_Type.NVTE_NO_BIAS, tex.NVTE_Mask_Type.NVTE_CAUSAL_MASK,
            tex.NVTE_Softmax_Type.NVTE_VANILLA_SOFTMAX, 0.0, 16, 16, 128, 128, 64, 64, -1, -1, False, False, False)
    assert len(args) == 19
    assert tex.get_fused_attn_backend(*args) == tex.NVTE_Fused_Attn_Backend.NVTE_No_Backend
    assert tex.get_cublasLt_version() == 0 and tex.get_cudnn_version() == 0
    assert tex.get_num_cublas_streams() == 0


def test_import_star_and_surface():
    ns: dict = {}
    exec("from tensor_ops.tex import *", ns)
    from tensor_ops._ops import TEX_OPS
    missing = [op for op in TEX_OPS if op not in ns]
    assert not missing, missing
    for name in ("DType", "NVTE_Fused_Attn_Backend", "TEXBackendBase", "register_backend", "list_backends",
                 "set_backend", "get_backend", "install", "get_cublasLt_version"):
        assert name in ns
    assert all(not n.startswith("_") for n in tex.__all__)


def test_every_tex_op_registered_with_reference():
    import tensor_ops
    reg = tensor_ops.get_registry()
    from tensor_ops._ops import TEX_OPS
    for op in TEX_OPS:
        ids = [i.impl_id for i in reg.get_impls(op, "tex")]
        assert "reference.torch" in ids, op
        ref = reg.get_impl(op, "reference.torch", "tex")
        assert ref.kind.value == "reference" and ref.backend == "torch"


def test_install():
    saved = sys.modules.pop("transformer_engine_torch", None)
    try:
        assert tex.install() == "installed"
        import transformer_engine_torch as te
        assert te is tex
        assert tex.install() == "already installed"
        assert tex.uninstall()
        fake = type(sys)("transformer_engine_torch")
        sys.modules["transformer_engine_torch"] = fake
        assert tex.install().startswith("kept existing")
        assert sys.modules["transformer_engine_torch"] is fake
    finally:
        sys.modules.pop("transformer_engine_torch", None)
        if saved is not None:
            sys.modules["transformer_engine_torch"] = saved


def _run(code, env=None):
    e = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          cwd=REPO, timeout=120)


def test_import_tensor_ops_does_not_import_torch():
    r = _run("""
        import sys, tensor_ops
        assert 'torch' not in sys.modules, 'import tensor_ops imported torch'
        print('ok')
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_tex_without_torch_says_how_to_install():
    r = _run("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == 'torch' or name.startswith('torch.'):
                    raise ImportError('No module named torch (blocked by test)')
        sys.meta_path.insert(0, Block())
        import tensor_ops
        try:
            import tensor_ops.tex
        except ImportError as e:
            print('MSG', e)
    """)
    assert "pip install torch==2.13.0" in r.stdout, (r.stdout, r.stderr)


@pytest.mark.parametrize("dtype", T.DTYPES, ids=str)
def test_cpp_adapter_views_are_the_tensors_memory(dtype):
    """default.cpp's adapters view their tensors in one native call (_cpp_base._views): each
    view is the tensor's own memory and values (bfloat16 as ml_dtypes' bfloat16, or its int16
    bits where _np made them); a call holding a tensor the native call declines (an empty
    one) or a subclass other than nn.Parameter views every tensor through _np instead; None
    passes."""
    from tensor_ops.backends import cpp
    from tensor_ops.tex import _cpp_base as B
    ok, why = cpp.availability()
    if not ok:
        pytest.skip(f"the cpp backend is unavailable: {why}")
    class Sub(torch.Tensor):
        pass

    x = T.rand((3, 5), dtype, seed=1)
    w = T.rand((5,), dtype, seed=2)
    p = torch.nn.Parameter(w.clone())
    for ts in ((x, None, w, p), (x, torch.empty(0, dtype=dtype), w), (x, w.as_subclass(Sub))):
        vs = B._views(*ts)
        assert len(vs) == len(ts)
        for t, v in zip(ts, vs):
            if t is None:
                assert v is None
                continue
            ref = B._np(t)
            assert v.shape == ref.shape
            assert t.numel() == 0 or v.__array_interface__["data"][0] == t.data_ptr()
            assert v.view(ref.dtype).tobytes() == ref.tobytes()
