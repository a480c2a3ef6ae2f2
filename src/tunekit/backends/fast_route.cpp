// Whether tunekit may take a call of one of torch's functions (tunekit/ops/_shared/routing.py's rule),
// in C++: a small CPython extension against libtorch, built at first use by
// tunekit.backends.fast_route (as fast_call.cpp is). Two functions:
//
//   configure(tensor_type, state, forward_ad, peek_interpreter_stack)
//   takes(x) -> bool
//
// takes: routing.takes's checks after torch.compiler.is_compiling() (which stays in Python: dynamo
// folds it, and must never meet this function), in its order: type(x) is exactly tensor_type
// (torch.Tensor); dtype float16 / bfloat16 / float32 / float64; strided; on the CPU or a CUDA device;
// state.inside false (routing's thread-local "inside tunekit" flag); no torch-function mode and no
// torch-dispatch mode active; no functorch transform (vmap, grad, ...: peek_interpreter_stack(), torch's
// own function, returns None; its C++ header needs one torch does not ship); forward_ad._current_level
// < 0 (no forward-mode AD level); TorchScript not tracing. Each is the call that torch's Python
// binding of the same check makes, so the answers are the Python rule's
// (tests/ops/test_routing.py holds both to the same cases).
//
// Why: through Python these checks cost about 1 us a call on a 2-core CPU host (each a C call or
// attribute read behind a Python frame), on every call of a patched F.silu / F.gelu, which is
// otherwise the same call as tunekit.silu's; here they are field reads.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>

namespace {

PyObject* tensor_type = nullptr;  // torch.Tensor
PyObject* state = nullptr;        // routing.state
PyObject* forward_ad = nullptr;   // torch.autograd.forward_ad
PyObject* peek = nullptr;         // torch._C._functorch.peek_interpreter_stack
PyObject* inside_name = nullptr;
PyObject* level_name = nullptr;

bool plain_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// 1 true, 0 false, -1 error (set)
int attribute_true(PyObject* owner, PyObject* name) {
  PyObject* value = PyObject_GetAttr(owner, name);
  if (value == nullptr) return -1;
  const int yes = PyObject_IsTrue(value);
  Py_DECREF(value);
  return yes;
}

// 1: a forward-mode AD level is active, 0: none, -1 error (set)
int forward_level_active() {
  PyObject* level = PyObject_GetAttr(forward_ad, level_name);
  if (level == nullptr) return -1;
  const long value = PyLong_AsLong(level);
  Py_DECREF(level);
  if (value == -1 && PyErr_Occurred()) return -1;
  return value >= 0;
}

// 1: a functorch transform is active, 0: none, -1 error (set)
int transform_active() {
  PyObject* top = PyObject_CallNoArgs(peek);
  if (top == nullptr) return -1;
  const int active = top != Py_None;
  Py_DECREF(top);
  return active;
}

PyObject* configure(PyObject*, PyObject* args) {
  PyObject *type, *new_state, *module, *new_peek;
  if (!PyArg_ParseTuple(args, "OOOO:configure", &type, &new_state, &module, &new_peek)) return nullptr;
  if (!PyType_Check(type)) {
    PyErr_SetString(PyExc_TypeError, "configure: tensor_type must be a type");
    return nullptr;
  }
  Py_XSETREF(tensor_type, Py_NewRef(type));
  Py_XSETREF(state, Py_NewRef(new_state));
  Py_XSETREF(forward_ad, Py_NewRef(module));
  Py_XSETREF(peek, Py_NewRef(new_peek));
  Py_RETURN_NONE;
}

PyObject* takes(PyObject*, PyObject* x) {
  if (tensor_type == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "takes: configure() was not called");
    return nullptr;
  }
  if (reinterpret_cast<PyObject*>(Py_TYPE(x)) != tensor_type) Py_RETURN_FALSE;
  HANDLE_TH_ERRORS  // a C++ exception from torch becomes the Python error torch's bindings would raise
  const at::Tensor& t = THPVariable_Unpack(x);
  if (!plain_dtype(t.scalar_type()) || t.layout() != at::kStrided) Py_RETURN_FALSE;
  const c10::Device device = t.device();
  if (!device.is_cuda() && !device.is_cpu()) Py_RETURN_FALSE;
  const int inside = attribute_true(state, inside_name);
  if (inside != 0) return inside < 0 ? nullptr : Py_NewRef(Py_False);
  if (at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::stack_len() > 0)
    Py_RETURN_FALSE;
  const int forward = forward_level_active();
  if (forward != 0) return forward < 0 ? nullptr : Py_NewRef(Py_False);
  const int transform = transform_active();
  if (transform != 0) return transform < 0 ? nullptr : Py_NewRef(Py_False);
  if (torch::jit::tracer::isTracing()) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "configure(tensor_type, state, forward_ad, peek_interpreter_stack): what takes reads"},
    {"takes", takes, METH_O, "takes(x) -> bool: routing.takes's checks after is_compiling()"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tunekit_fast_route", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_tunekit_fast_route() {
  inside_name = PyUnicode_InternFromString("inside");
  level_name = PyUnicode_InternFromString("_current_level");
  if (inside_name == nullptr || level_name == nullptr) return nullptr;
  return PyModule_Create(&module_def);
}
