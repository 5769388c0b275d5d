// rope.cpp: rotary position embedding (compiled once per ISA variant).
// Non-interleaved (h = n/2): y[i] = x[i]c[i] - x[i+h]s[i], y[i+h] = x[i+h]c[i+h] + x[i]s[i+h].
// Interleaved: y[2i] = x[2i]c[2i] - x[2i+1]s[2i], y[2i+1] = x[2i+1]c[2i+1] + x[2i]s[2i+1];
// vectorised as x*c + swap_pairs(x)*s*(-1,+1,...), which needs pairs aligned with lanes.
//
// Both halves of a non-interleaved row come from one loop (x[i] and x[i+h] loaded once):
// writing the first half, then loading x[i] again for the second, stalled on 4 KiB aliasing
// with the just-streamed y[i] whenever x and y sat at the same page offset (5.4 vs 3.5 ms,
// 1 thread, 32 x 2048 x 128). Rows whose output is not whole aligned lines are spliced in
// registers (SplicedOut, below) or staged in L1 (StagedOut, rowio.h): which one, rope_k says.
#include "vmath.h"
#include "variant.h"

namespace to {
namespace TO_NS {
namespace {

#if TO_ISA != 0
// (-1, +1, -1, +1, ...): the interleaved form's sign on the swapped pair
inline V pair_sign() {
    alignas(64) float sg[W];
    for (int j = 0; j < W; ++j) sg[j] = (j & 1) ? 1.f : -1.f;
    return vload(sg);
}
#endif

template <class T>
inline float rope_il_elem(const T* x, const float* c, const float* s, int64_t j) {
    const float other = to_f32(x[j ^ 1]);
    return to_f32(x[j]) * c[j] + ((j & 1) ? other : -other) * s[j];
}

// One non-interleaved row; NT: streaming stores (yr and h*sizeof(T) vector-aligned). AVX2
// streams a 64-byte line of the first half, then one of the second (the vectors of the two
// halves alternated before, the two-stream pattern of backward.cpp gated_bwd_k): fp16 rope
// (32 x 8192 x 128, torch's placement) 1.11-1.26x, bf16 1.02-1.05x, fp32 0.98-1.02x
// (ab_builds.py --copies 3 --out-offset 0, Zen 3; rope_interleaved, unchanged, 1.00-1.06x).
template <class T, bool NT>
inline void rope_half_row(const T* xr, const float* c, const float* s, T* yr, int64_t h) {
    const T* x2 = xr + h;
    const float* c2 = c + h;
    const float* s2 = s + h;
    int64_t i = 0;
    if (NT && TO_ISA == 1) {
        constexpr int L = line_vectors<T>();
        for (; i + L * W <= h; i += L * W) {
            V y1[L], y2[L];
            for (int q = 0; q < L; ++q) {
                const V a = vload(xr + i + q * W), b = vload(x2 + i + q * W);
                y1[q] = vfnma(b, vload(s + i + q * W), a * vload(c + i + q * W));
                y2[q] = vfma(a, vload(s2 + i + q * W), b * vload(c2 + i + q * W));
            }
            for (int q = 0; q < L; ++q) vstream(yr + i + q * W, y1[q]);
            for (int q = 0; q < L; ++q) vstream(yr + h + i + q * W, y2[q]);
        }
    }
    for (; i + W <= h; i += W) {
        const V a = vload(xr + i), b = vload(x2 + i);
        const V y1 = vfnma(b, vload(s + i), a * vload(c + i));
        const V y2 = vfma(a, vload(s2 + i), b * vload(c2 + i));
        if (NT) {
            vstream(yr + i, y1);
            vstream(yr + h + i, y2);
        } else {
            vstore(yr + i, y1);
            vstore(yr + h + i, y2);
        }
    }
    if (i < h) {
        const int64_t k = h - i;
        const V a = vload_part(xr + i, k, 0.f), b = vload_part(x2 + i, k, 0.f);
        vstore_part(yr + i, vfnma(b, vload_part(s + i, k, 0.f), a * vload_part(c + i, k, 0.f)), k);
        vstore_part(yr + h + i, vfma(a, vload_part(s2 + i, k, 0.f), b * vload_part(c2 + i, k, 0.f)), k);
    }
}

template <class T, bool NT>
inline void rope_il_row(const T* xr, const float* c, const float* s, T* yr, int64_t n) {
    int64_t i = 0;
#if TO_ISA != 0
    const V sign = pair_sign();
    for (; i + W <= n; i += W) {  // i stays even: pairs line up with lanes
        const V vx = vload(xr + i);
        const V y = vfma(vswap_pairs(vx) * sign, vload(s + i), vx * vload(c + i));
        if (NT) vstream(yr + i, y);
        else vstore(yr + i, y);
    }
#endif
    for (; i < n; ++i) put(yr + i, rope_il_elem(xr, c, s, i));
}

template <class T, bool NT>
inline void rope_row(const T* xr, const float* c, const float* s, T* yr, int64_t n, bool interleaved) {
    if (interleaved) rope_il_row<T, NT>(xr, c, s, yr, n);
    else rope_half_row<T, NT>(xr, c, s, yr, n / 2);
}

#if TO_ISA == 1
// The spliced writer (AVX2): a y that sits o lanes past a vector boundary gets streaming
// stores at the aligned addresses, each the previous row-frame vector's last o lanes followed
// by the current one's first W - o, in address order along each head's rows. rot(v) turns v
// by o lanes, join(rot(prev), rot(cur)) takes lanes [0, o) from prev's: one vpermps + one
// vblendvps per vector, carried in registers (StagedOut does it through an L1 buffer: a
// store and a line-crossing load more per vector). fp32 rope into np.empty's out= (16 bytes
// off a line), ab_builds: 1.18-1.28x faster than StagedOut on Zen 3. Not built for
// AVX-512: a register writer of this kind measured 1.08 / 1.03 / 1.00x there
// (CONTRIBUTING.md, rope).
struct Splice {
    __m256i idx;
    __m256 first;
    explicit Splice(int64_t o) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        idx = _mm256_and_si256(_mm256_sub_epi32(lane, _mm256_set1_epi32((int)o)), _mm256_set1_epi32(7));
        first = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)o), lane));
    }
    V rot(V v) const { return {_mm256_permutevar8x32_ps(v.v, idx)}; }
    V join(V rprev, V rcur) const { return {_mm256_blendv_ps(rcur.v, rprev.v, first)}; }
};

// Streams the aligned vector at ya + i (ya: a row's start less o lanes): the last o lanes of
// the vector before (rprev = its rot()), then the first W - o of v; returns rot(v).
template <class T>
inline V splice_put(const Splice& sp, T* ya, int64_t i, V v, V rprev) {
    const V r = sp.rot(v);
    vstream(ya + i, sp.join(rprev, r));
    return r;
}

// One head's rows through a Splice, y o lanes past a vector boundary: head() writes the
// stream's first W - o lanes (a partial store), splice_put the aligned vectors, end() its
// last o lanes. A thread's part of the rows starts and ends with these partial stores; they
// write only their own elements (vstore_part), so two threads' parts can share a line. The
// row functions below copy sp into locals: the streaming stores may alias this struct
// (GCC's __m256 is may_alias), and its members were reloaded for every vector (fp32 2.15 ->
// 1.80 instructions per element with the copies; the direct path: 1.18). Long rows off the
// vector alignment take this writer too (before: write_row's per-row head; tested, not timed).
template <class T>
struct SplicedOut {
    int64_t o = 0;
    Splice sp{0};
    V carry{};  // rot() of the vector just before the next one (the previous row's last)
    bool started = false;
    void reset(T* y) {
        o = (int64_t)(((uintptr_t)y % (W * sizeof(T))) / sizeof(T));
        sp = Splice(o);
        started = false;
    }
    V head(T* yr, V v) {  // the stream's first vector: no previous one
        vstore_part(yr, v, W - o);
        started = true;
        return sp.rot(v);
    }
    void end(T* yend) {  // yend: past the stream's last element
        if (started && o) vstore_part(yend - o, sp.join(carry, carry), o);
    }
};

// One non-interleaved row (h % W == 0), its vectors in address order: the first half, then the
// second (x's row is loaded twice, from L1).
template <class T>
inline void rope_half_row_spliced(const T* xr, const float* c, const float* s, T* yr, int64_t h,
                                  SplicedOut<T>& so) {
    const T* x2 = xr + h;
    const Splice sp = so.sp;
    T* const ya = yr - so.o;
    auto y1 = [&](int64_t i) { return vfnma(vload(x2 + i), vload(s + i), vload(xr + i) * vload(c + i)); };
    auto y2 = [&](int64_t i) { return vfma(vload(xr + i), vload(s + h + i), vload(x2 + i) * vload(c + h + i)); };
    V p = so.started ? splice_put(sp, ya, 0, y1(0), so.carry) : so.head(yr, y1(0));
    for (int64_t i = W; i < h; i += W) p = splice_put(sp, ya, i, y1(i), p);
    for (int64_t i = 0; i < h; i += W) p = splice_put(sp, ya, h + i, y2(i), p);
    so.carry = p;
}

// One interleaved row (n % W == 0), vectors in address order.
template <class T>
inline void rope_il_row_spliced(const T* xr, const float* c, const float* s, T* yr, int64_t n, V sign,
                                SplicedOut<T>& so) {
    auto y = [&](int64_t i) {
        const V vx = vload(xr + i);
        return vfma(vswap_pairs(vx) * sign, vload(s + i), vx * vload(c + i));
    };
    const Splice sp = so.sp;
    T* const ya = yr - so.o;
    V p = so.started ? splice_put(sp, ya, 0, y(0), so.carry) : so.head(yr, y(0));
    for (int64_t i = W; i < n; i += W) p = splice_put(sp, ya, i, y(i), p);
    so.carry = p;
}
#endif

template <class T>
void rope_k(const void* xv, const float* cosp, const float* sinp, void* yv, int64_t rows, int64_t n,
            int64_t T_, int64_t row0, bool interleaved, bool nt, int64_t heads, int64_t hstride) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    if (heads < 1) heads = 1;
    if (heads > ROPE_MAX_HEADS) heads = ROPE_MAX_HEADS;  // the caller groups at most this many
    // The writer (streaming stores, nt): direct when every (half) row is whole vectors at
    // vector-aligned addresses and either whole 64-byte lines or long; spliced (AVX2) when
    // the rows are whole vectors but y is off the vector alignment; staged for other short
    // rows; write_row's per-row head for other long ones (a partial line per row is noise
    // there). Lines, not vectors: short rows on vector but not line boundaries (fp16 into
    // np.empty's out=, 16 bytes off a line, on AVX2) leave a partial line at every row end
    // while the other heads' rows are written, and ran 2x slower direct than staged.
    const int64_t piece = interleaved ? n : n / 2;
    const int64_t A = (int64_t)W * (int64_t)sizeof(T);
    const bool short_rows = n * (int64_t)sizeof(T) <= STAGE_BYTES / 4;
    const bool whole = W > 1 && piece % W == 0;
    bool vec_al = whole, line_al = (piece * (int64_t)sizeof(T)) % 64 == 0, elem_al = true;
    for (int64_t h = 0; h < heads; ++h) {
        const uintptr_t a = (uintptr_t)(y + h * hstride);
        vec_al = vec_al && a % A == 0;
        line_al = line_al && a % 64 == 0;
        elem_al = elem_al && a % sizeof(T) == 0;
    }
    const bool direct = vec_al && (line_al || !short_rows);
    const bool spliced = TO_ISA == 1 && nt && whole && elem_al && !vec_al;
    const bool staged = nt && W > 1 && !direct && !spliced && short_rows;
    // fn(head, x row, its cos and sin rows, y row) for each row, position by position: a table
    // row serves the group's heads while it is in L1
    auto each_row = [&](auto&& fn) __attribute__((flatten)) {
        int64_t pos = row0 % T_;
        for (int64_t r = 0; r < rows; ++r, pos = (pos + 1 == T_) ? 0 : pos + 1)
            for (int64_t h = 0; h < heads; ++h)
                fn(h, x + h * hstride + r * n, cosp + pos * n, sinp + pos * n, y + h * hstride + r * n);
    };
#if TO_ISA == 1
    if (spliced) {
        SplicedOut<T> so[ROPE_MAX_HEADS];
        for (int64_t h = 0; h < heads; ++h) so[h].reset(y + h * hstride);
        const V sign = pair_sign();
        each_row([&](int64_t h, const T* xr, const float* c, const float* s, T* yr) {
            if (interleaved) rope_il_row_spliced<T>(xr, c, s, yr, n, sign, so[h]);
            else rope_half_row_spliced<T>(xr, c, s, yr, n / 2, so[h]);
        });
        for (int64_t h = 0; h < heads; ++h) so[h].end(y + h * hstride + rows * n);
        stream_fence();
        return;
    }
#endif
    if (staged) {
        // Drained every 512 bytes (the complete lines stream out after each row or two):
        // writes interleave with the next rows' reads instead of leaving in 16 KiB bursts
        // between read-only stretches (32 x 8192 x 128 into np.empty's 64n+16 out=, in-process
        // A/B: fp32 10.2 -> 9.2 ms, fp16 6.0 -> 5.3 ms; 2048 B no better than 16 KiB, 256 B
        // no better than 512). One stage per head of the group: each head's rows are its own
        // contiguous stream.
        StagedOut<T> so[ROPE_MAX_HEADS];
        for (int64_t h = 0; h < heads; ++h) so[h].reset(y + h * hstride, 512);
        each_row([&](int64_t h, const T* xr, const float* c, const float* s, T*) {
            rope_row<T, false>(xr, c, s, so[h].row(n), n, interleaved);
            so[h].add(n);
        });
        for (int64_t h = 0; h < heads; ++h) so[h].finish();
        return;
    }
    const bool stream = nt && direct;
    each_row([&](int64_t, const T* xr, const float* c, const float* s, T* yr) {
        if (stream) {
            rope_row<T, true>(xr, c, s, yr, n, interleaved);
        } else if (nt && W > 1) {  // long rows, misaligned: write_row's aligned streaming body
            alignas(64) float buf[W];
            if (interleaved) {
                auto part = [&](int64_t i, int64_t k) {
                    for (int64_t j = 0; j < W; ++j) buf[j] = j < k ? rope_il_elem(xr, c, s, i + j) : 0.f;
                    return vload(buf);
                };
#if TO_ISA != 0
                const V sign = pair_sign();
                auto full = [&](int64_t i) {
                    if (i & 1) return part(i, W);  // pairs straddle lanes (odd head): slow but right
                    V vx = vload(xr + i);
                    return vfma(vswap_pairs(vx) * sign, vload(s + i), vx * vload(c + i));
                };
                write_row(yr, n, true, full, part);
#else
                (void)part;  // scalar: W == 1, this branch never runs
#endif
            } else {
                const int64_t h = n / 2;
                const T* x2 = xr + h;
                write_row(
                    yr, h, true, [&](int64_t i) { return vfnma(vload(x2 + i), vload(s + i), vload(xr + i) * vload(c + i)); },
                    [&](int64_t i, int64_t k) {
                        return vfnma(vload_part(x2 + i, k, 0.f), vload_part(s + i, k, 0.f),
                                     vload_part(xr + i, k, 0.f) * vload_part(c + i, k, 0.f));
                    });
                write_row(
                    yr + h, h, true,
                    [&](int64_t i) { return vfma(vload(xr + i), vload(s + h + i), vload(x2 + i) * vload(c + h + i)); },
                    [&](int64_t i, int64_t k) {
                        return vfma(vload_part(xr + i, k, 0.f), vload_part(s + h + i, k, 0.f),
                                    vload_part(x2 + i, k, 0.f) * vload_part(c + h + i, k, 0.f));
                    });
            }
        } else {
            rope_row<T, false>(xr, c, s, yr, n, interleaved);
        }
    });
    if (nt) stream_fence();
}

}  // namespace

void fill_rope(KernelTable& t) {
    t.rope[DT_F32] = rope_k<float>;
    t.rope[DT_F16] = rope_k<f16>;
    t.rope[DT_BF16] = rope_k<bf16>;
}

}  // namespace TO_NS
}  // namespace to
