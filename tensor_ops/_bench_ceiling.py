"""The ceiling every benchmark row is compared with: a copy that reads the op's own input
pages (the very arrays the kernel reads) and writes a same-sized destination, moving as many
bytes as the op, timed by the engine in the same interleaved rounds as the op.

On the host it is ``tensor_ops._cpp.stream_copy`` (non-temporal stores, the C++ kernels'
OpenMP threads, GIL released): glibc's memcpy does not stream below its non-temporal
threshold (~240 MiB on the development VM), so kernels with streaming stores beat a memcpy
and a memcpy is not the memory ceiling. Without ``stream_copy`` the ceiling is a memcpy
split over the same threads, labelled :data:`MEMCPY_MISSING`. torch CUDA tensors are copied
on the device (``Tensor.copy_``).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np

MEMCPY_MISSING = "memcpy (no streaming copy: tensor_ops._cpp.stream_copy missing)"
PARALLEL_MIN = 128 << 10          # below this many bytes the memcpy runs on one thread (as _cpp does)
_POOL: Optional[ThreadPoolExecutor] = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max(1, (os.cpu_count() or 2) - 1), thread_name_prefix="tensor_ops_copy")
    return _POOL


def stream_copy_fn() -> Optional[Callable]:
    """``tensor_ops._cpp.stream_copy`` when this build has it, else None."""
    try:
        from .backends import cpp
        return getattr(cpp.native(), "stream_copy", None) if cpp.availability()[0] else None
    except Exception:  # an unavailable backend means no streaming copy, not a failed run
        return None


def copy_threads() -> int:
    """The threads the ceiling uses: the C++ kernels' (``set_num_threads``), else 2."""
    try:
        from .backends import cpp
        return cpp.get_num_threads() if cpp.availability()[0] else 2
    except Exception:
        return 2


def _bytes(a):
    """A flat uint8 view of a C-contiguous NumPy array or torch tensor (same memory)."""
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    import torch
    b = a.detach().contiguous().reshape(-1).view(torch.uint8)
    return b if b.device.type != "cpu" else b.numpy()


def pieces(srcs, nbytes: int) -> list:
    """(source, destination) byte views over the first ``nbytes`` of ``srcs`` in order (the
    op's own input pages); a fresh buffer tops up if they are shorter."""
    pairs, left = [], int(nbytes)
    for s in srcs:
        if left <= 0:
            break
        a = _bytes(s)[:left]
        if a.shape[0]:
            pairs.append((a, a.new_empty(a.shape) if not isinstance(a, np.ndarray) else np.empty_like(a)))
            left -= a.shape[0]
    if left > 0:
        a = np.ones(left, np.uint8) if not pairs or isinstance(pairs[0][0], np.ndarray) else pairs[0][0].new_ones(left)
        pairs.append((a, a.copy() if isinstance(a, np.ndarray) else a.clone()))
    return pairs


def memcpy_fn(pairs: list, threads: int) -> Callable[[], None]:
    """np.copyto (glibc memcpy, GIL released) of every pair, each split over ``threads``."""
    total = sum(a.size for a, _ in pairs)
    if threads <= 1 or total < PARALLEL_MIN:
        def one():
            for a, b in pairs:
                np.copyto(b, a)
        return one
    parts: list = [[] for _ in range(threads)]
    for a, b in pairs:
        step = -(-a.size // threads)
        for k in range(threads):
            parts[k].append((a[k * step:(k + 1) * step], b[k * step:(k + 1) * step]))

    def part(k):
        for a, b in parts[k]:
            np.copyto(b, a)
    pool = _pool()

    def run():
        futs = [pool.submit(part, k) for k in range(1, threads)]
        part(0)
        for f in futs:
            f.result()
    return run


def ceiling_copy(srcs, nbytes: int, memcpy: bool = False) -> tuple[Callable[[], None], str, str]:
    """(fn, kind, label) of the ceiling of an op moving ``2 * nbytes`` bytes: a copy reading
    ``nbytes`` of its input arrays ``srcs`` into a same-sized destination. kind is
    ``stream``, ``memcpy`` or ``device``; ``memcpy=True`` asks for the memcpy (a second,
    labelled reference line beside a streaming ceiling)."""
    pairs = pieces(srcs, nbytes)
    if not isinstance(pairs[0][0], np.ndarray):           # torch device tensors

        def dev():
            for a, b in pairs:
                b.copy_(a)
        return dev, "device", f"device copy of the op's pages ({pairs[0][0].device.type}, Tensor.copy_)"
    threads = copy_threads()
    sc = None if memcpy else stream_copy_fn()
    if sc is None:
        return memcpy_fn(pairs, threads), "memcpy", (f"memcpy ({threads} threads)" if memcpy else MEMCPY_MISSING)

    def run():
        for a, b in pairs:
            sc(a, b)
    return run, "stream", f"streaming-store copy of the op's pages ({threads} threads)"
