// simd.h: one small vector abstraction, compiled once per ISA variant.
//
// Every kernel source (norm.cpp, softmax.cpp, ...) is compiled three times by
// tensor_ops/_build/cpp_build.py with -DTO_ISA=0|1|2 and that variant's flags only:
//   0 scalar  portable C++ (baseline x86-64 / any CPU), vector width 1
//   1 avx2    -mavx2 -mfma -mf16c, 8 fp32 lanes
//   2 avx512  -mavx512f/bw/dq/vl (+avx2/fma/f16c), 16 fp32 lanes
//   3 avx512bf16  the avx512 code + -mavx512bf16: bfloat16 stores by vcvtneps2bf16
// The code of a variant lives in namespace to::TO_NS and its helpers in an anonymous
// namespace, so no inline function compiled with AVX-512 flags can be merged by the
// linker into the scalar variant (the usual ODR trap of per-file ISA flags). For the same
// reason the kernels use no std:: templates that could be emitted out of line.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifndef TO_ISA
#error "TO_ISA must be defined (0 scalar, 1 avx2, 2 avx512)"
#endif

#if TO_ISA == 3
// avx512bf16: the AVX-512 variant (every `TO_ISA == 2` path below applies) whose bfloat16
// stores use the AVX512_BF16 instruction vcvtneps2bf16 (one instruction instead of the
// integer round-to-nearest-even sequence of bf16_pack). Like that instruction, it treats
// denormal fp32 inputs as zero and flushes denormal bf16 results to zero (< 1.2e-38).
#define TO_NS isa_avx512bf16
#define TO_TABLE_FN table_avx512bf16
#define TO_AVX512_BF16 1
#undef TO_ISA
#define TO_ISA 2
#elif TO_ISA == 0
#define TO_NS isa_scalar
#define TO_TABLE_FN table_scalar
#elif TO_ISA == 1
#define TO_NS isa_avx2
#define TO_TABLE_FN table_avx2
#elif TO_ISA == 2
#define TO_NS isa_avx512
#define TO_TABLE_FN table_avx512
#else
#error "unknown TO_ISA"
#endif

#if TO_ISA >= 1
#include <immintrin.h>
#endif

namespace to {
namespace TO_NS {
namespace {

// Storage tags: 16-bit types travel as raw bits; math is always fp32.
struct f16 { uint16_t b; };
struct bf16 { uint16_t b; };

inline float bits_f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// ---- scalar conversions (used by every variant for tails; RNE like F16C) ----------
inline float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {  // zero / subnormal: m * 2^-24 is exact in fp32
        float v = (float)m * 5.9604644775390625e-8f;
        return bits_f(f_bits(v) | sign);
    }
    if (e == 31) return bits_f(sign | 0x7f800000u | (m << 13));
    return bits_f(sign | ((e + 112u) << 23) | (m << 13));
}

// F. Giesen's float_to_half_fast3_rtne: round-to-nearest-even, NaN stays NaN (quiet),
// overflow (>= 65520) gives Inf, subnormal results rounded by the FPU via the 0.5 magic.
inline uint16_t f32_to_half(float f) {
    uint32_t u = f_bits(f);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint32_t o;
    if (u >= (143u << 23)) {
        o = (u > 0x7f800000u) ? 0x7e00u : 0x7c00u;
    } else if (u < (113u << 23)) {
        float v = bits_f(u) + 0.5f;
        o = f_bits(v) - f_bits(0.5f);
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu;
        u += odd;
        o = u >> 13;
    }
    return (uint16_t)(o | (sign >> 16));
}

inline float bf16_to_f32(uint16_t b) { return bits_f((uint32_t)b << 16); }
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

inline float to_f32(float v) { return v; }
inline float to_f32(f16 v) { return half_to_f32(v.b); }
inline float to_f32(bf16 v) { return bf16_to_f32(v.b); }
// A bf16 norm's weight and bias packed in one 32-bit word per element (norm.cpp with_w): the
// weight's bits in the low half, the bias's in the high half. Two views of one array: the
// weight is the word shifted up 16 bits, the bias the word with its low half cleared, one
// instruction each from one load (a bf16 row widens with two), in 4 bytes per element where
// the fp32 weight and bias took 8.
struct bf16lo { uint32_t v; };
struct bf16hi { uint32_t v; };
inline float to_f32(bf16lo p) { return bits_f(p.v << 16); }
inline float to_f32(bf16hi p) { return bits_f(p.v & 0xffff0000u); }
inline void put(float* p, float v) { *p = v; }
inline void put(f16* p, float v) { p->b = f32_to_half(v); }
inline void put(bf16* p, float v) { p->b = f32_to_bf16(v); }

#if TO_ISA == 0
// ============================ scalar / portable =====================================
constexpr int W = 1;
struct V { float v; };
struct M { bool m; };
struct VI { int32_t v; };

inline V vset(float a) { return {a}; }
inline V operator+(V a, V b) { return {a.v + b.v}; }
inline V operator-(V a, V b) { return {a.v - b.v}; }
inline V operator*(V a, V b) { return {a.v * b.v}; }
inline V operator/(V a, V b) { return {a.v / b.v}; }
inline V vfma(V a, V b, V c) { return {a.v * b.v + c.v}; }   // a*b + c
inline V vfnma(V a, V b, V c) { return {c.v - a.v * b.v}; }  // c - a*b
// a*b + c rounded once, as the vector variants' vfma is: for the optimizers, which follow
// torch's rounding op by op (optim.cpp: lerp and addcmul are fmas). The scalar vfma above
// rounds twice, which gave Adam moments 1 ulp off torch's under TENSOR_OPS_MAX_ISA=scalar
// (tests/test_tex_train_parity.py); std::fma everywhere made the scalar variant's polynomials
// 2-4x slower (a libm call per element where the baseline ISA has no FMA instruction), so only
// the optimizers take it.
inline V vfma_once(V a, V b, V c) { return {std::fma(a.v, b.v, c.v)}; }
inline V vfnma_once(V a, V b, V c) { return {std::fma(-a.v, b.v, c.v)}; }
inline V vmax(V a, V b) { return {a.v > b.v ? a.v : b.v}; }  // b if either is NaN (x86 maxps rule)
inline V vmin(V a, V b) { return {a.v < b.v ? a.v : b.v}; }
inline V vabs(V a) { return {bits_f(f_bits(a.v) & 0x7fffffffu)}; }
inline V vsqrt(V a) { return {__builtin_sqrtf(a.v)}; }
inline float hsum(V a) { return a.v; }
inline float hmax(V a) { return a.v; }
inline M visnan(V a) { return {a.v != a.v}; }
inline M vlt(V a, V b) { return {a.v < b.v}; }
inline V vsel(M m, V a, V b) { return m.m ? a : b; }
inline V vxor(V a, V b) { return {bits_f(f_bits(a.v) ^ f_bits(b.v))}; }
// a as a value the compiler cannot see into (no instruction): GCC contracts a*b - c into one
// FMA (-ffp-contract=fast is its default), which skips the rounding of a*b a caller may
// rely on (vmath.h vexp_shift: x must be the rounded logit). Elsewhere than GCC/Clang on
// x86, a.
inline V vopaque(V a) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(a.v));
#endif
    return a;
}
// round half away from zero: only ever used on |x| < 2^8, where that is all we need;
// NaN maps to 0 (a NaN -> int cast is undefined behaviour in C++, unlike cvtps2dq).
inline VI vcvt_i(V a) { return {a.v == a.v ? (int32_t)(a.v + (a.v >= 0.f ? 0.5f : -0.5f)) : 0}; }
inline VI operator+(VI a, VI b) { return {a.v + b.v}; }
inline VI operator-(VI a, VI b) { return {a.v - b.v}; }
inline VI vsra1(VI a) { return {a.v >> 1}; }
inline V vexp2i(VI e) { return {bits_f((uint32_t)(e.v + 127) << 23)}; }  // 2^e, e in [-126,127]
inline V vround(V a) { return {__builtin_nearbyintf(a.v)}; }  // nearest-even, NaN stays NaN
// y * 2^e for integral e with 2^e a normal float (vexp keeps it so on this path)
inline V vldexp(V y, V e) { return y * vexp2i(vcvt_i(e)); }

inline V vload(const float* p) { return {*p}; }
inline V vload(const f16* p) { return {half_to_f32(p->b)}; }
inline V vload(const bf16* p) { return {bf16_to_f32(p->b)}; }
inline V vload(const bf16lo* p) { return {to_f32(*p)}; }
inline V vload(const bf16hi* p) { return {to_f32(*p)}; }
// H: a vector of 16-bit lanes as the bits a store writes (see "16-bit lanes as bits" below)
struct H { uint16_t v; };
inline H vpack16(const f16*, V v) { return {f32_to_half(v.v)}; }
inline H vpack16(const bf16*, V v) { return {f32_to_bf16(v.v)}; }
inline V vwiden(const f16*, H h) { return {half_to_f32(h.v)}; }
inline V vwiden(const bf16*, H h) { return {bf16_to_f32(h.v)}; }
template <class T> inline void vstore(T* p, H h) { p->b = h.v; }
inline void vstore(float* p, V v) { *p = v.v; }
template <class T> inline void vstream(T* p, V v) { vstore(p, v); }
template <class T> inline void vstream(T* p, H h) { vstore(p, h); }
inline void stream_fence() {}
// rope's interleaved pairs: (x1, x0) per pair is meaningless at width 1; rope.cpp has
// a pair loop for W == 1.

#elif TO_ISA == 1
// ============================ AVX2 + FMA + F16C =====================================
constexpr int W = 8;
struct V { __m256 v; };
struct M { __m256 m; };
struct VI { __m256i v; };

inline V vset(float a) { return {_mm256_set1_ps(a)}; }
inline V operator+(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V operator-(V a, V b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline V operator*(V a, V b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V operator/(V a, V b) { return {_mm256_div_ps(a.v, b.v)}; }
inline V vfma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V vfnma(V a, V b, V c) { return {_mm256_fnmadd_ps(a.v, b.v, c.v)}; }
inline V vfma_once(V a, V b, V c) { return vfma(a, b, c); }  // see the scalar vfma_once
inline V vfnma_once(V a, V b, V c) { return vfnma(a, b, c); }
inline V vmax(V a, V b) { return {_mm256_max_ps(a.v, b.v)}; }
inline V vmin(V a, V b) { return {_mm256_min_ps(a.v, b.v)}; }
inline V vabs(V a) { return {_mm256_and_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))}; }
inline V vsqrt(V a) { return {_mm256_sqrt_ps(a.v)}; }
inline float hsum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float hmax(V a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline M visnan(V a) { return {_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)}; }
inline M vlt(V a, V b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ)}; }
inline V vsel(M m, V a, V b) { return {_mm256_blendv_ps(b.v, a.v, m.m)}; }
inline V vxor(V a, V b) { return {_mm256_xor_ps(a.v, b.v)}; }
inline V vopaque(V a) {  // see the scalar vopaque
#if defined(__GNUC__)
    __asm__("" : "+x"(a.v));
#endif
    return a;
}
inline VI vcvt_i(V a) { return {_mm256_cvtps_epi32(a.v)}; }  // MXCSR default: nearest-even
inline VI operator+(VI a, VI b) { return {_mm256_add_epi32(a.v, b.v)}; }
inline VI operator-(VI a, VI b) { return {_mm256_sub_epi32(a.v, b.v)}; }
inline VI vsra1(VI a) { return {_mm256_srai_epi32(a.v, 1)}; }
inline V vexp2i(VI e) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e.v, _mm256_set1_epi32(127)), 23))};
}
inline V vround(V a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V vldexp(V y, V e) { return y * vexp2i(vcvt_i(e)); }  // 2^e must be a normal float

inline V vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline V vload(const f16* p) { return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p))}; }
inline V vload(const bf16* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}
inline V vload(const bf16lo* p) { return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i*)p), 16))}; }
inline V vload(const bf16hi* p) {
    return {_mm256_and_ps(_mm256_loadu_ps((const float*)p), _mm256_castsi256_ps(_mm256_set1_epi32((int)0xffff0000u)))};
}
// v rounded to nearest-even in the high half of each word, v not NaN (bf16_round_word's case)
inline __m256i bf16_round_num(V v) {
    __m256i u = _mm256_castps_si256(v.v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}
// v rounded to nearest-even in the high half of each word
inline __m256i bf16_round_word(V v) {
    const __m256i r = bf16_round_num(v);
    // NaN: keep the high half with the quiet bit set instead of rounding it into Inf.
    __m256i qnan = _mm256_or_si256(_mm256_castps_si256(v.v), _mm256_set1_epi32(0x400000));
    __m256 isnan = _mm256_cmp_ps(v.v, v.v, _CMP_UNORD_Q);
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan), isnan));
}
inline __m128i bf16_narrow(__m256i r) {
    // each 32-bit lane's high half to the low 8 bytes of its 128-bit lane (one shuffle where a
    // shift and a pack took two), then those two quarters together
    const __m256i hi = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, hi), 0x08);
    return _mm256_castsi256_si128(packed);
}
inline __m128i bf16_pack(V v) { return bf16_narrow(bf16_round_word(v)); }
struct H { __m128i v; };
// vround16's bf16 form (as AVX-512's): the rounded word masked is the widened value
inline V vround16(const bf16*, V v, H& h) {
    const __m256i r = bf16_round_word(v);
    h = {bf16_narrow(r)};
    return {_mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)))};
}
inline H vpack16(const f16*, V v) { return {_mm256_cvtps_ph(v.v, _MM_FROUND_TO_NEAREST_INT)}; }
inline H vpack16(const bf16*, V v) { return {bf16_pack(v)}; }
// vpack16 of a v known not to hold NaN (rowio.h nan_free): the same bits without the NaN
// compare, or and blend (three of bf16_pack's nine instructions).
inline H vpack16_num(const bf16*, V v) { return {bf16_narrow(bf16_round_num(v))}; }
inline V vwiden(const f16*, H h) { return {_mm256_cvtph_ps(h.v)}; }
inline V vwiden(const bf16*, H h) { return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h.v), 16))}; }
template <class T> inline void vstore(T* p, H h) { _mm_storeu_si128((__m128i*)p, h.v); }
template <class T> inline void vstream(T* p, H h) { _mm_stream_si128((__m128i*)p, h.v); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v.v); }
inline void vstream(float* p, V v) { _mm256_stream_ps(p, v.v); }
inline void stream_fence() { _mm_sfence(); }
// swap the two lanes of every pair: (x0,x1,x2,x3..) -> (x1,x0,x3,x2..)
inline V vswap_pairs(V a) { return {_mm256_permute_ps(a.v, 0xB1)}; }

#else
// ============================ AVX-512 F/BW/DQ/VL =====================================
constexpr int W = 16;
struct V { __m512 v; };
struct M { __mmask16 m; };
struct VI { __m512i v; };

inline V vset(float a) { return {_mm512_set1_ps(a)}; }
inline V operator+(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V operator-(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V operator*(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V operator/(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V vfnma(V a, V b, V c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline V vfma_once(V a, V b, V c) { return vfma(a, b, c); }  // see the scalar vfma_once
inline V vfnma_once(V a, V b, V c) { return vfnma(a, b, c); }
inline V vmax(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V vmin(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V vabs(V a) { return {_mm512_abs_ps(a.v)}; }
inline V vsqrt(V a) { return {_mm512_sqrt_ps(a.v)}; }
inline float hsum(V a) { return _mm512_reduce_add_ps(a.v); }
inline float hmax(V a) { return _mm512_reduce_max_ps(a.v); }
inline M visnan(V a) { return {_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q)}; }
inline M vlt(V a, V b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ)}; }
inline V vsel(M m, V a, V b) { return {_mm512_mask_blend_ps(m.m, b.v, a.v)}; }
inline V vxor(V a, V b) { return {_mm512_xor_ps(a.v, b.v)}; }
inline V vopaque(V a) {  // see the scalar vopaque; "v": any of zmm0-31
#if defined(__GNUC__)
    __asm__("" : "+v"(a.v));
#endif
    return a;
}
inline VI vcvt_i(V a) { return {_mm512_cvtps_epi32(a.v)}; }
inline VI operator+(VI a, VI b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline VI operator-(VI a, VI b) { return {_mm512_sub_epi32(a.v, b.v)}; }
inline VI vsra1(VI a) { return {_mm512_srai_epi32(a.v, 1)}; }
inline V vexp2i(VI e) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e.v, _mm512_set1_epi32(127)), 23))};
}
inline V vround(V a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// vscalefps: y * 2^e in one instruction, correctly rounded for every e (subnormal results,
// underflow to 0, overflow to Inf), so vexp needs neither the integer exponent trick nor
// the two-factor split here.
inline V vldexp(V y, V e) { return {_mm512_scalef_ps(y.v, e.v)}; }

inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vload(const f16* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))}; }
inline V vload(const bf16* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
inline V vload(const bf16lo* p) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16))}; }
inline V vload(const bf16hi* p) {
    return {_mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32((int)0xffff0000u)))};
}
#if defined(TO_AVX512_BF16)
// vload_permw: vload, with a bf16 vector widened by one zero-masked vpermw (code i into word
// 2i + 1, the high half of lane i; word 2i zeroed) instead of vpmovzxwd + vpslld: bitwise the
// same value in one shuffle. Not vload itself: on a Zen 4, every load widened so gave layer_norm
// 0.88x and the norm backwards 0.97-0.98x (loops bound by the shuffle pipe already). Kernels opt
// in where it was measured faster: the forward unary activations (lut16.h OfCodes' PW: silu
// 1.07-1.09x, tanh-GELU 1.05x, exact GELU 0.98-1.02x) and the softmax forwards' logits (the
// facade's 1.04-1.09x, TE's 1.07-1.09x, masked 1.02-1.04x, causal 1.03x); rms_norm, swiglu's
// gate and the softmax backward measured 0.98-1.03x and keep vload (CONTRIBUTING "bf16 widened
// by vpermw"). The AVX512_BF16 variant only: measured there; a Skylake-X vpermw is two uops.
inline V vload_permw(const bf16* p) {
    const __m512i idx = _mm512_set_epi32(0xf000f, 0xe000e, 0xd000d, 0xc000c, 0xb000b, 0xa000a, 0x90009, 0x80008,
                                         0x70007, 0x60006, 0x50005, 0x40004, 0x30003, 0x20002, 0x10001, 0);
    const __m512i h = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)p));
    return {_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16((__mmask32)0xAAAAAAAAu, idx, h))};
}
inline __m256i bf16_pack(V v) { return (__m256i)_mm512_cvtneps_pbh(v.v); }
#else
// v rounded to nearest-even in the high half of each word (NaN: quieted, not rounded into Inf).
// The NaN lanes are put back by one vfixupimmps (one p05 uop) instead of a compare into a mask
// (p5, the port vpmovdw also needs), an OR and a masked move: its table sends the QNaN and SNaN
// classes of v to "QNaN(v)" (v with the quiet bit set, the payload kept) and every other class
// to "keep the destination" (the rounded word); the imm8 of 0 reports no zero/one exceptions.
inline __m512i bf16_round_word(V v) {
    __m512i u = _mm512_castps_si512(v.v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __m512i nan_to_qnan = _mm512_set1_epi32(0x22);  // token 2 (QNaN(src)) for classes 0, 1
    return _mm512_castps_si512(_mm512_fixupimm_ps(_mm512_castsi512_ps(r), v.v, nan_to_qnan, 0));
}
inline __m256i bf16_pack(V v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_word(v), 16)); }
#endif
struct H { __m256i v; };
#if !defined(TO_AVX512_BF16)
// vround16's bf16 form: the rounded word's high half is the bf16 value, so the widened value is
// that word masked (one vpandd) instead of the packed bits widened back (vpmovzxwd + vpslld).
inline V vround16(const bf16*, V v, H& h) {
    const __m512i r = bf16_round_word(v);
    h = {_mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16))};
    return {_mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)))};
}
#endif
inline H vpack16(const f16*, V v) { return {_mm512_cvtps_ph(v.v, _MM_FROUND_TO_NEAREST_INT)}; }
inline H vpack16(const bf16*, V v) { return {bf16_pack(v)}; }
inline V vwiden(const f16*, H h) { return {_mm512_cvtph_ps(h.v)}; }
inline V vwiden(const bf16*, H h) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h.v), 16))}; }
template <class T> inline void vstore(T* p, H h) { _mm256_storeu_si256((__m256i*)p, h.v); }
template <class T> inline void vstream(T* p, H h) { _mm256_stream_si256((__m256i*)p, h.v); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v.v); }
inline void vstream(float* p, V v) { _mm512_stream_ps(p, v.v); }
inline void stream_fence() { _mm_sfence(); }
inline V vswap_pairs(V a) { return {_mm512_permute_ps(a.v, 0xB1)}; }
#endif

// vload_permw's other types and variants: vload (the AVX512_BF16 variant's bf16 one is above).
template <class T>
inline V vload_permw(const T* p) { return vload(p); }

// Every variant's 16-bit stores: the conversion (vpack16), then the bits' store.
inline void vstore(f16* p, V v) { vstore(p, vpack16(p, v)); }
inline void vstore(bf16* p, V v) { vstore(p, vpack16(p, v)); }
#if TO_ISA >= 1
inline void vstream(f16* p, V v) { vstream(p, vpack16(p, v)); }
inline void vstream(bf16* p, V v) { vstream(p, vpack16(p, v)); }
#endif

// W lanes of a 16-bit T as their bits (an H), no conversion: a write_row generator that copies
// a 16-bit row (norm.cpp: res_out from the fused add's 16-bit scratch row when y and res_out
// take separate passes; re-packing the fp32 scratch there cost bf16 ~9 instructions per vector).
template <class T>
inline H vbits16(const T* s) {
    static_assert(sizeof(T) == 2, "16-bit lanes");
#if TO_ISA == 2
    return {_mm256_loadu_si256((const __m256i*)s)};
#elif TO_ISA == 1
    return {_mm_loadu_si128((const __m128i*)s)};
#else
    return {s->b};
#endif
}

// W lanes of a 16-bit T copied as bits, no conversion (norm.cpp: res_out from the fused add's
// 16-bit scratch copy of s); nt: a streaming store (p W*2-byte aligned), s may be unaligned.
template <class T>
inline void vcopy16(T* p, const T* s, bool nt) {
    const H h = vbits16(s);
    if (nt)
        vstream(p, h);
    else
        vstore(p, h);
}

// v rounded to the 16-bit T as fp32 (what a store of v writes, read back), its bits in h: for a
// kernel that both stores the rounded value and computes with it (norm.cpp's fused add sums
// and normalizes round_T(x + r)), one conversion and no store-to-load round trip. bf16 on AVX2
// and AVX-512 without BF16 has its own form beside bf16_pack (the rounded word masked).
template <class T>
inline V vround16(const T* p, V v, H& h) {
    h = vpack16(p, v);
    return vwiden(p, h);
}

// ---- partial (tail) loads/stores ---------------------------------------------------
// Lanes [0, k) of p, k < W; the other lanes hold `fill`. The tail runs the very same vector
// math as the body (no second scalar implementation of exp/erf to keep in step) and never
// touches memory past the end of the row. AVX-512: one masked load / store (fault-suppressing
// for the masked-off lanes). Elsewhere: element by element through a W-wide stack buffer.
// The masked forms matter beyond tails: with non-temporal stores every row whose output is
// not 64-byte aligned has a partial head and tail, and rope writes each half of a 128-wide
// row separately; element loops there made rope on (32, 8192, 128) 4x slower than with
// cached stores (18 vs 4.3 ms single-threaded).
#if TO_ISA == 2
inline __mmask16 kmask(int64_t k) { return (__mmask16)((1u << k) - 1u); }
inline V vload_part(const float* p, int64_t k, float fill) {
    return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), kmask(k), p)};
}
inline V vload_part(const f16* p, int64_t k, float fill) {
    const __mmask16 m = kmask(k);
    return {_mm512_mask_blend_ps(m, _mm512_set1_ps(fill), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)))};
}
inline V vload_part(const bf16* p, int64_t k, float fill) {
    const __mmask16 m = kmask(k);
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return {_mm512_mask_blend_ps(m, _mm512_set1_ps(fill), _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)))};
}
inline V vload_part(const bf16lo* p, int64_t k, float fill) {
    const __m512i u = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(kmask(k), p), 16);
    return {_mm512_mask_blend_ps(kmask(k), _mm512_set1_ps(fill), _mm512_castsi512_ps(u))};
}
inline V vload_part(const bf16hi* p, int64_t k, float fill) {
    const __m512i u = _mm512_and_si512(_mm512_maskz_loadu_epi32(kmask(k), p), _mm512_set1_epi32((int)0xffff0000u));
    return {_mm512_mask_blend_ps(kmask(k), _mm512_set1_ps(fill), _mm512_castsi512_ps(u))};
}
inline void vstore_part(float* p, V v, int64_t k) { _mm512_mask_storeu_ps(p, kmask(k), v.v); }
inline void vstore_part(f16* p, V v, int64_t k) {
    _mm256_mask_storeu_epi16(p, kmask(k), _mm512_cvtps_ph(v.v, _MM_FROUND_TO_NEAREST_INT));
}
inline void vstore_part(bf16* p, V v, int64_t k) { _mm256_mask_storeu_epi16(p, kmask(k), bf16_pack(v)); }
template <class T>
inline void vstore_part(T* p, H h, int64_t k) { _mm256_mask_storeu_epi16(p, kmask(k), h.v); }
template <class T>
inline H vbits16_part(const T* s, int64_t k) { return {_mm256_maskz_loadu_epi16(kmask(k), s)}; }
#else
#if TO_ISA == 1
inline V vload_part(const float* p, int64_t k, float fill) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), lane));
    return {_mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, _mm256_castps_si256(m)), m)};
}
#endif
template <class T>
inline V vload_part(const T* p, int64_t k, float fill) {
    alignas(64) float b[W];
    for (int64_t i = 0; i < W; ++i) b[i] = i < k ? to_f32(p[i]) : fill;
    return vload(b);
}
template <class T>
inline void vstore_part(T* p, V v, int64_t k) {
    alignas(64) float b[W];
    vstore(b, v);
    for (int64_t i = 0; i < k; ++i) put(p + i, b[i]);
}
template <class T>
inline void vstore_part(T* p, H h, int64_t k) {
    alignas(64) T b[W];
    vstore(b, h);
    std::memcpy((void*)p, (const void*)b, (size_t)k * sizeof(T));
}
template <class T>
inline H vbits16_part(const T* s, int64_t k) {  // lanes [k, W) zero
    alignas(64) T b[W] = {};
    std::memcpy((void*)b, (const void*)s, (size_t)k * sizeof(T));
    return vbits16(b);
}
#endif

// ---- 16-bit lanes as bits ------------------------------------------------------------
// H (defined per variant above): W lanes of a 16-bit T as the bits a store of them writes.
// vpack16 is the store's conversion (rounded to nearest-even; every 16-bit vstore / vstream
// is vpack16 then the bits' store), vwiden the fp32 value those bits hold. For a kernel that
// needs the rounded value as well as storing it (tex_train.cpp: the bias gradient sums what
// the output holds), one conversion instead of a second one inside the store: write_row
// stores what its generator returns, a V or an H. The pointer argument only picks the format.

}  // namespace
}  // namespace TO_NS
}  // namespace to
