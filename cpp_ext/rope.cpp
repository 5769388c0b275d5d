// rope.cpp: rotary position embedding (compiled once per ISA variant).
// Non-interleaved (h = n/2): y[i] = x[i]c[i] - x[i+h]s[i], y[i+h] = x[i+h]c[i+h] + x[i]s[i+h].
// Interleaved: y[2i] = x[2i]c[2i] - x[2i+1]s[2i], y[2i+1] = x[2i+1]c[2i+1] + x[2i]s[2i+1];
// vectorised as x*c + swap_pairs(x)*s*(-1,+1,...), which needs pairs aligned with lanes.
//
// Both halves of a non-interleaved row come from one loop (x[i] and x[i+h] loaded once):
// writing the first half, then loading x[i] again for the second, stalled on 4 KiB aliasing
// with the just-streamed y[i] whenever x and y sat at the same page offset (5.4 vs 3.5 ms,
// 1 thread, 32 x 2048 x 128). Rows whose output is not whole aligned lines go through
// StagedOut (simd.h).
#include "vmath.h"
#include "variant.h"

namespace to {
namespace TO_NS {
namespace {

template <class T>
inline float rope_il_elem(const T* x, const float* c, const float* s, int64_t j) {
    const float other = to_f32(x[j ^ 1]);
    return to_f32(x[j]) * c[j] + ((j & 1) ? other : -other) * s[j];
}

// One non-interleaved row; NT: streaming stores (yr and h*sizeof(T) vector-aligned).
template <class T, bool NT>
inline void rope_half_row(const T* xr, const float* c, const float* s, T* yr, int64_t h) {
    const T* x2 = xr + h;
    const float* c2 = c + h;
    const float* s2 = s + h;
    int64_t i = 0;
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
    alignas(64) float sg[W];
    for (int j = 0; j < W; ++j) sg[j] = (j & 1) ? 1.f : -1.f;
    const V sign = vload(sg);
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

template <class T>
void rope_k(const void* xv, const float* cosp, const float* sinp, void* yv, int64_t rows, int64_t n,
            int64_t T_, int64_t row0, bool interleaved, bool nt, int64_t heads, int64_t hstride) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    if (heads < 1) heads = 1;
    if (heads > ROPE_MAX_HEADS) heads = ROPE_MAX_HEADS;  // the caller groups at most this many
    const int64_t A = (int64_t)W * (int64_t)sizeof(T);
    // Streaming stores straight into y need every row (and half row) to be whole aligned
    // vectors; otherwise short rows are staged, long ones (a partial line per row is noise
    // there) keep write_row's per-row head.
    const int64_t piece = interleaved ? n : n / 2;
    bool direct = W > 1 && (piece * (int64_t)sizeof(T)) % A == 0;
    for (int64_t h = 0; h < heads; ++h) direct = direct && (uintptr_t)(y + h * hstride) % A == 0;
    const bool staged = nt && W > 1 && !direct && n * (int64_t)sizeof(T) <= STAGE_BYTES / 4;
    int64_t pos = row0 % T_;
    if (staged) {
        // Drained every 512 bytes (the complete lines stream out after each row or two):
        // writes interleave with the next rows' reads instead of leaving in 16 KiB bursts
        // between read-only stretches (32 x 8192 x 128 into np.empty's 64n+16 out=, in-process
        // A/B: fp32 10.2 -> 9.2 ms, fp16 6.0 -> 5.3 ms; 2048 B no better than 16 KiB, 256 B
        // no better than 512). One stage per head of the group: each head's rows are its own
        // contiguous stream.
        StagedOut<T> so[ROPE_MAX_HEADS];
        for (int64_t h = 0; h < heads; ++h) so[h].reset(y + h * hstride, 512);
        for (int64_t r = 0; r < rows; ++r, pos = (pos + 1 == T_) ? 0 : pos + 1) {
            for (int64_t h = 0; h < heads; ++h) {
                T* yr = so[h].row(n);
                rope_row<T, false>(x + h * hstride + r * n, cosp + pos * n, sinp + pos * n, yr, n, interleaved);
                so[h].add(n);
            }
        }
        for (int64_t h = 0; h < heads; ++h) so[h].finish();
        return;
    }
    const bool stream = nt && direct;
    for (int64_t r = 0; r < rows; ++r, pos = (pos + 1 == T_) ? 0 : pos + 1) {
        const float* c = cosp + pos * n;
        const float* s = sinp + pos * n;
        for (int64_t hd = 0; hd < heads; ++hd) {
            const T* xr = x + hd * hstride + r * n;
            T* yr = y + hd * hstride + r * n;
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
                    alignas(64) float sg[W];
                    for (int j = 0; j < W; ++j) sg[j] = (j & 1) ? 1.f : -1.f;
                    const V sign = vload(sg);
                    auto full = [&](int64_t i) {
                        if (i & 1) return part(i, W);  // pairs straddle lanes (odd head): slow but right
                        V vx = vload(xr + i);
                        return vfma(vswap_pairs(vx) * sign, vload(s + i), vx * vload(c + i));
                    };
                    write_row(yr, n, true, full, part);
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
        }
    }
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
