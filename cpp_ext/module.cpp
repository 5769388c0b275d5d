// module.cpp: the pybind11 module tensor_ops._cpp (compiled once, baseline flags).
//
// At import: init_runtime() picks one KernelTable, the best compiled variant the CPU
// supports (__builtin_cpu_supports checks the OS saves the wide registers too), capped by
// TENSOR_OPS_MAX_ISA=scalar|avx2|avx512, and reads the rest of the environment
// (runtime.cpp); then every binding file registers its functions. binding.h says which
// file holds what.
#include <pybind11/pybind11.h>

#include "binding.h"
#include "runtime.h"

namespace py = pybind11;

PYBIND11_MODULE(_cpp, m) {
    m.doc() = "tensor_ops C++ SIMD kernels (see tensor_ops/_cpp.pyi)";
    to::init_runtime();
    to::register_facade(m);
    to::register_tex(m);
    to::register_tex_train(m);
    to::register_autograd(m);
    to::register_runtime(m);
    to::register_fast(m);
    to::register_torch(m);
    m.attr("ISA") = to::g_k->isa;
}
