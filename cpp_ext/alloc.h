// alloc.h: fresh outputs (NumPy's allocator for small ones, a bounded cache of 2 MiB
// blocks for large ones; see alloc.cpp for why) and the checked `out=` arguments.
#pragma once

#include "checks.h"

namespace to {

// A new C-contiguous array of `descr` and `shape` (nd dims).
py::object new_array(PyObject* descr, int64_t elsize, int nd, const Py_intptr_t* shape);
// empty(shape, dtype): for callers that allocate their own outputs (the tex adapters).
py::object empty(const py::object& shape, const py::object& dtype);
// A new array like x (same dtype and shape; the last axis `last` when last >= 0).
py::object new_like(const Arr& x, int64_t last = -1);
// out: None -> a new array shaped like x (last axis = last); else checked (dtype of x,
// writable, that shape) and returned. `o` is set to the checked output either way.
py::object get_out(const py::object& out, const Arr& x, Arr& o, bool bf16, const char* name = "out",
                   int64_t last = -1);

int64_t empty_cache();  // frees every cached block; returns the bytes freed
py::dict cache_info();

}  // namespace to
