"""``python setup.py build_opencl``: build every ``opencl_ext/`` program for every OpenCL
device, store the binaries in the backend's cache and record the result in backend.json
``built.opencl``.

Exit status: 0 when every program built (or was already cached and valid) on every device;
non-zero with the build log when a kernel fails to compile; non-zero with the reason when
pyopencl or an OpenCL platform/device is missing. setup.py loads this file by path, so the
``tensor_ops`` package is imported only inside ``run()`` (to reuse the runtime's
program-building and cache code, so build and runtime can never disagree on cache keys).
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from setuptools import Command

try:
    from . import jsonfile
except ImportError:  # loaded by file path (setup.py): the package is not imported here
    _spec = importlib.util.spec_from_file_location("_tensor_ops_build_jsonfile",
                                                   Path(__file__).with_name("jsonfile.py"))
    assert _spec is not None and _spec.loader is not None, "tensor_ops/_build/jsonfile.py is missing"
    jsonfile = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(jsonfile)

ROOT = jsonfile.PROJECT_ROOT


def _record(value: dict) -> Path:
    return jsonfile.update_section("built", "opencl", value)


def build(force: bool = False, log=print) -> int:
    """Build and cache all programs; returns the exit status (0 = success)."""
    try:
        import pyopencl as cl
    except Exception as exc:
        log(f"build_opencl: pyopencl is not importable ({exc}); install it with "
            "pip install 'tensor_ops[opencl]' (pyopencl + pocl-binary-distribution). "
            "Nothing was built.", file=sys.stderr)
        return 1
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tensor_ops.backends import opencl as ocl

    try:
        devices = ocl.all_devices()
    except cl.Error as exc:
        devices, why = [], str(exc)
    else:
        why = "no device on any platform"
    if not devices:
        log(f"build_opencl: no OpenCL platform/device found ({why}); install an OpenCL ICD, "
            "e.g. pip install pocl-binary-distribution for a CPU device. Nothing was built.",
            file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    try:
        results = ocl.build_all(force=force)
    except RuntimeError as exc:   # BackendError: carries the compiler's build log
        log(f"build_opencl: FAILED\n{exc}", file=sys.stderr)
        _record({"ok": False, "error": str(exc)[:2000],
                 "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        return 1
    for r in results:
        progs = ", ".join(f"{k} {v['status']} {v['seconds']:.2f}s" for k, v in r["programs"].items())
        log(f"build_opencl: [{r['index']}] {r['device']} ({r['platform']}, driver {r['driver']}, "
            f"local size {r['local_size']}): {progs}")
    value = {"ok": True, "devices": results, "cache_dir": str(ocl.cache_dir() or "off"),
             "source_hash": ocl.source_hash()[:16],
             "seconds": round(time.perf_counter() - t0, 3),
             "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = _record(value)
    where = ("no binary cached (TENSOR_OPS_OPENCL_CACHE=off)" if value["cache_dir"] == "off"
             else f"binaries cached in {value['cache_dir']}")
    log(f"build_opencl: {len(results)} device(s), {where}; "
        f"recorded in {path} (built.opencl)")
    return 0


class BuildOpenCL(Command):
    description = "build and cache the opencl_ext/ programs for every OpenCL device"
    user_options = [("force", "f", "rebuild from source even when a valid cached binary exists")]
    boolean_options = ["force"]

    def initialize_options(self):
        self.force = False

    def finalize_options(self):
        self.force = bool(self.force)

    def run(self):
        rc = build(force=self.force)
        if rc:
            raise SystemExit(rc)
