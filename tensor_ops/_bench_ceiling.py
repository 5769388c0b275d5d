"""The ceiling every benchmark row is compared with: a copy that reads the op's own input
pages (the very arrays the kernel reads) and writes a same-sized destination, moving as many
bytes as the op, timed by the engine in the same interleaved rounds as the op.

On the host it is ``tensor_ops._cpp.stream_copy`` (non-temporal stores, the C++ kernels'
OpenMP threads, GIL released): glibc's memcpy does not stream below its non-temporal
threshold (~240 MiB on the development VM), so kernels with streaming stores beat a memcpy
and a memcpy is not the memory ceiling. Without ``stream_copy`` the ceiling is a memcpy
split over the same threads, labelled :data:`MEMCPY_MISSING`. torch CUDA tensors are copied
on the device (``Tensor.copy_``).

``stream_copy`` copies either linearly or a block of 4 pages at a time, 128 bytes of each in
turn (``pages=4``, glibc's large-copy pattern). Which is faster depends on the host: on an
Intel Cascade Lake VM (2026-11-28) the 4-page copy moved 1.27-1.36x the linear one's bytes per
second standalone (1.0-1.1x memcpy's) and ~1.1x in the engine, so holding kernels to the
linear copy there overstated every ratio. :func:`ceiling_copy` times both on the op's
pages and keeps the faster, named in its label; the choice holds for sizes within 2x (one
probe per rung of a size ladder).
"""
from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np

MEMCPY_MISSING = "memcpy (no streaming copy: tensor_ops._cpp.stream_copy missing)"
PARALLEL_MIN = 128 << 10          # below this many bytes the memcpy runs on one thread (as _cpp does)
_POOL: Optional[ThreadPoolExecutor] = None
PAGES = (1, 4)                    # stream_copy's layouts: linear, 4 pages a piece each in turn
PROBE_CALLS = 3                   # timed calls per layout (after one warm-up) when choosing
_clock = time.perf_counter        # a module attribute so a test can count calls, not seconds
_LAYOUT: dict = {}                # (threads, bytes' bit length) -> the pages chosen for that size


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

    key = (threads, sum(a.size for a, _ in pairs).bit_length())
    if key not in _LAYOUT:  # one probe per size within 2x: a size ladder probes each rung once
        _LAYOUT[key] = faster_pages(sc, pairs)
    pages = _LAYOUT[key]

    def run():
        for a, b in pairs:
            sc(a, b, pages)
    how = f"{threads} threads" + (f", {pages} pages at a time" if pages > 1 else "")
    return run, "stream", f"streaming-store copy of the op's pages ({how})"


def faster_pages(sc: Callable, pairs: list) -> int:
    """The ``pages`` of :data:`PAGES` whose ``stream_copy`` of ``pairs`` took less time: the
    median of :data:`PROBE_CALLS` calls each, alternating, after one warm-up call each (a
    burst of load on the shared host hits both). Pairs too small for one 4-page block take
    the linear copy; a tie goes to it too."""
    if max(a.size for a, _ in pairs) < 2 * max(PAGES) * 4096:
        return 1
    times: dict = {p: [] for p in PAGES}
    for r in range(PROBE_CALLS + 1):
        for p in PAGES:
            t0 = _clock()
            for a, b in pairs:
                sc(a, b, p)
            if r:
                times[p].append(_clock() - t0)
    return min(PAGES, key=lambda p: statistics.median(times[p]))
