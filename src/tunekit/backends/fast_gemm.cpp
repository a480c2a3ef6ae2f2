// GEMM calls whose tuned answer is torch's own kernels, handed to torch's own function from C++: a
// small CPython extension against libtorch, built at first use by tunekit.backends.fast_gemm (as
// fast_call.cpp is). tunekit/ops/gemm/routes.py says why and when a call is routed. One type:
//
//   GemmRoute(form, routes, settings_var, context, tensor_types)
//     route(*operands) -> torch's result, or None
//     route.key(*operands) -> bytes, or None
//
// form: which torch function the operands are the positional arguments of: 0 linear(x, weight,
// bias or None), 1 mm(a, b), 2 addmm(c, a, b), 3 bmm(a, b), 4 baddbmm(c, a, b), 5 matmul(a, b);
// alpha = beta = 1, no out=. 6 rms_norm(x, normalized_shape, weight, eps), the one route that is not a
// GEMM (tunekit/ops/rms_norm/route.py): normalized_shape a tuple or list of ints equal to weight's
// sizes and to x's last ones, eps None or a float; its key is that of (x, weight), eps aside.
//
// key: None unless every operand is a tensor whose type is exactly one of tensor_types (torch.Tensor,
// nn.Parameter: no __torch_function__ of their own), float32 / float16 / bfloat16, strided, on the
// CPU or a CUDA device, all of one dtype and device, and no torch-function mode is active: calling
// at:: functions skips __torch_function__ handling, the one step of a Python call of torch's
// function that this does not take. Otherwise the call's layout as bytes: the form, dtype, device,
// TF32 and deterministic settings, which operands require grad (when grad mode is on), and each
// operand's sizes, strides and data pointer mod 16 (64-bit integers). Reading it fails (None) for
// tensors without strides or storage (functorch wrappers, for one).
//
// route: torch's function on the operands (the GIL released, as torch's bindings do) when the key is
// not None and routes[settings.cache_id][key] is True, for the current settings (settings_var, else
// context._defaults) when they are enabled; when the value there is a plan (any other object but
// False: tunekit/ops/gemm/launch_plans.py, a backends/fast_plan.cpp KernelPlan), plan(*operands), for
// operands that ask for nothing beyond the kernels (no autocast, dispatch mode, operand requiring grad
// under grad mode, forward-mode tangent, lazy negation or conjugation, zero tensor; else None); None otherwise. Errors propagate as torch's
// bindings translate them (the same Python exception types).
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace {

enum Form { kLinear = 0, kMm, kAddmm, kBmm, kBaddbmm, kMatmul, kRmsNorm, kForms };

// operands per form (linear's bias may be None; rms_norm's arguments, two of them tensors)
constexpr int kOperands[kForms] = {3, 2, 3, 2, 3, 2, 4};

PyObject *s_defaults, *s_enabled, *s_cache_id;

struct GemmRoute {
  PyObject_HEAD
  int form;
  PyObject* routes;        // {settings.cache_id: {key: True / False}}: the op family's dict, never replaced
  PyObject* settings_var;  // the ContextVar holding the current settings (or None)
  PyObject* context;       // the module whose _defaults are the settings when the variable holds none
  PyObject* tensor_types;  // a tuple of the exact types taken
  vectorcallfunc vectorcall;
};

bool taken_type(GemmRoute* self, PyObject* o) {
  const Py_ssize_t n = PyTuple_GET_SIZE(self->tensor_types);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (reinterpret_cast<PyObject*>(Py_TYPE(o)) == PyTuple_GET_ITEM(self->tensor_types, i)) return true;
  return false;
}

bool taken_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// rms_norm's (x, normalized_shape, weight, eps) as out[0] = x, out[1] = weight and *eps, or false when
// the call is not one this takes (the module comment).
bool norm_operands(GemmRoute* self, PyObject* const* args, at::Tensor* out, std::optional<double>* eps) {
  if (!taken_type(self, args[0]) || !taken_type(self, args[2])) return false;
  if (args[3] != Py_None && !PyFloat_CheckExact(args[3])) return false;
  if (args[3] != Py_None) *eps = PyFloat_AS_DOUBLE(args[3]);
  PyObject* shape = args[1];
  if (!PyTuple_Check(shape) && !PyList_Check(shape)) return false;  // torch.Size is a tuple
  out[0] = THPVariable_Unpack(args[0]);
  out[1] = THPVariable_Unpack(args[2]);
  const auto sizes = out[1].sizes();
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(shape);
  if (n == 0 || n != static_cast<Py_ssize_t>(sizes.size()) || out[0].dim() < n) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(shape, i);
    if (!PyLong_CheckExact(item)) return false;
    const long long v = PyLong_AsLongLong(item);
    if (v == -1 && PyErr_Occurred()) return false;
    if (v != sizes[i] || v != out[0].size(out[0].dim() - n + i)) return false;
  }
  return true;
}

// The operands as at::Tensors (an undefined one for linear's None bias), or false when the call is
// not one this takes (wrong count, a type, a mode).
bool operands(GemmRoute* self, PyObject* const* args, Py_ssize_t nargs, at::Tensor* out, std::optional<double>* eps) {
  if (nargs != kOperands[self->form] || at::impl::torch_function_mode_enabled()) return false;
  if (self->form == kRmsNorm) return norm_operands(self, args, out, eps);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (self->form == kLinear && i == 2 && args[i] == Py_None) continue;
    if (!taken_type(self, args[i])) return false;
    out[i] = THPVariable_Unpack(args[i]);
  }
  return true;
}

// The layout key of defined operands t[0..n) (module comment), or nullptr (no Python error set)
// when they are not of one taken dtype and device. May throw (a tensor without strides).
PyObject* layout_key(int form, const at::Tensor* t, int n) {
  const at::Tensor& first = t[0];
  const at::Device device = first.device();
  if (!(device.is_cpu() || device.is_cuda()) || !taken_dtype(first.scalar_type())) return nullptr;
  const bool grad_mode = c10::GradMode::is_enabled();
  std::int64_t grads = 0;
  std::vector<std::int64_t> words = {form, static_cast<std::int64_t>(first.scalar_type()),
                                     static_cast<std::int64_t>(device.type()), device.index(),
                                     at::globalContext().allowTF32CuBLAS(),
                                     at::globalContext().deterministicAlgorithms(), 0};
  for (int i = 0; i < n; ++i) {
    words.push_back(t[i].defined());
    if (!t[i].defined()) continue;
    const at::Tensor& x = t[i];
    if (x.scalar_type() != first.scalar_type() || x.device() != device || x.layout() != at::kStrided) return nullptr;
    if (grad_mode && x.requires_grad()) grads |= std::int64_t{1} << i;
    words.push_back(x.dim());
    for (std::int64_t s : x.sizes()) words.push_back(s);
    for (std::int64_t s : x.strides()) words.push_back(s);
    words.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x.data_ptr()) & 15u));
  }
  words[6] = grads;
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(words.data()),
                                   static_cast<Py_ssize_t>(words.size() * sizeof(std::int64_t)));
}

// The key of a call (a new reference), or nullptr with no error set when the call is not taken.
PyObject* call_key(GemmRoute* self, PyObject* const* args, Py_ssize_t nargs, at::Tensor* t,
                   std::optional<double>* eps) {
  if (!operands(self, args, nargs, t, eps)) return nullptr;
  try {
    return layout_key(self->form, t, self->form == kRmsNorm ? 2 : static_cast<int>(nargs));
  } catch (...) {  // a tensor that cannot describe its layout here: the general path meets it
    return nullptr;
  }
}

// routes[settings.cache_id][key] for the current, enabled settings (a new reference), or nullptr.
PyObject* route_of(GemmRoute* self, PyObject* key) {
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
  PyObject* table = PyDict_GetItemWithError(self->routes, cache_id);  // borrowed
  Py_DECREF(cache_id);
  PyObject* value = table != nullptr && PyDict_Check(table) ? PyDict_GetItemWithError(table, key) : nullptr;
  return Py_XNewRef(value);
}

// Whether a plan may stand for torch's function on these operands: what at:: functions would do
// beyond the kernels (autocast's casts, a dispatch mode, forward-mode tangents, lazy negation or
// conjugation, zero tensors) is not asked for.
bool plain_operands(const at::Tensor* t, int n) {
  if (at::autocast::is_autocast_enabled(t[0].device().type()) || c10::impl::TorchDispatchModeTLS::any_modes_set())
    return false;
  const bool grad_mode = c10::GradMode::is_enabled();
  for (int i = 0; i < n; ++i) {
    if (!t[i].defined()) continue;
    if (grad_mode && t[i].requires_grad()) return false;  // a plan makes no autograd node
    if (t[i].is_neg() || t[i].is_conj() || t[i]._is_zerotensor() || t[i]._fw_grad(0).defined()) return false;
  }
  return true;
}

struct WithoutGil {
  PyThreadState* state = PyEval_SaveThread();
  ~WithoutGil() { PyEval_RestoreThread(state); }
};

at::Tensor torch_function(int form, const at::Tensor* t, std::optional<double> eps) {
  WithoutGil released;
  switch (form) {
    case kRmsNorm: return at::rms_norm(t[0], t[1].sizes(), t[1], eps);
    case kLinear: return at::linear(t[0], t[1], t[2].defined() ? std::optional<at::Tensor>(t[2]) : std::nullopt);
    case kMm: return at::mm(t[0], t[1]);
    case kAddmm: return at::addmm(t[0], t[1], t[2]);
    case kBmm: return at::bmm(t[0], t[1]);
    case kBaddbmm: return at::baddbmm(t[0], t[1], t[2]);
    default: return at::matmul(t[0], t[1]);
  }
}

PyObject* route_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<GemmRoute*>(op);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) Py_RETURN_NONE;
  at::Tensor t[3];
  std::optional<double> eps;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  PyObject* key = call_key(self, args, nargs, t, &eps);
  PyObject* route = key != nullptr ? route_of(self, key) : nullptr;
  Py_XDECREF(key);
  if (route == nullptr || route == Py_False) {
    Py_XDECREF(route);
    PyErr_Clear();  // whatever failed, the general path meets it again
    Py_RETURN_NONE;
  }
  if (route != Py_True) {  // a plan (launch_plans.py): the decided kernels, for plain operands only
    bool plain = false;
    try {
      plain = plain_operands(t, self->form == kRmsNorm ? 2 : static_cast<int>(nargs));
    } catch (...) {
    }
    PyObject* result = plain ? PyObject_Vectorcall(route, args, nargs, nullptr) : Py_NewRef(Py_None);
    Py_DECREF(route);
    return result;
  }
  Py_DECREF(route);
  HANDLE_TH_ERRORS
  return THPVariable_Wrap(torch_function(self->form, t, eps));
  END_HANDLE_TH_ERRORS
}

PyObject* route_key(PyObject* op, PyObject* const* args, Py_ssize_t nargs) {
  at::Tensor t[3];
  std::optional<double> eps;
  PyObject* key = call_key(reinterpret_cast<GemmRoute*>(op), args, nargs, t, &eps);
  if (key != nullptr) return key;
  PyErr_Clear();
  Py_RETURN_NONE;
}

PyObject* route_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  int form;
  PyObject *routes, *settings_var, *context, *tensor_types;
  static const char* names[] = {"form", "routes", "settings_var", "context", "tensor_types", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iO!OOO!:GemmRoute", const_cast<char**>(names), &form, &PyDict_Type,
                                   &routes, &settings_var, &context, &PyTuple_Type, &tensor_types))
    return nullptr;
  bool types_ok = PyTuple_GET_SIZE(tensor_types) > 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tensor_types); ++i) {
    PyObject* t = PyTuple_GET_ITEM(tensor_types, i);
    types_ok = types_ok && PyType_Check(t) &&
               PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t), reinterpret_cast<PyTypeObject*>(THPVariableClass));
  }
  if (form < 0 || form >= kForms || !PyContextVar_CheckExact(settings_var) || !types_ok) {
    PyErr_SetString(PyExc_TypeError, "GemmRoute: form 0-6, settings_var a ContextVar, tensor_types torch.Tensor types");
    return nullptr;
  }
  auto* self = reinterpret_cast<GemmRoute*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  for (PyObject* o : {routes, settings_var, context, tensor_types}) Py_INCREF(o);
  self->form = form;
  self->routes = routes;
  self->settings_var = settings_var;
  self->context = context;
  self->tensor_types = tensor_types;
  self->vectorcall = route_call;
  return reinterpret_cast<PyObject*>(self);
}

int route_traverse(GemmRoute* self, visitproc visit, void* arg) {
  Py_VISIT(self->routes);
  Py_VISIT(self->settings_var);
  Py_VISIT(self->context);
  Py_VISIT(self->tensor_types);
  return 0;
}

int route_clear(GemmRoute* self) {
  Py_CLEAR(self->routes);
  Py_CLEAR(self->settings_var);
  Py_CLEAR(self->context);
  Py_CLEAR(self->tensor_types);
  return 0;
}

void route_dealloc(GemmRoute* self) {
  PyObject_GC_UnTrack(self);
  route_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMethodDef route_methods[] = {
    {"key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(route_key)), METH_FASTCALL,
     "key(*operands): the call's layout key (bytes), or None when the call is not one a route takes"},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject GemmRouteType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tunekit_fast_gemm", nullptr, -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_tunekit_fast_gemm(void) {
  s_defaults = PyUnicode_InternFromString("_defaults");
  s_enabled = PyUnicode_InternFromString("enabled");
  s_cache_id = PyUnicode_InternFromString("cache_id");
  if (!s_defaults || !s_enabled || !s_cache_id) return nullptr;
  GemmRouteType.tp_name = "tunekit_fast_gemm.GemmRoute";
  GemmRouteType.tp_basicsize = sizeof(GemmRoute);
  GemmRouteType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  GemmRouteType.tp_doc = "GemmRoute(form, routes, settings_var, context, tensor_types): see fast_gemm.cpp";
  GemmRouteType.tp_new = route_new;
  GemmRouteType.tp_call = PyVectorcall_Call;
  GemmRouteType.tp_vectorcall_offset = offsetof(GemmRoute, vectorcall);
  GemmRouteType.tp_methods = route_methods;
  GemmRouteType.tp_traverse = reinterpret_cast<traverseproc>(route_traverse);
  GemmRouteType.tp_clear = reinterpret_cast<inquiry>(route_clear);
  GemmRouteType.tp_dealloc = reinterpret_cast<destructor>(route_dealloc);
  if (PyType_Ready(&GemmRouteType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&GemmRouteType);
  if (PyModule_AddObject(m, "GemmRoute", reinterpret_cast<PyObject*>(&GemmRouteType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
