// variant.h: what every per-ISA kernel file shares (included after vmath.h; brings simd.h and rowio.h).
#pragma once
#include <type_traits>

#include "kernels.h"
#include "rowio.h"

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
// st for a value that is an fp32 product / sum / FMA of widened operands and scalars whose
// NaNs have a zero low half (rowio.h nan_free's condition): AVX2's bf16 rounds it without the
// NaN case, the same bits (tex_train.cpp sgd_loop's p and momentum, its scalars made so by
// bf16_nan_high; not Adam's: its fp32 moments may hold any payload).
template <class T>
inline void st_num(T* p, V v, int64_t k) {
#if TO_ISA == 1
    if constexpr (std::is_same_v<T, bf16>)
        if (k == W) return vstore(p, vpack16_num(p, v));
#endif
    st(p, v, k);
}

// f(i, k) over [0, n) a vector at a time: the full vectors with k == W, a constant once f is
// inlined (so ld/st's partial branch leaves the loop), then the tail once. The flat kernels
// (optim.cpp, tex_train.cpp sgd_k) wrote `k = min(n - i, W)` in every iteration instead, and
// kept that branch per load and store.
template <class F>
inline void for_vectors(int64_t n, F&& f) {
    int64_t i = 0;
    for (; i + W <= n; i += W) f(i, (int64_t)W);
    if (i < n) f(i, n - i);
}

// f(std::true_type{}) or f(std::false_type{}): a runtime flag as a constant of f's body, for
// kernels that compile one loop per combination of their flags (sgd_k, adam_k). A flag tested
// inside a loop GCC did not unswitch cost 2-4 instructions per vector.
template <class F>
inline void with_flag(bool b, F&& f) {
    if (b) f(std::true_type{});
    else f(std::false_type{});
}

// A row's sum (SQ: of squares; BOTH: the sum and the sum of squares together, for
// layer_norm's one-pass moments) in fp32 vector accumulators inside blocks of 1024 elements,
// blocks added in double, so a 2^24-element row keeps ~1e-7 relative accuracy while the
// inner loop stays pure SIMD. Src gives the row's vectors (RowSrc below: a row in memory;
// norm.cpp AddSrc: x + residual, stored as it goes; ShiftSrc: x - c). Taken a step at a time
// so that another loop can carry it: the norms sum row r+1 inside row r's write pass
// (norm.cpp). A step adds four vectors of the current block, vector j into a[j % 4] (q[j % 4]
// for the squares), or closes the block (its tail, its lanes into the double totals);
// finish() takes what the steps left. The additions happen in one order whoever steps it, so
// row r+1's statistics, and its output, are bitwise the same whether they rode on row r's
// write (at any output placement) or were summed on their own. Four chains, not two: summed
// alone (finish(): the first row of a call, every row of a one-row call) two were
// latency-bound in cache, 16 values per FMA latency (4 cycles on Zen 3); carried, the sum now
// runs half a write pass ahead of the write it rides on.
// (1, 4096) fp32 rms_norm 1.14-1.26x; at 8192 x 4096 the 16-bit norms 1.06-1.24x but bf16
// layer_norm 0.96-0.99x, fp32 0.94-1.04x (CONTRIBUTING "A row's statistics in four chains").
template <class Src, bool SQ, bool BOTH = false>
struct BlockSum {
    Src src;  // full(i): lanes [i, i+W); part(i, k): k of them, the rest 0
    int64_t n = 0, i = 0, e = 0;
    bool open = false;  // a block is being summed
    V a0 = vset(0.0f), a1 = vset(0.0f), a2 = vset(0.0f), a3 = vset(0.0f);
    V q0 = vset(0.0f), q1 = vset(0.0f), q2 = vset(0.0f), q3 = vset(0.0f);
    double acc = 0.0, accq = 0.0;  // accq: the squares' total, with BOTH
    BlockSum() = default;
    BlockSum(Src s, int64_t n_) : src(s), n(n_), e(n_ > 1024 ? 1024 : n_), open(n_ > 0) {}
    static inline V term(V v, V a) { return SQ ? vfma(v, v, a) : a + v; }
    static inline void add(V v, V& a, V& q) {
        a = term(v, a);
        if (BOTH) q = vfma(v, v, q);
    }
    inline void quad() {
        add(src.full(i), a0, q0);
        add(src.full(i + W), a1, q1);
        add(src.full(i + 2 * W), a2, q2);
        add(src.full(i + 3 * W), a3, q3);
        i += 4 * W;
    }
    void close() {  // the block's last < 4 vectors (only the row's last block has them), its lanes
        for (; i + W <= e; i += W) add(src.full(i), a0, q0);
        if (i < e) {
            add(src.part(i, e - i), a0, q0);
            i = e;
        }
        acc += (double)hsum((a0 + a1) + (a2 + a3));
        if (BOTH) accq += (double)hsum((q0 + q1) + (q2 + q3));
        a0 = a1 = a2 = a3 = q0 = q1 = q2 = q3 = vset(0.0f);
        open = i < n;
        e = (n - i > 1024) ? i + 1024 : n;
    }
    inline void operator()() {
        if (i + 4 * W <= e) quad();
        else if (open) close();
    }
    inline double finish() {
        while (open) {
            while (i + 4 * W <= e) quad();
            close();
        }
        return acc;
    }
};

// A row of T in memory as BlockSum's source.
template <class T>
struct RowSrc {
    const T* x;
    inline V full(int64_t i) const { return vload(x + i); }
    inline V part(int64_t i, int64_t k) const { return ld(x + i, k); }
};

template <class T, bool SQ>
using RowSum = BlockSum<RowSrc<T>, SQ>;

template <class T>
inline double row_sumsq(const T* x, int64_t n) { return RowSum<T, true>({x}, n).finish(); }

template <class T>
inline double row_sum(const T* x, int64_t n) { return RowSum<T, false>({x}, n).finish(); }

// layer_norm's statistics in one pass, shifted: sums of d = x - c and of d^2, c the mean of
// the row's first 64 elements (in L2 already: the row was prefetched during the row before).
// var = E[d^2] - E[d]^2 amplifies the fp32 lanes' rounding by E[d^2] / var = 1 + E[d]^2 / var;
// E[d]^2 is ~var/64 for a row of independent values. Where E[d]^2 > E[d^2] / 8 (a factor
// above 8/7: ~0.3 % of such rows by the normal tail, computed, not counted; more where a
// row's head is not typical of it, and every row whose values trend) norm.cpp layer_norm_k
// takes the two-pass statistics from cache instead.
template <class T>
struct ShiftSrc {
    const T* x;
    float c;
    V vc;
    inline V full(int64_t i) const { return vload(x + i) - vc; }
    inline V part(int64_t i, int64_t k) const { return ld(x + i, k, c) - vc; }  // padded lanes: c - c = 0
};

template <class T>
using RowMoments = BlockSum<ShiftSrc<T>, false, true>;

template <class T>
inline float head_mean(const T* x, int64_t n) {
    const int64_t k = n < 64 ? n : 64;
    V s = vset(0.0f);
    for (int64_t i = 0; i < k; i += W) s = s + ld(x + i, k - i < W ? k - i : W);
    return k ? hsum(s) / (float)k : 0.0f;
}

template <class T>
inline RowMoments<T> moments_of(const T* x, int64_t n, bool any) {
    const float c = any ? head_mean(x, n) : 0.0f;
    return RowMoments<T>({x, c, vset(c)}, any ? n : 0);
}

// Sum of (x - c)^2 (two-pass variance: no cancellation, unlike E[x^2] - E[x]^2).
template <class T>
inline double row_sumsq_centered(const T* x, int64_t n, float c) {
    return BlockSum<ShiftSrc<T>, true>({x, c, vset(c)}, n).finish();
}

}  // namespace
}  // namespace TO_NS
}  // namespace to
