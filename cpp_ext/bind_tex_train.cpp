// bind_tex_train.cpp: the tex training kernels of tensor_ops._cpp (tex_train.cpp): activation
// derivatives with the optional bias gradient, TE's scaled softmax forward (plain / masked /
// causal) and backward, fused RoPE over (token, head) rows, the SGD step. Called by
// tensor_ops/tex/_cpp_adapters.py with NumPy views of torch tensors (outputs given, written
// in place); every array is checked here, the GIL is released around the kernels.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "binding.h"
#include "checks.h"
#include "runtime.h"

namespace to {
namespace {

void check_same(const Arr& a, const Arr& b, const char* an, const char* bn) {
    if (!same_shape(a, b)) shape_error(std::string(an) + " has shape " + shape_str(a) + " but " + bn + " has " + shape_str(b));
}

int dact_code(int k) {
    if (k < 0 || k >= DA_COUNT) throw py::value_error("kind=" + std::to_string(k) + " is not a DAct code [0, 6)");
    return k;
}

// A C-contiguous integer array of the given element size/kind ('u' uint8 or bool, 'i' int64).
template <class I>
const I* get_int(const py::handle& h, const char* name, char kind, int64_t& size) {
    if (!py::isinstance<py::array>(h)) throw py::type_error(std::string(name) + " must be a numpy.ndarray");
    py::array a = py::reinterpret_borrow<py::array>(h);
    const char k = a.dtype().kind();
    if ((size_t)a.itemsize() != sizeof(I) || !(k == kind || (kind == 'u' && k == 'b')))
        throw py::type_error(std::string(name) + " has dtype " + py::str(a.dtype()).cast<std::string>() +
                             (kind == 'u' ? "; expected uint8 (or bool)" : "; expected int64"));
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " must be C-contiguous");
    size = a.size();
    return (const I*)a.data();
}

void dglu(const py::object& g_, const py::object& x_, const py::object& out_, int kind, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), g = get(g_, "grad", bf, x.dt), o = get(out_, "out", bf, x.dt, true);
    check_same(o, x, "out", "x");
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    if (n % 2) shape_error("x's last dim must be even (the halves a, b), got " + std::to_string(n));
    if (g.size != rows * (n / 2)) shape_error("grad must have rows x n/2 = " + std::to_string(rows * (n / 2)) + " elements");
    if (x.size == 0) return;
    auto k = g_k->dglu[x.dt][dact_code(kind)];
    const int es = ELSIZE[x.dt];
    const int64_t h = n / 2;
    const bool nt = use_nt(x.size * es);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(5 * rows * h * es, rows), [&](int64_t b, int64_t e, int) {
        k(g.data + b * h * es, x.data + b * n * es, o.data + b * n * es, e - b, h, nt);
    });
}

void tex_softmax(const py::object& x_, const py::object& out_, float scale, int mode, const py::object& mask_,
                 int64_t heads, int64_t sq, int64_t causal_off, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), o = get(out_, "out", bf, x.dt, true);
    check_same(o, x, "out", "x");
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    if (mode < SM_PLAIN || mode > SM_CAUSAL) throw py::value_error("mode must be 0 (plain), 1 (mask) or 2 (causal)");
    if (sq < 1 || heads < 1 || rows % sq) shape_error("rows must be a multiple of sq >= 1 (heads >= 1)");
    const uint8_t* mask = nullptr;
    int64_t mb = 1;
    if (mode == SM_MASK) {
        int64_t ms;
        mask = get_int<uint8_t>(mask_, "mask", 'u', ms);
        if (ms % (sq * n)) shape_error("mask must hold [b or 1, sq, sk] uint8");
        mb = ms / (sq * n);
        if (mb != 1 && mb * heads * sq != rows) shape_error("mask's batch dim must be 1 or b = rows / (heads * sq)");
    }
    if (x.size == 0) return;
    auto k = g_k->tsoftmax[x.dt];
    const int es = ELSIZE[x.dt];
    const int nth = threads_for(2 * x.size * es, rows);
    const bool nt = use_nt(x.size * es);
    // the pipelined plain rows' two scratch rows (softmax.cpp), and at least n + 64 as before
    const size_t per = (size_t)std::max<int64_t>(softmax_scratch(n), n + 64);
    Scratch scratch((size_t)nth * per, x.data);
    py::gil_scoped_release nogil;
    parallel_units(rows, nth, [&](int64_t b, int64_t e, int t) {
        k(x.data + b * n * es, o.data + b * n * es, e - b, n, scale, mode, mask, mb, heads, b, sq, causal_off,
          scratch.get() + (size_t)t * per, nt);
    });
}

void tex_rope(const py::object& x_, const py::object& cos_, const py::object& sin_, const py::object& pos_,
              const py::object& out_, int64_t heads, bool interleaved, bool transpose, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), o = get(out_, "out", bf, x.dt, true);
    check_same(o, x, "out", "x");
    Arr c = get_f32(cos_, "cos"), s = get_f32(sin_, "sin");
    if (c.nd != 2 || !same_shape(c, s)) shape_error("cos and sin must be 2-D (P, d2) of one shape");
    const int64_t P = c.shape[0], d2 = c.shape[1];
    int64_t rows, d;
    rows_n(x, "x", rows, d);
    if (heads < 1 || rows % heads) shape_error("x must be (tokens, heads, d)");
    if (d2 > d || d2 % 2) shape_error("d2 = " + std::to_string(d2) + " must be even and <= d = " + std::to_string(d));
    const int64_t tokens = rows / heads;
    int64_t np;
    const int64_t* pos = get_int<int64_t>(pos_, "pos", 'i', np);
    if (np != tokens) shape_error("pos must hold one int64 per token (" + std::to_string(tokens) + ")");
    for (int64_t t = 0; t < np; ++t)
        if (pos[t] < 0 || pos[t] >= P) throw py::value_error("pos[" + std::to_string(t) + "] = " + std::to_string(pos[t]) +
                                                             " is outside the freqs' " + std::to_string(P) + " positions");
    if (x.size == 0) return;
    auto k = g_k->trope[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(x.size * es);
    py::gil_scoped_release nogil;
    parallel_units(tokens, threads_for(2 * x.size * es, tokens), [&](int64_t b, int64_t e, int) {
        k(x.data, (const float*)c.data, (const float*)s.data, pos, o.data, b, e, heads, d, d2, interleaved, transpose, nt);
    });
}

void sgd_step(const py::object& g_, const py::object& p_, const py::object& b_, float wd, float momentum,
              float dampening, float lr, bool nesterov, bool first_run, bool wd_after, float scale,
              const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr p = get(p_, "p", bf, -1, true), g = get(g_, "g", bf, p.dt), b = get(b_, "buf", bf, p.dt, true);
    if (g.size != p.size || b.size != p.size)
        shape_error("g, p, buf must have the same number of elements, got " + std::to_string(g.size) + ", " +
                    std::to_string(p.size) + ", " + std::to_string(b.size));
    if (p.size == 0) return;
    SgdParams a{wd, momentum, dampening, lr, scale, nesterov, first_run, wd_after};
    auto k = g_k->sgd[p.dt];
    const int es = ELSIZE[p.dt];
    py::gil_scoped_release nogil;
    parallel_flat(p.size, p.size * es * 5, [&](int64_t lo, int64_t hi, int) {
        k(g.data + lo * es, p.data + lo * es, b.data + lo * es, hi - lo, &a);
    });
}

// out (float32 [n]) = the column sums of x (rows, n = x's last dim); see colsum_k.
void col_sums(const py::object& x_, const py::object& out_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf);
    Arr o = get_f32(out_, "out", true);
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    if (o.size != n) shape_error("out must hold n = " + std::to_string(n) + " float32, got " + std::to_string(o.size));
    auto k = g_k->colsum[x.dt];
    const int es = ELSIZE[x.dt];
    float* res = (float*)o.data;
    py::gil_scoped_release nogil;
    const int64_t groups = row_groups(rows);
    const int nth = threads_for(x.size * es, groups);
    std::unique_ptr<double[]> tot(new double[(size_t)groups * n]());
    Scratch blk((size_t)nth * n, x.data);
    parallel_row_groups(rows, nth, [&](int64_t r0, int64_t r1, int64_t g, int t) {
        k(x.data + r0 * n * es, r1 - r0, n, blk.get() + (size_t)t * n, tot.get() + (size_t)g * n);
    });
    for (int64_t i = 0; i < n; ++i) {  // in group order: the same sums whatever the threads
        double s = 0.0;
        for (int64_t g = 0; g < groups; ++g) s += tot[(size_t)g * n + i];
        res[i] = (float)s;
    }
}

}  // namespace

// Also called by the autograd entries (fast_entry.cpp).
void dact(const py::object& g_, const py::object& x_, const py::object& out_, int kind, const py::object& dbias_,
          const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), g = get(g_, "grad", bf, x.dt), o = get(out_, "out", bf, x.dt, true);
    check_same(g, x, "grad", "x");
    check_same(o, x, "out", "x");
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    float* acc = nullptr;
    if (!dbias_.is_none()) {
        Arr b = get_f32(dbias_, "dbias", true);
        if (b.size != n) shape_error("dbias must hold n = " + std::to_string(n) + " float32, got " + std::to_string(b.size));
        acc = (float*)b.data;
    }
    auto k = g_k->dact[x.dt][dact_code(kind)];
    const int es = ELSIZE[x.dt];
    const int64_t bytes = 3 * x.size * es;
    const bool nt = use_nt(x.size * es);
    if (x.size == 0) {
        if (acc) for (int64_t i = 0; i < n; ++i) acc[i] = 0.f;
        return;
    }
    py::gil_scoped_release nogil;
    if (!acc) {
        parallel_flat(x.size, bytes, [&](int64_t b, int64_t e, int) {
            k(g.data + b * es, x.data + b * es, o.data + b * es, 1, e - b, nullptr, nt);
        });
        return;
    }
    const int64_t groups = row_groups(rows);
    const size_t slot = pad_slot(n);
    Scratch part((size_t)groups * slot, x.data, true, o.data, es);  // on the output's phase (runtime.h)
    parallel_row_groups(rows, threads_for(bytes, groups), [&](int64_t b, int64_t e, int64_t t, int) {  // t: the row group
        k(g.data + b * n * es, x.data + b * n * es, o.data + b * n * es, e - b, n, part.get() + (size_t)t * slot, nt);
    });
    for (int64_t i = 0; i < n; ++i) {  // in group order: the same sums whatever the threads
        float s = 0.f;
        for (int64_t t = 0; t < groups; ++t) s += part[(size_t)t * slot + i];
        acc[i] = s;
    }
}

void tex_softmax_bwd(const py::object& dy_, const py::object& y_, const py::object& out_, float scale,
                     const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr y = get(y_, "y", bf), dy = get(dy_, "dy", bf, y.dt), o = get(out_, "out", bf, y.dt, true);
    check_same(dy, y, "dy", "y");
    check_same(o, y, "out", "y");
    int64_t rows, n;
    rows_n(y, "y", rows, n);
    if (y.size == 0) return;
    auto k = g_k->tsoftmax_bwd[y.dt];
    const int es = ELSIZE[y.dt];
    const bool nt = use_nt(y.size * es);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(3 * y.size * es, rows), [&](int64_t b, int64_t e, int) {
        k(dy.data + b * n * es, y.data + b * n * es, o.data + b * n * es, e - b, n, scale, nt);
    });
}

void register_tex_train(py::module_& m) {
    using namespace pybind11::literals;
    auto none = py::none();
    m.attr("DACT_CODES") = py::dict("gelu"_a = (int)DA_GELU_TANH, "silu"_a = (int)DA_SILU, "qgelu"_a = (int)DA_QGELU,
                                    "relu"_a = (int)DA_RELU, "srelu"_a = (int)DA_SRELU, "sigmoid"_a = (int)DA_SIGMOID);
    m.def("dact", &dact, "grad"_a, "x"_a, "out"_a, "kind"_a, "dbias"_a = none, py::kw_only(),
          "dtype"_a = none,
          "out = grad * act'(x) (kind: DACT_CODES); dbias (float32 [n]) gets the column sums of out.");
    m.def("dglu", &dglu, "grad"_a, "x"_a, "out"_a, "kind"_a, py::kw_only(), "dtype"_a = none,
          "Gated backward: x (rows, 2h) = [a | b], grad (rows, h) -> out [grad*b*act'(a) | grad*act(a)].");
    m.def("tex_softmax", &tex_softmax, "x"_a, "out"_a, "scale"_a, "mode"_a = 0, "mask"_a = none, "heads"_a = 1,
          "sq"_a = 1, "causal_off"_a = 0, py::kw_only(), "dtype"_a = none,
          "TE's scaled softmax over rows: mode 0 plain, 1 uint8 mask (== 1: -10000; rows whose max is -10000 give 0), 2 causal.");
    m.def("tex_softmax_bwd", &tex_softmax_bwd, "dy"_a, "y"_a, "out"_a, "scale"_a, py::kw_only(),
          "dtype"_a = none, "dx = scale * y * (dy - sum(dy * y)) per row.");
    m.def("tex_rope", &tex_rope, "x"_a, "cos"_a, "sin"_a, "pos"_a, "out"_a, "heads"_a, "interleaved"_a = false,
          "transpose"_a = false, py::kw_only(), "dtype"_a = none,
          "Fused RoPE over (tokens, heads, d) rows, position pos[token].");
    m.def("sgd_step", &sgd_step, "g"_a, "p"_a, "buf"_a, "wd"_a, "momentum"_a, "dampening"_a, "lr"_a, "nesterov"_a,
          "first_run"_a, "wd_after"_a, "scale"_a, py::kw_only(), "dtype"_a = none,
          "One SGD step in place (apex/TE semantics).");
    m.def("col_sums", &col_sums, "x"_a, "out"_a, py::kw_only(), "dtype"_a = none,
          "out (float32 [n]) = column sums of x (rows, n): fp32 blocks of 64 rows, folded in fp64.");
}

}  // namespace to
