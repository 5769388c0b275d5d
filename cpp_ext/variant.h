// variant.h: what every per-ISA kernel file shares (included after simd.h / vmath.h).
#pragma once
#include "kernels.h"
#include "simd.h"

namespace to {
namespace TO_NS {

// Each op-family file fills its slots of the table (external linkage, distinct per ISA
// through the TO_NS namespace).
void fill_norm(KernelTable& t);
void fill_softmax(KernelTable& t);
void fill_activation(KernelTable& t);
void fill_rope(KernelTable& t);
void fill_optim(KernelTable& t);
void fill_common(KernelTable& t);
void fill_tex_train(KernelTable& t);
void fill_backward(KernelTable& t);

namespace {

// Full or partial (k < W lanes) load / store of lanes [p, p+k).
template <class T>
inline V ld(const T* p, int64_t k, float fill = 0.0f) { return k == W ? vload(p) : vload_part(p, k, fill); }
template <class T>
inline void st(T* p, V v, int64_t k) {
    if (k == W) vstore(p, v);
    else vstore_part(p, v, k);
}

// Sum of squares of a row: fp32 vector accumulators inside blocks of 1024 elements,
// blocks added in double, so a 2^24-element row keeps ~1e-7 relative accuracy while the
// inner loop stays pure SIMD.
template <class T>
inline double row_sumsq(const T* x, int64_t n) {
    double acc = 0.0;
    int64_t i = 0;
    while (i < n) {
        const int64_t e = (n - i > 1024) ? i + 1024 : n;
        V a0 = vset(0.0f), a1 = vset(0.0f);
        for (; i + 2 * W <= e; i += 2 * W) {
            V v0 = vload(x + i), v1 = vload(x + i + W);
            a0 = vfma(v0, v0, a0);
            a1 = vfma(v1, v1, a1);
        }
        for (; i < e; i += W) {
            V v = ld(x + i, e - i < W ? e - i : W);
            a0 = vfma(v, v, a0);
        }
        i = e;
        acc += (double)hsum(a0 + a1);
    }
    return acc;
}

// Sum of (x - c): same blocking as row_sumsq.
template <class T>
inline double row_sum(const T* x, int64_t n) {
    double acc = 0.0;
    int64_t i = 0;
    while (i < n) {
        const int64_t e = (n - i > 1024) ? i + 1024 : n;
        V a0 = vset(0.0f), a1 = vset(0.0f);
        for (; i + 2 * W <= e; i += 2 * W) {
            a0 = a0 + vload(x + i);
            a1 = a1 + vload(x + i + W);
        }
        for (; i < e; i += W) a0 = a0 + ld(x + i, e - i < W ? e - i : W);
        i = e;
        acc += (double)hsum(a0 + a1);
    }
    return acc;
}

// Sum of (x - c)^2 (two-pass variance: no cancellation, unlike E[x^2] - E[x]^2). pf: a
// prefetch of the next row (simd.h) stepped once per two vectors, when given.
template <class T>
inline double row_sumsq_centered(const T* x, int64_t n, float c, Prefetch* pf = nullptr) {
    const V vc = vset(c);
    double acc = 0.0;
    int64_t i = 0;
    while (i < n) {
        const int64_t e = (n - i > 1024) ? i + 1024 : n;
        V a0 = vset(0.0f), a1 = vset(0.0f);
        for (; i + 2 * W <= e; i += 2 * W) {
            if (pf) (*pf)();
            V v0 = vload(x + i) - vc, v1 = vload(x + i + W) - vc;
            a0 = vfma(v0, v0, a0);
            a1 = vfma(v1, v1, a1);
        }
        for (; i < e; i += W) {
            const int64_t k = e - i < W ? e - i : W;
            V v = ld(x + i, k, c) - vc;  // fill with c: padded lanes add 0
            a0 = vfma(v, v, a0);
        }
        i = e;
        acc += (double)hsum(a0 + a1);
    }
    return acc;
}

}  // namespace
}  // namespace TO_NS
}  // namespace to
