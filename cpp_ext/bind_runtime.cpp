// bind_runtime.cpp: the runtime side of tensor_ops._cpp (compiled once, baseline flags):
// threads, the tuning hooks, build_info(), the fresh-output cache, and stream_copy (the
// benchmark engine's memory ceiling).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "alloc.h"
#include "binding.h"
#include "checks.h"
#include "runtime.h"

namespace to {
namespace {

// Returns the thread count in force (1 in a child forked after OpenMP ran, whatever n is).
int set_num_threads(int n) {
    if (n < 1) throw py::value_error("set_num_threads(" + std::to_string(n) + "): need n >= 1");
    return set_threads(n);
}

py::dict build_info() {
    py::dict d;
    d["selected_isa"] = g_k->isa;
    d["vector_width_fp32"] = g_k->width;
    py::list variants;
    for (const char* v : compiled_variants()) variants.append(v);
    d["compiled_variants"] = variants;
    py::dict cpu;
    cpu["avx2_fma_f16c"] = cpu_avx2();
    cpu["avx512_f_bw_dq_vl"] = cpu_avx512();
    cpu["avx512_bf16"] = cpu_avx512bf16();
    cpu["splits_512"] = cpu_splits_512();
    cpu["halves_256"] = cpu_halves_256();
    cpu["vendor_amd"] = cpu_amd();
    d["cpu_supports"] = cpu;
    d["isa_note"] = g_isa_note;
#if defined(_OPENMP)
    d["openmp"] = true;
    d["openmp_version"] = (int)_OPENMP;
    d["omp_max_threads"] = omp_get_max_threads();
#else
    d["openmp"] = false;
    d["openmp_version"] = 0;
    d["omp_max_threads"] = 1;
#endif
    d["num_threads"] = g_threads;
    d["threads_note"] = g_forked_after_omp ? "1 thread: this process was forked after its parent ran OpenMP "
                                             "kernels, and libgomp cannot run parallel regions in such a child"
                                           : "";
    d["parallel_threshold_bytes"] = g_par_bytes;
    d["nontemporal_threshold_bytes"] = g_nt_bytes;
    d["softmax_exp_twice"] = g_softmax_exp_twice;
    d["norm_weights_16bit"] = g_norm_w16;
    d["fp16_tables_all"] = g_f16_lut;
    d["rope_group"] = g_rope_group;
    d["rope_block_bytes"] = g_rope_block;
    d["output_cache"] = cache_info();
#if defined(__clang__)
    d["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    d["compiler"] = std::string("gcc ") + __VERSION__;
#else
    d["compiler"] = "unknown";
#endif
    const BuildFlags bf = build_flags();
    py::dict fl;
    fl["common"] = bf.common;
    fl["scalar"] = bf.scalar;
    fl["avx2"] = bf.avx2;
    fl["avx512"] = bf.avx512;
    fl["avx512bf16"] = bf.avx512bf16;
    d["flags"] = fl;
    return d;
}

// One side of stream_copy: a C-contiguous ndarray of any dtype without object references
// (copying their bytes would skip the reference counts); returns its data and nbytes.
char* raw_bytes(const py::object& a, const char* name, bool writable, int64_t& nbytes) {
    if (!py::isinstance<py::array>(a))
        throw py::type_error(std::string(name) + " must be a numpy.ndarray, got " + std::string(Py_TYPE(a.ptr())->tp_name));
    const auto arr = py::reinterpret_borrow<py::array>(a);
    if (arr.dtype().flags() & 0x01)  // NPY_ITEM_REFCOUNT: holds Python objects
        throw py::type_error(std::string(name) + " has dtype " + py::str(arr.dtype()).cast<std::string>() +
                             "; stream_copy copies raw bytes, so it takes only dtypes without Python objects");
    auto* p = proxy(a.ptr());
    if (!(p->flags & F_C))
        throw py::value_error(std::string(name) + " must be C-contiguous; pass np.ascontiguousarray(" + name + ")");
    if (writable && !(p->flags & F_WRITEABLE))
        throw py::value_error(std::string(name) + " is read-only; pass a writable array");
    nbytes = (int64_t)arr.nbytes();
    return p->data;
}

// dst[:] = src[:] byte for byte, with non-temporal stores (the variant's stream_copy
// kernel), split over the set_num_threads() threads above the usual threshold. The pieces
// are blocks of `pages` of dst's 4 KiB pages (the first and last may be partial), so only
// the first and last piece have an unaligned head or tail; pages > 1 copies each block a
// piece of every page in turn (common.cpp says why).
void stream_copy(const py::object& src_, const py::object& dst_, int pages) {
    if (pages < 1 || pages > 16)
        throw py::value_error("pages must be an int in [1, 16] (consecutive 4 KiB pages copied together), got " +
                              std::to_string(pages));
    int64_t ns, nd;
    const char* src = raw_bytes(src_, "src", false, ns);
    char* dst = raw_bytes(dst_, "dst", true, nd);
    if (ns != nd)
        shape_error("src has " + std::to_string(ns) + " bytes but dst has " + std::to_string(nd) +
                    " bytes; stream_copy needs the same nbytes");
    const int64_t n = ns;
    if (n == 0 || src == dst) return;
    if (src < dst + n && dst < src + n) shape_error("src and dst overlap; stream_copy needs separate buffers");
    const int64_t BLOCK = 4096 * (int64_t)pages;
    int64_t first = (int64_t)((4096 - (uintptr_t)dst % 4096) % 4096);  // bytes before dst's first page boundary
    if (first > n) first = n;
    const int64_t units = (first ? 1 : 0) + (n - first + BLOCK - 1) / BLOCK;
    auto at = [&](int64_t u) -> int64_t {  // start of piece u
        const int64_t p = first ? (u == 0 ? 0 : first + (u - 1) * BLOCK) : u * BLOCK;
        return p < n ? p : n;
    };
    auto k = g_k->stream_copy;
    py::gil_scoped_release nogil;
    parallel_units(units, threads_for(2 * n, units), [&](int64_t b, int64_t e, int) {
        const int64_t lo = at(b), hi = at(e);
        k(src + lo, dst + lo, hi - lo, pages);
    });
}

}  // namespace

void register_runtime(py::module_& m) {
    using namespace pybind11::literals;
    m.def("set_num_threads", &set_num_threads, "n"_a);
    m.def("get_num_threads", []() { return g_threads; });
    m.def("build_info", &build_info);
    m.def(
        "_set_tuning",
        [](int64_t par_bytes, int64_t nt_bytes, int softmax_exp_twice, int norm_w16, int64_t rg, int64_t rb, int f16_lut) {
            if (f16_lut >= 0) g_f16_lut = f16_lut != 0;
            if (rg > 0) g_rope_group = rg;
            if (rb > 0) g_rope_block = rb;
            if (par_bytes >= 0) g_par_bytes = par_bytes;
            if (nt_bytes >= 0) g_nt_bytes = nt_bytes;
            if (softmax_exp_twice >= 0) g_softmax_exp_twice = softmax_exp_twice != 0;
            if (norm_w16 >= 0) g_norm_w16 = norm_w16 != 0;
        },
        "parallel_threshold_bytes"_a = -1, "nontemporal_threshold_bytes"_a = -1, "softmax_exp_twice"_a = -1,
        "norm_w16"_a = -1, "rope_group"_a = -1, "rope_block"_a = -1, "f16_lut"_a = -1);
    m.def("empty_cache", &empty_cache, "Free every cached output block; returns the bytes freed.");
    m.def("empty", &empty, "shape"_a, "dtype"_a);
    m.def("cache_info", &cache_info);
    m.def(
        "_set_cache",
        [](int64_t cap_bytes, int64_t min_bytes) {
            if (cap_bytes >= 0) g_cache_cap = cap_bytes;
            if (min_bytes >= 0) g_cache_min = min_bytes;
            if (cap_bytes >= 0) empty_cache();
        },
        "cap_bytes"_a = -1, "min_bytes"_a = -1);
    m.def("stream_copy", &stream_copy, "src"_a, "dst"_a, "pages"_a = 1,
          "dst[:] = src[:] byte for byte with non-temporal stores (C-contiguous arrays of equal nbytes); "
          "pages > 1 copies blocks of that many 4 KiB pages a piece of each in turn.");
}

}  // namespace to
