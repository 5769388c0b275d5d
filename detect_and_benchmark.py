"""One-shot: detect → build → validate → benchmark → tune → write backend.json → report.

    python detect_and_benchmark.py              # everything (<= 5 minutes on a 2-core VM)
    python detect_and_benchmark.py --quick      # 3 sizes, short timings (CI; < 1 minute)
    python detect_and_benchmark.py --full       # every size up to 4x the cache, every row at every size
    python detect_and_benchmark.py --no-build --no-write --ops rms_norm,softmax --backends cpp

1. Detect: ``tensor_ops/_build/capabilities.py`` (loaded by path, like setup.py), shown as a table.
2. Build: ``setup.py build_ext --inplace``, ``build_cuda`` (where nvcc and a CUDA device exist),
   ``build_opencl`` (where an OpenCL device exists), each as a subprocess, reported ok /
   up to date / skipped (why) / failed (why + the tail of its log, the full log under
   bench_results/). A step whose output is newer than its sources is not re-run (the C++
   extension: ``tensor_ops/_cpp*.so`` vs ``cpp_ext/``, ``setup.py``, ``_build/cpp_build.py``;
   the CUDA fatbin: the source hash in its ``.json`` record); ``--rebuild`` runs them anyway.
   The run goes on with what works; ``--strict`` stops at the first failure.
3-6. Validate every available impl against an fp64 reference (failing ones are excluded from the
   tuned orders, with the reason), benchmark against the ceiling (a streaming-store copy of each
   op's own pages, timed in the same interleaved rounds), tune, write ``tuning`` into
   backend.json (user settings kept), report: table, PNG + JSON, who serves each op now.
   The size ladder stops once the leading impl's bandwidth has converged past the last-level
   cache (arrays <= 256 MiB); NumPy and torch rows are sampled at 3 sizes. Progress with an
   ETA: a bar on a terminal, ``[3/20] softmax float32 … eta 1m20s`` lines otherwise.
   (``tensor_ops/_bench_cli.py``; the same engine is ``python -m tensor_ops bench``.)

Exit code: 0 when everything built and validated, 1 when something failed (a build, a
backend's numerics, the write), 2 for bad options.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def _load_build_module(name: str):
    """tensor_ops/_build/<name>.py without importing tensor_ops (it may be rebuilt below)."""
    path = ROOT / "tensor_ops" / "_build" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_tensor_ops_build_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _load_cli():
    """tensor_ops._bench_cli, imported only after the builds so the fresh extension loads."""
    sys.path.insert(0, str(ROOT))
    from tensor_ops import _bench_cli
    return _bench_cli


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="detect_and_benchmark.py", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-build", action="store_true", help="skip the build step")
    p.add_argument("--no-write", action="store_true", help="do not write the tuning table into backend.json")
    p.add_argument("--strict", action="store_true", help="any failure (build, numerics) is fatal")
    p.add_argument("--build-timeout", type=float, default=480, help="seconds per build step (default 480)")
    p.add_argument("--rebuild", action="store_true", help="run every build step even when its output is up to date")
    sys.path.insert(0, str(ROOT))
    from tensor_ops._bench_cli import add_arguments   # argparse glue only; no native code loads
    add_arguments(p, write_flag=False)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- build
def build_plan(detected: dict) -> list[tuple[str, list, str]]:
    """(name, command, skip reason or '') for each build step."""
    py = [sys.executable, "setup.py"]
    comp = detected.get("compilers", {})
    have_cxx = any((comp.get(c) or {}).get("path") for c in ("g++", "clang++")) or bool(os.environ.get("CXX"))
    nvcc = (comp.get("nvcc") or {}).get("path")
    cu, cl = detected.get("cuda", {}), detected.get("opencl", {})
    no_gpu = "" if cu.get("available") else (f"no CUDA device visible ({cu.get('reason')}): nothing here would use "
                                             "the fatbin (`python setup.py build_cuda` builds it anyway)")
    no_cl = "" if cl.get("available") else f"no usable OpenCL device: {cl.get('reason')}"
    return [
        ("cpp", py + ["build_ext", "--inplace"], "" if have_cxx else "no C++ compiler (g++/clang++) on PATH"),
        ("cuda", py + ["build_cuda"], "nvcc not found on PATH" if not nvcc else no_gpu),
        ("opencl", py + ["build_opencl"], no_cl),
    ]


def up_to_date(name: str) -> str:
    """Why build step ``name`` need not run (its output is newer than its sources), or ''."""
    if name == "cpp":
        switches = [k for k in ("TENSOR_OPS_CPP_SANITIZE", "TENSOR_OPS_CPP_VARIANTS", "TENSOR_OPS_SKIP_CPP")
                    if os.environ.get(k)]
        so = ROOT / "tensor_ops" / ("_cpp" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
        if switches or not so.is_file():
            return ""
        inputs = [*(ROOT / "cpp_ext").glob("*.cpp"), *(ROOT / "cpp_ext").glob("*.h"), ROOT / "setup.py",
                  ROOT / "tensor_ops" / "_build" / "cpp_build.py"]
        newest = max((p.stat().st_mtime for p in inputs if p.is_file()), default=0)
        if so.stat().st_mtime >= newest:
            return f"tensor_ops/{so.name} is newer than cpp_ext/, setup.py and _build/cpp_build.py"
    if name == "cuda":
        side = ROOT / "tensor_ops" / "_cuda_kernels.fatbin.json"
        try:
            rec = json.loads(side.read_text())
            if (ROOT / "tensor_ops" / "_cuda_kernels.fatbin").is_file() and \
                    rec.get("sources_sha256") == _load_build_module("cuda_build").sources_digest():
                return f"tensor_ops/_cuda_kernels.fatbin matches the sources ({side.name})"
        except (OSError, ValueError, RuntimeError):
            pass
    return ""


def run_build(name: str, cmd: list, skip: str, log_dir: Path, timeout: float, console) -> dict:
    rec = {"name": name, "command": " ".join(cmd[1:]), "status": "skipped", "reason": skip, "seconds": 0.0}
    if skip:
        return rec
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"build_{name}.log"
    t0 = time.perf_counter()
    if console is None or not console.is_terminal:
        _say(console, f"building {name}: python {rec['command']} …")
    status = console.status(f"building {name}: python {rec['command']}") if console is not None else None
    if status is not None:
        status.start()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        text, rc = text + f"\n(timed out after {timeout:.0f}s)", -1
    except OSError as exc:
        text, rc = str(exc), -1
    finally:
        if status is not None:
            status.stop()
    log.write_text(text, encoding="utf-8")
    rec.update(seconds=round(time.perf_counter() - t0, 1), log=str(log))
    if rc == 0:
        rec.update(status="ok", reason="")
    else:
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-12:]
        why = next((ln for ln in reversed(tail) if "error" in ln.lower()), tail[-1] if tail else f"exit code {rc}")
        rec.update(status="failed", reason=why.strip()[:300], tail=tail, returncode=rc)
    return rec


def _say(console, text=""):
    if console is not None:
        console.print(text, highlight=False, markup=False)
    else:
        print(text)


def main(argv=None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    cli = _load_cli()
    err = cli.check_args(args)
    if err:
        print(err, file=sys.stderr)
        return 2
    console = cli._console()
    out_dir = Path(args.json_path).parent if args.json_path else cli.DEFAULT_DIR

    _say(console, "== 1. detect")
    capabilities = _load_build_module("capabilities")
    t0 = time.perf_counter()
    detected = capabilities.detect_all()
    _say(console, capabilities.format_table(detected))
    t_detect = time.perf_counter() - t0

    _say(console, "\n== 2. build")
    builds = []
    if args.no_build:
        _say(console, "skipped (--no-build)")
    else:
        for name, cmd, skip in build_plan(detected):
            fresh = "" if (skip or args.rebuild) else up_to_date(name)
            if fresh:
                builds.append({"name": name, "command": " ".join(cmd[1:]), "status": "up to date", "reason": fresh,
                               "seconds": 0.0})
                _say(console, f"{name:<7} {'current':<8} {0.0:6.1f}s  up to date: {fresh} (--rebuild to build anyway)")
                continue
            rec = run_build(name, cmd, skip, out_dir, args.build_timeout, console)
            builds.append(rec)
            line = f"{name:<7} {rec['status']:<8} {rec['seconds']:6.1f}s  {rec['reason'] or rec['command']}"
            _say(console, line)
            if rec["status"] == "failed":
                for ln in rec.get("tail", [])[-6:]:
                    _say(console, f"          | {ln}")
                _say(console, f"          full log: {rec['log']}")
                if args.strict:
                    _say(console, "--strict: stopping at the first failure")
                    return 1

    _say(console, "\n== 3-6. validate, benchmark, tune, report")
    import tensor_ops as to
    try:
        to.reload_config()
    except ValueError as exc:
        _say(console, f"configuration error: {exc}")
        return 1
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    source = f"detect_and_benchmark.py {argv_text}".strip()
    payload = cli.pipeline(args, console, detected, write=not args.no_write, source=source, strict=args.strict)
    if payload.get("aborted"):
        payload["build"] = builds
        cli.save_json(payload, args)
        return 1
    failed_numerics = any(v["failures"] for v in payload["validation"].values())
    payload["build"] = builds
    payload["timing_s"]["detect"] = round(t_detect, 1)
    payload["timing_s"]["build"] = round(sum(b["seconds"] for b in builds), 1)
    payload["timing_s"]["all"] = round(time.perf_counter() - t_start, 1)
    cli.save_json(payload, args)

    failed_builds = [b for b in builds if b["status"] == "failed"]
    summary = ", ".join(f"{b['name']} {b['status']}" for b in builds) or "no build"
    _say(console, f"\nbuild: {summary}; numerics: {'FAILURES (see EXCLUDED above)' if failed_numerics else 'all ok'}; "
                  f"total {payload['timing_s']['all']:.0f}s")
    largest = payload.get("ceiling_gbps_largest")
    at_largest = f", {largest:.1f} GB/s at the largest size" if largest else ""
    _say(console, f"ceiling: {payload.get('ceiling')}{at_largest}")
    if payload.get("busy_note"):
        _say(console, "WARNING: " + payload["busy_note"])
    return 1 if (failed_builds or failed_numerics or "error" in payload.get("written", {})) else 0


if __name__ == "__main__":
    raise SystemExit(main())
