// norm.cpp: rms_norm / layer_norm forward and backward (compiled once per ISA variant).
//
// Forward kernels are single pass over memory: row r+1 (16 KiB for n = 4096 fp32) is read
// from memory for its statistics inside row r's write pass, which reads row r again from
// cache and streams its output, while row r+2 is prefetched (rms_norm_k, layer_norm_k; the
// fused adds take a row's statistics in their own pass). Statistics are accumulated in fp32
// lanes inside 1024-element blocks and in double across blocks (variant.h BlockSum), so very
// long rows stay accurate.
#include "vmath.h"
#include "variant.h"

#include <cmath>
#include <type_traits>
#include <utility>

namespace to {
namespace TO_NS {
namespace {

// One row of layer_norm in double, for rows whose fp32 statistics overflowed.
template <class T, class TX, class TW, class TB>
void layer_norm_row_f64(const TX* xr, const TW* w, const TB* b, T* yr, int64_t n, float eps, float* mu,
                        float* rsigma) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)to_f32(xr[i]);
    const double mean = sum / (double)n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double)to_f32(xr[i]) - mean;
        ss += d * d;
    }
    const double rs = 1.0 / std::sqrt(ss / (double)n + (double)eps);
    if (mu) *mu = (float)mean;
    if (rsigma) *rsigma = (float)rs;
    for (int64_t i = 0; i < n; ++i) {
        double v = ((double)to_f32(xr[i]) - mean) * rs * (double)to_f32(w[i]);
        if (b) v += (double)to_f32(b[i]);
        put(yr + i, (float)v);
    }
}

// One row of rms_norm in double, for rows whose fp32 sum of squares overflowed (|x| >
// ~1.8e19 on finite input): finite input never turns into 0. Rows holding inf/NaN come out
// as the fp32 formula makes them (x * 0 or NaN), the double sum being inf/NaN too.
template <class T, class TX, class TW>
void rms_norm_row_f64(const TX* xr, const TW* w, T* yr, int64_t n, float eps, float* rsigma) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double v = (double)to_f32(xr[i]);
        ss += v * v;
    }
    const double rs = 1.0 / std::sqrt(ss / (double)n + (double)eps);
    if (rsigma) *rsigma = (float)rs;
    for (int64_t i = 0; i < n; ++i) put(yr + i, (float)((double)to_f32(xr[i]) * rs * (double)to_f32(w[i])));
}

inline float rsqrt_of(double ss, int64_t n, float eps) { return (float)(1.0 / std::sqrt(ss / (double)n + (double)eps)); }

// Rows pipelined: row r's write pass (from cache, streaming out) also sums row r+1 from
// memory (StepWith over RowSum) while row r+2 is prefetched, so reads and writes stream
// together instead of a read-only statistics pass between write passes (the first row's sum
// is taken on its own). In-process A/B against the unpipelined form (ab_builds.py, 3 copies,
// both placements): fp16 1.08-1.25x (median 1.18), bf16 0.94-1.23x (median 1.08), fp32
// 1.03-1.09x in seven runs where relu's time showed a copy-bound host, 0.94x in one where it
// did not, 0.90-1.07x in six earlier ones (more instructions: 1.12 per element against 1.05,
// which costs where the host's bandwidth outruns the core). layer_norm likewise, once its
// statistics take one pass (below). RowSum adds in one order whoever steps it: the output
// is bitwise the unpipelined one (CONTRIBUTING "Rows pipelined").
template <class T, class TW>
void rms_norm_t(const void* xv, const TW* w, void* yv, int64_t rows, int64_t n, float eps, float* rsigma, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    double ss = rows > 0 ? row_sumsq(x, n) : 0.0;
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        const bool more = r + 1 < rows;
        if (!std::isfinite(ss)) {  // fp32 lanes overflowed: this row in double (rare: scalar is fine)
            rms_norm_row_f64(xr, w, y + r * n, n, eps, rsigma ? rsigma + r : nullptr);
            ss = more ? row_sumsq(xr + n, n) : 0.0;
            continue;
        }
        const float rs = rsqrt_of(ss, n, eps);
        if (rsigma) rsigma[r] = rs;
        const V vrs = vset(rs);
        const auto full = [&](int64_t i) { return vload(xr + i) * vrs * vload(w + i); };
        const auto part = [&](int64_t i, int64_t k) { return vload_part(xr + i, k, 0.f) * vrs * vload_part(w + i, k, 0.f); };
        const StepWith<RowSum<T, true>> pf{next_row(xr + n, n, r + 2 < rows, n), RowSum<T, true>({xr + n}, more ? n : 0)};
        T* yr = y + r * n;
        ss = write_row(yr, n, nt, nan_free<T>(full), nan_free<T>(part), pf).s.acc;  // rowio.h nan_free
    }
    if (nt) stream_fence();
}

// y = (x - mean) * rs * w (+ b) from a row in cache: the row's (full, part) generators handed
// to `sink`, so layer_norm's write_row and the fused add's two-output write share them.
template <class TX, class TW, class TB, class Sink>
inline void ln_row(const TX* xr, const TW* w, const TB* b, float mean, float rs, const Sink& sink) {
    const V vm = vset(mean), vrs = vset(rs);
    if (b) {
        sink([&](int64_t i) { return vfma((vload(xr + i) - vm) * vrs, vload(w + i), vload(b + i)); },
             [&](int64_t i, int64_t k) {
                 return vfma((vload_part(xr + i, k, 0.f) - vm) * vrs, vload_part(w + i, k, 0.f), vload_part(b + i, k, 0.f));
             });
    } else {
        sink([&](int64_t i) { return (vload(xr + i) - vm) * vrs * vload(w + i); },
             [&](int64_t i, int64_t k) { return (vload_part(xr + i, k, 0.f) - vm) * vrs * vload_part(w + i, k, 0.f); });
    }
}

// Rows pipelined as rms_norm's (above): row r's write pass from cache also takes row r+1's
// shifted moments from memory while row r+2 is prefetched, so each row is read from memory
// once, in a pass that also writes. In-process A/B against the two-pass form (ab_builds.py,
// 3 copies, both placements, AVX2 variant on a Zen 3 host whose copy was slow): fp32 1.21-1.27x,
// fp16 1.14-1.18x, bf16 1.16-1.21x. Pipelining with the two-pass statistics (the centred
// squares from cache between the sum and the write) measured 0.88-1.00x, the one-pass
// statistics without pipelining 0.98-1.06x: it takes both (CONTRIBUTING "Rows pipelined").
template <class T, class TW, class TB>
void layer_norm_t(const void* xv, const TW* w, const TB* b, void* yv, int64_t rows, int64_t n, float eps, float* mu,
                  float* rsigma, bool nt) {
    const T* x = (const T*)xv;
    T* y = (T*)yv;
    RowMoments<T> m = moments_of(x, n, rows > 0);
    m.finish();
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const bool more = r + 1 < rows;
        const double d = m.acc / (double)n, d2 = m.accq / (double)n;
        double var = d2 - d * d;
        float mean = (float)((double)m.src.c + d);
        if (std::isfinite(var) && d * d > 0.125 * d2) {  // c far from the mean: two passes, from cache
            mean = (float)(row_sum(xr, n) / (double)n);
            var = row_sumsq_centered(xr, n, mean) / (double)n;
        }
        if (!std::isfinite(var) || !std::isfinite(mean)) {
            // The fp32 block sums overflowed (|x - c| > ~1.8e19, e.g. FLT_MAX in the row):
            // redo this row in double so finite input never turns into "y = bias". Rare, so a
            // scalar loop is fine; NaN/Inf inputs still come out NaN as in NumPy.
            layer_norm_row_f64(xr, w, b, yr, n, eps, mu ? mu + r : nullptr, rsigma ? rsigma + r : nullptr);
            m = moments_of(xr + n, n, more);
            m.finish();
            continue;
        }
        const float rs = (float)(1.0 / std::sqrt(var + (double)eps));
        if (mu) mu[r] = mean;
        if (rsigma) rsigma[r] = rs;
        ln_row(xr, w, b, mean, rs, [&](const auto& full, const auto& part) {  // rowio.h nan_free
            m = write_row(yr, n, nt, nan_free<T>(full), nan_free<T>(part),
                          StepWith<RowMoments<T>>{next_row(xr + n, n, r + 2 < rows, n), moments_of(xr + n, n, more)})
                    .s;
        });
    }
    if (nt) stream_fence();
}

// ---- fused residual add (vLLM's fused_add_rms_norm) --------------------------------------
// s = round_T(x + r) into the scratch row: what res_out receives, so the norm sees the stored
// residual, like an add in T followed by the norm. s goes to e in fp32 for fp32 and, for a
// 16-bit T, only to e16 in T (simd.h vround16: the rounded value and its bits from one
// conversion; s_row below), which the norm widens and res_out copies as bits instead of
// converting s a second time (add_rms_norm bf16 1.11-1.23x, fp16 1.07-1.20x; ab_builds, AVX2,
// Zen 3), in both the one-pass and the two-pass write. BlockSum's source; add_into returns the
// blocked sum (SQ: of squares) of s.
template <class T>
struct AddSrc {
    const T* x;
    const T* r;
    float* e;
    T* e16;  // 16-bit T only
    inline V full(int64_t i) const {
        V v = vload(x + i) + vload(r + i);
        if constexpr (sizeof(T) < 4) {
            H h;
            v = vround16(x, v, h);
            vstore(e16 + i, h);
        } else {
            vstore(e + i, v);
        }
        return v;
    }
    inline V part(int64_t i, int64_t k) const {
        V v = ld(x + i, k) + ld(r + i, k);  // padded lanes: 0 + 0
        if constexpr (sizeof(T) < 4) {
            H h;
            v = vround16(x, v, h);
            vstore_part(e16 + i, h, k);
        } else {
            st(e + i, v, k);
        }
        return v;
    }
};

// Where a row's 16-bit copy of s lives in the scratch (kernels.h fused_add_scratch).
template <class T>
inline T* e16_of(float* e, int64_t n) {
    return (T*)(e + fused_add_e16_at(n));
}

// The row s as the write pass reads it: e (fp32) for fp32, e16's bits for a 16-bit T, widened
// as they are loaded like any 16-bit input. A 16-bit form kept an fp32 copy too until
// 2026-11-28: 16 KiB more per 4096-wide row beside x, residual, w and e16 in a 32 KiB L1, one
// more store per vector, and the loads it saved were a widen each.
template <class T>
inline auto s_row(float* e, int64_t n) {
    if constexpr (sizeof(T) < 4)
        return (const T*)e16_of<T>(e, n);
    else
        return (const float*)e;
}

template <class T, bool SQ>
inline double add_into(const T* x, const T* r, float* e, int64_t n) {
    return BlockSum<AddSrc<T>, SQ>({x, r, e, e16_of<T>(e, n)}, n).finish();
}

// Both outputs of a row in one pass over the scratch row e: write_row writes y from (full,
// part) and each of its steps stores the same lanes of res_out = e beside it (two streaming
// stores per vector; a 16-bit res_out copies e16's bits), the next row's add stepped beside
// it (pf: add_next below; the two-pass form steps it in y's pass). Needs y and o at the
// same offset within a vector (torch: both page + 64; np.empty: both page + 16), else each
// gets its own write_row pass. 16-bit outputs off a vector boundary keep the two passes too:
// fused, they ran 0.95-0.97x in bf16 and 0.95 / 1.01x in fp16 (np.empty's page + 16) where the
// aligned cases gained up to 1.14x (CONTRIBUTING "The fused add's two outputs in one pass").
// So do the AVX2 builds: on an AMD EPYC Zen 3 two interleaved streams of streaming stores ran
// the 16-bit fused adds 1.2-2.0x slower than two passes, and at some placements fp32's and
// fp16's took 3.5-9x their usual time (CONTRIBUTING "Two interleaved streams of streaming
// stores"); the one-pass gains were measured on AVX-512 builds.
template <class T, class Full, class Part, class PF>
inline PF write_pair(T* y, T* o, const float* e, int64_t n, bool nt, const Full& full, const Part& part, PF pf) {
    const uintptr_t A = (uintptr_t)W * sizeof(T);
    const T* e16 = e16_of<T>(const_cast<float*>(e), n);
    if (nt && W > 1 && (TO_ISA < 2 || (uintptr_t)y % A != (uintptr_t)o % A || (sizeof(T) < 4 && (uintptr_t)y % A))) {
        PF got = write_row(y, n, nt, full, part, pf);
        if constexpr (sizeof(T) < 4)  // e16's bits, as the one-pass form copies them
            write_row(
                o, n, nt, [&](int64_t i) { return vbits16(e16 + i); },
                [&](int64_t i, int64_t k) { return vbits16_part(e16 + i, k); });
        else
            write_row(
                o, n, nt, [&](int64_t i) { return vload(e + i); },
                [&](int64_t i, int64_t k) { return vload_part(e + i, k, 0.f); });
        return got;
    }
    if (nt && (n * (int64_t)sizeof(T) + (int64_t)((uintptr_t)o % A)) % (int64_t)A)
        __builtin_prefetch(o + n - 1, 1, 3);  // as write_row does for y's shared last line
    return write_row(
        y, n, nt,
        [&](int64_t i) {
            if constexpr (sizeof(T) < 4) {
                vcopy16(o + i, e16 + i, nt);
            } else {
                const V s = vload(e + i);
                if (nt)
                    vstream(o + i, s);
                else
                    vstore(o + i, s);
            }
            return full(i);
        },
        [&](int64_t i, int64_t k) {
            if constexpr (sizeof(T) < 4)
                std::memcpy((void*)(o + i), (const void*)(e16 + i), (size_t)k * sizeof(T));
            else
                vstore_part(o + i, vload_part(e + i, k, 0.f), k);
            return part(i, k);
        },
        pf);
}

// y = e * rs * w (rms) or (e - mean) * rs * w (+ b) (layer) and res_out = e, in one pass.
// flatten: GCC left the sink lambda out of line (a call per row, its closures reloaded every
// vector: add_rms_norm fp32 1.98 instructions per element against 1.67 inlined).
template <class T, class TW, class TB, class PF>
__attribute__((flatten)) inline double add_norm_write(const float* e, const TW* w, const TB* b, T* yr, T* orow,
                                                      int64_t n, float mean, float rs, bool layer, bool nt, PF pf) {
    double next = 0.0;
    const auto sink = [&](const auto& full, const auto& part) {  // y: rowio.h nan_free (products of es)
        next = write_pair(yr, orow, e, n, nt, nan_free<T>(full), nan_free<T>(part), pf).s.acc;
    };
    const auto es = s_row<T>(const_cast<float*>(e), n);
    if (layer) {
        ln_row(es, w, b, mean, rs, sink);
    } else {
        const V vrs = vset(rs);
        sink([&](int64_t i) { return vload(es + i) * vrs * vload(w + i); },
             [&](int64_t i, int64_t k) { return vload_part(es + i, k, 0.f) * vrs * vload_part(w + i, k, 0.f); });
    }
    return next;
}

// Rows pipelined, as rms_norm_t's: row r's write pass also adds row r + 1 (x + r from memory,
// into the other scratch row, its sum taken as it goes: BlockSum stepped by write_row) while
// row r + 2 is prefetched, so reads and writes stream together. ab_builds.py --copies 2
// --rounds 9 against the unpipelined form (add_into, then the write with row r + 1
// prefetched), 8192 x 4096, Zen 4: np.empty's placement fp32 / fp16 / bf16 add_rms_norm 1.20 /
// 1.20 / 1.12x, add_layer_norm 1.17 / 1.15 / 1.12x; torch's (--out-offset 0) 1.15 / 1.10 /
// 1.11x and 1.11 / 1.08 / 1.04x. AVX2 (TENSOR_OPS_MAX_ISA=avx2): fp32 1.11-1.13x, 16-bit
// 0.94-0.99x (an unpipelined 16-bit AVX2 form beside it, its write prefetching the next row's
// x and residual together, measured 0.82-1.00x: not kept). BlockSum adds in its one order: the
// output is bitwise the unpipelined one. y may be x and res_out may be r (the same arrays,
// vLLM's in-place form): row r + 1 is read, during row r's write, before it is written.
template <class T, bool SQ>
using AddSum = BlockSum<AddSrc<T>, SQ>;
template <class T, bool SQ>
inline StepWith<AddSum<T, SQ>, Prefetch2> add_next(const T* xr, const T* rr, float* e1, int64_t n, bool more,
                                                   bool more2) {
    const T *x1 = xr + n, *r1 = rr + n;
    return {Prefetch2(next_row(x1, n, more2, n), next_row(r1, n, more2, n)),
            AddSum<T, SQ>({x1, r1, e1, e16_of<T>(e1, n)}, more ? n : 0)};
}

template <class T, class TW>
void add_rms_norm_t(const void* xv, const void* rv, const TW* w, void* yv, void* ov, int64_t rows, int64_t n,
                    float eps, float* e, bool nt) {
    const T* x = (const T*)xv;
    const T* rr = (const T*)rv;
    T* y = (T*)yv;
    T* o = (T*)ov;
    float* ea = e;                       // row r's s
    float* eb = e + fused_add_row(n);   // row r + 1's, summed during row r's write
    double ss = rows > 0 ? add_into<T, true>(x, rr, ea, n) : 0.0;
    for (int64_t r = 0; r < rows; ++r) {
        const T *xr = x + r * n, *rrow = rr + r * n;
        const bool more = r + 1 < rows;
        if (!std::isfinite(ss)) {  // as in rms_norm_k: s² overflowed fp32 lanes, this row in double
            const auto es = s_row<T>(ea, n);
            rms_norm_row_f64(es, w, y + r * n, n, eps, nullptr);
            write_row(
                o + r * n, n, nt, [&](int64_t i) { return vload(es + i); },
                [&](int64_t i, int64_t k) { return vload_part(es + i, k, 0.f); });
            ss = more ? add_into<T, true>(xr + n, rrow + n, eb, n) : 0.0;
        } else {
            const float rs = rsqrt_of(ss, n, eps);
            ss = add_norm_write<T, TW, TW>(ea, w, nullptr, y + r * n, o + r * n, n, 0.f, rs, false, nt,
                                           add_next<T, true>(xr, rrow, eb, n, more, r + 2 < rows));
        }
        std::swap(ea, eb);
    }
    if (nt) stream_fence();
}

template <class T, class TW, class TB>
void add_layer_norm_t(const void* xv, const void* rv, const TW* w, const TB* b, void* yv, void* ov, int64_t rows,
                      int64_t n, float eps, float* e, bool nt) {
    const T* x = (const T*)xv;
    const T* rr = (const T*)rv;
    T* y = (T*)yv;
    T* o = (T*)ov;
    float* ea = e;
    float* eb = e + fused_add_row(n);
    double sum = rows > 0 ? add_into<T, false>(x, rr, ea, n) : 0.0;
    for (int64_t r = 0; r < rows; ++r) {
        const T *xr = x + r * n, *rrow = rr + r * n;
        const bool more = r + 1 < rows;
        const float mean = (float)(sum / (double)n);
        const auto es = s_row<T>(ea, n);
        const double var = row_sumsq_centered(es, n, mean) / (double)n;
        if (!std::isfinite(var) || !std::isfinite(mean)) {  // as in layer_norm_k
            layer_norm_row_f64(es, w, b, y + r * n, n, eps, nullptr, nullptr);
            write_row(
                o + r * n, n, nt, [&](int64_t i) { return vload(es + i); },
                [&](int64_t i, int64_t k) { return vload_part(es + i, k, 0.f); });
            sum = more ? add_into<T, false>(xr + n, rrow + n, eb, n) : 0.0;
        } else {
            sum = add_norm_write(ea, w, b, y + r * n, o + r * n, n, mean, (float)(1.0 / std::sqrt(var + (double)eps)),
                                 true, nt, add_next<T, false>(xr, rrow, eb, n, more, r + 2 < rows));
        }
        std::swap(ea, eb);
    }
    if (nt) stream_fence();
}

// The table's entries: the weights (and bias) in the format wf (kernels.h NormWeights), chosen by
// bind_facade.cpp NormParams. Both 16-bit formats keep the rows' L1 footprint small: a
// 4096-wide fp32 weight and bias are 32 KiB, the whole L1 of the Intel host, beside x's row,
// the next row being summed and the fused adds' scratch row. An fp16 weight (and bias) is read
// as it is, one vcvtph2ps from memory each; in cache (callgrind_ops incache, 16 rows x 4096,
// one thread, Cascade Lake) fp16 rms_norm 0.24 against 0.29 ns per element, layer_norm
// 0.30-0.32 against 0.34. A bf16 one costs two instructions to widen (vpmovzxwd + vpslld):
// bf16 layer_norm 0.46-0.47 against 0.42, so bf16 packs a weight and its bias in one word
// (simd.h bf16lo / bf16hi: one instruction each from one load); a bf16 rms_norm, or a
// layer_norm without bias, keeps the fp32 weight. On Zen 4 (512-bit instructions split in
// two) the conversions cost more than the footprint saves: fp32 weights there for fp16 (rms_norm
// 1.06-1.15x, layer_norm 1.06-1.27x) and bf16 layer_norm (1.07-1.09x); the fused add keeps
// bf16 pairs (0.96x without). runtime.h g_norm_w16; CONTRIBUTING "Zen 4: the norms' 16-bit weights".
template <class T, bool PAIRS, class F>
inline void with_w(int wf, const void* w, const void* b, const F& f) {
    if constexpr (std::is_same_v<T, f16>) {
        if (wf == NW_F16) return f((const T*)w, (const T*)b);
    }
    if constexpr (PAIRS && std::is_same_v<T, bf16>) {
        if (wf == NW_BF16_PAIRS) return f((const bf16lo*)w, (const bf16hi*)w);
    }
    f((const float*)w, (const float*)b);
}
template <class T>
void rms_norm_k(const void* x, const void* w, void* y, int64_t rows, int64_t n, float eps, float* rsigma, bool nt,
                int wf) {
    with_w<T, false>(wf, w, nullptr, [&](auto wt, auto) { rms_norm_t<T>(x, wt, y, rows, n, eps, rsigma, nt); });
}
template <class T>
void layer_norm_k(const void* x, const void* w, const void* b, void* y, int64_t rows, int64_t n, float eps, float* mu,
                  float* rsigma, bool nt, int wf) {
    with_w<T, true>(wf, w, b, [&](auto wt, auto bt) { layer_norm_t<T>(x, wt, bt, y, rows, n, eps, mu, rsigma, nt); });
}
template <class T>
void add_rms_norm_k(const void* x, const void* r, const void* w, void* y, void* o, int64_t rows, int64_t n, float eps,
                    float* e, bool nt, int wf) {
    with_w<T, false>(wf, w, nullptr, [&](auto wt, auto) { add_rms_norm_t<T>(x, r, wt, y, o, rows, n, eps, e, nt); });
}
template <class T>
void add_layer_norm_k(const void* x, const void* r, const void* w, const void* b, void* y, void* o, int64_t rows,
                      int64_t n, float eps, float* e, bool nt, int wf) {
    with_w<T, true>(wf, w, b,
                    [&](auto wt, auto bt) { add_layer_norm_t<T>(x, r, wt, bt, y, o, rows, n, eps, e, nt); });
}

// sum_i a[i]*b[i]*c[i] over a row, blocked like row_sumsq (b: the backward's fp32 weight).
template <class T>
inline double row_dot3(const T* a, const float* b, const T* c, int64_t n, const V add_c) {
    double acc = 0.0;
    int64_t i = 0;
    while (i < n) {
        const int64_t e = (n - i > 1024) ? i + 1024 : n;
        V s = vset(0.0f);
        for (; i < e; i += W) {
            const int64_t k = e - i < W ? e - i : W;
            s = vfma(ld(a + i, k) * (ld(b + i, k) + add_c), ld(c + i, k), s);
        }
        i = e;
        acc += (double)hsum(s);
    }
    return acc;
}

// The backward's second pass reads the row from cache (the first pass brought it in) and
// writes dx with write_row: streaming stores for large outputs (nt), and the next row's dz
// and x prefetched meanwhile, so the first pass over it finds it in cache (4096x1024 fp32
// layer_norm_bwd, one thread, on the shared 2-core box: ~4.9 -> ~2.9 ms, best of 21).
// dgamma (and dbeta) are added into the fp32 accumulators as each dx vector is produced:
// write_row visits every index once. gp is gamma in fp32 (read as gp + 1 for zero-centred
// gamma, zc): a 16-bit gamma is widened once per call by the binding (bind_tex.cpp norm_bwd)
// instead of at each of the rows' two reads per element (two instructions for bf16).
// y = x*rs*g'  (g' = g or 1+g):  dx = rs*(dz*g' - x*rs*c),  c = rs*mean(dz*g'*x),
// dgamma += dz*x*rs.
template <class T>
void rms_norm_bwd_k(const void* dzv, const void* xv, const float* rsigma, const float* gp, void* dxv,
                    float* dg, int64_t rows, int64_t n, bool zc, bool nt) {
    const T* dz = (const T*)dzv;
    const T* x = (const T*)xv;
    T* dx = (T*)dxv;
    const V one = vset(zc ? 1.0f : 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const T* dzr = dz + r * n;
        const T* xr = x + r * n;
        const float rs = rsigma[r];
        const double s = row_dot3(dzr, gp, xr, n, one);
        const float c = (float)((double)rs * s / (double)n);
        const V vrs = vset(rs), vk = vset(rs * rs * c);
        const bool more = r + 1 < rows;
        Prefetch px = next_row(xr, n, more, n);
        auto full = [&](int64_t i) {
            px();
            const V vdz = vload(dzr + i), vx = vload(xr + i);
            vstore(dg + i, vfma(vdz, vx * vrs, vload(dg + i)));
            return vfnma(vk, vx, vrs * vdz * (vload(gp + i) + one));
        };
        auto part = [&](int64_t i, int64_t k) {
            const V vdz = vload_part(dzr + i, k, 0.f), vx = vload_part(xr + i, k, 0.f);
            vstore_part(dg + i, vfma(vdz, vx * vrs, vload_part(dg + i, k, 0.f)), k);
            return vfnma(vk, vx, vrs * vdz * (vload_part(gp + i, k, 0.f) + one));
        };
        write_row(dx + r * n, n, nt, full, part, next_row(dzr, n, more, n));
        px.rest();
    }
    if (nt) stream_fence();
}

// xh = (x-mu)*rs, dy = dz*g':  dx = rs*(dy - mean(dy) - xh*mean(dy*xh)),
// dgamma += dz*xh, dbeta += dz.
template <class T>
void layer_norm_bwd_k(const void* dzv, const void* xv, const float* mu, const float* rsigma, const float* gp,
                      void* dxv, float* dg, float* db, int64_t rows, int64_t n, bool zc, bool nt) {
    const T* dz = (const T*)dzv;
    const T* x = (const T*)xv;
    T* dx = (T*)dxv;
    const V one = vset(zc ? 1.0f : 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
        const T* dzr = dz + r * n;
        const T* xr = x + r * n;
        const float rs = rsigma[r], m = mu[r];
        const V vm = vset(m), vrs = vset(rs);
        double s1 = 0.0, s2 = 0.0;
        int64_t i = 0;
        while (i < n) {
            const int64_t e = (n - i > 1024) ? i + 1024 : n;
            V a1 = vset(0.0f), a2 = vset(0.0f);
            for (; i < e; i += W) {
                const int64_t k = e - i < W ? e - i : W;
                V dy = ld(dzr + i, k) * (ld(gp + i, k) + one);
                V xh = (ld(xr + i, k) - vm) * vrs;
                a1 = a1 + dy;
                a2 = vfma(dy, xh, a2);
            }
            i = e;
            s1 += (double)hsum(a1);
            s2 += (double)hsum(a2);
        }
        const V va = vset((float)(s1 / (double)n)), vb = vset((float)(s2 / (double)n));
        const bool more = r + 1 < rows;
        Prefetch px = next_row(xr, n, more, n);
        auto full = [&](int64_t j) {
            px();
            const V vdz = vload(dzr + j);
            const V xh = (vload(xr + j) - vm) * vrs;
            vstore(dg + j, vfma(vdz, xh, vload(dg + j)));
            if (db) vstore(db + j, vload(db + j) + vdz);
            return vrs * vfnma(xh, vb, vdz * (vload(gp + j) + one) - va);
        };
        auto part = [&](int64_t j, int64_t k) {
            const V vdz = vload_part(dzr + j, k, 0.f);
            const V xh = (vload_part(xr + j, k, 0.f) - vm) * vrs;
            vstore_part(dg + j, vfma(vdz, xh, vload_part(dg + j, k, 0.f)), k);
            if (db) vstore_part(db + j, vload_part(db + j, k, 0.f) + vdz, k);
            return vrs * vfnma(xh, vb, vdz * (vload_part(gp + j, k, 0.f) + one) - va);
        };
        write_row(dx + r * n, n, nt, full, part, next_row(dzr, n, more, n));
        px.rest();
    }
    if (nt) stream_fence();
}

}  // namespace

void fill_norm(KernelTable& t) {
    t.rms_norm[DT_F32] = rms_norm_k<float>;
    t.rms_norm[DT_F16] = rms_norm_k<f16>;
    t.rms_norm[DT_BF16] = rms_norm_k<bf16>;
    t.layer_norm[DT_F32] = layer_norm_k<float>;
    t.layer_norm[DT_F16] = layer_norm_k<f16>;
    t.layer_norm[DT_BF16] = layer_norm_k<bf16>;
    t.add_rms_norm[DT_F32] = add_rms_norm_k<float>;
    t.add_rms_norm[DT_F16] = add_rms_norm_k<f16>;
    t.add_rms_norm[DT_BF16] = add_rms_norm_k<bf16>;
    t.add_layer_norm[DT_F32] = add_layer_norm_k<float>;
    t.add_layer_norm[DT_F16] = add_layer_norm_k<f16>;
    t.add_layer_norm[DT_BF16] = add_layer_norm_k<bf16>;
    t.rms_norm_bwd[DT_F32] = rms_norm_bwd_k<float>;
    t.rms_norm_bwd[DT_F16] = rms_norm_bwd_k<f16>;
    t.rms_norm_bwd[DT_BF16] = rms_norm_bwd_k<bf16>;
    t.layer_norm_bwd[DT_F32] = layer_norm_bwd_k<float>;
    t.layer_norm_bwd[DT_F16] = layer_norm_bwd_k<f16>;
    t.layer_norm_bwd[DT_BF16] = layer_norm_bwd_k<bf16>;
}

}  // namespace TO_NS
}  // namespace to
