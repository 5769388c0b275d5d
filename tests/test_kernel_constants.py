"""The numeric constants the three kernel languages share must agree.

The C++ (cpp_ext/*.h|cpp), OpenCL (opencl_ext/*.cl) and CUDA (cuda_ext/*.cu*) kernels each
write their math constants as literals. Read from the sources (no build, no device needed)
by regexes on the named functions and macros that hold them, and checked against the
reference values written once here:

- the erf rational approximation x P(x^2) / Q(x^2) on [-4, 4] (the Eigen / XLA fp32 form):
  C++ ``verf``, OpenCL ``HERF_BODY`` (P halved by ``0.5f *``: herf = erf / 2). CUDA calls
  ``erff`` and has no copy;
- the same rational folded with 1/sqrt(2) for exact GELU's fp32 form (C++ ``verf_sqrt_half``:
  erf(x/sqrt2) = x P'(x^2) / Q'(x^2) with P'_k = P_k / (sqrt2 2^k), Q'_k = Q_k / 2^k, x clamped to
  [-6, 4 sqrt2]);
- the GELU constants 1/sqrt(2) (C++: recovered from ``verf_sqrt_half``'s P', OpenCL
  ``GELU8``/``GELU1``, CUDA ``gelu_erf_f``), sqrt(2/pi) and 0.044715 (CUDA ``gelu_tanh_f`` as written; C++
  ``vgelu_tanh`` folded with -2 log2(e) for its 2^v; OpenCL ``GELU_TANH8``/``GELU_TANH1``
  folded with -2), recovered from each form;
- the exp constants: log2(e) (C++ ``vexp_reduced`` and ``vsilu``, OpenCL ``EXP_BODY``) and
  ln2 (C++: a Cody-Waite hi/lo pair whose sum is ln2; OpenCL: ln2 rounded to fp32, one FMA).

Not shared, so not compared: the exp polynomials. C++ ``vexp_reduced`` uses a degree-6
polynomial for e^r and ``vexp2_fast`` a degree-6 one for 2^f (AVX2: ``vpow2_d5c``, degree 5;
16-bit outputs: ``vpow2_d3c`` / ``vpow2_d3``, degree 3); OpenCL ``EXP_BODY`` a degree-5
one (EXP_C5..EXP_C2, fewer operations for PoCL); CUDA calls ``expf``. Each is only checked
to approximate its function to its documented accuracy (which catches a gross edit, not a
last-digit one).

A literal's sign is read with it: ``q * x2 - 2.1e-04f`` is the coefficient -2.1e-04, as in
``vfma(q, x2, vset(-2.1e-04f))``. The folders are globbed (file names may change); each
named definition must occur exactly once per language.
"""
from __future__ import annotations

import glob
import math
import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANGS = {
    "cpp": ("cpp_ext/*.h", "cpp_ext/*.cpp"),
    "opencl": ("opencl_ext/*.cl",),
    "cuda": ("cuda_ext/*.cu*",),
}

# Eigen's generic_fast_erf_float / XLA's fp32 erf: erf(x) = x P(x^2) / Q(x^2), |x| <= 4.
# Highest power first, as the Horner loops are written.
ERF_P = [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
         -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02]
ERF_Q = [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
         -1.42647390514189e-02]
ERF_CLAMP = 4.0
INV_SQRT2 = 1.0 / math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
REL = 1e-12  # the literals are written with 13-18 significant digits

_NUM = r"(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
# A literal with the sign in front of it (unary or binary minus: both negate the term).
_SIGNED = re.compile(r"(?<![\w.])(?:(-)\s*)?(" + _NUM + r")[fF]?(?![\w.])")


def load_sources(root: str = ROOT) -> dict:
    """{lang: {relative path: text}} for every kernel source file."""
    out = {}
    for lang, patterns in LANGS.items():
        files = sorted({p for pat in patterns for p in glob.glob(os.path.join(root, pat))})
        out[lang] = {os.path.relpath(p, root): open(p, encoding="utf-8").read() for p in files}
    return out


def _one(matches: list, what: str, lang: str):
    assert len(matches) == 1, f"{lang}: expected one definition of {what}, found {len(matches)}"
    return matches[0]


def function_body(src: dict, lang: str, name: str) -> str:
    """The {...} body of the C++/CUDA function `name` (braces matched)."""
    found = []
    for text in src[lang].values():
        for m in re.finditer(r"\b" + re.escape(name) + r"\s*\([^;{}]*\)\s*(?:const\s*)?\{", text):
            depth, i = 0, m.end() - 1
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    found.append(text[i:j + 1])
                    break
    return _one(found, name, lang)


def macro_body(src: dict, lang: str, name: str) -> str:
    """The replacement text of the #define `name` (continuation lines joined)."""
    found = []
    for text in src[lang].values():
        found += re.findall(r"^[ \t]*#define[ \t]+" + re.escape(name) + r"\b((?:.*\\\n)*.*)", text, re.M)
    return _one(found, name, lang)


def literals(body: str) -> list:
    """Every numeric literal of a body, in order, with its sign."""
    return [(-1.0 if m.group(1) else 1.0) * float(m.group(2)) for m in _SIGNED.finditer(body)]


def only(values: list, lo: float, hi: float, what: str, count: int = 1) -> list:
    """The literals with lo < |v| < hi; there must be exactly `count` of them."""
    got = [v for v in values if lo < abs(v) < hi]
    assert len(got) == count, f"{what}: expected {count} literal(s) with {lo} < |v| < {hi}, got {got}"
    return got


def close(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= REL * abs(want), f"{what}: {got!r} != {want!r}"


# ---------------------------------------------------------------------------- collectors
def erf_coefficients(src: dict) -> dict:
    """{lang: (P, Q, clamps)} as written; OpenCL's P un-halved (checked to be halved)."""
    out = {}
    lits = literals(function_body(src, "cpp", "verf"))
    coef = only(lits, 0.0, 0.1, "cpp verf P and Q", len(ERF_P) + len(ERF_Q))
    out["cpp"] = (coef[:len(ERF_P)], coef[len(ERF_P):], [v for v in lits if abs(v) == ERF_CLAMP])
    body = macro_body(src, "opencl", "HERF_BODY")
    lits = literals(body)
    coef = only(lits, 0.0, 0.1, "opencl HERF_BODY P and Q", len(ERF_P) + len(ERF_Q))
    halved = [(-1.0 if s else 1.0) * float(v) for s, v in
              re.findall(r"0\.5f?\s*\*\s*(?:(-)\s*)?(" + _NUM + r")f?", body)]
    assert halved == coef[:len(ERF_P)], f"opencl HERF_BODY: P must be written as 0.5f * P[i], got {halved}"
    out["opencl"] = (coef[:len(ERF_P)], coef[len(ERF_P):], [v for v in lits if abs(v) == ERF_CLAMP])
    return out


def folded_erf(src: dict) -> tuple:
    """C++ ``verf_sqrt_half`` as written: (P', Q', clamps), P' and Q' highest power first."""
    lits = literals(function_body(src, "cpp", "verf_sqrt_half"))
    coef = only(lits, 0.0, 0.1, "cpp verf_sqrt_half P' and Q'", len(ERF_P) + len(ERF_Q))
    return coef[:len(ERF_P)], coef[len(ERF_P):], [v for v in lits if abs(v) >= 1.0]


def gelu_constants(src: dict) -> dict:
    """{(lang, where): (1/sqrt2 or None, sqrt(2/pi) or None, 0.044715 or None)}."""
    out = {}
    p = folded_erf(src)[0]   # 1/sqrt2 from the constant term, P'_0 = P_0 / sqrt2 (the others: check_shared)
    out[("cpp", "verf_sqrt_half")] = (p[-1] / ERF_P[-1], None, None)
    # C++ folds -2 sqrt(2/pi) log2(e) (c2) and its product with 0.044715 (c1) for vexp2_fast
    lits = literals(function_body(src, "cpp", "vgelu_tanh_arg"))
    c1 = only(lits, 0.05, 0.2, "cpp vgelu_tanh_arg c1")[0]
    c2 = only(lits, 2.0, 3.0, "cpp vgelu_tanh_arg c2")[0]
    out[("cpp", "vgelu_tanh_arg")] = (None, -c2 / (2.0 * LOG2E), c1 / c2)
    for name in ("GELU8", "GELU1"):
        out[("opencl", name)] = (only(literals(macro_body(src, "opencl", name)), 0.7, 0.72, f"opencl {name}")[0],
                                 None, None)
    for name in ("GELU_TANH8", "GELU_TANH1"):  # a = -2 sqrt(2/pi) 0.044715, b = -2 sqrt(2/pi)
        lits = literals(macro_body(src, "opencl", name))
        a = only(lits, 0.05, 0.1, f"opencl {name} a")[0]
        b = only(lits, 1.5, 1.7, f"opencl {name} b")[0]
        out[("opencl", name)] = (None, -b / 2.0, a / b)
    out[("cuda", "gelu_erf_f")] = (only(literals(function_body(src, "cuda", "gelu_erf_f")), 0.7, 0.72,
                                        "cuda gelu_erf_f")[0], None, None)
    lits = literals(function_body(src, "cuda", "gelu_tanh_f"))
    out[("cuda", "gelu_tanh_f")] = (None, only(lits, 0.78, 0.8, "cuda sqrt(2/pi)")[0],
                                    only(lits, 0.04, 0.05, "cuda 0.044715")[0])
    return out


def exp_constants(src: dict) -> dict:
    """{(lang, where): {"log2e": .., "ln2": ..}}; "ln2" is hi + lo for a Cody-Waite pair."""
    out = {}
    lits = literals(function_body(src, "cpp", "vexp_reduced"))
    hi = only(lits, 0.69, 0.7, "cpp vexp_reduced ln2 hi")[0]
    lo = only(lits, 1e-4, 1e-3, "cpp vexp_reduced ln2 lo")[0]
    out[("cpp", "vexp_reduced")] = {"log2e": only(lits, 1.4, 1.5, "cpp vexp_reduced log2(e)")[0],
                                    "ln2": hi + lo, "ln2_hi": hi}
    out[("cpp", "vneg_log2e")] = {"log2e": -only(literals(function_body(src, "cpp", "vneg_log2e")), 1.4, 1.5,
                                                 "cpp vneg_log2e -log2(e)")[0]}
    lits = literals(macro_body(src, "opencl", "EXP_BODY"))
    out[("opencl", "EXP_BODY")] = {"log2e": only(lits, 1.4, 1.5, "opencl EXP_BODY log2(e)")[0],
                                   "ln2": -only(lits, 0.69, 0.7, "opencl EXP_BODY -ln2")[0]}
    return out


def horner_cpp(src: dict, name: str) -> list:
    """Coefficients of the `V p = vset(c); p = vfma(p, r, vset(c)) ...` chain of `name`."""
    body = function_body(src, "cpp", name)
    lit = r"vset\(\s*((?:-\s*)?" + _NUM + r")f?\s*\)"
    first = re.search(r"\bV\s+p\s*=\s*" + lit, body)
    steps = re.findall(r"vfma\(\s*p\s*,\s*\w+\s*,\s*" + lit, body)
    assert first and steps, f"cpp {name}: no Horner chain found"
    return [float(first.group(1).replace(" ", ""))] + [float(s.replace(" ", "")) for s in steps]


# ---------------------------------------------------------------------------- checks
def check_shared(src: dict) -> None:
    """Raise AssertionError when a shared constant differs from the reference anywhere."""
    for lang, (p, q, clamps) in erf_coefficients(src).items():
        assert p == ERF_P, f"{lang}: erf P {p} != {ERF_P}"
        assert q == ERF_Q, f"{lang}: erf Q {q} != {ERF_Q}"
        assert sorted(set(clamps)) == [-ERF_CLAMP, ERF_CLAMP], f"{lang}: erf clamp {clamps} is not +-{ERF_CLAMP}"
    p, q, clamps = folded_erf(src)
    deg_p, deg_q = len(ERF_P) - 1, len(ERF_Q) - 1
    for i, (got, ref) in enumerate(zip(p, ERF_P)):
        close(got, ref * INV_SQRT2 / 2 ** (deg_p - i), f"cpp verf_sqrt_half: P'[{i}] (P / (sqrt2 2^k))")
    for i, (got, ref) in enumerate(zip(q, ERF_Q)):
        close(got, ref / 2 ** (deg_q - i), f"cpp verf_sqrt_half: Q'[{i}] (Q / 2^k)")
    assert len(clamps) == 2 and clamps[1] == -6.0, f"cpp verf_sqrt_half: clamps {clamps} are not (4 sqrt2, -6)"
    close(clamps[0], ERF_CLAMP * math.sqrt(2.0), "cpp verf_sqrt_half: upper clamp 4 sqrt2")
    for (lang, where), (inv_sqrt2, s, k) in gelu_constants(src).items():
        if inv_sqrt2 is not None:
            close(inv_sqrt2, INV_SQRT2, f"{lang} {where}: 1/sqrt(2)")
        if s is not None:
            close(s, SQRT_2_OVER_PI, f"{lang} {where}: sqrt(2/pi)")
            close(k, GELU_CUBIC, f"{lang} {where}: the cubic coefficient")
    for (lang, where), c in exp_constants(src).items():
        close(c["log2e"], LOG2E, f"{lang} {where}: log2(e)")
        if lang == "cpp" and "ln2" in c:  # Cody-Waite: the sum is ln2, hi has few bits (n*hi exact)
            close(c["ln2"], LN2, f"{lang} {where}: ln2 hi + lo")
            assert (c["ln2_hi"] * 2 ** 11).is_integer(), f"{lang} {where}: ln2 hi {c['ln2_hi']} has too many bits"
        elif "ln2" in c:  # one FMA with ln2 rounded to fp32
            assert c["ln2"] == float(np.float32(LN2)), f"{lang} {where}: ln2 {c['ln2']!r} is not fp32(ln2)"


@pytest.fixture(scope="module")
def sources():
    src = load_sources()
    for lang, files in src.items():
        if not files:
            pytest.fail(f"no {lang} kernel sources under {LANGS[lang]}")
    return src


def test_shared_constants_agree(sources):
    check_shared(sources)


def test_every_copy_is_read(sources):
    """The collectors found every place a shared constant is written (none skipped)."""
    assert set(erf_coefficients(sources)) == {"cpp", "opencl"}
    assert {lang for lang, _ in gelu_constants(sources)} == {"cpp", "opencl", "cuda"}
    assert {lang for lang, _ in exp_constants(sources)} == {"cpp", "opencl"}


# A one-digit edit (within the first 10 significant digits: what can change the fp32 value)
# of one copy of each shared constant: check_shared must notice every one.
MUTATIONS = [
    ("cpp", "-1.60960333262415e-02f", "-1.60960333262416e-02f"),      # erf P, C++
    ("opencl", "2.77068142495902e-08f", "2.77068142495903e-08f"),     # erf P (halved), OpenCL
    ("opencl", "q * x2 - 1.68282697438203e-03f", "q * x2 - 1.68282697438213e-03f"),  # erf Q
    ("cpp", "vset(4.0f), vmax(vset(-4.0f)", "vset(4.5f), vmax(vset(-4.0f)"),  # erf clamp
    ("cpp", "-1.04460878015564e-03f", "-1.04460878025564e-03f"),  # folded P'
    ("cpp", "-2.66717569098631e-05f", "-2.66717579098631e-05f"),  # folded Q'
    ("cpp", "vset(5.65685424949238f)", "vset(5.65685524949238f)"),     # folded clamp 4 sqrt2
    ("cuda", "0.70710678118654752f", "0.70710678128654752f"),         # 1/sqrt(2)
    ("opencl", "0.70710678118654752f", "0.70710679118654752f"),
    ("cpp", "-0.10294323958002349f", "-0.10294323968002349f"),        # folded 0.044715
    ("opencl", "-0.0713548162726f", "-0.0713548162736f"),
    ("cuda", "0.044715f", "0.044716f"),
    ("cuda", "0.79788456080286536f", "0.79788456180286536f"),         # sqrt(2/pi)
    ("cpp", "-2.3022081981443252f", "-2.3022081991443252f"),
    ("cpp", "x * vset(-1.44269504088896341f)", "x * vset(-1.44269504188896341f)"),  # log2(e), vneg_log2e
    ("opencl", "-0.693147182464599609f", "-0.693147192464599609f"),   # ln2
    ("cpp", "vset(-2.12194440e-4f)", "vset(-2.12194441e-4f)"),        # ln2 lo
]


@pytest.mark.parametrize("lang,old,new", MUTATIONS, ids=[f"{m[0]}:{m[1].strip()[:28]}" for m in MUTATIONS])
def test_an_edited_copy_is_caught(sources, lang, old, new):
    hits = [(path, text) for path, text in sources[lang].items() if old in text]
    assert hits, f"{old!r} not found in the {lang} sources (update MUTATIONS)"
    path, text = hits[0]
    mutated = {k: dict(v) for k, v in sources.items()}
    mutated[lang][path] = text.replace(old, new, 1)
    with pytest.raises(AssertionError):
        check_shared(mutated)


# ---------------------------------------------------------------------------- not shared
def test_unshared_exp_polynomials_hold_their_accuracy(sources):
    """The exp polynomials differ by design (see the module docstring); each must still
    approximate its function on its reduced range (float64 evaluation: the fit's own error)."""
    r = np.linspace(-LN2 / 2, LN2 / 2, 20001)
    f = np.linspace(-0.5, 0.5, 20001)
    exp_c = horner_cpp(sources, "vexp_reduced")
    assert len(exp_c) == 7  # degree 6
    exp2_c = horner_cpp(sources, "vexp2_fast")
    assert len(exp2_c) == 7
    # AVX2's 2^f on [-1/2, 1/2] (vexp2_fast's and softmax's fp32 form, degree 5; the 16-bit
    # outputs' degree 3) and the degree-3 form on [0, 1): vmath.h documents 2.3e-7 / 8.6e-5
    d5c, d3c, d3 = (horner_cpp(sources, n) for n in ("vpow2_d5c", "vpow2_d3c", "vpow2_d3"))
    assert (len(d5c), len(d3c), len(d3)) == (6, 4, 4)
    g = np.linspace(0.0, 1.0, 20001, endpoint=False)
    defs = {n: float(v) for src in sources["opencl"].values()
            for n, v in re.findall(r"^#define[ \t]+(EXP_C\d)[ \t]+(" + _NUM + r")f?", src, re.M)}
    ocl_c = [defs["EXP_C5"], defs["EXP_C4"], defs["EXP_C3"], defs["EXP_C2"], 1.0, 1.0]  # degree 5
    for name, coef, x, want, bound in [("cpp vexp_reduced", exp_c, r, np.exp(r), 3e-8),
                                       ("cpp vexp2_fast", exp2_c, f, np.exp2(f), 3e-8),
                                       ("cpp vpow2_d5c", d5c, f, np.exp2(f), 2.3e-7),
                                       ("cpp vpow2_d3c", d3c, f, np.exp2(f), 8.6e-5),
                                       ("cpp vpow2_d3", d3, g, np.exp2(g), 8.6e-5),
                                       ("opencl EXP_BODY", ocl_c, r, np.exp(r), 1.5e-7)]:
        y = np.zeros_like(x)
        for c in coef:
            y = y * x + c
        err = float(np.abs(y / want - 1.0).max())
        assert err < bound, f"{name}: max relative error {err:.3g} >= {bound}"


def test_erf_reference_is_erf():
    """The reference coefficients themselves: erf to ~1e-7 absolute on [-4, 4]."""
    x = np.linspace(-ERF_CLAMP, ERF_CLAMP, 8001)
    x2 = x * x
    p = np.zeros_like(x)
    q = np.zeros_like(x)
    for c in ERF_P:
        p = p * x2 + c
    for c in ERF_Q:
        q = q * x2 + c
    want = np.array([math.erf(v) for v in x])
    assert float(np.abs(x * p / q - want).max()) < 1e-7
