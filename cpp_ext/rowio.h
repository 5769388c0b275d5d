// rowio.h: how the kernels move rows, on simd.h's vectors (compiled once per ISA variant):
// the next-row prefetch (Prefetch, Prefetch2, StepWith, next_row), the streaming row writer
// (write_row) and the staging buffer for short rows off their line alignment (StagedOut).
// simd.h says what one vector is; this says how rows of them meet memory.
#pragma once
#include "simd.h"

namespace to {
namespace TO_NS {
namespace {

// Software prefetch of the next row while this one is written: `bytes` bytes from p, spread
// evenly over `iters` steps (a whole number of lines per step). The row kernels read a row
// from memory for its statistics, then write it from cache; during that write nothing was
// being read, and the hardware prefetcher does not run a row ahead on its own. With the next
// row prefetched here, reads and streaming writes overlap as in a copy (two-pass rms_norm,
// 1 thread, 4096 x 4096 fp32: 0.67 -> 0.86-0.91 of the streaming copy in a standalone
// loop; prefetching as the row is read, or interleaving the next row's statistics into this
// write pass, measured lower: 0.70-0.80). Into L2 (prefetcht1), not L1: a 4096-wide fp32 row
// is 16 KiB, and the next one pulled into the 32 KiB L1 evicted the current row before its
// write pass re-read it (8192 x 4096, 2 threads, in-process A/B against prefetcht0: rms_norm
// fp32 0.77 -> 0.90 of the ceiling, layer_norm 0.77 -> 0.88, softmax 0.76 -> 0.83, bf16
// rms_norm 0.72 -> 0.84, layer_norm 0.63 -> 0.70-0.76; add_rms_norm / add_layer_norm 20 %
// faster; swiglu, whose rows are re-read from nowhere, unchanged).
struct Prefetch {
    const char* p = nullptr;
    const char* end = nullptr;
    int64_t step = 0;
    Prefetch() = default;
    Prefetch(const void* p_, int64_t bytes, int64_t iters) : p((const char*)p_), end((const char*)p_ + bytes) {
        if (iters < 1) iters = 1;
        step = ((bytes + iters - 1) / iters + 63) & ~(int64_t)63;
    }
    // One compare per step: the steps are 1 or 2 lines at the kernels' row widths, and a
    // loop over the step's lines put ~12 instructions (two compares per line, setb/and,
    // jumps) around each prefetch, in loops of ~25 (softmax's exp loop: 47 instructions per
    // 32 elements, 13 of them this). The last step may reach up to a step past `end`: a
    // prefetch never faults, and those lines are the row after next. Counted (callgrind_ops
    // step, fp32): rms_norm 1.27 -> 1.05 instructions per element, layer_norm 1.93 -> 1.68;
    // timed (ab_builds --copies 3): layer_norm fp32 1.08x faster, the others 1.00-1.05x.
    inline void operator()() {
        if (p < end) {
            __builtin_prefetch(p, 0, 2);
            if (step > 64) {
                __builtin_prefetch(p + 64, 0, 2);
                for (int64_t b = 128; b < step; b += 64) __builtin_prefetch(p + b, 0, 2);
            }
            p += step;
        }
    }
    inline void rest() {  // whatever the steps did not reach
        for (; p < end; p += 64) __builtin_prefetch(p, 0, 2);
    }
};

// Two rows of the same length prefetched together (norm.cpp's fused add writes two outputs per
// step and prefetches the next rows of x and residual): a's steps, each line also taken `off`
// bytes further on. One pointer, bound and step for both: the fused write's loop already holds
// e, its 16-bit copy, w, b, y and res_out, and two whole Prefetch states spilled to the stack
// (add_layer_norm fp16, AVX2: its inner loop reloaded them every step).
struct Prefetch2 {
    Prefetch a;
    intptr_t off = 0;
    // b: a's lines shifted, the same bytes and steps (next_row of two rows of one width)
    Prefetch2(Prefetch a_, Prefetch b) : a(a_), off(a_.p ? (intptr_t)b.p - (intptr_t)a_.p : 0) {}
    inline void line(const char* p) const {  // the other row's line by address: no pointer into it is formed
        __builtin_prefetch(p, 0, 2);
        __builtin_prefetch((const char*)((uintptr_t)p + (uintptr_t)off), 0, 2);
    }
    inline void operator()() {
        if (a.p < a.end) {  // as Prefetch's: one compare per step of one line
            line(a.p);
            if (a.step > 64)
                for (int64_t b = 64; b < a.step; b += 64) line(a.p + b);
            a.p += a.step;
        }
    }
    inline void rest() {
        for (; a.p < a.end; a.p += 64) line(a.p);
    }
};

// The prefetch plus other work stepped with it: S is a functor with finish() (variant.h
// RowSum: the next row's statistics summed during this row's write). write_row returns its
// PF, so the caller reads S's result from what it gets back.
template <class S, class PF = Prefetch>
struct StepWith {
    PF pf;
    S s;
    inline void operator()() {
        pf();
        s();
    }
    inline void rest() {
        pf.rest();
        s.finish();
    }
};

// Stores whose NaNs all have zero low 16 bits. bf16_round_word's NaN case (keep the high
// half, quiet bit set, instead of rounding a payload into the exponent) is only needed for a
// NaN whose low half is nonzero or whose quiet bit is clear. A kernel whose every output value
// is the result of an fp32 multiply / add / FMA (not a min, max or select passing an operand
// through), on bf16 operands widened and values it computed, never makes one: arithmetic on
// NaN gives the default NaN (0xffc00000) or an operand's payload with the quiet bit set, and a
// widened bf16 has a zero low half. Its stores can then round without the NaN case (simd.h
// vpack16_num: the same bits for every value, three instructions fewer per 8 on AVX2).
// nan_free(g): the generator g returning those bits instead of its V where that is cheaper
// (AVX2's bf16), else g itself. Used by rms_norm, layer_norm (their weights
// widened from the input's dtype by the binding: bind_facade.cpp NormParams), the fused adds'
// normed output (of the stored residual; the residual output keeps vround16's exact form),
// softmax's write pass (e * 1/sum), silu / GELU / tanh-GELU, the gated forms (act(a) * b) and
// TE's flat derivatives (g * act'(x)). ab_builds.py, 8192 x 4096 bf16, Zen 3: rms_norm
// 1.13-1.14x, layer_norm 1.05x, add_rms_norm 1.04-1.07x, add_layer_norm 1.03x, softmax
// 1.09-1.10x, silu 1.09x, GELU / tanh-GELU 1.08x, swiglu 1.09x, geglu 1.12x, TE's dgelu 1.08x,
// drelu 1.06x, dsilu 1.04x (CONTRIBUTING "bf16 stores without the NaN case"). Not rope (fp32
// tables from the caller: any payload), relu (vmax passes x through), exp or tanh (their
// selects pass x through).
template <class T, class G>
inline auto nan_free(const G& g) {
#if TO_ISA == 1
    if constexpr (std::is_same_v<T, bf16>)
        return [&g](auto... a) { return vpack16_num((const bf16*)nullptr, g(a...)); };
    else
#endif
        return g;
}

// 16-bit values worked on as their codes, 2W to a V (GCC vector extensions: the variant's own
// integer instructions): the kernels whose 16-bit result is a select of operand bits need no
// widening and no rounding (activation.cpp relu, tex_train.cpp drelu).
typedef int16_t S16 __attribute__((vector_size(sizeof(V))));
inline S16 s16_of(V v) {
    S16 s;
    __builtin_memcpy(&s, &v, sizeof s);
    return s;
}
inline V v_of(S16 s) {
    V v;
    __builtin_memcpy(&v, &s, sizeof s);
    return v;
}
inline S16 s16_splat(int16_t c) { return S16{} + c; }
// The codes at p, 2W of them (unaligned fp32 loads), or 2k with the rest 0.
inline S16 s16_load(const uint16_t* p) { return s16_of(vload((const float*)(const void*)p)); }
inline S16 s16_load_part(const uint16_t* p, int64_t k) { return s16_of(vload_part((const float*)(const void*)p, k, 0.f)); }

// Write y[0, count) of 16-bit codes through write_row as count / 2 fp32 lanes (its streaming
// stores, heads and tails): one(e) gives element e alone, full(e) / part(e, k) the S16 of 2W /
// 2k elements from e. The fp32 lanes need y on a 4-byte boundary, so an odd start runs one
// element alone, as does an odd end. Vector variants only (W > 1).
template <class One, class Full, class Part>
inline void write_row16(uint16_t* y, int64_t count, bool nt, const One& one, const Full& full, const Part& part) {
    int64_t e0 = 0;
    if (count > 0 && ((uintptr_t)y & 2)) {
        y[0] = one(0);
        e0 = 1;
    }
    const int64_t pairs = (count - e0) / 2;
    write_row((float*)(void*)(y + e0), pairs, nt, [&](int64_t i) { return v_of(full(e0 + 2 * i)); },
              [&](int64_t i, int64_t k) { return v_of(part(e0 + 2 * i, k)); });
    if (e0 + 2 * pairs < count) y[count - 1] = one(count - 1);
}

// Write y[0, n) from a vector generator. `full(i)` computes lanes [i, i+W) from full
// loads; `part(i, k)` computes them from partial loads (only k lanes valid). With nt
// (large outputs) the body uses non-temporal stores: they skip the read-for-ownership of
// the destination, which is what lets a read+write kernel reach memcpy speed; that needs
// W*sizeof(T)-aligned addresses, so a partial head runs until y is aligned. pf: the next
// row's prefetch (above; Prefetch2 for two rows, StepWith for a prefetch plus other work),
// stepped once per two vectors and returned.
// flatten: `full` is the loop body and must be inlined into it; GCC's inliner left some out of
// line (tex_train.cpp's dact_k for bf16/fp16 and fp32 silu: one call per vector, bf16 dgelu
// 3.19 instructions per element against 1.97 at fp32).
template <class T, class Full, class Part, class PF = Prefetch>
__attribute__((flatten)) inline PF write_row(T* y, int64_t n, bool nt, const Full& full, const Part& part,
                                             PF pf = PF()) {
    int64_t i = 0;
    // A partial head until y is on a vector boundary: streaming stores need it; cached ones
    // (rows of >= 8 vectors) split no line then, where a 32-byte store 16 bytes past a line
    // (np.empty's, malloc's placement) splits every other one.
    const uintptr_t A = (uintptr_t)W * sizeof(T), mis = (uintptr_t)y % A;
    if (W > 1 && mis && (nt || (n >= 8 * W && mis % sizeof(T) == 0))) {
        i = (int64_t)((A - mis) / sizeof(T));
        if (i > n) i = n;
        vstore_part(y, part(0, i), i);
    }
    if (nt && W > 1) {
        const int64_t head = i;
        // The partial vector at the end is a cached store into a line the next row's head
        // shares, so its read for ownership goes to memory; prefetchw now, and the line
        // arrives while the body streams. fp32 softmax into np.empty's out= (16 bytes off a
        // line) 1.15x faster (ab_builds --copies 3), the norms unchanged. Our reading, not
        // measured: stores commit in order, so the stores behind that one wait for it, and
        // only softmax stores right away (its next exp pass fills the scratch row); the
        // norms' next pass only reads.
        // Streaming stores end where the tail's 64-byte line begins: the whole vectors in that
        // line are cached stores too. A vector narrower than a line (16-bit on AVX-512, every
        // type on AVX2) left the line half streamed, then cached-stored by the tail and the
        // next row's head; in that order the line's store waited for the partial streaming
        // write: bf16 layer_norm_bwd (4096 x 1024) with dx 48 bytes past a line 1.05-1.32 ms
        // against 0.58-0.79 at the other three 16-byte offsets (16: cached stores first, then
        // streamed: fast), whatever the inputs' offsets (CONTRIBUTING "Streamed, then cached").
        int64_t stop = n;
        if ((n - head) % W) {
            __builtin_prefetch(y + n - 1, 1, 3);
            const int64_t line = (int64_t)((((uintptr_t)(y + n)) & ~(uintptr_t)63) - (uintptr_t)y) / (int64_t)sizeof(T);
            stop = line > i ? line : i;
        }
        // Two independent vectors per iteration: the exp/erf chains are ~30 dependent
        // ops deep, and the out-of-order window alone overlaps too few iterations.
        for (; i + 2 * W <= stop; i += 2 * W) {
            pf();
            const auto a = full(i), b = full(i + W);  // a V, or an H (simd.h: bits already rounded)
            vstream(y + i, a);
            vstream(y + i + W, b);
        }
        for (; i + W <= stop; i += W) vstream(y + i, full(i));
        for (; i + W <= n; i += W) vstore(y + i, full(i));
    } else {
        for (; i + 2 * W <= n; i += 2 * W) {
            pf();
            const auto a = full(i), b = full(i + W);
            vstore(y + i, a);
            vstore(y + i + W, b);
        }
        for (; i + W <= n; i += W) vstore(y + i, full(i));
    }
    if (i < n) vstore_part(y + i, part(i, n - i), n - i);
    pf.rest();
    return pf;  // its state: what a StepWith carried (the next row's sum)
}

// Vectors of T per 64-byte line (1 where a vector is a line or more): the two-output writers
// that stream a line of each output in turn on AVX2 (backward.cpp gated_bwd_k, rope.cpp
// rope_half_row) compute this many vectors of each before storing.
template <class T>
constexpr int line_vectors() { return 64 / (W * (int)sizeof(T)) > 0 ? 64 / (W * (int)sizeof(T)) : 1; }

// The Prefetch for the row after the one at x (n elements of T), spread over a write of n
// elements; none when there is no next row.
template <class T>
inline Prefetch next_row(const T* x, int64_t n, bool has_next, int64_t write_n) {
    return has_next ? Prefetch(x + n, n * (int64_t)sizeof(T), write_n / (2 * W)) : Prefetch();
}

// Streaming stores for outputs written in short pieces. write_row aligns each call's
// destination with a partial head; when the output rows are short (rope on 128-wide heads:
// two 256-byte halves per row) or not 64-byte aligned (an out= from np.empty is 16 bytes
// off), every row then leaves partly written lines: each is read from memory for ownership
// and written back, a quarter of rope's lines on (32, 8192, 128) with a misaligned out=
// (4x the time of the aligned case). StagedOut instead collects consecutive rows in an L1
// buffer (normal stores) and writes them out as one contiguous stream: a partial line only
// at the two ends of a kernel call, every other line whole with streaming stores.
// Usage: T* r = so.row(n); <write r[0, n)>; so.add(n); ...; so.finish(). `drain`: once that
// many bytes are staged, add() streams the complete lines out (rope drains every 512 bytes).
constexpr int64_t STAGE_BYTES = 16 << 10;
template <class T>
struct StagedOut {
    char* dst;           // the next byte of the output not written yet
    int64_t start = 0;   // where the staged bytes begin in buf (< 64)
    int64_t have = 0;    // bytes staged (they belong at dst)
    alignas(64) char buf[STAGE_BYTES + 64];
    int64_t drain = STAGE_BYTES;
    StagedOut() : dst(nullptr) {}
    explicit StagedOut(T* y, int64_t drain_ = STAGE_BYTES) : dst((char*)y), drain(drain_) {}
    void reset(T* y, int64_t drain_) {
        dst = (char*)y;
        start = have = 0;
        drain = drain_;
    }
    // Room for n elements (n * sizeof(T) <= STAGE_BYTES): where to write them.
    T* row(int64_t n) {
        if (have + n * (int64_t)sizeof(T) > STAGE_BYTES) flush(false);
        return (T*)(buf + start + have);
    }
    void add(int64_t n) {
        have += n * (int64_t)sizeof(T);
        if (have >= drain) flush(false);
    }
    void finish() {
        flush(true);
        stream_fence();
    }

  private:
    // The complete lines of dst stream out from buf + start; when dst is not 64-byte aligned
    // those loads cross lines of buf. The remainder (a line's first bytes) is kept at the
    // offset that puts the next row on a 64-byte boundary of buf: rows whose bytes are a
    // multiple of 64 (rope's) are then written into buf by whole aligned vectors, and the
    // line-crossing accesses are the flush's loads instead of every store of the rows.
    void flush(bool last) {
        int64_t i = 0;
        const char* src = buf + start;
#if TO_ISA >= 1
        constexpr int64_t A = TO_ISA == 2 ? 64 : 32;
        int64_t head = (int64_t)((A - (uintptr_t)dst % A) % A);
        if (head > have) head = have;
        if (head) std::memcpy(dst, src, (size_t)head);
        i = head;
        for (; i + A <= have; i += A) {
#if TO_ISA == 2
            _mm512_stream_si512((__m512i*)(dst + i), _mm512_loadu_si512((const void*)(src + i)));
#else
            _mm256_stream_si256((__m256i*)(dst + i), _mm256_loadu_si256((const __m256i*)(src + i)));
#endif
        }
        if (!last) {  // keep the unaligned remainder: the next rows complete its line
            const int64_t rem = have - i;
            const int64_t at = (64 - rem % 64) % 64;
            dst += i;
            std::memmove(buf + at, src + i, (size_t)rem);
            start = at;
            have = rem;
            return;
        }
#endif
        if (have > i) std::memcpy(dst + i, src + i, (size_t)(have - i));
        dst += have;
        start = have = 0;
    }
};

}  // namespace
}  // namespace TO_NS
}  // namespace to
