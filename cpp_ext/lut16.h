// lut16.h: an elementwise function of one bf16 operand, read from a table of its fp32 values at
// all 65536 codes instead of computed (included after vmath.h / variant.h).
//
// Why: a bf16 operand has only 65536 values, and the kernels' fp32 math for one (a sigmoid's 2^v
// polynomial and division, tanh-GELU's derivative, erf) costs more on AVX2 than reading a value:
// a bf16 tex dgelu loop took ~48 TSC cycles per 16 values in L1 computed and ~22 with act'(x)
// from the table (1 thread, 2048 values, standalone loop); 8192 x 4096 calls, `ab_builds.py
// --copies 3 --rounds 9` on Zen 3: TE's dgelu 1.65-1.68x, dsilu 1.38-1.44x, dqgelu 1.43x,
// dbias_dgelu 1.61x, the facade's gelu 1.75x, geglu 1.67x, tanh-GELU 1.28x, silu / swiglu
// 1.09-1.10x (CONTRIBUTING.md "bf16 operands by table").
//
// Exactness: the table is built by the kernel's own V -> V function through the same widening
// (vload) the kernel uses, so t[c] is bit for bit what the kernel computed for the input with
// code c, and everything after it (the product with g, the rounding to 16 bits, the bias
// gradient's sums) is unchanged: outputs are bitwise the computing kernel's (every code checked
// against the build before, and tests/test_cpp_tables.py). Lanes past a tail read code 0 (+0.0),
// as vload_part's fill of 0.0f gave. The table is built under the default MXCSR (nearest, no
// flush-to-zero or denormals-are-zero): a caller that set FTZ/DAZ (torch.set_flush_denormal)
// got those flushes from the computing kernel and gets the default results here.
//
// Where: bf16 on AVX2 and scalar; fp16 on AVX2 for the dear functions only (use_lut16's
// f16_too). 8192 x 4096 standard normal values hold 32851 distinct fp16 codes (10 mantissa
// bits) and 4928 bf16 ones (7): 128 KiB of the table against 19 KiB, past L1 but in L2, and
// F16C widens in one instruction. `ab_builds.py --copies 2 --rounds 9` on Zen 3 (2026-12-04),
// fp16 read against computed: erf-GELU 1.27-1.42x, geglu 1.19-1.22x, TE's dgelu (tanh)
// 1.35-1.51x, dsilu 1.06-1.21x, dbias_dgelu 1.32-1.34x, dbias_dsilu 1.14x, dqgelu 1.11x,
// dsigmoid 1.14x, the autograd's exact-GELU backward 2.2-2.4x, tanh 2.4-2.6x, erf geglu's gated
// backward (pair table) 1.46-1.71x; but silu 0.79-0.83x, swiglu 0.81x, TE's gated dswiglu /
// dqgeglu 0.75-0.77x (pairs), tanh-GELU 1.00-1.02x and its gated backward 0.98-1.14x: those
// stay computed (fp16 dsilu read 0.76x on 2026-11-29; why it gains now was not found) - except
// on a Zen 1, whose 128-bit pipes make computing them dearer: there they read tables too, chosen
// at import (lut_flex below; silu 1.87x, tanh dgeglu 2.12x, exp 2.46x, CONTRIBUTING "A Zen 1 host"). The table's
// worst case, every finite fp16 code equally likely (`--data codes`: a random walk over its
// 256 KiB in L2), ran erf-GELU 0.77-0.80x, dgelu 0.97-1.02x, dsilu 0.76x; standard normal x 8
// gained as x did (1.30-1.75x). Not AVX-512: on a Zen 4 the table read by vgatherdps was
// 0.52-1.09x of computing (silu 0.52x, dgelu 1.09x), by 16 scalar loads 0.57-1.04x
// (CONTRIBUTING.md). AVX2 reads 8 values by 8 scalar loads: vpgatherdd took ~35 TSC cycles per
// 16 values in the loop above where the scalar loads took ~22, two 128-bit gathers ~43.
// Memory: 256 KiB per (function, ISA variant) (512 KiB for a pair table), zero pages until the
// first call of that kernel builds it (~0.4 ms, once per process); a call then touches the codes
// its data holds (standard normal data: the 19 KiB above, in L1; of the pair table 39 KiB, more
// than Zen 3's 32 KiB L1: our guess, not measured, at why the gated kernels gained least).
#pragma once
#if TO_ISA >= 1 || defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace to {
namespace TO_NS {
namespace {

// Whether a kernel reads its function of a T operand from the table: bf16 on AVX2 and scalar;
// fp16 on AVX2 only where the caller says the function is dear enough (f16_too: erf-GELU, tanh,
// the flat derivatives), since F16C widens in one instruction and fp16's finer codes spread
// over more of the table (the header comment).
template <class T>
constexpr bool use_lut16(bool f16_too = false) {
    return TO_ISA != 2 && (std::is_same<T, bf16>::value || (TO_ISA == 1 && f16_too && std::is_same<T, f16>::value));
}

// Whether the table choice is made at import instead: fp16 on AVX2 for a function that is not
// dear (kernels.h g_f16_lut, set on a Zen 1, whose 128-bit pipes make computing it twice as dear
// as on Zen 3). The kernel then has both forms and branches once per call on the flag.
template <class T>
constexpr bool lut_flex(bool dear) { return !use_lut16<T>(dear) && use_lut16<T>(true); }

// put(c, x) for every code c, W codes at a time (x: the W values c.. c + W - 1, widened as the
// kernels widen), under the default MXCSR: nearest, all exceptions masked, no FTZ / DAZ.
template <class T, class Put>
bool for_codes(const Put& put) {
#if TO_ISA >= 1 || defined(__SSE__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(0x1f80);
#endif
    for (uint32_t c = 0; c < 65536; c += W) {
        alignas(64) T b[W];
        for (int j = 0; j < W; ++j) b[j].b = (uint16_t)(c + (uint32_t)j);
        put(c, vload(b));
    }
#if TO_ISA >= 1 || defined(__SSE__)
    _mm_setcsr(csr);
#endif
    return true;
}

// The table of f over T's codes: one per (T, F) (a lambda is its own type, so each call site of
// each kernel instantiation has its own), built on first use; thread-safe (a function-local
// static's initialisation: one thread builds, the others wait).
template <class T, class F>
const float* lut16(const F& f) {
    alignas(64) static float t[65536];
    static const bool built = for_codes<T>([&](uint32_t c, V x) { vstore(t + c, f(x)); });
    (void)built;
    return t;
}

// f at the W 16-bit values from p, read from f's table t.
#if TO_ISA == 1
template <class T>
inline V vlut(const float* t, const T* p) {
    const uint16_t* c = (const uint16_t*)p;
    const __m128 lo = _mm_setr_ps(t[c[0]], t[c[1]], t[c[2]], t[c[3]]);
    const __m128 hi = _mm_setr_ps(t[c[4]], t[c[5]], t[c[6]], t[c[7]]);
    return {_mm256_set_m128(hi, lo)};
}
#else
template <class T>
inline V vlut(const float* t, const T* p) {
    alignas(64) float b[W];
    for (int j = 0; j < W; ++j) b[j] = t[p[j].b];
    return vload(b);
}
#endif
// Lanes [0, k) of the above, k < W; the other lanes f(+0.0) (code 0), as vload_part(p, k, 0.f).
template <class T>
inline V vlut_part(const float* t, const T* p, int64_t k) {
    alignas(64) T b[W] = {};
    for (int64_t j = 0; j < k; ++j) b[j] = p[j];
    return vlut(t, b);
}

// Two functions in one table of pairs (t[2c] = f(x), t[2c + 1] = g(x)): the gated derivatives
// need act(a) and act'(a), and two tables read apart cost the bf16 dswiglu 0.83-0.97x of
// computing them (ab_builds.py, Zen 3), where the pairs share a load's line.
template <class T, class F>
const float* lut16x2(const F& fg) {
    alignas(64) static float t[2 * 65536];
    static const bool built = for_codes<T>([&](uint32_t c, V x) {
        V f, g;
        fg(x, f, g);
        alignas(64) float fs[W], gs[W];
        vstore(fs, f);
        vstore(gs, g);
        for (int j = 0; j < W; ++j) {
            t[2 * (c + j)] = fs[j];
            t[2 * (c + j) + 1] = gs[j];
        }
    });
    (void)built;
    return t;
}
#if TO_ISA == 1
template <class T>
inline void vlut2(const float* t, const T* p, V& f, V& g) {
    const uint16_t* c = (const uint16_t*)p;
    // [f_j, g_j, f_k, g_k]: both 8-byte loads through may_alias types (__m128i, __m64; a
    // double* load of the float table would break strict aliasing), vmovq + vmovhps as before
    auto pair = [&](int j, int k) {
        return _mm_loadh_pi(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i*)(t + 2 * c[j]))), (const __m64*)(t + 2 * c[k]));
    };
    const __m256 a = _mm256_set_m128(pair(4, 5), pair(0, 1)), b = _mm256_set_m128(pair(6, 7), pair(2, 3));
    f = {_mm256_shuffle_ps(a, b, 0x88)};
    g = {_mm256_shuffle_ps(a, b, 0xdd)};
}
#else
template <class T>
inline void vlut2(const float* t, const T* p, V& f, V& g) {
    alignas(64) float fs[W], gs[W];
    for (int j = 0; j < W; ++j) {
        fs[j] = t[2 * p[j].b];
        gs[j] = t[2 * p[j].b + 1];
    }
    f = vload(fs);
    g = vload(gs);
}
#endif
template <class T>
inline void vlut2_part(const float* t, const T* p, int64_t k, V& f, V& g) {
    alignas(64) T b[W] = {};
    for (int64_t j = 0; j < k; ++j) b[j] = p[j];
    vlut2(t, b, f, g);
}

// f(x) for a kernel's operand x of type T, x given by its address: read from f's table when ON
// (use_lut16<T>() by default, bf16 only; a dear f passes use_lut16<T>(true), fp16 too on AVX2;
// a kernel whose f is cheaper than the lookup passes false), else computed as before. full: W
// lanes at p; part: lanes [0, k), the rest f(+0.0). PW: full's computed x widened by
// vload_permw (simd.h; the forward activations, where it was measured faster).
template <class T, class F, bool ON, bool PW>
struct OfCodes {
    F f;
    const float* t;
    inline V full(const T* p) const {
        if constexpr (ON) return vlut(t, p);
        else if constexpr (PW) return f(vload_permw(p));
        else return f(vload(p));
    }
    inline V part(const T* p, int64_t k) const {
        if constexpr (ON) return vlut_part(t, p, k);
        else return f(vload_part(p, k, 0.f));
    }
};
template <class T, bool ON = use_lut16<T>(), bool PW = false, class F>
inline OfCodes<T, F, ON, PW> of_codes(const F& f) {
    if constexpr (ON) return {f, lut16<T>(f)};
    else return {f, nullptr};
}

}  // namespace
}  // namespace TO_NS
}  // namespace to
