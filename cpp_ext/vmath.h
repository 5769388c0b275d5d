// vmath.h: vectorised transcendental functions on the V type of simd.h (fp32 math).
// Accuracy is checked in tests/test_cpp.py against float64 NumPy/SciPy.
#pragma once
#include "simd.h"

namespace to {
namespace TO_NS {
namespace {

// exp(x), within 2 ulp over the whole fp32 range (test: <= 4 ulp), NaN -> NaN.
// Cody-Waite reduction x = n*ln2 + r with ln2 split in a short high part (exact n*C1 for
// |n| < 2^9) and a correction, so r is accurate to ~1 ulp; e^r on |r| <= ln2/2 by a
// degree-6 polynomial in Horner form (0.84 ulp in fp32 arithmetic on that interval;
// coefficients fitted for relative error with the constant term fixed at 1, so e^0 = 1
// exactly; one FMA fewer than Cephes' degree-7 1 + r + r^2 P(r)). n is rounded as a float
// (one vroundps). x is clamped first (beyond the clamp the result is 0 / Inf anyway); the
// clamp is written min(hi, max(lo, x)) because x86 min/max return their second operand when
// one is NaN, so NaN flows through to p and the result without an extra blend.
// 2^n is applied as two factors 2^(n>>1) * 2^(n - n>>1); each stays a normal float for n
// in [-150, 128], so denormal results, underflow to 0 and overflow to +Inf all come out
// right without a branch. AVX-512: one vscalefps does that exactly for every n.
//
// vexp_reduced is the reduction and polynomial shared by vexp and softmax's exp: it
// returns e^r with xc = fn*ln2 + r; the caller scales by 2^fn.
inline V vexp_reduced(V xc, V& fn) {
    fn = vround(xc * vset(1.44269504088896341f));
    V r = vfnma(fn, vset(0.693359375f), xc);
    r = vfnma(fn, vset(-2.12194440e-4f), r);
    V p = vset(1.3844064670e-3f);
    p = vfma(p, r, vset(8.3741657436e-3f));
    p = vfma(p, r, vset(4.1667994112e-2f));
    p = vfma(p, r, vset(1.6666431725e-1f));
    p = vfma(p, r, vset(4.9999994040e-1f));
    p = vfma(p, r, vset(1.0f));
    return vfma(p, r, vset(1.0f));
}

inline V vexp(V x) {
    V fn, y = vexp_reduced(vmin(vset(88.8f), vmax(vset(-104.0f), x)), fn);
#if TO_ISA == 2
    return vldexp(y, fn);
#else
    VI n = vcvt_i(fn), n1 = vsra1(n);
    return (y * vexp2i(n1)) * vexp2i(n - n1);
#endif
}

// vsplit / vscale2n: vc = n + f with n = round(vc), |f| <= 1/2, for vc in [-127, 128], and
// y * 2^n. AVX2: the magic number 1.5 * 2^23 + 127, whose sum s with vc holds n + 127 in its
// low mantissa bits, so one shift makes 2^n (exactly 0 at n = -127, Inf at 128) and one
// subtraction gives n back: 4 instructions where round, subtract, convert, add the bias and
// shift took 5 (no -ffast-math here, so the compiler keeps (vc + magic) - magic). vexp2_fast
// through it on AVX2: silu fp32 2.688 -> 2.563 instructions per element, tanh-GELU 2.938 ->
// 2.813, swiglu 1.949 -> 1.888 (callgrind); ab_builds.py --copies 3: 0.97-1.05x (fp32 silu,
// tanh-GELU, swiglu), within the method's noise. Elsewhere n itself (vldexp: vscalefps on
// AVX-512; scalar 2^n must be normal).
#if TO_ISA == 1
inline V vsplit(V vc, V& s) {
    const V magic = vset(12583039.0f);
    s = vc + magic;
    return vc - (s - magic);
}
inline V vscale2n(V y, V s) { return y * V{_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(s.v), 23))}; }
#else
inline V vsplit(V vc, V& s) {
    s = vround(vc);
    return vc - s;
}
inline V vscale2n(V y, V s) { return vldexp(y, s); }
#endif

// The activations' 2^v by ISA and output precision. These kernels are bound by their
// instruction count (AVX-512, 1 core, in cache: silu 3.1 ns per 16 fp32 values against the
// 3.2 ns a core's share of the streaming copy allows; fp16 4.2 against 1.6), so on AVX-512
// 2^v = 2^f * 2^floor(v) with f = v - floor(v) from one vreduceps and the scale applied by
// vscalefps, which takes floor(v) itself: no clamp, no round, no subtraction (vreduceps
// gives f = 0 for +-Inf, so 2^-Inf = 0 and 2^Inf = Inf; NaN stays NaN). The polynomial for
// 2^f on [0, 1) (constant term 1, fitted for relative error, fp32 Horner): degree 5,
// 1.7e-7 (silu's and tanh-GELU's bound is 1.3e-6); for 16-bit outputs (half an ulp: 4.9e-4
// fp16, 3.9e-3 bf16) degree 3, 8.6e-5, and the reciprocal estimate vrcp14ps (6.1e-5) for
// the division (3.4 cycles per vector on Zen 4, the longest instruction of the loop). AVX2
// has the degree-3 form for 16-bit outputs too (floor and the exponent bits instead of
// vreduceps and vscalefps), with the division; its fp32 forms and the scalar ones keep
// vexp2_fast. (Exact GELU's 16-bit form below stays AVX-512's: on AVX2 it measured
// 0.87-0.93x the rational erf, ab_builds.py on Zen 3.)
// 2^f on [0, 1), degree 3 (8.6e-5 relative): the 16-bit outputs' form.
inline V vpow2_d3(V f) {
    V p = vset(7.7066143791e-02f);
    p = vfma(p, f, vset(2.2764597125e-01f));
    p = vfma(p, f, vset(6.9511656616e-01f));
    return vfma(p, f, vset(1.0f));
}
#if TO_ISA == 2
inline V vexp2_d5(V v) {
    const V f = {_mm512_reduce_ps(v.v, _MM_FROUND_TO_NEG_INF)};
    V p = vset(1.8671244615e-03f);
    p = vfma(p, f, vset(9.0170421813e-03f));
    p = vfma(p, f, vset(5.5799904666e-02f));
    p = vfma(p, f, vset(2.4016445244e-01f));
    p = vfma(p, f, vset(6.9315131162e-01f));
    return vldexp(vfma(p, f, vset(1.0f)), v);
}
inline V vexp2_d3(V v) {
    const V f = {_mm512_reduce_ps(v.v, _MM_FROUND_TO_NEG_INF)};
    return vldexp(vpow2_d3(f), v);
}
#elif TO_ISA == 1
// AVX2: the same polynomials moved to f in [-1/2, 1/2] for vsplit's rounded n: p(f + 1/2) /
// sqrt(2), re-expanded (degree 3: 8.6e-5 relative as before; degree 5: 2.3e-7; fp32 Horner
// on 2M points), for softmax's vexp2_np. vexp2_d3, the 16-bit activations': f = v - floor(v)
// and the exponent bits, v clamped to [-126, 128] (Inf from 128 on, so silu(-Inf) = -Inf/Inf
// = NaN as the float64 formula; NaN passes, see vexp). (vsplit there instead: one
// instruction fewer per vector, but bf16 swiglu 0.95x, silu 0.97-0.99x, fp16 1.00-1.02x;
// ab_builds.py --copies 3, Zen 3 - our guess, unmeasured: the magic number's two additions
// queue on the FP adder pipes beside the bf16 conversions.)
inline V vpow2_d3c(V f) {
    V p = vset(5.4493993521e-02f);
    p = vfma(p, f, vset(2.4271100760e-01f));
    p = vfma(p, f, vset(6.9336217642e-01f));
    return vfma(p, f, vset(9.9992185831e-01f));
}
inline V vpow2_d5c(V f) {
    V p = vset(1.3202563860e-03f);
    p = vfma(p, f, vset(9.6766520292e-03f));
    p = vfma(p, f, vset(5.5509153754e-02f));
    p = vfma(p, f, vset(2.4022099376e-01f));
    p = vfma(p, f, vset(6.9314682484e-01f));
    return vfma(p, f, vset(1.0000001192e+00f));
}
inline V vexp2_d3(V v) {
    const V vc = vmin(vset(128.0f), vmax(vset(-126.0f), v));
    const V fl = {_mm256_floor_ps(vc.v)};
    return vpow2_d3(vc - fl) * vexp2i(vcvt_i(fl));
}
// 2^v for v <= 0 or NaN (softmax's shifted logits), clamped at -127, where vsplit's 2^n is
// exactly 0: e^-Inf (masked entries) and every result below ~8e-39 come out 0 with no
// compare and blend.
template <bool LP>
inline V vexp2_np(V v) {
    V s, f = vsplit(vmax(vset(-127.0f), v), s);
    return vscale2n(LP ? vpow2_d3c(f) : vpow2_d5c(f), s);
}
#endif
// 2^v, "fast" form, for callers that fold log2(e) into their own constants (silu, tanh-GELU):
// that saves vexp's multiply, and the reduction f = v - round(v) is exact, so one
// subtraction replaces the two-step Cody-Waite correction (3 FMA-pipe instructions become
// 1 add; measured against vexp's route: silu 34.0 -> 40.6 GB/s, tanh-GELU 24.8 -> 33.2 GB/s,
// 1 thread, 16x4096 in cache, AVX-512). Accuracy is that of e^x
// from an x with the same rounding: the argument's own rounding error (|v| * 2^-24
// relative) dominates either way, and these callers only use 2^v inside 1/(1 + 2^v).
// Degree-6 polynomial for 2^f on |f| <= 1/2 (0.93 ulp in fp32 arithmetic; fitted for
// relative error with the constant term 1). AVX2 takes vpow2_d5c instead (degree 5, 2.3e-7
// relative; AVX-512's vexp2_d5 is degree 5 too): one FMA fewer per vector, TE's derivatives
// 1.03-1.07x in bf16 / fp16 and 0.97-1.08x in fp32, fp32 silu / tanh-GELU 1.03 / 0.99x
// (ab_builds.py --copies 3, Zen 3; CONTRIBUTING.md "Zen 3's vector pipes"). Clamped to
// [-126, 128]: 2^n stays a normal float below, and v >= 128 gives f = 0, n = 128, i.e. +Inf
// (the Inf bit pattern, or vscalefps overflowing), so silu(-Inf) = -Inf/Inf = NaN like the
// float64 formula; results below 2^-126 come out as ~1e-38 instead of 0, which 1/(1 + 2^v)
// cannot show.
inline V vexp2_fast(V v) {
    V vc = vmin(vset(128.0f), vmax(vset(-126.0f), v));  // NaN passes through (see vexp)
    V fn, f = vsplit(vc, fn);
#if TO_ISA == 1
    return vscale2n(vpow2_d5c(f), fn);
#else
    V p = vset(1.5353612253e-04f);
    p = vfma(p, f, vset(1.3398883166e-03f));
    p = vfma(p, f, vset(9.6184359863e-03f));
    p = vfma(p, f, vset(5.5503323674e-02f));
    p = vfma(p, f, vset(2.4022647738e-01f));
    p = vfma(p, f, vset(6.9314718246e-01f));
    return vscale2n(vfma(p, f, vset(1.0f)), fn);
#endif
}

// a / (1 + e) with e = 2^v, e >= 0 or NaN; LP: the 16-bit output form above. On AVX2 the
// division stays: vrcpps (3.7e-4 relative, too coarse alone for fp16) with a Newton step
// measured 0.82-0.94x the division (ab_builds.py, Zen 3).
template <bool LP>
inline V vdiv_1p_exp2(V a, V v) {
#if TO_ISA == 2
    if (LP) return a * V{_mm512_rcp14_ps((vset(1.0f) + vexp2_d3(v)).v)};
    return a / (vset(1.0f) + vexp2_d5(v));
#elif TO_ISA == 1
    return a / (vset(1.0f) + (LP ? vexp2_d3(v) : vexp2_fast(v)));
#else
    return a / (vset(1.0f) + vexp2_fast(v));
#endif
}

// Softmax's e^(x - m), m the row's max, so x - m <= 0 (or NaN: a NaN in the row, or +Inf,
// whose Inf - Inf gives a NaN row as the float64 formula does); one definition for the facade
// softmax (softmax.cpp) and TE's scaled softmax (tex_train.cpp). AVX-512: 2^((x - m) log2 e)
// through the activations' polynomials (vexp2_d5; vexp2_d3 for 16-bit outputs, 8.6e-5
// relative against their half ulp of 4.9e-4 / 3.9e-3): two to four fewer instructions than
// vexp's Cody-Waite route, and the argument's rounding (|x - m| 6e-8 relative) only matters
// where e^(x-m) is negligible against the sum (>= 1). e^-Inf (masked entries) is exactly 0:
// vreduceps gives f = 0 for +-Inf and vscalefps 2^-Inf = 0; below 2^-150 the results are 0,
// with subnormals in between. AVX2: vexp2_np, the same route with 2^n made from a
// magic-number sum (degree 5, or 3 for 16-bit outputs; exact 0 below ~8e-39): softmax 4.945
// / 4.369 / 5.617 -> 4.128 / 3.738 / 4.988 instructions per element (fp32 / fp16 / bf16,
// callgrind), 1.15-1.17x (ab_builds.py --copies 3, Zen 3), where it took the Cody-Waite
// route below for fp32. Scalar: the Cody-Waite route, clamped at -87.3 so 2^n stays a
// normal float, and exact 0 below it (dropped results < 1.2e-38 against a sum >= 1).
// (Folding the subtraction into the multiply, x log2e - m log2e as one FMA, was measured and
// dropped: the rounding of m log2e is a shift common to the row, which the normalisation
// cancels, but for |m| near 1e30 that shift is 2^(6e22) and the row overflows.)
// x must be a rounded value: a caller's x = a*scale goes through vopaque (simd.h), or GCC
// contracts it with the subtraction into one FMA, the same unrounded shift (TE's scaled
// softmax of a row with 1e30, scale 3, gave NaN; tests/test_tex_softmax.py).
template <bool LP>
inline V vexp_shift(V x, V m) {
    const V d = x - m;
#if TO_ISA == 2
    const V v = d * vset(1.44269504088896341f);
    return LP ? vexp2_d3(v) : vexp2_d5(v);
#elif TO_ISA == 1
    return vexp2_np<LP>(d * vset(1.44269504088896341f));
#else
    V fn, y = vexp_reduced(vmax(vset(-87.3f), d), fn);
    return vsel(vlt(d, vset(-87.3f)), vset(0.0f), vldexp(y, fn));
#endif
}

// The derivatives' sigmoid pieces from e = 2^v: s = 1/(1 + e) and 1 - s. On AVX-512, e comes
// from vexp2_d5 (vreduceps + vscalefps, as the forward activations) and 1 - s is e*s where
// s >= 1/2, which keeps its relative accuracy as s -> 1 (1 - s cancels there: d/dx silu at
// x = 20 is 1 + 20 (1 - s)); below 1/2 it is 1 - s, exact there, and e may be Inf (s = 0,
// so x = -Inf still gives torch's NaN for silu's derivative, not Inf*0). No 16-bit shortcut (vexp2_d3,
// vrcp14ps) here: the derivatives cross zero (tanh-GELU's near x = -0.75), where s and the
// other term cancel, and those 1e-4 relative errors became 1e-2 relative errors of a 1e-3
// result (TE's tests allow atol 1e-5 for fp16 and bf16 too). AVX2 and scalar keep
// vexp2_fast, the division and 1 - s, as before.
inline void vsig_parts(V v, V& s, V& one_minus_s) {
#if TO_ISA == 2
    const V e = vexp2_d5(v);
    s = vset(1.0f) / (vset(1.0f) + e);
    one_minus_s = vsel(vlt(s, vset(0.5f)), vset(1.0f) - s, e * s);  // NaN: e * s, NaN
#else
    s = vset(1.0f) / (vset(1.0f) + vexp2_fast(v));
    one_minus_s = vset(1.0f) - s;
#endif
}

// x * sigmoid(x) written as x / (1 + e^-x): e^-x -> Inf for very negative x gives the
// correct -0 limit, and silu(-Inf) = -Inf/Inf = NaN matches the float64 formula (with the
// reciprocal estimate: -Inf * rcp(Inf) = -Inf * 0 = NaN too). (A division-free fp32 form,
// 1/(1+e^-|x|) by reciprocal estimate + Newton step, was measured 40% slower.)
// vneg_log2e: the argument v of 2^v = e^-x, shared by silu's forward and its derivatives
// (backward.cpp, through vsig_parts).
inline V vneg_log2e(V x) { return x * vset(-1.44269504088896341f); }
template <bool LP = false>
inline V vsilu(V x) { return vdiv_1p_exp2<LP>(x, vneg_log2e(x)); }

// x P(x^2) / Q(x^2), P and Q highest power first (Horner; the loops unroll at -O3): the erf
// rational's one body, for verf and exact GELU's folded form (verf_sqrt_half).
template <int NP, int NQ>
inline V vodd_rational(V x, const float (&P)[NP], const float (&Q)[NQ]) {
    const V x2 = x * x;
    V p = vset(P[0]);
    for (int i = 1; i < NP; ++i) p = vfma(p, x2, vset(P[i]));
    V q = vset(Q[0]);
    for (int i = 1; i < NQ; ++i) q = vfma(q, x2, vset(Q[i]));
    return p * x / q;
}

// erf(x): rational minimax approximation x*P(x^2)/Q(x^2) on [-4, 4] (the one Eigen and
// XLA use for fp32; a few ulp); |x| > 4 clamps, where erf is +-1 to fp32 precision.
inline V verf(V x) {
    static constexpr float P[] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f,
                                  -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                                  -1.60960333262415e-02f};
    static constexpr float Q[] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                                  -7.37332916720468e-03f, -1.42647390514189e-02f};
    return vodd_rational(vmin(vset(4.0f), vmax(vset(-4.0f), x)), P, Q);  // NaN passes through (see vexp)
}

// erf(x/sqrt2) for exact GELU's fp32 form (vgelu_erf, below): verf's rational with 1/sqrt2
// folded into its coefficients, P_k / (sqrt2 2^k) and Q_k / 2^k, x clamped to [-6, 4 sqrt2]
// (why there: vgelu_erf's comment; tests/test_kernel_constants.py checks the folding).
inline V verf_sqrt_half(V x) {
    static constexpr float P[] = {-3.01199012050038e-12f, 6.12239882530040e-10f, -9.28530207850775e-08f,
                                  -5.03151234198254e-06f, -1.29929214703174e-04f, -1.04460878015564e-03f,
                                  -1.13816143151900e-02f};
    static constexpr float Q[] = {-9.10379490406225e-07f, -2.66717569098631e-05f, -4.20706743595508e-04f,
                                  -3.68666458360234e-03f, -1.42647390514189e-02f};
    return vodd_rational(vmin(vset(5.65685424949238f), vmax(vset(-6.0f), x)), P, Q);  // NaN passes
}

// Exact GELU 0.5*x*(1 + erf(x/sqrt2)), fp32 form: x * Phi(x), Phi = 0.5 e + 0.5 (one FMA),
// e = erf(x/sqrt2) from verf's rational with the 1/sqrt2 folded into its coefficients (x^2 =
// 2 y^2: the powers of two are exact, 1/sqrt2 one rounding per coefficient), so x is clamped,
// not scaled: x/sqrt2, 0.5*x, 1 + erf and the product of 0.5*x*(1 + verf(x/sqrt2)) become e's
// vmax (below), the FMA and the product. L1 harness, Zen 3 (AVX2), TSC cycles per 8 values:
// 8.9 -> 8.4; h*e + h with h = x/2 measured 7.95 but gives +0 where x and the float64 formula
// give -0 (x = -0, gelu(-big)), and an OR of x's sign bit cost it all back.
// Saturation must not hang on the rational's last bit, which differs by variant (the scalar
// build rounds a*b + c twice): e at 5.6 is 1 on AVX2 but 1 - 2^-23 there, which left
// gelu(-65504) = -0.002. So x is clamped to [-6, 4 sqrt2]: at -6 e overshoots -1 by 36 ulp in
// the scalar and AVX2 forms (AVX-512 runs AVX2's FMA sequence) and e >= -1 (one vmax) makes Phi
// exactly 0, so gelu(x <= -6) = -0 (true |gelu| < 6e-9); at 4 sqrt2 e is 1 + 2^-23 in both
// forms, so Phi = 1 + 2^-24 rounds (to even) to exactly 1 and gelu(x) = x from there up.
// Between 4 and 6 the rational overshoots |e| = 1 by a few ulp; e >= -1 keeps Phi >= 0, so a
// negative x never gives a positive result (the former form did at 5942 of 4M points of [-8,
// 8], x in (-5.66, -4)); the positive side's overshoot is a relative 6e-8. Error against
// float64 on [-8, 8]: at most 0.091 of the fp32 tolerance (1e-5 + 1.3e-6 |y|; 0.106 before).
// LP (16-bit outputs, AVX-512): x * Phi(x) with Phi(-a) = 2^P(a), a = |x|, P a degree-5
// polynomial for log2 Phi(-a), and Phi(x) = 1 - Phi(-a) for x >= 0 (no cancellation: Phi(-a)
// <= 1/2). 5 FMAs + vexp2_d3 + a masked subtraction replace the rational's 11 FMAs and
// vdivps: these kernels are compute-bound on 16-bit data (CONTRIBUTING "Roofline"). P was
// fitted (weighted minimax, Lawson iterations) for relative error in Phi: <= 6e-5 on
// a <= 4, with 8.6e-5 from vexp2_d3 under fp16's half ulp of 4.9e-4; beyond, where |y| <
// 1.5e-5, the error grows to 0.1 % at a = 4.5 and 2 % at 5.5 - absolute error under 3e-8,
// fp16's smallest step (the fp32 form above returns -0 from -6 down). It is relative where
// the fp32 form's 1 + erf cancels (tested: tests/test_cpp.py, every fp16 and bf16 value).
// P' < 0 on [0, inf) and P -> -inf, so 2^P -> 0: gelu(-big) = -0, gelu(-Inf) = -Inf * 0 =
// NaN as the float64 formula gives, gelu(Inf) = Inf, NaN stays NaN.
template <bool LP = false>
inline V vgelu_erf(V x) {
#if TO_ISA == 2
    if (LP) {
        // A NaN x gives Phi = |x|'s NaN, and x * Phi either factor's: x's payload, its sign
        // possibly cleared (bf16 -NaN in, +NaN out on a Zen 4), which IEEE 754 leaves
        // uninterpreted. Keeping the sign (a = min(|x|, 16): Phi finite, the product x's NaN)
        // cost 16-bit gelu / geglu 0.93-0.98x (ab_builds.py --copies 2 --rounds 9, Zen 4).
        const V a = vabs(x);
        V p = vset(-3.50719354e-04f);
        p = vfma(p, a, vset(6.11423924e-03f));
        p = vfma(p, a, vset(-4.91788358e-02f));
        p = vfma(p, a, vset(-4.62880596e-01f));
        p = vfma(p, a, vset(-1.14973549e+00f));
        p = vfma(p, a, vset(-1.00008171e+00f));
        const V q = vexp2_d3(p);  // Phi(-a)
        const __mmask16 pos = _mm512_cmp_ps_mask(x.v, _mm512_setzero_ps(), _CMP_GE_OQ);
        return x * V{_mm512_mask_sub_ps(q.v, pos, _mm512_set1_ps(1.0f), q.v)};
    }
#endif
    return x * vfma(vmax(vset(-1.0f), verf_sqrt_half(x)), vset(0.5f), vset(0.5f));  // e >= -1; NaN passes
}

// tanh-GELU 0.5*x*(1 + tanh(u)), u = sqrt(2/pi)*(x + 0.044715 x^3). Method: the identity
// 0.5*(1 + tanh(u)) = 1/(1 + e^(-2u)) turns it into x / (1 + e^(-2u)): one exponential and
// one division, no tanh polynomial, and none of the cancellation tanh(u) -> -1 would cause
// in 1 + tanh(u) for negative x (the error stays at the exponential's, see vexp2_fast).
// -2u * log2(e) = x * (c1 + c2 x^2), the argument of 2^v: the constants folded once here
// (the forward below and the backward in backward.cpp both call it; x2 = x*x).
inline V vgelu_tanh_arg(V x, V x2) {
    return x * vfma(x2, vset(-0.10294323958002349f), vset(-2.3022081981443252f));
}

template <bool LP = false>
inline V vgelu_tanh(V x) {
    return vdiv_1p_exp2<LP>(x, vgelu_tanh_arg(x, x * x));
}

// tanh(x) by the same route, for callers that need tanh itself:
// tanh(x) = sign(x) * (1 - 2/(e^(2|x|) + 1)). Below |x| < 0.55 that difference cancels
// (up to ~16 ulp lost near 0.06), so there the odd Taylor series to x^17 is used instead
// (truncation < 1e-8 relative at 0.55; at 0.55 the subtraction loses only one bit).
inline V vtanh(V x) {
    V ax = vabs(x);
    V e = vexp(ax + ax);
    V big = vset(1.0f) - vset(2.0f) / (e + vset(1.0f));
    V x2 = x * x;
    V p = vset(6404582.0f / 10854718875.0f);
    p = vfma(p, x2, vset(-929569.0f / 638512875.0f));
    p = vfma(p, x2, vset(21844.0f / 6081075.0f));
    p = vfma(p, x2, vset(-1382.0f / 155925.0f));
    p = vfma(p, x2, vset(62.0f / 2835.0f));
    p = vfma(p, x2, vset(-17.0f / 315.0f));
    p = vfma(p, x2, vset(2.0f / 15.0f));
    p = vfma(p, x2, vset(-1.0f / 3.0f));
    V small = vfma(p * x2, ax, ax);
    V r = vsel(vlt(ax, vset(0.55f)), small, big);
    V sign = vxor(x, ax);  // just the sign bit of x
    return vsel(visnan(x), x, vxor(r, sign));
}

}  // namespace
}  // namespace TO_NS
}  // namespace to
