// Rotary position embedding. x: (rows, n), cos/sin: (T, n) float32, row r uses position r % T.
// Non-interleaved pairs (i, i + n/2); interleaved pairs (2i, 2i + 1). fp32 math.
#include "common.cuh"

namespace to {

// Non-interleaved: V consecutive i in [0, h) per step, with their partners at i + h.
template <typename T, int V>
__device__ __forceinline__ void rope_half(const T* __restrict__ xr, const float* __restrict__ c,
                                          const float* __restrict__ s, T* __restrict__ yr, int h) {
    for (int i = (blockIdx.x * blockDim.x + threadIdx.x) * V; i < h; i += gridDim.x * blockDim.x * V) {
        float a[V], b[V], c0[V], c1[V], s0[V], s1[V], o0[V], o1[V];
        load_f<T, V>(xr + i, a);
        load_f<T, V>(xr + h + i, b);
        load_f<float, V>(c + i, c0);
        load_f<float, V>(c + h + i, c1);
        load_f<float, V>(s + i, s0);
        load_f<float, V>(s + h + i, s1);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            o0[j] = a[j] * c0[j] - b[j] * s0[j];
            o1[j] = b[j] * c1[j] + a[j] * s1[j];
        }
        store_f<T, V>(yr + i, o0);
        store_f<T, V>(yr + h + i, o1);
    }
}

// Interleaved: V consecutive elements (V/2 pairs) per step; V == 2 is the unaligned path
// done with scalar accesses.
template <typename T, int V>
__device__ __forceinline__ void rope_pairs(const T* __restrict__ xr, const float* __restrict__ c,
                                           const float* __restrict__ s, T* __restrict__ yr, int n) {
    for (int i = (blockIdx.x * blockDim.x + threadIdx.x) * V; i < n; i += gridDim.x * blockDim.x * V) {
        float a[V], cv[V], sv[V], o[V];
        if (V == 2) {
#pragma unroll
            for (int j = 0; j < V; ++j) { a[j] = to_float(xr[i + j]); cv[j] = c[i + j]; sv[j] = s[i + j]; }
        } else {
            load_f<T, V>(xr + i, a);
            load_f<float, V>(c + i, cv);
            load_f<float, V>(s + i, sv);
        }
#pragma unroll
        for (int j = 0; j < V; j += 2) {
            o[j] = a[j] * cv[j] - a[j + 1] * sv[j];
            o[j + 1] = a[j + 1] * cv[j + 1] + a[j] * sv[j + 1];
        }
        if (V == 2) {
#pragma unroll
            for (int j = 0; j < V; ++j) yr[i + j] = from_float<T>(o[j]);
        } else {
            store_f<T, V>(yr + i, o);
        }
    }
}

// 4 elements per vector for every dtype: cos/sin are float32, 4 of them are 16 bytes.
template <typename T>
__device__ __forceinline__ void rope_kernel(const T* x, const float* cos_t, const float* sin_t, T* y,
                                            long long rows, int n, int T_pos, int interleaved, int vec) {
    // blockDim.y rows per block (rows_cols_launch): a 128-wide row is 16 vector steps, so one
    // row per 256-thread block left 15 of every 16 threads idle (0.37 of the copy on an H200).
    for (long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y; r < rows;
         r += (long long)gridDim.y * blockDim.y) {
        const long long p = r % T_pos;
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const float* c = cos_t + p * n;
        const float* s = sin_t + p * n;
        if (interleaved) {
            if (vec) rope_pairs<T, 4>(xr, c, s, yr, n);
            else rope_pairs<T, 2>(xr, c, s, yr, n);
        } else {
            if (vec) rope_half<T, 4>(xr, c, s, yr, n / 2);
            else rope_half<T, 1>(xr, c, s, yr, n / 2);
        }
    }
}

}  // namespace to

#define TO_ROPE(T, S)                                                                          \
    extern "C" __global__ void to_rope_##S(const T* __restrict__ x, const float* __restrict__ cos_t, \
                                        const float* __restrict__ sin_t, T* __restrict__ y,    \
                                        long long rows, int n, int T_pos, int interleaved,     \
                                        int vec) {                                             \
        to::rope_kernel<T>(x, cos_t, sin_t, y, rows, n, T_pos, interleaved, vec);              \
    }
TO_FOR_EACH_DTYPE(TO_ROPE)
#undef TO_ROPE
