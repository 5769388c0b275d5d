// norm.cpp: rms_norm / layer_norm forward and backward (compiled once per ISA variant).
//
// Forward kernels are single pass over memory: the row (16 KiB for n = 4096 fp32) is
// read once for its statistics, stays in L1/L2, and is read again from cache for the
// write pass. Statistics are accumulated in fp32 lanes inside 1024-element blocks and
// in double across blocks (variant.h), so very long rows stay accurate.
#include "vmath.h"
#include "variant.h"

#include <cmath>

namespace to {
namespace TO_NS {
namespace {

template <class T>
void rms_norm_k(const void* xv, const void* wv, void* yv, int64_t rows, int64_t n, float eps,
                float* rsigma, bool zc, bool nt) {
    const T* x = (const T*)xv;
    const T* w = (const T*)wv;
    T* y = (T*)yv;
    const V one = vset(zc ? 1.0f : 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const double ms = row_sumsq(xr, n) / (double)n;
        const float rs = (float)(1.0 / std::sqrt(ms + (double)eps));
        if (rsigma) rsigma[r] = rs;
        const V vrs = vset(rs);
        write_row(
            yr, n, nt, [&](int64_t i) { return vload(xr + i) * vrs * (vload(w + i) + one); },
            [&](int64_t i, int64_t k) { return vload_part(xr + i, k, 0.f) * vrs * (vload_part(w + i, k, 0.f) + one); });
    }
    if (nt) stream_fence();
}

template <class T>
void layer_norm_row_f64(const T* xr, const T* w, const T* b, T* yr, int64_t n, float eps, bool zc,
                        float* mu, float* rsigma) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)to_f32(xr[i]);
    const double mean = sum / (double)n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double)to_f32(xr[i]) - mean;
        ss += d * d;
    }
    const double rs = 1.0 / std::sqrt(ss / (double)n + (double)eps);
    if (mu) *mu = (float)mean;
    if (rsigma) *rsigma = (float)rs;
    const double one = zc ? 1.0 : 0.0;
    for (int64_t i = 0; i < n; ++i) {
        double v = ((double)to_f32(xr[i]) - mean) * rs * ((double)to_f32(w[i]) + one);
        if (b) v += (double)to_f32(b[i]);
        put(yr + i, (float)v);
    }
}

template <class T>
void layer_norm_k(const void* xv, const void* wv, const void* bv, void* yv, int64_t rows, int64_t n,
                  float eps, float* mu, float* rsigma, bool zc, bool nt) {
    const T* x = (const T*)xv;
    const T* w = (const T*)wv;
    const T* b = (const T*)bv;
    T* y = (T*)yv;
    const V one = vset(zc ? 1.0f : 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const float mean = (float)(row_sum(xr, n) / (double)n);
        const double var = row_sumsq_centered(xr, n, mean) / (double)n;
        if (!std::isfinite(var) || !std::isfinite(mean)) {
            // The fp32 block sums overflowed (|x - mean| > ~1.8e19, e.g. FLT_MAX in the row):
            // redo this row in double so finite input never turns into "y = bias". Rare, so a
            // scalar loop is fine; NaN/Inf inputs still come out NaN as in NumPy.
            layer_norm_row_f64(xr, w, b, yr, n, eps, zc, mu ? mu + r : nullptr, rsigma ? rsigma + r : nullptr);
            continue;
        }
        const float rs = (float)(1.0 / std::sqrt(var + (double)eps));
        if (mu) mu[r] = mean;
        if (rsigma) rsigma[r] = rs;
        const V vm = vset(mean), vrs = vset(rs);
        if (b) {
            write_row(
                yr, n, nt,
                [&](int64_t i) { return vfma((vload(xr + i) - vm) * vrs, vload(w + i) + one, vload(b + i)); },
                [&](int64_t i, int64_t k) {
                    return vfma((vload_part(xr + i, k, 0.f) - vm) * vrs, vload_part(w + i, k, 0.f) + one,
                                vload_part(b + i, k, 0.f));
                });
        } else {
            write_row(
                yr, n, nt, [&](int64_t i) { return (vload(xr + i) - vm) * vrs * (vload(w + i) + one); },
                [&](int64_t i, int64_t k) {
                    return (vload_part(xr + i, k, 0.f) - vm) * vrs * (vload_part(w + i, k, 0.f) + one);
                });
        }
    }
    if (nt) stream_fence();
}

// sum_i a[i]*b[i]*c[i] over a row, blocked like row_sumsq.
template <class T>
inline double row_dot3(const T* a, const T* b, const T* c, int64_t n, const V add_c) {
    double acc = 0.0;
    int64_t i = 0;
    while (i < n) {
        const int64_t e = (n - i > 1024) ? i + 1024 : n;
        V s = vset(0.0f);
        for (; i < e; i += W) {
            const int64_t k = e - i < W ? e - i : W;
            s = vfma(ld(a + i, k) * (ld(b + i, k) + add_c), ld(c + i, k), s);
        }
        i = e;
        acc += (double)hsum(s);
    }
    return acc;
}

// y = x*rs*g'  (g' = g or 1+g):  dx = rs*(dz*g' - x*rs*c),  c = rs*mean(dz*g'*x),
// dgamma += dz*x*rs.
template <class T>
void rms_norm_bwd_k(const void* dzv, const void* xv, const float* rsigma, const void* gv, void* dxv,
                    float* dg, int64_t rows, int64_t n, bool zc) {
    const T* dz = (const T*)dzv;
    const T* x = (const T*)xv;
    const T* g = (const T*)gv;
    T* dx = (T*)dxv;
    const V one = vset(zc ? 1.0f : 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const T* dzr = dz + r * n;
        const T* xr = x + r * n;
        T* dxr = dx + r * n;
        const float rs = rsigma[r];
        const double s = row_dot3(dzr, g, xr, n, one);
        const float c = (float)((double)rs * s / (double)n);
        const V vrs = vset(rs), vk = vset(rs * rs * c);
        for (int64_t i = 0; i < n; i += W) {
            const int64_t k = n - i < W ? n - i : W;
            V vdz = ld(dzr + i, k), vx = ld(xr + i, k);
            V d = vfnma(vk, vx, vrs * vdz * (ld(g + i, k) + one));
            st(dxr + i, d, k);
            st(dg + i, vfma(vdz, vx * vrs, ld(dg + i, k)), k);
        }
    }
}

// xh = (x-mu)*rs, dy = dz*g':  dx = rs*(dy - mean(dy) - xh*mean(dy*xh)),
// dgamma += dz*xh, dbeta += dz.
template <class T>
void layer_norm_bwd_k(const void* dzv, const void* xv, const float* mu, const float* rsigma, const void* gv,
                      void* dxv, float* dg, float* db, int64_t rows, int64_t n, bool zc) {
    const T* dz = (const T*)dzv;
    const T* x = (const T*)xv;
    const T* g = (const T*)gv;
    T* dx = (T*)dxv;
    const V one = vset(zc ? 1.0f : 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const T* dzr = dz + r * n;
        const T* xr = x + r * n;
        T* dxr = dx + r * n;
        const float rs = rsigma[r], m = mu[r];
        const V vm = vset(m), vrs = vset(rs);
        double s1 = 0.0, s2 = 0.0;
        int64_t i = 0;
        while (i < n) {
            const int64_t e = (n - i > 1024) ? i + 1024 : n;
            V a1 = vset(0.0f), a2 = vset(0.0f);
            for (; i < e; i += W) {
                const int64_t k = e - i < W ? e - i : W;
                V dy = ld(dzr + i, k) * (ld(g + i, k) + one);
                V xh = (ld(xr + i, k) - vm) * vrs;
                a1 = a1 + dy;
                a2 = vfma(dy, xh, a2);
            }
            i = e;
            s1 += (double)hsum(a1);
            s2 += (double)hsum(a2);
        }
        const V va = vset((float)(s1 / (double)n)), vb = vset((float)(s2 / (double)n));
        for (i = 0; i < n; i += W) {
            const int64_t k = n - i < W ? n - i : W;
            V vdz = ld(dzr + i, k);
            V xh = (ld(xr + i, k) - vm) * vrs;
            V dy = vdz * (ld(g + i, k) + one);
            st(dxr + i, vrs * vfnma(xh, vb, dy - va), k);
            st(dg + i, vfma(vdz, xh, ld(dg + i, k)), k);
            if (db) st(db + i, ld(db + i, k) + vdz, k);
        }
    }
}

}  // namespace

void fill_norm(KernelTable& t) {
    t.rms_norm[DT_F32] = rms_norm_k<float>;
    t.rms_norm[DT_F16] = rms_norm_k<f16>;
    t.rms_norm[DT_BF16] = rms_norm_k<bf16>;
    t.layer_norm[DT_F32] = layer_norm_k<float>;
    t.layer_norm[DT_F16] = layer_norm_k<f16>;
    t.layer_norm[DT_BF16] = layer_norm_k<bf16>;
    t.rms_norm_bwd[DT_F32] = rms_norm_bwd_k<float>;
    t.rms_norm_bwd[DT_F16] = rms_norm_bwd_k<f16>;
    t.rms_norm_bwd[DT_BF16] = rms_norm_bwd_k<bf16>;
    t.layer_norm_bwd[DT_F32] = layer_norm_bwd_k<float>;
    t.layer_norm_bwd[DT_F16] = layer_norm_bwd_k<f16>;
    t.layer_norm_bwd[DT_BF16] = layer_norm_bwd_k<bf16>;
}

}  // namespace TO_NS
}  // namespace to
