// tex_train.cpp: the training-side tex kernels (compiled once per ISA variant): the plain
// activation derivatives (optionally with the bias gradient; the gated ones are backward.cpp's
// gated_bwd_k; TE's scaled softmax is softmax.cpp's), fused RoPE over (token, head) rows with a
// position per token, and the SGD step. fp32 math for every storage dtype.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "vmath.h"
#include "variant.h"
#include "lut16.h"

namespace to {
namespace TO_NS {
namespace {

// The shared constants (tests/test_kernel_constants.py reads vmath.h's copies), written here as
// products of named values so that the folded forms below visibly derive from them.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
// tanh-GELU's -2u*log2(e) = x*(c1 + c2 x^2), u = sqrt(2/pi)(x + 0.044715 x^3) (vgelu_tanh's fold)
constexpr float kGeluC1 = -2.0f * kSqrt2OverPi * kLog2e;
constexpr float kGeluC2 = -2.0f * kSqrt2OverPi * kGeluCubic * kLog2e;
constexpr float kQgelu = 1.702f;

// act'(x) for the plain activations (DA_*); the gated kernels also need act(x) itself. s and
// 1 - s from vsig_parts (vmath.h).
template <int OP>
inline V dact_v(V x) {
    V s, om;
    if (OP == DA_GELU_TANH) {
        // tanh-GELU: with s = sigmoid(2u) = (1 + tanh u)/2, u = k0 (x + 0.044715 x^3):
        // d/dx = s + 2 k0 x s (1 - s) (1 + 3*0.044715 x^2)
        vsig_parts(x * vfma(x * x, vset(kGeluC2), vset(kGeluC1)), s, om);
        V t = vset(2.0f * kSqrt2OverPi) * x * s * om;
        return vfma(t, vfma(x * x, vset(3.0f * kGeluCubic), vset(1.0f)), s);
    }
    if (OP == DA_SILU) {
        vsig_parts(x * vset(-kLog2e), s, om);
        return s * vfma(x, om, vset(1.0f));
    }
    if (OP == DA_QGELU) {
        vsig_parts(x * vset(-kLog2e * kQgelu), s, om);
        return vfma(vset(kQgelu) * x, s * om, s);
    }
    if (OP == DA_RELU) return vsel(vlt(vset(0.0f), x), vset(1.0f), vset(0.0f));
    if (OP == DA_SRELU) return vset(2.0f) * vmax(vset(0.0f), x);  // NaN in x stays NaN
    vsig_parts(x * vset(-kLog2e), s, om);  // DA_SIGMOID
    return s * om;
}

// v as the output stores it, its value added to the column sums in acc (the bias gradient sums
// what the output holds, as TE's dbias of the stored d-activation does). A 16-bit T returns the
// bits (simd.h H), which write_row stores as they are: one rounding per element, where rounding
// for the sum and again inside the store cost AVX2 bf16 nine instructions per 8 lanes twice.
// simd.h vround16 gives both: for bf16 without AVX512_BF16 the rounded word masked (one vpandd)
// instead of the packed bits widened back (vpmovzxwd, a p5 uop beside vpmovdw's two, + vpslld).
template <class T>
inline auto stored_summed(V v, float* acc) {
    if constexpr (sizeof(T) == sizeof(float)) {
        vstore(acc, vload(acc) + v);
        return v;
    } else {
        H h;
        vstore(acc, vload(acc) + vround16((const T*)nullptr, v, h));
        return h;
    }
}
template <class T>
inline auto stored_summed(V v, float* acc, int64_t k) {
    if constexpr (sizeof(T) == sizeof(float)) {
        vstore_part(acc, vload_part(acc, k, 0.f) + v, k);
        return v;
    } else {
        H h;
        vstore_part(acc, vload_part(acc, k, 0.f) + vround16((const T*)nullptr, v, h), k);
        return h;
    }
}

// TE's drelu of 16-bit operands on their codes: g * (x > 0 ? 1 : 0) rounded, without widening or
// rounding: g where x > 0 (not NaN), else g * 0 (a zero of g's sign; the default NaN for an
// infinite g); a NaN g stays NaN, quiet bit set. Bitwise what the widening form gives on AVX2 /
// AVX-512 (the avx512bf16 variant flushed denormal results; this keeps them, as relu does),
// at the cost of its loads and stores: bf16 drelu read 0.72 of the ceiling on a Zen 1, 0.75 on
// Zen 3 (CONTRIBUTING.md "A Zen 1 host").
template <class T>
struct Drelu16 {
    static constexpr int16_t INF = std::is_same<T, bf16>::value ? 0x7f80 : 0x7c00;
    static constexpr int16_t QUIET = std::is_same<T, bf16>::value ? 0x0040 : 0x0200;
    static constexpr int16_t DNAN = std::is_same<T, bf16>::value ? (int16_t)0xffc0 : (int16_t)0xfe00;  // inf * 0
    static constexpr int16_t SIGN = INT16_MIN;
    static inline uint16_t one(uint16_t g, uint16_t x) {
        if ((g & 0x7fff) > (uint16_t)INF) return (uint16_t)(g | QUIET);
        if ((int16_t)x > 0 && (x & 0x7fff) <= (uint16_t)INF) return g;
        if ((g & 0x7fff) == (uint16_t)INF) return (uint16_t)DNAN;
        return g & 0x8000u;
    }
    static inline S16 vec(S16 g, S16 x) {
        const S16 mag = g & s16_splat(0x7fff), inf = s16_splat(INF);
        const S16 gnan = mag > inf, ginf = mag == inf;
        const S16 xpos = (x > S16{}) & ~((x & s16_splat(0x7fff)) > inf);
        const S16 zero = (ginf & s16_splat(DNAN)) | (~ginf & g & s16_splat(SIGN));
        const S16 r = (xpos & g) | (~xpos & zero);
        return (~gnan & r) | (gnan & (g | s16_splat(QUIET)));
    }
};

template <class T>
void drelu16_flat(const uint16_t* g, const uint16_t* x, uint16_t* y, int64_t count, bool nt) {
    if constexpr (W == 1) {
        for (int64_t i = 0; i < count; ++i) y[i] = Drelu16<T>::one(g[i], x[i]);
    } else {
        write_row16(
            y, count, nt, [&](int64_t e) { return Drelu16<T>::one(g[e], x[e]); },
            [&](int64_t e) { return Drelu16<T>::vec(s16_load(g + e), s16_load(x + e)); },
            [&](int64_t e, int64_t k) { return Drelu16<T>::vec(s16_load_part(g + e, k), s16_load_part(x + e, k)); });
    }
}

// y = g * act'(x) over rows x n; with acc (fp32 [n]) the column sums of y are added to it.
// act'(x) of a bf16 x is read from its table (lut16.h) on AVX2 and scalar, of an fp16 x on
// AVX2, except relu's and squared relu's, cheaper computed.
template <class T, int OP>
void dact_k(const void* gv, const void* xv, void* yv, int64_t rows, int64_t n, float* acc, bool nt) {
    const T* g = (const T*)gv;
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    constexpr bool ON = use_lut16<T>(true) && OP != DA_RELU && OP != DA_SRELU;
    const auto d = of_codes<T, ON>([](V v) { return dact_v<OP>(v); });
    if constexpr (OP == DA_RELU && sizeof(T) == 2) {
        if (!acc) {  // flat: on the codes (Drelu16 above)
            drelu16_flat<T>((const uint16_t*)gv, (const uint16_t*)xv, (uint16_t*)yv, rows * n, nt);
            if (nt) stream_fence();
            return;
        }
    }
    if (!acc) {  // flat
        const int64_t cnt = rows * n;
        const auto full = [&](int64_t i) { return vload(g + i) * d.full(x + i); };
        const auto part = [&](int64_t i, int64_t k) { return vload_part(g + i, k, 0.f) * d.part(x + i, k); };
        write_row(y, cnt, nt, nan_free<T>(full), nan_free<T>(part));  // rowio.h nan_free: products
    } else {
        // Row by row. Rows in pairs (one load and store of the fp32 column sums per two rows,
        // the second row's output streamed beside the first's) gained 1.05-1.07x on an Intel
        // Cascade Lake but made 16-bit dbias 1.56-2.14x slower on an AMD EPYC Zen 3; with plain
        // stores for the second row still ~6% slower there, at cached sizes 0.95-1.03x
        // (CONTRIBUTING.md, "dbias rows in pairs").
        for (int64_t r = 0; r < rows; ++r) {
            const T* gr = g + r * n;
            const T* xr = x + r * n;
            // write_row visits each index once (aligned body, partial head/tail): the column sums
            // are added as the values are produced
            write_row(
                y + r * n, n, nt, [&](int64_t i) { return stored_summed<T>(vload(gr + i) * d.full(xr + i), acc + i); },
                [&](int64_t i, int64_t k) {
                    return stored_summed<T>(vload_part(gr + i, k, 0.f) * d.part(xr + i, k), acc + i, k);
                });
        }
    }
    if (nt) stream_fence();
}

// The gated derivatives (dglu: TE's dswiglu, dgeglu, ...) are backward.cpp's gated_bwd_k, the one
// definition glu2_bwd uses too.

// Fused RoPE over rows of (token, head): x (tokens, heads, d), row (t, h) uses the angles of
// position pos[t]: cos/sin (P, d2) fp32. On the first d2 channels y = x*cos + rot(x)*sin
// (transpose: the backward, x*cos + rot^T(x*sin)); channels d2..d are copied.
template <class T>
void trope_k(const void* xv, const float* cosp, const float* sinp, const int64_t* pos, void* yv, int64_t t0,
             int64_t t1, int64_t heads, int64_t d, int64_t d2, bool interleaved, bool transpose, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    const int64_t h2 = d2 / 2;
    const float sg = transpose ? -1.0f : 1.0f;  // rot(x) = (-x2, x1); rot^T(x) = (x2, -x1)
    for (int64_t t = t0; t < t1; ++t) {
        const float* c = cosp + pos[t] * d2;
        const float* s = sinp + pos[t] * d2;
        for (int64_t hh = 0; hh < heads; ++hh) {
            const T* xr = x + (t * heads + hh) * d;
            T* yr = y + (t * heads + hh) * d;
            if (!interleaved) {
                const T* x1 = xr;
                const T* x2 = xr + h2;
                // forward: y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2; backward: y1 = x1 c1 + x2 s2, y2 = x2 c2 - x1 s1
                const float* sa = transpose ? s + h2 : s;
                const float* sb = transpose ? s : s + h2;
                write_row(
                    yr, h2, nt, [&](int64_t i) { return vfma(vload(x2 + i) * vset(-sg), vload(sa + i), vload(x1 + i) * vload(c + i)); },
                    [&](int64_t i, int64_t k) {
                        return vfma(vload_part(x2 + i, k, 0.f) * vset(-sg), vload_part(sa + i, k, 0.f),
                                    vload_part(x1 + i, k, 0.f) * vload_part(c + i, k, 0.f));
                    });
                write_row(
                    yr + h2, h2, nt,
                    [&](int64_t i) { return vfma(vload(x1 + i) * vset(sg), vload(sb + i), vload(x2 + i) * vload(c + h2 + i)); },
                    [&](int64_t i, int64_t k) {
                        return vfma(vload_part(x1 + i, k, 0.f) * vset(sg), vload_part(sb + i, k, 0.f),
                                    vload_part(x2 + i, k, 0.f) * vload_part(c + h2 + i, k, 0.f));
                    });
            } else {
                // forward y[j] = x[j] c[j] + (j odd ? x[j-1] : -x[j+1]) s[j];
                // backward y[j] = x[j] c[j] + (j odd ? -x[j-1] s[j-1] : x[j+1] s[j+1])
                alignas(64) float buf[W];
                auto part = [&](int64_t i, int64_t k) {
                    for (int64_t q = 0; q < W; ++q) {
                        const int64_t j = i + q;
                        if (q >= k) { buf[q] = 0.f; continue; }
                        const float o = to_f32(xr[j ^ 1]);
                        float v = to_f32(xr[j]) * c[j];
                        if (!transpose) v += ((j & 1) ? o : -o) * s[j];
                        else v += ((j & 1) ? -o * s[j - 1] : o * s[j + 1]);
                        buf[q] = v;
                    }
                    return vload(buf);
                };
#if TO_ISA == 0
                write_row(yr, d2, nt, [&](int64_t i) { return part(i, 1); }, part);
#else
                alignas(64) float sgv[W];
                for (int q = 0; q < W; ++q) sgv[q] = ((q & 1) ? 1.f : -1.f) * sg;
                const V sign = vload(sgv);
                auto full = [&](int64_t i) {
                    if (i & 1) return part(i, W);  // pairs straddle lanes: slow but right
                    V vx = vload(xr + i);
                    if (!transpose) return vfma(vswap_pairs(vx) * sign, vload(s + i), vx * vload(c + i));
                    return vfma(vswap_pairs(vx * vload(s + i)) * sign, vset(1.0f), vx * vload(c + i));
                };
                write_row(yr, d2, nt, full, part);
#endif
            }
            if (d2 < d)
                write_row(
                    yr + d2, d - d2, nt, [&](int64_t i) { return vload(xr + d2 + i); },
                    [&](int64_t i, int64_t k) { return vload_part(xr + d2 + i, k, 0.f); });
        }
    }
    if (nt) stream_fence();
}

// Column sums of x (rows, n), added to tot (fp64 [n]): cuBLASLt's BGRADB epilogue (the bias
// gradient of a GEMM), which TE asks for on every Linear's weight-gradient GEMM. Rows are
// streamed in order into fp32 sums of blocks of 64 rows (blk: fp32 [n] scratch, L1/L2-resident
// for n up to ~16K), each block folded into fp64: a 64-term fp32 error bound whatever the row
// count, at the speed of reading x (4096x8192 fp32, 2 threads: 4.6 ms against torch's sum(0) 7.9).
template <class T>
void colsum_k(const void* xv, int64_t rows, int64_t n, float* blk, double* tot) {
    const T* x = (const T*)xv;
    for (int64_t r0 = 0; r0 < rows; r0 += 64) {
        const int64_t r1 = r0 + 64 < rows ? r0 + 64 : rows;
        for (int64_t j = 0; j < n; j += W) {
            const int64_t k = n - j < W ? n - j : W;
            st(blk + j, ld(x + r0 * n + j, k), k);
        }
        int64_t r = r0 + 1;
        for (; r + 4 <= r1; r += 4) {  // four rows per pass over blk: a quarter of its loads and stores
            const T* xr = x + r * n;
            for (int64_t j = 0; j < n; j += W) {
                const int64_t k = n - j < W ? n - j : W;
                V a = ld(xr + j, k) + ld(xr + n + j, k);
                V b = ld(xr + 2 * n + j, k) + ld(xr + 3 * n + j, k);
                st(blk + j, ld(blk + j, k) + (a + b), k);
            }
        }
        for (; r < r1; ++r) {
            const T* xr = x + r * n;
            for (int64_t j = 0; j < n; j += W) {
                const int64_t k = n - j < W ? n - j : W;
                st(blk + j, ld(blk + j, k) + ld(xr + j, k), k);
            }
        }
        for (int64_t j = 0; j < n; ++j) tot[j] += (double)blk[j];
    }
}

// SGD (apex/TE): g = grad*scale [+ wd p]; momentum buffer; [+ wd p after]; p -= lr g.
// One loop per combination of the flags, its parameters in locals. Before, the loop read them
// through sgd_k's `a`: GCC loaded every field again per vector (a store through p or b may alias
// *a as far as it knows) and tested the flags there, 5.9 instructions per fp32 value and 10.1 per
// bf16 (callgrind, AVX2; now 1.5 and 4.4), so that bf16 ran no faster than fp32.
template <class T, bool WD_BEFORE, bool WD_AFTER, bool MOM, bool FIRST, bool NESTEROV>
void sgd_loop(const T* g, T* p, T* b, int64_t n, const SgdParams q) {
    const V scale = vset(q.scale), wd = vset(q.wd), mom = vset(q.momentum), damp = vset(1.0f - q.dampening),
            lr = vset(q.lr);
    for_vectors(n, [&](int64_t i, int64_t k) {
        const V pp = ld(p + i, k);
        V gg = ld(g + i, k) * scale;
        if constexpr (WD_BEFORE) gg = vfma_once(wd, pp, gg);
        if constexpr (MOM) {
            V buf = gg;
            if constexpr (!FIRST) buf = vfma_once(mom, ld(b + i, k), damp * gg);
            st_num(b + i, buf, k);  // variant.h st_num: products and FMAs
            gg = NESTEROV ? vfma_once(mom, buf, gg) : buf;
        }
        if constexpr (WD_AFTER) gg = vfma_once(wd, pp, gg);
        st_num(p + i, vfnma_once(lr, gg, pp), k);
    });
}

// A NaN scalar as a bf16 store keeps it: high half, quiet bit set, low half zero. sgd_loop's
// bf16 stores round without the NaN case (variant.h st_num), which is exact when every NaN it
// meets has a zero low half; a caller's lr = NaN with any payload then stores the bits
// bf16_round_word gives it (a payload of ones in the low half would otherwise carry into the
// sign: a NaN step storing zero). Any other dtype, or a number: unchanged.
template <class T>
inline float bf16_nan_high(float x) {
    if (!std::is_same_v<T, bf16> || !std::isnan(x)) return x;
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u & 0xffff0000u) | 0x00400000u;
    std::memcpy(&x, &u, 4);
    return x;
}

template <class T>
void sgd_k(const void* gv, void* pv, void* bv, int64_t n, const SgdParams* a) {
    SgdParams q = *a;
    q.scale = bf16_nan_high<T>(q.scale);
    q.wd = bf16_nan_high<T>(q.wd);
    q.momentum = bf16_nan_high<T>(q.momentum);
    q.dampening = bf16_nan_high<T>(q.dampening);
    q.lr = bf16_nan_high<T>(q.lr);
    with_flag(q.wd != 0.0f && !q.wd_after, [&](auto wd_before) {
        with_flag(q.wd != 0.0f && q.wd_after, [&](auto wd_after) {
            with_flag(q.momentum != 0.0f, [&](auto mom) {
                with_flag(q.first_run, [&](auto first) {
                    with_flag(q.nesterov, [&](auto nesterov) {
                        sgd_loop<T, wd_before(), wd_after(), mom(), first(), nesterov()>((const T*)gv, (T*)pv, (T*)bv,
                                                                                         n, q);
                    });
                });
            });
        });
    });
}

template <class T>
void fill_t(KernelTable& t, int dt) {
    t.dact[dt][DA_GELU_TANH] = dact_k<T, DA_GELU_TANH>;
    t.dact[dt][DA_SILU] = dact_k<T, DA_SILU>;
    t.dact[dt][DA_QGELU] = dact_k<T, DA_QGELU>;
    t.dact[dt][DA_RELU] = dact_k<T, DA_RELU>;
    t.dact[dt][DA_SRELU] = dact_k<T, DA_SRELU>;
    t.dact[dt][DA_SIGMOID] = dact_k<T, DA_SIGMOID>;
    t.trope[dt] = trope_k<T>;
    t.sgd[dt] = sgd_k<T>;
    t.colsum[dt] = colsum_k<T>;
}

}  // namespace

void fill_tex_train(KernelTable& t) {
    fill_t<float>(t, DT_F32);
    fill_t<f16>(t, DT_F16);
    fill_t<bf16>(t, DT_BF16);
}

}  // namespace TO_NS
}  // namespace to
