// bind_facade.cpp: the facade ops of tensor_ops._cpp (compiled once, baseline flags).
//
// Each op checks its arrays at the boundary (checks.h), takes or allocates its output
// (alloc.h), releases the GIL and runs the selected variant's kernel over rows (or flat
// chunks) split across OpenMP threads above a size threshold (runtime.h).
#include <algorithm>
#include <cstring>
#include <pybind11/pybind11.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>

#include "alloc.h"
#include "binding.h"
#include "checks.h"
#include "runtime.h"

namespace to {

namespace {

// The norm kernels' fp32 weight (and bias), zero-centred gamma's +1 folded in, converted
// once per call here when needed: a 16-bit weight was converted again for every row (one
// vcvtph2ps per vector of output), a plain gamma's 0 added per element. On large calls the
// weights are also copied to 64-byte aligned memory: they are read once per row from L1,
// and a weight 16 bytes off (NumPy's usual alignment) splits every 64-byte load across two
// lines (two-pass rms_norm, 1 thread, 4096 x 4096 fp32: 0.86 -> 0.50 of the streaming copy
// in a standalone loop). A (1, 4096) call keeps the caller's arrays: the copy would cost
// more than the misaligned loads.
// Without zero-centred gamma, and where g_norm_w16 says so (runtime.h: not on Zen 4), 16-bit
// weights stay 16-bit (kernels.h NormWeights; norm.cpp with_w says why): fp16 as they are
// (copied only to align them), bf16 with a bias packed with it, a word per element; the fused
// add (`fused`) packs bf16 pairs on every CPU. Exact either way: the fp32 conversion of a
// 16-bit value is exact.
struct NormParams {
    const void* w = nullptr;
    const void* b = nullptr;
    int wf = NW_F32;
    std::optional<Scratch> buf;  // 64-byte aligned (runtime.h)
    NormParams(const Arr& wa, const char* bias, int dt, int64_t n, bool zc, bool big, bool fused = false) {
        auto off = [](const void* p) { return (uintptr_t)p % 64 != 0; };
        if (dt == DT_BF16 && bias && !zc && (g_norm_w16 || fused)) {
            wf = NW_BF16_PAIRS;
            uint32_t* pk = (uint32_t*)buf.emplace((size_t)n, wa.data).get();
            const uint16_t *wb = (const uint16_t*)wa.data, *bb = (const uint16_t*)bias;
            for (int64_t i = 0; i < n; ++i) pk[i] = (uint32_t)wb[i] | ((uint32_t)bb[i] << 16);
            w = b = pk;
            return;
        }
        if (dt == DT_F16 && !zc && g_norm_w16) {
            wf = NW_F16;
            w = wa.data;
            b = bias;
            const bool cw = big && off(wa.data), cb = bias && big && off(bias);
            const int64_t stride = (n + 31) / 32 * 32;  // halves: the bias row 64-byte aligned too
            char* base = nullptr;
            if (cw || cb) base = (char*)buf.emplace((size_t)stride, wa.data).get();  // 2 rows of halves
            if (cw) w = std::memcpy(base, wa.data, (size_t)n * 2);
            if (cb) b = std::memcpy(base + stride * 2, bias, (size_t)n * 2);
            return;
        }
        const bool cw = dt != DT_F32 || zc || (big && off(wa.data));
        const bool cb = bias && (dt != DT_F32 || (big && off(bias)));
        const int64_t stride = (n + 15) / 16 * 16;  // keeps the bias row 64-byte aligned too
        float* base = nullptr;
        if (cw || cb) base = buf.emplace((size_t)(2 * stride), wa.data).get();
        if (cw) {
            g_k->to_f32[dt](wa.data, base, n);
            if (zc)
                for (int64_t i = 0; i < n; ++i) base[i] += 1.0f;
            w = base;
        } else {
            w = (const float*)wa.data;
        }
        if (cb) {
            g_k->to_f32[dt](bias, base + stride, n);
            b = base + stride;
        } else {
            b = (const float*)bias;
        }
    }
};

// An output that is not one of `ins` must not overlap any of them; one that is (the same
// data and shape) is fine: the fused kernels read each row of their inputs before writing
// that row of their outputs.
void check_alias(const Arr& o, const char* oname, std::initializer_list<std::pair<const Arr*, const char*>> ins) {
    const char *o0 = o.data, *o1 = o.data + o.size * ELSIZE[o.dt];
    for (const auto& in : ins) {
        const Arr& a = *in.first;
        if (a.data == o.data && same_shape(a, o)) continue;
        const char *a0 = a.data, *a1 = a.data + a.size * ELSIZE[a.dt];
        if (o0 < a1 && a0 < o1)
            shape_error(std::string(oname) + " overlaps " + in.second + " without being the same array (exact in-place "
                        "is supported; pass separate buffers otherwise)");
    }
}

}  // namespace

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
    NormParams np(w, nullptr, x.dt, n, zc, bytes >= g_par_bytes);
    auto k = g_k->rms_norm[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(2 * bytes, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, np.w, o.data + b * n * es, e - b, n, eps, rs ? rs + b : nullptr, nt, np.wf);
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
    NormParams np(w, bias, x.dt, n, zc, bytes >= g_par_bytes);
    auto k = g_k->layer_norm[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(bytes);
    py::gil_scoped_release nogil;
    parallel_units(rows, threads_for(2 * bytes, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, np.w, np.b, o.data + b * n * es, e - b, n, eps, mu ? mu + b : nullptr,
          rs ? rs + b : nullptr, nt, np.wf);
    });
    return res;
}

// The fused residual add + norm: (y, res_out) = (norm(x + residual), x + residual), each
// returned (allocated when None). out may be x and residual_out may be residual (or x), the
// same arrays, for vLLM's in-place form.
py::tuple add_norm(bool layer, const py::object& x_, const py::object& r_, const py::object& w_,
                   const py::object& b_, float eps, const py::object& out_, const py::object& ro_,
                   const py::object& dtype) {
    const bool bf = parse_bf16(dtype);
    Arr x = get(x_, "x", bf), r = get(r_, "residual", bf, x.dt), w = get(w_, "weight", bf, x.dt), o, ro;
    if (!same_shape(r, x)) shape_error("residual has shape " + shape_str(r) + " but x has " + shape_str(x));
    int64_t rows, n;
    rows_n(x, "x", rows, n);
    check_vec(w, "weight", n);
    const char* bias = nullptr;
    if (layer && !b_.is_none()) {
        Arr b = get(b_, "bias", bf, x.dt);
        check_vec(b, "bias", n);
        bias = b.data;
    }
    py::object res = get_out(out_, x, o, bf);
    py::object rres = get_out(ro_, x, ro, bf, "residual_out");
    if (x.size == 0) return py::make_tuple(res, rres);
    check_alias(o, "out", {{&x, "x"}, {&r, "residual"}, {&w, "weight"}});
    check_alias(ro, "residual_out", {{&x, "x"}, {&r, "residual"}, {&w, "weight"}});
    if (o.data == ro.data || (o.data < ro.data + ro.size * ELSIZE[ro.dt] && ro.data < o.data + o.size * ELSIZE[o.dt]))
        shape_error("out and residual_out overlap; they must be separate arrays");
    const int es = ELSIZE[x.dt];
    const int64_t bytes = x.size * es;
    NormParams np(w, bias, x.dt, n, false, bytes >= g_par_bytes, true);
    const int nth = threads_for(4 * bytes, rows);
    const size_t per = (size_t)fused_add_scratch(n);
    Scratch scratch((size_t)nth * per, x.data);
    float* sc = scratch.get();
    const bool nt = use_nt(bytes);
    {
        py::gil_scoped_release nogil;
        parallel_units(rows, nth, [&](int64_t b, int64_t e, int t) {
            const int64_t off = b * n * es;
            float* s = sc + (size_t)t * per;
            if (layer)
                g_k->add_layer_norm[x.dt](x.data + off, r.data + off, np.w, np.b, o.data + off, ro.data + off, e - b, n,
                                          eps, s, nt, np.wf);
            else
                g_k->add_rms_norm[x.dt](x.data + off, r.data + off, np.w, o.data + off, ro.data + off, e - b, n, eps, s,
                                        nt, np.wf);
        });
    }
    return py::make_tuple(res, rres);
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
    const size_t per = (size_t)softmax_scratch(n);
    Scratch scratch((size_t)nth * per, x.data);
    auto k = g_k->softmax[x.dt];
    const int es = ELSIZE[x.dt];
    const bool nt = use_nt(bytes);
    float* sc = scratch.get();
    py::gil_scoped_release nogil;
    parallel_units(rows, nth, [&](int64_t b, int64_t e, int t) {
        k(x.data + b * n * es, o.data + b * n * es, e - b, n, sc + (size_t)t * per, nt);
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
    const int64_t tab_row = 2 * n * (int64_t)sizeof(float);  // bytes of cos + sin per position
    if (B > 1 && rows % T == 0) {
        // Several sequences (heads) over the same positions. The (T, n) tables are walked in
        // blocks of P positions (g_rope_block bytes of cos + sin, or all of them), each block run
        // for every sequence while it is in cache, so each table byte comes from memory once
        // and x is read in contiguous runs of P rows. Row-major order re-streamed the tables B
        // times (0.7 of copy on 8 x 1024 x 4096); one position at a time over all sequences read
        // x in B scattered 512-byte pieces per position, which defeated the prefetchers and the
        // write-combining of the streaming stores (0.08-0.22 of the ceiling on the LLM layout
        // 32 x 8192 x 128). Within a block, G = g_rope_group sequences go together position by
        // position, so that a table row read from L2/L3 serves G rows of x from L1.
        // The runs' length is what the memory side sees: on an AMD Zen 5 (2026-12-02, 32 x 8192
        // x 128, both placements, median of 15 rounds against the streaming copy in one
        // process, _set_tuning(rope_group=, rope_block=) scanned) G = 4 with 256 KiB blocks (runs
        // of 64-128 KiB per head) held rope at 0.33-0.75 of the ceiling, G = 2 with 2 MiB blocks
        // (runs of 512 KiB-1 MiB) at 0.49-0.91, the better in every paired run (ab_builds.py:
        // 1.11-1.46x). With 2-8 MiB blocks G = 2 beat 4 by 1.15-1.2x (our reading: 2 G streams
        // of x and y each are too many there), G = 1 reached 0.82-0.88; 4 MiB blocks measured as
        // 2. An earlier host, with 256 KiB blocks, had G = 4 1.29 / 1.53 / 1.55x the head-at-a-time
        // order and G = 2 1.25 / 1.42 / 1.38x (fp32 / fp16 / bf16).
        const int64_t P = tab_row >= g_rope_block ? 1 : std::min<int64_t>(T, g_rope_block / tab_row);
        const int64_t blocks = (T + P - 1) / P;
        const int64_t G = std::min<int64_t>(g_rope_group, ROPE_MAX_HEADS);
        const int64_t groups = (B + G - 1) / G, units = blocks * groups;
        parallel_units(units, threads_for(2 * bytes, units), [&](int64_t u0, int64_t u1, int) {
            for (int64_t u = u0; u < u1; ++u) {
                const int64_t blk = u / groups, bb = (u % groups) * G;
                const int64_t t0 = blk * P, np_ = T - t0 < P ? T - t0 : P;
                const int64_t r = bb * T + t0;
                k(x.data + r * n * es, (const float*)c.data, (const float*)s.data, o.data + r * n * es, np_, n,
                  T, t0, interleaved, nt, std::min(G, B - bb), T * n);
            }
        });
        return res;
    }
    parallel_units(rows, threads_for(2 * bytes, rows), [&](int64_t b, int64_t e, int) {
        k(x.data + b * n * es, (const float*)c.data, (const float*)s.data, o.data + b * n * es, e - b, n, T, b,
          interleaved, nt, 1, 0);
    });
    return res;
}

void register_facade(py::module_& m) {
    using namespace pybind11::literals;
    auto none = py::none();
    m.def("rms_norm", &rms_norm, "x"_a, "weight"_a, "eps"_a, "out"_a = none, py::kw_only(), "rsigma"_a = none,
          "zero_centered_gamma"_a = false, "dtype"_a = none);
    m.def("layer_norm", &layer_norm, "x"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a = none, py::kw_only(), "mu"_a = none,
          "rsigma"_a = none, "zero_centered_gamma"_a = false, "dtype"_a = none);
    m.def(
        "add_rms_norm",
        [](const py::object& x, const py::object& r, const py::object& w, float eps, const py::object& out,
           const py::object& ro, const py::object& dt) { return add_norm(false, x, r, w, py::none(), eps, out, ro, dt); },
        "x"_a, "residual"_a, "weight"_a, "eps"_a, "out"_a = none, "residual_out"_a = none, py::kw_only(),
        "dtype"_a = none);
    m.def(
        "add_layer_norm",
        [](const py::object& x, const py::object& r, const py::object& w, const py::object& b, float eps,
           const py::object& out, const py::object& ro,
           const py::object& dt) { return add_norm(true, x, r, w, b, eps, out, ro, dt); },
        "x"_a, "residual"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a = none, "residual_out"_a = none, py::kw_only(),
        "dtype"_a = none);
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
