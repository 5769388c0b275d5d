"""The one benchmark engine (tensor_ops/_bench.py): the ladder and its convergence rule, the
sampling of reference rows, the timer and its statistic (median of per-round ratios), strict
mode without os.environ, progress lines, the ceiling copy and its fallback label, and the
presets over it. Fake clocks and fake functions only: real speed is never asserted."""
from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import _bench, _bench_ceiling, _bench_report, _global, _tune

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_preset_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- fake clock
class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scripted(clock: FakeClock, times: list, log: list = None, name: str = ""):
    """A fn that 'takes' times[i] seconds on its i-th call (warm-up included) by advancing
    the fake clock; the last value repeats."""
    it = {"i": 0}

    def fn():
        i = it["i"]
        it["i"] += 1
        clock.t += times[min(i, len(times) - 1)]
        if log is not None:
            log.append(name)
    return fn


def test_per_round_ratio_is_robust_to_bursts_that_a_ratio_of_medians_is_not():
    clock = FakeClock()
    # warm-up first, then 5 rounds; a load burst hits the copy in rounds 2-4, the op in 3-4.
    op = scripted(clock, [2, 2, 2, 2, 10, 10])
    copy = scripted(clock, [1, 1, 1, 5, 5, 5])
    t = _bench.time_rounds({"op": op, "ceiling": copy}, budget_s=0, min_rounds=5, clock=clock)
    assert t["op"].samples == [2, 2, 2, 10, 10] and t["ceiling"].samples == [1, 1, 5, 5, 5]
    assert _bench.median_ratio(t["ceiling"], t["op"]) == pytest.approx(0.5)
    ratio_of_medians = np.median(t["ceiling"].times) / np.median(t["op"].times)
    assert ratio_of_medians == pytest.approx(2.5)
    st = _bench.stats(t, bytes_moved=10)
    assert st["op"]["median_s"] == 2 and st["op"]["x_ceiling"] == pytest.approx(0.5)
    assert st["op"]["gbps"] == pytest.approx(10 / 2 / 1e9) and st["ceiling"]["x_ceiling"] == 1.0
    assert st["ceiling"]["vs"] == {"op": pytest.approx(2.0)} and "ceiling" not in st["op"]["vs"]


def test_timer_interleaves_rotates_and_keeps_rounds_aligned():
    clock, log = FakeClock(), []
    fns = {k: scripted(clock, [1.0], log, k) for k in "abc"}
    t = _bench.time_rounds(fns, budget_s=0, min_rounds=3, clock=clock)
    assert log[:3] == ["a", "b", "c"]                                  # warm-ups
    assert log[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]    # one call each per round, rotating
    assert all(v.samples == [1.0] * 3 for v in t.values())

    def flaky():
        flaky.n += 1
        clock.t += 1
        if flaky.n == 3:
            raise RuntimeError("boom")
    flaky.n = 0
    t = _bench.time_rounds({"ok": scripted(clock, [1.0]), "flaky": flaky}, 0, 4, clock=clock)
    assert "RuntimeError: boom" in t["flaky"].error
    assert t["flaky"].samples == [1, None, None, None] and t["ok"].samples == [1.0] * 4
    st = _bench.stats(t, 1)
    assert st["flaky"]["median_s"] is None and st["flaky"]["error"]


def test_timer_budget_slow_calls_and_device_blocks():
    clock = FakeClock()
    t = _bench.time_rounds({"x": scripted(clock, [0.0625])}, budget_s=0.5, min_rounds=5, clock=clock)
    assert len(t["x"].samples) == 8                      # until 0.5 s per fn have passed
    t = _bench.time_rounds({"x": scripted(clock, [1.0])}, budget_s=0.5, min_rounds=5, clock=clock)
    assert len(t["x"].samples) == 3                      # slower than the budget: 3 rounds
    log = []
    t = _bench.time_rounds({"a": scripted(clock, [1.0], log, "a"), "b": scripted(clock, [1.0], log, "b")}, 0, 2,
                           clock=clock, warmed={"a"})
    assert log == ["b", "a", "b", "b", "a"]              # no warm-up for a (already called once)
    syncs = []
    t = _bench.time_rounds({"x": scripted(clock, [0.5])}, 0, 2, clock=clock, calls=4,
                           sync=lambda: syncs.append(1))
    assert t["x"].samples == [0.5, 0.5] and len(syncs) == 3      # warm-up block + 2 samples


# ----------------------------------------------------------------------------- ladder
def test_ladder_candidates_are_capped_whatever_the_cache_reports():
    f32 = _bench.row_ladder("float32", 32 * MIB, "default")
    assert f32 == [1, 4, 16, 64, 256, 1024, 4096, 8192, 16384]   # x4 below the LLC, then doubling
    for llc in (32 * MIB, 260 * MIB, 4 << 30):
        for dt in ("float32", "float16"):
            rows = _bench.row_ladder(dt, llc, "default")
            assert rows[-1] * 4096 * np.dtype(dt).itemsize == _bench.CAP_BYTES
            assert rows == sorted(set(rows))
    assert _bench.row_ladder("float32", 260 * MIB, "full")[-1] * 4096 * 4 * 2 >= 4 * 260 * MIB   # --full: today's
    assert _bench.row_ladder("float16", 32 * MIB, "quick") == [1, 32, 512]


def _row(col, nbytes, t, x_ceiling, kind="impl", shape=None):
    return {"col": col, "kind": kind, "nbytes": nbytes, "median_s": t, "gbps": 2 * nbytes / t / 1e9,
            "x_ceiling": x_ceiling, "shape": shape or f"{nbytes}"}


def test_convergence_rule():
    llc = 32 * MIB
    prev = [_row("cpp", 64 * MIB, 1.00, 1.10), _row("numpy", 64 * MIB, 9.0, 0.1)]
    cur = [_row("cpp", 128 * MIB, 2.06, 1.12), _row("numpy", 128 * MIB, 18.0, 0.1)]
    why = _bench.converged(prev, cur, llc)
    assert why.startswith("converged past the cache: cpp")
    # not past the cache yet: x smaller than the LLC
    small = [dict(r, nbytes=8 * MIB) for r in prev]
    assert _bench.converged(small, cur, llc) == ""
    # GB/s halved by a load burst but the ratio to the ceiling held: converged (load-robust form)
    burst = [_row("cpp", 128 * MIB, 4.0, 1.11)]
    assert _bench.converged(prev, burst, llc)
    # both moved: not converged
    moving = [_row("cpp", 128 * MIB, 3.0, 0.8)]
    assert _bench.converged(prev, moving, llc) == ""
    # a cache that reports more than the cap: never "past the cache", the cap stops the ladder
    assert _bench.converged(prev, cur, 260 * MIB) == ""


class FakeSweep:
    """measure_case / bench_case stand-ins: rows whose GB/s level off from ``flat_from`` rows;
    NumPy is 3x slower than cpp everywhere but at the first size (where it is close)."""

    def __init__(self, flat_from: int):
        self.flat_from, self.calls = flat_from, []

    def bench_case(self, name, dtype, rows, cols=4096):
        return SimpleNamespace(rows=rows, nbytes=rows * cols * 4, shape_label=f"{rows}x{cols}")

    def measure_case(self, case, size, impls, *, baselines=(), ref_impls=True, **kw):
        self.calls.append((size, tuple(baselines), ref_impls))
        gb = 40.0 if size >= self.flat_from else 40.0 * size / self.flat_from
        t = 2 * case.nbytes / gb / 1e9
        rows = [_row("cpp", case.nbytes, t, 1.1, shape=case.shape_label)]
        if ref_impls:
            rows.append(_row("numpy", case.nbytes, t * (1.1 if size == 1 else 3), 0.4, shape=case.shape_label))
        rows += [_row(b, case.nbytes, t * 2, 0.5, "baseline", case.shape_label) for b in baselines]
        return rows


def test_sweep_stops_on_convergence_and_samples_the_references(monkeypatch):
    fake = FakeSweep(flat_from=4096)
    monkeypatch.setattr(_bench, "measure_case", fake.measure_case)
    monkeypatch.setattr(_bench, "bench_case", fake.bench_case)
    impls = [_bench.ImplRef("silu", "default.cpp", "cpp", "default", "cpp"),
             _bench.ImplRef("silu", "reference.numpy", "numpy", "reference", "numpy")]
    plan = _bench.BenchPlan(["silu"], ["float32"], impls, "default", llc=32 * MIB, baselines=("torch",))
    rows, rec = _bench.sweep(plan, "silu", "float32")
    swept = [c for c in fake.calls]
    # 1..1024 by 4, then 4096 (x 64 MiB, past the 32 MiB cache), 8192: converged, no 16384
    assert [c[0] for c in swept[:8]] == [1, 4, 16, 64, 256, 1024, 4096, 8192]
    assert rec["stop"].startswith("converged") and rec["sizes"][-1] == "8192x4096"
    assert swept[0] == (1, ("torch",), True)                       # the smallest size: every row
    assert swept[1] == (4, (), True)                               # numpy was close at 1: swept once more
    assert all(c[1] == () and not c[2] for c in swept[2:8])        # then neither numpy nor torch
    # re-timed with every row: the largest size with x <= 64 MiB (4096 rows) and the middle one
    assert swept[8:] == [(64, ("torch",), True), (4096, ("torch",), True)]
    assert rec["references_at"] == ["1x4096", "64x4096", "4096x4096"]
    torch_at = {r["shape"] for r in rows if r["col"] == "torch"}
    assert torch_at == {"1x4096", "64x4096", "4096x4096"}
    assert {r["shape"] for r in rows if r["col"] == "numpy"} == {"1x4096", "4x4096", "64x4096", "4096x4096"}
    assert len([r for r in rows if r["col"] == "cpp"]) == 8      # one row per size, re-timed sizes replaced


def test_sweep_stops_at_the_cap_when_nothing_converges(monkeypatch):
    fake = FakeSweep(flat_from=1 << 30)          # bandwidth keeps growing: never converged
    monkeypatch.setattr(_bench, "measure_case", fake.measure_case)
    monkeypatch.setattr(_bench, "bench_case", fake.bench_case)
    impls = [_bench.ImplRef("silu", "default.cpp", "cpp", "default", "cpp")]
    plan = _bench.BenchPlan(["silu"], ["float32"], impls, "default", llc=260 * MIB)
    rows, rec = _bench.sweep(plan, "silu", "float32")
    assert rec["stop"].startswith("cap") and rec["sizes"][-1] == "16384x4096"
    assert max(int(s.split("x")[0]) for s in rec["references_at"]) * 4096 * 4 <= _bench.REF_CAP_BYTES
    full = _bench.BenchPlan(["silu"], ["float32"], impls, "quick", baselines=("torch",))
    fake.calls.clear()
    _bench.sweep(full, "silu", "float32")
    assert fake.calls == [(1, ("torch",), True), (32, ("torch",), True), (512, ("torch",), True)]


def test_a_spent_time_budget_stops_the_ladder_past_the_cache(monkeypatch):
    fake, clock = FakeSweep(flat_from=1 << 30), FakeClock()
    measure = fake.measure_case

    def timed(*a, **kw):
        clock.t += 1.0
        return measure(*a, **kw)
    monkeypatch.setattr(_bench, "measure_case", timed)
    monkeypatch.setattr(_bench, "bench_case", fake.bench_case)
    impls = [_bench.ImplRef("silu", "default.cpp", "cpp", "default", "cpp")]
    plan = _bench.BenchPlan(["silu"], ["float32"], impls, "default", llc=32 * MIB, time_budget_s=5.0)
    out = _bench.benchmark(plan, clock=clock)
    rec = out["ladders"][0]
    # over budget from 1024 rows on, but the ladder goes on until x >= 32 MiB (4096 rows: 64 MiB)
    assert rec["sizes"][-1] == "4096x4096" and rec["stop"].startswith("time budget (5s for the run) spent")


# ----------------------------------------------------------------------------- strict mode
def test_strict_mode_uses_the_settings_not_the_environment(monkeypatch):
    monkeypatch.delenv("TENSOR_OPS_STRICT", raising=False)
    m = _global.manager()
    to.get_manager().resolve("silu", None, "facade", "float32", 64)     # backends probed (they may set env)
    before_env, before = dict(os.environ), m.settings
    assert not before.strict
    with _bench.strict_mode():
        assert "TENSOR_OPS_STRICT" not in os.environ and dict(os.environ) == before_env
        assert m.settings.strict and m.settings is not before
        assert "strict_mode" in m.settings.strict_source
        assert to.get_manager().resolve("silu", None, "facade", "float32", 64).strict
    assert m.settings is before and dict(os.environ) == before_env
    assert not to.get_manager().resolve("silu", None, "facade", "float32", 64).strict


# ----------------------------------------------------------------------------- progress
def test_progress_prints_plain_lines_with_an_eta_when_not_a_terminal():
    clock, out = FakeClock(), io.StringIO()
    con = SimpleNamespace(is_terminal=False)
    p = _bench_report.Progress(con, "benchmark", 4, stream=out, clock=clock)
    for what in ("rms_norm float32", "rms_norm float16", "softmax float32", "softmax float16"):
        p(what)
        clock.t += 40
    p.close()
    assert out.getvalue().splitlines() == ["[1/4] rms_norm float32 … eta ?",
                                           "[2/4] rms_norm float16 … eta 2m00s",
                                           "[3/4] softmax float32 … eta 1m20s",
                                           "[4/4] softmax float16 … eta 40s"]
    quiet = io.StringIO()
    q = _bench_report.Progress(None, "validate", 2, lines=False, stream=quiet)
    q("a")
    assert quiet.getvalue() == "" and q.bar is None


# ----------------------------------------------------------------------------- the ceiling
def test_ceiling_falls_back_to_a_labelled_memcpy(monkeypatch):
    monkeypatch.setattr(_bench_ceiling, "stream_copy_fn", lambda: None)
    case = _bench.bench_case("rope", "float32", 64, 1024)
    fn, kind, label = _bench.ceiling_copy(case.reads, case.bytes_moved // 2)
    assert kind == "memcpy" and label == _bench.MEMCPY_MISSING
    assert label == "memcpy (no streaming copy: tensor_ops._cpp.stream_copy missing)"
    fn()
    rows = _bench.measure_case(case, 64, [], budget_s=0, min_rounds=1)
    assert [r["col"] for r in rows] == ["ceiling"] and rows[0]["ceiling"] == _bench.MEMCPY_MISSING


def test_ceiling_streams_the_ops_own_pages_when_stream_copy_exists(monkeypatch):
    seen = []

    def stand_in(src, dst, pages=1):      # a local stand-in for tensor_ops._cpp.stream_copy
        assert src.flags.c_contiguous and dst.flags.c_contiguous and src.nbytes == dst.nbytes
        seen.append((src, dst, pages))
        np.copyto(dst, src)
    monkeypatch.setattr(_bench_ceiling, "stream_copy_fn", lambda: stand_in)
    monkeypatch.setattr(_bench_ceiling, "_LAYOUT", {})
    case = _bench.bench_case("rope", "float16", 32, 1024)          # x (8, 32, 128) fp16 + two (32, 128) fp32 tables
    assert case.bytes_moved == 2 * case.x.nbytes + 2 * 32 * 128 * 4
    fn, kind, label = _bench.ceiling_copy(case.reads, case.bytes_moved // 2)
    assert kind == "stream" and label.startswith("streaming-store copy of the op's pages")
    # 64 KiB of x: both layouts were timed (a warm-up and PROBE_CALLS calls each) to pick one
    assert sorted({p for *_, p in seen}) == list(_bench_ceiling.PAGES)
    assert len(seen) == 2 * len(_bench_ceiling.PAGES) * (_bench_ceiling.PROBE_CALLS + 1)
    seen.clear()
    fn()
    assert len({p for *_, p in seen}) == 1 and ("pages at a time" in label) == (seen[0][2] > 1)
    assert sum(s.nbytes for s, *_ in seen) == case.bytes_moved // 2        # moves exactly the op's bytes
    assert np.shares_memory(seen[0][0], case.x) and np.shares_memory(seen[1][0], case.args[0])
    assert np.array_equal(seen[0][1], case.x.reshape(-1).view(np.uint8))
    impls = [i for i in _bench.facade_impls(["rope"]) if i.backend == "numpy"]
    rows = _bench.measure_case(case, 32, impls, budget_s=0, min_rounds=2, memcpy=True)
    by = {r["col"]: r for r in rows}
    assert set(by) == {"numpy", "ceiling", "memcpy"}
    assert by["memcpy"]["label"].startswith("memcpy (") and by["numpy"]["ceiling"] == label  # the same size: no probe
    assert by["numpy"]["x_ceiling"] > 0 and "memcpy" in by["numpy"]["vs"]


@pytest.mark.parametrize("slow", [1, 4])
def test_ceiling_keeps_the_faster_stream_copy_layout(monkeypatch, slow):
    clock = [0.0]                         # a fake clock: each copy advances it by its layout's cost

    def stand_in(src, dst, pages=1):
        clock[0] += 3.0 if pages == slow else 1.0
        np.copyto(dst, src)
    monkeypatch.setattr(_bench_ceiling, "_clock", lambda: clock[0])
    monkeypatch.setattr(_bench_ceiling, "stream_copy_fn", lambda: stand_in)
    monkeypatch.setattr(_bench_ceiling, "_LAYOUT", {})
    x = np.ones((64, 1024), np.float32)   # 256 KiB: room for 4-page blocks
    fn, kind, label = _bench.ceiling_copy([x], x.nbytes)
    assert kind == "stream" and ("4 pages at a time" in label) == (slow == 1)
    clock[0] = 0.0                        # a size within 2x takes the choice made: no second probe
    y = np.ones((96, 1024), np.float32)
    assert _bench.ceiling_copy([y], y.nbytes)[2] == label and clock[0] == 0.0
    small = np.ones(1000, np.float32)     # under two 4-page blocks: the linear copy, no probe
    clock[0] = 0.0
    assert "pages at a time" not in _bench.ceiling_copy([small], small.nbytes)[2] and clock[0] == 0.0


def test_bytes_moved_counts_the_big_tensors():
    g = _bench.bench_case("swiglu", "float32", 8, 256)       # reads 2h, writes h
    assert g.bytes_moved == 8 * 256 * 4 + 8 * 128 * 4 and g.out_shape == (8, 128)
    r = _bench.bench_case("rms_norm", "float16", 8, 256)     # the (n,) weight is not counted
    assert r.bytes_moved == 2 * 8 * 256 * 2
    m = _bench.bench_case("matmul", "float32", 16)
    assert m.bytes_moved == 3 * 16 * 16 * 4


# ----------------------------------------------------------------------------- rows, tuning
def test_rows_of_a_real_case_and_tuning_ranks_only_out_rows():
    case = _bench.bench_case("relu", "float32", 4, 512)
    impls = [i for i in _bench.facade_impls(["relu"]) if i.available]
    rows = _bench.measure_case(case, 4, impls, baselines=("numpy formula",), fresh=True, budget_s=0, min_rounds=2)
    kinds = {r["col"]: r["kind"] for r in rows}
    assert kinds["numpy"] == "impl" and kinds["numpy (fresh)"] == "fresh" and kinds["numpy formula"] == "baseline"
    assert kinds["ceiling"] == "ceiling"
    for r in rows:
        assert r["error"] is None, r
        assert r["reps"] == 2 and r["x_ceiling"] > 0 and r["gbps"] > 0
    t = _tune.build_tuning(rows, {}, 1.0, "test")
    tokens = {tok for b in t["ops"]["relu"]["float32"] for tok in b["order"]}
    assert tokens <= {i.token for i in impls}            # no fresh / baseline / ceiling row ranks


# ----------------------------------------------------------------------------- presets
def test_bench_cpp_preset_rows_and_table(capsys):
    if not to.get_backend_info()["backends"]["cpp"]["available"]:
        pytest.skip(f"cpp unavailable: {to.get_backend_info()['backends']['cpp']['reason']}")
    mod = _load("bench_cpp")
    rows = mod.run(sizes=((8, 256),), ops=("gelu_tanh", "swiglu"), reps=1, with_torch=False)
    cols = {(r["name"], r["col"]) for r in rows}
    assert {("gelu_tanh", "cpp"), ("gelu_tanh", "cpp (fresh)"), ("gelu_tanh", "numpy formula"),
            ("gelu_tanh", "ceiling"), ("swiglu", "cpp")} <= cols
    assert all(r["variant"] == "tanh" for r in rows if r["name"] == "gelu_tanh")
    mod.print_table(rows)
    out = capsys.readouterr().out
    assert "× ceiling" in out and "gelu_tanh" in out and "ceiling: " in out
    with pytest.raises(SystemExit):
        mod.main(["--sizes", "8192"])


def test_bench_cpp_runs_bfloat16_in_a_fresh_interpreter():
    """A preset names dtypes as strings; 'bfloat16' is ml_dtypes' and NumPy only knows the name
    once ml_dtypes is imported. The suite's conftest imports it, a user's shell does not: the
    preset once died with "data type 'bfloat16' not understood" (ml_dtypes 0.7)."""
    if not to.get_backend_info()["backends"]["cpp"]["available"]:
        pytest.skip(f"cpp unavailable: {to.get_backend_info()['backends']['cpp']['reason']}")
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_cpp.py"), "--sizes", "8x256", "--dtypes",
                        "bfloat16", "--ops", "relu", "--reps", "1", "--no-torch"],
                       capture_output=True, text=True, cwd=root, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "relu  8x256  bfloat16" in r.stdout


def test_ab_builds_compares_two_loaded_builds(capsys):
    """ab_builds loads a build beside tensor_ops._cpp (here the same file under another module
    object) and times both on every case, the two-output and bfloat16 ones included."""
    if not to.get_backend_info()["backends"]["cpp"]["available"]:
        pytest.skip(f"cpp unavailable: {to.get_backend_info()['backends']['cpp']['reason']}")
    from tensor_ops import _cpp
    mod = _load("ab_builds")
    other = mod.load_other(_cpp.__file__)
    assert other is not _cpp and other.rms_norm is not _cpp.rms_norm
    # --copies: every load its own module (one name for all returned the first module object)
    again = mod.load_other(_cpp.__file__)
    assert again is not other and again.rms_norm is not other.rms_norm
    ops = ("rms_norm", "add_rms_norm", "gelu_tanh", "rope", "tex_softmax", "tex_softmax_mask",
           "tex_softmax_causal", "tex_softmax_bwd", "tex_dgelu", "tex_dbias_dsilu", "tex_dglu_silu", "tex_sgd",
           "tex_adam", "ag_gelu_erf_bwd", "ag_tanh", "ag_exp", "ag_glu2_bwd_gelu")
    mod.main([_cpp.__file__, "--ops", *ops, "--dtypes", "float32", "bfloat16", "--rows", "16", "--rounds", "1"])
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.split() and ln.split()[0] in ops]
    assert len(lines) == 34 and not any("error" in ln for ln in lines), out
    # --data: x 8 x wider, or every finite 16-bit code (no Inf / NaN) equally likely
    x = np.random.default_rng(0).standard_normal((64, 512), np.float32)
    assert np.array_equal(mod._spread(x, "wide"), x * 8) and mod._spread(x, "normal") is x
    for dt in (np.float16, np.dtype("bfloat16")):
        c = mod._spread(x.astype(dt), "codes")
        assert c.dtype == dt and c.shape == x.shape and np.isfinite(c.astype(np.float32)).all()
        assert len(np.unique(c.view(np.uint16))) > 20000  # spread over the codes, not normal's few thousand
    mod.main([_cpp.__file__, "--ops", "gelu", "tex_dsilu", "--dtypes", "float16", "--rows", "16", "--rounds", "1",
              "--data", "codes"])
    out = capsys.readouterr().out
    assert sum(ln.split()[0] in ("gelu", "tex_dsilu") and "error" not in ln
               for ln in out.splitlines() if ln.split()) == 2, out
    # --out-offset: every array of a call (inputs too, small ones too) at page + 64 + offset
    for n in (100, 1 << 22):
        for off in (0, 16):
            a = mod._placed(np.arange(n, dtype=np.float32), off)
            assert a.ctypes.data % 4096 == 64 + off and a[-1] == n - 1
    assert mod._placed(a, None) is a
    mod.main([_cpp.__file__, "--ops", "gelu", "tex_dbias_dgelu", "--dtypes", "bfloat16", "--rows", "16",
              "--rounds", "1", "--out-offset", "0"])
    out = capsys.readouterr().out
    assert sum(ln.split()[0] in ("gelu", "tex_dbias_dgelu") for ln in out.splitlines() if ln.split()) == 2, out


def test_bench_cuda_preset_parses_and_explains_a_missing_gpu(capsys):
    mod = _load("bench_cuda")
    a = mod.parse_args([])
    assert a.ops == list(mod.OPS) and a.dtypes == ["float32", "bfloat16"]
    assert a.shapes == [(8192, 8192), (1, 4096)] and a.iters == 50 and not a.no_compile and a.json is None
    assert not a.graph
    a = mod.parse_args(["--ops", "rms_norm,softmax,add_rms_norm", "--dtypes", "float16", "--shapes", "64x128",
                        "--json", "o.json", "--no-compile", "--rounds", "3", "--graph"])
    assert (a.ops, a.dtypes, a.shapes, a.json, a.rounds, a.graph) == (
        ["rms_norm", "softmax", "add_rms_norm"], ["float16"], [(64, 128)], "o.json", 3, True)
    for bad in (["--ops", "nope"], ["--dtypes", "int8"], ["--shapes", "64"]):
        with pytest.raises(SystemExit) as exc:
            mod.parse_args(bad)
        assert exc.value.code == 2
    capsys.readouterr()
    from tensor_ops.backends import cuda
    if cuda.availability()[0]:
        pytest.skip("a usable GPU is present: the no-GPU exit is not reachable")
    with pytest.raises(SystemExit) as exc:
        mod.main(["--ops", "silu"])
    assert exc.value.code == 2 and "no usable GPU" in capsys.readouterr().err


def test_device_cases_convert_dtype_and_bytes():
    pytest.importorskip("torch")
    from tensor_ops._bench_cases import on_torch
    case = on_torch(_bench.bench_case("rope", "float32", 16, 256), "cpu", "bfloat16")
    assert str(case.x.dtype) == "torch.bfloat16" and str(case.reads[1].dtype) == "torch.float32"
    assert case.bytes_moved == 2 * 2 * 16 * 256 + 2 * 16 * 128 * 4
    assert case.empty_out().shape == case.x.shape
    fn, kind, _ = _bench.ceiling_copy(case.reads, case.bytes_moved // 2)   # CPU tensors: their NumPy pages
    assert kind in ("stream", "memcpy")
    fn()
