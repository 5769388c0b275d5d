// Shared helpers for the tensor_ops CUDA kernels.
//
// Self-contained on purpose: no <cuda_fp16.h>/<cuda_bf16.h>, so the same text compiles with
// nvcc (ahead of time, setup.py build_cuda) and with NVRTC through CuPy (runtime fallback)
// without include paths. fp16/bf16 are 16-bit storage types; all math is fp32.
#ifndef TENSOR_OPS_COMMON_CUH
#define TENSOR_OPS_COMMON_CUH

namespace to {

struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(f16 v) {
#ifdef TO_HOST_EMULATION  // tests/test_cuda.py runs these kernels on the CPU (F16C)
    return _cvtsh_ss(v.bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
#endif
}
__device__ __forceinline__ float to_float(bf16 v) {
    return __uint_as_float(static_cast<unsigned int>(v.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ f16 from_float<f16>(float f) {
    f16 r;
#ifdef TO_HOST_EMULATION
    r.bits = _cvtss_sh(f, 0);  // 0: round to nearest even, as cvt.rn
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
#endif
    return r;
}
// Round-to-nearest-even: one cvt.rn.bf16.f32 on sm_80+; by bit arithmetic before that (and in
// the CPU emulation). The bit form cost bf16 15-20 % against fp16 in the memory-bound kernels
// on an H200 (rms_norm 0.60 against 0.74 of the copy, kernels alone, 2026-11-27).
template <> __device__ __forceinline__ bf16 from_float<bf16>(float f) {
    bf16 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(TO_HOST_EMULATION)
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
#else
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet NaN, keep the sign
        r.bits = static_cast<unsigned short>((u >> 16) | 0x0040u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        r.bits = static_cast<unsigned short>(u >> 16);
    }
#endif
    return r;
}

// N elements of T in one aligned access (16 bytes for VEC = 16 / sizeof(T)).
template <typename T, int N>
struct alignas(sizeof(T) * N) AVec { T v[N]; };

// Widen / narrow one vector of N elements (fp32 math on 16-bit storage).
template <typename T, int N>
__device__ __forceinline__ void widen(const AVec<T, N>& a, float* out) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_float(a.v[j]);
}

template <typename T, int N>
__device__ __forceinline__ AVec<T, N> narrow(const float* in) {
    AVec<T, N> a;
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] = from_float<T>(in[j]);
    return a;
}

template <typename T, int N>
__device__ __forceinline__ AVec<T, N> load_vec(const T* __restrict__ p) {
#ifdef TO_EMU_CHECK_ALIGN
    TO_EMU_CHECK_ALIGN(p, alignof(AVec<T, N>));
#endif
    return *reinterpret_cast<const AVec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void load_f(const T* __restrict__ p, float* out) {
    widen<T, N>(load_vec<T, N>(p), out);
}

template <typename T, int N>
__device__ __forceinline__ void store_f(T* __restrict__ p, const float* in) {
#ifdef TO_EMU_CHECK_ALIGN
    TO_EMU_CHECK_ALIGN(p, alignof(AVec<T, N>));
#endif
    *reinterpret_cast<AVec<T, N>*>(p) = narrow<T, N>(in);
}

// Elements per 16-byte access.
template <typename T> struct VecWidth { static constexpr int value = 16 / sizeof(T); };

// Row-cache capacity per thread: CACHE_BYTES of the row in registers, in its own type (16 fp32
// or 32 fp16/bf16 values, kept packed and widened where used), i.e. CACHE_BYTES / 16 vector
// units; rows longer than threads * that are processed in streaming passes instead. Counted in
// bytes, not floats: with 16 values a thread, a 16-bit row of 8192 took 512 threads holding 32
// bytes each, half the bytes in flight per SM of fp32 for as many block-wide reductions, and
// the 16-bit norms and softmax ran at 0.55-0.74 of the copy on an H200 (fp32 0.93-0.99,
// 2026-11-27). The host's row_launch (backends/cuda/arrays.py) sizes blocks by the same rule.
constexpr int CACHE_BYTES = 64;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A row is processed either by one warp (blockDim = (32, rows_per_block)) or by the whole
// block (blockDim = (threads, 1), threads > 32). The launch shape selects the mode.
struct RowGroup {
    int tid;
    int nthreads;
    bool warp_mode;

    __device__ __forceinline__ static RowGroup make() {
        RowGroup g;
        g.warp_mode = (blockDim.x == 32);
        g.tid = threadIdx.x;
        g.nthreads = blockDim.x;
        return g;
    }
    __device__ __forceinline__ long long first_row() const {
        return warp_mode ? (long long)blockIdx.x * blockDim.y + threadIdx.y : (long long)blockIdx.x;
    }
    __device__ __forceinline__ long long row_step() const {
        return warp_mode ? (long long)gridDim.x * blockDim.y : (long long)gridDim.x;
    }
    __device__ __forceinline__ float sum(float v) const {
        if (warp_mode) return warp_sum(v);
        __shared__ float sh[32];
        v = warp_sum(v);
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        __syncthreads();  // the previous reduction may still be reading sh
        if (lane == 0) sh[wid] = v;
        __syncthreads();
        const int nw = (blockDim.x + 31) >> 5;
        return warp_sum(lane < nw ? sh[lane] : 0.0f);
    }
    __device__ __forceinline__ float max(float v) const {
        if (warp_mode) return warp_max(v);
        __shared__ float shm[32];
        v = warp_max(v);
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        __syncthreads();
        if (lane == 0) shm[wid] = v;
        __syncthreads();
        const int nw = (blockDim.x + 31) >> 5;
        return warp_max(lane < nw ? shm[lane] : __int_as_float(0xff800000));
    }
};

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float relu_f(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
__device__ __forceinline__ float gelu_erf_f(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float gelu_tanh_f(float x) {
    const float k = 0.79788456080286536f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

}  // namespace to

// One extern "C" entry per (op, dtype), named to_<op>_<f32|f16|bf16> ("to_" is the project's one
// symbol prefix, shared with the OpenCL kernels), so CuPy's RawModule finds it by name.
#define TO_FOR_EACH_DTYPE(M) M(float, f32) M(to::f16, f16) M(to::bf16, bf16)

#endif  // TENSOR_OPS_COMMON_CUH
