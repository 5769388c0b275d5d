"""tex against the names TransformerEngine's own Python layer takes from ``transformer_engine_torch``.

The source of truth is the installed TE wheel (pinned: ``transformer-engine==2.20.2``, the ``te``
extra): every ``tex.<name>`` attribute use and ``from transformer_engine_torch import ...`` in
``transformer_engine/pytorch/**.py`` (found with ``ast``, without importing TE), and every enum
member used as ``tex.<Enum>.<member>``, must exist on tensor_ops.tex. A newer TE that calls a new
name fails here, not in a user's ImportError. What tex does not compute must fail at call time
with NotImplementedError naming the op, never at import."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import tensor_ops.tex as tex  # noqa: E402
from tensor_ops.tex import _enums, _unsupported  # noqa: E402

pytestmark = pytest.mark.tex

MODULE = "transformer_engine_torch"
#: names TE's Python uses that NVIDIA's extension does not define either (so tex need not)
NOT_IN_NVIDIA_EITHER = {
    "*": "`from transformer_engine_torch import *` in cpp_extensions/__init__.py (a star, not a name)",
    "LayerNorm": "onnx_extensions.py's ONNX-export LayerNorm calls tex.LayerNorm, which NVIDIA's pybind "
                 "module does not define (pybind.cpp); reached only during ONNX export",
}


def _te_pytorch_dir() -> Path:
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.origin:
        pytest.skip('transformer_engine is not installed (pip install -e ".[te]")')
    d = Path(spec.origin).parent / "pytorch"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    return d


def used_names(root: Path):
    """(name → files, enum → members) that TE's Python takes from transformer_engine_torch."""
    names: dict = {}
    members: dict = {}
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        aliases = set()
        imported: dict = {}                     # local name → tex name, from `from ... import x as y`
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update(a.asname or a.name for a in node.names if a.name == MODULE)
            elif isinstance(node, ast.ImportFrom) and node.module == MODULE and not node.level:
                for a in node.names:
                    names.setdefault(a.name, set()).add(f.name)
                    imported[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in aliases:
                names.setdefault(node.attr, set()).add(f.name)
            elif isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id in aliases:
                members.setdefault(v.attr, set()).add(node.attr)
            elif isinstance(v, ast.Name) and v.id in imported and imported[v.id][:1].isupper():
                members.setdefault(imported[v.id], set()).add(node.attr)
    return names, members


@pytest.fixture(scope="module")
def te_names():
    return used_names(_te_pytorch_dir())


def test_the_wheel_is_the_pinned_one():
    _te_pytorch_dir()
    from importlib.metadata import version
    v = version("transformer_engine")
    if v != "2.20.2":   # the checks below still run: they are what tells a newer TE's gap
        pytest.xfail(f"transformer_engine {v} installed; the te extra pins 2.20.2")


def test_every_name_te_uses_exists(te_names):
    names, _ = te_names
    assert len(names) > 150, f"only {len(names)} names found: the extractor missed TE's imports"
    missing = sorted(n for n in names if n not in NOT_IN_NVIDIA_EITHER and not hasattr(tex, n))
    assert not missing, "tensor_ops.tex lacks names TE's Python layer uses: " + ", ".join(
        f"{n} ({', '.join(sorted(names[n]))})" for n in missing)


def test_every_enum_member_te_uses_exists(te_names):
    _, members = te_names
    bad = []
    for cls, used in sorted(members.items()):
        obj = getattr(tex, cls, None)
        if obj is None or not isinstance(obj, type):
            continue
        for m in sorted(used):
            if m.startswith("__") or callable(getattr(type(obj), m, None)):
                continue
            if not hasattr(obj, m):
                bad.append(f"{cls}.{m}")
    assert not bad, f"enum members TE uses that tex lacks: {bad}"


# TE 2.20's members and values (pybind_helper.h / pybind.cpp registrations, values from the C headers)
EXPECTED = {
    "DType": {"kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6, "kFloat8E4M3": 7,
              "kFloat8E5M2": 8, "kFloat4E2M1": 10},
    "NVTE_QKV_Format": {"NVTE_SBHD": 0, "NVTE_BSHD": 1, "NVTE_THD": 2, "NVTE_BSHD_2SBHD": 3, "NVTE_SBHD_2BSHD": 4,
                        "NVTE_THD_2BSHD": 5, "NVTE_THD_2SBHD": 6, "NVTE_BHSD": 7, "NVTE_QKV_Format_NOT_SET": 8},
    "NVTE_Fused_Attn_Backend": {"NVTE_No_Backend": -1, "NVTE_F16_arbitrary_seqlen": 1, "NVTE_FP8": 2},
    "NVTE_Bias_Type": {"NVTE_NO_BIAS": 0, "NVTE_PRE_SCALE_BIAS": 1, "NVTE_POST_SCALE_BIAS": 2, "NVTE_ALIBI": 3},
    "NVTE_Mask_Type": {"NVTE_NO_MASK": 0, "NVTE_PADDING_MASK": 1, "NVTE_CAUSAL_MASK": 2,
                       "NVTE_PADDING_CAUSAL_MASK": 3, "NVTE_CAUSAL_BOTTOM_RIGHT_MASK": 4,
                       "NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK": 5},
    "NVTE_Softmax_Type": {"NVTE_VANILLA_SOFTMAX": 0, "NVTE_OFF_BY_ONE_SOFTMAX": 1, "NVTE_LEARNABLE_SOFTMAX": 2},
    "CommOverlapType": {"RS": 0, "AG": 1},
    "CommOverlapAlgo": {"BULK_OVERLAP_AG": 0, "BULK_OVERLAP_RS": 1, "SPLIT_PIPELINED_AG_P2P": 2,
                        "SPLIT_PIPELINED_RS": 3, "SPLIT_PIPELINED_RS_P2P": 4, "ATOMIC_GEMM_RS": 5,
                        "ATOMIC_GEMM_AG_P2P": 6, "ATOMIC_GEMM_RS_P2P": 7, "EXTERNAL_BULK_OVERLAP_AG": 8},
    "NVTERoutingMapFormat": {"BYTEMAP": 0, "BITMAP_U8": 1},
    "NVTEQBHistogramMode": {"TWO_KERNEL": 0, "FUSED_ATOMIC": 1},
    "Float8BlockScaleTensorFormat": {"GEMM_READY": 0, "COMPACT": 1, "INVALID": 2},
}


@pytest.mark.parametrize("enum", sorted(EXPECTED))
def test_enum_members_and_values(enum):
    cls = getattr(tex, enum)
    assert {m.name: int(m) for m in cls} == EXPECTED[enum]


def test_qkv_layout_has_te_220_members():
    L = tex.NVTE_QKV_Layout
    assert int(L.NVTE_BHSD_BHSD_BHSD) == 25 and int(L.NVTE_QKV_Layout_NOT_SET) == 26 and len(L) == 27


@pytest.mark.parametrize("name", sorted(_unsupported.FUNCTIONS))
def test_unsupported_fail_at_call_time_naming_the_op(name):
    fn = getattr(tex, name)
    with pytest.raises(NotImplementedError, match=name):
        fn()


@pytest.mark.parametrize("cls", ["CommOverlap", "CommOverlapP2P", "CommOverlapHelper"])
def test_comm_overlap_classes_fail_when_built(cls):
    with pytest.raises(NotImplementedError, match=f"tex.{cls}: userbuffers"):
        getattr(tex, cls)()


def test_fp8_tensor_meta_is_a_container():
    m = tex.FP8TensorMeta()
    m.scale = torch.ones(1)
    assert m.scale_inv is None and m.amax_history is None and float(m.scale) == 1.0


def test_capability_queries_answer_without_cuda():
    assert tex.device_supports_multicast() is False and tex.ubuf_built_with_mpi() is False
    assert tex.get_stream_priority_range() == (0, 0)
    assert tex.get_grouped_gemm_setup_workspace_size(4) == 0


def test_star_import_exports_every_public_name():
    ns: dict = {}
    exec("from tensor_ops.tex import *", ns)
    assert {"FP8TensorMeta", "CommOverlap", "NVTE_QKV_Format", "moe_permute_fwd", "splits_to_offsets"} <= set(ns)
    assert set(tex.__all__) <= set(ns)


def test_dtype_enum_matches_te_constants():
    """TE's constants.py asserts its DType mirror has exactly tex.DType's members."""
    assert set(tex.DType.__members__) == set(_enums.DType.__members__) and len(tex.DType) == 8
