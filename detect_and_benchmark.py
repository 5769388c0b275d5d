"""One-shot: detect the machine, validate every available backend, time what exists.

(Interim version: the full detect → build → validate → benchmark → tune → write pipeline
replaces this.)
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tensor_ops" / "_build"))
import capabilities  # noqa: E402

import tensor_ops as to  # noqa: E402


def main() -> int:
    print(capabilities.format_table(capabilities.detect_all()))
    x = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)
    w = np.ones(4096, np.float32)
    ref = to.rms_norm(x, w, backend="numpy")
    info = to.get_backend_info()
    for name, b in info["backends"].items():
        if not b["available"]:
            print(f"{name:<8} unavailable: {b['reason']}")
            continue
        y = to.rms_norm(x, w, backend=name)
        ok = np.allclose(y, ref, rtol=1e-5, atol=1e-5)
        t0 = time.perf_counter()
        for _ in range(5):
            to.rms_norm(x, w, backend=name)
        dt = (time.perf_counter() - t0) / 5
        print(f"{name:<8} rms_norm 1024x4096 fp32: {'ok' if ok else 'WRONG'}  {2 * x.nbytes / dt / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
