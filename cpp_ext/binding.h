// binding.h: what the binding files of tensor_ops._cpp declare for each other.
//
//   module.cpp        PYBIND11_MODULE: init_runtime(), then the register_* below, in order
//   bind_facade.cpp   the facade ops (rms_norm, layer_norm, softmax, silu, relu, gelu,
//                     swiglu, geglu, rope; _exp/_tanh test hooks)
//   bind_tex.cpp      the tex kernels (rms_norm_bwd, layer_norm_bwd, adam_step, scale,
//                     l2norm_sq)
//   bind_tex_train.cpp the tex training kernels (d-activations, TE's softmax fwd/bwd, fused
//                     RoPE over tokens, sgd_step)
//   bind_autograd.cpp the autograd kernels of tensor_ops.torch (glu2, glu2_bwd, glu_bwd,
//                     gelu_erf_bwd; backward.cpp)
//   bind_runtime.cpp  threads, tuning hooks, build_info, the output cache, stream_copy
//   fast_entry.cpp    the facade's plain-call METH_FASTCALL entries (_fast_*), and autograd's
//                     (the norms with statistics, the backward of the torch ops)
//   torch_entry.cpp   those entries on torch CPU tensors (_set_torch)
//   checks.cpp/.h     array checks at the boundary; alloc.cpp/.h fresh outputs;
//   runtime.cpp/.h    ISA choice, threads, fork safety, environment (no pybind11)
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace to {

namespace py = pybind11;

// The facade ops (bind_facade.cpp), also called by the fast entries. unary: op is a Unary
// (kernels.h), glu: g is a Glu.
py::object rms_norm(const py::object& x, const py::object& w, float eps, const py::object& out,
                    const py::object& rsigma, bool zc, const py::object& dtype);
py::object layer_norm(const py::object& x, const py::object& w, const py::object& b, float eps,
                      const py::object& out, const py::object& mu, const py::object& rsigma, bool zc,
                      const py::object& dtype);
py::object softmax(const py::object& x, const py::object& out, const py::object& dtype);
py::object unary(int op, const py::object& x, const py::object& out, const py::object& dtype);
py::object glu(int g, const py::object& x, const py::object& out, const py::object& dtype);
py::object rope(const py::object& x, const py::object& cos, const py::object& sin, bool interleaved,
                const py::object& out, const py::object& dtype);
// the fused residual add + norm (layer: add_layer_norm, else add_rms_norm): (normed, x + residual)
py::tuple add_norm(bool layer, const py::object& x, const py::object& r, const py::object& w, const py::object& b,
                   float eps, const py::object& out, const py::object& ro, const py::object& dtype);

// the norms' backward (bind_tex.cpp; layer: layer_norm's, with mu and dbeta): (dx, dgamma[, dbeta])
py::tuple norm_bwd(bool layer, const py::object& dz, const py::object& x, const py::object& mu,
                   const py::object& rsigma, const py::object& g, const py::object& dx, const py::object& dg,
                   const py::object& db, bool zc, const py::object& dtype);

// the autograd backward kernels the entries call (bind_tex_train.cpp, bind_autograd.cpp)
void dact(const py::object& g, const py::object& x, const py::object& out, int kind, const py::object& dbias,
          const py::object& dtype);
void tex_softmax_bwd(const py::object& dy, const py::object& y, const py::object& out, float scale,
                     const py::object& dtype);
py::object glu_bwd(const py::object& dy, const py::object& x, const py::object& dx, const std::string& act,
                   const py::object& dtype);
py::object gelu_erf_bwd(const py::object& dy, const py::object& x, const py::object& out, const py::object& dtype);

void register_facade(py::module_& m);
void register_tex(py::module_& m);
void register_tex_train(py::module_& m);
void register_autograd(py::module_& m);
void register_runtime(py::module_& m);
void register_fast(py::module_& m);
void register_torch(py::module_& m);

// torch_entry.cpp: torch CPU tensors on the plain-call entries (no libtorch linked).
using FastEntry = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t);
extern PyTypeObject* g_torch_tensor;  // torch.Tensor once _set_torch ran, else nullptr
// The entry f on NumPy views of the tensor arguments, its result as a tensor; None to decline.
PyObject* torch_fast(FastEntry f, PyObject* self, PyObject* const* a, Py_ssize_t na);

}  // namespace to
