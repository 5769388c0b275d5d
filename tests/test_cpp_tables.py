"""The C++ backend's 16-bit activations over every 16-bit value (cpp_ext/lut16.h).

On AVX2 and the scalar variant, a bf16 operand's act(x) / act'(x) is read from a table of the
kernel's own fp32 function at all 65536 codes instead of computed, and on AVX2 an fp16
operand's too for the dear functions (exact GELU and its backward, tanh, TE's flat
derivatives; lut16.h's use_lut16). A table is only right if
code c holds f(value of c) - an index off by one, a wrong widening or a tail lane that reads
past its row would give another value - so these tests pass every code through every kernel
that reads one, in rows whose length is off the vector width (partial tails):

- the derivatives (TE's d<act>, the gated dglu, the autograd's glu2_bwd and exact-GELU
  backward) compute in fp32 for every storage type and round once, so a bf16 or fp16 call
  must give bit for bit the fp32 call's result on the widened operands, rounded (the fp32
  kernels never read a table);
- the forward activations use cheaper 16-bit forms (vmath.h LP), so they are held to the bf16
  rtol against the float64 oracle instead, with atol 1e-6 where the project's bf16 atol (0.016)
  would hide a table shifted by a code among the small values (all codes pass within 0.39 %
  relative + 1e-6); fp16's exact GELU, geglu and tanh have no 16-bit form outside AVX-512,
  so there they are held to the fp32 kernel's bits as the derivatives are.

Run under every ISA variant by CI (TENSOR_OPS_MAX_ISA=scalar|avx2); AVX-512 builds compute and
must pass the same checks.
"""
from __future__ import annotations

import numpy as np
import pytest

from tensor_ops._ops import tolerance
from tensor_ops.testing import oracles as ref
from tests._helpers import bf16_bits as to_bf16
from tests._helpers import bf16_float as widen
from tests._helpers import cpp_native

pytestmark = pytest.mark.cpp

BF = {"dtype": "bfloat16"}


@pytest.fixture(scope="module")
def C():
    return cpp_native()


class Fmt:
    """How a 16-bit type's codes (uint16 bits) are passed to the kernels and widened."""

    def __init__(self, name: str):
        self.name, self.fp16 = name, name == "float16"
        self.kw = {} if self.fp16 else BF

    def arr(self, bits: np.ndarray) -> np.ndarray:
        return bits.view(np.float16) if self.fp16 else bits

    def bits(self, a: np.ndarray) -> np.ndarray:
        return a.view(np.uint16)

    def widen(self, a: np.ndarray) -> np.ndarray:
        """The kernel operand -> the float32 values it holds."""
        return a.astype(np.float32) if self.fp16 else widen(a)

    def rounded(self, C, want32: np.ndarray) -> np.ndarray:
        """want32 as this build's 16-bit stores round it, as bits: to nearest even, and on the
        avx512bf16 variant, whose vcvtneps2bf16 treats a subnormal fp32 input as zero (simd.h),
        those bf16 values as a zero of their sign."""
        if self.fp16:
            with np.errstate(over="ignore"):
                return want32.astype(np.float16).view(np.uint16)
        want = to_bf16(want32)
        if C.ISA == "avx512bf16":
            sub = (np.abs(want32) < np.float32(2.0 ** -126)) & (want32 != 0)
            want[sub] = np.signbit(want32[sub]).astype(np.uint16) << 15
        return want

    def normal(self, shape, seed: int) -> np.ndarray:
        v = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        return v.astype(np.float16) if self.fp16 else to_bf16(v)


FMTS = [Fmt("bfloat16"), Fmt("float16")]
fmts = pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)


def value64(bits: np.ndarray) -> np.ndarray:
    """bf16 bits -> float64 (signalling NaN codes quietly become NaN)."""
    with np.errstate(invalid="ignore"):
        return widen(bits).astype(np.float64)


def every_code(rows: int, n: int, seed: int) -> np.ndarray:
    """(rows, n) 16-bit codes (uint16) holding all 65536 (shuffled; rows * n >= 65536)."""
    rng = np.random.default_rng(seed)
    reps = -(-rows * n // 65536)
    codes = np.concatenate([rng.permutation(65536) for _ in range(reps)]).astype(np.uint16)
    return codes[: rows * n].reshape(rows, n)


def assert_bits(C, fmt: Fmt, got: np.ndarray, want32: np.ndarray, what: str):
    """got (a 16-bit kernel output) is want32 rounded (Fmt.rounded); NaN where want32 is NaN (any payload)."""
    want, gotb = fmt.rounded(C, want32), fmt.bits(got)
    nan = np.isnan(want32)
    assert np.array_equal(np.isnan(fmt.widen(got)), nan), f"{fmt.name} {what}: NaN positions differ"
    bad = np.flatnonzero((gotb != want) & ~nan)
    assert bad.size == 0, (f"{fmt.name} {what}: {bad.size} values differ from the fp32 kernel's, first at flat "
                           f"index {bad[0]}: {gotb.flat[bad[0]]:#06x} != {want.flat[bad[0]]:#06x}")


def assert_nans_from(got: np.ndarray, *ops: np.ndarray, what: str):
    """Each NaN a bf16 kernel stored (got, bits) is the default NaN or, quiet, the payload of an
    operand at its position: the store did not round a payload (AVX2 rounds these kernels'
    outputs without the NaN case, rowio.h nan_free, since their NaNs have zero low halves).
    Of either sign: IEEE 754 does not interpret a NaN's sign, and AVX-512's 16-bit exact GELU
    returns |x|'s NaN for a NaN x (vmath.h vgelu_erf: keeping the sign cost 2-7 %)."""
    nan = np.isnan(widen(got))
    ok = got == 0xFFC0
    for op in ops:
        ok |= np.isnan(widen(op)) & ((got | 0x8000) == (op | 0x8040))
    bad = np.flatnonzero(nan & ~ok)
    assert bad.size == 0, (f"{what}: {bad.size} NaNs not from an operand, first {got.flat[bad[0]]:#06x} "
                           f"at flat index {bad[0]}")


SHAPES = [(16, 4099), (7, 9363)]  # rows * n >= 65536, n off the vector width


@fmts
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpp_16bit_derivatives_every_code_match_fp32(C, fmt, shape):
    x = fmt.arr(every_code(*shape, seed=1))
    g = fmt.normal(shape, seed=2)
    for name, kind in C.DACT_CODES.items():
        out = np.empty_like(x)
        C.dact(g, x, out, kind, None, **fmt.kw)
        out32 = np.empty(shape, np.float32)
        C.dact(fmt.widen(g), fmt.widen(x), out32, kind, None)
        assert_bits(C, fmt, out, out32, f"d{name}")
        if not fmt.fp16:
            assert_nans_from(out, x, g, what=f"d{name}")
        db = np.zeros(shape[1], np.float32)
        out2 = np.empty_like(x)
        C.dact(g, x, out2, kind, db, **fmt.kw)
        assert np.array_equal(fmt.bits(out2), fmt.bits(out)), f"dbias_d{name}: the stored output differs from d{name}'s"


@fmts
@pytest.mark.parametrize("h", [4099, 9363])
def test_cpp_16bit_gated_derivatives_every_code_match_fp32(C, fmt, h):
    rows = -(-65536 // h)
    a = fmt.arr(every_code(rows, h, seed=3))
    b = fmt.normal((rows, h), seed=4)
    g = fmt.normal((rows, h), seed=5)
    x = np.concatenate([a, b], axis=1)
    w = fmt.widen
    for name, kind in C.DACT_CODES.items():
        out = np.empty_like(x)
        C.dglu(g, x, out, kind, **fmt.kw)
        out32 = np.empty(x.shape, np.float32)
        C.dglu(w(g), w(x), out32, kind)
        assert_bits(C, fmt, out, out32, f"dglu {name}")
    for act in ("silu", "gelu", "gelu_tanh"):
        da, db = C.glu2_bwd(g, a, b, act=act, **fmt.kw)
        da32, db32 = C.glu2_bwd(w(g), w(a), w(b), act=act)
        assert_bits(C, fmt, da, da32, f"glu2_bwd {act} da")
        assert_bits(C, fmt, db, db32, f"glu2_bwd {act} db")
    assert_bits(C, fmt, C.gelu_erf_bwd(g, a, **fmt.kw), C.gelu_erf_bwd(w(g), w(a)), "gelu_erf_bwd")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpp_fp16_forward_every_code_match_fp32(C, shape):
    """fp16 exact GELU, geglu (and the autograd's strided glu2) and tanh read tables on AVX2;
    outside AVX-512 (whose 16-bit exact GELU has its own form, held to the oracle by
    test_cpp.py's every-value test) they compute the fp32 kernel's function, so they round its
    result bit for bit (silu's and tanh-GELU's 16-bit forms differ from fp32's everywhere)."""
    if C.ISA.startswith("avx512"):
        pytest.skip(f"the {C.ISA} variant computes fp16 GELU in its own 16-bit form (test_cpp.py checks it)")
    fmt = FMTS[1]
    x = fmt.arr(every_code(*shape, seed=9))
    x32 = fmt.widen(x)
    assert_bits(C, fmt, C.gelu(x, "none"), C.gelu(x32, "none"), "gelu")
    assert_bits(C, fmt, C._tanh(x), C._tanh(x32), "tanh")
    b = fmt.normal(shape, seed=10)
    xx = np.concatenate([x, b], axis=1)
    assert_bits(C, fmt, C.geglu(xx, "none"), C.geglu(fmt.widen(xx), "none"), "geglu")
    assert_bits(C, fmt, C.glu2(x, b, act="gelu"), C.glu2(x32, fmt.widen(b), act="gelu"), "glu2 gelu")


def _forward_cases(C):
    """name: (the bf16 kernel, its float64 oracle, the |x| below which its result is a finite bf16)."""
    return {
        "silu": (lambda x: C.silu(x, **BF), ref.silu, 1e30),
        "gelu": (lambda x: C.gelu(x, "none", **BF), lambda v: ref.gelu(v, "none"), 1e30),
        "gelu_tanh": (lambda x: C.gelu(x, "tanh", **BF), lambda v: ref.gelu(v, "tanh"), 1e30),
        "relu": (lambda x: C.relu(x, **BF), ref.relu, 1e30),
        # the autograd's exp / tanh kernels (tensor_ops.torch), tables too
        "exp": (lambda x: C._exp(x, **BF), np.exp, 88.0),
        "tanh": (lambda x: C._tanh(x, **BF), np.tanh, 1e30),
    }


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpp_bf16_activations_every_code(C, shape):
    x = every_code(*shape, seed=6)
    xv = value64(x)
    rtol, atol = tolerance("bfloat16")[0], 1e-6
    for name, (fn, oracle, bound) in _forward_cases(C).items():
        finite = np.isfinite(xv) & (np.abs(xv) < bound)
        yb = fn(x)
        y = value64(yb)
        assert np.isnan(y[np.isnan(xv)]).all() and not np.isnan(y[finite]).any(), f"{name}: NaN in, NaN out"
        if name in ("silu", "gelu", "gelu_tanh"):
            assert_nans_from(yb, x, what=name)
        with np.errstate(all="ignore"):
            want = oracle(np.where(finite, xv, 0.0))
        np.testing.assert_allclose(y[finite], want[finite], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("h", [4099])
def test_cpp_bf16_gated_activations_every_code(C, h):
    rows = -(-65536 // h)
    a = every_code(rows, h, seed=7)
    b = FMTS[0].normal((rows, h), seed=8)
    x = np.concatenate([a, b], axis=1)
    av, bv = value64(a), value64(b)
    finite = np.isfinite(av) & (np.abs(av) < 1e30)
    # act(a) * b: the fp32 act's own absolute error (exact GELU: up to 10 fp32 eps, ~9e-7 near
    # a = -5, test_cpp.py) is scaled by |b|, so the forward test's atol 1e-6 is 1e-6 * max(1, |b|)
    # here (a table one code off still moves act(a) by a bf16 step, 0.39 % relative)
    rtol, atol = tolerance("bfloat16")[0], 1e-6 * np.maximum(1.0, np.abs(bv))
    for name, fn, act in (("swiglu", lambda: C.swiglu(x, **BF), ref.silu),
                          ("geglu", lambda: C.geglu(x, "none", **BF), lambda v: ref.gelu(v, "none")),
                          ("geglu_tanh", lambda: C.geglu(x, "tanh", **BF), lambda v: ref.gelu(v, "tanh"))):
        yb = fn()
        y = value64(yb)
        assert np.isnan(y[np.isnan(av)]).all() and not np.isnan(y[finite]).any(), f"{name}: NaN in, NaN out"
        assert_nans_from(yb, a, b, what=name)
        with np.errstate(all="ignore"):
            want = act(np.where(finite, av, 0.0)) * bv
        err, bound = np.abs(y - want)[finite], (rtol * np.abs(want) + atol)[finite]
        assert (err <= bound).all(), (f"{name}: {(err > bound).sum()} values off, worst at a="
                                      f"{av[finite][np.argmax(err / bound)]}: {(err / bound).max():.3f} of the bound")


def relu16_rule(codes: np.ndarray, fp16: bool) -> np.ndarray:
    """relu on 16-bit codes as every variant now stores it (activation.cpp Relu16): x for x > 0,
    -0.0 and NaN (sign and payload kept, quiet bit set), +0.0 for the rest."""
    inf, quiet = (0x7C00, 0x0200) if fp16 else (0x7F80, 0x0040)
    c = codes.astype(np.uint16)
    nan = (c & 0x7FFF) > inf
    keep = (c.view(np.int16) > 0) | (c == 0x8000)
    return np.where(nan, c | quiet, np.where(keep, c, 0)).astype(np.uint16)


@fmts
@pytest.mark.parametrize("start", [0, 1, 2, 3], ids=lambda s: f"start{s}")
@pytest.mark.parametrize("nt", [False, True], ids=["cached", "streamed"])
def test_cpp_16bit_relu_every_code_by_the_rule(C, fmt, start, nt):
    """The 16-bit relu works on the codes (no widening, no rounding): every code, in rows and
    chunks that start on each 2-byte offset (the fp32-lane loop needs its output on a 4-byte
    boundary: an odd start runs one element alone) and end off the vector width, single- and
    multi-threaded, with cached and with streaming stores. Bitwise the widen / max / round form
    wherever that kept payloads (AVX2, AVX-512), and the same rule on every variant."""
    codes = every_code(9, 9363, seed=start + 11)
    x = np.concatenate([codes, codes[:, :5]], axis=1)[:, start:start + 9363 + 2]
    old = C.build_info()
    try:
        C._set_tuning(0 if nt else -1, 0 if nt else -1)  # threads and streaming stores from the smallest call
        got = C.relu(fmt.arr(np.ascontiguousarray(x)), **fmt.kw)
        flat = C.relu(fmt.arr(np.ascontiguousarray(x).reshape(-1)[start:]), **fmt.kw)
    finally:
        C._set_tuning(old["parallel_threshold_bytes"], old["nontemporal_threshold_bytes"])
    want = relu16_rule(np.ascontiguousarray(x), fmt.fp16)
    np.testing.assert_array_equal(fmt.bits(got), want)
    np.testing.assert_array_equal(fmt.bits(flat), want.reshape(-1)[start:])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpp_fp16_tables_either_way_bitwise(C, shape):
    """AVX2's fp16 kernels of the cheaper functions read them from a table on a Zen 1 and
    compute them elsewhere (build_info()["fp16_tables_all"], chosen at import; lut16.h
    lut_flex): the table is the kernel's own function, so both give the same bits for every
    code - the forward activations, the autograd's exp and glu2, the gated backward (the
    autograd's and TE's dglu). Elsewhere (AVX-512, scalar) the flag changes no kernel."""
    x = every_code(*shape, seed=21).view(np.float16)
    b = FMTS[1].normal(shape, seed=22)
    xx = np.concatenate([x, b], axis=1)
    g = FMTS[1].normal(shape, seed=23)

    def dglu(kind):
        y = np.empty_like(xx)
        C.dglu(g, xx, y, C.DACT_CODES[kind])
        return y

    calls = {"silu": lambda: C.silu(x), "gelu_tanh": lambda: C.gelu(x, "tanh"), "exp": lambda: C._exp(x),
             "swiglu": lambda: C.swiglu(xx), "geglu_tanh": lambda: C.geglu(xx, "tanh"),
             **{f"glu2 {a}": (lambda a=a: C.glu2(x, b, act=a)) for a in ("silu", "gelu_tanh")},
             **{f"glu2_bwd {a}": (lambda a=a: np.concatenate(C.glu2_bwd(g, x, b, act=a), axis=1))
                for a in ("silu", "gelu_tanh")},
             **{f"dglu {k}": (lambda k=k: dglu(k)) for k in ("silu", "gelu", "qgelu", "sigmoid")}}
    old = int(C.build_info()["fp16_tables_all"])
    assert C.build_info()["fp16_tables_all"] == C.build_info()["cpu_supports"]["halves_256"]
    try:
        got = {}
        for on in (0, 1):
            C._set_tuning(f16_lut=on)
            got[on] = {k: f().view(np.uint16) for k, f in calls.items()}
    finally:
        C._set_tuning(f16_lut=old)
    for k in calls:
        np.testing.assert_array_equal(got[1][k], got[0][k], err_msg=f"{k}: the table and the computed form")


def drelu16_rule(g: np.ndarray, x: np.ndarray, fp16: bool) -> np.ndarray:
    """TE's drelu, g * (x > 0), on 16-bit codes as every variant stores it (tex_train.cpp
    Drelu16): g where x > 0, else a zero of g's sign (the default NaN for an infinite g); a NaN
    g stays NaN, quiet bit set."""
    inf, quiet, dnan = (0x7C00, 0x0200, 0xFE00) if fp16 else (0x7F80, 0x0040, 0xFFC0)
    g, x = g.astype(np.uint16), x.astype(np.uint16)
    gm = g & 0x7FFF
    xpos = (x.view(np.int16) > 0) & ((x & 0x7FFF) <= inf)
    r = np.where(xpos, g, np.where(gm == inf, dnan, g & 0x8000))
    return np.where(gm > inf, g | quiet, r).astype(np.uint16)


@fmts
@pytest.mark.parametrize("start", [0, 1], ids=lambda s: f"start{s}")
@pytest.mark.parametrize("nt", [False, True], ids=["cached", "streamed"])
def test_cpp_16bit_drelu_every_code_by_the_rule(C, fmt, start, nt):
    """TE's flat 16-bit drelu works on the codes: every g code against shuffled x codes, and
    every pair of the special values (zeros, subnormals, ones, infinities, quiet and signalling
    NaNs of both signs), on both 2-byte offsets of the output, with cached and streaming stores."""
    sp = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x3C00 if fmt.fp16 else 0x3F80, 0xBC00 if fmt.fp16 else 0xBF80,
                   0x7C00 if fmt.fp16 else 0x7F80, 0xFC00 if fmt.fp16 else 0xFF80,
                   0x7E01 if fmt.fp16 else 0x7FC1, 0xFC01 if fmt.fp16 else 0xFF81], np.uint16)
    g = np.concatenate([every_code(9, 9363, seed=31).reshape(-1), np.repeat(sp, sp.size)])
    x = np.concatenate([every_code(9, 9363, seed=32).reshape(-1), np.tile(sp, sp.size)])
    g, x = g[start:], x[start:]
    old = C.build_info()
    try:
        C._set_tuning(0 if nt else -1, 0 if nt else -1)
        y = np.empty_like(fmt.arr(g))
        C.dact(fmt.arr(g), fmt.arr(x), y, C.DACT_CODES["relu"], None, **fmt.kw)
    finally:
        C._set_tuning(old["parallel_threshold_bytes"], old["nontemporal_threshold_bytes"])
    np.testing.assert_array_equal(fmt.bits(y), drelu16_rule(g, x, fmt.fp16))


@pytest.mark.parametrize("scalar", ["lr", "momentum", "dampening", "wd", "scale"])
def test_cpp_bf16_sgd_nan_scalar_payload_stays_nan(C, scalar):
    """A NaN scalar whose low half is all ones (the payload of struct's b'\\xff' * 8) makes every
    bf16 parameter and momentum NaN. AVX2's bf16 stores round without the NaN case
    (variant.h st_num), so sgd_k keeps only a NaN scalar's high half (bf16_nan_high): without it
    that payload's rounding carried into the sign bit and stored zeros."""
    import struct

    nan = struct.unpack("<d", b"\xff" * 8)[0]
    kw = {"wd": 1e-2, "momentum": 0.9, "dampening": 0.1, "lr": 1e-3, "scale": 1.0, scalar: nan}
    rng = np.random.default_rng(0)
    g, p, buf = (to_bf16(rng.standard_normal(1000).astype(np.float32)).view(np.int16) for _ in range(3))
    C.sgd_step(g, p, buf, kw["wd"], kw["momentum"], kw["dampening"], kw["lr"], False, False, False, kw["scale"],
               dtype="bfloat16")
    assert np.isnan(widen(p.view(np.uint16))).all(), "p"
    if scalar != "lr":
        assert np.isnan(widen(buf.view(np.uint16))).all(), "momentum"
