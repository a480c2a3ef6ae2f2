// A tunable op's cached call in C++, as a small CPython extension against libtorch (built at first
// use by tunekit.backends.fast_call; see there for why). Two types:
//
//   FastCall(runners, settings_var, context, tensor_type, differentiable=frozenset(), recorder=None)(x[, extra])
//
// The fast path of tunekit/tunable/fast_path.py (which has the same steps in Python, used when this
// cannot be built): for x of exactly tensor_type, contiguous, with no forward-mode tangent (a
// torch.func transform's wrapped tensor has no data pointer: refused too), not requiring grad unless the runner
// is one of `differentiable` (torch's own function: its result and autograd node), the cache key
// (x.dtype, x.numel(), x.data_ptr() & 15, x.device) (paired with extra when given: ((...), extra)),
// the settings (settings_var, else context._defaults), and when they are enabled and
// runners[settings.cache_id] holds a runner for the key, runner(x). Otherwise None (also when
// reading anything fails): the caller takes its general path. The runner's own errors propagate.
// recorder: a list whose item 0, once not None (fast_grad.cpp's silu_call / gelu_call), lets x requiring
// grad take any runner, as recorder[0](runner, x[, extra]): the runner with grad mode off and torch's
// own node for its result (through the op's Python function and fast_grad's GradCall, ~5 us more host
// time per forward + backward than F.gelu's, H100 host).
// The tensor's fields are read from the at::Tensor itself: read through torch's Python accessors (a
// C version's only way), they keep a cached call's host time above F.silu's.
//
//   Launcher(entry, function, grid, block, n, device_index, stream_fn)(x) -> out
//
// A CUDA C elementwise kernel's runner: out = at::empty_like(x), then the driver's cuLaunchKernel
// (entry: its address, or a stand-in with its C signature in the tests) of `function` on
// stream_fn(device_index) (torch's current raw stream) with the arguments (x, out, n), with x's
// device current for the launch (a device guard: the driver launches in the current context).
//
//   set_context_hook(hook) -> the previous hook (or None)
//
// hook: None, or a callable of no arguments the Launcher calls after the driver refused a launch;
// True when it made a context current in this thread (there was none: a thread whose first CUDA
// work is this launch), and the launch is then retried once. Its exceptions are discarded (the
// launch's error is reported). tunekit installs tunekit.backends.thread_context.launch_hook.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

namespace {

typedef int (*launch_kernel_fn)(void* f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                unsigned int shared_bytes, void* stream, void** params, void** extra);

PyObject *s_defaults, *s_enabled, *s_cache_id;
PyObject* context_hook = nullptr;  // see set_context_hook

// After a refused launch: whether the hook made a context current (then the launch is retried).
bool context_was_bound() {
  if (context_hook == nullptr) return false;
  PyObject* r = PyObject_CallNoArgs(context_hook);
  const int yes = r == nullptr ? 0 : PyObject_IsTrue(r);
  Py_XDECREF(r);
  if (yes < 0 || PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return yes != 0;
}

PyObject* set_context_hook(PyObject*, PyObject* hook) {
  if (hook != Py_None && !PyCallable_Check(hook)) {
    PyErr_SetString(PyExc_TypeError, "set_context_hook: hook must be callable or None");
    return nullptr;
  }
  PyObject* previous = context_hook != nullptr ? context_hook : Py_NewRef(Py_None);
  context_hook = hook == Py_None ? nullptr : Py_NewRef(hook);
  return previous;  // the reference the module held
}

// -- FastCall ---------------------------------------------------------------------------------------

struct FastCall {
  PyObject_HEAD
  PyObject* runners;       // {settings.cache_id: {cache key: runner}}: the op's dict, cleared, never replaced
  PyObject* settings_var;  // the ContextVar holding the current settings (or None)
  PyObject* context;       // the module whose _defaults are the settings when the variable holds none
  PyObject* tensor_type;   // torch.Tensor: subclasses take the general path
  PyObject* differentiable;  // a frozenset of the runners that may take a tensor requiring grad
  PyObject* recorder;        // a list: [None] or [the recorder of torch's node], or nullptr
  vectorcallfunc vectorcall;
};

// The runners of the current settings (a new reference), or nullptr.
PyObject* current_runners(FastCall* self) {
  PyObject* s = nullptr;
  if (PyContextVar_Get(self->settings_var, nullptr, &s) < 0) return nullptr;
  if (s == nullptr || s == Py_None) {
    Py_XDECREF(s);
    s = PyObject_GetAttr(self->context, s_defaults);
    if (s == nullptr) return nullptr;
  }
  PyObject* enabled = PyObject_GetAttr(s, s_enabled);
  PyObject* cache_id = enabled == Py_True ? PyObject_GetAttr(s, s_cache_id) : nullptr;
  Py_DECREF(s);
  Py_XDECREF(enabled);
  if (cache_id == nullptr) return nullptr;
  PyObject* table = PyDict_GetItemWithError(self->runners, cache_id);  // borrowed
  Py_DECREF(cache_id);
  if (table == nullptr || !PyDict_Check(table)) return nullptr;
  Py_INCREF(table);
  return table;
}

// The cache key of x, or nullptr when x does not take the fast path; *grad: x requires grad.
PyObject* cache_key(PyObject* x, PyObject* extra, bool* grad) {
  const at::Tensor& t = THPVariable_Unpack(x);
  if (!t.defined() || !t.is_contiguous() || t._fw_grad(0).defined()) return nullptr;  // a tangent: torch's function
  *grad = t.requires_grad();
  const auto address = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));  // borrowed
  PyObject* numel = PyLong_FromLongLong(t.numel());
  PyObject* align = PyLong_FromUnsignedLong(static_cast<unsigned long>(address & 15u));
  PyObject* device = THPDevice_New(t.device());
  PyObject* key = numel && align && device ? PyTuple_Pack(4, dtype, numel, align, device) : nullptr;
  Py_XDECREF(numel);
  Py_XDECREF(align);
  Py_XDECREF(device);
  if (key != nullptr && extra != nullptr) {
    PyObject* pair = PyTuple_Pack(2, key, extra);
    Py_SETREF(key, pair);
  }
  return key;
}

PyObject* fastcall_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) || nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "FastCall takes (x) or (x, extra)");
    return nullptr;
  }
  auto* self = reinterpret_cast<FastCall*>(op);
  PyObject* x = args[0];
  if (reinterpret_cast<PyObject*>(Py_TYPE(x)) != self->tensor_type) Py_RETURN_NONE;
  PyObject* runner = nullptr;
  PyObject* recorder = nullptr;
  PyObject* table = current_runners(self);
  if (table != nullptr) {
    try {
      bool grad = false;
      PyObject* key = cache_key(x, nargs == 2 ? args[1] : nullptr, &grad);
      if (key != nullptr) {
        runner = PyDict_GetItemWithError(table, key);
        Py_XINCREF(runner);  // before PySet_Contains, which may run Python code
        Py_DECREF(key);
      }
      if (runner != nullptr && grad) {
        const int named = PySet_Contains(self->differentiable, runner);  // -1: an error, cleared below
        if (named == 0 && self->recorder != nullptr && PyList_GET_SIZE(self->recorder) > 0)
          recorder = PyList_GET_ITEM(self->recorder, 0) == Py_None ? nullptr : Py_NewRef(PyList_GET_ITEM(self->recorder, 0));
        if (named != 1 && recorder == nullptr) Py_CLEAR(runner);
      }
    } catch (...) {  // a tensor torch cannot describe here (a transform's wrapper): the general path meets it
      Py_CLEAR(runner);
      Py_CLEAR(recorder);
    }
    Py_DECREF(table);
  }
  if (runner == nullptr) {
    PyErr_Clear();  // whatever failed, the general path meets it again
    Py_RETURN_NONE;
  }
  PyObject* with_runner[3] = {runner, args[0], nargs == 2 ? args[1] : nullptr};
  PyObject* result = recorder != nullptr ? PyObject_Vectorcall(recorder, with_runner, nargs + 1, nullptr)
                                         : PyObject_Vectorcall(runner, args, 1, nullptr);
  Py_DECREF(runner);
  Py_XDECREF(recorder);
  return result;
}

PyObject* fastcall_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *runners, *settings_var, *context, *tensor_type, *differentiable = nullptr, *recorder = nullptr;
  static const char* names[] = {"runners", "settings_var", "context", "tensor_type", "differentiable", "recorder",
                                nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOO|O!O!:FastCall", const_cast<char**>(names), &PyDict_Type,
                                   &runners, &settings_var, &context, &tensor_type, &PyFrozenSet_Type, &differentiable,
                                   &PyList_Type, &recorder))
    return nullptr;
  differentiable = differentiable != nullptr ? Py_NewRef(differentiable) : PyFrozenSet_New(nullptr);
  if (differentiable == nullptr) return nullptr;
  if (!PyContextVar_CheckExact(settings_var) || !PyType_Check(tensor_type) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(tensor_type), reinterpret_cast<PyTypeObject*>(THPVariableClass))) {
    PyErr_SetString(PyExc_TypeError, "FastCall: settings_var must be a ContextVar and tensor_type torch.Tensor");
    Py_DECREF(differentiable);
    return nullptr;
  }
  auto* self = reinterpret_cast<FastCall*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    Py_DECREF(differentiable);
    return nullptr;
  }
  self->differentiable = differentiable;  // the reference taken above
  self->recorder = Py_XNewRef(recorder);
  for (PyObject* o : {runners, settings_var, context, tensor_type}) Py_INCREF(o);
  self->runners = runners;
  self->settings_var = settings_var;
  self->context = context;
  self->tensor_type = tensor_type;
  self->vectorcall = fastcall_call;
  return reinterpret_cast<PyObject*>(self);
}

int fastcall_traverse(FastCall* self, visitproc visit, void* arg) {
  Py_VISIT(self->runners);
  Py_VISIT(self->settings_var);
  Py_VISIT(self->context);
  Py_VISIT(self->tensor_type);
  Py_VISIT(self->differentiable);
  Py_VISIT(self->recorder);
  return 0;
}

int fastcall_clear(FastCall* self) {
  Py_CLEAR(self->runners);
  Py_CLEAR(self->settings_var);
  Py_CLEAR(self->context);
  Py_CLEAR(self->tensor_type);
  Py_CLEAR(self->differentiable);
  Py_CLEAR(self->recorder);
  return 0;
}

void fastcall_dealloc(FastCall* self) {
  PyObject_GC_UnTrack(self);
  fastcall_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject FastCallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -- Launcher ---------------------------------------------------------------------------------------

struct Launcher {
  PyObject_HEAD
  launch_kernel_fn entry;
  void* function;
  unsigned int grid, block;
  long long n;
  PyObject* device_index;  // an int, passed to stream_fn
  PyObject* stream_fn;
  vectorcallfunc vectorcall;
};

PyObject* launcher_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<Launcher*>(op);
  if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) || PyVectorcall_NARGS(nargsf) != 1 ||
      !THPVariable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "Launcher takes one tensor");
    return nullptr;
  }
  at::Tensor out;
  void* x_ptr;
  c10::OptionalDeviceGuard guard;
  try {
    const at::Tensor& x = THPVariable_Unpack(args[0]);
    const c10::Device device = x.device();  // switched only when another device is current
    if (device.is_cuda() && c10::impl::getDeviceGuardImpl(device.type())->getDevice() != device) guard.reset_device(device);
    out = at::empty_like(x);
    x_ptr = x.data_ptr();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  PyObject* stream = PyObject_Vectorcall(self->stream_fn, &self->device_index, 1, nullptr);
  if (stream == nullptr) return nullptr;
  void* stream_handle = PyLong_AsVoidPtr(stream);
  Py_DECREF(stream);
  if (stream_handle == nullptr && PyErr_Occurred()) return nullptr;
  std::uint64_t values[3] = {reinterpret_cast<std::uintptr_t>(x_ptr), reinterpret_cast<std::uintptr_t>(out.data_ptr()),
                             static_cast<std::uint64_t>(self->n)};
  void* params[3] = {&values[0], &values[1], &values[2]};
  int err = self->entry(self->function, self->grid, 1, 1, self->block, 1, 1, 0, stream_handle, params, nullptr);
  if (err != 0 && context_was_bound())
    err = self->entry(self->function, self->grid, 1, 1, self->block, 1, 1, 0, stream_handle, params, nullptr);
  if (err != 0) {
    PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed: CUresult %d", err);
    return nullptr;
  }
  return THPVariable_Wrap(std::move(out));
}

PyObject* launcher_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *entry, *function, *device_index, *stream_fn;
  unsigned int grid, block;
  long long n;
  static const char* names[] = {"entry", "function", "grid", "block", "n", "device_index", "stream_fn", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOIILO!O:Launcher", const_cast<char**>(names), &entry, &function,
                                   &grid, &block, &n, &PyLong_Type, &device_index, &stream_fn))
    return nullptr;
  void* entry_address = PyLong_AsVoidPtr(entry);
  void* function_address = PyLong_AsVoidPtr(function);
  if (PyErr_Occurred()) return nullptr;
  if (entry_address == nullptr || function_address == nullptr || grid == 0 || block == 0 || n < 0 ||
      !PyCallable_Check(stream_fn)) {
    PyErr_SetString(PyExc_ValueError, "Launcher: null entry or function, empty grid or block, or bad n / stream_fn");
    return nullptr;
  }
  auto* self = reinterpret_cast<Launcher*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->entry = reinterpret_cast<launch_kernel_fn>(entry_address);
  self->function = function_address;
  self->grid = grid;
  self->block = block;
  self->n = n;
  Py_INCREF(device_index);
  Py_INCREF(stream_fn);
  self->device_index = device_index;
  self->stream_fn = stream_fn;
  self->vectorcall = launcher_call;
  return reinterpret_cast<PyObject*>(self);
}

int launcher_traverse(Launcher* self, visitproc visit, void* arg) {
  Py_VISIT(self->device_index);
  Py_VISIT(self->stream_fn);
  return 0;
}

int launcher_clear(Launcher* self) {
  Py_CLEAR(self->device_index);
  Py_CLEAR(self->stream_fn);
  return 0;
}

void launcher_dealloc(Launcher* self) {
  PyObject_GC_UnTrack(self);
  launcher_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject LauncherType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// -- module -----------------------------------------------------------------------------------------

PyMethodDef module_methods[] = {
    {"set_context_hook", set_context_hook, METH_O,
     "set_context_hook(hook): called after a refused launch, True to retry it once (see the file's comment)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tunekit_fast_call", nullptr, -1, module_methods};

int ready_types() {
  FastCallType.tp_name = "tunekit_fast_call.FastCall";
  FastCallType.tp_basicsize = sizeof(FastCall);
  FastCallType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  FastCallType.tp_doc = "FastCall(runners, settings_var, context, tensor_type, differentiable=frozenset(), recorder=None): see fast_call.cpp";
  FastCallType.tp_new = fastcall_new;
  FastCallType.tp_call = PyVectorcall_Call;
  FastCallType.tp_vectorcall_offset = offsetof(FastCall, vectorcall);
  FastCallType.tp_traverse = reinterpret_cast<traverseproc>(fastcall_traverse);
  FastCallType.tp_clear = reinterpret_cast<inquiry>(fastcall_clear);
  FastCallType.tp_dealloc = reinterpret_cast<destructor>(fastcall_dealloc);
  LauncherType.tp_name = "tunekit_fast_call.Launcher";
  LauncherType.tp_basicsize = sizeof(Launcher);
  LauncherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  LauncherType.tp_doc = "Launcher(entry, function, grid, block, n, device_index, stream_fn): a CUDA C runner";
  LauncherType.tp_new = launcher_new;
  LauncherType.tp_call = PyVectorcall_Call;
  LauncherType.tp_vectorcall_offset = offsetof(Launcher, vectorcall);
  LauncherType.tp_traverse = reinterpret_cast<traverseproc>(launcher_traverse);
  LauncherType.tp_clear = reinterpret_cast<inquiry>(launcher_clear);
  LauncherType.tp_dealloc = reinterpret_cast<destructor>(launcher_dealloc);
  return PyType_Ready(&FastCallType) < 0 || PyType_Ready(&LauncherType) < 0 ? -1 : 0;
}

}  // namespace

PyMODINIT_FUNC PyInit_tunekit_fast_call(void) {
  s_defaults = PyUnicode_InternFromString("_defaults");
  s_enabled = PyUnicode_InternFromString("enabled");
  s_cache_id = PyUnicode_InternFromString("cache_id");
  if (!s_defaults || !s_enabled || !s_cache_id || ready_types() < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&FastCallType);
  Py_INCREF(&LauncherType);
  if (PyModule_AddObject(m, "FastCall", reinterpret_cast<PyObject*>(&FastCallType)) < 0 ||
      PyModule_AddObject(m, "Launcher", reinterpret_cast<PyObject*>(&LauncherType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
