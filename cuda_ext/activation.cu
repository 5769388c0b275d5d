// Elementwise activations (grid-stride, 16-byte vectors) and gated ones (x: rows x 2h -> rows x h).
#include "common.cuh"

namespace to {

struct SiluOp { __device__ __forceinline__ float operator()(float v) const { return silu_f(v); } };
struct ReluOp { __device__ __forceinline__ float operator()(float v) const { return relu_f(v); } };
struct GeluOp { __device__ __forceinline__ float operator()(float v) const { return gelu_erf_f(v); } };
struct GeluTanhOp { __device__ __forceinline__ float operator()(float v) const { return gelu_tanh_f(v); } };

template <typename T, typename F>
__device__ __forceinline__ void unary_kernel(const T* __restrict__ x, T* __restrict__ y,
                                             long long N, int vec, F f) {
    constexpr int V = VecWidth<T>::value;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if (vec) {
        const long long nvec = N / V;
        for (long long i = tid; i < nvec; i += stride) {
            float a[V];
            load_f<T, V>(x + i * V, a);
#pragma unroll
            for (int j = 0; j < V; ++j) a[j] = f(a[j]);
            store_f<T, V>(y + i * V, a);
        }
        done = nvec * V;
    }
    for (long long i = done + tid; i < N; i += stride) y[i] = from_float<T>(f(to_float(x[i])));
}

template <typename T, int V, typename F>
__device__ __forceinline__ void gated_rows(const T* __restrict__ x, T* __restrict__ y,
                                           long long rows, int h, F f) {
    const int hv = h / V;
    for (long long r = (long long)blockIdx.y * blockDim.y + threadIdx.y; r < rows;
         r += (long long)gridDim.y * blockDim.y) {  // blockDim.y rows per block: rows_cols_launch
        const T* xr = x + r * 2 * (long long)h;
        T* yr = y + r * (long long)h;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < hv; c += gridDim.x * blockDim.x) {
            float a[V], b[V];
            load_f<T, V>(xr + (size_t)c * V, a);
            load_f<T, V>(xr + h + (size_t)c * V, b);
#pragma unroll
            for (int j = 0; j < V; ++j) a[j] = f(a[j]) * b[j];
            store_f<T, V>(yr + (size_t)c * V, a);
        }
    }
}

template <typename T, typename F>
__device__ __forceinline__ void gated_kernel(const T* x, T* y, long long rows, int h, int vec, F f) {
    if (vec) gated_rows<T, VecWidth<T>::value>(x, y, rows, h, f);
    else gated_rows<T, 1>(x, y, rows, h, f);
}

}  // namespace to

#define TO_UNARY(NAME, OP, T, S)                                                               \
    extern "C" __global__ void to_##NAME##_##S(const T* __restrict__ x, T* __restrict__ y,     \
                                          long long N, int vec) {                              \
        to::unary_kernel<T>(x, y, N, vec, to::OP());                                           \
    }
#define TO_GATED(NAME, OP, T, S)                                                               \
    extern "C" __global__ void to_##NAME##_##S(const T* __restrict__ x, T* __restrict__ y,     \
                                          long long rows, int h, int vec) {                    \
        to::gated_kernel<T>(x, y, rows, h, vec, to::OP());                                     \
    }
#define TO_ACTIVATIONS(T, S)                                                                   \
    TO_UNARY(silu, SiluOp, T, S)                                                               \
    TO_UNARY(relu, ReluOp, T, S)                                                               \
    TO_UNARY(gelu, GeluOp, T, S)                                                               \
    TO_UNARY(gelu_tanh, GeluTanhOp, T, S)                                                      \
    TO_GATED(swiglu, SiluOp, T, S)                                                             \
    TO_GATED(geglu, GeluOp, T, S)                                                              \
    TO_GATED(geglu_tanh, GeluTanhOp, T, S)
TO_FOR_EACH_DTYPE(TO_ACTIVATIONS)
#undef TO_ACTIVATIONS
#undef TO_GATED
#undef TO_UNARY
