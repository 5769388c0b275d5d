"""Instructions per element of the C++ kernels, counted (not timed): the roofline analysis.

Timings on a shared 2-core VM are noisy; instruction counts are not. Two counters:

* ``callgrind``: ``valgrind --tool=callgrind`` runs the workload twice (``--reps`` 1 and
  3 calls per case, after a warm-up call), and each kernel function's inclusive Ir
  (``callgrind_annotate --auto=no --inclusive=yes``) is differenced and divided by the
  elements of the extra calls, so import, first-call and Python costs drop out. Valgrind
  (3.19) has no AVX-512: its CPUID hides it, so the import picks the **AVX2** variant and
  these are AVX2 counts. Slow: ~5-15 minutes per valgrind run on a loaded 2-core VM.
* ``step``: the same workload under ``ptrace`` single-stepping (Linux x86-64, no valgrind),
  so it counts whatever variant the CPU runs, **AVX-512** included. The child stops itself
  (SIGSTOP) right before and after one call of the op with ``out=``; the parent counts the
  instructions executed inside ``tensor_ops._cpp``'s code in between (the kernel and its C++
  entry), at ``--rows`` and at half as many rows, and divides the difference by the
  elements: the entry's fixed cost cancels, the kernel's per-row work stays in.
  ``TENSOR_OPS_MAX_ISA=avx2`` there must agree with ``callgrind`` (the cross-check).
  Deterministic (relu fp32: 0.281, its 9-instruction loop per 32 elements, on every run);
  ~10 us per step, so 1-3 minutes per op.

Both run one thread (``OMP_NUM_THREADS=1``) on the benchmark's own cases
(``tensor_ops._bench_cases.bench_case``: (rows, 4096), rope (32, rows, 128) with (rows, 128)
float32 tables; add_rms_norm / add_layer_norm with both outputs there; ``tex_d<act>`` /
``tex_dbias_d<act>``: TE's activation derivatives as tex calls them, ``_cpp.dact`` on (rows,
4096), with the bias gradient for the second), ``out`` 16 bytes past
a 64-byte boundary (``--out-offset``), and force the
streaming-store path (``_set_tuning(nontemporal_threshold_bytes
=0)``), which the kernels take at the memory-bound sizes (8192x4096).

    PYTHONPATH=. python benchmarks/callgrind_ops.py callgrind            # AVX2, 256x4096
    PYTHONPATH=. python benchmarks/callgrind_ops.py step                 # AVX-512 (this CPU)
    PYTHONPATH=. TENSOR_OPS_MAX_ISA=avx2 python benchmarks/callgrind_ops.py step
    PYTHONPATH=. python benchmarks/callgrind_ops.py run --reps 1         # the workload alone
    PYTHONPATH=. python benchmarks/callgrind_ops.py ceiling --reps 21    # stream_copy GB/s
    PYTHONPATH=. python benchmarks/callgrind_ops.py incache --reps 11    # ns/element in L2, 1 thread
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import signal
import subprocess
import sys
import tempfile

OPS = ["rms_norm", "layer_norm", "softmax", "silu", "gelu", "gelu_tanh", "relu", "swiglu", "geglu", "rope",
       "add_rms_norm", "add_layer_norm", "tex_dgelu", "tex_dbias_dgelu", "tex_dsilu", "tex_dbias_dsilu"]
DTYPES = ["float32", "float16", "bfloat16"]
COLS = 4096
# Kernel symbol (as callgrind_annotate prints it, after the ISA namespace) per op; {T} is the
# element type. unary_k / glu_k's second argument: kernels.h's Unary / Glu enums.
SYMBOL = {
    "rms_norm": "rms_norm_k<{T}>",
    "layer_norm": "layer_norm_k<{T}>",
    "softmax": "softmax_k<{T}>",
    "silu": "unary_k<{T}, 0>",
    "relu": "unary_k<{T}, 1>",
    "gelu": "unary_k<{T}, 2>",
    "gelu_tanh": "unary_k<{T}, 3>",
    "swiglu": "glu_k<{T}, 0>",
    "geglu": "glu_k<{T}, 1>",
    "add_rms_norm": "add_rms_norm_k<{T}>",
    "add_layer_norm": "add_layer_norm_k<{T}>",
    "tex_dgelu": "dact_k<{T}, 0>",  # kernels.h's DAct codes (TE's gelu is the tanh form)
    "tex_dbias_dgelu": "dact_k<{T}, 0>",
    "tex_dsilu": "dact_k<{T}, 1>",
    "tex_dbias_dsilu": "dact_k<{T}, 1>",
}
CTYPE = {"float32": "float", "float16": "f16", "bfloat16": "bf16"}


def _case(op: str, dtype: str, rows: int, out_offset: int = 16):
    """(call, elements): a no-argument call of the facade op with ``out=`` given, ``out``
    starting ``out_offset`` bytes past a 64-byte boundary. 16 is where glibc puts a large
    ``np.empty`` (mmap'd: page + 16), the benchmark's outputs included; rope then stages its
    rows (rope.cpp), so its count depends on this. Small arrays land anywhere, which made a
    rows-vs-rows/2 difference mix two paths before this was pinned."""
    import ml_dtypes  # noqa: F401  (registers the name "bfloat16" with NumPy)
    import numpy as np

    import tensor_ops as to
    from tensor_ops import _cpp
    from tensor_ops._bench_cases import bench_case

    _cpp._set_tuning(nontemporal_threshold_bytes=0)  # streaming stores, as at 8192x4096

    def out(dt, shape):
        size = int(np.prod(shape)) * np.dtype(dt).itemsize
        raw = np.empty(size + 128, np.uint8)
        start = (-raw.ctypes.data) % 64 + out_offset
        return raw[start:start + size].view(dt).reshape(shape)
    if op.startswith("tex_"):  # TE's activation derivatives (tex): grad, x -> out (+ dbias)
        x = np.random.default_rng(0).standard_normal((rows, COLS), np.float32).astype(dtype)
        g = np.ascontiguousarray(x[::-1])
        yd = out(x.dtype, x.shape)
        kw = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
        x, g, yd = ((a.view(np.int16) if kw else a) for a in (x, g, yd))
        kind = _cpp.DACT_CODES[op.rsplit("_d", 1)[1]]
        db = np.zeros(COLS, np.float32) if op.startswith("tex_dbias_") else None
        return (lambda: _cpp.dact(g, x, yd, kind, db, **kw)), x.size
    case = bench_case(op, dtype, rows, COLS)  # "gelu_tanh": gelu(x, "tanh")
    y = out(case.x.dtype, case.out_shape)
    fn = getattr(to, case.op)
    if op.startswith("add_"):  # the fused residual add: both outputs at the same offset
        res = out(case.x.dtype, case.out_shape)

        def call():
            fn(case.x, *case.args, out=(y, res))
        return call, case.x.size

    def call():
        fn(case.x, *case.args, out=y)

    return call, case.x.size


def run(args) -> None:
    """The workload: every op x dtype called ``--reps`` times (after one warm-up call);
    with ``--mark``, one call between two SIGSTOPs for ``step``."""
    for op in args.ops:
        for dtype in args.dtypes:
            call, _ = _case(op, dtype, args.rows, args.out_offset)
            call()
            if args.mark:
                gc.collect()
                gc.disable()  # a collection between the marks would add thousands of instructions
                os.kill(os.getpid(), signal.SIGSTOP)
                call()
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                for _ in range(args.reps):
                    call()


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")


def _kernel_ir(annotate_out: str, op: str, dtype: str) -> int:
    """The inclusive Ir of ``op``'s kernel for ``dtype`` in ``callgrind_annotate --auto=no
    --inclusive=yes`` output. Code inlined from headers (simd.h, rowio.h, the intrinsics' headers) is
    listed as more "file:function" entries of the same function, each with its own part;
    the entry of the function's own file carries the whole inclusive cost, hence the max."""
    sym = SYMBOL.get(op, "rope_k<{T}>").format(T=CTYPE[dtype])
    best = 0
    for line in annotate_out.splitlines():
        line = re.sub(r"to::isa_\w+::\(anonymous namespace\)::", "", line)
        m = re.match(r"\s*([\d,]+)\s.*(?<!\w)" + re.escape(sym) + r"\(", line)
        if m:
            best = max(best, int(m.group(1).replace(",", "")))
    return best


def callgrind(args) -> None:
    """Ir per element of each kernel (inclusive), reps 3 minus reps 1, under valgrind. The
    profiles go to ``--cg-dir`` (kept; one already there is re-annotated, not re-run)."""
    ir = {}
    with tempfile.TemporaryDirectory() as tmp:
        for reps in (1, 3):
            out = os.path.join(args.cg_dir or tmp, f"cg.{reps}")
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__, "run",
                   "--reps", str(reps), "--rows", str(args.rows), "--out-offset", str(args.out_offset),
                   "--ops", *args.ops, "--dtypes", *args.dtypes]
            if not os.path.exists(out):
                subprocess.run(cmd, env=_env(), check=True, stderr=subprocess.DEVNULL)
            ann = subprocess.run(["callgrind_annotate", "--auto=no", "--inclusive=yes", "--threshold=100", out],
                                 capture_output=True, text=True, check=True).stdout
            ir[reps] = ann
    isa = re.findall(r"to::isa_(\w+)::", ir[3])
    print(f"callgrind, variant {sorted(set(isa))}, rows={args.rows}x{COLS}, 1 thread: instructions per element")
    _table(args, lambda op, dt: (_kernel_ir(ir[3], op, dt) - _kernel_ir(ir[1], op, dt)) / (2 * args.rows * COLS))


# ---- ptrace single-stepping ------------------------------------------------------------
_PTRACE_TRACEME, _PTRACE_GETREGS, _PTRACE_CONT, _PTRACE_SINGLESTEP = 0, 12, 7, 9
_RIP = 16  # index of rip in x86-64 struct user_regs_struct (27 unsigned longs)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    return libc


def _module_ranges(pid: int) -> list:
    """The executable mappings of tensor_ops._cpp in ``pid``: where the kernels run."""
    ranges = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "x" in parts[1] and "/_cpp." in parts[5]:
                lo, hi = (int(v, 16) for v in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def _steps(op: str, dtype: str, rows: int, out_offset: int) -> int:
    """Instructions the child executes inside tensor_ops._cpp between its two SIGSTOPs (one
    call of the op): the kernel and its C++ entry, not Python (whose allocator and
    collector add a few thousand instructions at random)."""
    libc = _libc()
    cmd = [sys.executable, __file__, "run", "--mark", "--rows", str(rows), "--ops", op, "--dtypes", dtype,
           "--out-offset", str(out_offset)]
    child = subprocess.Popen(cmd, env=_env(), preexec_fn=lambda: libc.ptrace(_PTRACE_TRACEME, 0, None, None))
    pid, marks, count, stepping, ranges = child.pid, 0, 0, False, []
    regs = (ctypes.c_ulong * 27)()
    while True:
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            break
        sig = os.WSTOPSIG(status)
        deliver = 0
        if sig == signal.SIGSTOP:  # our marks: swallowed
            marks += 1
            stepping = marks == 1
            ranges = ranges or _module_ranges(pid)
        elif sig == signal.SIGTRAP:
            if stepping:
                libc.ptrace(_PTRACE_GETREGS, pid, None, ctypes.cast(regs, ctypes.c_void_p))
                rip = regs[_RIP]
                count += any(lo <= rip < hi for lo, hi in ranges)
        else:
            deliver = sig
        req = _PTRACE_SINGLESTEP if stepping else _PTRACE_CONT
        if libc.ptrace(req, pid, None, ctypes.c_void_p(deliver)) != 0:
            raise OSError(ctypes.get_errno(), "ptrace")
    if marks != 2 or not ranges:
        raise RuntimeError(f"{op} {dtype}: expected 2 marks and the module mapped, saw {marks}, {ranges}")
    return count


def step(args) -> None:
    """Instructions per element by single-stepping one call at rows and rows/2."""
    import tensor_ops.backends.cpp as cb

    isa = cb.get_optimization_info().get("selected_isa")
    print(f"ptrace single-step, variant {isa}, rows={args.rows} vs {args.rows // 2} (x{COLS}), 1 thread, "
          f"out at 64n+{args.out_offset}: "
          "instructions per element")
    half = args.rows // 2  # --rows even: the difference is half rows
    off = args.out_offset
    _table(args, lambda op, dt: (_steps(op, dt, args.rows, off) - _steps(op, dt, half, off)) / (half * COLS))


def ceiling(args) -> None:
    """The memory side: GB/s of ``_cpp.stream_copy`` (8192x4096 float32 into a second array:
    128 MiB read + 128 MiB written, the kernels' threads) in each layout the engine chooses
    from (linear, ``pages=4``) and of a one-thread ``np.copyto`` (glibc memcpy), timed side by
    side by the engine's ``time_rounds`` (``--reps`` rounds): medians, best, and each row's
    speed as the median per-round ratio to the linear copy."""
    import numpy as np

    from tensor_ops import _cpp
    from tensor_ops._bench import stats, time_rounds
    from tensor_ops._bench_ceiling import PAGES

    src = np.ones((8192, COLS), np.float32)
    dst = np.zeros_like(src)
    fns = {f"stream_copy pages={p}": (lambda p=p: _cpp.stream_copy(src, dst, p)) for p in PAGES}
    fns["np.copyto (1 thread)"] = lambda: np.copyto(dst, src)
    st = stats(time_rounds(fns, 0, min_rounds=args.reps), 2 * src.nbytes)
    first = next(iter(fns))
    print(f"8192x{COLS} float32, {_cpp.get_num_threads()} threads, {args.reps} rounds:")
    for k, s in st.items():
        vs = s["vs"].get(first)
        print(f"  {k:<22} median {s['median_s'] * 1e3:7.2f} ms = {s['gbps']:5.1f} GB/s, best "
              f"{2 * src.nbytes / s['best_s'] / 1e9:5.1f} GB/s" + (f", {vs:.2f}x the speed of {first}" if vs else ""))


def incache(args) -> None:
    """The compute side, timed: ns per element of one thread with x and y in L2 (``--rows``
    16: 256 KiB + 256 KiB at fp32; cached stores, nontemporal threshold raised), by the
    engine's ``time_rounds`` (``--reps`` rounds, each a block of 20 calls): the best and the
    median. Noisy on a shared machine: the best is the figure to read, next to the
    instruction count."""
    from tensor_ops import _cpp
    from tensor_ops._bench import stats, time_rounds

    _cpp.set_num_threads(1)

    def per_elem(op, dtype):
        call, elems = _case(op, dtype, args.rows, args.out_offset)
        _cpp._set_tuning(nontemporal_threshold_bytes=1 << 40)
        s = stats(time_rounds({"k": call}, 0, min_rounds=args.reps, calls=20), 0)["k"]
        return f"{s['best_s'] / elems * 1e9:.3f} / {s['median_s'] / elems * 1e9:.3f}"

    print(f"in-cache time, 1 thread, rows={args.rows}x{COLS}: ns per element, best / median")
    _table(args, per_elem)


def _table(args, per_elem) -> None:
    print("| op | " + " | ".join(args.dtypes) + " |")
    print("|---|" + "---|" * len(args.dtypes))
    for op in args.ops:
        cells = (per_elem(op, dt) for dt in args.dtypes)
        print(f"| {op} | " + " | ".join(c if isinstance(c, str) else f"{c:.3f}" for c in cells) + " |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["callgrind", "step", "run", "ceiling", "incache"])
    p.add_argument("--ops", nargs="*", default=OPS, choices=OPS)
    p.add_argument("--dtypes", nargs="*", default=DTYPES, choices=DTYPES)
    p.add_argument("--rows", type=int, default=None, help="x rows of 4096 (callgrind/run: 256, step: 16)")
    p.add_argument("--reps", type=int, default=None,
                   help="run: calls per case after the warm-up (1); ceiling/incache: timed rounds (21)")
    p.add_argument("--out-offset", type=int, default=16, help="out's start past a 64-byte boundary (default 16)")
    p.add_argument("--cg-dir", default=None, help="callgrind: keep (or reuse) the profiles cg.1, cg.3 here")
    p.add_argument("--mark", action="store_true", help="run: one call between two SIGSTOPs (for step)")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 1 if args.mode == "run" else 21
    if args.rows is None:
        args.rows = 16 if args.mode in ("step", "incache") else 256
    {"callgrind": callgrind, "step": step, "run": run, "ceiling": ceiling, "incache": incache}[args.mode](args)


if __name__ == "__main__":
    main()
