"""``setup.py build_cuda``: compile ``cuda_ext/*.cu`` into one fatbin with nvcc.

Loaded by file path from setup.py (and runnable as a script), so it must not import the
``tensor_ops`` package. The fatbin holds SASS for every ``sm_XX >= 75`` the installed nvcc
lists (``nvcc --list-gpu-code``) plus PTX of the newest ``compute_XX`` for forward
compatibility. The result is recorded in backend.json ``built.cuda``.

Script use (what CI runs)::

    python tensor_ops/_build/cuda_build.py build [--archs 75,90] [--check]
    python tensor_ops/_build/cuda_build.py check [--fatbin PATH]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from setuptools import Command

try:
    from . import jsonfile
except ImportError:  # loaded by file path (setup.py) or run as a script: no package here
    _spec = importlib.util.spec_from_file_location("_tensor_ops_build_jsonfile",
                                                   Path(__file__).with_name("jsonfile.py"))
    assert _spec is not None and _spec.loader is not None, "tensor_ops/_build/jsonfile.py is missing"
    jsonfile = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(jsonfile)
_env = jsonfile.env

PROJECT_ROOT = jsonfile.PROJECT_ROOT
SOURCE_DIR = PROJECT_ROOT / "cuda_ext"
HEADER = "common.cuh"
DEFAULT_FATBIN = PROJECT_ROOT / "tensor_ops" / "_cuda_kernels.fatbin"
MIN_SM = 75

# One extern "C" kernel per (op, dtype), named to_<op>_<dtype> (SYMBOL_PREFIX: the project's one
# kernel symbol prefix, shared with opencl_ext/); tensor_ops/backends/cuda/ launches these names.
SYMBOL_PREFIX = "to_"
KERNEL_OPS = ("rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm", "softmax", "silu", "relu", "gelu", "gelu_tanh",
              "swiglu", "geglu", "geglu_tanh", "rope")
DTYPE_SUFFIXES = ("f32", "f16", "bf16")


class CudaBuildError(RuntimeError):
    """nvcc/cuobjdump missing or failing; the message says what to do."""


def kernel_symbols() -> list[str]:
    return [f"{SYMBOL_PREFIX}{op}_{s}" for op in KERNEL_OPS for s in DTYPE_SUFFIXES]


def source_files(src_dir: Path = SOURCE_DIR) -> list[Path]:
    files = sorted(Path(src_dir).glob("*.cu"))
    if not files:
        raise CudaBuildError(f"no .cu sources found in {src_dir}")
    return files


def sources_digest(src_dir: Path = SOURCE_DIR) -> str:
    h = hashlib.sha256()
    for p in [Path(src_dir) / HEADER, *source_files(src_dir)]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _bin_dirs() -> list[Path]:
    dirs = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = _env.get(var)
        if root is not None:
            dirs.append(root / "bin")
    dirs.append(Path("/usr/local/cuda/bin"))
    # pip wheels (nvidia-cuda-nvcc, nvidia-cuda-cuobjdump) put their tools here.
    for entry in sys.path:
        for d in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "bin")), reverse=True):
            dirs.append(Path(d))
    return dirs


def find_tool(name: str) -> str | None:
    """PATH first, then $CUDA_HOME/bin, /usr/local/cuda/bin, the pip nvidia-* wheels, nvcc's dir."""
    found = shutil.which(name)
    if found:
        return found
    dirs = _bin_dirs()
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.insert(0, Path(os.path.realpath(nvcc)).parent)
    for d in dirs:
        cand = d / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _run(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def require_nvcc() -> str:
    nvcc = find_tool("nvcc")
    if not nvcc:
        raise CudaBuildError(
            "nvcc not found (looked in PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin); "
            "install the CUDA toolkit or `pip install nvidia-cuda-nvcc`, or set CUDA_HOME")
    return nvcc


def nvcc_version(nvcc: str) -> str:
    out = _run([nvcc, "--version"], timeout=60).stdout
    m = re.search(r"release [\d.]+, V([\d.]+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def supported_archs(nvcc: str) -> tuple[list[int], int]:
    """(SASS archs >= sm_75 that nvcc can emit, newest compute_XX for the PTX), from nvcc itself."""
    codes = _run([nvcc, "--list-gpu-code"], timeout=60)
    virt = _run([nvcc, "--list-gpu-arch"], timeout=60)
    if codes.returncode != 0 or virt.returncode != 0:
        raise CudaBuildError(f"{nvcc} --list-gpu-code/--list-gpu-arch failed (nvcc older than 11.0?):\n"
                             f"{codes.stdout}{virt.stdout}")
    sms = sorted({int(m) for m in re.findall(r"^sm_(\d+)$", codes.stdout, re.M) if int(m) >= MIN_SM})
    computes = sorted({int(m) for m in re.findall(r"^compute_(\d+)$", virt.stdout, re.M)
                       if int(m) >= MIN_SM})
    if not sms or not computes:
        raise CudaBuildError(f"{nvcc} lists no architecture >= sm_{MIN_SM}:\n{codes.stdout}")
    return sms, computes[-1]


def parse_archs(text: str, supported: list[int]) -> list[int]:
    """'75,90' / 'sm_75 sm_90' / 'all' -> [75, 90]; each must be one nvcc supports."""
    if text.strip().lower() in ("", "all"):
        return list(supported)
    out = []
    for tok in re.split(r"[,\s;]+", text.strip()):
        if not tok:
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+)", tok.lower())
        if not m:
            raise ValueError(f"--archs: {tok!r} is not an architecture; use e.g. 75,90 or sm_90")
        a = int(m.group(1))
        if a not in supported:
            raise ValueError(f"--archs: sm_{a} is not supported by this nvcc; choose from "
                             f"{', '.join(f'sm_{s}' for s in supported)}")
        out.append(a)
    return sorted(set(out))


def build_fatbin(output: Path = DEFAULT_FATBIN, archs: list[int] | None = None,
                 jobs: int | None = None, src_dir: Path = SOURCE_DIR, record: bool = True,
                 log=print) -> dict:
    """Compile the sources into ``output``; returns (and records) what was built."""
    nvcc = require_nvcc()
    version = nvcc_version(nvcc)
    supported, ptx = supported_archs(nvcc)
    archs = list(supported) if archs is None else archs
    ptx = max(archs) if archs != supported else ptx
    sources = source_files(src_dir)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="tensor_ops_cuda_") as tmp:
        # One translation unit including every .cu: nvcc makes one fatbin from one input, and
        # diagnostics still name the real source files.
        unity = Path(tmp) / "tensor_ops_kernels.cu"
        unity.write_text("".join(f'#include "{p.resolve()}"\n' for p in sources))
        tmp_out = Path(tmp) / output.name
        cmd = [nvcc, "-fatbin", "-std=c++17", "-O3", "-Wno-deprecated-gpu-targets",
               f"--threads={jobs}", f"-I{Path(src_dir).resolve()}"]
        cmd += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        cmd += [f"-gencode=arch=compute_{ptx},code=compute_{ptx}", "-o", str(tmp_out), str(unity)]
        log("build_cuda: " + " ".join(cmd))
        t0 = time.perf_counter()
        proc = _run(cmd)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise CudaBuildError(f"nvcc failed (exit {proc.returncode}) after {seconds:.1f}s:\n"
                                 f"{proc.stdout}")
        if proc.stdout.strip():
            log(proc.stdout.rstrip())
        shutil.copyfile(tmp_out, str(output) + ".tmp")
        os.replace(str(output) + ".tmp", output)
    try:
        shown = str(output.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        shown = str(output.resolve())
    info = {
        "fatbin": shown,
        "fatbin_sha256": hashlib.sha256(output.read_bytes()).hexdigest(),
        "archs": [f"sm_{a}" for a in archs],
        "ptx": f"compute_{ptx}",
        "nvcc": nvcc,
        "nvcc_version": version,
        "flags": ["-std=c++17", "-O3"],
        "kernels": kernel_symbols(),
        "sources_sha256": sources_digest(src_dir),
        "build_seconds": round(seconds, 1),
        "built_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    log(f"build_cuda: wrote {output} ({output.stat().st_size} bytes, "
        f"{len(archs)} SASS archs + PTX compute_{ptx}) in {seconds:.1f}s")
    # Sidecar read by the runtime (tensor_ops/backends/cuda/module.py): archs and the source hash
    # tell it whether the fatbin can serve this GPU or is stale.
    sidecar = Path(str(output) + ".json")
    jsonfile.atomic_write(sidecar, info)
    os.chmod(sidecar, 0o644)  # mkstemp made it 0600; an installed package must be readable
    os.chmod(output, 0o644)
    if record:
        path = jsonfile.update_section("built", "cuda", info)
        log(f"build_cuda: recorded built.cuda in {path}")
    return info


def require_cuobjdump() -> str:
    tool = find_tool("cuobjdump")
    if not tool:
        raise CudaBuildError("cuobjdump not found (CUDA toolkit bin/, or `pip install "
                             "nvidia-cuda-cuobjdump`); cannot list the fatbin's kernels")
    return tool


def fatbin_contents(path: Path, cuobjdump: str | None = None) -> dict:
    """{'symbols': {arch: set(kernel names)}, 'ptx': [archs]} read with cuobjdump."""
    tool = cuobjdump or require_cuobjdump()
    if not Path(path).is_file():
        raise CudaBuildError(f"no fatbin at {path}; run `python setup.py build_cuda` first")
    proc = _run([tool, "-symbols", str(path)], timeout=600)
    if proc.returncode != 0:
        raise CudaBuildError(f"{tool} -symbols {path} failed (exit {proc.returncode}):\n{proc.stdout}")
    symbols: dict[str, set] = {}
    arch = None
    for line in proc.stdout.splitlines():
        m = re.search(r"arch\s*=\s*(sm_\d+\w*)", line)
        if m:
            arch = m.group(1)
            symbols.setdefault(arch, set())
            continue
        # cuobjdump <= 13.0 prints "STT_FUNC STB_GLOBAL STO_ENTRY name"; 13.5 prints
        # "FUNC GLOBAL DEFAULT ENTRY name": accept both spellings.
        m = re.match(r"\s*(?:STT_)?FUNC\s+(?:STB_)?GLOBAL\s+.*?(\w+)\s*$", line)
        if m and arch:
            symbols[arch].add(m.group(1))
    ptx = _run([tool, "-lptx", str(path)], timeout=600)
    ptx_archs = re.findall(r"(sm_\d+\w*|compute_\d+\w*)", ptx.stdout) if ptx.returncode == 0 else []
    return {"symbols": symbols, "ptx": ptx_archs}


def check_fatbin(path: Path = DEFAULT_FATBIN, expected_archs: list[str] | None = None,
                 cuobjdump: str | None = None) -> dict:
    """Raise CudaBuildError unless every kernel symbol is in the SASS of every arch."""
    contents = fatbin_contents(path, cuobjdump)
    symbols = contents["symbols"]
    if not symbols:
        raise CudaBuildError(f"{path}: cuobjdump lists no ELF (SASS) images")
    problems = []
    if expected_archs:
        absent = sorted(set(expected_archs) - set(symbols))
        if absent:
            problems.append(f"no SASS for {', '.join(absent)}")
    want = set(kernel_symbols())
    for arch, syms in sorted(symbols.items()):
        missing = sorted(want - syms)
        if missing:
            problems.append(f"{arch} lacks {', '.join(missing)}")
    if not contents["ptx"]:
        problems.append("no PTX image (forward compatibility)")
    if problems:
        raise CudaBuildError(f"{path}: " + "; ".join(problems))
    archs = sorted(symbols, key=lambda a: (int(re.sub(r"\D", "", a) or 0), a))
    return {"archs": archs, "ptx": contents["ptx"], "kernels": len(want)}


class BuildCuda(Command):
    description = "compile cuda_ext/*.cu into tensor_ops/_cuda_kernels.fatbin with nvcc"
    user_options = [
        ("archs=", None, "comma list of SASS archs, e.g. 75,90 (default: all nvcc supports >= 75)"),
        ("output=", "o", f"fatbin path (default {DEFAULT_FATBIN.relative_to(PROJECT_ROOT)})"),
        ("jobs=", "j", "nvcc --threads (default: CPU count)"),
        ("check", None, "after building, check the kernel symbols with cuobjdump"),
    ]
    boolean_options = ["check"]

    def initialize_options(self):
        self.archs = None
        self.output = None
        self.jobs = None
        self.check = False

    def finalize_options(self):
        self.jobs = int(self.jobs) if self.jobs else None

    def run(self):
        try:
            archs = None
            if self.archs:
                archs = parse_archs(self.archs, supported_archs(require_nvcc())[0])
            out = Path(self.output) if self.output else DEFAULT_FATBIN
            info = build_fatbin(out, archs=archs, jobs=self.jobs)
            if self.check:
                res = check_fatbin(out, expected_archs=info["archs"])
                print(f"build_cuda: {res['kernels']} kernels present in {len(res['archs'])} "
                      f"SASS archs; PTX {', '.join(res['ptx'])}")
        except (CudaBuildError, ValueError) as exc:
            print(f"build_cuda: error: {exc}", file=sys.stderr)
            raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="tensor_ops CUDA fatbin build/check")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the fatbin")
    b.add_argument("--archs", default=None)
    b.add_argument("--output", default=str(DEFAULT_FATBIN))
    b.add_argument("--jobs", type=int, default=None)
    b.add_argument("--check", action="store_true")
    b.add_argument("--no-record", action="store_true", help="do not touch backend.json")
    c = sub.add_parser("check", help="check an existing fatbin's kernel symbols with cuobjdump")
    c.add_argument("--fatbin", default=str(DEFAULT_FATBIN))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            archs = parse_archs(args.archs, supported_archs(require_nvcc())[0]) if args.archs else None
            info = build_fatbin(Path(args.output), archs=archs, jobs=args.jobs,
                                record=not args.no_record)
            if args.check:
                res = check_fatbin(Path(args.output), expected_archs=info["archs"])
                print(f"check: {res['kernels']} kernels in each of {', '.join(res['archs'])}; "
                      f"PTX {', '.join(res['ptx'])}")
        else:
            res = check_fatbin(Path(args.fatbin))
            print(f"check: {res['kernels']} kernels in each of {', '.join(res['archs'])}; "
                  f"PTX {', '.join(res['ptx'])}")
    except (CudaBuildError, ValueError) as exc:
        print(f"cuda_build: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
