/* The CUDA C candidates' launch call, as a tiny CPython extension (built at first use by
 * tunekit.backends.fast_launch; see there for why).
 *
 *   launch(entry, function, grid, block, stream, *args) -> None
 *   launch_dependent(entry, function, grid, block, stream, *args) -> None
 *
 * entry:    the address of the driver's cuLaunchKernel (or a stand-in with its signature: the tests
 *           pass a recording one, so the argument packing is checked without a GPU);
 * function: a CUfunction handle; grid, block: 1-D sizes; stream: a CUstream handle (0 is the
 *           legacy default stream: the caller passes torch's current stream);
 * args:     the kernel's parameters, each an int (passed as 64 bits, negative ones as two's
 *           complement) or an object with data_ptr() (a tensor: its device address).
 *
 * launch_dependent: the same launch through cuLaunchKernelEx (entry: its address) with programmatic
 * stream serialization allowed, so the kernel may start before the previous kernel in the stream
 * ends (Hopper's programmatic dependent launch); the kernel must wait (griddepcontrol.wait) before
 * reading what that kernel wrote.
 *
 * launch_grid(entry, function, grid_x, grid_y, grid_z, block, shared, stream, *args) -> None
 *
 * The launch of a Triton-compiled kernel (tunekit.backends.triton_static): a 3-D grid, dynamic
 * shared memory of `shared` bytes, and up to MAX_GRID_ARGS parameters, each an int (64 bits), None
 * (a null pointer), a float (stored as float32: Triton passes Python floats as fp32 parameters) or
 * an object with data_ptr(). Each parameter sits in an 8-byte slot, so a 4-byte parameter reads
 * the slot's low half (little-endian hosts: x86-64 and aarch64).
 *
 * set_context_hook(hook) -> the previous hook (or None)
 *
 * hook:     None, or a callable of no arguments that the launches call after the driver refused one:
 *           it returns True when it made a context current in this thread (there was none: a
 *           thread whose first CUDA work is this launch), and the launch is then retried once. An
 *           exception in it is discarded (the launch's own error is reported). tunekit installs
 *           tunekit.backends.thread_context.launch_hook; the common path checks nothing.
 *
 * A driver error raises RuntimeError carrying the CUresult code. No CUDA header is needed: the
 * driver entry points are called through their documented C signatures, and cuLaunchKernelEx's
 * structs are declared here as cuda.h lays them out (tests/backends/test_fast_launch.py compiles
 * this file against cuda.h with TUNEKIT_CHECK_CUDA_H to check the layout).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FIXED_ARGS 5
#define MAX_KERNEL_ARGS 16
#define GRID_FIXED_ARGS 8
#define MAX_GRID_ARGS 64

typedef int (*launch_kernel_fn)(void *f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                unsigned int shared_bytes, void *stream, void **params, void **extra);

/* cuda.h's CUlaunchAttribute (an 8-byte id slot and a 64-byte value union) and CUlaunchConfig */
typedef struct {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char pad[64];
    int programmatic_stream_serialization_allowed;
  } value;
} launch_attribute;

typedef struct {
  unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  void *stream;
  launch_attribute *attrs;
  unsigned int num_attrs;
} launch_config;

#define PROGRAMMATIC_STREAM_SERIALIZATION 6 /* CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION */

typedef int (*launch_kernel_ex_fn)(const launch_config *config, void *f, void **params, void **extra);

#ifdef TUNEKIT_CHECK_CUDA_H
#include <cuda.h>
#include <stddef.h>
_Static_assert(sizeof(launch_attribute) == sizeof(CUlaunchAttribute), "CUlaunchAttribute size");
_Static_assert(offsetof(launch_attribute, value) == offsetof(CUlaunchAttribute, value), "CUlaunchAttribute.value");
_Static_assert(sizeof(launch_config) == sizeof(CUlaunchConfig), "CUlaunchConfig size");
_Static_assert(offsetof(launch_config, stream) == offsetof(CUlaunchConfig, hStream), "CUlaunchConfig.hStream");
_Static_assert(offsetof(launch_config, attrs) == offsetof(CUlaunchConfig, attrs), "CUlaunchConfig.attrs");
_Static_assert(offsetof(launch_config, num_attrs) == offsetof(CUlaunchConfig, numAttrs), "CUlaunchConfig.numAttrs");
_Static_assert(PROGRAMMATIC_STREAM_SERIALIZATION == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
               "attribute id");
#endif

static PyObject *data_ptr_name;
static PyObject *context_hook; /* see set_context_hook; NULL: none */

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

/* The parsed arguments of a launch; 0 on success, -1 with a Python error set. */
typedef struct {
  void *entry, *function, *stream;
  unsigned int grid, block;
  uint64_t values[MAX_KERNEL_ARGS];
  void *params[MAX_KERNEL_ARGS];
} launch_args;

static int parse(const char *name, PyObject *const *args, Py_ssize_t nargs, launch_args *out) {
  if (nargs < FIXED_ARGS || nargs > FIXED_ARGS + MAX_KERNEL_ARGS) {
    PyErr_Format(PyExc_TypeError, "%s(entry, function, grid, block, stream, *args) takes %d to %d arguments (%zd given)",
                 name, FIXED_ARGS, FIXED_ARGS + MAX_KERNEL_ARGS, nargs);
    return -1;
  }
  if (as_address(args[0], &out->entry) || as_address(args[1], &out->function) ||
      as_dim(args[2], "grid", &out->grid) || as_dim(args[3], "block", &out->block) ||
      as_address(args[4], &out->stream))
    return -1;
  if (out->entry == NULL || out->function == NULL) {
    PyErr_Format(PyExc_ValueError, "%s: null entry point or function", name);
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs - FIXED_ARGS; ++i) {
    if (as_value(args[FIXED_ARGS + i], &out->values[i])) return -1;
    out->params[i] = &out->values[i];
  }
  return 0;
}

/* After a refused launch: whether the hook made a context current (then the launch is retried). */
static int context_was_bound(void) {
  if (context_hook == NULL) return 0;
  PyObject *r = PyObject_CallNoArgs(context_hook);
  int yes = r == NULL ? 0 : PyObject_IsTrue(r);
  Py_XDECREF(r);
  if (yes < 0 || PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  return yes;
}

static PyObject *set_context_hook(PyObject *self, PyObject *hook) {
  (void)self;
  if (hook != Py_None && !PyCallable_Check(hook)) {
    PyErr_SetString(PyExc_TypeError, "set_context_hook: hook must be callable or None");
    return NULL;
  }
  PyObject *previous = context_hook ? context_hook : Py_NewRef(Py_None);
  context_hook = hook == Py_None ? NULL : Py_NewRef(hook);
  return previous; /* the reference the module held */
}

static PyObject *result(const char *what, int err) {
  if (err != 0) {
    PyErr_Format(PyExc_RuntimeError, "%s failed: CUresult %d", what, err);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  launch_args a;
  if (parse("launch", args, nargs, &a)) return NULL;
  const launch_kernel_fn entry = (launch_kernel_fn)a.entry;
  int err = entry(a.function, a.grid, 1, 1, a.block, 1, 1, 0, a.stream, a.params, NULL);
  if (err != 0 && context_was_bound()) err = entry(a.function, a.grid, 1, 1, a.block, 1, 1, 0, a.stream, a.params, NULL);
  return result("cuLaunchKernel", err);
}

static PyObject *launch_dependent(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  launch_args a;
  if (parse("launch_dependent", args, nargs, &a)) return NULL;
  launch_attribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmatic_stream_serialization_allowed = 1;
  const launch_config config = {a.grid, 1, 1, a.block, 1, 1, 0, a.stream, &attr, 1};
  const launch_kernel_ex_fn entry = (launch_kernel_ex_fn)a.entry;
  int err = entry(&config, a.function, a.params, NULL);
  if (err != 0 && context_was_bound()) err = entry(&config, a.function, a.params, NULL);
  return result("cuLaunchKernelEx", err);
}

/* launch_grid's parameter: an int, None, a float (as float32) or a tensor's data_ptr(). */
static int as_grid_value(PyObject *o, uint64_t *out) {
  if (o == Py_None) {
    *out = 0;
    return 0;
  }
  if (PyFloat_Check(o)) {
    float f = (float)PyFloat_AS_DOUBLE(o);
    *out = 0;
    memcpy(out, &f, sizeof f);
    return 0;
  }
  return as_value(o, out);
}

static PyObject *launch_grid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs < GRID_FIXED_ARGS || nargs > GRID_FIXED_ARGS + MAX_GRID_ARGS) {
    PyErr_Format(PyExc_TypeError,
                 "launch_grid(entry, function, grid_x, grid_y, grid_z, block, shared, stream, *args) takes %d to %d "
                 "arguments (%zd given)", GRID_FIXED_ARGS, GRID_FIXED_ARGS + MAX_GRID_ARGS, nargs);
    return NULL;
  }
  void *entry_address, *function, *stream;
  unsigned int grid[3], block, shared;
  if (as_address(args[0], &entry_address) || as_address(args[1], &function) || as_dim(args[2], "grid_x", &grid[0]) ||
      as_dim(args[3], "grid_y", &grid[1]) || as_dim(args[4], "grid_z", &grid[2]) || as_dim(args[5], "block", &block))
    return NULL;
  unsigned long shared_bytes = PyLong_AsUnsignedLong(args[6]);
  if (shared_bytes == (unsigned long)-1 && PyErr_Occurred()) return NULL;
  if (shared_bytes > 0xFFFFFFFFul) {
    PyErr_SetString(PyExc_ValueError, "launch_grid: shared must be below 2^32");
    return NULL;
  }
  shared = (unsigned int)shared_bytes;
  if (as_address(args[7], &stream)) return NULL;
  if (entry_address == NULL || function == NULL) {
    PyErr_SetString(PyExc_ValueError, "launch_grid: null entry point or function");
    return NULL;
  }
  uint64_t values[MAX_GRID_ARGS];
  void *params[MAX_GRID_ARGS];
  for (Py_ssize_t i = 0; i < nargs - GRID_FIXED_ARGS; ++i) {
    if (as_grid_value(args[GRID_FIXED_ARGS + i], &values[i])) return NULL;
    params[i] = &values[i];
  }
  const launch_kernel_fn entry = (launch_kernel_fn)entry_address;
  int err = entry(function, grid[0], grid[1], grid[2], block, 1, 1, shared, stream, params, NULL);
  if (err != 0 && context_was_bound()) err = entry(function, grid[0], grid[1], grid[2], block, 1, 1, shared, stream, params, NULL);
  return result("cuLaunchKernel", err);
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(entry, function, grid, block, stream, *args): call cuLaunchKernel (see the file's comment)"},
    {"launch_dependent", (PyCFunction)(void (*)(void))launch_dependent, METH_FASTCALL,
     "launch_dependent(entry, function, grid, block, stream, *args): call cuLaunchKernelEx with programmatic "
     "stream serialization (see the file's comment)"},
    {"launch_grid", (PyCFunction)(void (*)(void))launch_grid, METH_FASTCALL,
     "launch_grid(entry, function, grid_x, grid_y, grid_z, block, shared, stream, *args): a Triton kernel's "
     "launch through cuLaunchKernel (see the file's comment)"},
    {"set_context_hook", set_context_hook, METH_O,
     "set_context_hook(hook): called after a refused launch, True to retry it once (see the file's comment)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tunekit_fast_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_tunekit_fast_launch(void) {
  data_ptr_name = PyUnicode_InternFromString("data_ptr");
  if (data_ptr_name == NULL) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m != NULL && (PyModule_AddIntConstant(m, "MAX_KERNEL_ARGS", MAX_KERNEL_ARGS) < 0 ||
                    PyModule_AddIntConstant(m, "MAX_GRID_ARGS", MAX_GRID_ARGS) < 0)) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
