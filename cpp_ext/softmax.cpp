// softmax.cpp: the row softmax, forward and backward (compiled once per ISA variant): one row
// kernel for the facade's softmax and TransformerEngine's scaled softmax (plain / masked /
// causal, tex), and TE's backward, which tensor_ops.torch's autograd uses too.
//
// Two passes over a row that stays in cache (softmax_row says why two): e = exp(z - c), c a
// shift near the row's max, written to a per-thread fp32 scratch row while summing (and the
// row's max found); y = e * (1/sum). The scratch (not y) holds e so 16-bit outputs are
// rounded once, and so the final write can be a non-temporal store (writing y twice, once
// cached and once streamed, measured 30% slower at 8192x4096). The next row is prefetched
// across both passes (rowio.h Prefetch); AVX-512 fp32 rows on 64-byte lines (the facade's, TE's
// plain and masked) run row r + 1's exp pass inside row r's write instead (softmax_rows.h). NaN in a row, or +Inf
// (Inf - Inf), gives a NaN row, as the float64 formula does.
#include <cstring>
#include <utility>
#include <type_traits>

#include "vmath.h"
#include "variant.h"

namespace to {
namespace TO_NS {
namespace {

// Lanes of W mask bytes that are 1 (TE's uint8 attention mask: only 1 masks; TE's kernel
// tests `mask != 1`, so 0, 2 or 255 keep the logit, as the reference's mask == 1).
inline M vmask_u8(const uint8_t* p) {
#if TO_ISA == 2
    return {_mm_cmpeq_epi8_mask(_mm_loadu_si128((const __m128i*)p), _mm_set1_epi8(1))};
#elif TO_ISA == 1
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
    return {_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, _mm256_set1_epi32(1)))};
#else
    return {p[0] == 1};
#endif
}

// TE's masked softmax multiplies its row by 0 where the row's max is -10000 (`scale_value`:
// every logit masked, or none above the mask's value), else by 1; the factor goes into 1/sum,
// and 0/NaN keeps a NaN row NaN. The other forms: 1.
inline double mask_scale(bool masked, float row_max) { return masked && row_max == -10000.0f ? 0.0 : 1.0; }

// The lines of [p, p + bytes) into L2 (see rowio.h Prefetch).
inline void prefetch_l2(const void* p, int bytes) {
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch((const char*)p + b, 0, 2);
}

// Lanes [0, k) of v, the rest `fill` (-Inf for a max, 0 past a causal row's end).
inline V lanes_below(V v, int64_t k, float fill) {
    alignas(64) float t[W];
    vstore(t, v);
    return vload_part(t, k, fill);
}

// A causal row's write (len < n): y[0, len) = e * inv, y[len, n) = 0 - exactly 0 also in the
// vector that holds the row's end, where a NaN row's inv would make the padded lanes 0 * NaN
// (TE's kernel writes 0 past the limit, whatever the row holds). pf is stepped as write_row
// steps it and returned (softmax_rows.h passes the next row's exp steps in it).
template <class T, class PF>
inline PF write_causal(T* yr, int64_t n, int64_t len, const float* e, V inv, bool nt, PF pf) {
    const auto head = [&](int64_t j, int64_t k) {  // lanes [j, j + k), k <= W; len - j of them count
        const int64_t c = len - j < k ? (len > j ? len - j : 0) : k;
        return c == 0 ? vset(0.0f) : lanes_below(vload_part(e + j, c, 0.f) * inv, c, 0.0f);
    };
    return write_row(
        yr, n, nt,
        [&](int64_t j) {
            if (j + W <= len) return vload(e + j) * inv;
            return head(j, W);
        },
        head, pf);
}

// One row: yr[0, len) = softmax(z[0, len)), yr[len, n) = 0 (TE's causal rows), len >= 1.
// z(i) gives the logits of lanes [i, i+W), zp(i, k) those of a partial vector (lanes >= k
// anything: they are dropped here). e: n floats of scratch. masked: TE's masked form, whose
// row is 0 where its max is -10000 (mask_scale).
//
// Two passes over the row, not three: softmax(z) = e^(z - c) / sum e^(z - c) for any shift
// c, so the exp pass shifts by c = the max of the row's first SHIFT_LANES logits (a short
// pass, from cache afterwards) and finds the row's max M as it goes, instead of a whole max
// pass first. The max pass cost bf16 as much as the store it saved: bf16 softmax ran 0.46-0.56
// of the ceiling, bound by instructions (the logits widened twice, 8192 x 4096 in 3.5-4.1 ms
// against the copy's 2.0). Where M - c > SHIFT_MAX (or M is NaN / Inf, or c is -Inf) the exp
// pass runs again with c = M, the three-pass result: within SHIFT_MAX the shift's cost is
// the argument's rounding, |z - c| 2^-24 <= 7e-7 relative (fp32's rtol is 1.3e-6), and
// e^(z - c) <= e^12 per lane keeps the fp32 sums far from overflow. NaN anywhere gives a
// NaN row (e^NaN joins the sum), +Inf a NaN row (Inf - Inf), as the float64 formula does.
// KEEP: the three passes, the first over the whole row storing z in e (c is then the row's
// max) and the exp pass reading it back, for logits that cost more to recompute than a load:
// the mask's on 16-bit data (aligned out=, 3 copies of each build against the two-kernel
// build: bf16 masked recomputed 0.85x, kept 0.99-1.00x). The two-pass form ran it 0.83-0.87x
// (fp16, ab_builds.py --ops tex_softmax_mask --copies 2 --rounds 9, Zen 5): its exp pass then
// waits on memory with the mask's and the conversion's arithmetic, where the first pass alone
// had streamed the row in.
constexpr int64_t SHIFT_LANES = 256;
constexpr float SHIFT_MAX = 12.0f;

template <bool KEEP, class T, class Z, class ZP>
__attribute__((flatten)) inline void softmax_row(T* yr, int64_t n, int64_t len, float* e, bool nt, Prefetch pf,
                                                 const Z& z_, const ZP& zp_, bool masked = false) {
    constexpr bool LP = sizeof(T) == 2;  // a 16-bit output: vexp_shift's cheaper form
    // AVX-512 fp16 rows without a causal tail, on an Intel core (g_softmax_exp_twice,
    // kernels.h): exp computed again in the write pass instead of
    // stored in e and read back (the same bits: the same lane-wise function of the same logits).
    // The write pass then spaces its streaming stores with the exp's arithmetic instead of
    // bursting them (perf annotate, one thread: 42 % of the kernel's samples on the write pass's
    // vcvtps2ph / vmovntdq). ab_builds.py --ops softmax --copies 3 --rounds 11, Intel Cascade
    // Lake: avx512 fp16 1.18x in three runs (tex_softmax 1.13x), bf16 0.88x (its widen and pack
    // make the second exp too dear), the AVX2 variant's fp16 0.92x. On Zen 4, which splits
    // each 512-bit instruction in two, the second exp is the loss: the stored form is 1.50x
    // (softmax) and 1.54x (tex_softmax) faster there (ab_builds.py --copies 3 --rounds 9);
    // on Zen 5, whose 512-bit pipes are whole, still 1.15-1.17x (both forms in one process,
    // _set_tuning(softmax_exp_twice=) alternating, 8192 x 4096, two runs): so AMD stores.
    const auto z = [&](int64_t i) {
        if (!KEEP) return z_(i);
        const V v = z_(i);
        vstore(e + i, v);
        return v;
    };
    const auto zp = [&](int64_t i, int64_t k) {
        if (!KEEP) return zp_(i, k);
        const V v = zp_(i, k);
        vstore_part(e + i, v, k);
        return v;
    };
    // the exp pass's logits: recomputed, or the stored ones
    const auto z2 = [&](int64_t i) { return KEEP ? vload(e + i) : z_(i); };
    const auto zp2 = [&](int64_t i, int64_t k) { return KEEP ? vload_part(e + i, k, 0.f) : zp_(i, k); };
    const bool rc = !KEEP && TO_ISA == 2 && std::is_same_v<T, f16> && len == n && g_softmax_exp_twice;
    const float ninf = -__builtin_inff();
    float c;
    {
        const int64_t end = (KEEP || len < SHIFT_LANES) ? len : SHIFT_LANES;
        V m0 = vset(ninf), m1 = vset(ninf);
        int64_t i = 0;
        for (; i + 2 * W <= end; i += 2 * W) {
            m0 = vmax(m0, z(i));
            m1 = vmax(m1, z(i + W));
        }
        for (; i + W <= end; i += W) m0 = vmax(m0, z(i));
        if (i < end) m0 = vmax(m0, lanes_below(zp(i, end - i), end - i, ninf));
        c = hmax(vmax(m0, m1));
    }
    // e = e^(z - c) over the row (stored unless rc), its sum; the row's max when `track`
    // (a constant: std::true_type / false_type)
    const auto exp_pass = [&](float shift, auto track_c, float& mx) {
        constexpr bool track = decltype(track_c)::value;
        const V vc = vset(shift);
        V m0 = vset(ninf), m1 = vset(ninf);
        double sum = 0.0;
        int64_t i = 0;
        while (i < len) {
            const int64_t end = (len - i > 1024) ? i + 1024 : len;
            // Two independent chains: exp is ~15 dependent instructions deep.
            V s0 = vset(0.0f), s1 = vset(0.0f);
            for (; i + 2 * W <= end; i += 2 * W) {
                pf();
                const V z0 = z2(i), z1 = z2(i + W);
                if constexpr (track) {
                    m0 = vmax(m0, z0);
                    m1 = vmax(m1, z1);
                }
                const V v0 = vexp_shift<LP>(z0, vc), v1 = vexp_shift<LP>(z1, vc);
                if (!rc) {
                    vstore(e + i, v0);
                    vstore(e + i + W, v1);
                }
                s0 = s0 + v0;
                s1 = s1 + v1;
            }
            for (; i < end; i += W) {
                const int64_t k = end - i < W ? end - i : W;
                const V zz = k == W ? z2(i) : zp2(i, k);
                if constexpr (track) m0 = vmax(m0, k == W ? zz : lanes_below(zz, k, ninf));
                V v = vexp_shift<LP>(zz, vc);
                st(e + i, v, k);
                if (k < W) v = vload_part(e + i, k, 0.0f);  // padded lanes must not count
                s0 = s0 + v;
            }
            i = end;
            sum += (double)hsum(s0 + s1);
        }
        if constexpr (track) mx = hmax(vmax(m0, m1));
        return sum;
    };
    float mx = c;
    double sum = KEEP ? exp_pass(c, std::false_type{}, mx) : exp_pass(c, std::true_type{}, mx);
    if (!KEEP && !(mx - c <= SHIFT_MAX)) {  // far above the shift, Inf or NaN: shift by the row's max
        c = mx;
        sum = exp_pass(c, std::false_type{}, mx);
    }
    const V vm = vset(c);
    const V inv = vset((float)(mask_scale(masked, mx) / sum));  // mx: the row's max (KEEP: c)
    if (rc) {
        write_row(
            yr, n, nt, [&](int64_t j) { return vexp_shift<LP>(z_(j), vm) * inv; },
            [&](int64_t j, int64_t k) { return vexp_shift<LP>(zp_(j, k), vm) * inv; }, pf);
    } else if (len == n) {  // rowio.h nan_free: products
        const auto full = [&](int64_t j) { return vload(e + j) * inv; };
        const auto part = [&](int64_t j, int64_t k) { return vload_part(e + j, k, 0.f) * inv; };
        write_row(yr, n, nt, nan_free<T>(full), nan_free<T>(part), pf);
    } else {
        write_causal(yr, n, len, e, inv, nt, pf);
    }
}

}  // namespace
}  // namespace TO_NS
}  // namespace to

#include "softmax_rows.h"

namespace to {
namespace TO_NS {
namespace {

// The facade's softmax over rows of n (scratch: softmax_scratch(n) floats).
template <class T>
void softmax_k(const void* xv, void* yv, int64_t rows, int64_t n, float* scratch, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    if (softmax_lines<T>(x, y, n)) {
        if constexpr (std::is_same_v<T, float>)
            softmax_rows_pipelined(x, y, rows, n, [n](int64_t) { return std::make_pair(Logits<false>(), n); },
                                   scratch, nt);
    } else {
        for (int64_t r = 0; r < rows; ++r) {
            const T* xr = x + r * n;
            softmax_row<false>(
                y + r * n, n, n, scratch, nt, next_row(xr, n, r + 1 < rows, 2 * n),
                [&](int64_t i) { return vload_permw(xr + i); }, [&](int64_t i, int64_t k) { return vload_part(xr + i, k, 0.f); });
        }
    }
    if (nt) stream_fence();
}

// TE's scaled softmax over rows of n: z = x*scale; mode SM_MASK: where mask[j] == 1, z = -10000,
// and a row whose max is -10000 gives 0 (every element masked, or none above -10000 - TE's
// rule, mask_scale); SM_CAUSAL: only j <= lim (row r's limit) count, the rest (and rows with
// lim < 0) give 0.
template <class T>
void tsoftmax_k(const void* xv, void* yv, int64_t rows, int64_t n, float scale, int mode, const uint8_t* mask,
                int64_t mask_batches, int64_t heads, int64_t row0, int64_t sq, int64_t causal_off, float* e, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    const Logits<true> plain(scale);
    const auto mask_row = [&](int64_t grow) {  // mask [b|1, 1, sq, sk]
        const int64_t mb = mask_batches == 1 ? 0 : (grow / sq) / heads;
        return mask + mb * sq * n + (grow % sq) * n;
    };
    const auto causal_len = [&](int64_t grow) {  // the allowed columns, j <= lim
        const int64_t lim = grow % sq + causal_off;
        return lim < 0 ? int64_t{0} : (lim + 1 < n ? lim + 1 : n);
    };
    if constexpr (std::is_same_v<T, float>) {
        if (softmax_lines<T>(x, y, n)) {
            if (mode == SM_PLAIN) {
                softmax_rows_pipelined(x, y, rows, n, [&](int64_t) { return std::make_pair(plain, n); }, e, nt);
            } else if (mode == SM_CAUSAL) {
                softmax_rows_pipelined(
                    x, y, rows, n, [&](int64_t r) { return std::make_pair(plain, causal_len(row0 + r)); }, e, nt);
            } else {
                softmax_rows_pipelined(
                    x, y, rows, n,
                    [&](int64_t r) {
                        const uint8_t* mr = mask_row(row0 + r);
                        return std::make_pair(MaskedLogits{plain.vs, mr}, all_masked(mr, n) ? int64_t{0} : n);
                    },
                    e, nt);
            }
            if (nt) stream_fence();
            return;
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        int64_t len = n;
        const uint8_t* mr = nullptr;
        const int64_t grow = row0 + r;
        if (mode == SM_CAUSAL) {
            len = causal_len(grow);
        } else if (mode == SM_MASK) {
            mr = mask_row(grow);
            if (all_masked(mr, n)) len = 0;
        }
        if (len == 0) {
            write_row(yr, n, nt, [&](int64_t) { return vset(0.0f); }, [&](int64_t, int64_t) { return vset(0.0f); });
            continue;
        }
        const Prefetch pf = next_row(xr, n, r + 1 < rows, 2 * n);
        // the logits (softmax_rows.h Logits, MaskedLogits): rounded products (see vexp_shift)
        if (mr) {
            const MaskedLogits z{plain.vs, mr};
            softmax_row<sizeof(T) == 2>(
                yr, n, len, e, nt, pf, [&](int64_t i) { return z.full(xr, i); },
                [&](int64_t i, int64_t k) { return z.part(xr, i, k); }, true);
        } else {
            softmax_row<false>(
                yr, n, len, e, nt, pf, [&](int64_t i) { return plain.full(xr, i); },
                [&](int64_t i, int64_t k) { return plain.part(xr, i, k); });
        }
    }
    if (nt) stream_fence();
}

// sum(a * b) over a row of n, stepped (StepWith) so that row r's write pass carries row r+1's
// dot, as the norms carry the next row's statistics: two fp32 accumulators, two vectors of
// each operand per step, the tail in finish(): one order of additions whoever steps it.
template <class T>
struct RowDot {
    const T* a = nullptr;
    const T* b = nullptr;
    int64_t n = 0, i = 0;
    V acc0 = vset(0.0f), acc1 = vset(0.0f);
    inline void operator()() {
        if (i + 2 * W <= n) {
            acc0 = vfma(vload(a + i), vload(b + i), acc0);
            acc1 = vfma(vload(a + i + W), vload(b + i + W), acc1);
            i += 2 * W;
        }
    }
    inline void finish() {
        while (i + 2 * W <= n) (*this)();
        for (; i < n; i += W) {
            const int64_t k = n - i < W ? n - i : W;
            acc0 = vfma(ld(a + i, k), ld(b + i, k), acc0);
        }
    }
    inline float dot() const { return hsum(acc0 + acc1); }
};

// dx = scale * y * (dy - sum(dy * y)) per row, rows pipelined: row r's write pass (dy and y
// from cache) also takes row r+1's dot from memory (RowDot) while row r+2's dy and y are
// prefetched, so each row is read from memory once, in a pass that also writes (the first
// row's dot is taken on its own). dx may be dy or y: row r+1 is read before it is written.
// The unpipelined form (the dot pass from memory, then the write from cache with the next
// row prefetched) and its placement history: CONTRIBUTING "Placement", "Softmax backward
// pipelined".
template <class T>
void tsoftmax_bwd_k(const void* dyv, const void* yv, void* dxv, int64_t rows, int64_t n, float scale, bool nt) {
    const T* dy = (const T*)dyv;
    const T* y = (const T*)yv;
    T* dx = (T*)dxv;
    const V sc = vset(scale);
    RowDot<T> d{dy, y, rows > 0 ? n : 0};
    d.finish();
    for (int64_t r = 0; r < rows; ++r) {
        const T* a = dy + r * n;
        const T* b = y + r * n;
        const V dot = vset(d.dot());
        const bool more = r + 1 < rows, more2 = r + 2 < rows;
        const StepWith<RowDot<T>, Prefetch2> pf{Prefetch2(next_row(a + n, n, more2, n), next_row(b + n, n, more2, n)),
                                                RowDot<T>{a + n, b + n, more ? n : 0}};
        d = write_row(
                dx + r * n, n, nt, [&](int64_t j) { return sc * vload(b + j) * (vload(a + j) - dot); },
                [&](int64_t j, int64_t k) { return sc * vload_part(b + j, k, 0.f) * (vload_part(a + j, k, 0.f) - dot); },
                pf)
                .s;
    }
    if (nt) stream_fence();
}

template <class T>
void fill_t(KernelTable& t, int dt) {
    t.softmax[dt] = softmax_k<T>;
    t.tsoftmax[dt] = tsoftmax_k<T>;
    t.tsoftmax_bwd[dt] = tsoftmax_bwd_k<T>;
}

}  // namespace

void fill_softmax(KernelTable& t) {
    fill_t<float>(t, DT_F32);
    fill_t<f16>(t, DT_F16);
    fill_t<bf16>(t, DT_BF16);
}

}  // namespace TO_NS
}  // namespace to
