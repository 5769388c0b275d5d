// runtime.cpp: ISA choice, threads, fork safety, size thresholds (compiled once, baseline
// flags, no pybind11).
//
// Environment variables read by the C++ code -- all of them, here, once, at import
// (init_runtime); a bad value makes the import fail with the message given below:
//   TENSOR_OPS_MAX_ISA=scalar|avx2|avx512  cap the kernel variant (case-insensitive)
//   TENSOR_OPS_CPP_CACHE_MB=<n>            cap of the fresh-output block cache in MiB (0: off)
//   OMP_NUM_THREADS                        read by libgomp; the default of set_num_threads()
#include "runtime.h"

#include <cctype>
#include <cstdlib>
#include <stdexcept>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#define TO_HAVE_ATFORK 1
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define TO_X86 1
#include <cpuid.h>
#endif

namespace to {

const KernelTable* g_k = nullptr;
std::string g_isa_note;
int g_threads = 1;

// Measured on the 2-core EPYC dev box with `python benchmarks/bench_cpp.py --threshold`
// (rms_norm + silu, 1 vs 2 threads): 64 KiB 4.3 vs 6.4 us, 96 KiB 6.5 vs 7.6 us, 128 KiB
// 8.1 vs 5.9 us, 256 KiB 16.3 vs 10.0 us. Waking and joining the second OpenMP thread costs
// a few us, so the split only pays once a call does more than ~8 us of work. Tunable:
// _set_tuning().
int64_t g_par_bytes = 128 * 1024;
// Non-temporal stores skip the read-for-ownership of the destination (1/3 of the memory
// traffic of a read+write kernel) but leave the result out of cache, which only pays when
// the output would not have stayed in the last-level cache anyway. 8 MiB: a quarter of the
// dev box's 32 MiB L3 (sysconf's L3 size is unreliable in VMs: it reports 320 MiB there).
int64_t g_nt_bytes = 8 << 20;
// Default cap: 1 GiB or 1/16 of physical memory, whichever is less (init_runtime).
int64_t g_cache_min = 1 << 20;
int64_t g_cache_cap = int64_t(1) << 30;

// ---------------------------------------------------------------------------- ISA
bool cpu_avx2() {
#ifdef TO_X86
    __builtin_cpu_init();
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return false;
#endif
}

bool cpu_avx512() {
#ifdef TO_X86
    __builtin_cpu_init();
    return cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

std::vector<const char*> compiled_variants() {
    std::vector<const char*> v{"scalar"};
#ifdef TO_HAVE_AVX2
    v.push_back("avx2");
#endif
#ifdef TO_HAVE_AVX512
    v.push_back("avx512");
#endif
    return v;
}

namespace {

int isa_rank(const std::string& s) { return s == "scalar" ? 0 : s == "avx2" ? 1 : s == "avx512" ? 2 : -1; }

void select_isa() {
    int cap = 2;
    const char* env = std::getenv("TENSOR_OPS_MAX_ISA");
    if (env && *env) {
        std::string s(env);
        for (auto& ch : s) ch = (char)std::tolower((unsigned char)ch);
        cap = isa_rank(s);
        if (cap < 0)
            throw std::invalid_argument("TENSOR_OPS_MAX_ISA=" + std::string(env) +
                                        " is not one of ['avx2', 'avx512', 'scalar']; unset it or pick one");
        g_isa_note = std::string("capped by TENSOR_OPS_MAX_ISA=") + env;
    }
    g_k = table_scalar();
#ifdef TO_HAVE_AVX2
    if (cap >= 1 && cpu_avx2()) g_k = table_avx2();
#endif
#ifdef TO_HAVE_AVX512
    if (cap >= 2 && cpu_avx512()) g_k = table_avx512();
#endif
}

void read_cache_cap() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psize > 0 && (int64_t)pages * psize / 16 < g_cache_cap) g_cache_cap = (int64_t)pages * psize / 16;
#endif
    if (const char* mb = std::getenv("TENSOR_OPS_CPP_CACHE_MB")) {
        char* end = nullptr;
        const long long v = std::strtoll(mb, &end, 10);
        if (!*mb || *end || v < 0)
            throw std::invalid_argument("TENSOR_OPS_CPP_CACHE_MB=" + std::string(mb) +
                                        " is not a whole number of MiB >= 0 (0 disables the output block cache)");
        g_cache_cap = (int64_t)v << 20;
    }
}

}  // namespace

// ---------------------------------------------------------------------------- threads
// libgomp cannot run a parallel region in a child forked after the parent ran one: the
// child waits for the parent's pool threads, which fork did not copy (measured: a hang on
// the child's first multi-threaded call, e.g. in multiprocessing's fork workers). So a
// child forked after OpenMP was used runs every kernel on its calling thread, for good.
std::atomic<bool> g_omp_used{false};
bool g_forked_after_omp = false;

namespace {
#ifdef TO_HAVE_ATFORK
void at_fork_child() {
    if (g_omp_used.load(std::memory_order_relaxed)) {
        g_forked_after_omp = true;
        g_threads = 1;
    }
}
#endif
}  // namespace

int set_threads(int n) {
    g_threads = g_forked_after_omp ? 1 : n;
    return g_threads;
}

void init_runtime() {
    select_isa();
#ifdef TO_HAVE_ATFORK
    pthread_atfork(nullptr, nullptr, at_fork_child);
#endif
    read_cache_cap();
#if defined(_OPENMP)
    g_threads = omp_get_max_threads();  // honours OMP_NUM_THREADS
#endif
}

}  // namespace to
