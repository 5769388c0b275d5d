// rms_norm and layer_norm (+ the fused residual add: add_rms_norm, add_layer_norm): one warp per row
// (n <= 512 fp32, 1024 16-bit: arrays.row_launch) or one block per row, launch-selected.
// The row stays in registers when it fits (CACHE_BYTES per thread, packed); longer rows are
// re-read in streaming passes. 16-byte loads when the host says every row is aligned.
// All four kernels run one row function, norm_row: the plain and the fused-add forms differ
// only in where a row's values come from (RowSrc), rms and layer only in the statistics.
#include "common.cuh"

namespace to {

// ---- where a row's values come from --------------------------------------------------------
// Plain (ADD false): x, read-only. Fused residual add (vLLM's fused_add_rms_norm): s =
// round_T(x + r), stored, then normalised. y may be x and s may be r there (the in-place
// form), so x, r and s are plain pointers read with plain loads (never the read-only path,
// which is not coherent with the kernel's own stores): each thread reads its elements of x and
// r before it writes the same elements of s, and rereads (streamed rows) only the elements of
// s it wrote itself; y is written last.
template <typename T, int V>
__device__ __forceinline__ AVec<T, V> load_rw(const T* p) {
#ifdef TO_EMU_CHECK_ALIGN
    TO_EMU_CHECK_ALIGN(p, alignof(AVec<T, V>));
#endif
    return *reinterpret_cast<const AVec<T, V>*>(p);
}

template <typename T, int V, bool ADD>
struct RowSrc {
    const T* x;
    const T* r;  // ADD only
    T* s;        // ADD only
    // Chunk i (V elements), first read, in the row's type: x, or s = round_T(x + r) stored to s.
    __device__ __forceinline__ AVec<T, V> first_vec(int i) const {
        if (!ADD) return load_vec<T, V>(x + (size_t)i * V);
        float a[V], rv[V];
        widen<T, V>(load_rw<T, V>(x + (size_t)i * V), a);
        widen<T, V>(load_rw<T, V>(r + (size_t)i * V), rv);
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] += rv[j];
        const AVec<T, V> sv = narrow<T, V>(a);
#ifdef TO_EMU_CHECK_ALIGN
        TO_EMU_CHECK_ALIGN(s + (size_t)i * V, alignof(AVec<T, V>));
#endif
        *reinterpret_cast<AVec<T, V>*>(s + (size_t)i * V) = sv;
        return sv;
    }
    __device__ __forceinline__ void first(int i, float* a) const { widen<T, V>(first_vec(i), a); }
    // Chunk i again (streamed rows): this thread's own chunk, as first() gave it.
    __device__ __forceinline__ void again(int i, float* a) const {
        if (ADD) widen<T, V>(load_rw<T, V>(s + (size_t)i * V), a);
        else load_f<T, V>(x + (size_t)i * V, a);
    }
};

// ---- statistics -----------------------------------------------------------------------------
// The row's affine map y = (a * sc - mean) * mul * w (+ b): sc = 1 normally; rms: mean = 0.
// ok: the fp32 sums stayed finite.
struct Affine {
    float sc, mean, mul;
    bool ok;
};

// Statistics of this thread's chunks (get(k, a): chunk k of the thread's values, false past the
// row's end; from registers or reread), reduced over the group, of the values scaled by sc:
// rms: mul = 1/sqrt(mean(v^2) + eps * sc^2); layer: the mean, then the centred squares (two
// passes over the values: no cancellation).
template <int V, bool LAYER, typename Get>
__device__ Affine row_stats(Get get, int nk, int n, float sc, float eps, const RowGroup& g) {
    const float inv_n = 1.0f / (float)n;
    float acc = 0.0f;
    for (int k = 0; k < nk; ++k) {
        float a[V];
        if (get(k, a))
#pragma unroll
            for (int j = 0; j < V; ++j) { const float v = a[j] * sc; acc = LAYER ? acc + v : fmaf(v, v, acc); }
    }
    acc = g.sum(acc);
    if (!LAYER) return {sc, 0.0f, 1.0f / sqrtf(acc * inv_n + eps * sc * sc), (bool)isfinite(acc)};
    const float mean = acc * inv_n;
    float q = 0.0f;
    for (int k = 0; k < nk; ++k) {
        float a[V];
        if (get(k, a))
#pragma unroll
            for (int j = 0; j < V; ++j) { const float d = fmaf(a[j], sc, -mean); q = fmaf(d, d, q); }
    }
    q = g.sum(q);
    float mul = 1.0f / sqrtf(q * inv_n + eps * sc * sc);
    // Scaled, eps * sc^2 can underflow: a row of equal values then gets y = b, as in fp64.
    if (sc != 1.0f && eps > 0.0f) mul = fminf(mul, 3.402823466e38f);
    return {sc, mean, mul, isfinite(acc) && isfinite(q)};
}

// The statistics, redone on the values scaled by 1/max|v| when the fp32 sums overflowed on
// finite input (|v| > ~1.8e19: rms's squares; layer's sum or centred squares), so finite input
// never turns into 0 (rms) or into "y = bias" (layer), as the cpp backend's fp64 rows. Rows
// holding inf/NaN keep the plain formula's 0/NaN. The sums are reduced over the group, so
// every thread takes the branch (the barriers of g.max/g.sum are reached by all or none).
template <int V, bool LAYER, typename Get>
__device__ __forceinline__ Affine norm_stats(Get get, int nk, int n, float eps, const RowGroup& g) {
    const Affine f = row_stats<V, LAYER>(get, nk, n, 1.0f, eps, g);
    if (f.ok) return f;
    float m = 0.0f;
    for (int k = 0; k < nk; ++k) {
        float a[V];
        if (get(k, a))
#pragma unroll
            for (int j = 0; j < V; ++j) m = fmaxf(m, fabsf(a[j]));
    }
    m = g.max(m);
    if (!(isfinite(m) && m > 0.0f)) return f;
    // sc = 2^-e with max|v| * sc in [0.5, 1) (e <= 126: sc stays a normal float): a power of
    // two, so v * sc is exact and fmaf(v, sc, -mean) rounds like the scaled value minus the
    // mean (a row of equal values has centred values of exactly 0, as in fp64).
    int e;
    frexpf(m, &e);
    return row_stats<V, LAYER>(get, nk, n, ldexpf(1.0f, e < 126 ? -e : -126), eps, g);
}

// ---- one row ----------------------------------------------------------------------------------
template <typename T, int V, bool LAYER, bool ADD>
__device__ __forceinline__ void norm_row(const RowSrc<T, V, ADD>& src, const T* __restrict__ w,
                                         const T* __restrict__ b, T* y, int n, float eps, const RowGroup& g) {
    constexpr int NV = CACHE_BYTES / (V * (int)sizeof(T));
    const int nvec = n / V;
    // The scalar (unaligned / odd width) path streams: caching it costs registers that
    // would lower the occupancy of the vector path, which shares the kernel.
    const bool cached = V > 1 && nvec <= NV * g.nthreads;  // folds to false for V == 1
    auto write = [&](int i, const float* a, const Affine& f) {
        float wv[V], bv[V], o[V];
        load_f<T, V>(w + (size_t)i * V, wv);
        if (LAYER && b) load_f<T, V>(b + (size_t)i * V, bv);
#pragma unroll
        for (int j = 0; j < V; ++j) o[j] = fmaf(a[j], f.sc, -f.mean) * f.mul * wv[j] + (LAYER && b ? bv[j] : 0.0f);
        store_f<T, V>(y + (size_t)i * V, o);
    };
    if (cached) {
        // The row's own type in registers (16-bit rows packed: half the registers of floats),
        // widened by each pass that reads it.
        AVec<T, V> v[NV];
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) v[k] = src.first_vec(i);
        }
        auto get = [&](int k, float* a) {
            if (g.tid + k * g.nthreads >= nvec) return false;
#pragma unroll
            for (int kk = 0; kk < NV; ++kk)  // constant register indices: v stays in registers
                if (kk == k) widen<T, V>(v[kk], a);
            return true;
        };
        const Affine f = norm_stats<V, LAYER>(get, NV, n, eps, g);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int i = g.tid + k * g.nthreads;
            if (i < nvec) {
                float a[V];
                widen<T, V>(v[k], a);
                write(i, a, f);
            }
        }
    } else {
        // The statistics' first pass is the row's first read (ADD: it writes s); the later
        // passes reread the thread's own chunks.
        const int nk = (nvec - g.tid + g.nthreads - 1) / g.nthreads;
        bool fresh = true;
        auto get = [&](int k, float* a) {
            const int i = g.tid + k * g.nthreads;
            if (!fresh) {
                src.again(i, a);
                return true;
            }
            src.first(i, a);
            if (k == nk - 1) fresh = false;  // row_stats' first loop visits k = 0 .. nk-1 once
            return true;
        };
        const Affine f = norm_stats<V, LAYER>(get, nk > 0 ? nk : 0, n, eps, g);
        for (int i = g.tid; i < nvec; i += g.nthreads) {
            float a[V];
            src.again(i, a);
            write(i, a, f);
        }
    }
}

template <typename T, bool LAYER, bool ADD>
__device__ __forceinline__ void norm_kernel(const T* x, const T* r, const T* w, const T* b, T* y, T* s,
                                            long long rows, int n, float eps, int vec) {
    const RowGroup g = RowGroup::make();
    constexpr int VW = VecWidth<T>::value;
    for (long long row = g.first_row(); row < rows; row += g.row_step()) {
        const long long off = row * n;
        if (vec) norm_row<T, VW, LAYER, ADD>(RowSrc<T, VW, ADD>{x + off, ADD ? r + off : nullptr, ADD ? s + off : nullptr},
                                             w, b, y + off, n, eps, g);
        else norm_row<T, 1, LAYER, ADD>(RowSrc<T, 1, ADD>{x + off, ADD ? r + off : nullptr, ADD ? s + off : nullptr},
                                        w, b, y + off, n, eps, g);
    }
}

}  // namespace to

#define TO_NORM(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_rms_norm_##S(                                      \
        const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, long long rows, int n, float eps,    \
        int vec) {                                                                                             \
        to::norm_kernel<T, false, false>(x, nullptr, w, nullptr, y, nullptr, rows, n, eps, vec);                \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_layer_norm_##S(                                    \
        const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,             \
        long long rows, int n, float eps, int vec) {                                                           \
        to::norm_kernel<T, true, false>(x, nullptr, w, b, y, nullptr, rows, n, eps, vec);                       \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_add_rms_norm_##S(                                  \
        const T* x, const T* r, const T* __restrict__ w, T* y, T* s, long long rows, int n, float eps, int vec) { \
        to::norm_kernel<T, false, true>(x, r, w, nullptr, y, s, rows, n, eps, vec);                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(512, 2) to_add_layer_norm_##S(                                \
        const T* x, const T* r, const T* __restrict__ w, const T* __restrict__ b, T* y, T* s, long long rows,     \
        int n, float eps, int vec) {                                                                           \
        to::norm_kernel<T, true, true>(x, r, w, b, y, s, rows, n, eps, vec);                                    \
    }
TO_FOR_EACH_DTYPE(TO_NORM)
#undef TO_NORM
