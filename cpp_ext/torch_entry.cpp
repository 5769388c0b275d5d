// torch_entry.cpp: torch CPU tensors on the plain-call entries (compiled once, baseline flags).
//
// The facade's plain-call entries (fast_entry.cpp) take NumPy arrays. A plain call on torch
// CPU tensors -- `to.rms_norm(x, w)` with x, w torch tensors -- would otherwise go through
// Python: `x.numpy()` and `w.numpy()` (~0.7 us each) and `torch.from_numpy` on the result,
// ~2 us on a (1, 4096) call whose kernel takes ~0.6 us. Here the tensors are read with a few
// attribute lookups each (data_ptr, shape, stride, dtype, is_cpu, requires_grad), viewed as
// NumPy arrays over the same memory, passed to the same entry, and the result comes back by
// torch.from_numpy. No libtorch is linked: tensor_ops/_torch_facade.py hands the module the
// torch objects it compares with (_set_torch) the first time a tensor reaches the facade.
//
// Tensor arguments may be torch.Tensor or nn.Parameter (exactly those types: a module's weight).
// Anything that is not plain (requires_grad while grad mode is on -- autograd must record the
// call; under torch.no_grad() a Parameter is plain --, not CPU,
// not C-contiguous, not aligned, empty, a dtype other than float32/float16/bfloat16, mixed
// with NumPy arrays, weights of another dtype) returns None: the Python path (the same
// validation and messages as NumPy input) takes it. An out= tensor is viewed like the others;
// the entry writes through its view and the call returns the tensor itself.
#include "binding.h"
#include "checks.h"

namespace to {

PyTypeObject* g_torch_tensor = nullptr;

namespace {

PyObject* g_dt[DT_COUNT] = {nullptr, nullptr, nullptr};  // torch.float32, float16, bfloat16
PyTypeObject* g_parameter = nullptr;                      // torch.nn.Parameter (optional)
PyObject* g_grad_enabled = nullptr;                       // torch.is_grad_enabled (optional)
PyObject* g_from_numpy = nullptr;
PyObject *s_requires_grad, *s_is_cpu, *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_view, *s_is_neg;

PyObject* declined() { Py_RETURN_NONE; }

bool attr_is_true(PyObject* t, PyObject* name, bool& value) {
    PyObject* v = PyObject_GetAttr(t, name);
    if (!v) return false;
    value = v == Py_True;
    Py_DECREF(v);
    return true;
}

// Whether t's negative bit is set (or cannot be read): its memory holds -value (`z.conj().imag`,
// torch._neg_view), so a view of its memory is not a view of its values.
bool negative(PyObject* t) {
    PyObject* neg = PyObject_CallMethodNoArgs(t, s_is_neg);
    if (!neg) return true;
    Py_DECREF(neg);
    return neg != Py_False;
}

bool is_tensor(PyObject* o) {
    const PyTypeObject* t = Py_TYPE(o);
    return t == g_torch_tensor || (g_parameter && t == g_parameter);
}

// Whether a tensor that requires grad may be viewed: only with grad mode off (asked once per
// call: grad is -1 until then, then 0 or 1; without torch.is_grad_enabled, never).
bool grad_off(int& grad) {
    if (grad < 0) {
        PyObject* on = g_grad_enabled ? PyObject_CallNoArgs(g_grad_enabled) : nullptr;
        grad = on == Py_False ? 0 : 1;
        Py_XDECREF(on);
        PyErr_Clear();
    }
    return grad == 0;
}

// _torch_views(*args): the torch facade's general path (tensor_ops/_torch_facade.py host())
// on NumPy views made here instead of by `t.numpy()` (~2 us each in torch 2.13, three per
// call). Each CPU tensor of float32/float16/bfloat16 with at least one element becomes a
// NumPy view of its memory with its strides (any layout) whose base is the tensor (the view
// keeps it alive); None, bool, int, float and str pass through. Anything else -- a tensor on
// another device, of another dtype, with its negative bit set (its memory is not its value),
// empty, a NumPy or other array mixed in -- makes the whole call return None: the Python
// path then names the argument and converts it. requires_grad is not looked at: the caller
// reaches this only when autograd does not record the call.
PyObject* view_any(PyObject* t, int& tdt) {
    auto& api = py::detail::npy_api::get();
    bool flag = false;
    if (!attr_is_true(t, s_is_cpu, flag) || !flag || negative(t)) return nullptr;
    PyObject* d = PyObject_GetAttr(t, s_dtype);
    if (!d) return nullptr;
    tdt = -1;
    for (int i = 0; i < DT_COUNT; ++i)
        if (d == g_dt[i]) tdt = i;
    Py_DECREF(d);
    if (tdt < 0 || (tdt == DT_BF16 && !g_bf16_descr)) return nullptr;
    PyObject* shape = PyObject_GetAttr(t, s_shape);
    PyObject* stride = shape ? PyObject_CallMethodNoArgs(t, s_stride) : nullptr;
    PyObject* ptr = stride ? PyObject_CallMethodNoArgs(t, s_data_ptr) : nullptr;
    PyObject* out = nullptr;
    if (ptr && PyTuple_Check(shape) && PyTuple_Check(stride) && PyTuple_GET_SIZE(shape) == PyTuple_GET_SIZE(stride)) {
        const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
        Py_intptr_t dims[32], strides[32];
        bool ok = nd <= 32;
        for (Py_ssize_t i = 0; ok && i < nd; ++i) {
            const long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
            const long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
            ok = n > 0 && s >= 0 && s < (1LL << 48);
            dims[i] = (Py_intptr_t)n;
            strides[i] = (Py_intptr_t)(s * ELSIZE[tdt]);
        }
        void* p = PyLong_AsVoidPtr(ptr);
        if (ok && p && !PyErr_Occurred()) {
            PyObject* descr = tdt == DT_F32   ? api.PyArray_DescrFromType_(NPY_FLOAT_)
                              : tdt == DT_F16 ? api.PyArray_DescrFromType_(NPY_HALF_)
                                              : (Py_INCREF(g_bf16_descr), g_bf16_descr);
            // given strides, NumPy derives the contiguity and alignment flags itself
            out = descr ? api.PyArray_NewFromDescr_(api.PyArray_Type_, descr, (int)nd, dims, strides, p,
                                                    py::detail::npy_api::NPY_ARRAY_WRITEABLE_, nullptr)
                        : nullptr;
            if (out) {
                Py_INCREF(t);
                if (api.PyArray_SetBaseObject_(out, t) < 0) {  // steals t's reference even on failure
                    Py_CLEAR(out);
                }
            }
        }
    }
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(ptr);
    return out;
}

// A NumPy view of a plain CPU tensor for an entry (new reference), or nullptr (an error is
// never left set): view_any's view, which must also be C-contiguous, aligned and >= 1-D.
// dt: -1 to take the tensor's dtype (set on success), else the dtype it must have.
PyObject* view_of(PyObject* t, int& dt, int& grad) {
    bool flag = false;
    int tdt = -1;
    PyObject* v = nullptr;
    if (attr_is_true(t, s_requires_grad, flag) && (!flag || grad_off(grad))) v = view_any(t, tdt);
    PyErr_Clear();
    if (!v) return nullptr;
    const auto* pv = py::detail::array_proxy(v);
    const int need = py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_ | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
    if ((dt >= 0 && tdt != dt) || pv->nd < 1 || (pv->flags & need) != need) {
        Py_DECREF(v);
        return nullptr;
    }
    dt = tdt;
    return v;
}

// torch.from_numpy(r) (bfloat16: through an int16 view, then .view(torch.bfloat16)); steals r.
PyObject* as_tensor(PyObject* r, int dt) {
    auto& api = py::detail::npy_api::get();
    if (dt == DT_BF16) {
        PyObject* v = api.PyArray_View_(r, api.PyArray_DescrFromType_(NPY_SHORT_), nullptr);
        Py_DECREF(r);
        if (!v) return nullptr;
        r = v;
    }
    PyObject* t = PyObject_CallOneArg(g_from_numpy, r);
    Py_DECREF(r);
    if (!t || dt != DT_BF16) return t;
    PyObject* b = PyObject_CallMethodOneArg(t, s_view, g_dt[DT_BF16]);
    Py_DECREF(t);
    return b;
}

// The dtype of one array of an entry's tuple: the fused add + norm's pair have x's, the norms'
// statistics (_fast_rms_norm_stats & co.) are float32 whatever x is.
int result_dt(PyObject* e, int dt) {
    const auto* d = py::detail::array_descriptor_proxy(py::detail::array_proxy(e)->descr);
    return d->type_num == NPY_FLOAT_ ? DT_F32 : dt;
}

void set_torch(const py::object& tensor, const py::object& f32, const py::object& f16, const py::object& bf16,
               const py::object& from_numpy, const py::object& numpy_bf16, const py::object& parameter,
               const py::object& is_grad_enabled) {
    if (!PyType_Check(tensor.ptr())) throw py::type_error("tensor must be torch.Tensor (a type)");
    if (!parameter.is_none() && !PyType_Check(parameter.ptr()))
        throw py::type_error("parameter must be torch.nn.Parameter (a type) or None");
    if (!numpy_bf16.is_none() && !g_bf16_descr) {  // ml_dtypes' bfloat16, as checks.cpp would record it
        py::dtype d = py::dtype::from_args(numpy_bf16);
        if (d.itemsize() != 2) throw py::value_error("numpy_bfloat16 must be ml_dtypes' bfloat16 dtype");
        Py_INCREF(d.ptr());
        g_bf16_descr = d.ptr();
        g_bf16_type_num = py::detail::array_descriptor_proxy(d.ptr())->type_num;
    }
    auto keep = [](const py::object& o) { Py_INCREF(o.ptr()); return o.ptr(); };  // for the process
    g_dt[DT_F32] = keep(f32);
    g_dt[DT_F16] = keep(f16);
    g_dt[DT_BF16] = keep(bf16);
    g_from_numpy = keep(from_numpy);
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    s_is_cpu = PyUnicode_InternFromString("is_cpu");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_shape = PyUnicode_InternFromString("shape");
    s_stride = PyUnicode_InternFromString("stride");
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_view = PyUnicode_InternFromString("view");
    s_is_neg = PyUnicode_InternFromString("is_neg");
    if (!parameter.is_none()) g_parameter = (PyTypeObject*)keep(parameter);
    if (!is_grad_enabled.is_none()) g_grad_enabled = keep(is_grad_enabled);
    g_torch_tensor = (PyTypeObject*)keep(tensor);  // last: the entries look at it first
}

}  // namespace

PyObject* torch_fast(FastEntry f, PyObject* self, PyObject* const* a, Py_ssize_t na) {
    PyObject* views[8];
    if (na > 8) return declined();
    int dt = -1, grad = -1;
    for (Py_ssize_t i = 0; i < na; ++i) {  // a call autograd must record declines before any view is made
        bool rg = false;
        if (is_tensor(a[i]) && (!attr_is_true(a[i], s_requires_grad, rg) || (rg && !grad_off(grad)))) {
            PyErr_Clear();
            return declined();
        }
    }
    Py_ssize_t made = 0;
    bool ok = true;
    for (; ok && made < na; ++made) {
        PyObject* o = a[made];
        if (is_tensor(o)) {
            int own = -1;  // x's dtype is the result's; the rest keep theirs (each entry checks them)
            views[made] = view_of(o, made == 0 ? dt : own, grad);
            ok = views[made] != nullptr;
        } else if (py::detail::npy_api::get().PyArray_Check_(o)) {
            ok = false;  // NumPy mixed with torch: the Python path names the argument
            views[made] = nullptr;
        } else {
            Py_INCREF(o);
            views[made] = o;
        }
    }
    PyObject* r = ok ? f(self, views, na) : nullptr;
    PyObject* given = nullptr;  // out=: the entry returned the view of a tensor argument -> that tensor
    for (Py_ssize_t i = 0; ok && r && i < na; ++i)
        if (r == views[i] && is_tensor(a[i])) given = a[i];
    for (Py_ssize_t i = 0; i < made; ++i) Py_XDECREF(views[i]);
    if (!ok) return declined();
    if (given) {
        Py_DECREF(r);
        Py_INCREF(given);
        return given;
    }
    if (!r || r == Py_None) return r;
    if (!PyTuple_CheckExact(r)) return as_tensor(r, dt);
    const Py_ssize_t k = PyTuple_GET_SIZE(r);  // the fused add + norm's (normed, sum), the norms' stats
    PyObject* t = PyTuple_New(k);
    for (Py_ssize_t i = 0; t && i < k; ++i) {
        PyObject* e = PyTuple_GET_ITEM(r, i);
        Py_INCREF(e);
        PyObject* te = as_tensor(e, result_dt(e, dt));
        if (!te) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i, te);
    }
    Py_DECREF(r);
    return t;
}

namespace {

PyObject* torch_views(PyObject*, PyObject* const* a, Py_ssize_t na) {
    if (!g_torch_tensor) Py_RETURN_NONE;
    PyObject* r = PyTuple_New(na);
    if (!r) return nullptr;
    for (Py_ssize_t i = 0; i < na; ++i) {
        PyObject* o = a[i];
        PyObject* v = nullptr;
        if (PyObject_TypeCheck(o, g_torch_tensor)) {
            int tdt = -1;
            v = view_any(o, tdt);
        } else if (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
                   PyUnicode_CheckExact(o)) {
            Py_INCREF(o);
            v = o;
        }
        if (!v) {
            PyErr_Clear();
            Py_DECREF(r);
            Py_RETURN_NONE;
        }
        PyTuple_SET_ITEM(r, i, v);
    }
    return r;
}

PyMethodDef g_views_def = {"_torch_views", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&torch_views)),
                           METH_FASTCALL,
                           "_torch_views(*args)\n--\n\nargs with each torch CPU tensor as a NumPy view of it, or None "
                           "(see torch_entry.cpp)"};

}  // namespace

void register_torch(py::module_& m) {
    using namespace pybind11::literals;
    PyObject* f = PyCFunction_NewEx(&g_views_def, nullptr, m.attr("__name__").ptr());
    if (!f) throw py::error_already_set();
    m.add_object("_torch_views", py::reinterpret_steal<py::object>(f));
    m.def("_set_torch", &set_torch, "tensor"_a, "float32"_a, "float16"_a, "bfloat16"_a, "from_numpy"_a,
          "numpy_bfloat16"_a = py::none(), "parameter"_a = py::none(), "is_grad_enabled"_a = py::none(),
          "Let the plain-call entries take torch CPU tensors (tensor_ops/_torch_facade.py calls it once).");
}

}  // namespace to
