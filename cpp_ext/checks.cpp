// checks.cpp: array checks at the binding boundary (compiled once, baseline flags).
#include "checks.h"

namespace to {

int g_bf16_type_num = -1;
PyObject* g_bf16_descr = nullptr;

bool parse_bf16(const py::object& dtype) {
    if (dtype.is_none()) return false;
    if (py::isinstance<py::str>(dtype)) {
        std::string s = dtype.cast<std::string>();
        if (s == "bfloat16") return true;
        if (s == "float32" || s == "float16") return false;
    }
    throw py::value_error("dtype=" + py::repr(dtype).cast<std::string>() +
                          " is not accepted; use None or 'bfloat16' (int16/uint16 arrays then hold bfloat16 bits)");
}

Arr get(const py::handle& h, const char* name, bool bf16, int want_dt, bool writable) {
    PyObject* o = h.ptr();
    if (!py::detail::npy_api::get().PyArray_Check_(o))
        throw py::type_error(std::string(name) + " must be a numpy.ndarray, got " +
                             std::string(Py_TYPE(o)->tp_name));
    auto* p = proxy(o);
    const int num = py::detail::array_descriptor_proxy(p->descr)->type_num;
    int dt = -1;
    if (num == NPY_FLOAT_) dt = DT_F32;
    else if (num == NPY_HALF_) dt = DT_F16;
    else if (bf16 && (num == NPY_SHORT_ || num == NPY_USHORT_)) dt = DT_BF16;
    else if (num == g_bf16_type_num) dt = DT_BF16;  // ml_dtypes' bfloat16, recorded below (str(dtype) is a
                                                    // Python call: ~3 us a bfloat16 argument, every call)
    else {
        py::dtype d = py::reinterpret_borrow<py::dtype>(p->descr);
        if (d.itemsize() == 2 && py::str(d).cast<std::string>() == "bfloat16") {  // ml_dtypes
            dt = DT_BF16;
            if (!g_bf16_descr) {
                Py_INCREF(p->descr);
                g_bf16_descr = p->descr;
                g_bf16_type_num = num;
            }
        }
    }
    if (dt < 0 || (want_dt >= 0 && dt != want_dt)) {
        std::string got = py::str(py::reinterpret_borrow<py::object>(p->descr)).cast<std::string>();
        std::string acc = want_dt >= 0 ? std::string(DT_NAME[want_dt]) +
                                             (want_dt == DT_BF16 ? " (int16/uint16 bits with dtype='bfloat16')" : "")
                                       : std::string("float16, float32") +
                                             (bf16 ? ", int16/uint16 holding bfloat16" : " (or int16/uint16 bfloat16 bits with dtype='bfloat16')");
        throw py::type_error(std::string(name) + " has dtype " + got + "; accepted: " + acc +
                             ". float64 is served by the numpy backend");
    }
    const char bo = py::detail::array_descriptor_proxy(p->descr)->byteorder;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    const char foreign = '<';
#else
    const char foreign = '>';
#endif
    if (bo == foreign)
        throw py::value_error(std::string(name) + " has non-native byte order; pass " + name +
                              ".astype(" + name + ".dtype.newbyteorder('='))");
    if (!(p->flags & F_C))
        throw py::value_error(std::string(name) + " must be C-contiguous; pass np.ascontiguousarray(" + name + ")");
    if (!(p->flags & F_ALIGNED))
        throw py::value_error(std::string(name) + " is not aligned to its itemsize; pass a copy (np.array(" + name + "))");
    if (writable && !(p->flags & F_WRITEABLE))
        throw py::value_error(std::string(name) + " is read-only; pass a writable array");
    int64_t size = 1;
    for (int i = 0; i < p->nd; ++i) size *= p->dimensions[i];
    return Arr{o, p->data, p->nd, p->dimensions, size, dt};
}

void shape_error(const std::string& what) { throw py::value_error(what); }

std::string shape_str(const Arr& a) {
    std::string s = "(";
    for (int i = 0; i < a.nd; ++i) s += std::to_string(a.shape[i]) + (a.nd == 1 || i + 1 < a.nd ? "," : "");
    return s + ")";
}

bool same_shape(const Arr& a, const Arr& b) {
    if (a.nd != b.nd) return false;
    for (int i = 0; i < a.nd; ++i)
        if (a.shape[i] != b.shape[i]) return false;
    return true;
}

void rows_n(const Arr& a, const char* name, int64_t& rows, int64_t& n) {
    if (a.nd < 1) shape_error(std::string(name) + " must have at least one dimension, got a 0-d array");
    n = a.shape[a.nd - 1];
    rows = n ? a.size / n : 0;
}

void check_vec(const Arr& w, const char* name, int64_t n) {
    if (w.size != n)
        shape_error(std::string(name) + " has shape " + shape_str(w) + " but the last axis of x is " + std::to_string(n));
}

float* get_stats(const py::object& s, const char* name, int64_t rows) {
    if (s.is_none()) return nullptr;
    Arr a = get_f32(s, name, true);
    if (a.size != rows)
        shape_error(std::string(name) + " must hold one float32 per row (" + std::to_string(rows) + "), got shape " +
                    shape_str(a));
    return (float*)a.data;
}

}  // namespace to
