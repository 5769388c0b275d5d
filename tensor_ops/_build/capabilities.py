"""Hardware/toolchain detection for ``setup.py test_capabilities`` and detect_and_benchmark.

Loaded by file path from setup.py: no tensor_ops import. Each probe is independent and
reports *why* something is missing rather than raising.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Command

try:
    from . import jsonfile
except ImportError:  # loaded by file path (setup.py, detect_and_benchmark.py): no package here
    _spec = importlib.util.spec_from_file_location("_tensor_ops_build_jsonfile",
                                                   Path(__file__).with_name("jsonfile.py"))
    assert _spec is not None and _spec.loader is not None, "tensor_ops/_build/jsonfile.py is missing"
    jsonfile = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(jsonfile)

ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl")


def _run(cmd, timeout=60):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)


def detect_cpu() -> dict:
    """CPU model and ISA extensions the OS has enabled (Linux hides flags it can't save)."""
    info: dict = {"machine": platform.machine(), "model": platform.processor() or "", "flags": [],
            "cores": os.cpu_count(), "source": "none"}
    try:
        import cpuinfo  # py-cpuinfo: portable, also reads CPUID where /proc is absent
        ci = cpuinfo.get_cpu_info()
        info["model"] = ci.get("brand_raw", info["model"])
        info["flags"] = sorted(set(ci.get("flags", [])))
        info["source"] = "py-cpuinfo"
    except Exception:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        info["model"] = line.split(":", 1)[1].strip()
                    elif line.startswith("flags"):
                        info["flags"] = sorted(set(line.split(":", 1)[1].split()))
                        break
            info["source"] = "/proc/cpuinfo"
        except OSError:
            pass
    flags = set(info["flags"])
    info["isa"] = {f: (f in flags) for f in ISA_FLAGS}
    info["flags"] = [f for f in info["flags"] if f in ISA_FLAGS]
    return info


def detect_openmp(cxx: str = "g++") -> dict:
    exe = shutil.which(jsonfile.env.get("CXX") or cxx)
    if not exe:
        return {"available": False, "reason": f"no C++ compiler ({cxx}) on PATH"}
    src = "#include <omp.h>\nint main(){int n=0;\n#pragma omp parallel reduction(+:n)\nn+=1;\nreturn n>0?0:1;}\n"
    with tempfile.TemporaryDirectory() as d:
        cpp = Path(d) / "t.cpp"
        cpp.write_text(src)
        rc, out = _run([exe, "-fopenmp", str(cpp), "-o", str(Path(d) / "t")])
        if rc != 0:
            return {"available": False, "reason": f"{exe} -fopenmp failed: {out[-300:]}"}
        rc, out = _run([str(Path(d) / "t")])
    return {"available": rc == 0, "flag": "-fopenmp", "reason": None if rc == 0 else out}


def detect_compilers() -> dict:
    out: dict = {}
    for name in ("g++", "clang++", "nvcc"):
        exe = shutil.which(name)
        if exe is None:
            out[name] = {"path": None, "version": None}
            continue
        rc, text = _run([exe, "--version"])
        ver = next((ln for ln in text.splitlines() if "release" in ln or "g++" in ln or "version" in ln),
                   text.splitlines()[0] if text else "")
        out[name] = {"path": exe, "version": ver.strip()}
    return out


def detect_cuda() -> dict:
    """CUDA devices via CuPy (if installed), in a subprocess so a broken driver can't hang us."""
    code = ("import json,sys\n"
            "try:\n import cupy\nexcept Exception as e:\n print(json.dumps({'available':False,'reason':'CuPy not installed ('+type(e).__name__+')'}));sys.exit()\n"
            "try:\n n=cupy.cuda.runtime.getDeviceCount()\nexcept Exception as e:\n print(json.dumps({'available':False,'reason':'no CUDA device: '+str(e)}));sys.exit()\n"
            "devs=[]\n"
            "for i in range(n):\n p=cupy.cuda.runtime.getDeviceProperties(i); devs.append({'name':p['name'].decode(),'cc':f\"{p['major']}.{p['minor']}\",'memory_gb':round(p['totalGlobalMem']/2**30,1)})\n"
            "print(json.dumps({'available':n>0,'devices':devs,'reason':None if n else 'no CUDA device'}))\n")
    rc, out = _run([sys.executable, "-c", code], timeout=120)
    import json
    try:
        return json.loads(out.splitlines()[-1])
    except Exception:
        return {"available": False, "reason": f"probe failed: {out[-300:]}"}


# A device whose OpenCL compiler cannot build a one-line kernel is listed but not available:
# PoCL 3.0's LLVM 14 names an AMD Zen 5 CPU (family 26) "generic" and then rejects that name
# ("unknown target CPU 'generic'") for every program, so setup.py build_opencl could only fail.
# The probe tells that apart from a failure in our kernels, which still fails the build.
_OPENCL_PROBE = """\
import json, sys
try:
    import pyopencl as cl
except Exception as e:
    print(json.dumps({'available': False, 'reason': 'pyopencl not installed (' + type(e).__name__ + ')'})); sys.exit()
try:
    plats = cl.get_platforms()
except Exception as e:
    print(json.dumps({'available': False, 'reason': 'no OpenCL platform: ' + str(e)})); sys.exit()
def compile_error(d):
    try:
        cl.Program(cl.Context([d]), '__kernel void k(__global float* a) { a[0] = 1.0f; }').build()
        return None
    except Exception as e:
        lines = [ln.strip() for ln in str(e).splitlines() if 'error' in ln.lower()]
        return (lines[-1] if lines else str(e).strip().splitlines()[-1])[:200]
devs = []
for p in plats:
    for d in p.get_devices():
        devs.append({'platform': p.name, 'device': d.name, 'type': cl.device_type.to_string(d.type),
                     'fp16': 'cl_khr_fp16' in d.extensions, 'driver': d.driver_version,
                     'compile_error': compile_error(d)})
ok = [d for d in devs if d['compile_error'] is None]
reason = None
if not devs:
    reason = 'no OpenCL device'
elif not ok:
    reason = '; '.join(f"{d['device']} [{d['platform']}]: its OpenCL compiler cannot build a one-line kernel "
                       f"({d['compile_error']})" for d in devs)
print(json.dumps({'available': bool(ok), 'devices': devs, 'reason': reason}))
"""


def detect_opencl() -> dict:
    """OpenCL platforms and devices, each with whether its compiler builds a trivial kernel;
    available when one does (in a subprocess: a broken ICD cannot take this process down)."""
    rc, out = _run([sys.executable, "-c", _OPENCL_PROBE], timeout=120)
    import json
    try:
        return json.loads(out.splitlines()[-1])
    except Exception:
        return {"available": False, "reason": f"probe failed: {out[-300:]}"}


def detect_all() -> dict:
    return {"cpu": detect_cpu(), "openmp": detect_openmp(), "compilers": detect_compilers(),
            "cuda": detect_cuda(), "opencl": detect_opencl(), "python": sys.version.split()[0]}


def format_table(d: dict) -> str:
    rows = [("CPU", d["cpu"]["model"]),
            ("ISA", " ".join(f for f, ok in d["cpu"]["isa"].items() if ok) or "(baseline only)"),
            ("OpenMP", "yes (-fopenmp)" if d["openmp"]["available"] else f"no: {d['openmp']['reason']}")]
    for name, c in d["compilers"].items():
        rows.append((name, c["version"] or "not found"))
    cu = d["cuda"]
    rows.append(("CUDA devices", ", ".join(f"{x['name']} (sm_{x['cc'].replace('.', '')})" for x in cu.get("devices", []))
                 if cu.get("available") else f"none: {cu.get('reason')}"))
    cl = d["opencl"]
    rows.append(("OpenCL devices", ", ".join(f"{x['device']} [{x['platform']}]" for x in cl.get("devices", [])
                                             if not x.get("compile_error"))
                 if cl.get("available") else f"none usable: {cl.get('reason')}"))
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


class TestCapabilities(Command):
    description = "detect CPU ISA, OpenMP, compilers, CUDA and OpenCL devices; record under 'detected'"
    user_options = [("no-write", None, "print only; do not record in backend.json")]
    boolean_options = ["no-write"]

    def initialize_options(self):
        self.no_write = False

    def finalize_options(self):
        pass

    def run(self):
        d = detect_all()
        print(format_table(d))
        if not self.no_write:
            try:
                path = None
                for key, val in d.items():
                    path = jsonfile.update_section("detected", key, val)
                print(f"recorded under 'detected' in {path}")
            except (OSError, ValueError) as exc:
                print(f"test_capabilities: could not record the result: {exc}", file=sys.stderr)
                raise SystemExit(1)
