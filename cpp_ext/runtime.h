// runtime.h: process-wide state of tensor_ops._cpp: the chosen kernel table, the thread
// count, the size thresholds, fork safety, and the helpers that split work over OpenMP
// threads. No pybind11 here: runtime.cpp compiles in well under a second, and every
// binding file includes this header.
//
// Every environment variable the C++ code reads is read in runtime.cpp::init_runtime(), at
// import (the list is at the top of runtime.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels.h"

namespace to {

// ---- state (defined in runtime.cpp) -----------------------------------------------------
extern const KernelTable* g_k;  // the variant picked at import
extern std::string g_isa_note;  // why a lower variant was picked ("" when none was capped)
extern int g_threads;           // set_num_threads(); 1 in a child forked after OpenMP ran
extern bool g_forked_after_omp;
extern std::atomic<bool> g_omp_used;
// Below this many bytes touched (inputs + outputs) a call stays on one thread.
extern int64_t g_par_bytes;
// Outputs at least this large are written with non-temporal (streaming) stores.
extern int64_t g_nt_bytes;
// Whether the norms read fp16 weights (and a bf16 layer_norm its weight and bias packed) as
// 16-bit data instead of an fp32 copy: half the L1 footprint for one conversion per vector.
// It pays on Intel's AVX-512 cores and loses on Zen 4 (cpu_splits_512; bind_facade.cpp
// NormParams, norm.cpp with_w); build_info()["norm_weights_16bit"], _set_tuning(norm_w16=).
extern bool g_norm_w16;
// The fresh-output block cache (alloc.cpp): outputs >= g_cache_min bytes come from it and
// at most g_cache_cap bytes stay cached.
extern int64_t g_cache_min;
extern int64_t g_cache_cap;

// Picks the kernel table, reads the environment, installs the fork handler. Throws
// std::invalid_argument with the message to show for a bad environment variable (the
// module import then fails with it).
void init_runtime();

bool cpu_avx2();
bool cpu_avx512();
bool cpu_avx512bf16();
bool cpu_amd();         // AuthenticAMD
bool cpu_halves_256();  // Zen 1 / Zen+: 256-bit instructions as two 128-bit halves
bool cpu_splits_512();  // Zen 4: 512-bit instructions as two 256-bit halves
std::vector<const char*> compiled_variants();  // "scalar" first, then what was built
struct BuildFlags {
    const char *common, *scalar, *avx2, *avx512, *avx512bf16;
};
BuildFlags build_flags();  // the compiler flags of the build (build_info()["flags"])
// Sets the thread count and returns the one in force (1 in a child forked after OpenMP
// ran, whatever n is). n >= 1 is the caller's job.
int set_threads(int n);

// ---- parallel helpers -----------------------------------------------------------------
inline int threads_for(int64_t bytes, int64_t units) {
    if (bytes < g_par_bytes || g_threads <= 1) return 1;
    return (int)(units < g_threads ? units : g_threads);
}

inline bool use_nt(int64_t out_bytes) { return out_bytes >= g_nt_bytes; }

// One call of parallel_units as the thread pool sees it: fn(ctx, begin, end, thread).
struct ParTask {
    void (*fn)(const void* ctx, int64_t b, int64_t e, int t);
    const void* ctx;
    int64_t units;
};
// Runs task over `chunks` chunks of [0, units) on the calling thread (index 0) and up to
// nt - 1 pool threads (runtime.cpp). Chunks are claimed one at a time, and the caller waits
// only for chunks another thread has started: a pool thread that is not running (a shared
// machine whose other core is busy, torch's OpenMP threads spinning after an op) costs
// nothing, where an OpenMP region's closing barrier waited for it a scheduler time slice
// (measured, 2 cores under load, 4096x1024 fp32 layer_norm: 8-12 ms with 2 OpenMP threads
// against 1.6 ms on one).
void run_parallel(const ParTask& task, int nt, int64_t chunks);

// f(begin, end, thread_index) over [0, units). The range is cut into ~8 chunks per thread
// handed out dynamically (run_parallel). Chunk calls of one thread share its index (< nt),
// so per-thread scratch and partial sums stay valid.
template <class F>
void parallel_units(int64_t units, int nt, const F& f) {
    if (nt <= 1) {
        f((int64_t)0, units, 0);
        return;
    }
    const int64_t chunks = units < (int64_t)nt * 8 ? units : (int64_t)nt * 8;
    const ParTask task{[](const void* c, int64_t b, int64_t e, int t) { (*(const F*)c)(b, e, t); }, &f, units};
    run_parallel(task, nt, chunks);
}

// Flat elementwise ranges are split on 1024-element boundaries: chunk starts stay
// cache-line (and streaming-store) aligned relative to the array start.
template <class F>
void parallel_flat(int64_t count, int64_t bytes, const F& f) {
    const int64_t blocks = (count + 1023) / 1024;
    parallel_units(blocks, threads_for(bytes, blocks), [&](int64_t b, int64_t e, int t) {
        const int64_t lo = b * 1024, hi = e * 1024 < count ? e * 1024 : count;
        f(lo, hi, t);
    });
}

// Per-call fp32 scratch (softmax's exp row, the column partials of dbias and the norms'
// backward, colsum's block): 64-byte aligned, half a page from `like` (the rows the kernel
// streams) within a 4 KiB page. new float[] gave 16-byte alignment, so whether every vector
// access of the scratch split two lines depended on the heap (bf16 softmax, tex softmax,
// norm backward, dbias_dgelu: 1.08-1.29x aligned). Half a page: a load is first matched
// against older stores by the low 12 address bits, and stores to the partials just past the
// inputs' offset can stall the inputs' next loads (4 KiB aliasing); at x's own offset the fp32
// norm backward ran 0.88-0.96x, half a page away 1.05-1.10x with torch's placement.
// Figures: CONTRIBUTING.md, "Scratch".
//
// `beside` (elements of es bytes; nullptr: none): column partials read and written at the index
// of the output element being written (the bias gradient of the d-activations, the norm
// backward's dgamma / dbeta) start at float p where beside's element p starts within a 64-byte
// line (4 p = beside mod 64 for fp32), not on a line: write_row's body runs on the output's vector
// boundaries, so with an output 16 bytes past a line (np.empty's) every other 32-byte access
// of line-aligned partials split two lines: fp32 dbias_dgelu / dsilu / drelu 1.18-1.28x,
// rms_norm_bwd / layer_norm_bwd 1.11-1.19x with the shift (8192 x 4096, two threads, Zen 3;
// CONTRIBUTING "Partials on the output's phase"). The partials' slots must then be a multiple of
// 16 floats apart (pad_slot). Not softmax's exp row: its exp pass writes it from index 0, which
// is line-aligned the other way (0.91-0.93x shifted).
inline size_t pad_slot(int64_t n) { return (size_t)(n + 15) / 16 * 16; }
class Scratch {
    std::unique_ptr<char[]> raw_;
    float* p_;

public:
    Scratch(size_t floats, const void* like, bool zero = false, const void* beside = nullptr, int es = 4)
        : raw_(new char[floats * sizeof(float) + 4096]) {
        const uintptr_t phase = beside ? 4 * ((uintptr_t)beside / (uintptr_t)es % 16) : 0;
        const uintptr_t base = (uintptr_t)raw_.get(), want = (((uintptr_t)like + 2048) % 4096 & ~(uintptr_t)63) + phase;
        p_ = (float*)(base + (want - base % 4096 + 4096) % 4096);
        if (zero) std::memset(p_, 0, floats * sizeof(float));
    }
    float* get() const { return p_; }
    float& operator[](size_t i) const { return p_[i]; }
};

// Column reductions over rows (norm backward's dgamma/dbeta, the dbias of the d-activations)
// whose result must not depend on the threads: per-thread partials, with chunks claimed
// dynamically (run_parallel), summed rows in a different order every call - run-to-run
// different dgamma in the last bits. Instead the rows are cut into row_groups(rows) fixed
// groups, which depend on the row count alone; f(r0, r1, g, t) accumulates group g's rows, in
// order, into the caller's slot g (t: the thread, for scratch), and the caller adds the slots
// in group order.
inline int64_t row_groups(int64_t rows) {
    const int64_t g = rows / 16;  // groups of >= 16 rows, at most 32 slots to add
    return g < 1 ? 1 : (g > 32 ? 32 : g);
}
template <class F>
void parallel_row_groups(int64_t rows, int nt, const F& f) {
    const int64_t groups = row_groups(rows), per = (rows + groups - 1) / groups;
    parallel_units(groups, nt, [&](int64_t b, int64_t e, int t) {
        for (int64_t g = b; g < e; ++g) {
            const int64_t r0 = g * per, r1 = r0 + per < rows ? r0 + per : rows;
            if (r0 < r1) f(r0, r1, g, t);
        }
    });
}

}  // namespace to
