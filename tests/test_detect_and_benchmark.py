"""detect_and_benchmark.py / ``python -m tensor_ops bench`` / the tuning table (issue 7).

The end-to-end runs are ``--quick --no-build`` subprocesses on a private TENSOR_OPS_CONFIG, with
a plugin that registers a vendor impl with wrong numerics; speed is never asserted, only what
the run writes and how the resolver follows it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import _config, _policy, _tune

ROOT = Path(__file__).resolve().parent.parent

BROKEN_PLUGIN = textwrap.dedent('''
    import numpy as np
    from tensor_ops.plugin import BackendImplKind, OpImpl

    def _silu_wrong(x, out):
        y = (x * 2).astype(x.dtype)          # deliberately not silu
        if out is None:
            return y
        out[...] = y
        return out

    def register(registry):
        registry.register_impl(OpImpl(op_name="silu", impl_id="vendor.broken", kind=BackendImplKind.VENDOR,
                                      vendor="broken", fn=_silu_wrong, priority=100, api="facade",
                                      supports=lambda x, out=None: type(x) is np.ndarray))
''')


def _clean_env(cfg: Path, extra_path: Path | None = None, plugins: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _policy.ALL_ENV}
    env["TENSOR_OPS_CONFIG"] = str(cfg)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(extra_path or ""), env.get("PYTHONPATH", "")) if p)
    if plugins:
        env["TENSOR_OPS_PLUGINS"] = plugins
    return env


@pytest.fixture
def no_env_overrides(monkeypatch):
    """The tuning table ranks below every env/runtime setting: clear them for resolver checks."""
    for k in _policy.ALL_ENV:
        if k != "TENSOR_OPS_CONFIG":
            monkeypatch.delenv(k, raising=False)


def _reload():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to.reload_config()


def _first_impl(op, dtype, nbytes):
    res = to.get_manager().resolve(op, None, "facade", dtype, nbytes)
    return res.candidates[0], res.source


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `detect_and_benchmark.py --quick --no-build` run with a broken vendor plugin and a
    user `per_op` setting already in the config file."""
    d = tmp_path_factory.mktemp("dab")
    (d / "broken_vendor_plugin.py").write_text(BROKEN_PLUGIN)
    cfg = d / "backend.json"
    cfg.write_text(json.dumps({"schema_version": 1, "per_op": {"softmax": ["numpy"]}, "strict": False}))
    out = d / "res" / "bench.json"
    cmd = [sys.executable, str(ROOT / "detect_and_benchmark.py"), "--quick", "--no-build",
           "--ops", "silu,relu,softmax", "--dtypes", "float32,float16", "--no-torch",
           "--json", str(out), "--plot", str(d / "res" / "plot.png")]
    p = subprocess.run(cmd, cwd=d, env=_clean_env(cfg, d, "broken_vendor_plugin"),
                       capture_output=True, text=True, timeout=240)
    return {"proc": p, "cfg": cfg, "json": out, "dir": d}


def test_quick_run_writes_a_valid_tuning_table(quick_run):
    p = quick_run["proc"]
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]   # 1: a backend failed numerics
    data = json.loads(quick_run["cfg"].read_text())
    cfg = _config.validate_config(data, str(quick_run["cfg"]))
    tuning = cfg.tuning
    assert _policy.fingerprint_mismatch(tuning["fingerprint"]) is None
    assert set(tuning["ops"]) == {"silu", "relu", "softmax"}
    for per_dtype in tuning["ops"].values():
        assert set(per_dtype) == {"float32", "float16"}
        for buckets in per_dtype.values():
            assert buckets[-1]["max_bytes"] is None
            assert all(b["order"][-1] == "numpy" or "numpy" in b["order"] for b in buckets)
    assert tuning["copy_gbps"] > 0
    assert "detected" in data and "cpu" in data["detected"]
    assert quick_run["json"].is_file() and (quick_run["dir"] / "res" / "plot.png").stat().st_size > 1000
    raw = json.loads(quick_run["json"].read_text())
    assert raw["ceiling"] and raw["results"] and raw["serving"] and raw["mode"] == "quick"
    assert {r["backend"] for r in raw["results"]} >= {"numpy"}
    ceil = [r for r in raw["results"] if r["kind"] == "ceiling"]
    assert len(ceil) == 3 * 2 * 3 and all(r["gbps"] for r in ceil)         # one per (op, dtype, size)
    assert tuning["copy_gbps"] == pytest.approx(raw["ceiling_gbps_largest"], rel=1e-3)
    labels = {c["ceiling"] for c in ceil}        # the copy layout is chosen per size
    assert raw["ceiling"].split(" | ") == sorted(labels, key=raw["ceiling"].index)
    for r in raw["results"]:
        if r["kind"] == "impl" and r["median_s"]:
            assert r["x_ceiling"] > 0 and r["ceiling"] in labels
    assert [(d["op"], d["dtype"]) for d in raw["ladders"]] == [(o, dt) for o in ("silu", "relu", "softmax")
                                                               for dt in ("float32", "float16")]


def test_quick_run_prints_progress_lines_when_piped(quick_run):
    out = quick_run["proc"].stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert lines[0] == "[1/6] silu float32 … eta ?", out[-3000:]
    assert [ln.split(" … ")[0] for ln in lines] == [f"[{k}/6] {o} {dt}" for k, (o, dt) in enumerate(
        [(o, dt) for o in ("silu", "relu", "softmax") for dt in ("float32", "float16")], 1)]
    assert all(" … eta " in ln for ln in lines)
    assert "× ceiling" in out and "ceiling: " in out


def test_broken_backend_is_excluded_with_its_reason(quick_run):
    raw = json.loads(quick_run["json"].read_text())
    rec = raw["validation"]["vendor.broken"]
    assert "silu" in rec["excluded_ops"] and "wrong numerics" in rec["excluded_ops"]["silu"]
    assert "EXCLUDED vendor.broken from silu" in quick_run["proc"].stdout
    tuning = json.loads(quick_run["cfg"].read_text())["tuning"]
    assert "vendor.broken excluded from silu" in tuning["source"]
    for buckets in tuning["ops"]["silu"].values():
        for b in buckets:
            assert not any("broken" in t for t in b["order"])
            assert "vendor.broken" in b["why"]
    assert not any(r["impl_id"] == "vendor.broken" for r in raw["results"])


def test_user_per_op_survives_and_keeps_precedence(quick_run, monkeypatch, no_env_overrides):
    data = json.loads(quick_run["cfg"].read_text())
    assert data["per_op"] == {"softmax": ["numpy"]} and data["strict"] is False
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(quick_run["cfg"]))
    _reload()
    impl, source = _first_impl("softmax", "float32", 1 << 26)
    assert impl.impl_id == "reference.numpy" and "per_op.softmax" in source


def test_resolver_follows_the_written_table(quick_run, monkeypatch, no_env_overrides):
    monkeypatch.setenv("TENSOR_OPS_CONFIG", str(quick_run["cfg"]))
    _reload()
    assert to.get_backend_info()["tuning"]["status"].startswith("in use")
    tuning = json.loads(quick_run["cfg"].read_text())["tuning"]
    m = to.get_manager()
    for op in ("silu", "relu"):
        for dt, buckets in tuning["ops"][op].items():
            m.invalidate()       # one dtype at a time: see test_tuned_resolution_is_cached_per_dtype
            lo = 0
            for b in buckets:
                nb = b["max_bytes"] if b["max_bytes"] is not None else lo + (1 << 20)
                impl, source = _first_impl(op, dt, nb)
                first = next(i for tok in b["order"] for i in m.registry.get_impls(op, "facade")
                             if (i.backend == tok or f"impl:{i.impl_id}" == tok) and not m._exclusion(i))
                assert impl is first, (op, dt, nb, b, source)
                assert "'tuning'" in source
                lo = nb


def test_tuned_resolution_is_cached_per_dtype(isolated_config, no_env_overrides):
    table = {"fingerprint": _policy.machine_fingerprint(), "created": "test", "copy_gbps": 1.0, "source": "test",
             "ops": {"relu": {"float32": [{"max_bytes": None, "order": ["numpy"]}],
                              "float16": [{"max_bytes": None, "order": ["opencl", "cpp", "numpy"]}]}}}
    _config.write_config({"schema_version": 1, "tuning": table}, isolated_config)
    _reload()
    m = to.get_manager()
    r16 = m.resolve("relu", None, "facade", "float16", 1 << 20)
    r32 = m.resolve("relu", None, "facade", "float32", 1 << 20)
    assert r16.tokens == ["opencl", "cpp", "numpy"]
    assert r32.tokens == ["numpy"], r32.source


def _other_backend():
    m = to.get_manager()
    for name in ("cpp", "opencl"):
        impls = [i for i in m.registry.get_impls("silu", "facade") if i.backend == name]
        if impls and not m._exclusion(impls[0]):
            return name
    return None


def test_resolver_uses_numpy_small_and_native_large(isolated_config, no_env_overrides):
    """A crafted table: numpy up to 64 KiB, then a native backend (cpp, else opencl)."""
    _reload()
    other = _other_backend()
    if other is None:
        pytest.skip("neither cpp nor opencl is available here: " +
                    "; ".join(f"{k}: {v['reason']}" for k, v in to.get_backend_info()["backends"].items()
                              if k in ("cpp", "opencl")))
    table = {"fingerprint": _policy.machine_fingerprint(), "created": "test", "copy_gbps": 10.0, "source": "test",
             "ops": {"silu": {"float32": [{"max_bytes": 65536, "order": ["numpy"], "why": "small"},
                                          {"max_bytes": None, "order": [other, "numpy"], "why": "large"}]}}}
    _config.write_config({"schema_version": 1, "tuning": table}, isolated_config)
    _reload()
    small = np.random.default_rng(0).standard_normal((2, 4096)).astype(np.float32)      # 32 KiB
    large = np.random.default_rng(1).standard_normal((64, 4096)).astype(np.float32)     # 1 MiB
    m = to.get_manager()
    for x, want in ((small, "reference.numpy"), (large, f"default.{other}")):
        res = m.resolve("silu", None, "facade", "float32", x.nbytes)
        before = dict(res.by_impl)
        y = to.silu(x)
        assert res.by_impl.get(want, 0) == before.get(want, 0) + 1, (x.shape, dict(res.by_impl))
        np.testing.assert_allclose(y, x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-5, atol=1e-6)
    assert to.get_backend("silu", "float32", small.nbytes) == "numpy"
    assert to.get_backend("silu", "float32", large.nbytes) == other


def test_tune_crossover_ties_and_exclusions():
    def row(tok, nb, t):
        return {"op": "relu", "dtype": "float32", "nbytes": nb, "token": tok, "impl_id": f"x.{tok}",
                "median_s": t, "gbps": 2 * nb / t / 1e9}
    rows = [row("numpy", 1000, 1.0), row("cpp", 1000, 2.0), row("impl:vendor.bad", 1000, 0.1),
            row("numpy", 4000, 1.0), row("cpp", 4000, 1.02),          # near tie: cpp keeps its rank
            row("numpy", 16000, 4.0), row("cpp", 16000, 1.0)]
    val = {"x.impl:vendor.bad": {"excluded_ops": {"relu": "wrong numerics vs fp64 reference: test"}}}
    t = _tune.build_tuning(rows, val, 9.5, "unit test")
    buckets = t["ops"]["relu"]["float32"]
    assert [b["order"] for b in buckets] == [["numpy", "cpp"], ["cpp", "numpy"]]
    assert buckets[0]["max_bytes"] == 2000 and buckets[1]["max_bytes"] is None   # sqrt(1000 * 4000)
    assert "impl:vendor.bad" in buckets[0]["why"] or "x.impl:vendor.bad" in buckets[0]["why"]
    _config.validate_tuning(t, "test", _config.known_names())


def test_write_keeps_user_settings_and_refuses_invalid_files(tmp_path):
    cfg = tmp_path / "b.json"
    user = {"schema_version": 1, "priority": ["cpp", "numpy"], "per_op": {"rms_norm": ["numpy"]},
            "strict": True, "disabled": ["cuda"], "built": {"cpp": {"ok": True}}}
    cfg.write_text(json.dumps(user))
    t = {"fingerprint": _policy.machine_fingerprint(), "created": "now", "copy_gbps": 1.0, "source": "t",
         "ops": {"relu": {"float32": [{"max_bytes": None, "order": ["numpy"]}]}}}
    path, kept = _tune.write_tuning(t, {"python": "3"}, cfg, ["numpy", "cpp", "cuda", "opencl"])
    data = json.loads(cfg.read_text())
    for k, v in user.items():
        assert data[k] == v
    assert data["tuning"]["ops"]["relu"] and data["detected"] == {"python": "3"}
    assert set(kept) == {"priority", "per_op", "strict", "disabled"}
    cfg.write_text("{not json")
    with pytest.raises(ValueError):
        _tune.write_tuning(t, None, cfg, ["numpy"])
    assert cfg.read_text() == "{not json"


def test_bench_cli_quick_does_not_write(tmp_path):
    cfg = tmp_path / "backend.json"
    out = tmp_path / "b" / "bench.json"
    p = subprocess.run([sys.executable, "-m", "tensor_ops", "bench", "--quick", "--ops", "relu",
                        "--dtypes", "float32", "--no-torch", "--json", str(out)],
                       cwd=tmp_path, env=_clean_env(cfg), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert not cfg.exists()
    raw = json.loads(out.read_text())
    assert out.with_suffix(".png").is_file()
    assert all(r["op"] == "relu" and r["dtype"] == "float32" for r in raw["results"])
    assert "relu" in p.stdout and "who serves each op now" in p.stdout


def _dab():
    spec = importlib.util.spec_from_file_location("_dab_under_test", ROOT / "detect_and_benchmark.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_steps_that_are_up_to_date_are_not_rerun(tmp_path, monkeypatch):
    dab = _dab()
    (tmp_path / "cpp_ext").mkdir()
    (tmp_path / "tensor_ops" / "_build").mkdir(parents=True)
    src = [tmp_path / "cpp_ext" / "norm.cpp", tmp_path / "cpp_ext" / "simd.h", tmp_path / "setup.py",
           tmp_path / "tensor_ops" / "_build" / "cpp_build.py"]
    so = tmp_path / "tensor_ops" / ("_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    for p in src + [so]:
        p.write_text("x")
    monkeypatch.setattr(dab, "ROOT", tmp_path)
    for k in ("TENSOR_OPS_CPP_SANITIZE", "TENSOR_OPS_CPP_VARIANTS", "TENSOR_OPS_SKIP_CPP"):
        monkeypatch.delenv(k, raising=False)
    os.utime(so, (2000, 2000))
    for p in src:
        os.utime(p, (1000, 1000))
    assert "is newer than cpp_ext/" in dab.up_to_date("cpp")
    os.utime(src[1], (3000, 3000))                     # a header changed: rebuild
    assert dab.up_to_date("cpp") == ""
    os.utime(src[1], (1000, 1000))
    monkeypatch.setenv("TENSOR_OPS_CPP_SANITIZE", "1")  # a build switch: always build
    assert dab.up_to_date("cpp") == ""
    assert dab.up_to_date("cuda") == ""                 # no fatbin here
    plan = {n: skip for n, _, skip in dab.build_plan({"compilers": {"nvcc": {"path": "/x/nvcc"}, "g++": {"path": "g"}},
                                                      "cuda": {"available": False, "reason": "no GPU"},
                                                      "opencl": {"available": True}})}
    assert plan["cpp"] == "" and plan["opencl"] == "" and plan["cuda"].startswith("no CUDA device visible (no GPU)")


def test_plan_from_the_options():
    import argparse
    from tensor_ops import _bench_cli
    p = argparse.ArgumentParser()
    _bench_cli.add_arguments(p)

    def plan(*argv):
        return _bench_cli.make_plan(p.parse_args(list(argv)), [], 32 << 20)
    d = plan()
    assert (d.mode, d.time_budget_s, d.baselines, d.budget_s) == ("default", _bench_cli.TIME_BUDGET, ("torch",), 0.05)
    f = plan("--full")
    assert (f.mode, f.time_budget_s, f.budget_s) == ("full", None, 0.1)
    assert plan("--quick").mode == "quick" and plan("--quick").time_budget_s is None
    fixed = plan("--sizes", "64,1")
    assert fixed.mode == "fixed" and fixed.shapes == [(1, 4096), (64, 4096)] and fixed.matmul_sides == (1, 64)
    assert plan("--compile").baselines == ("torch", "torch.compile") and plan("--no-torch").baselines == ()
    assert plan("--time-budget", "0").time_budget_s is None and plan("--time-budget", "90").time_budget_s == 90
    with pytest.raises(SystemExit):
        p.parse_args(["--quick", "--full"])


def test_bench_cli_rejects_unknown_op(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tensor_ops", "bench", "--ops", "nope"], cwd=tmp_path,
                       env=_clean_env(tmp_path / "c.json"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown op" in p.stderr


def test_strict_stops_on_a_numerics_failure_and_writes_nothing(tmp_path):
    (tmp_path / "broken_vendor_plugin.py").write_text(BROKEN_PLUGIN)
    cfg = tmp_path / "backend.json"
    before = json.dumps({"schema_version": 1, "per_op": {"relu": ["numpy"]}})
    cfg.write_text(before)
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "detect_and_benchmark.py"), "--strict", "--quick", "--no-build",
                        "--ops", "silu", "--dtypes", "float32", "--no-torch", "--json", str(out)],
                       cwd=tmp_path, env=_clean_env(cfg, tmp_path, "broken_vendor_plugin"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert cfg.read_text() == before
    raw = json.loads(out.read_text())
    assert raw["aborted"] and raw["results"] == [] and "silu" in raw["validation"]["vendor.broken"]["excluded_ops"]
