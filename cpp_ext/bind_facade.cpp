// bind_facade.cpp: the facade ops of tensor_ops._cpp (compiled once, baseline flags).
//
// Each op checks its arrays at the boundary (checks.h), takes or allocates its output
// (alloc.h), releases the GIL and runs the selected variant's kernel over rows (or flat
// chunks) split across OpenMP threads above a size threshold (runtime.h).
#include <pybind11/pybind11.h>

#include <memory>

#include "alloc.h"
#include "binding.h"
#include "checks.h"
#include "runtime.h"

namespace to {

py::object rms_norm(const py::object& x_, const py::object& w_, float eps, const py::object& out_,
                    const py::object& rsigma_, bool zc, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), w = get(w_, "weight", bf, x.dt), o;
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    check_vec(w, "weight", n);
    py::object res = get_out(out_, x, o, bf);
    float* rs = get_stats(rsigma_, "rsigma", rows);
    if (x.size == 0) return res;
    const int64_t bytes = x.size * ELSIZE[x.dt];
    auto k = g_k->rms_norm[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(2 * bytes, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, w.data, o.data + b * n * es, e - b, n, eps, rs ? rs + b : nullptr, zc, nt);
    });
    return res;
}

py::object layer_norm(const py::object& x_, const py::object& w_, const py::object& b_, float eps,
                      const py::object& out_, const py::object& mu_, const py::object& rsigma_, bool zc,
                      const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), w = get(w_, "weight", bf, x.dt), o;
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    check_vec(w, "weight", n);
    const char* bias = nullptr;
    if (!b_.is_none()) {
        Arr b = get(b_, "bias", bf, x.dt);
        check_vec(b, "bias", n);
        bias = b.data;
    }
    py::object res = get_out(out_, x, o, bf);
    float* mu = get_stats(mu_, "mu", rows);
    float* rs = get_stats(rsigma_, "rsigma", rows);
    if (x.size == 0) return res;
    const int64_t bytes = x.size * ELSIZE[x.dt];
    auto k = g_k->layer_norm[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(2 * bytes, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, w.data, bias, o.data + b * n * es, e - b, n, eps, mu ? mu + b : nullptr,
          rs ? rs + b : nullptr, zc, nt);
    });
    return res;
}

py::object softmax(const py::object& x_, const py::object& out_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), o;
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    py::object res = get_out(out_, x, o, bf);
    if (x.size == 0) return res;
    const int64_t bytes = x.size * ELSIZE[x.dt];
    const int nth = threads_for(2 * bytes, rows);
    std::unique_ptr<float[]> scratch(new float[(size_t)nth * (size_t)n]);
    auto k = g_k->softmax[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(bytes);
    float* sc = scratch.get();
    py::gil_scoped_release nogil;
    parallel_units(rows, nth, [&](int64_t b, int64_t e, int t) {
        k(x.data + b * n * es, o.data + b * n * es, e - b, n, sc + (size_t)t * n, nt);
    });
    return res;
}

py::object unary(int op, const py::object& x_, const py::object& out_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), o;
    py::object res = get_out(out_, x, o, bf);
    if (x.size == 0) return res;
    const int es = ELSIZE[x.dt];
    const int64_t bytes = x.size * es;
    auto k = g_k->unary[x.dt][op];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_flat(x.size, 2 * bytes, [&](int64_t b, int64_t e, int) { k(x.data + b * es, o.data + b * es, e - b, nt); });
    return res;
}

namespace {

int approx_code(const py::object& a) {
    if (py::isinstance<py::str>(a)) {
        PyObject* s = a.ptr();
        if (PyUnicode_CompareWithASCIIString(s, "none") == 0) return 0;
        if (PyUnicode_CompareWithASCIIString(s, "tanh") == 0) return 1;
    }
    throw py::value_error("approximate=" + py::repr(a).cast<std::string>() + " is not one of ['none', 'tanh']");
}

py::object gelu(const py::object& x_, const py::object& approximate, const py::object& out_, const py::object& dtype) {
    return unary(approx_code(approximate) ? UN_GELU_TANH : UN_GELU_ERF, x_, out_, dtype);
}

}  // namespace

py::object glu(int g, const py::object& x_, const py::object& out_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), o;
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    if (n % 2) shape_error("the last axis of x must be even (it holds [a, b] halves), got " + std::to_string(n));
    const int64_t h = n / 2;
    py::object res = get_out(out_, x, o, bf, "out", h);
    if (x.size == 0) return res;
    const int es = ELSIZE[x.dt];
    const int64_t bytes = x.size * es;
    auto k = g_k->glu[x.dt][g];
    const bool nt = use_nt(bytes / 2);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(bytes + bytes / 2, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, o.data + b * h * es, e - b, h, nt);
    });
    return res;
}

namespace {

py::object rope(const py::object& x_, const py::object& cos_, const py::object& sin_, bool interleaved,
                const py::object& out_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), c = get_f32(cos_, "cos"), s = get_f32(sin_, "sin"), o;
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    if (n % 2) shape_error("rope needs an even last axis, got " + std::to_string(n));
    if (c.nd != 2 || c.shape[1] != n || c.shape[0] < 1)
        shape_error("cos must have shape (T, " + std::to_string(n) + ") with T >= 1, got " + shape_str(c));
    if (!same_shape(c, s)) shape_error("sin has shape " + shape_str(s) + " but cos has " + shape_str(c));
    py::object res = get_out(out_, x, o, bf);
    if (x.size == 0) return res;
    const int es = ELSIZE[x.dt];
    const int64_t bytes = x.size * es;
    const int64_t T = c.shape[0];
    auto k = g_k->rope[x.dt];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    const int64_t B = rows / T;
    if (B > 1 && rows % T == 0 && 2 * T * n * (int64_t)sizeof(float) > (1 << 20)) {
        // The (T, n) cos/sin tables outgrow L2: walk positions outermost so each table row is
        // fetched from memory once and reused for all B sequences while it is in L1 (row-major
        // order streamed the tables B times: rope ran at ~0.7 of copy on 8 x 1024 x 4096 fp32).
        parallel_units(T, threads_for(2 * bytes, T), [&](int64_t t0, int64_t t1, int) {
            for (int64_t t = t0; t < t1; ++t)
                for (int64_t bb = 0; bb < B; ++bb) {
                    const int64_t r = bb * T + t;
                    k(x.data + r * n * es, (const float*)c.data, (const float*)s.data, o.data + r * n * es, 1, n, T,
                      r, interleaved, nt);
                }
        });
        return res;
    }
    parallel_units(rows, threads_for(2 * bytes, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, (const float*)c.data, (const float*)s.data, o.data + b * n * es, e - b, n, T, b,
          interleaved, nt);
    });
    return res;
}

}  // namespace

void register_facade(py::module_& m) {
    using namespace pybind11::literals;
    auto none = py::none();
    m.def("rms_norm", &rms_norm, "x"_a, "weight"_a, "eps"_a, "out"_a = none, py::kw_only(), "rsigma"_a = none,
          "zero_centered_gamma"_a = false, "dtype"_a = none);
    m.def("layer_norm", &layer_norm, "x"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a = none, py::kw_only(), "mu"_a = none,
          "rsigma"_a = none, "zero_centered_gamma"_a = false, "dtype"_a = none);
    m.def("softmax", &softmax, "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def(
        "silu", [](const py::object& x, const py::object& out, const py::object& dt) { return unary(UN_SILU, x, out, dt); },
        "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def(
        "relu", [](const py::object& x, const py::object& out, const py::object& dt) { return unary(UN_RELU, x, out, dt); },
        "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def(
        "_exp", [](const py::object& x, const py::object& out, const py::object& dt) { return unary(UN_EXP, x, out, dt); },
        "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def(
        "_tanh", [](const py::object& x, const py::object& out, const py::object& dt) { return unary(UN_TANH, x, out, dt); },
        "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def("gelu", &gelu, "x"_a, "approximate"_a = "none", "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def(
        "swiglu", [](const py::object& x, const py::object& out, const py::object& dt) { return glu(GLU_SWIGLU, x, out, dt); },
        "x"_a, "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def(
        "geglu",
        [](const py::object& x, const py::object& approximate, const py::object& out, const py::object& dt) {
            return glu(approx_code(approximate) ? GLU_GEGLU_TANH : GLU_GEGLU_ERF, x, out, dt);
        },
        "x"_a, "approximate"_a = "none", "out"_a = none, py::kw_only(), "dtype"_a = none);
    m.def("rope", &rope, "x"_a, "cos"_a, "sin"_a, "interleaved"_a = false, "out"_a = none, py::kw_only(),
          "dtype"_a = none);
}

}  // namespace to
