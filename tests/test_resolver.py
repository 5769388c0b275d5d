"""Resolver: precedence, force/strict, order tokens, vendor filters, fallback, threads."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import tensor_ops as to
from tensor_ops import BackendImplKind, OpImpl, OpManager, OpRegistry
from tensor_ops._policy import build_settings

# run once per forced backend in CI (TENSOR_OPS_BACKEND=<name> pytest -m <name>)
pytestmark = pytest.mark.every_backend


def _impl(op, impl_id, kind="vendor", **kw):
    tag = impl_id

    def fn(x, out):
        return np.full_like(x, float(len(tag))) if out is None else out

    fn.tag = tag
    return OpImpl(op_name=op, impl_id=impl_id, kind=kind, fn=kw.pop("fn", fn), api="facade", **kw)


@pytest.fixture
def vendors():
    """Two vendor impls of facade 'relu' on the global registry, removed afterwards."""
    reg = to.get_registry()
    added = []
    for iid, prio in (("vendor.acme", 150), ("vendor.Zeta", 50)):
        added.append(reg.register_impl(_impl("relu", iid, priority=prio,
                                             fn=(lambda t: lambda x, out: np.full_like(x, t))(prio))))
    yield
    for impl in added:
        reg.unregister_impl("relu", impl.impl_id, "facade")


X = np.ones((2, 4), np.float32)


def served(op="relu"):
    return to.get_backend_info()["ops"][op]["calls"]


def test_seed_example_runs_as_written():
    calls = []

    def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
        calls.append(1)
        r = 1 / np.sqrt((input ** 2).mean(-1, keepdims=True) + eps)
        return input * r * weight, r

    input, weight = np.ones((2, 8), np.float32), np.ones(8, np.float32)
    registry = OpRegistry()
    registry.register_impl(OpImpl(op_name="rmsnorm_fwd", impl_id="vendor.mybackend", kind=BackendImplKind.VENDOR,
                                  vendor="mybackend", fn=my_rmsnorm, priority=200))
    manager = OpManager(registry)
    output, rsigma = manager.call("rmsnorm_fwd", input, weight)
    assert calls == [1] and output.shape == (2, 8) and rsigma.shape == (2, 1)


def test_duplicate_registration_names_both_sites():
    reg = OpRegistry()
    reg.register_impl(_impl("relu", "vendor.a"))
    with pytest.raises(ValueError,
                       match=r"first registered at .*test_resolver.py:\d+, again at .*test_resolver.py:\d+"):
        reg.register_impl(_impl("relu", "vendor.a"))


def test_registration_validated_at_register_time():
    with pytest.raises(TypeError, match="fn"):
        OpImpl(op_name="relu", impl_id="vendor.a", kind="vendor", fn=42)
    with pytest.raises(ValueError, match="kind"):
        OpImpl(op_name="relu", impl_id="vendor.a", kind="bogus", fn=print)
    with pytest.raises(ValueError, match="unknown op 'rmsnorm'"):
        to.get_registry().register_impl(OpImpl(op_name="rmsnorm", impl_id="vendor.a", kind="vendor", fn=print))


def test_flagos_is_default_kind():
    assert BackendImplKind("flagos") is BackendImplKind.DEFAULT
    assert BackendImplKind.FLAGOS is BackendImplKind.DEFAULT


def test_default_order_puts_reference_last(vendors, unforced):
    res = to.get_manager().resolve("relu", None, "facade")
    ids = [i.impl_id for i in res.candidates]
    assert ids[-1] == "reference.numpy"
    assert ids.index("vendor.acme") < ids.index("vendor.Zeta")


def test_precedence_keyword_context_set_env_config(vendors, isolated_config, monkeypatch, unforced):
    isolated_config.write_text('{"schema_version": 1, "priority": ["vendor:zeta"]}')
    to.reload_config()
    assert to.relu(X)[0, 0] == 50                      # backend.json priority
    monkeypatch.setenv("TENSOR_OPS_PRIORITY", "numpy")
    to.reload_config()
    assert to.relu(X)[0, 0] == 1                       # env beats file
    to.set_backend("vendor:acme")
    assert to.relu(X)[0, 0] == 150                     # set_backend beats env
    with to.use_backend("vendor:zeta"):
        assert to.relu(X)[0, 0] == 50                  # use_backend beats set_backend
        assert to.relu(X, backend="numpy")[0, 0] == 1  # keyword beats everything
    assert to.relu(X)[0, 0] == 150
    to.set_backend(None)


def test_per_op_beats_priority_and_tokens(vendors, isolated_config, unforced):
    isolated_config.write_text('{"schema_version": 1, "priority": ["numpy"], '
                               '"per_op": {"relu": ["impl:vendor.Zeta", "numpy"]}}')
    to.reload_config()
    assert to.relu(X)[0, 0] == 50
    assert to.get_backend_info()["ops"]["relu"]["source"].endswith("'per_op.relu'")


@pytest.mark.parametrize("token,expect", [("vendor:ACME", 150), ("vendor", 150), ("reference", 1),
                                          ("zeta", 50), ("flagos,reference", 1)])
def test_order_tokens(vendors, token, expect, unforced):
    assert to.relu(X, backend=token)[0, 0] == expect


def test_unknown_backend_name_lists_choices():
    with pytest.raises(ValueError, match=r"unknown backend 'cdua'.*\['acme'|unknown backend 'cdua'.*'cpp'"):
        to.relu(X, backend="cdua")
    with pytest.raises(ValueError, match="unknown backend"):
        to.set_backend("nope")
    with pytest.raises(ValueError, match="unknown backend"):
        with to.use_backend("nope"):
            pass


def test_allow_and_deny_vendors(vendors, monkeypatch, unforced):
    monkeypatch.setenv("TE_FL_DENY_VENDORS", "ACME")
    to.reload_config()
    assert to.relu(X, backend="vendor")[0, 0] == 50
    monkeypatch.delenv("TE_FL_DENY_VENDORS")
    monkeypatch.setenv("TE_FL_ALLOW_VENDORS", "zeta")
    to.reload_config()
    res = to.get_manager().resolve("relu", None, "facade")
    assert "vendor.acme" in res.excluded and "allow_vendors" in res.excluded["vendor.acme"]


def test_forced_unavailable_backend_is_an_error():
    reg = to.get_registry()
    reg.register_impl(_impl("relu", "vendor.ghost", available=lambda: (False, "no ghost device")))
    try:
        with pytest.raises(to.BackendUnavailableError, match="no ghost device"):
            to.relu(X, backend="ghost")
    finally:
        reg.unregister_impl("relu", "vendor.ghost", "facade")


def test_forced_backend_without_the_op_is_an_error(monkeypatch, unforced):
    """A forced backend is never silently replaced: an op it lacks is a clear error naming
    the backend, the op and what it serves, unless a fallback is asked for."""
    reg = to.get_registry()
    reg.register_impl(_impl("silu", "vendor.only_silu"))
    try:
        monkeypatch.setenv("TENSOR_OPS_BACKEND", "only_silu")
        to.reload_config()
        with pytest.raises(to.BackendUnsupportedError,
                           match=r"'only_silu' was forced .* does not support op 'relu'.*ops \['silu'\]"):
            to.relu(np.array([-1.0, 2.0], np.float32))
        monkeypatch.setenv("TENSOR_OPS_FALLBACK_BACKEND", "numpy")
        to.reload_config()
        with pytest.warns(to.BackendFallbackWarning, match="does not support op 'relu'"):
            y = to.relu(np.array([-1.0, 2.0], np.float32))
        assert list(y) == [0, 2]
        info = to.get_backend_info()["ops"]["relu"]
        assert "no 'relu'" in info["note"] and info["substituted"]["only_silu"]["count"] == 1
    finally:
        reg.unregister_impl("silu", "vendor.only_silu", "facade")


@pytest.mark.parametrize("how", ["keyword", "use_backend", "set_backend", "env", "config"])
def test_forced_backend_that_declines_the_dtype_is_an_error(how, monkeypatch, isolated_config, unforced):
    """float64 is not a dtype cpp computes: forcing cpp must not measure the NumPy reference
    without saying so. The same error for every way of forcing."""
    if not to.get_manager().availability(to.get_registry().get_impl("silu", "default.cpp", "facade"))[0]:
        pytest.skip("cpp unavailable")
    x = np.ones((2, 8))
    call = {"keyword": lambda: to.silu(x, backend="cpp")}.get(how, lambda: to.silu(x))
    if how == "use_backend":
        ctx = to.use_backend("cpp")
    else:
        import contextlib
        ctx = contextlib.nullcontext()
    if how == "set_backend":
        to.set_backend("cpp")
    elif how == "env":
        monkeypatch.setenv("TENSOR_OPS_BACKEND", "cpp")
        to.reload_config()
    elif how == "config":
        isolated_config.write_text('{"schema_version": 1, "force": "cpp"}')
        to.reload_config()
    try:
        with ctx, pytest.raises(to.BackendUnsupportedError) as err:
            call()
        msg = str(err.value)
        assert "'silu'" in msg and "'cpp' was forced" in msg and "float64" in msg
        assert "dtypes ['float16', 'bfloat16', 'float32']" in msg and "TENSOR_OPS_FALLBACK_BACKEND" in msg
    finally:
        to.set_backend(None)


def test_fallback_setting_in_backend_json(isolated_config, unforced):
    isolated_config.write_text('{"schema_version": 1, "force": "cpp", "fallback": ["numpy"]}')
    to.reload_config()
    if not to.get_backend_info()["backends"]["cpp"]["available"]:
        pytest.skip("cpp unavailable")
    with pytest.warns(to.BackendFallbackWarning, match="float64"):
        y = to.silu(np.zeros((2, 8)))
    assert y.dtype == np.float64
    assert to.get_backend_info()["settings"]["fallback"]["source"] == "backend.json 'fallback'"


def _failing(op="relu", exc=None):
    exc = exc if exc is not None else RuntimeError("driver exploded")

    def fn(x, out):
        raise exc
    return _impl(op, "vendor.broken", priority=999, fn=fn)


def test_fallback_warns_once_and_counts(unforced):
    reg = to.get_registry()
    reg.register_impl(_failing())
    try:
        with pytest.warns(to.BackendFallbackWarning, match="driver exploded"):
            y = to.relu(X, backend="broken,numpy")
        assert y[0, 0] == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # second fallback: counted, not warned again
            to.relu(X, backend="broken,numpy")
        op = to.get_backend_info()["ops"]["relu"]
        assert op["fallbacks"] >= 2 and op["failures"]["vendor.broken"]["count"] >= 2
    finally:
        reg.unregister_impl("relu", "vendor.broken", "facade")


def test_strict_turns_fallback_into_error(monkeypatch, unforced):
    reg = to.get_registry()
    reg.register_impl(_failing())
    try:
        monkeypatch.setenv("TE_FL_STRICT", "1")      # TE-FL's documented meaning: 1 = strict
        to.reload_config()
        with pytest.raises(to.BackendError, match="strict"):
            to.relu(X, backend="broken,numpy")
    finally:
        reg.unregister_impl("relu", "vendor.broken", "facade")


def test_value_errors_from_facade_impls_are_backend_failures(unforced):
    """Validation happened before dispatch (the op's spec): a ValueError from inside an impl
    is that impl's failure, so the next backend serves (with one warning)."""
    reg = to.get_registry()
    reg.register_impl(_failing(exc=ValueError("bad value from impl")))
    try:
        with warnings.catch_warnings():          # warned once per (op, impl) and process
            warnings.simplefilter("ignore")
            y = to.relu(X, backend="broken,numpy")
        np.testing.assert_array_equal(y, np.maximum(X, 0))
        assert "bad value from impl" in to.get_backend_info()["ops"]["relu"]["failures"]["vendor.broken"]["last_error"]
    finally:
        reg.unregister_impl("relu", "vendor.broken", "facade")


def test_wrong_shaped_output_is_a_backend_failure(unforced):
    reg = to.get_registry()
    reg.register_impl(_impl("relu", "vendor.liar", priority=999, fn=lambda x, out: np.zeros(3, x.dtype)))
    try:
        with pytest.warns(to.BackendFallbackWarning, match="expected shape"):
            y = to.relu(np.array([[-1.0, 2.0]], np.float32), backend="liar,numpy")
        assert y.tolist() == [[0.0, 2.0]]
    finally:
        reg.unregister_impl("relu", "vendor.liar", "facade")


def test_supports_is_checked_per_call(unforced):
    seen = []
    reg = to.get_registry()
    reg.register_impl(_impl("relu", "vendor.f16only", priority=999,
                            supports=lambda x, out: seen.append(x.dtype) or x.dtype == np.float16))
    try:
        assert to.relu(np.ones(2, np.float16), backend="vendor")[0] == len("vendor.f16only")
        assert to.relu(np.ones(2, np.float32), backend="vendor")[0] == 1
        assert len(seen) == 2
    finally:
        reg.unregister_impl("relu", "vendor.f16only", "facade")


def test_choice_logged_once_and_on_change(caplog, vendors, unforced):
    import logging
    caplog.set_level(logging.INFO, logger="tensor_ops")
    for _ in range(3):
        to.relu(X, backend="vendor:acme")
    to.relu(X, backend="vendor:zeta")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Op 'relu'")]
    assert lines == ["Op 'relu' using 'vendor.acme' (kind=vendor, vendor=acme)",
                     "Op 'relu' using 'vendor.Zeta' (kind=vendor, vendor=Zeta)"]


def test_resolution_is_cached_per_policy():
    m = to.get_manager()
    a = m.resolve("relu", None, "facade")
    assert m.resolve("relu", None, "facade") is a
    to.reload_config()
    assert m.resolve("relu", None, "facade") is not a


def test_thread_safe_resolution_under_concurrent_calls_and_reloads():
    errors = []
    x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    want = np.maximum(x, 0)

    def worker():
        try:
            for i in range(300):
                y = to.relu(x) if i % 2 else to.relu(x, backend="numpy")
                assert np.array_equal(y, want)
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    def reloader():
        for _ in range(30):
            to.reload_config()

    threads = [threading.Thread(target=worker) for _ in range(8)] + [threading.Thread(target=reloader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_settings_te_aliases():
    env = {"TENSOR_OPS_BACKEND": "numpy", "TE_FL_PER_OP": "rms_norm=vendor:acme|flagos;softmax=reference",
           "TE_FL_STRICT": "1", "TE_FL_SKIP_CUDA": "1", "TEFL_LOG_LEVEL": "debug",
           "TE_FALLBACK_BACKEND": "numpy", "TENSOR_OPS_CONFIG": "/nonexistent/backend.json"}
    s = build_settings(env)
    assert s.force == "numpy" and s.force_source == "env TENSOR_OPS_BACKEND"
    assert s.env_per_op == {"rms_norm": ["vendor:acme", "default"], "softmax": ["reference"]}
    assert s.strict is True and s.disabled["cuda"] == "env TE_FL_SKIP_CUDA"
    assert s.log_level == "DEBUG" and s.fallback == ["numpy"]
    assert build_settings({"TE_FL_STRICT": "0", "TENSOR_OPS_CONFIG": "/nonexistent/x.json"}).strict is False
    assert build_settings({"TE_FL_PREFER": "vendor", "TENSOR_OPS_CONFIG": "/x/y.json"}).env_priority == ["vendor"]
    assert build_settings({"TE_FL_DEBUG": "1", "TENSOR_OPS_CONFIG": "/x/y.json"}).log_level == "DEBUG"


@pytest.mark.parametrize("var,value,msg", [
    ("TENSOR_OPS_STRICT", "maybe", "TENSOR_OPS_STRICT='maybe'"),
    ("TENSOR_OPS_PRIORITY", "cpp,gpu", "unknown backend 'gpu'"),
    ("TENSOR_OPS_PER_OP", "rmsnorm=cpp", "unknown op 'rmsnorm'"),
    ("TE_FL_PREFER", "fast", "TE_FL_PREFER"),
    ("TENSOR_OPS_LOG_LEVEL", "loud", "TENSOR_OPS_LOG_LEVEL"),
])
def test_bad_env_values_are_named(var, value, msg):
    env = {var: value, "TENSOR_OPS_CONFIG": "/nonexistent/backend.json"}
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace("[", r"\[")):
        build_settings(env)


def test_tuning_table_followed_and_reported(isolated_config, unforced):
    import json
    from tensor_ops._policy import machine_fingerprint
    isolated_config.write_text(json.dumps({"schema_version": 1, "tuning": {
        "fingerprint": machine_fingerprint(),
        "ops": {"relu": {"float32": [{"max_bytes": 1024, "order": ["numpy"]},
                                     {"max_bytes": None, "order": ["vendor", "numpy"]}]}}}}))
    to.reload_config()
    reg = to.get_registry()
    reg.register_impl(_impl("relu", "vendor.big", fn=lambda x, out: np.full_like(x, 7)))
    try:
        assert to.relu(np.ones(4, np.float32))[0] == 1          # 16 bytes → numpy
        assert to.relu(np.ones(4096, np.float32))[0] == 7       # 16 KiB → vendor
        assert "in use" in to.get_backend_info()["tuning"]["status"]
    finally:
        reg.unregister_impl("relu", "vendor.big", "facade")


def test_stale_tuning_fingerprint_is_ignored_with_warning(isolated_config):
    isolated_config.write_text('{"schema_version": 1, "tuning": {"fingerprint": {"cpu": "Other CPU"}, '
                               '"ops": {"relu": {"float32": [{"max_bytes": null, "order": ["numpy"]}]}}}}')
    with pytest.warns(RuntimeWarning, match="fingerprint differs"):
        to.reload_config()
    assert to.get_backend_info()["tuning"]["status"].startswith("ignored")


def test_template_backend_registers_and_serves():
    from tensor_ops.backends import _template
    reg = OpRegistry()
    _template.register(reg)
    m = OpManager(reg)
    x = np.array([[3.0, 4.0]], np.float32)
    assert np.allclose(m.call("rms_norm", x, np.ones(2, np.float32), 0.0, None), x / np.sqrt(12.5))
    assert _template.availability() == (True, "")


def test_device_backend_takes_host_arrays_only_when_named(isolated_config, unforced):
    reg = to.get_registry()
    reg.register_impl(_impl("relu", "vendor.gpu", priority=999, host_arrays="when-named",
                            fn=lambda x, out: np.full_like(x, 9)))
    try:
        assert to.relu(X)[0, 0] == 1                          # default order: host data stays on the host
        assert to.relu(X, backend="gpu")[0, 0] == 9           # named: copies are what the user asked for
        isolated_config.write_text('{"schema_version": 1, "per_op": {"relu": ["gpu", "numpy"]}}')
        to.reload_config()
        assert to.relu(X)[0, 0] == 9
        assert to.relu(X, backend="vendor")[0, 0] == 1        # a kind token does not name it
    finally:
        reg.unregister_impl("relu", "vendor.gpu", "facade")


def test_tuning_exclusions_are_honoured(isolated_config, unforced):
    import json
    from tensor_ops._policy import machine_fingerprint
    reg = to.get_registry()
    reg.register_impl(_impl("relu", "vendor.wrong", priority=999, fn=lambda x, out: np.full_like(x, 5)))
    try:
        assert to.relu(X, backend="vendor")[0, 0] == 5
        isolated_config.write_text(json.dumps({"schema_version": 1, "tuning": {
            "fingerprint": machine_fingerprint(), "ops": {},
            "excluded": {"relu": {"vendor.wrong": "wrong numerics vs fp64 reference"}}}}))
        to.reload_config()
        assert to.relu(X, backend="vendor,numpy")[0, 0] == 1
        why = to.get_manager().resolve("relu", "vendor,numpy", "facade").excluded["vendor.wrong"]
        assert "wrong numerics" in why
    finally:
        reg.unregister_impl("relu", "vendor.wrong", "facade")


def _gpu_tuned_config(cfg, opencl_devices):
    import json
    from tensor_ops._policy import machine_fingerprint
    fp = dict(machine_fingerprint())
    if opencl_devices is not None:
        fp["opencl_devices"] = opencl_devices
    cfg.write_text(json.dumps({"schema_version": 1, "tuning": {
        "fingerprint": fp, "ops": {"silu": {"float32": [{"max_bytes": None, "order": ["opencl", "numpy"]}]}}}}))


@pytest.mark.parametrize("recorded,probe,followed", [
    (["GPU A [Vendor] driver 1"], ["GPU A [Vendor] driver 1"], True),
    (["GPU A [Vendor] driver 1"], ["GPU B [Vendor] driver 1"], False),      # another device
    (["GPU A [Vendor] driver 1"], ["GPU A [Vendor] driver 2"], False),      # another driver
    (["GPU A [Vendor] driver 1"], None, True),     # backend unavailable: its tokens match nothing anyway
    (None, ["GPU B [Vendor] driver 1"], True),     # table from before GPU ids were recorded
])
def test_tuned_order_naming_a_gpu_checks_its_devices(tmp_path, recorded, probe, followed):
    """The cheap fingerprint (CPU, ISA, version) is checked at load; the GPU ids only when a
    tuned order names that backend, against what it sees now."""
    cfg = tmp_path / "backend.json"
    _gpu_tuned_config(cfg, recorded)
    s = build_settings({"TENSOR_OPS_CONFIG": str(cfg)})
    asked = []
    s.gpu_probe = lambda name: asked.append(name) or probe
    tokens, source, _ = s.order_for("silu", "float32", 1 << 20)
    assert (tokens == ["opencl", "numpy"]) is followed, (tokens, source)
    assert asked == ([] if recorded is None else ["opencl"])
    assert bool(s.gpu_mismatch_notes.get("opencl")) is (not followed)
    if not followed:
        note = s.gpu_mismatch_notes["opencl"]
        assert "when tuned" in note and "detect_and_benchmark" in note
    s.order_for("silu", "float32", 1 << 10)
    assert asked.count("opencl") <= 1                                      # probed once per settings


def test_tuned_gpu_order_against_the_real_opencl_device(isolated_config, unforced):
    from tensor_ops.backends import opencl
    ok, why = opencl.availability()
    if not ok:
        pytest.skip(f"opencl unavailable: {why}")
    _gpu_tuned_config(isolated_config, opencl.device_ids())
    to.reload_config()
    assert to.get_backend("silu", "float32", 1 << 20) == "opencl"
    _gpu_tuned_config(isolated_config, ["Some Other GPU [Elsewhere] driver 9"])
    to.reload_config()
    assert to.get_backend("silu", "float32", 1 << 20) != "opencl"
    assert "Some Other GPU" in to.get_backend_info()["tuning"]["gpu_mismatch"]["opencl"]
