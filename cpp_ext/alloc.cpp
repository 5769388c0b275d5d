// alloc.cpp: the fresh-output block cache and the output arguments (compiled once,
// baseline flags).
//
// Fresh outputs of at least g_cache_min bytes come from a bounded cache of blocks instead of
// malloc. Why: glibc serves such sizes with mmap and unmaps them on free, so every fresh
// 128 MiB result page-faults 32768 zeroed 4 KiB pages (~14 ms on the dev box, longer than
// the kernel that fills it). A block freed by NumPy (the array's base is a capsule) goes
// back to the cache and the next result of that size reuses it, already mapped; blocks are
// 2 MiB-aligned and advised MADV_HUGEPAGE, so even the first touch faults 512x less often.
// Sizes are rounded up to 2 MiB. At most g_cache_cap bytes stay cached (free beyond that):
// by default 1 GiB or 1/16 of physical memory, whichever is less (a laptop keeps most of
// its memory); TENSOR_OPS_CPP_CACHE_MB sets it (read in runtime.cpp; 0 disables the
// cache), empty_cache() frees every cached block.
#include "alloc.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "runtime.h"

namespace to {
namespace {

constexpr size_t BLOCK_ALIGN = 2u << 20;

struct BlockCache {
    std::mutex mu;
    std::multimap<size_t, void*> free_blocks;  // rounded size -> block
    int64_t cached = 0, hits = 0, misses = 0;
};
BlockCache& block_cache() {
    static BlockCache* c = new BlockCache();  // never destroyed: capsules may outlive exit handlers
    return *c;
}

size_t round_block(size_t bytes) { return (bytes + BLOCK_ALIGN - 1) / BLOCK_ALIGN * BLOCK_ALIGN; }

void* block_get(size_t size) {
    BlockCache& c = block_cache();
    {
        std::lock_guard<std::mutex> g(c.mu);
        auto it = c.free_blocks.find(size);
        if (it != c.free_blocks.end()) {
            void* p = it->second;
            c.free_blocks.erase(it);
            c.cached -= (int64_t)size;
            ++c.hits;
            return p;
        }
        ++c.misses;
    }
    void* p = std::aligned_alloc(BLOCK_ALIGN, size);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) madvise(p, size, MADV_HUGEPAGE);  // a hint: ignored where THP is off
#endif
    return p;
}

void block_put(void* p, size_t size) {
    BlockCache& c = block_cache();
    {
        std::lock_guard<std::mutex> g(c.mu);
        if (c.cached + (int64_t)size <= g_cache_cap) {
            c.free_blocks.emplace(size, p);
            c.cached += (int64_t)size;
            return;
        }
    }
    std::free(p);
}

struct BlockRef { void* p; size_t size; };

void block_capsule_free(PyObject* cap) {
    auto* r = (BlockRef*)PyCapsule_GetPointer(cap, "tensor_ops._cpp.block");
    if (!r) { PyErr_Clear(); return; }
    block_put(r->p, r->size);
    delete r;
}

}  // namespace

int64_t empty_cache() {
    BlockCache& c = block_cache();
    std::multimap<size_t, void*> drop;
    int64_t freed;
    {
        std::lock_guard<std::mutex> g(c.mu);
        drop.swap(c.free_blocks);
        freed = c.cached;
        c.cached = 0;
    }
    for (auto& kv : drop) std::free(kv.second);
    return freed;
}

py::dict cache_info() {
    BlockCache& c = block_cache();
    std::lock_guard<std::mutex> g(c.mu);
    py::dict d;
    d["cap_bytes"] = g_cache_cap;
    d["min_bytes"] = g_cache_min;
    d["cached_bytes"] = c.cached;
    d["cached_blocks"] = (int64_t)c.free_blocks.size();
    d["hits"] = c.hits;
    d["misses"] = c.misses;
    return d;
}

// From the block cache when large enough, else NumPy's allocator. Built with NumPy's C API
// directly: py::array's constructor costs a few hundred ns more, which a (1, 4096) call
// notices.
py::object new_array(PyObject* descr, int64_t elsize, int nd, const Py_intptr_t* shape) {
    auto& api = py::detail::npy_api::get();
    int64_t size = 1;
    for (int i = 0; i < nd; ++i) size *= shape[i];
    const int64_t bytes = size * elsize;
    Py_INCREF(descr);  // NewFromDescr steals it
    if (bytes < g_cache_min || g_cache_cap <= 0) {
        PyObject* a = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, nd, shape, nullptr, nullptr, 0, nullptr);
        if (!a) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(a);
    }
    const size_t rounded = round_block((size_t)bytes);
    void* p = block_get(rounded);
    if (!p) {
        Py_DECREF(descr);
        throw std::bad_alloc();
    }
    PyObject* cap = PyCapsule_New(new BlockRef{p, rounded}, "tensor_ops._cpp.block", block_capsule_free);
    if (!cap) {
        block_put(p, rounded);
        Py_DECREF(descr);
        throw py::error_already_set();
    }
    PyObject* a = api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, nd, shape, nullptr, p,
                                            py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ |
                                                py::detail::npy_api::NPY_ARRAY_ALIGNED_ |
                                                py::detail::npy_api::NPY_ARRAY_WRITEABLE_,
                                            nullptr);
    if (!a) {
        Py_DECREF(cap);  // returns the block
        throw py::error_already_set();
    }
    if (api.PyArray_SetBaseObject_(a, cap) < 0) {  // steals cap, even on failure
        Py_DECREF(a);
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(a);
}

// A new C-contiguous array from the block cache (large) or NumPy (small).
py::object empty(const py::object& shape_, const py::object& dtype_) {
    const py::dtype dt = py::dtype::from_args(dtype_);
    std::vector<Py_intptr_t> shape;
    if (py::isinstance<py::int_>(shape_)) shape.push_back(shape_.cast<Py_intptr_t>());
    else
        for (auto h : shape_) shape.push_back(h.cast<Py_intptr_t>());
    if (shape.size() > 32) throw py::value_error("empty: more than 32 dimensions");
    for (auto d : shape)
        if (d < 0) throw py::value_error("empty: negative dimension " + std::to_string(d));
    return new_array(dt.ptr(), (int64_t)dt.itemsize(), (int)shape.size(), shape.data());
}

py::object new_like(const Arr& x, int64_t last) {
    Py_intptr_t shape[32];
    if (x.nd > 32) throw py::value_error("x has more than 32 dimensions");
    for (int i = 0; i < x.nd; ++i) shape[i] = x.shape[i];
    if (last >= 0) shape[x.nd - 1] = last;
    return new_array(proxy(x.obj)->descr, ELSIZE[x.dt], x.nd, shape);
}

py::object get_out(const py::object& out, const Arr& x, Arr& o, bool bf16, const char* name, int64_t last) {
    if (out.is_none()) {
        py::object a = new_like(x, last);
        o = get(a, name, bf16, x.dt, true);
        return a;
    }
    o = get(out, name, bf16, x.dt, true);
    bool ok = o.nd == x.nd;
    for (int i = 0; ok && i < x.nd; ++i) ok = o.shape[i] == (i + 1 == x.nd && last >= 0 ? last : x.shape[i]);
    if (!ok) {
        std::string want = "(";
        for (int i = 0; i < x.nd; ++i)
            want += std::to_string(i + 1 == x.nd && last >= 0 ? last : x.shape[i]) + (x.nd == 1 || i + 1 < x.nd ? "," : "");
        shape_error(std::string(name) + " has shape " + shape_str(o) + ", expected " + want + ")");
    }
    return out;
}

}  // namespace to
