// fast_entry.cpp: the facade's plain-call entries _fast_* (compiled once, baseline flags).
//
// tensor_ops/_facade.py calls these for a plain call (no out=, no backend=, no override) once
// the resolver has chosen default.cpp for the op. They take only what needs no
// normalisation: exactly numpy.ndarray, >= 1 dim, non-empty, C-contiguous, aligned, native
// float32/float16 (or ml_dtypes bfloat16 once the module has seen that dtype), weights of the
// same dtype and length, a finite float eps >= 0. Anything
// else returns None and the facade's general path gives the same result or its error, so
// there is one set of checks and messages. out= calls come here too, as one trailing argument
// (the facade passes it only when given; _state.fast_out_fns): taken when it is exactly an
// ndarray of x's dtype and result shape, C-contiguous, aligned, writeable and sharing no byte
// with any input -- in-place included, which the general path serves through a temporary.
// Through Python a (1, 4096) rms_norm with out= cost 15-18 us on NumPy arrays and 52-66 us on
// torch tensors; here 1.4-1.7 / 3.8-4.9 us (bench_cpp.py --small). Why they exist: the facade's Python checks and
// the manager's dispatch added ~1.4 us to a (1, 4096) rms_norm that costs ~0.9 us through
// the binding alone (bench_cpp.py --small); as METH_FASTCALL functions they also skip
// pybind11's argument dispatcher. Calls are counted here (the
// manager adds them to get_backend_info()'s per-impl counts). The norms also have entries for
// autograd (tensor_ops/torch/_kernels.py): the forward with its statistics (_fast_*_stats,
// PlainEntry.stats) and the backward from them (_fast_*_bwd); the activations, the gated ops and
// softmax their backward (_fast_act_bwd, _fast_glu_bwd, _fast_softmax_bwd).
#include <atomic>
#include <vector>

#include "alloc.h"
#include "binding.h"
#include "checks.h"

namespace to {
namespace {

enum FastOp {
    FO_RMS, FO_LN, FO_SOFTMAX, FO_SILU, FO_RELU, FO_GELU, FO_SWIGLU, FO_GEGLU, FO_ADD_RMS, FO_ADD_LN, FO_ROPE, FO_COUNT
};
const char* FAST_NAMES[FO_COUNT] = {"rms_norm", "layer_norm", "softmax",      "silu",           "relu", "gelu",
                                    "swiglu",   "geglu",      "add_rms_norm", "add_layer_norm", "rope"};
std::atomic<int64_t> g_fast_calls[FO_COUNT];

int plain_dt(PyObject* o) {
    if (Py_TYPE(o) != py::detail::npy_api::get().PyArray_Type_) return -1;
    auto* p = proxy(o);
    if (p->nd < 1 || (p->flags & (F_C | F_ALIGNED)) != (F_C | F_ALIGNED)) return -1;
    auto* d = py::detail::array_descriptor_proxy(p->descr);
    const int num = d->type_num;
    const int dt = num == NPY_FLOAT_ ? DT_F32 : num == NPY_HALF_ ? DT_F16
                 : (num == g_bf16_type_num && num >= 0) ? DT_BF16 : -1;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    if (d->byteorder == '<') return -1;
#else
    if (d->byteorder == '>') return -1;
#endif
    for (int i = 0; i < p->nd; ++i)
        if (p->dimensions[i] == 0) return -1;
    return dt;
}
inline int64_t last_dim(PyObject* o) { auto* p = proxy(o); return p->dimensions[p->nd - 1]; }
bool plain_vec(PyObject* w, int dt, int64_t n) {
    return plain_dt(w) == dt && proxy(w)->nd == 1 && proxy(w)->dimensions[0] == n;
}
bool plain_eps(PyObject* e, float& out) {
    if (!PyFloat_CheckExact(e)) return false;
    const double v = PyFloat_AS_DOUBLE(e);
    if (!(v >= 0.0 && v <= 3.4028234663852886e38)) return false;  // NaN, negative, inf: general path
    out = (float)v;
    return true;
}
int plain_approx(PyObject* a) {  // 0 none, 1 tanh, -1 anything else
    if (!PyUnicode_CheckExact(a)) return -1;
    if (PyUnicode_CompareWithASCIIString(a, "none") == 0) return 0;
    if (PyUnicode_CompareWithASCIIString(a, "tanh") == 0) return 1;
    return -1;
}
inline py::object B(PyObject* o) { return py::reinterpret_borrow<py::object>(o); }

int64_t span(PyObject* o) {  // bytes of a plain (C-contiguous) array
    auto* p = proxy(o);
    int64_t n = ELSIZE[plain_dt(o)];
    for (int i = 0; i < p->nd; ++i) n *= p->dimensions[i];
    return n;
}
// The entry's optional trailing out= argument (a[k] when na == k + 1): sets `out` (Py_None when
// absent or None) and returns false to decline. The result has x's shape, its last axis halved
// when `half` (the gated ops); the inputs (x, weight, bias, rope's tables) must already have
// passed their plain checks (they are read as arrays here), or be None.
bool out_arg(PyObject* const* a, Py_ssize_t na, Py_ssize_t k, int dt, bool half,
             std::initializer_list<PyObject*> inputs, PyObject*& out) {
    out = Py_None;
    if (na == k || a[k] == Py_None) return na == k || na == k + 1;
    if (na != k + 1) return false;
    PyObject* o = a[k];
    if (plain_dt(o) != dt || !(proxy(o)->flags & F_WRITEABLE)) return false;
    auto *po = proxy(o), *px = proxy(a[0]);
    if (po->nd != px->nd) return false;
    for (int i = 0; i < po->nd; ++i)
        if (po->dimensions[i] != (i == po->nd - 1 && half ? px->dimensions[i] / 2 : px->dimensions[i])) return false;
    const char* o0 = po->data;
    const char* o1 = o0 + span(o);
    for (PyObject* in : inputs) {
        if (in == Py_None) continue;
        const char* i0 = proxy(in)->data;
        if (o0 < i0 + span(in) && i0 < o1) return false;
    }
    out = o;
    return true;
}
inline PyObject* declined() { Py_RETURN_NONE; }

template <class F>
PyObject* fast_call(int op, const F& f) {
    try {
        py::object r = f();
        if (op >= 0) g_fast_calls[op].fetch_add(1, std::memory_order_relaxed);  // -1: a backward, not counted
        return r.release().ptr();
    } catch (py::error_already_set& e) {
        e.restore();
    } catch (py::builtin_exception& e) {
        e.set_error();
    } catch (std::bad_alloc&) {
        PyErr_NoMemory();
    } catch (std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

PyObject* fast_rms_norm(PyObject*, PyObject* const* a, Py_ssize_t na) {
    float eps;
    int dt;
    PyObject* out;
    if (na < 3 || (dt = plain_dt(a[0])) < 0 || !plain_vec(a[1], dt, last_dim(a[0])) || !plain_eps(a[2], eps) ||
        !out_arg(a, na, 3, dt, false, {a[0], a[1]}, out))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_RMS, [&] { return rms_norm(B(a[0]), B(a[1]), eps, B(out), none, false, none); });
}
PyObject* fast_layer_norm(PyObject*, PyObject* const* a, Py_ssize_t na) {
    float eps;
    int dt;
    PyObject* out;
    if (na < 4 || (dt = plain_dt(a[0])) < 0 || !plain_vec(a[1], dt, last_dim(a[0])) ||
        (a[2] != Py_None && !plain_vec(a[2], dt, last_dim(a[0]))) || !plain_eps(a[3], eps) ||
        !out_arg(a, na, 4, dt, false, {a[0], a[1], a[2]}, out))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_LN,
                     [&] { return layer_norm(B(a[0]), B(a[1]), B(a[2]), eps, B(out), none, none, false, none); });
}
// The norms with their per-row statistics, for an autograd forward (tensor_ops/torch/_kernels.py
// rms_norm_fwd / layer_norm_fwd: the backward kernels reuse them): (y, rsigma) and (y, mu,
// rsigma), the statistics float32 of shape x.shape[:-1]. The plain case of the entries above,
// without out=. Through Python (the resolver's choice, prepare, the kernel with rsigma=) a
// (1, 4096) autograd forward spent ~25 us here; counted as the op's plain calls.
py::array stats_like(PyObject* x) {
    auto* p = proxy(x);
    return py::array_t<float>(std::vector<py::ssize_t>(p->dimensions, p->dimensions + p->nd - 1));
}
PyObject* fast_rms_norm_stats(PyObject*, PyObject* const* a, Py_ssize_t na) {
    float eps;
    int dt;
    if (na != 3 || (dt = plain_dt(a[0])) < 0 || !plain_vec(a[1], dt, last_dim(a[0])) || !plain_eps(a[2], eps))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_RMS, [&] {
        py::array rs = stats_like(a[0]);
        py::object y = rms_norm(B(a[0]), B(a[1]), eps, none, rs, false, none);
        return py::object(py::make_tuple(y, rs));
    });
}
PyObject* fast_layer_norm_stats(PyObject*, PyObject* const* a, Py_ssize_t na) {
    float eps;
    int dt;
    if (na != 4 || (dt = plain_dt(a[0])) < 0 || !plain_vec(a[1], dt, last_dim(a[0])) ||
        (a[2] != Py_None && !plain_vec(a[2], dt, last_dim(a[0]))) || !plain_eps(a[3], eps))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_LN, [&] {
        py::array mu = stats_like(a[0]), rs = stats_like(a[0]);
        py::object y = layer_norm(B(a[0]), B(a[1]), B(a[2]), eps, none, mu, rs, false, none);
        return py::object(py::make_tuple(y, mu, rs));
    });
}
PyObject* fast_softmax(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt;
    PyObject* out;
    if (na < 2 || (dt = plain_dt(a[0])) < 0 || !PyLong_CheckExact(a[1]) || !out_arg(a, na, 2, dt, false, {a[0]}, out))
        return declined();
    const long axis = PyLong_AsLong(a[1]);
    if (axis == -1 && PyErr_Occurred()) {  // overflowed: the general path explains the range
        PyErr_Clear();
        return declined();
    }
    if (axis != -1 && axis != proxy(a[0])->nd - 1) return declined();
    const py::object none = py::none();
    return fast_call(FO_SOFTMAX, [&] { return softmax(B(a[0]), B(out), none); });
}
template <int OP, int UN>
PyObject* fast_unary(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt;
    PyObject* out;
    if (na < 1 || (dt = plain_dt(a[0])) < 0 || !out_arg(a, na, 1, dt, false, {a[0]}, out)) return declined();
    const py::object none = py::none();
    return fast_call(OP, [&] { return unary(UN, B(a[0]), B(out), none); });
}
PyObject* fast_gelu(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int ap, dt;
    PyObject* out;
    if (na < 2 || (dt = plain_dt(a[0])) < 0 || (ap = plain_approx(a[1])) < 0 ||
        !out_arg(a, na, 2, dt, false, {a[0]}, out))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_GELU, [&] { return unary(ap ? UN_GELU_TANH : UN_GELU_ERF, B(a[0]), B(out), none); });
}
PyObject* fast_swiglu(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt;
    PyObject* out;
    if (na < 1 || (dt = plain_dt(a[0])) < 0 || last_dim(a[0]) % 2 || !out_arg(a, na, 1, dt, true, {a[0]}, out))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_SWIGLU, [&] { return glu(GLU_SWIGLU, B(a[0]), B(out), none); });
}
PyObject* fast_geglu(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int ap, dt;
    PyObject* out;
    if (na < 2 || (dt = plain_dt(a[0])) < 0 || last_dim(a[0]) % 2 || (ap = plain_approx(a[1])) < 0 ||
        !out_arg(a, na, 2, dt, true, {a[0]}, out))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_GEGLU, [&] { return glu(ap ? GLU_GEGLU_TANH : GLU_GEGLU_ERF, B(a[0]), B(out), none); });
}

// The fused residual add + norm, (normed, x + residual): plain calls only (out= is a pair, with
// an in-place form; it declines to the general path).
bool plain_like_x(PyObject* r, PyObject* x, int dt) {
    if (plain_dt(r) != dt || proxy(r)->nd != proxy(x)->nd) return false;
    for (int i = 0; i < proxy(x)->nd; ++i)
        if (proxy(r)->dimensions[i] != proxy(x)->dimensions[i]) return false;
    return true;
}
PyObject* fast_add_rms_norm(PyObject*, PyObject* const* a, Py_ssize_t na) {
    float eps;
    int dt;
    if ((na != 4 && !(na == 5 && a[4] == Py_None)) || (dt = plain_dt(a[0])) < 0 || !plain_like_x(a[1], a[0], dt) ||
        !plain_vec(a[2], dt, last_dim(a[0])) || !plain_eps(a[3], eps))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_ADD_RMS,
                     [&] { return add_norm(false, B(a[0]), B(a[1]), B(a[2]), none, eps, none, none, none); });
}
PyObject* fast_add_layer_norm(PyObject*, PyObject* const* a, Py_ssize_t na) {
    float eps;
    int dt;
    if ((na != 5 && !(na == 6 && a[5] == Py_None)) || (dt = plain_dt(a[0])) < 0 || !plain_like_x(a[1], a[0], dt) ||
        !plain_vec(a[2], dt, last_dim(a[0])) || (a[3] != Py_None && !plain_vec(a[3], dt, last_dim(a[0]))) ||
        !plain_eps(a[4], eps))
        return declined();
    const py::object none = py::none();
    return fast_call(FO_ADD_LN,
                     [&] { return add_norm(true, B(a[0]), B(a[1]), B(a[2]), B(a[3]), eps, none, none, none); });
}

// The norms' backward from the statistics of _fast_*_stats (above): (dx, dweight) and (dx,
// dweight, dbias) of dy, x (one plain dtype, one shape), the float32 statistics (x.shape[:-1],
// >= 1-D) and the weight. Through Python (the checks, two allocations, six views) a (1, 4096)
// backward cost ~40 us. Not counted: they are no facade calls.
bool plain_stats(PyObject* s, PyObject* x) {
    if (plain_dt(s) != DT_F32) return false;
    int64_t n = 1, rows = 1;
    for (int i = 0; i < proxy(s)->nd; ++i) n *= proxy(s)->dimensions[i];
    for (int i = 0; i < proxy(x)->nd - 1; ++i) rows *= proxy(x)->dimensions[i];
    return n == rows;
}
PyObject* fast_norm_bwd(PyObject* const* a, Py_ssize_t na, bool layer) {
    const int k = layer ? 1 : 0;  // layer_norm's mu comes before rsigma
    int dt;
    if (na != 4 + k || (dt = plain_dt(a[1])) < 0 || !plain_like_x(a[0], a[1], dt) ||
        (layer && !plain_stats(a[2], a[1])) || !plain_stats(a[2 + k], a[1]) || !plain_vec(a[3 + k], dt, last_dim(a[1])))
        return declined();
    const py::object none = py::none();
    return fast_call(-1, [&] {
        return py::object(norm_bwd(layer, B(a[0]), B(a[1]), layer ? B(a[2]) : none, B(a[2 + k]), B(a[3 + k]), none,
                                   none, none, false, none));
    });
}
PyObject* fast_rms_norm_bwd(PyObject*, PyObject* const* a, Py_ssize_t na) { return fast_norm_bwd(a, na, false); }
PyObject* fast_layer_norm_bwd(PyObject*, PyObject* const* a, Py_ssize_t na) { return fast_norm_bwd(a, na, true); }

// The backward of the activations, the gated ops and softmax (tensor_ops/torch/_kernels.py
// act_bwd, glu_bwd, softmax_bwd), each into a fresh output: dy * act'(x) (act "silu", "gelu"
// (erf), "gelu_tanh" or "relu"; dy and x of one plain dtype and shape); the gated ops'
// [dy * b * act'(a) | dy * act(a)] of x = [a | b] (dy: x's shape, the last axis halved; act
// "silu", "gelu" or "gelu_tanh"); softmax's scale * y * (dy - sum(dy * y)) over the last axis
// (scale a float). Through Python and tex's dispatch a (1, 4096) silu backward cost ~100 us.
constexpr int ACT_GELU_ERF = DA_COUNT;  // beside the DAct codes
int plain_act(PyObject* a) {            // a DAct code, ACT_GELU_ERF, or -1
    if (!PyUnicode_CheckExact(a)) return -1;
    if (PyUnicode_CompareWithASCIIString(a, "silu") == 0) return DA_SILU;
    if (PyUnicode_CompareWithASCIIString(a, "gelu") == 0) return ACT_GELU_ERF;
    if (PyUnicode_CompareWithASCIIString(a, "gelu_tanh") == 0) return DA_GELU_TANH;
    if (PyUnicode_CompareWithASCIIString(a, "relu") == 0) return DA_RELU;
    return -1;
}
py::object fresh_like(PyObject* x) {
    Arr xa = get(B(x), "x", false), o;
    return get_out(py::none(), xa, o, false);
}
PyObject* fast_act_bwd(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt, act;
    if (na != 3 || (dt = plain_dt(a[1])) < 0 || !plain_like_x(a[0], a[1], dt) || (act = plain_act(a[2])) < 0)
        return declined();
    const py::object none = py::none();
    return fast_call(-1, [&] {
        if (act == ACT_GELU_ERF) return gelu_erf_bwd(B(a[0]), B(a[1]), none, none);
        py::object out = fresh_like(a[1]);
        dact(B(a[0]), B(a[1]), out, act, none, none);
        return out;
    });
}
PyObject* fast_glu_bwd(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt, act;
    if (na != 3 || (dt = plain_dt(a[1])) < 0 || plain_dt(a[0]) != dt || last_dim(a[1]) % 2 ||
        (act = plain_act(a[2])) < 0 || act == DA_RELU)
        return declined();
    auto *pd = proxy(a[0]), *px = proxy(a[1]);
    if (pd->nd != px->nd) return declined();
    for (int i = 0; i < px->nd; ++i)
        if (pd->dimensions[i] != (i == px->nd - 1 ? px->dimensions[i] / 2 : px->dimensions[i])) return declined();
    const py::object none = py::none();
    return fast_call(-1, [&] { return glu_bwd(B(a[0]), B(a[1]), none, PyUnicode_AsUTF8(a[2]), none); });
}
PyObject* fast_softmax_bwd(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt;
    if (na != 3 || (dt = plain_dt(a[1])) < 0 || !plain_like_x(a[0], a[1], dt) || !PyFloat_CheckExact(a[2]))
        return declined();
    const float scale = (float)PyFloat_AS_DOUBLE(a[2]);
    const py::object none = py::none();
    return fast_call(-1, [&] {
        py::object out = fresh_like(a[1]);
        tex_softmax_bwd(B(a[0]), B(a[1]), out, scale, none);
        return out;
    });
}

// rope: the plain case is float32 (T, n) tables, T = x.shape[-2], as prepare makes them
// ((T, n/2) tables, leading size-1 dims, other dtypes and float64 x decline: prepare builds
// the (T, n) float32 tables they stand for); interleaved exactly True or False.
PyObject* fast_rope(PyObject*, PyObject* const* a, Py_ssize_t na) {
    int dt;
    PyObject* out;
    if (na < 4 || (dt = plain_dt(a[0])) < 0 || proxy(a[0])->nd < 2 || last_dim(a[0]) % 2 ||
        (a[3] != Py_True && a[3] != Py_False))
        return declined();
    auto* px = proxy(a[0]);
    for (PyObject* t : {a[1], a[2]})  // before out_arg, which reads the inputs as arrays
        if (plain_dt(t) != DT_F32 || proxy(t)->nd != 2 || proxy(t)->dimensions[0] != px->dimensions[px->nd - 2] ||
            proxy(t)->dimensions[1] != px->dimensions[px->nd - 1])
            return declined();
    if (!out_arg(a, na, 4, dt, false, {a[0], a[1], a[2]}, out)) return declined();
    const py::object none = py::none();
    return fast_call(FO_ROPE, [&] { return rope(B(a[0]), B(a[1]), B(a[2]), a[3] == Py_True, B(out), none); });
}

// Every entry first hands torch tensors to torch_entry.cpp (views in, a tensor out).
template <PyObject* (*F)(PyObject*, PyObject* const*, Py_ssize_t)>
PyObject* entry(PyObject* self, PyObject* const* a, Py_ssize_t na) {
    if (na > 0 && g_torch_tensor && Py_TYPE(a[0]) == g_torch_tensor) return torch_fast(F, self, a, na);
    return F(self, a, na);
}

#define TO_FASTCALL(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&entry<f>))
// "name(args, /)\n--\n\n" is CPython's __text_signature__ form: inspect.signature() (and so
// mypy.stubtest) sees the positional-only parameters; __doc__ keeps "(args) -> y or None".
#define TO_DOC(name, args) name "(" args ", /)\n--\n\n(" args ") -> y (out when given) or None"
PyMethodDef g_fast_defs[] = {
    {"_fast_rms_norm", TO_FASTCALL(fast_rms_norm), METH_FASTCALL, TO_DOC("_fast_rms_norm", "x, weight, eps, out=None")},
    {"_fast_layer_norm", TO_FASTCALL(fast_layer_norm), METH_FASTCALL,
     TO_DOC("_fast_layer_norm", "x, weight, bias, eps, out=None")},
    {"_fast_rms_norm_stats", TO_FASTCALL(fast_rms_norm_stats), METH_FASTCALL,
     "_fast_rms_norm_stats(x, weight, eps, /)\n--\n\n(x, weight, eps) -> (y, rsigma) or None"},
    {"_fast_layer_norm_stats", TO_FASTCALL(fast_layer_norm_stats), METH_FASTCALL,
     "_fast_layer_norm_stats(x, weight, bias, eps, /)\n--\n\n(x, weight, bias, eps) -> (y, mu, rsigma) or None"},
    {"_fast_rms_norm_bwd", TO_FASTCALL(fast_rms_norm_bwd), METH_FASTCALL,
     "_fast_rms_norm_bwd(dy, x, rsigma, weight, /)\n--\n\n(dy, x, rsigma, weight) -> (dx, dweight) or None"},
    {"_fast_layer_norm_bwd", TO_FASTCALL(fast_layer_norm_bwd), METH_FASTCALL,
     "_fast_layer_norm_bwd(dy, x, mu, rsigma, weight, /)\n--\n\n(dy, x, mu, rsigma, weight) -> (dx, dweight, dbias) "
     "or None"},
    {"_fast_act_bwd", TO_FASTCALL(fast_act_bwd), METH_FASTCALL,
     "_fast_act_bwd(dy, x, act, /)\n--\n\n(dy, x, act) -> dy * act'(x) or None"},
    {"_fast_glu_bwd", TO_FASTCALL(fast_glu_bwd), METH_FASTCALL,
     "_fast_glu_bwd(dy, x, act, /)\n--\n\n(dy, x, act) -> dx of act(a) * b, x = [a | b], or None"},
    {"_fast_softmax_bwd", TO_FASTCALL(fast_softmax_bwd), METH_FASTCALL,
     "_fast_softmax_bwd(dy, y, scale, /)\n--\n\n(dy, y, scale) -> scale * y * (dy - sum(dy * y)) or None"},
    {"_fast_softmax", TO_FASTCALL(fast_softmax), METH_FASTCALL, TO_DOC("_fast_softmax", "x, axis, out=None")},
    {"_fast_silu", TO_FASTCALL((fast_unary<FO_SILU, UN_SILU>)), METH_FASTCALL, TO_DOC("_fast_silu", "x, out=None")},
    {"_fast_relu", TO_FASTCALL((fast_unary<FO_RELU, UN_RELU>)), METH_FASTCALL, TO_DOC("_fast_relu", "x, out=None")},
    {"_fast_gelu", TO_FASTCALL(fast_gelu), METH_FASTCALL, TO_DOC("_fast_gelu", "x, approximate, out=None")},
    {"_fast_swiglu", TO_FASTCALL(fast_swiglu), METH_FASTCALL, TO_DOC("_fast_swiglu", "x, out=None")},
    {"_fast_geglu", TO_FASTCALL(fast_geglu), METH_FASTCALL, TO_DOC("_fast_geglu", "x, approximate, out=None")},
    {"_fast_rope", TO_FASTCALL(fast_rope), METH_FASTCALL, TO_DOC("_fast_rope", "x, cos, sin, interleaved, out=None")},
    {"_fast_add_rms_norm", TO_FASTCALL(fast_add_rms_norm), METH_FASTCALL,
     TO_DOC("_fast_add_rms_norm", "x, residual, weight, eps, out=None")},
    {"_fast_add_layer_norm", TO_FASTCALL(fast_add_layer_norm), METH_FASTCALL,
     TO_DOC("_fast_add_layer_norm", "x, residual, weight, bias, eps, out=None")},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void register_fast(py::module_& m) {
    m.def("_fast_calls", []() {
        py::dict d;
        for (int i = 0; i < FO_COUNT; ++i) d[FAST_NAMES[i]] = g_fast_calls[i].load(std::memory_order_relaxed);
        return d;
    });
    py::object modname = m.attr("__name__");
    for (PyMethodDef* d = g_fast_defs; d->ml_name; ++d) {
        PyObject* f = PyCFunction_NewEx(d, nullptr, modname.ptr());
        if (!f) throw py::error_already_set();
        m.add_object(d->ml_name, py::reinterpret_steal<py::object>(f));
    }
}

}  // namespace to
