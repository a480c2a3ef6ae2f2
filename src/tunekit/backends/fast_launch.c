/* The cached call's host path in C, as a tiny CPython extension (built at first use by
 * tunekit.backends.fast_launch; see there for why). Two parts:
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
 *
 *   FastCall(runners, settings_var, context, tensor_type)(x[, extra]) -> result or None
 *
 * A tunable op's fast path (tunekit/tunable/tunable_op.py, where the same steps are written in
 * Python for when this extension is unavailable): for x of exactly tensor_type, not requiring
 * grad, contiguous, it builds the op's cache key (x.dtype, x.numel(), x.data_ptr() & 15, x.device)
 * (paired with extra when given: ((...), extra)), reads the settings (settings_var, else
 * context._defaults), and when they are enabled and runners[settings.cache_id] holds a runner for
 * the key, returns runner(x). Otherwise None (also when reading an attribute fails): the caller
 * takes its general path. Errors of the runner itself propagate.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
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

/* -- FastCall ----------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  PyObject *runners;      /* {settings.cache_id: {cache key: runner}}: the op's dict, cleared, never replaced */
  PyObject *settings_var; /* the ContextVar holding the current settings (or None) */
  PyObject *context;      /* the module whose _defaults are the settings when the variable holds none */
  PyObject *tensor_type;  /* torch.Tensor: subclasses take the general path */
  vectorcallfunc vectorcall;
} FastCall;

static PyObject *s_defaults, *s_enabled, *s_cache_id, *s_requires_grad, *s_is_contiguous, *s_dtype, *s_numel,
    *s_device;

/* The runner for x (a new reference), or NULL with no error set when there is none. */
static PyObject *find_runner(FastCall *self, PyObject *x, PyObject *extra) {
  if ((PyObject *)Py_TYPE(x) != self->tensor_type) return NULL;
  PyObject *s = NULL;
  if (PyContextVar_Get(self->settings_var, NULL, &s) < 0) return NULL;
  if (s == NULL || s == Py_None) {
    Py_XDECREF(s);
    s = PyObject_GetAttr(self->context, s_defaults);
    if (s == NULL) return NULL;
  }
  PyObject *enabled = PyObject_GetAttr(s, s_enabled);
  PyObject *cache_id = enabled == Py_True ? PyObject_GetAttr(s, s_cache_id) : NULL;
  Py_DECREF(s);
  Py_XDECREF(enabled);
  if (cache_id == NULL) return NULL;
  PyObject *table = PyDict_GetItemWithError(self->runners, cache_id); /* borrowed */
  Py_DECREF(cache_id);
  if (table == NULL || !PyDict_Check(table)) return NULL;
  Py_INCREF(table);
  PyObject *runner = NULL, *key = NULL, *dtype = NULL, *numel = NULL, *ptr = NULL, *align = NULL, *device = NULL;
  PyObject *flag = PyObject_GetAttr(x, s_requires_grad);
  if (flag != Py_True) {
    Py_XDECREF(flag);
    flag = flag == NULL ? NULL : PyObject_CallMethodNoArgs(x, s_is_contiguous);
    if (flag == Py_True && (dtype = PyObject_GetAttr(x, s_dtype)) && (numel = PyObject_CallMethodNoArgs(x, s_numel)) &&
        (ptr = PyObject_CallMethodNoArgs(x, data_ptr_name)) && PyLong_Check(ptr) &&
        (align = PyLong_FromUnsignedLongLong(PyLong_AsUnsignedLongLongMask(ptr) & 15u)) &&
        (device = PyObject_GetAttr(x, s_device)) && (key = PyTuple_Pack(4, dtype, numel, align, device))) {
      if (extra != NULL) {
        PyObject *pair = PyTuple_Pack(2, key, extra);
        Py_SETREF(key, pair);
      }
      if (key != NULL) {
        runner = PyDict_GetItemWithError(table, key);
        Py_XINCREF(runner);
      }
    }
  }
  Py_XDECREF(flag);
  Py_XDECREF(key);
  Py_XDECREF(dtype);
  Py_XDECREF(numel);
  Py_XDECREF(ptr);
  Py_XDECREF(align);
  Py_XDECREF(device);
  Py_DECREF(table);
  return runner;
}

static PyObject *fastcall_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "FastCall takes (x) or (x, extra)");
    return NULL;
  }
  PyObject *runner = find_runner((FastCall *)op, args[0], nargs == 2 ? args[1] : NULL);
  if (runner == NULL) {
    PyErr_Clear(); /* whatever failed (an odd tensor's attribute, a broken setting), the general path meets it again */
    Py_RETURN_NONE;
  }
  PyObject *result = PyObject_Vectorcall(runner, args, 1, NULL);
  Py_DECREF(runner);
  return result;
}

static PyObject *fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  PyObject *runners, *settings_var, *context, *tensor_type;
  static char *names[] = {"runners", "settings_var", "context", "tensor_type", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOO:FastCall", names, &PyDict_Type, &runners, &settings_var,
                                   &context, &tensor_type))
    return NULL;
  if (!PyContextVar_CheckExact(settings_var) || !PyType_Check(tensor_type)) {
    PyErr_SetString(PyExc_TypeError, "FastCall: settings_var must be a ContextVar and tensor_type a type");
    return NULL;
  }
  FastCall *self = (FastCall *)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  Py_INCREF(runners);
  Py_INCREF(settings_var);
  Py_INCREF(context);
  Py_INCREF(tensor_type);
  self->runners = runners;
  self->settings_var = settings_var;
  self->context = context;
  self->tensor_type = tensor_type;
  self->vectorcall = fastcall_call;
  return (PyObject *)self;
}

static int fastcall_traverse(FastCall *self, visitproc visit, void *arg) {
  Py_VISIT(self->runners);
  Py_VISIT(self->settings_var);
  Py_VISIT(self->context);
  Py_VISIT(self->tensor_type);
  return 0;
}

static int fastcall_clear(FastCall *self) {
  Py_CLEAR(self->runners);
  Py_CLEAR(self->settings_var);
  Py_CLEAR(self->context);
  Py_CLEAR(self->tensor_type);
  return 0;
}

static void fastcall_dealloc(FastCall *self) {
  PyObject_GC_UnTrack(self);
  fastcall_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tunekit_fast_launch.FastCall",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FastCall(runners, settings_var, context, tensor_type): a tunable op's fast path (see the file's comment)",
    .tp_new = fastcall_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_dealloc = (destructor)fastcall_dealloc,
};

/* -- module ------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(entry, function, grid, block, stream, *args): call cuLaunchKernel (see the file's comment)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tunekit_fast_launch", NULL, -1, methods};

static int intern_names(void) {
  struct {
    PyObject **slot;
    const char *text;
  } names[] = {{&data_ptr_name, "data_ptr"}, {&s_defaults, "_defaults"}, {&s_enabled, "enabled"},
               {&s_cache_id, "cache_id"}, {&s_requires_grad, "requires_grad"}, {&s_is_contiguous, "is_contiguous"},
               {&s_dtype, "dtype"}, {&s_numel, "numel"}, {&s_device, "device"}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
    *names[i].slot = PyUnicode_InternFromString(names[i].text);
    if (*names[i].slot == NULL) return -1;
  }
  return 0;
}

PyMODINIT_FUNC PyInit_tunekit_fast_launch(void) {
  if (intern_names() < 0 || PyType_Ready(&FastCallType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&FastCallType);
  if (PyModule_AddIntConstant(m, "MAX_KERNEL_ARGS", MAX_KERNEL_ARGS) < 0 ||
      PyModule_AddObject(m, "FastCall", (PyObject *)&FastCallType) < 0) {
    Py_DECREF(&FastCallType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
