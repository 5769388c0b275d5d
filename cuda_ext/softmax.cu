// softmax over the last axis: same row layout as norm.cu (warp or block per row, launch-selected).
#include "common.cuh"

namespace to {

template <typename T, int V>
__device__ __forceinline__ void softmax_row(const T* __restrict__ x, T* __restrict__ y, int n,
                                            const RowGroup& g) {
    constexpr int NV = CACHE_BYTES / (V * (int)sizeof(T));
    const int nvec = n / V;
    const float NEG_INF = __int_as_float(0xff800000);
    // The scalar (unaligned / odd width) path streams: caching it costs registers that
    // would lower the occupancy of the vector path, which shares the kernel.
    const bool cached = V > 1 && nvec <= NV * g.nthreads;  // folds to false for V == 1
    if (cached) {
        // The row's own type in registers (common.cuh CACHE_BYTES). fp32 keeps exp(v - m) in
        // place for the write; a 16-bit row is kept packed and its exp recomputed in the write
        // pass (the same value both times), which costs arithmetic, not registers or bytes.
        // 16-bit rows take exp as exp2f((v - m) * log2 e): an FADD, an FMUL and ex2 with its
        // subnormal scaling (~6 SASS instructions against expf's ~9; twice per element, where a
        // 16-bit row has half the bytes per element of fp32 to hide them behind). Its relative
        // error, ~|v - m| * 2^-24 plus ex2's 2 ulp, is far below a 16-bit output's half ulp
        // (2^-12 / 2^-9).
        AVec<T, V> v[NV];
        float m = NEG_INF;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float a[V];
                v[k] = load_vec<T, V>(x + (size_t)i * V);
                widen<T, V>(v[k], a);
#pragma unroll
                for (int j = 0; j < V; ++j) m = fmaxf(m, a[j]);
            }
        }
        m = g.max(m);
        auto ex = [m](float a) {
            return sizeof(T) == 4 ? expf(a - m) : exp2f((a - m) * 1.4426950408889634f);
        };
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float a[V];
                widen<T, V>(v[k], a);
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    a[j] = ex(a[j]);
                    s += a[j];
                    if constexpr (sizeof(T) == 4) v[k].v[j] = a[j];
                }
            }
        }
        const float inv = 1.0f / g.sum(s);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float o[V];
                widen<T, V>(v[k], o);
#pragma unroll
                for (int j = 0; j < V; ++j) o[j] = (sizeof(T) == 4 ? o[j] : ex(o[j])) * inv;
                store_f<T, V>(y + (size_t)i * V, o);
            }
        }
    } else {
        // Online max/sum in one read, then one read + write. A NaN must reach the sum, as in
        // the cached path and NumPy (a row holding a NaN is all NaN): the compare below skips
        // it, so it is added explicitly (it makes s NaN for good); a +inf gives inf - inf.
        float m = NEG_INF, s = 0.0f;
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V];
            load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                if (a[j] > m) { s = s * expf(m - a[j]) + 1.0f; m = a[j]; }
                else if (m != NEG_INF || a[j] != a[j]) s += expf(a[j] - m);  // -inf first adds 0
            }
        }
        const float M = g.max(m);
        // s == 0 only while every element seen was -inf (s * expf(-inf - -inf) would be NaN);
        // a NaN s (m still -inf) is kept.
        const float inv = 1.0f / g.sum(s == 0.0f ? 0.0f : s * expf(m - M));
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V], o[V];
            load_f<T, V>(x + (size_t)i * V, a);
#pragma unroll
            for (int j = 0; j < V; ++j) o[j] = expf(a[j] - M) * inv;
            store_f<T, V>(y + (size_t)i * V, o);
        }
    }
}

template <typename T>
__device__ __forceinline__ void softmax_kernel(const T* x, T* y, long long rows, int n, int vec) {
    const RowGroup g = RowGroup::make();
    for (long long r = g.first_row(); r < rows; r += g.row_step()) {
        if (vec) softmax_row<T, VecWidth<T>::value>(x + r * n, y + r * n, n, g);
        else softmax_row<T, 1>(x + r * n, y + r * n, n, g);
    }
}

}  // namespace to

#define TO_SOFTMAX(T, S)                                                                       \
    extern "C" __global__ void __launch_bounds__(512, 2) to_softmax_##S(const T* __restrict__ x, T* __restrict__ y, \
                                           long long rows, int n, int vec) {                   \
        to::softmax_kernel<T>(x, y, rows, n, vec);                                             \
    }
TO_FOR_EACH_DTYPE(TO_SOFTMAX)
#undef TO_SOFTMAX
