// bind_autograd.cpp: the autograd kernels of tensor_ops._cpp (backward.cpp; compiled once,
// baseline flags). tensor_ops/torch/_kernels.py calls them with NumPy views of torch tensors.
//
//   glu2(a, b, out, act)           out = act(a) * b               (a, b, out: same shape)
//   glu2_bwd(dy, a, b, da, db, act) da = dy*b*act'(a), db = dy*act(a)
//   glu_bwd(dy, x, dx, act)        the same on the halves of x (..., 2h): dx = [da | db]
//   gelu_erf_bwd(dy, x, out)       out = dy * gelu'(x) (exact GELU)
//
// act: "silu", "gelu" (exact, erf) or "gelu_tanh".
#include <pybind11/pybind11.h>

#include "alloc.h"
#include "binding.h"
#include "checks.h"
#include "runtime.h"

namespace to {
namespace {

int act_code(const std::string& a) {
    if (a == "silu") return GLU_SWIGLU;
    if (a == "gelu") return GLU_GEGLU_ERF;
    if (a == "gelu_tanh") return GLU_GEGLU_TANH;
    throw py::value_error("act='" + a + "' is not one of ['gelu', 'gelu_tanh', 'silu']");
}

void same_as(const Arr& a, const char* name, const Arr& ref, const char* ref_name) {
    if (!same_shape(a, ref))
        shape_error(std::string(name) + " has shape " + shape_str(a) + " but " + ref_name + " has " + shape_str(ref));
}

py::object glu2(const py::object& a_, const py::object& b_, const py::object& out_, const std::string& act,
                const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    const int g = act_code(act);
    Arr a = get(a_, "a", bf), b = get(b_, "b", bf, a.dt), o;
    same_as(b, "b", a, "a");
    int64_t rows, h;
    rows_n(a, "a", rows, h);
    py::object res = get_out(out_, a, o, bf);
    if (a.size == 0) return res;
    const int es = ELSIZE[a.dt];
    const int64_t bytes = a.size * es;
    auto k = g_k->glu2[a.dt][g];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(3 * bytes, rows), [&](int64_t r0, int64_t r1, int) {
        k(a.data + r0 * h * es, b.data + r0 * h * es, o.data + r0 * h * es, r1 - r0, h, h, h, h, nt);
    });
    return res;
}

py::tuple glu2_bwd(const py::object& dy_, const py::object& a_, const py::object& b_, const py::object& da_,
                   const py::object& db_, const std::string& act, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    const int g = act_code(act);
    Arr a = get(a_, "a", bf), b = get(b_, "b", bf, a.dt), dy = get(dy_, "dy", bf, a.dt), da, db;
    same_as(b, "b", a, "a");
    same_as(dy, "dy", a, "a");
    int64_t rows, h;
    rows_n(a, "a", rows, h);
    py::object rda = get_out(da_, a, da, bf, "da");
    py::object rdb = get_out(db_, a, db, bf, "db");
    if (a.size == 0) return py::make_tuple(rda, rdb);
    const int es = ELSIZE[a.dt];
    const int64_t bytes = a.size * es;
    auto k = g_k->glu2_bwd[a.dt][g];
    const bool nt = use_nt(2 * bytes);
    {
        py::gil_scoped_release nogil;
        parallel_units(rows, threads_for(5 * bytes, rows), [&](int64_t r0, int64_t r1, int) {
            const int64_t off = r0 * h * es;
            k(dy.data + off, a.data + off, b.data + off, da.data + off, db.data + off, r1 - r0, h, h, h, h, h, h, nt);
        });
    }
    return py::make_tuple(rda, rdb);
}

}  // namespace

// Also called by the autograd entries (fast_entry.cpp).
py::object glu_bwd(const py::object& dy_, const py::object& x_, const py::object& dx_, const std::string& act,
                   const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    const int g = act_code(act);
    Arr x = get(x_, "x", bf), dy = get(dy_, "dy", bf, x.dt), dx;
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    if (n % 2) shape_error("the last axis of x must be even (it holds [a, b] halves), got " + std::to_string(n));
    const int64_t h = n / 2;
    int64_t drows, dh;
    rows_n(dy, "dy", drows, dh);
    if (dh != h || drows != rows || dy.nd != x.nd)
        shape_error("dy must have x's shape with the last axis halved, got " + shape_str(dy) + " for x " +
                    shape_str(x));
    py::object res = get_out(dx_, x, dx, bf, "dx");
    if (x.size == 0) return res;
    const int es = ELSIZE[x.dt];
    const int64_t bytes = x.size * es;
    auto k = g_k->glu2_bwd[x.dt][g];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(bytes * 5 / 2, rows), [&](int64_t r0, int64_t r1, int) {
        const char* xr = x.data + r0 * n * es;
        char* dxr = dx.data + r0 * n * es;
        k(dy.data + r0 * h * es, xr, xr + h * es, dxr, dxr + h * es, r1 - r0, h, h, n, n, n, n, nt);
    });
    return res;
}

py::object gelu_erf_bwd(const py::object& dy_, const py::object& x_, const py::object& out_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), dy = get(dy_, "dy", bf, x.dt), o;
    same_as(dy, "dy", x, "x");
    py::object res = get_out(out_, x, o, bf);
    if (x.size == 0) return res;
    const int es = ELSIZE[x.dt];
    const int64_t bytes = x.size * es;
    auto k = g_k->gelu_erf_bwd[x.dt];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_flat(x.size, 3 * bytes, [&](int64_t b, int64_t e, int) {
        k(dy.data + b * es, x.data + b * es, o.data + b * es, e - b, nt);
    });
    return res;
}

void register_autograd(py::module_& m) {
    using namespace pybind11::literals;
    auto none = py::none();
    m.def("glu2", &glu2, "a"_a, "b"_a, "out"_a = none, py::kw_only(), "act"_a = "silu", "dtype"_a = none,
          "out = act(a) * b (a, b, out of one shape; act: 'silu', 'gelu' (erf) or 'gelu_tanh').");
    m.def("glu2_bwd", &glu2_bwd, "dy"_a, "a"_a, "b"_a, "da"_a = none, "db"_a = none, py::kw_only(), "act"_a = "silu",
          "dtype"_a = none, "(da, db) = (dy * b * act'(a), dy * act(a)).");
    m.def("glu_bwd", &glu_bwd, "dy"_a, "x"_a, "dx"_a = none, py::kw_only(), "act"_a = "silu", "dtype"_a = none,
          "dx of act(x[..., :h]) * x[..., h:]: [dy * b * act'(a) | dy * act(a)].");
    m.def("gelu_erf_bwd", &gelu_erf_bwd, "dy"_a, "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none,
          "out = dy * gelu'(x), exact (erf) GELU.");
}

}  // namespace to
