// bind_tex.cpp: the TransformerEngine-named kernels of tensor_ops._cpp (norm backward,
// Adam, scale, l2norm; compiled once, baseline flags). The tex adapters
// (tensor_ops/tex/_cpp_adapters.py) call them with NumPy views of torch tensors.
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "alloc.h"
#include "binding.h"
#include "checks.h"
#include "runtime.h"

namespace to {

// Per-thread fp32 partials of dgamma/dbeta, reduced after the parallel region and cast.
py::tuple norm_bwd(bool layer, const py::object& dz_, const py::object& x_, const py::object& mu_,
                   const py::object& rsigma_, const py::object& g_, const py::object& dx_, const py::object& dg_,
                   const py::object& db_, bool zc, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), dz = get(dz_, "dz", bf, x.dt), g = get(g_, "gamma", bf, x.dt), dx, dg, db;
    if (!same_shape(dz, x)) shape_error("dz has shape " + shape_str(dz) + " but x has " + shape_str(x));
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    check_vec(g, "gamma", n);
    Arr rs = get_f32(rsigma_, "rsigma");
    if (rs.size != rows) shape_error("rsigma must hold one float32 per row (" + std::to_string(rows) + ")");
    const float* mu = nullptr;
    if (layer) {
        Arr m = get_f32(mu_, "mu");
        if (m.size != rows) shape_error("mu must hold one float32 per row (" + std::to_string(rows) + ")");
        mu = (const float*)m.data;
    }
    py::object rdx = get_out(dx_, x, dx, bf, "dx");
    py::object rdg = get_out(dg_, g, dg, bf, "dgamma");
    py::object rdb = py::none();
    if (layer) rdb = get_out(db_, g, db, bf, "dbeta");
    const int es = ELSIZE[x.dt];
    const int64_t bytes = 3 * x.size * es;
    const int64_t groups = row_groups(rows);
    const int nth = rows ? threads_for(bytes, groups) : 1;
    const int nacc = layer ? 2 : 1;
    const bool nt = use_nt(x.size * es);
    // The accumulators, then a 16-bit gamma widened once (the kernels' gp: they read it twice per
    // element), GP_SKEW floats past them so gp[i] and the accumulators' [i] are not a multiple of
    // 4 KiB apart: right after them (n = 1024) it measured 0.90-0.94x, skewed 1.09-1.14x
    // (CONTRIBUTING "The norm backward's 16-bit gamma"). An fp32 gamma is read in place.
    constexpr size_t GP_SKEW = 272;  // 1 KiB + one line
    const bool widen = x.dt != DT_F32;
    const size_t sn = pad_slot(n);  // the slots on dx's phase (runtime.h Scratch)
    Scratch acc((size_t)groups * nacc * sn + (widen ? GP_SKEW + (size_t)n : 0) + 1, x.data, false, dx.data, es);
    {
        py::gil_scoped_release nogil;
        std::memset(acc.get(), 0, sizeof(float) * (size_t)groups * nacc * sn);
        float* A = acc.get();
        const float* gp = (const float*)g.data;
        if (widen) {
            float* c = A + (size_t)groups * nacc * sn + GP_SKEW;
            g_k->to_f32[x.dt](g.data, c, n);
            gp = c;
        }
        if (rows) {
            const float* rsp = (const float*)rs.data;
            parallel_row_groups(rows, nth, [&](int64_t b, int64_t e, int64_t t, int) {  // t: the row group
                float* dga = A + (size_t)t * nacc * sn;
                if (layer)
                    g_k->layer_norm_bwd[x.dt](dz.data + b * n * es, x.data + b * n * es, mu + b, rsp + b, gp,
                                              dx.data + b * n * es, dga, dga + sn, e - b, n, zc, nt);
                else
                    g_k->rms_norm_bwd[x.dt](dz.data + b * n * es, x.data + b * n * es, rsp + b, gp,
                                            dx.data + b * n * es, dga, e - b, n, zc, nt);
            });
        }
        for (int64_t t = 1; t < groups; ++t)  // in group order: the same sums whatever the threads
            for (size_t i = 0; i < nacc * sn; ++i) A[i] += A[(size_t)t * nacc * sn + i];
        g_k->from_f32[x.dt](A, dg.data, n);
        if (layer) g_k->from_f32[x.dt](A + sn, db.data, n);
    }
    if (layer) return py::make_tuple(rdx, rdg, rdb);
    return py::make_tuple(rdx, rdg);
}

namespace {

void adam_step(const py::object& g_, const py::object& p_, const py::object& m_, const py::object& v_, double lr,
               double beta1, double beta2, float eps, double bc1, double bc2, int mode, double wd,
               const py::object& master_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr g = get(g_, "g", bf), p = get(p_, "p", bf, -1, true), m = get_f32(m_, "m", true), v = get_f32(v_, "v", true);
    if (mode != 0 && mode != 1) throw py::value_error("mode=" + std::to_string(mode) + " is not one of [0 (L2), 1 (AdamW)]");
    if (!(bc1 > 0.f) || !(bc2 > 0.f)) throw py::value_error("bc1 and bc2 must be > 0 (1 - beta^step, or 1)");
    const int64_t n = g.size;
    if (p.size != n || m.size != n || v.size != n)
        shape_error("g, p, m, v must have the same number of elements, got " + std::to_string(g.size) + ", " +
                    std::to_string(p.size) + ", " + std::to_string(m.size) + ", " + std::to_string(v.size));
    float* master = nullptr;
    if (!master_.is_none()) {
        Arr ms = get_f32(master_, "master", true);
        if (ms.size != n) shape_error("master must have " + std::to_string(n) + " elements, got " + std::to_string(ms.size));
        master = (float*)ms.data;
    }  // without master, 16-bit p is read and written in its own precision (TE's FusedAdam, bf16 model)
    if (n == 0) return;
    AdamParams a{(float)lr, (float)beta1, (float)beta2, eps, (float)bc1, (float)bc2, (float)wd, mode,
                 (float)(lr / bc1), (float)std::sqrt(bc2), (float)(1.0 - lr * wd), (float)(1.0 - beta1),
                 (float)(1.0 - beta2)};
    auto k = g_k->adam[g.dt][p.dt];
    const int eg = ELSIZE[g.dt], ep = ELSIZE[p.dt];
    const int64_t bytes = n * (eg + ep + 16 + (master ? 8 : 0));
    py::gil_scoped_release nogil;
    parallel_flat(n, bytes, [&](int64_t b, int64_t e, int) {
        k(g.data + b * eg, p.data + b * ep, (float*)m.data + b, (float*)v.data + b, master ? master + b : nullptr, e - b, &a);
    });
}

bool scale(const py::object& in_, const py::object& out_, float s, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr in = get(in_, "inp", bf), out = get(out_, "out", bf, -1, true);
    if (in.size != out.size)
        shape_error("out has " + std::to_string(out.size) + " elements, inp has " + std::to_string(in.size));
    if (in.size == 0) return false;
    if (in.data != out.data) {  // in place is fine; any other overlap is not
        const char *a0 = in.data, *a1 = in.data + in.size * ELSIZE[in.dt];
        const char *b0 = out.data, *b1 = out.data + out.size * ELSIZE[out.dt];
        if (a0 < b1 && b0 < a1) shape_error("out overlaps inp (only exact in-place is supported)");
    } else if (in.dt != out.dt) {
        shape_error("in-place scale needs inp and out of the same dtype");
    }
    auto k = g_k->scale[in.dt][out.dt];
    const int ei = ELSIZE[in.dt], eo = ELSIZE[out.dt];
    int flags[256] = {0};
    py::gil_scoped_release nogil;
    parallel_flat(in.size, in.size * (ei + eo), [&](int64_t b, int64_t e, int t) {
        flags[t & 255] |= k(in.data + b * ei, out.data + b * eo, e - b, s);
    });
    int f = 0;
    for (int i = 0; i < 256; ++i) f |= flags[i];
    return f != 0;
}

double l2norm_sq(const py::object& x_, const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf);
    if (x.size == 0) return 0.0;
    auto k = g_k->sumsq[x.dt];
    const int es = ELSIZE[x.dt];
    // fixed groups of 1024-element blocks, added in group order: the same bits on every call
    const int64_t blocks = (x.size + 1023) / 1024, groups = row_groups(blocks);
    double part[32] = {0};
    py::gil_scoped_release nogil;
    parallel_row_groups(blocks, threads_for(x.size * es, groups), [&](int64_t b, int64_t e, int64_t g, int) {
        const int64_t lo = b * 1024, hi = e * 1024 < x.size ? e * 1024 : x.size;
        part[g] = k(x.data + lo * es, hi - lo);
    });
    double s = 0.0;
    for (int64_t g = 0; g < groups; ++g) s += part[g];
    return s;
}

}  // namespace

void register_tex(py::module_& m) {
    using namespace pybind11::literals;
    auto none = py::none();
    m.def(
        "rms_norm_bwd",
        [](const py::object& dz, const py::object& x, const py::object& rsigma, const py::object& gamma,
           const py::object& dx, const py::object& dgamma, bool zc, const py::object& dt) {
            return norm_bwd(false, dz, x, py::none(), rsigma, gamma, dx, dgamma, py::none(), zc, dt);
        },
        "dz"_a, "x"_a, "rsigma"_a, "gamma"_a, "dx"_a = none, "dgamma"_a = none, "zero_centered_gamma"_a = false,
        py::kw_only(), "dtype"_a = none);
    m.def(
        "layer_norm_bwd",
        [](const py::object& dz, const py::object& x, const py::object& mu, const py::object& rsigma,
           const py::object& gamma, const py::object& dx, const py::object& dgamma, const py::object& dbeta, bool zc,
           const py::object& dt) { return norm_bwd(true, dz, x, mu, rsigma, gamma, dx, dgamma, dbeta, zc, dt); },
        "dz"_a, "x"_a, "mu"_a, "rsigma"_a, "gamma"_a, "dx"_a = none, "dgamma"_a = none, "dbeta"_a = none,
        "zero_centered_gamma"_a = false, py::kw_only(), "dtype"_a = none);
    m.def("adam_step", &adam_step, "g"_a, "p"_a, "m"_a, "v"_a, "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "bc1"_a, "bc2"_a,
          "mode"_a, "weight_decay"_a, "master"_a = none, py::kw_only(), "dtype"_a = none);
    m.def("scale", &scale, "inp"_a, "out"_a, "scale"_a, py::kw_only(), "dtype"_a = none);
    m.def("l2norm_sq", &l2norm_sq, "x"_a, py::kw_only(), "dtype"_a = none);
}

}  // namespace to
