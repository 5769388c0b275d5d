// rms_norm and layer_norm (+ the fused residual add: add_rms_norm, add_layer_norm): one warp per row (n <= 1024) or one block per row, launch-selected.
// The row stays in registers when it fits (CACHE_FLOATS per thread); longer rows are
// re-read in streaming passes. 16-byte loads when the host says every row is aligned.
#include "common.cuh"

namespace to {

// rms_norm's multiplier 1/sqrt(ss/n + eps) for a row whose fp32 sum of squares overflowed
// (|x| > ~1.8e19 on finite input): the sum again for x/max|x|, so finite input never turns
// into 0; rows holding inf/NaN keep the plain formula's 0/NaN. Called only when ss is not
// finite; ss is reduced over the group, so every thread takes the branch (g.max/g.sum's
// barriers are reached by all or none). Rows with max|x| > ~8.5e37 get a subnormal scale.
template <typename T, int V>
__device__ float rms_overflow_scale(const T* __restrict__ x, int nvec, int n, float ss, float eps,
                                    const RowGroup& g) {
    float m = 0.0f;
    for (int i = g.tid; i < nvec; i += g.nthreads) {
        float a[V];
        load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
        for (int j = 0; j < V; ++j) m = fmaxf(m, fabsf(a[j]));
    }
    m = g.max(m);
    if (!(isfinite(m) && m > 0.0f)) return 1.0f / sqrtf(ss / (float)n + eps);
    const float sc = 1.0f / m;
    float s = 0.0f;
    for (int i = g.tid; i < nvec; i += g.nthreads) {
        float a[V];
        load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
        for (int j = 0; j < V; ++j) { const float v = a[j] * sc; s = fmaf(v, v, s); }
    }
    s = g.sum(s);
    return sc / sqrtf(s / (float)n + eps * sc * sc);
}

template <typename T, int V>
__device__ __forceinline__ void rms_row(const T* __restrict__ x, const T* __restrict__ w,
                                        T* __restrict__ y, int n, float eps, const RowGroup& g) {
    constexpr int NV = CACHE_FLOATS / V;
    const int nvec = n / V;
    // The scalar (unaligned / odd width) path streams: caching it costs registers that
    // would lower the occupancy of the vector path, which shares the kernel.
    const bool cached = V > 1 && nvec <= NV * g.nthreads;  // folds to false for V == 1
    if (cached) {
        float v[NV][V];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                load_f<T, V>(x + (size_t)i * V, v[k]);
#pragma unroll
                for (int j = 0; j < V; ++j) ss = fmaf(v[k][j], v[k][j], ss);
            }
        }
        ss = g.sum(ss);
        const float r = isfinite(ss) ? 1.0f / sqrtf(ss / (float)n + eps)
                                     : rms_overflow_scale<T, V>(x, nvec, n, ss, eps, g);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float wv[V], o[V];
                load_f<T, V>(w + (size_t)i * V, wv);
#pragma unroll
                for (int j = 0; j < V; ++j) o[j] = v[k][j] * r * wv[j];
                store_f<T, V>(y + (size_t)i * V, o);
            }
        }
    } else {
        float ss = 0.0f;
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V];
            load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
            for (int j = 0; j < V; ++j) ss = fmaf(a[j], a[j], ss);
        }
        ss = g.sum(ss);
        const float r = isfinite(ss) ? 1.0f / sqrtf(ss / (float)n + eps)
                                     : rms_overflow_scale<T, V>(x, nvec, n, ss, eps, g);
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V], wv[V], o[V];
            load_f<T, V>(x + (size_t)i * V, a);
            load_f<T, V>(w + (size_t)i * V, wv);
#pragma unroll
            for (int j = 0; j < V; ++j) o[j] = a[j] * r * wv[j];
            store_f<T, V>(y + (size_t)i * V, o);
        }
    }
}

template <typename T, int V>
__device__ __forceinline__ void layer_row(const T* __restrict__ x, const T* __restrict__ w,
                                          const T* __restrict__ b, T* __restrict__ y, int n,
                                          float eps, const RowGroup& g) {
    constexpr int NV = CACHE_FLOATS / V;
    const int nvec = n / V;
    const float inv_n = 1.0f / (float)n;
    // The scalar (unaligned / odd width) path streams: caching it costs registers that
    // would lower the occupancy of the vector path, which shares the kernel.
    const bool cached = V > 1 && nvec <= NV * g.nthreads;  // folds to false for V == 1
    if (cached) {
        float v[NV][V];
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                load_f<T, V>(x + (size_t)i * V, v[k]);
#pragma unroll
                for (int j = 0; j < V; ++j) s += v[k][j];
            }
        }
        const float mean = g.sum(s) * inv_n;
        float q = 0.0f;  // two-pass variance from registers: no cancellation
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
#pragma unroll
                for (int j = 0; j < V; ++j) { const float d = v[k][j] - mean; q = fmaf(d, d, q); }
            }
        }
        const float rstd = 1.0f / sqrtf(g.sum(q) * inv_n + eps);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float wv[V], bv[V], o[V];
                load_f<T, V>(w + (size_t)i * V, wv);
                if (b) load_f<T, V>(b + (size_t)i * V, bv);
#pragma unroll
                for (int j = 0; j < V; ++j) o[j] = (v[k][j] - mean) * rstd * wv[j] + (b ? bv[j] : 0.0f);
                store_f<T, V>(y + (size_t)i * V, o);
            }
        }
    } else {
        float s = 0.0f;
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V];
            load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
            for (int j = 0; j < V; ++j) s += a[j];
        }
        const float mean = g.sum(s) * inv_n;
        float q = 0.0f;
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V];
            load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
            for (int j = 0; j < V; ++j) { const float d = a[j] - mean; q = fmaf(d, d, q); }
        }
        const float rstd = 1.0f / sqrtf(g.sum(q) * inv_n + eps);
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V], wv[V], bv[V], o[V];
            load_f<T, V>(x + (size_t)i * V, a);
            load_f<T, V>(w + (size_t)i * V, wv);
            if (b) load_f<T, V>(b + (size_t)i * V, bv);
#pragma unroll
            for (int j = 0; j < V; ++j) o[j] = (a[j] - mean) * rstd * wv[j] + (b ? bv[j] : 0.0f);
            store_f<T, V>(y + (size_t)i * V, o);
        }
    }
}

template <typename T>
__device__ __forceinline__ void rms_norm_kernel(const T* x, const T* w, T* y, long long rows, int n,
                                                float eps, int vec) {
    const RowGroup g = RowGroup::make();
    for (long long r = g.first_row(); r < rows; r += g.row_step()) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        if (vec) rms_row<T, VecWidth<T>::value>(xr, w, yr, n, eps, g);
        else rms_row<T, 1>(xr, w, yr, n, eps, g);
    }
}

template <typename T>
__device__ __forceinline__ void layer_norm_kernel(const T* x, const T* w, const T* b, T* y,
                                                  long long rows, int n, float eps, int vec) {
    const RowGroup g = RowGroup::make();
    for (long long r = g.first_row(); r < rows; r += g.row_step()) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        if (vec) layer_row<T, VecWidth<T>::value>(xr, w, b, yr, n, eps, g);
        else layer_row<T, 1>(xr, w, b, yr, n, eps, g);
    }
}

// ---- fused residual add + norm (vLLM's fused_add_rms_norm) ----------------------------------
// s = x + r rounded to T, stored; then the norm of those rounded values. y may be x and s may
// be r (the same buffers: the in-place form), so x, r, y and s are plain pointers, read with
// plain loads (never the read-only path, which is not coherent with the kernel's own stores):
// each thread reads its elements of x and r before it writes the same elements of s, and
// rereads (streamed rows) only the elements of s it wrote itself; y is written last.
template <typename T, int V>
__device__ __forceinline__ void load_rw(const T* p, float* out) {
#ifdef TO_EMU_CHECK_ALIGN
    TO_EMU_CHECK_ALIGN(p, alignof(AVec<T, V>));
#endif
    const AVec<T, V> a = *reinterpret_cast<const AVec<T, V>*>(p);
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = to_float(a.v[j]);
}

// Chunk i (V elements) of s = round_T(x + r): into a, and stored to s.
template <typename T, int V>
__device__ __forceinline__ void add_chunk(const T* x, const T* r, T* s, int i, float* a) {
    float rv[V];
    load_rw<T, V>(x + (size_t)i * V, a);
    load_rw<T, V>(r + (size_t)i * V, rv);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = to_float(from_float<T>(a[j] + rv[j]));
    store_f<T, V>(s + (size_t)i * V, a);
}

// rms_norm's multiplier for a row whose fp32 sum of squares ss overflowed (as
// rms_overflow_scale): max|s| and the sum again for s/max|s|. get(k, a) gives chunk k of the
// thread's values (from registers or reread); uniform over the group (ss is reduced).
template <int V, typename Get>
__device__ float add_rms_overflow(Get get, int nk, int n, float ss, float eps, const RowGroup& g) {
    float m = 0.0f;
    for (int k = 0; k < nk; ++k) {
        float a[V];
        if (get(k, a))
#pragma unroll
            for (int j = 0; j < V; ++j) m = fmaxf(m, fabsf(a[j]));
    }
    m = g.max(m);
    if (!(isfinite(m) && m > 0.0f)) return 1.0f / sqrtf(ss / (float)n + eps);
    const float sc = 1.0f / m;
    float q = 0.0f;
    for (int k = 0; k < nk; ++k) {
        float a[V];
        if (get(k, a))
#pragma unroll
            for (int j = 0; j < V; ++j) { const float v = a[j] * sc; q = fmaf(v, v, q); }
    }
    q = g.sum(q);
    return sc / sqrtf(q / (float)n + eps * sc * sc);
}

// One row: LAYER: (s - mean) * rstd * w (+ b), two-pass variance (as layer_row); else
// s * rsqrt(mean(s^2) + eps) * w with rms_row's overflow rescale.
template <typename T, int V, bool LAYER>
__device__ __forceinline__ void add_norm_row(const T* x, const T* r, const T* __restrict__ w,
                                             const T* __restrict__ b, T* y, T* s, int n, float eps,
                                             const RowGroup& g) {
    constexpr int NV = CACHE_FLOATS / V;
    const int nvec = n / V;
    const float inv_n = 1.0f / (float)n;
    const bool cached = V > 1 && nvec <= NV * g.nthreads;  // folds to false for V == 1
    if (cached) {
        float v[NV][V];
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                add_chunk<T, V>(x, r, s, i, v[k]);
#pragma unroll
                for (int j = 0; j < V; ++j) acc = LAYER ? acc + v[k][j] : fmaf(v[k][j], v[k][j], acc);
            }
        }
        acc = g.sum(acc);
        float mean = 0.0f, mul;
        if (LAYER) {
            mean = acc * inv_n;
            float q = 0.0f;
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                if (g.tid + k * g.nthreads < nvec)
#pragma unroll
                    for (int j = 0; j < V; ++j) { const float d = v[k][j] - mean; q = fmaf(d, d, q); }
            }
            mul = 1.0f / sqrtf(g.sum(q) * inv_n + eps);
        } else if (isfinite(acc)) {
            mul = 1.0f / sqrtf(acc * inv_n + eps);
        } else {
            auto get = [&](int k, float* a) {
                if (g.tid + k * g.nthreads >= nvec) return false;
                for (int kk = 0; kk < NV; ++kk)   // constant register indices: v stays in registers
                    if (kk == k)
#pragma unroll
                        for (int j = 0; j < V; ++j) a[j] = v[kk][j];
                return true;
            };
            mul = add_rms_overflow<V>(get, NV, n, acc, eps, g);
        }
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float wv[V], bv[V], o[V];
                load_f<T, V>(w + (size_t)i * V, wv);
                if (LAYER && b) load_f<T, V>(b + (size_t)i * V, bv);
#pragma unroll
                for (int j = 0; j < V; ++j)
                    o[j] = LAYER ? (v[k][j] - mean) * mul * wv[j] + (b ? bv[j] : 0.0f) : v[k][j] * mul * wv[j];
                store_f<T, V>(y + (size_t)i * V, o);
            }
        }
    } else {
        float acc = 0.0f;
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V];
            add_chunk<T, V>(x, r, s, i, a);
#pragma unroll
            for (int j = 0; j < V; ++j) acc = LAYER ? acc + a[j] : fmaf(a[j], a[j], acc);
        }
        acc = g.sum(acc);
        float mean = 0.0f, mul;
        if (LAYER) {
            mean = acc * inv_n;
            float q = 0.0f;
            for (int i = g.tid; i < nvec; i += g.nthreads) {
                float a[V];
                load_rw<T, V>(s + (size_t)i * V, a);
#pragma unroll
                for (int j = 0; j < V; ++j) { const float d = a[j] - mean; q = fmaf(d, d, q); }
            }
            mul = 1.0f / sqrtf(g.sum(q) * inv_n + eps);
        } else if (isfinite(acc)) {
            mul = 1.0f / sqrtf(acc * inv_n + eps);
        } else {
            const int nk = (nvec - g.tid + g.nthreads - 1) / g.nthreads;
            auto get = [&](int k, float* a) {
                load_rw<T, V>(s + (size_t)(g.tid + k * g.nthreads) * V, a);
                return true;
            };
            mul = add_rms_overflow<V>(get, nk > 0 ? nk : 0, n, acc, eps, g);
        }
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V], wv[V], bv[V], o[V];
            load_rw<T, V>(s + (size_t)i * V, a);
            load_f<T, V>(w + (size_t)i * V, wv);
            if (LAYER && b) load_f<T, V>(b + (size_t)i * V, bv);
#pragma unroll
            for (int j = 0; j < V; ++j)
                o[j] = LAYER ? (a[j] - mean) * mul * wv[j] + (b ? bv[j] : 0.0f) : a[j] * mul * wv[j];
            store_f<T, V>(y + (size_t)i * V, o);
        }
    }
}

template <typename T, bool LAYER>
__device__ __forceinline__ void add_norm_kernel(const T* x, const T* r, const T* w, const T* b, T* y, T* s,
                                                long long rows, int n, float eps, int vec) {
    const RowGroup g = RowGroup::make();
    for (long long row = g.first_row(); row < rows; row += g.row_step()) {
        const long long off = row * n;
        if (vec) add_norm_row<T, VecWidth<T>::value, LAYER>(x + off, r + off, w, b, y + off, s + off, n, eps, g);
        else add_norm_row<T, 1, LAYER>(x + off, r + off, w, b, y + off, s + off, n, eps, g);
    }
}

}  // namespace to

#define TO_ADD_NORM(T, S)                                                                                      \
    extern "C" __global__ void __launch_bounds__(512, 2) to_add_rms_norm_##S(                                  \
        const T* x, const T* r, const T* __restrict__ w, T* y, T* s, long long rows, int n, float eps, int vec) { \
        to::add_norm_kernel<T, false>(x, r, w, nullptr, y, s, rows, n, eps, vec);                               \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_add_layer_norm_##S(                                \
        const T* x, const T* r, const T* __restrict__ w, const T* __restrict__ b, T* y, T* s, long long rows,     \
        int n, float eps, int vec) {                                                                           \
        to::add_norm_kernel<T, true>(x, r, w, b, y, s, rows, n, eps, vec);                                      \
    }
TO_FOR_EACH_DTYPE(TO_ADD_NORM)
#undef TO_ADD_NORM

#define TO_NORM(T, S)                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_rms_norm_##S(const T* __restrict__ x, const T* __restrict__ w, \
                                            T* __restrict__ y, long long rows, int n,          \
                                            float eps, int vec) {                              \
        to::rms_norm_kernel<T>(x, w, y, rows, n, eps, vec);                                    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_layer_norm_##S(const T* __restrict__ x, const T* __restrict__ w, \
                                              const T* __restrict__ b, T* __restrict__ y,      \
                                              long long rows, int n, float eps, int vec) {     \
        to::layer_norm_kernel<T>(x, w, b, y, rows, n, eps, vec);                               \
    }
TO_FOR_EACH_DTYPE(TO_NORM)
#undef TO_NORM
