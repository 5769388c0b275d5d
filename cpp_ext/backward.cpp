// backward.cpp: the autograd kernels of tensor_ops.torch that no other file provides
// (compiled once per ISA variant):
//
// * glu2 / glu2_bwd: the gated activations on row-strided operands. Hugging Face MLPs keep
//   the gate and up projections in two arrays (act(gate) * up), the facade's swiglu/geglu
//   keep them as the halves [a | b] of one row: both are "a, b with row strides", so one
//   kernel serves the two layouts (forward and backward) and both GELU forms.
// * gated_bwd_k is the one definition of the gated derivative (da = g*b*act'(a),
//   db = g*act(a)): glu2_bwd is it, and so is tex's dglu (TE's dswiglu/dgeglu/dreglu/
//   dqgeglu/dsreglu/dglu on [a | b] rows, the table's dglu entries, filled here).
// * gelu_erf_bwd: the exact (erf) GELU derivative (TransformerEngine has only the tanh form).
//
// The derivatives of silu, tanh-GELU and relu on one operand and the softmax backward come
// from the tex kernels; the norms' backward from norm.cpp (rms_norm_bwd / layer_norm_bwd).
// Math is fp32 for every storage type, one rounding per output, like the forward kernels;
// act(a) is computed by the forward's own vmath.h functions, so glu2 equals swiglu/geglu
// bit for bit.
#include "vmath.h"
#include "variant.h"
#include "lut16.h"

namespace to {
namespace TO_NS {
namespace {

constexpr float SQRT_HALF = 0.70710678118654752f;
constexpr float INV_SQRT_2PI = 0.39894228040143268f;  // 1/sqrt(2 pi): the normal density at 0
constexpr float GELU_K0 = 0.79788456080286536f;       // sqrt(2/pi)
constexpr float GELU_K1 = 0.044715f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float QGELU_K = 1.702f;  // TE's quick-GELU: x * sigmoid(1.702 x)

// The gated kernels' activations: tex's DAct codes, and the exact (erf) GELU beside them.
constexpr int A_GELU_ERF = DA_COUNT;
constexpr int GLU_ACT[GLU_COUNT] = {DA_SILU, A_GELU_ERF, DA_GELU_TANH};  // by Glu code

template <int A, bool LP>
inline V act_f(V x) {
    if (A == DA_SILU) return vsilu<LP>(x);
    if (A == A_GELU_ERF) return vgelu_erf<LP>(x);
    return vgelu_tanh<LP>(x);
}

// f = act(x) and df = act'(x), from one exponential where there is one.
//   silu:       s = sigmoid(x), f = x s, f' = s + x s (1 - s)
//   GELU (erf): f = x Phi(x), f' = Phi(x) + x phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi)
//   GELU (tanh): s = 1/(1 + e^(-2u)) = (1 + tanh u)/2, f = x s, f' = s + 2 x s (1 - s) u'(x)
//   quick-GELU: s = sigmoid(1.702 x), f = x s, f' = s + 1.702 x s (1 - s)
//   relu: f = max(0, x), f' = [x > 0];  squared relu: f = max(0, x)^2, f' = 2 max(0, x)
//   sigmoid (TE's "glu"): f = s, f' = s (1 - s)
template <int A>
inline void act_df(V x, V& f, V& df) {
    const V one = vset(1.0f);
    V s, om;  // sigmoid and 1 - sigmoid (vmath.h vsig_parts)
    if (A == DA_SILU) {
        vsig_parts(vneg_log2e(x), s, om);
        f = x * s;
        df = vfma(f, om, s);
    } else if (A == A_GELU_ERF) {
        const V phi = vset(0.5f) * (one + verf(x * vset(SQRT_HALF)));
        f = x * phi;
        df = vfma(x, vset(INV_SQRT_2PI) * vexp(vset(-0.5f) * x * x), phi);
    } else if (A == DA_GELU_TANH) {
        const V x2 = x * x;
        vsig_parts(vgelu_tanh_arg(x, x2), s, om);
        f = x * s;
        const V du = vset(GELU_K0) * vfma(vset(3.0f * GELU_K1), x2, one);
        df = vfma(vset(2.0f) * f * om, du, s);
    } else if (A == DA_QGELU) {
        vsig_parts(x * vset(-LOG2E * QGELU_K), s, om);
        f = x * s;
        df = vfma(vset(QGELU_K) * f, om, s);
    } else if (A == DA_RELU) {
        f = vmax(vset(0.0f), x);
        df = vsel(vlt(vset(0.0f), x), one, vset(0.0f));
    } else if (A == DA_SRELU) {
        const V r = vmax(vset(0.0f), x);  // NaN in x stays NaN
        f = r * r;
        df = vset(2.0f) * r;
    } else {  // DA_SIGMOID
        vsig_parts(vneg_log2e(x), s, om);
        f = s;
        df = s * om;
    }
}

// act(a) and act'(a) for a gated kernel's operand a of type T: read from a table of pairs (lut16.h)
// where use_lut16<T> (bf16 on AVX2 and scalar, fp16 on AVX2 for exact GELU, and on a Zen 1 for
// the others too: lut16.h lut_flex; relu's and squared relu's stay computed), else computed by
// act_df. Same bits either way.
template <int ACT>
constexpr bool act_dear() { return ACT == A_GELU_ERF; }
template <int ACT>
constexpr bool act_cheap() { return ACT == DA_RELU || ACT == DA_SRELU; }
template <class T, int ACT, bool ON = use_lut16<T>(act_dear<ACT>()) && !act_cheap<ACT>()>
struct ActDf {
    const float* t = nullptr;
    ActDf() {
        if constexpr (ON) t = lut16x2<T>([](V v, V& f, V& df) { act_df<ACT>(v, f, df); });
    }
    inline void full(const T* p, V& f, V& df) const {
        if constexpr (ON) vlut2(t, p, f, df);
        else act_df<ACT>(vload(p), f, df);
    }
    inline void part(const T* p, int64_t k, V& f, V& df) const {
        if constexpr (ON) vlut2_part(t, p, k, f, df);
        else act_df<ACT>(vload_part(p, k, 0.f), f, df);
    }
};

template <class T>
inline bool stream_aligned(const T* p) {
    return ((uintptr_t)p % ((uintptr_t)W * sizeof(T))) == 0;
}

template <class T, int ACT, bool ON>
void glu2_body(const void* av, const void* bv, void* yv, int64_t rows, int64_t h, int64_t sa, int64_t sb, int64_t sy,
               bool nt) {
    const T* A = (const T*)av;
    const T* B = (const T*)bv;
    T* Y = (T*)yv;
    const auto f = of_codes<T, ON>([](V v) { return act_f<ACT, sizeof(T) == 2>(v); });
    for (int64_t r = 0; r < rows; ++r) {
        const T* a = A + r * sa;
        const T* b = B + r * sb;
        write_row(
            Y + r * sy, h, nt, [&](int64_t i) { return f.full(a + i) * vload(b + i); },
            [&](int64_t i, int64_t k) { return f.part(a + i, k) * vload_part(b + i, k, 0.f); });
    }
    if (nt) stream_fence();
}

// The table choices made at import (lut16.h lut_flex: fp16 on AVX2, on a Zen 1 for these too).
template <class T, int ACT>
void glu2_k(const void* av, const void* bv, void* yv, int64_t rows, int64_t h, int64_t sa, int64_t sb, int64_t sy,
            bool nt) {
    if constexpr (lut_flex<T>(act_dear<ACT>()))
        if (g_f16_lut) return glu2_body<T, ACT, true>(av, bv, yv, rows, h, sa, sb, sy, nt);
    glu2_body<T, ACT, use_lut16<T>(act_dear<ACT>())>(av, bv, yv, rows, h, sa, sb, sy, nt);
}

// A gated derivative's output vector: its bits where AVX2 rounds bf16 without the NaN case
// (rowio.h nan_free: da and db are products of widened operands and values computed from
// them, so every NaN has a zero low half), else v; stored by vstore / vstream either way.
template <class T>
inline auto gated_out(V v) {
#if TO_ISA == 1
    if constexpr (std::is_same_v<T, bf16>) return vpack16_num((const bf16*)nullptr, v);
    else
#endif
        return v;
}

// The gated derivative, row-strided (strides in elements): da = dy * b * act'(a), db = dy * act(a).
// Streaming stores on AVX2 go out a 64-byte line of da, then a line of db (LINE_V vectors each,
// rowio.h line_vectors, computed first), from da's first line boundary on. Vector by vector,
// alternating da and db, they collapsed on an AMD Zen 3 the way the fused add's one-pass form
// did (CONTRIBUTING "Two interleaved streams of streaming stores"): TE's dswiglu / dgeglu /
// dreglu on 8192 x [2048 | 2048] (`ab_builds.py --ops tex_dglu_silu tex_dglu_gelu
// tex_dglu_relu --copies 3 --rounds 9`, against the alternating build, torch's placement /
// NumPy's): bf16 2.16 / 1.90x (silu), 2.17 / 2.14x (tanh-GELU), 4.62 / 1.46x (relu), its silu
// and tanh-GELU copies at 30-43 ms where these take 16-20; fp16 tanh-GELU 2.45 / 2.01x; where
// the alternating form ran well, fp16 silu 0.98 / 0.80x, fp32 0.87-1.05x. Same bits either way.
// AVX-512 builds keep the alternating form: the line-at-a-time one (two 16-bit vectors per
// line) ran 0.88-0.93x in bf16 / fp16 on a Zen 5 (the same ab_builds.py ops, --copies 2
// --rounds 9, np.empty's placement; fp32, a vector per line, the same code: 1.02-1.05x).
// Where act(a) and act'(a) come from a table (ON), those lines go out by cached stores: the
// table's scattered loads beside streaming stores ran TE's bf16 dswiglu / dgeglu at 1.7x their
// cached-store time per element in L2 on a Zen 3 (`_set_tuning(nontemporal_threshold_bytes=0)`,
// 64 rows, one thread), where fp16 (computed) ran at 1.1x (CONTRIBUTING "Gated derivatives
// from a table: cached lines").
template <class T, int ACT, bool ON>
void gated_bwd_body(const void* dyv, const void* av, const void* bv, void* dav, void* dbv, int64_t rows, int64_t h,
                    int64_t sdy, int64_t sa, int64_t sb, int64_t sda, int64_t sdb, bool nt) {
    const T* DY = (const T*)dyv;
    const T* A = (const T*)av;
    const T* B = (const T*)bv;
    T* DA = (T*)dav;
    T* DB = (T*)dbv;
    constexpr int LINE_V = line_vectors<T>();
    const ActDf<T, ACT, ON> fdf;
    const auto put = [](T* p, V v, bool stream) {
        if (stream)
            vstream(p, gated_out<T>(v));
        else
            vstore(p, gated_out<T>(v));
    };
    for (int64_t r = 0; r < rows; ++r) {
        const T* g = DY + r * sdy;
        const T* a = A + r * sa;
        const T* b = B + r * sb;
        T* da = DA + r * sda;
        T* db = DB + r * sdb;
        // Two outputs per element: streaming stores only when both rows start on a vector
        // boundary (the common case: contiguous outputs whose h is a multiple of W).
        const bool st_nt = nt && W > 1 && stream_aligned(da) && stream_aligned(db);
        const bool nt_out = st_nt && !ON;  // a table read: cached stores (see above)
        int64_t i = 0;
        if (st_nt && TO_ISA < 2) {
            // AVX2: each output's streaming stores a whole line at a time (the loop's vectors
            // alternated da, db, da, db before; see the comment above this function).
            for (; i + W <= h && (uintptr_t)(da + i) % 64; i += W) {  // to da's line boundary
                V f, df;
                fdf.full(a + i, f, df);
                const V vg = vload(g + i);
                put(da + i, vg * vload(b + i) * df, !ON);
                put(db + i, vg * f, !ON);
            }
            for (; i + LINE_V * W <= h; i += LINE_V * W) {
                V vda[LINE_V], vdb[LINE_V];
                for (int q = 0; q < LINE_V; ++q) {
                    V f, df;
                    fdf.full(a + i + q * W, f, df);
                    const V vg = vload(g + i + q * W);
                    vda[q] = vg * vload(b + i + q * W) * df;
                    vdb[q] = vg * f;
                }
                for (int q = 0; q < LINE_V; ++q) put(da + i + q * W, vda[q], !ON);
                for (int q = 0; q < LINE_V; ++q) put(db + i + q * W, vdb[q], !ON);
            }
        }
        for (; i + W <= h; i += W) {
            V f, df;
            fdf.full(a + i, f, df);
            const V vg = vload(g + i);
            put(da + i, vg * vload(b + i) * df, nt_out);
            put(db + i, vg * f, nt_out);
        }
        if (i < h) {
            const int64_t k = h - i;
            V f, df;
            fdf.part(a + i, k, f, df);
            const V vg = vload_part(g + i, k, 0.f);
            vstore_part(da + i, vg * vload_part(b + i, k, 0.f) * df, k);
            vstore_part(db + i, vg * f, k);
        }
    }
    if (nt) stream_fence();
}

template <class T, int ACT>
void gated_bwd_k(const void* dyv, const void* av, const void* bv, void* dav, void* dbv, int64_t rows, int64_t h,
                 int64_t sdy, int64_t sa, int64_t sb, int64_t sda, int64_t sdb, bool nt) {
    if constexpr (lut_flex<T>(act_dear<ACT>()) && !act_cheap<ACT>())
        if (g_f16_lut)
            return gated_bwd_body<T, ACT, true>(dyv, av, bv, dav, dbv, rows, h, sdy, sa, sb, sda, sdb, nt);
    gated_bwd_body<T, ACT, use_lut16<T>(act_dear<ACT>()) && !act_cheap<ACT>()>(dyv, av, bv, dav, dbv, rows, h, sdy,
                                                                              sa, sb, sda, sdb, nt);
}

template <class T>
void gelu_erf_bwd_k(const void* dyv, const void* xv, void* dxv, int64_t count, bool nt) {
    const T* g = (const T*)dyv;
    const T* x = (const T*)xv;
    const auto d = of_codes<T, use_lut16<T>(true)>([](V v) {
        V f, df;
        act_df<A_GELU_ERF>(v, f, df);
        return df;
    });
    write_row(
        (T*)dxv, count, nt, [&](int64_t i) { return vload(g + i) * d.full(x + i); },
        [&](int64_t i, int64_t k) { return vload_part(g + i, k, 0.f) * d.part(x + i, k); });
    if (nt) stream_fence();
}

// tex's dglu: x rows [a | b] (2h), grad rows (h) -> y rows [da | db] (2h): gated_bwd_k on the halves.
template <class T, int ACT>
void dglu_halves_k(const void* gv, const void* xv, void* yv, int64_t rows, int64_t h, bool nt) {
    const char* x = (const char*)xv;
    char* y = (char*)yv;
    const int64_t half = h * (int64_t)sizeof(T);
    gated_bwd_k<T, ACT>(gv, x, x + half, y, y + half, rows, h, h, 2 * h, 2 * h, 2 * h, 2 * h, nt);
}

template <class T>
void fill_t(KernelTable& t, int dt) {
    t.glu2[dt][GLU_SWIGLU] = glu2_k<T, GLU_ACT[GLU_SWIGLU]>;
    t.glu2[dt][GLU_GEGLU_ERF] = glu2_k<T, GLU_ACT[GLU_GEGLU_ERF]>;
    t.glu2[dt][GLU_GEGLU_TANH] = glu2_k<T, GLU_ACT[GLU_GEGLU_TANH]>;
    t.glu2_bwd[dt][GLU_SWIGLU] = gated_bwd_k<T, GLU_ACT[GLU_SWIGLU]>;
    t.glu2_bwd[dt][GLU_GEGLU_ERF] = gated_bwd_k<T, GLU_ACT[GLU_GEGLU_ERF]>;
    t.glu2_bwd[dt][GLU_GEGLU_TANH] = gated_bwd_k<T, GLU_ACT[GLU_GEGLU_TANH]>;
    t.dglu[dt][DA_GELU_TANH] = dglu_halves_k<T, DA_GELU_TANH>;
    t.dglu[dt][DA_SILU] = dglu_halves_k<T, DA_SILU>;
    t.dglu[dt][DA_QGELU] = dglu_halves_k<T, DA_QGELU>;
    t.dglu[dt][DA_RELU] = dglu_halves_k<T, DA_RELU>;
    t.dglu[dt][DA_SRELU] = dglu_halves_k<T, DA_SRELU>;
    t.dglu[dt][DA_SIGMOID] = dglu_halves_k<T, DA_SIGMOID>;
    t.gelu_erf_bwd[dt] = gelu_erf_bwd_k<T>;
}

}  // namespace

void fill_backward(KernelTable& t) {
    fill_t<float>(t, DT_F32);
    fill_t<f16>(t, DT_F16);
    fill_t<bf16>(t, DT_BF16);
}

}  // namespace TO_NS
}  // namespace to
