// checks.h: array checks at the binding boundary (type, dtype, byte order, C-contiguity,
// alignment, writability, shape). Every refusal is a TypeError/ValueError naming the
// argument. The checks read NumPy's struct fields directly (no py::array_t conversions),
// which keeps a (1, 4096) call around a microsecond.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "kernels.h"

namespace to {

namespace py = pybind11;

constexpr int NPY_SHORT_ = 3, NPY_USHORT_ = 4, NPY_FLOAT_ = 11, NPY_HALF_ = 23;
constexpr int F_C = 0x0001, F_ALIGNED = 0x0100, F_WRITEABLE = 0x0400;
inline constexpr int ELSIZE[DT_COUNT] = {4, 2, 2};
inline constexpr const char* DT_NAME[DT_COUNT] = {"float32", "float16", "bfloat16"};

// A checked array: its data, shape and storage dtype index (DT_*).
struct Arr {
    PyObject* obj;
    char* data;
    int nd;
    const Py_intptr_t* shape;
    int64_t size;
    int dt;
};

inline py::detail::PyArray_Proxy* proxy(PyObject* o) { return py::detail::array_proxy(o); }

// NumPy's type number of ml_dtypes' bfloat16 (a user dtype, numbered at registration), or
// -1 until get() has seen one: the plain-call entries compare it instead of the dtype's name.
extern int g_bf16_type_num;
extern PyObject* g_bf16_descr;  // that dtype (a reference kept for the process), or nullptr

// dtype= of a call: None (float32/float16 arrays) or "bfloat16" (int16/uint16 arrays hold
// bfloat16 bits); anything else is a ValueError.
bool parse_bf16(const py::object& dtype);

// Type-check one array. want_dt >= 0 demands that dtype; bf16: int16/uint16 are bfloat16.
Arr get(const py::handle& h, const char* name, bool bf16, int want_dt = -1, bool writable = false);
inline Arr get_f32(const py::handle& h, const char* name, bool writable = false) {
    return get(h, name, false, DT_F32, writable);
}

[[noreturn]] void shape_error(const std::string& what);
std::string shape_str(const Arr& a);
bool same_shape(const Arr& a, const Arr& b);
// rows x n view of an array whose last axis is the feature axis.
void rows_n(const Arr& a, const char* name, int64_t& rows, int64_t& n);
// w must hold n elements (the last axis of x).
void check_vec(const Arr& w, const char* name, int64_t n);
// An optional float32 statistics output with one value per row (nullptr for None).
float* get_stats(const py::object& s, const char* name, int64_t rows);

}  // namespace to
