// An activation's differentiable cached call in C++: its forward through the op's fast call (the tuned
// runner), its autograd node torch's own (a small CPython extension against libtorch, built at first
// use by tunekit.backends.fast_grad, as fast_call.cpp is; see there for why). One type and two
// recorders:
//
//   GradCall(forward, kind)(x, *extra) -> y, or None
//
// x: a tensor that requires grad, under grad mode, that the caller checked tunekit computes. forward:
// the op's fast call (FastCall: forward(x, *extra) -> y, or None when no runner is cached for x's
// key) or any function of (x, *extra) that gives y or None; it runs on x detached, so y is a new tensor that autograd has not seen. When it gives None,
// so does this (the caller takes its general path: its Python autograd Function). So it does when x
// carries a forward-mode tangent (torch's node would need its forward formula too), and when y is
// not a fresh tensor (a view, an alias of x, or one with a history): its history cannot be set.
//
//   silu_call(runner, x) / gelu_call(runner, x, approximate) -> y, or None
//
// What a FastCall (fast_call.cpp) given one as its recorder does with x requiring grad and a runner
// that is not torch's function: runner(x) with grad mode off, y given torch's node as GradCall gives
// it (None where GradCall's would be; runner(x) as it is when grad mode is off). One C++ call instead
// of the op's Python function, a GradCall and a Python forward around the same runner.
//
// kind: "silu", "gelu" (extra: the approximation, "none" or "tanh") or "logsumexp" (extra: the
// reduced dims as a tuple of ints, keepdim as a bool). y gets the grad_fn torch's own F.silu / F.gelu
// / torch.logsumexp gives (SiluBackward0 / GeluBackward0 / LogsumexpBackward0, x and for logsumexp
// its result saved as torch saves them), built as torch's
// generated autograd code builds it: the backward is torch's kernel at torch's host cost, and every
// autograd feature that knows torch's nodes knows it (double backward, compiled autograd, anomaly
// mode, saved-tensor hooks). tunekit's tuned backward kernels stay with the Python Function and the
// explicit tunekit.silu_backward / gelu_backward; on the H200 they ran the activations suite's
// backward at 0.93-1.00x torch's device time.
//
// Why: through a Python autograd Function, a tunekit activation and its backward cost 37 us more host
// time than F.gelu's (CPU host, 8x256 float32); a host-bound training step paid that on every
// activation (a GPT-2-style step with the default tunekit.patch() ran 0.92x torch's on the H200). A
// node of tunekit's own in C++ (tried first) still paid a Python backward call, and compiled autograd
// refuses nodes it does not know.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace {

using torch::autograd::SavedVariable;

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

enum Kind { kSilu = 0, kGelu = 1, kLogsumexp = 2 };

// Positional arguments after x for each kind.
constexpr Py_ssize_t kExtra[] = {0, 1, 2};

bool extra_ok(int kind, PyObject* const* extra) {
  if (kind == kGelu) return PyUnicode_Check(extra[0]);
  if (kind == kLogsumexp) {
    if (!PyTuple_Check(extra[0]) || !PyBool_Check(extra[1])) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extra[0]); ++i)
      if (!PyLong_Check(PyTuple_GET_ITEM(extra[0], i))) return false;
  }
  return true;
}

struct GradCall {
  PyObject_HEAD
  PyObject* forward;
  int kind;
  vectorcallfunc vectorcall;
};

// torch's node for y = op(x, *extra): the edges to x's graph, x saved as an input (and, for logsumexp,
// y as the output, saved once y has its history, as torch's generated code does).
void record(int kind, const at::Tensor& x, const at::Tensor& y, PyObject* const* extra) {
  if (kind == kLogsumexp) {
    auto node = make_node<torch::autograd::generated::LogsumexpBackward0>();
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    node->self_ = SavedVariable(x, false);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extra[0]); ++i)
      node->dim.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(extra[0], i)));
    if (PyErr_Occurred()) throw python_error();
    node->keepdim = extra[1] == Py_True;
    torch::autograd::set_history(y, node);
    node->result_ = SavedVariable(y, true);
    return;
  }
  if (kind == kSilu) {
    auto node = make_node<torch::autograd::generated::SiluBackward0>();
    node->set_next_edges(torch::autograd::collect_next_edges(x));
    node->self_ = SavedVariable(x, false);
    torch::autograd::set_history(y, node);
    return;
  }
  auto node = make_node<torch::autograd::generated::GeluBackward0>();
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  node->self_ = SavedVariable(x, false);
  node->approximate = PyUnicode_AsUTF8(extra[0]);
  torch::autograd::set_history(y, node);
}

// forward(x', *extra) (args: x, *extra) with torch's node, or None; nullptr with an error set when
// anything raised. x' is x.detach() (GradCall), or x with grad mode off (a recorder: its forward is a
// runner, which takes x alone; under grad mode off its result needs no node).
PyObject* with_node(int kind, PyObject* forward, PyObject* const* args, Py_ssize_t nargs, bool detach) {
  const Py_ssize_t wanted = 1 + kExtra[kind];
  if (nargs != wanted || !THPVariable_Check(args[0]) || !extra_ok(kind, args + 1)) {
    PyErr_SetString(PyExc_TypeError,
                    "GradCall takes (x) for silu, (x, approximate) for gelu, (x, dims, keepdim) for logsumexp");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  // inference mode records no history, whatever grad mode says (torch's own ops give no grad_fn there)
  const bool grad_mode = c10::GradMode::is_enabled() && !c10::InferenceMode::is_enabled();
  if (!detach && !grad_mode) return PyObject_Vectorcall(forward, args, 1, nullptr);  // a runner takes x alone
  if (!grad_mode || !x.requires_grad() || x._fw_grad(0).defined()) Py_RETURN_NONE;
  PyObject* y;
  if (detach) {
    PyObject* call_args[3] = {THPVariable_Wrap(x.detach()), wanted > 1 ? args[1] : nullptr,
                              wanted > 2 ? args[2] : nullptr};
    if (call_args[0] == nullptr) return nullptr;
    y = PyObject_Vectorcall(forward, call_args, wanted, nullptr);
    Py_DECREF(call_args[0]);
  } else {
    c10::AutoGradMode off(false);
    y = PyObject_Vectorcall(forward, args, 1, nullptr);
  }
  if (y == nullptr || y == Py_None) return y;
  if (!THPVariable_Check(y)) {
    Py_DECREF(y);
    PyErr_SetString(PyExc_TypeError, "GradCall: the forward did not return a tensor");
    return nullptr;
  }
  const at::Tensor& out = THPVariable_Unpack(y);
  if (out.is_view() || out.is_alias_of(x) || out.requires_grad()) {  // not a fresh result: no history of its own
    Py_DECREF(y);
    Py_RETURN_NONE;
  }
  try {
    record(kind, x, out, args + 1);
  } catch (...) {
    Py_DECREF(y);
    throw;
  }
  return y;
  END_HANDLE_TH_ERRORS
}

PyObject* gradcall_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<GradCall*>(op);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "GradCall takes no keyword arguments");
    return nullptr;
  }
  return with_node(self->kind, self->forward, args, PyVectorcall_NARGS(nargsf), true);
}

// silu_call / gelu_call: a FastCall's recorder (args: runner, x, *extra).
template <int kind>
PyObject* recorder_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "a recorder takes (runner, x, *extra)");
    return nullptr;
  }
  return with_node(kind, args[0], args + 1, nargs - 1, false);
}

PyObject* gradcall_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* forward;
  const char* kind;
  static const char* names[] = {"forward", "kind", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os:GradCall", const_cast<char**>(names), &forward, &kind))
    return nullptr;
  const std::string k = kind;
  if (!PyCallable_Check(forward) || (k != "silu" && k != "gelu" && k != "logsumexp")) {
    PyErr_SetString(PyExc_TypeError, "GradCall: forward a callable, kind \"silu\", \"gelu\" or \"logsumexp\"");
    return nullptr;
  }
  auto* self = reinterpret_cast<GradCall*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  Py_INCREF(forward);
  self->forward = forward;
  self->kind = k == "silu" ? kSilu : k == "gelu" ? kGelu : kLogsumexp;
  self->vectorcall = gradcall_call;
  return reinterpret_cast<PyObject*>(self);
}

int gradcall_traverse(GradCall* self, visitproc visit, void* arg) {
  Py_VISIT(self->forward);
  return 0;
}

int gradcall_clear(GradCall* self) {
  Py_CLEAR(self->forward);
  return 0;
}

void gradcall_dealloc(GradCall* self) {
  PyObject_GC_UnTrack(self);
  gradcall_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject GradCallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef module_methods[] = {
    {"silu_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(recorder_call<kSilu>)), METH_FASTCALL,
     "silu_call(runner, x): runner(x) with torch's SiluBackward0 (see fast_grad.cpp)"},
    {"gelu_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(recorder_call<kGelu>)), METH_FASTCALL,
     "gelu_call(runner, x, approximate): runner(x) with torch's GeluBackward0 (see fast_grad.cpp)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tunekit_fast_grad", nullptr, -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit_tunekit_fast_grad(void) {
  GradCallType.tp_name = "tunekit_fast_grad.GradCall";
  GradCallType.tp_basicsize = sizeof(GradCall);
  GradCallType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  GradCallType.tp_doc = "GradCall(forward, kind): see fast_grad.cpp";
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
