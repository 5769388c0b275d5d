// activation.cpp: silu, relu, gelu (erf / tanh) and the gated swiglu / geglu
// (compiled once per ISA variant). Elementwise kernels see a flat range; bind_facade.cpp
// splits it in chunks across threads, so one long row is parallel too.
#include "vmath.h"
#include "variant.h"
#include "lut16.h"

namespace to {
namespace TO_NS {
namespace {

// LP: the output is 16-bit (vmath.h vdiv_1p_exp2: the cheaper forms its precision allows).
template <int OP, bool LP = false>
inline V act(V x) {
    if (OP == UN_SILU) return vsilu<LP>(x);
    if (OP == UN_RELU) return vmax(vset(0.0f), x);  // operand order: NaN in x stays NaN
    if (OP == UN_GELU_ERF) return vgelu_erf<LP>(x);
    if (OP == UN_GELU_TANH) return vgelu_tanh<LP>(x);
    if (OP == UN_EXP) return vexp(x);
    return vtanh(x);
}
template <class T>
constexpr bool low_prec() { return sizeof(T) == 2; }

template <class T, int OP, bool ON>
void unary_body(const void* xv, void* yv, int64_t count, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    const auto f = of_codes<T, ON, true>([](V v) { return act<OP, low_prec<T>()>(v); });
    const auto full = [&](int64_t i) { return f.full(x + i); };
    const auto part = [&](int64_t i, int64_t k) { return f.part(x + i, k); };
    // rowio.h nan_free: silu's and tanh-GELU's x / (1 + e), exact GELU's x * Phi (not exp's or
    // tanh's selects, which pass x through)
    if constexpr (OP == UN_SILU || OP == UN_GELU_ERF || OP == UN_GELU_TANH)
        write_row(y, count, nt, nan_free<T>(full), nan_free<T>(part));
    else
        write_row(y, count, nt, full, part);
    if (nt) stream_fence();
}

template <class T, int OP>
void unary_k(const void* xv, void* yv, int64_t count, bool nt) {
    constexpr bool DEAR = OP == UN_GELU_ERF || OP == UN_TANH;
    if constexpr (lut_flex<T>(DEAR) && OP != UN_RELU)
        if (g_f16_lut) return unary_body<T, OP, true>(xv, yv, count, nt);
    unary_body<T, OP, use_lut16<T>(DEAR)>(xv, yv, count, nt);
}

// relu of 16-bit values on their bits, bitwise what widening, max(0, x) and rounding give
// on AVX2 / AVX-512 (x for x > 0, -0.0 and NaN, +0.0 below; a NaN keeps its sign and payload,
// quiet bit set, as F16C's and the bf16 narrow's NaN case do), but with no conversion: the
// 16-bit relu moved as much data as the copy and ran at 0.62 of it in bf16 on a Zen 1 (0.81
// on Zen 3), its widening and rounding queued on 128-bit pipes (CONTRIBUTING.md "A Zen 1
// host"). The scalar variant's fp16 NaN (f32_to_half: 0x7e00, payload dropped) and the
// avx512bf16 variant's flushed denormals (vcvtneps2bf16) now follow the same rule.
// rowio.h write_row16 stores them as fp32 lanes.
template <class T>
struct Relu16 {
    static constexpr int16_t INF = std::is_same<T, bf16>::value ? 0x7f80 : 0x7c00;
    static constexpr int16_t QUIET = std::is_same<T, bf16>::value ? 0x0040 : 0x0200;
    static constexpr int16_t NEG0 = INT16_MIN;  // -0.0's bits
    static inline uint16_t one(uint16_t c) {
        if ((c & 0x7fff) > (uint16_t)INF) return (uint16_t)(c | QUIET);
        return ((int16_t)c > 0 || c == 0x8000u) ? c : 0;
    }
    static inline S16 vec(S16 s) {
        const S16 z = {};
        const S16 nan = (s & s16_splat(0x7fff)) > s16_splat(INF);
        const S16 keep = (s > z) | (s == s16_splat(NEG0)) | nan;
        return (s & keep) | (nan & s16_splat(QUIET));
    }
};

template <class T>
void relu16_k(const void* xv, void* yv, int64_t count, bool nt) {
    const uint16_t* x = (const uint16_t*)xv;
    uint16_t* y = (uint16_t*)yv;
    if constexpr (W == 1) {  // scalar variant: a plain loop (the compiler's baseline SSE2 vectorises it)
        for (int64_t i = 0; i < count; ++i) y[i] = Relu16<T>::one(x[i]);
    } else {
        write_row16(
            y, count, nt, [&](int64_t e) { return Relu16<T>::one(x[e]); },
            [&](int64_t e) { return Relu16<T>::vec(s16_load(x + e)); },
            [&](int64_t e, int64_t k) { return Relu16<T>::vec(s16_load_part(x + e, k)); });
        if (nt) stream_fence();
    }
}

template <class T, int G, bool ON>
void glu_body(const void* xv, void* yv, int64_t rows, int64_t h, bool nt) {
    constexpr int OP = G == GLU_SWIGLU ? UN_SILU : (G == GLU_GEGLU_ERF ? UN_GELU_ERF : UN_GELU_TANH);
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    const auto f = of_codes<T, ON>([](V v) { return act<OP, low_prec<T>()>(v); });
    for (int64_t r = 0; r < rows; ++r) {
        const T* a = x + r * 2 * h;
        const T* b = a + h;
        // The next row's first half is prefetched: the hardware prefetcher follows b into it
        // but has to find a's new start on its own at every row.
        const auto full = [&](int64_t i) { return f.full(a + i) * vload(b + i); };
        const auto part = [&](int64_t i, int64_t k) { return f.part(a + i, k) * vload_part(b + i, k, 0.f); };
        write_row(y + r * h, h, nt, nan_free<T>(full), nan_free<T>(part),  // rowio.h nan_free: products
                  r + 1 < rows ? Prefetch(a + 2 * h, 2 * h * (int64_t)sizeof(T), h / (2 * W)) : Prefetch());
    }
    if (nt) stream_fence();
}

template <class T, int G>
void glu_k(const void* xv, void* yv, int64_t rows, int64_t h, bool nt) {
    constexpr bool DEAR = G == GLU_GEGLU_ERF;
    if constexpr (lut_flex<T>(DEAR))
        if (g_f16_lut) return glu_body<T, G, true>(xv, yv, rows, h, nt);
    glu_body<T, G, use_lut16<T>(DEAR)>(xv, yv, rows, h, nt);
}

template <class T>
void fill_t(KernelTable& t, int dt) {
    t.unary[dt][UN_SILU] = unary_k<T, UN_SILU>;
    if constexpr (sizeof(T) == 2) t.unary[dt][UN_RELU] = relu16_k<T>;
    else t.unary[dt][UN_RELU] = unary_k<T, UN_RELU>;
    t.unary[dt][UN_GELU_ERF] = unary_k<T, UN_GELU_ERF>;
    t.unary[dt][UN_GELU_TANH] = unary_k<T, UN_GELU_TANH>;
    t.unary[dt][UN_EXP] = unary_k<T, UN_EXP>;
    t.unary[dt][UN_TANH] = unary_k<T, UN_TANH>;
    t.glu[dt][GLU_SWIGLU] = glu_k<T, GLU_SWIGLU>;
    t.glu[dt][GLU_GEGLU_ERF] = glu_k<T, GLU_GEGLU_ERF>;
    t.glu[dt][GLU_GEGLU_TANH] = glu_k<T, GLU_GEGLU_TANH>;
}

}  // namespace

void fill_activation(KernelTable& t) {
    fill_t<float>(t, DT_F32);
    fill_t<f16>(t, DT_F16);
    fill_t<bf16>(t, DT_BF16);
}

}  // namespace TO_NS
}  // namespace to
