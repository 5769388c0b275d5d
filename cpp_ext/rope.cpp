// rope.cpp: rotary position embedding (compiled once per ISA variant).
// Non-interleaved (h = n/2): y[i] = x[i]c[i] - x[i+h]s[i], y[i+h] = x[i+h]c[i+h] + x[i]s[i+h].
// Interleaved: y[2i] = x[2i]c[2i] - x[2i+1]s[2i], y[2i+1] = x[2i+1]c[2i+1] + x[2i]s[2i+1];
// vectorised as x*c + swap_pairs(x)*s*(-1,+1,...), which needs pairs aligned with lanes.
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

template <class T>
void rope_k(const void* xv, const float* cosp, const float* sinp, void* yv, int64_t rows, int64_t n,
            int64_t T_, int64_t row0, bool interleaved, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    int64_t pos = row0 % T_;
    for (int64_t r = 0; r < rows; ++r, pos = (pos + 1 == T_) ? 0 : pos + 1) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const float* c = cosp + pos * n;
        const float* s = sinp + pos * n;
        if (!interleaved) {
            const int64_t h = n / 2;
            const T* x1 = xr;
            const T* x2 = xr + h;
            write_row(
                yr, h, nt, [&](int64_t i) { return vfnma(vload(x2 + i), vload(s + i), vload(x1 + i) * vload(c + i)); },
                [&](int64_t i, int64_t k) {
                    return vfnma(vload_part(x2 + i, k, 0.f), vload_part(s + i, k, 0.f),
                                 vload_part(x1 + i, k, 0.f) * vload_part(c + i, k, 0.f));
                });
            const float* c2 = c + h;
            const float* s2 = s + h;
            write_row(
                yr + h, h, nt, [&](int64_t i) { return vfma(vload(x1 + i), vload(s2 + i), vload(x2 + i) * vload(c2 + i)); },
                [&](int64_t i, int64_t k) {
                    return vfma(vload_part(x1 + i, k, 0.f), vload_part(s2 + i, k, 0.f),
                                vload_part(x2 + i, k, 0.f) * vload_part(c2 + i, k, 0.f));
                });
        } else {
            alignas(64) float buf[W];
            auto part = [&](int64_t i, int64_t k) {
                for (int64_t j = 0; j < W; ++j) buf[j] = j < k ? rope_il_elem(xr, c, s, i + j) : 0.f;
                return vload(buf);
            };
#if TO_ISA == 0
            write_row(yr, n, nt, [&](int64_t i) { return part(i, 1); }, part);
#else
            alignas(64) float sg[W];
            for (int j = 0; j < W; ++j) sg[j] = (j & 1) ? 1.f : -1.f;
            const V sign = vload(sg);
            auto full = [&](int64_t i) {
                if (i & 1) return part(i, W);  // pairs straddle lanes (odd head): slow but right
                V vx = vload(xr + i);
                return vfma(vswap_pairs(vx) * sign, vload(s + i), vx * vload(c + i));
            };
            write_row(yr, n, nt, full, part);
#endif
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
