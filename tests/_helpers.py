"""Helpers every test module shares: a Python subprocess on this checkout, import blocking, bf16 bits.

Subprocesses are how the suite checks what only a fresh interpreter shows (import-time
behaviour, a missing toolkit, fork safety): they run ``sys.executable`` with this checkout
first on ``PYTHONPATH``, so the tree under test is the one imported.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def block_imports(*names: str, message: str = "blocked by the test") -> str:
    """Python source that makes ``import <name>`` (and its submodules) raise ImportError.

    ``names`` are top-level packages (``"torch"``) or exact modules (``"tensor_ops._cpp"``)."""
    return textwrap.dedent(f"""
        import sys, importlib.abc
        class _Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name in {names!r} or name.split('.')[0] in {names!r}:
                    raise ImportError({message!r} + ': ' + name)
        sys.meta_path.insert(0, _Block())
    """)


def run_python(code: str = "", *args: str, env: dict | None = None, timeout: float = 300,
               blocked: tuple = (), cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented; or ``args`` such as ``-m tensor_ops info``) in a fresh
    interpreter on this checkout; ``blocked`` modules fail to import there."""
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    src = (block_imports(*blocked) if blocked else "") + textwrap.dedent(code)
    cmd = [sys.executable, *(("-c", src) if code else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=str(cwd), timeout=timeout)


def tsan_toolchain() -> tuple[str, str]:
    """(g++, libtsan.so) for a ThreadSanitizer build; the calling test skips with the reason
    when either is missing."""
    import shutil

    import pytest
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the ThreadSanitizer harness needs it")
    libtsan = subprocess.run([gxx, "-print-file-name=libtsan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libtsan) or not os.path.exists(libtsan):
        pytest.skip(f"g++ has no libtsan.so ({libtsan!r}): install gcc's ThreadSanitizer runtime")
    return gxx, libtsan


def skip_if_tsan_cannot_start(proc: subprocess.CompletedProcess) -> None:
    """Skip when ThreadSanitizer's runtime could not map its shadow memory on this kernel."""
    import pytest
    if "unexpected memory mapping" in proc.stderr or "failed to allocate" in proc.stderr:
        pytest.skip(f"ThreadSanitizer cannot start on this kernel: {proc.stderr.strip()[:200]}")


def cpp_native():
    """The C++ extension module, or a skip naming why the cpp backend is unavailable (the
    tests that call its bindings directly share this one check)."""
    import pytest

    from tensor_ops.backends import cpp
    ok, reason = cpp.availability()
    if not ok:
        pytest.skip(f"cpp unavailable: {reason}")
    return cpp.native()


def bf16_bits(a) -> np.ndarray:
    """float -> bfloat16 bits (round to nearest even; NaN quiet, as the C++ kernels store it) as uint16."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_float(b) -> np.ndarray:
    """bfloat16 bits (uint16) -> the float32 values they hold."""
    return (b.astype(np.uint32) << 16).view(np.float32)
