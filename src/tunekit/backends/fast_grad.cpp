// An elementwise op's differentiable cached call in C++: its forward through the op's fast call, its
// autograd node in C++ (a small CPython extension against libtorch, built at first use by
// tunekit.backends.fast_grad, as fast_call.cpp is; see there for why). One type:
//
//   GradCall(forward, backward, settings_var, name)(x[, extra]) -> y, or None
//
// x: a tensor that requires grad, under grad mode, that the caller checked tunekit computes. forward:
// the op's fast call (FastCall: forward(x, extra) -> y, or None when no runner is cached for x's
// key); it runs on x detached, so y is a new tensor that autograd has not seen. When it gives None,
// so does this (the caller takes its general path: the Python autograd Function). So it does when x
// carries a forward-mode tangent (the Function refuses those as torch's rules say).
//
// y's grad_fn is a C++ node (node name: `name`) that saves x as torch saves an input (a later in-place
// change of x makes backward raise torch's error) and, in backward, calls backward(dy, x[, extra])
// with the GIL taken (autograd's device thread holds none) and the settings captured from
// settings_var at the forward in force unless a tuning() block is already set on that thread (what
// tunekit.tunable.context.inherited does for the Python Function). Python errors in backward
// propagate as torch's engine propagates a Python Function's.
//
// Why: through a Python autograd Function, a tunekit activation and its backward cost 37 us more host
// time than F.gelu's (CPU host, 8x256 float32); a training step that is host-bound paid that on every
// activation (a GPT-2-style step with the default tunekit.patch() ran 0.92x torch's on the H200).
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace {

using torch::autograd::variable_list;

// How this torch holds graph nodes: std::shared_ptr (torch <= 2.11) or c10::intrusive_ptr (later).
using NodeHandle = decltype(torch::autograd::Edge::function);
constexpr bool kIntrusiveNodes = !std::is_same_v<NodeHandle, std::shared_ptr<torch::autograd::Node>>;

template <typename T>
auto make_node() {
  if constexpr (kIntrusiveNodes) {
    return c10::make_intrusive<T>();
  } else {
    return std::make_shared<T>();
  }
}

// A new reference kept by a node; released with the GIL taken (a node may die on any thread).
struct PyRef {
  PyObject* p = nullptr;
  PyRef() = default;
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  void hold(PyObject* o) {  // with the GIL, once
    Py_XINCREF(o);
    p = o;
  }
  ~PyRef() {
    if (p == nullptr || !Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(p);
    PyGILState_Release(gil);
  }
};

struct ElementwiseBackward : torch::autograd::Node {
  torch::autograd::SavedVariable x;
  PyRef backward, extra, settings_var, settings;
  std::string node_name;

  std::string name() const override { return node_name; }

  void release_variables() override { x.reset_data(); }

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::Tensor saved = x.unpack();
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* result = call_backward(grads[0], saved);
    if (result == nullptr) {
      python_error err;
      err.persist();
      PyGILState_Release(gil);
      throw std::move(err);
    }
    at::Tensor dx = THPVariable_Check(result) ? THPVariable_Unpack(result) : at::Tensor();
    Py_DECREF(result);
    PyGILState_Release(gil);
    TORCH_CHECK(dx.defined(), node_name, ": the backward function did not return a tensor");
    return {dx};
  }

  // backward(dy, x[, extra]) under the captured settings; a new reference, or nullptr with an error set.
  PyObject* call_backward(const at::Tensor& dy, const at::Tensor& saved) {
    PyObject* token = nullptr;
    if (settings.p != nullptr) {
      PyObject* current = nullptr;
      if (PyContextVar_Get(settings_var.p, nullptr, &current) < 0) return nullptr;
      if (current == nullptr || current == Py_None) token = PyContextVar_Set(settings_var.p, settings.p);
      Py_XDECREF(current);
      if (token == nullptr && PyErr_Occurred()) return nullptr;
    }
    PyObject* args[3] = {THPVariable_Wrap(dy), THPVariable_Wrap(saved), extra.p};
    PyObject* result = nullptr;
    if (args[0] != nullptr && args[1] != nullptr)
      result = PyObject_Vectorcall(backward.p, args, extra.p != nullptr ? 3 : 2, nullptr);
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    if (token != nullptr) {
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);  // the reset must not lose the backward's error
      if (PyContextVar_Reset(settings_var.p, token) < 0) PyErr_Clear();
      PyErr_Restore(type, value, trace);
      Py_DECREF(token);
    }
    return result;
  }
};

struct GradCall {
  PyObject_HEAD
  PyObject* forward;
  PyObject* backward;
  PyObject* settings_var;
  PyObject* name;  // str
  vectorcallfunc vectorcall;
};

// y with its C++ node, or None; nullptr with an error set when the forward raised.
PyObject* gradcall_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<GradCall*>(op);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) || nargs < 1 || nargs > 2 || !THPVariable_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "GradCall takes (x) or (x, extra), x a tensor");
    return nullptr;
  }
  PyObject* extra = nargs == 2 ? args[1] : nullptr;
  HANDLE_TH_ERRORS
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  if (!c10::GradMode::is_enabled() || !x.requires_grad() || x._fw_grad(0).defined()) Py_RETURN_NONE;
  PyObject* call_args[2] = {THPVariable_Wrap(x.detach()), extra};
  if (call_args[0] == nullptr) return nullptr;
  PyObject* y = PyObject_Vectorcall(self->forward, call_args, extra != nullptr ? 2 : 1, nullptr);
  Py_DECREF(call_args[0]);
  if (y == nullptr || y == Py_None) return y;
  if (!THPVariable_Check(y)) {
    Py_DECREF(y);
    PyErr_SetString(PyExc_TypeError, "GradCall: the forward did not return a tensor");
    return nullptr;
  }
  at::Tensor out = THPVariable_Unpack(y);
  auto node = make_node<ElementwiseBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  node->x = torch::autograd::SavedVariable(x, false);
  node->node_name = PyUnicode_AsUTF8(self->name);
  node->backward.hold(self->backward);
  node->settings_var.hold(self->settings_var);
  node->extra.hold(extra);
  PyObject* settings = nullptr;
  if (PyContextVar_Get(self->settings_var, nullptr, &settings) < 0) {
    Py_DECREF(y);
    return nullptr;
  }
  if (settings != Py_None) node->settings.hold(settings);
  Py_XDECREF(settings);
  torch::autograd::set_history(out, node);
  return y;
  END_HANDLE_TH_ERRORS
}

PyObject* gradcall_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *forward, *backward, *settings_var, *name;
  static const char* names[] = {"forward", "backward", "settings_var", "name", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOU:GradCall", const_cast<char**>(names), &forward, &backward,
                                   &settings_var, &name))
    return nullptr;
  if (!PyCallable_Check(forward) || !PyCallable_Check(backward) || !PyContextVar_CheckExact(settings_var)) {
    PyErr_SetString(PyExc_TypeError, "GradCall: forward and backward callables, settings_var a ContextVar");
    return nullptr;
  }
  auto* self = reinterpret_cast<GradCall*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  for (PyObject* o : {forward, backward, settings_var, name}) Py_INCREF(o);
  self->forward = forward;
  self->backward = backward;
  self->settings_var = settings_var;
  self->name = name;
  self->vectorcall = gradcall_call;
  return reinterpret_cast<PyObject*>(self);
}

int gradcall_traverse(GradCall* self, visitproc visit, void* arg) {
  Py_VISIT(self->forward);
  Py_VISIT(self->backward);
  Py_VISIT(self->settings_var);
  Py_VISIT(self->name);
  return 0;
}

int gradcall_clear(GradCall* self) {
  Py_CLEAR(self->forward);
  Py_CLEAR(self->backward);
  Py_CLEAR(self->settings_var);
  Py_CLEAR(self->name);
  return 0;
}

void gradcall_dealloc(GradCall* self) {
  PyObject_GC_UnTrack(self);
  gradcall_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject GradCallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tunekit_fast_grad", nullptr, -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_tunekit_fast_grad(void) {
  GradCallType.tp_name = "tunekit_fast_grad.GradCall";
  GradCallType.tp_basicsize = sizeof(GradCall);
  GradCallType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  GradCallType.tp_doc = "GradCall(forward, backward, settings_var, name): see fast_grad.cpp";
  GradCallType.tp_new = gradcall_new;
  GradCallType.tp_call = PyVectorcall_Call;
  GradCallType.tp_vectorcall_offset = offsetof(GradCall, vectorcall);
  GradCallType.tp_traverse = reinterpret_cast<traverseproc>(gradcall_traverse);
  GradCallType.tp_clear = reinterpret_cast<inquiry>(gradcall_clear);
  GradCallType.tp_dealloc = reinterpret_cast<destructor>(gradcall_dealloc);
  if (PyType_Ready(&GradCallType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&GradCallType);
  if (PyModule_AddObject(m, "GradCall", reinterpret_cast<PyObject*>(&GradCallType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
