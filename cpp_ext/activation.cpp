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

template <class T, int OP>
void unary_k(const void* xv, void* yv, int64_t count, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    constexpr bool ON = use_lut16<T>(OP == UN_GELU_ERF || OP == UN_TANH) && OP != UN_RELU;  // lut16.h
    const auto f = of_codes<T, ON>([](V v) { return act<OP, low_prec<T>()>(v); });
    const auto full = [&](int64_t i) { return f.full(x + i); };
    const auto part = [&](int64_t i, int64_t k) { return f.part(x + i, k); };
    // rowio.h nan_free: silu's and tanh-GELU's x / (1 + e), exact GELU's x * Phi (not relu's
    // max, exp's or tanh's selects, which pass x through)
    if constexpr (OP == UN_SILU || OP == UN_GELU_ERF || OP == UN_GELU_TANH)
        write_row(y, count, nt, nan_free<T>(full), nan_free<T>(part));
    else
        write_row(y, count, nt, full, part);
    if (nt) stream_fence();
}

// y[r, i] = act(x[r, i]) * x[r, h + i]
template <class T, int G>
void glu_k(const void* xv, void* yv, int64_t rows, int64_t h, bool nt) {
    constexpr int OP = G == GLU_SWIGLU ? UN_SILU : (G == GLU_GEGLU_ERF ? UN_GELU_ERF : UN_GELU_TANH);
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    const auto f = of_codes<T, use_lut16<T>(G == GLU_GEGLU_ERF)>([](V v) { return act<OP, low_prec<T>()>(v); });
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

template <class T>
void fill_t(KernelTable& t, int dt) {
    t.unary[dt][UN_SILU] = unary_k<T, UN_SILU>;
    t.unary[dt][UN_RELU] = unary_k<T, UN_RELU>;
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
