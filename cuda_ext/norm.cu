// rms_norm and layer_norm: one warp per row (n <= 1024) or one block per row, launch-selected.
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

}  // namespace to

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
