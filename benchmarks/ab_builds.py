"""Two builds of the C++ kernels, side by side in one process: which one is faster?

On a shared 2-core VM the copy bandwidth moves by 1.5x between minutes, so a kernel change
measured by two benchmark runs (before / after) is mostly a measurement of the host. This
loads copies of another build's ``tensor_ops._cpp`` (a ``.so`` built from another checkout,
e.g. a ``git worktree`` of the base commit) and of this checkout's, each as a module of its
own, and times the same calls on all of them in the engine's interleaved rounds
(``tensor_ops._bench.time_rounds``), so both builds see the same host: the ratio is the
median of per-round ratios. The modules share nothing (each has its own thread pool and
output cache).

    git worktree add /tmp/base HEAD~1 && (cd /tmp/base && python setup.py -q build_ext --inplace)
    python benchmarks/ab_builds.py /tmp/base/tensor_ops/_cpp.*.so --ops rms_norm softmax \\
        --dtypes float32 bfloat16

Where a build's arrays land matters too: the same module timed on different out= arrays of
the same shape (each from its own ``np.empty``) differed by up to 17 % in one process (fp32
softmax, 6.7 vs 7.9 ms; not huge pages: NumPy's arrays here get them). ``--copies N``
(default 2) loads N copies of each build (each its own module, arrays, heap and thread
stacks) and times them all in the same rounds: a build's time per round is the median over
its copies (a mean let one copy's spike from another tenant move the round: gelu at 5.6 ms in
every copy's median read 7.2 ms as the median of per-round means), and the per-copy medians
are printed, so a placement effect shows as copies that
disagree instead of as a speed-up.

The cases are the benchmark's own (``_bench_cases.bench_case``: (rows, 4096), rope (32, rows,
128)), ``out=`` given as ``np.empty`` gives it (16 bytes past a 64-byte boundary); and TE's
scaled softmax as tex calls it (``tex_softmax``, ``tex_softmax_mask``, ``tex_softmax_causal``,
``tex_softmax_bwd``: the extension's entry points on (rows, ``--width``, 4096 by default)) and TE's activation
derivatives (``tex_d<act>``, e.g. ``tex_dgelu``; ``tex_dbias_d<act>`` with the bias gradient;
``tex_dglu_<act>``, the gated ones on (rows, [width/2 | width/2]) rows: ``tex_dglu_silu`` is dswiglu,
``tex_dglu_gelu`` TE's tanh dgeglu)
and norm backwards (``tex_rms_norm_bwd``, ``tex_layer_norm_bwd``: dx and dgamma (+ dbeta)).
The autograd's kernels (``tensor_ops.torch``'s backward and helpers) are ``ag_gelu_erf_bwd``,
``ag_tanh``, ``ag_exp`` and ``ag_glu2_bwd_<act>`` (``silu``, ``gelu``, ``gelu_tanh``; (rows, width/2)
halves), out= given.
``tex_sgd`` and ``tex_adam`` are the optimizer steps on one flat tensor (in place: the parameters
drift a little each call). ``--out-offset 0`` puts every array of a call (inputs and outputs) on a 64-byte boundary
instead, at one page offset, as torch allocates them (what TE's calls see). ``--data`` sets x:
standard normal (default), ``wide`` (8 times that) or ``codes`` (16-bit dtypes: every finite code
equally likely, the worst case of lut16.h's tables).

An import-time choice (``build_info()``'s ``norm_weights_16bit``, ``fp16_tables_all``, ...) is
measured the same way with this build's own ``.so`` as the other and ``--tune-other``, e.g.
``--tune-other norm_w16=0``: the other's copies run with that ``_set_tuning`` keyword.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_dtypes  # noqa: E402,F401  (registers "bfloat16" with NumPy)
import numpy as np  # noqa: E402

from tensor_ops import _bench  # noqa: E402
from tensor_ops._bench_cases import bench_case  # noqa: E402


_LOADED = [0]


def load_other(path: str):
    """The ``_cpp`` extension at ``path`` as a module of its own (not tensor_ops._cpp). Each
    call gets its own module name (``ab<k>._cpp``): CPython keeps single-phase extension
    modules by name, and a second load under the same name returned the first module object,
    whatever file it was given (so ``--copies`` once timed one build against itself)."""
    _LOADED[0] += 1
    spec = importlib.util.spec_from_file_location(f"ab{_LOADED[0]}._cpp", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"ab_builds: cannot load {path!r} as an extension module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _native(a):
    """(array, dtype keyword) as the extension takes it: bfloat16 as its int16 bits."""
    if getattr(a, "dtype", None) is not None and a.dtype.name == "bfloat16":
        return a.view(np.int16), "bfloat16"
    return a, None


#: TE's scaled softmax (tex, softmax.cpp's kernel) on (rows, width): mode, heads, sq of each case
#: (None: rows / heads; the causal case's square blocks take sq = width)
TEX_SOFTMAX = {"tex_softmax": (0, 1, 1), "tex_softmax_mask": (1, 16, None), "tex_softmax_causal": (2, 1, None)}


def _out_like(a, offset):
    """An uninitialised array like ``a``: np.empty's (None) or starting ``offset`` bytes past a
    64-byte boundary (0: aligned, as torch allocates)."""
    if offset is None:
        return np.empty_like(a)
    raw = np.empty(a.nbytes + 4096 + 128, np.uint8)
    start = (-raw.ctypes.data) % 4096 + 64 + offset  # page + 64 + offset, whatever the size
    return raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)


def _placed(a, offset):
    """``a`` itself (None), or a copy ``offset`` bytes past a 64-byte boundary: with
    --out-offset every array of a call sits at the same page offset, as torch allocates them
    all (page + 64). An output a line or two past its input's page offset is another case: it
    can run 2x slower (fp32 gelu, input at page + 16 and output at page + 64: 11.4 against
    5.9 ms), the stores matching the next loads' low 12 address bits (4 KiB aliasing)."""
    if offset is None:
        return a
    b = _out_like(a, offset)
    b[...] = a
    return b


def _spread(x: np.ndarray, data: str) -> np.ndarray:
    """x as --data asks: itself (normal), 8 x (wide), or every finite 16-bit code equally likely."""
    if data == "normal":
        return x
    if data == "wide":
        return (x.astype(np.float32) * 8).astype(x.dtype)
    if x.itemsize != 2:
        raise SystemExit(f"--data codes: 16-bit dtypes only, got {x.dtype}")
    c = np.random.default_rng(1).integers(0, 65536, 2 * x.size, dtype=np.uint16)
    top = 31 << 10 if x.dtype == np.float16 else 255 << 7  # the exponent field all ones: Inf / NaN
    return c[(c & top) != top][:x.size].reshape(x.shape).view(x.dtype)


def _ag_calls(mod, op: str, x: np.ndarray, out: np.ndarray, kw: dict, offset):
    """The autograd's kernels on x, out= given."""
    if op in ("ag_tanh", "ag_exp"):
        fn = getattr(mod, op[2:])
        return lambda: fn(x, out=out, **kw)
    g = _out_like(x, offset)
    g[...] = x[::-1]
    if op == "ag_gelu_erf_bwd":
        return lambda: mod.gelu_erf_bwd(g, x, out, **kw)
    h = x.shape[1] // 2  # ag_glu2_bwd_<act>: a, b the halves of x, dy (rows, h), each its own array
    a, b, dy, da, db = (_out_like(x[:, :h], offset) for _ in range(5))
    a[...], b[...], dy[...] = x[:, :h], x[:, h:], g[:, :h]
    act = op[len("ag_glu2_bwd_"):]
    return lambda: mod.glu2_bwd(dy, a, b, da, db, act=act, **kw)


def _tex_calls(mod, op: str, dtype: str, rows: int, offset=None, width: int = 4096, data: str = "normal"):
    """The tex_* cases on (rows, width) (tex_softmax*: scale 0.125, a 20 % uint8 mask, causal
    square blocks), out= as for the other cases."""
    rng = np.random.default_rng(0)
    x = _spread(rng.standard_normal((rows, width), np.float32).astype(dtype), data)
    x, bf = _native(_placed(x, offset))
    kw = {"dtype": bf} if bf else {}
    out = _out_like(x, offset)
    if op.startswith("ag_"):
        return _ag_calls(mod, op, x, out, kw, offset)
    if op.startswith("tex_dglu_"):  # TE's gated derivatives (dswiglu: tex_dglu_silu): [a | b] rows, grad (rows, 2048)
        g = _out_like(x[:, :width // 2], offset)
        g[...] = x[::-1, width // 4:width // 4 + width // 2]
        kind = mod.DACT_CODES[op[len("tex_dglu_"):]]
        return lambda: mod.dglu(g, x, out, kind, **kw)
    if op.startswith("tex_d"):  # tex_d<act>, tex_dbias_d<act>
        g = _out_like(x, offset)
        g[...] = x[::-1]
        kind = mod.DACT_CODES[op.rsplit("_d", 1)[1]]
        db = np.zeros(width, np.float32) if op.startswith("tex_dbias_d") else None
        return lambda: mod.dact(g, x, out, kind, db, **kw)
    if op in ("tex_rms_norm_bwd", "tex_layer_norm_bwd"):  # dx, dgamma (+ dbeta) from dz, x
        dz = _out_like(x, offset)
        dz[...] = x[::-1]
        gamma = _placed(np.ones(width, np.float32).astype(dtype), offset)
        gamma = _native(gamma)[0]
        rs = np.ones(rows, np.float32)
        dg = np.empty_like(gamma)
        if op == "tex_rms_norm_bwd":
            return lambda: mod.rms_norm_bwd(dz, x, rs, gamma, out, dg, **kw)
        mu, db = np.zeros(rows, np.float32), np.empty_like(gamma)
        return lambda: mod.layer_norm_bwd(dz, x, mu, rs, gamma, out, dg, db, **kw)
    if op == "tex_sgd":  # multi_tensor_sgd's step on one flat tensor: momentum 0.9, wd 1e-3 (in place)
        p, buf = x.reshape(-1), _out_like(x, offset).reshape(-1)
        buf[...] = 0
        g = _out_like(x, offset)
        g[...] = x[::-1]
        return lambda: mod.sgd_step(g.reshape(-1), p, buf, 1e-3, 0.9, 0.0, 1e-3, False, False, False, 1.0, **kw)
    if op == "tex_adam":  # AdamW on one flat tensor, fp32 moments (in place)
        p = x.reshape(-1)
        g = _out_like(x, offset).reshape(-1)
        g[...] = p[::-1]
        m, v = np.zeros(p.size, np.float32), np.zeros(p.size, np.float32)
        return lambda: mod.adam_step(g, p, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, 0.001, 1, 0.01, None, **kw)
    if op == "tex_softmax_bwd":
        dy = _out_like(x, offset)
        dy[...] = x[::-1]
        return lambda: mod.tex_softmax_bwd(dy, x, out, 0.125, **kw)
    mode, heads, sq = TEX_SOFTMAX[op]
    if mode == 2:
        sq = width  # causal: square blocks
    sq = rows // heads if not sq or rows % sq else sq  # small --rows: one causal block
    mask = (rng.random((1, sq, width)) < 0.2).astype(np.uint8) if mode == 1 else None
    return lambda: mod.tex_softmax(x, out, 0.125, mode, mask, heads, sq, 0, **kw)


def calls(mod, op: str, dtype: str, rows: int, offset=None, width: int = 4096, data: str = "normal"):
    """A no-argument call of ``op`` on ``mod`` with the benchmark's case, out= given (np.empty's,
    or ``offset`` bytes past a 64-byte boundary)."""
    if op.startswith(("tex_", "ag_")):
        return _tex_calls(mod, op, dtype, rows, offset, width, data)
    case = bench_case(op, dtype, rows)
    x, bf = _native(_placed(_spread(case.x, data), offset))
    args = [_native(_placed(a, offset))[0] if isinstance(a, np.ndarray) else a for a in case.args]
    kw = {"dtype": bf} if bf else {}
    outs = case.empty_out()
    if offset is not None:
        outs = tuple(_out_like(o, offset) for o in outs) if isinstance(outs, tuple) else _out_like(outs, offset)
    if isinstance(outs, tuple):
        o1, o2 = (_native(o)[0] for o in outs)
        return lambda: getattr(mod, case.op)(x, *args, out=o1, residual_out=o2, **kw)
    o = _native(outs)[0]
    return lambda: getattr(mod, case.op)(x, *args, out=o, **kw)


def main(argv=None) -> None:
    from tensor_ops import _cpp
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("other", help="the other build's _cpp*.so (the base of the comparison)")
    ap.add_argument("--ops", nargs="+", default=["rms_norm", "layer_norm", "softmax", "silu", "rope"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--width", type=int, default=4096,
                    help="row length of the tex_* cases (TE's training norms: 1024); the facade cases keep theirs")
    ap.add_argument("--copies", type=int, default=2, help="loaded copies of each build (see above)")
    ap.add_argument("--out-offset", type=int, default=None,
                    help="every array at page + 64 + this (0: aligned, as torch's); "
                         "default: where np.empty puts them (16 past)")
    ap.add_argument("--data", choices=["normal", "wide", "codes"], default="normal",
                    help="x standard normal, 8 x that, or every finite 16-bit code equally likely")
    ap.add_argument("--tune-other", nargs="*", default=[], metavar="KEY=INT",
                    help="_set_tuning keywords for the other build's copies (e.g. norm_w16=0): with "
                         "this build's own .so as the other, an A/B of an import-time choice")
    args = ap.parse_args(argv)
    tune = {}
    for kv in args.tune_other:
        key, sep, val = kv.partition("=")
        if not sep or not val.lstrip("-").isdigit():
            raise SystemExit(f"ab_builds: --tune-other takes KEY=INT, got {kv!r}")
        tune[key] = int(val)
    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for name, path in (("other", args.other), ("this", _cpp.__file__)):
            mods = []  # both builds loaded the same way (the imported tensor_ops._cpp is not timed)
            for c in range(max(1, args.copies)):
                copy = os.path.join(tmp, f"{name}{c}_" + os.path.basename(path))
                shutil.copyfile(path, copy)
                mods.append(load_other(copy))
                if name == "other" and tune:
                    mods[-1]._set_tuning(**tune)
            builds[name] = mods
        fns = {(op, dt, name, c): calls(m, op, dt, args.rows, args.out_offset, args.width, args.data)
               for op in args.ops for dt in args.dtypes for name, mods in builds.items() for c, m in enumerate(mods)}
        t = _bench.time_rounds(fns, 0, args.rounds)
    print(f"# this build: {_cpp.__file__}\n# other: {args.other} {tune or ''}\n# {args.rounds} interleaved rounds, "
          f"{len(builds['this'])} loaded copies of each build; speed = other's time / this time (median of "
          "per-round ratios of the copies' median times; > 1: this build is faster)")
    print(f"{'op':16s} {'dtype':9s} {'other ms':>9s} {'this ms':>9s} {'speed':>6s}  per-copy ms (other | this)")
    for op in args.ops:
        for dt in args.dtypes:
            per = {name: [t[(op, dt, name, c)] for c in range(len(mods))] for name, mods in builds.items()}
            bad = [x.error for xs in per.values() for x in xs if x.error]
            if bad:
                print(f"{op:16s} {dt:9s} error: {bad[0]}")
                continue
            per_round = {name: _bench.Timing([statistics.median(r) for r in zip(*(x.times for x in xs))])
                         for name, xs in per.items()}
            copies = " | ".join(" ".join(f"{statistics.median(x.times) * 1e3:.2f}" for x in per[name])
                                for name in ("other", "this"))
            speed = _bench.median_ratio(per_round["other"], per_round["this"])
            print(f"{op:16s} {dt:9s} {statistics.median(per_round['other'].times) * 1e3:9.2f} "
                  f"{statistics.median(per_round['this'].times) * 1e3:9.2f} {speed:6.2f}  {copies}")


if __name__ == "__main__":
    main()
