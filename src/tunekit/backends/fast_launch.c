/* The CUDA C candidates' launch call, as a tiny CPython extension (built at first use by
 * tunekit.backends.fast_launch; see there for why).
 *
 *   launch(entry, function, grid, block, stream, *args) -> None
 *
 * entry:    the address of the driver's cuLaunchKernel (or a stand-in with its signature: the tests
 *           pass a recording one, so the argument packing is checked without a GPU);
 * function: a CUfunction handle; grid, block: 1-D sizes; stream: a CUstream handle (0 is the
 *           legacy default stream: the caller passes torch's current stream);
 * args:     the kernel's parameters, each an int (passed as 64 bits, negative ones as two's
 *           complement) or an object with data_ptr() (a tensor: its device address).
 *
 * A driver error raises RuntimeError carrying the CUresult code. No CUDA header is needed: the
 * driver entry point is called through its documented C signature.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define FIXED_ARGS 5
#define MAX_KERNEL_ARGS 16

typedef int (*launch_kernel_fn)(void *f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                unsigned int shared_bytes, void *stream, void **params, void **extra);

static PyObject *data_ptr_name;

static int as_address(PyObject *o, void **out) {
  *out = PyLong_AsVoidPtr(o);
  return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int as_dim(PyObject *o, const char *what, unsigned int *out) {
  unsigned long v = PyLong_AsUnsignedLong(o);
  if (v == (unsigned long)-1 && PyErr_Occurred()) return -1;
  if (v == 0 || v > 0xFFFFFFFFul) {
    PyErr_Format(PyExc_ValueError, "launch: %s must be in [1, 2^32), got %lu", what, v);
    return -1;
  }
  *out = (unsigned int)v;
  return 0;
}

/* An int as 64 bits, or a tensor's data_ptr(). */
static int as_value(PyObject *o, uint64_t *out) {
  if (PyLong_Check(o)) {
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(o);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
  }
  PyObject *ptr = PyObject_CallMethodNoArgs(o, data_ptr_name);
  if (ptr == NULL) return -1;
  if (!PyLong_Check(ptr)) {
    Py_DECREF(ptr);
    PyErr_SetString(PyExc_TypeError, "launch: data_ptr() did not return an int");
    return -1;
  }
  *out = (uint64_t)PyLong_AsUnsignedLongLongMask(ptr);
  Py_DECREF(ptr);
  return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs < FIXED_ARGS || nargs > FIXED_ARGS + MAX_KERNEL_ARGS) {
    PyErr_Format(PyExc_TypeError, "launch(entry, function, grid, block, stream, *args) takes %d to %d arguments (%zd given)",
                 FIXED_ARGS, FIXED_ARGS + MAX_KERNEL_ARGS, nargs);
    return NULL;
  }
  void *entry, *function, *stream;
  unsigned int grid, block;
  if (as_address(args[0], &entry) || as_address(args[1], &function) || as_dim(args[2], "grid", &grid) ||
      as_dim(args[3], "block", &block) || as_address(args[4], &stream))
    return NULL;
  if (entry == NULL || function == NULL) {
    PyErr_SetString(PyExc_ValueError, "launch: null entry point or function");
    return NULL;
  }
  uint64_t values[MAX_KERNEL_ARGS];
  void *params[MAX_KERNEL_ARGS];
  const Py_ssize_t n = nargs - FIXED_ARGS;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (as_value(args[FIXED_ARGS + i], &values[i])) return NULL;
    params[i] = &values[i];
  }
  const int err = ((launch_kernel_fn)entry)(function, grid, 1, 1, block, 1, 1, 0, stream, params, NULL);
  if (err != 0) {
    PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed: CUresult %d", err);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(entry, function, grid, block, stream, *args): call cuLaunchKernel (see the file's comment)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tunekit_fast_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_tunekit_fast_launch(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  if (data_ptr_name == NULL) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m != NULL && PyModule_AddIntConstant(m, "MAX_KERNEL_ARGS", MAX_KERNEL_ARGS) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
