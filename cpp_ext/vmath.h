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
// exactly; one FMA fewer than Cephes' degree-7 1 + r + r^2 P(r)). x is clamped first
// (beyond the clamp the result is 0 / Inf anyway); the clamp is written min(hi, max(lo, x)) because x86
// min/max return their second operand when one is NaN, so NaN flows through to p and the
// result without an extra blend.
// Precise (default): 2^n is applied as two factors 2^(n>>1) * 2^(n - n>>1); each stays a
// normal float for n in [-150, 128], so denormal results, underflow to 0 and overflow to
// +Inf all come out right without a branch.
// Fast (Precise = false): one factor, clamp at -87.3 so 2^n stays normal: results below
// 2^-126 (and e^-Inf) come out as ~1e-38 instead of 0. Used where e^x only enters
// 1/(1 + e^x) (silu, tanh-GELU), where that is invisible, for ~15% fewer instructions.
// AVX-512: both are one vscalefps (exact for every n), so the split costs nothing there.
// n is rounded as a float (one vroundps) and converted only where the integer trick needs it.
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

template <bool Precise = true>
inline V vexp(V x) {
    const V lo = vset(Precise ? -104.0f : -87.3f), hi = vset(88.8f);
    V fn, y = vexp_reduced(vmin(hi, vmax(lo, x)), fn);
#if TO_ISA == 2
    return vldexp(y, fn);  // one vscalefps covers both paths (see simd.h)
#else
    if (Precise) {
        VI n = vcvt_i(fn), n1 = vsra1(n);
        return (y * vexp2i(n1)) * vexp2i(n - n1);
    }
    return vldexp(y, fn);  // n = 128 gives the Inf bit pattern: overflow stays right
#endif
}

// x * sigmoid(x) written as x / (1 + e^-x): e^-x -> Inf for very negative x gives the
// correct -0 limit, and silu(-Inf) = -Inf/Inf = NaN matches the float64 formula. (A
// division-free form, 1/(1+e^-|x|) by reciprocal estimate + Newton step, was measured
// 40% slower: the exp's instruction count, not the divider, bounds this kernel.)
inline V vsilu(V x) { return x / (vset(1.0f) + vexp<false>(vset(0.0f) - x)); }

// erf(x): rational minimax approximation x*P(x^2)/Q(x^2) on [-4, 4] (the one Eigen and
// XLA use for fp32; a few ulp); |x| > 4 clamps, where erf is +-1 to fp32 precision.
inline V verf(V x) {
    V xc = vmin(vset(4.0f), vmax(vset(-4.0f), x));  // NaN passes through (see vexp)
    V x2 = xc * xc;
    V p = vset(-2.72614225801306e-10f);
    p = vfma(p, x2, vset(2.77068142495902e-08f));
    p = vfma(p, x2, vset(-2.10102402082508e-06f));
    p = vfma(p, x2, vset(-5.69250639462346e-05f));
    p = vfma(p, x2, vset(-7.34990630326855e-04f));
    p = vfma(p, x2, vset(-2.95459980854025e-03f));
    p = vfma(p, x2, vset(-1.60960333262415e-02f));
    p = p * xc;
    V q = vset(-1.45660718464996e-05f);
    q = vfma(q, x2, vset(-2.13374055278905e-04f));
    q = vfma(q, x2, vset(-1.68282697438203e-03f));
    q = vfma(q, x2, vset(-7.37332916720468e-03f));
    q = vfma(q, x2, vset(-1.42647390514189e-02f));
    return p / q;
}

// Exact GELU 0.5*x*(1 + erf(x/sqrt2)). The erf error (a few 1e-8 absolute) is scaled by
// 0.5|x|, and for x < -5.66 the result is 0 against a true |gelu| < 1e-7: absolute error
// stays under 10 eps (tested).
inline V vgelu_erf(V x) {
    return vset(0.5f) * x * (vset(1.0f) + verf(x * vset(0.70710678118654752f)));
}

// tanh-GELU 0.5*x*(1 + tanh(u)), u = sqrt(2/pi)*(x + 0.044715 x^3). Method: the identity
// 0.5*(1 + tanh(u)) = 1/(1 + e^(-2u)) turns it into x / (1 + e^(-2u)): one vexp and one
// division, no tanh polynomial, and none of the cancellation tanh(u) -> -1 would cause
// in 1 + tanh(u) for negative x (the relative error stays at the exp error, ~2 ulp).
inline V vgelu_tanh(V x) {
    V u = x * vfma(vset(0.044715f) * x, x, vset(1.0f)) * vset(-1.5957691216057308f);  // -2u
    return x / (vset(1.0f) + vexp<false>(u));
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
