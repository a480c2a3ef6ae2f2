// A decided kernel sequence replayed from C++ with only its pointers patched: a small CPython extension
// against libtorch, built at first use by tunekit.backends.fast_plan (as fast_call.cpp is; see there
// for why). One type:
//
//   KernelPlan(entry, operands, device_index, stream_fn, result_sizes, result_strides, temporaries, launches)
//     plan(*operands) -> the result tensor
//
// entry: the address of the driver's cuLaunchKernel (or a stand-in with its C signature: the tests pass a
// recording one, so the packing is checked without a GPU). operands: tensors, or None (linear's absent
// bias: a slot naming it gets a null pointer), as many as the plan was built for; the first one a
// tensor. result: at::empty_strided(result_sizes, result_strides) with the first operand's dtype and
// device. temporaries: byte counts, each an uninitialised uint8 buffer allocated per call (a split-K
// workspace). launches: tuples (function, grid_x, grid_y, grid_z, block, shared, scratch, slots), run
// in order on stream_fn(device_index) (torch's current raw stream) with the first operand's device
// current; scratch > 0 allocates that many bytes for the launch (a Triton kernel's global scratch).
// slots: the kernel's parameters, each a pair (kind, value), one 8-byte slot apiece (a 4-byte
// parameter reads the low half: little-endian hosts):
//   0 a constant (value: an int, stored as 64 bits, two's complement for negatives)
//   1 operand `value`'s data pointer    2 the result's      3 temporary `value`'s    4 the scratch
//
// The plan checks nothing about the operands beyond their count and types: what it was built for (sizes,
// strides, dtype, alignment) is its caller's key (fast_gemm.cpp's GemmRoute routes a call to a plan
// only for the layout key the plan was built from). A refused launch is retried once after the context
// hook made a context current (as fast_call.cpp's set_context_hook: this module has its own); a driver
// error raises RuntimeError with its CUresult; torch's own errors (an allocation out of memory) keep
// their Python types, as torch's bindings translate them.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <new>
#include <vector>

namespace {

typedef int (*launch_kernel_fn)(void* f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                unsigned int shared_bytes, void* stream, void** params, void** extra);

enum SlotKind { kConstant = 0, kOperand, kResult, kTemporary, kScratch, kSlotKinds };

struct Slot {
  int kind;
  std::uint64_t value;
};

struct Launch {
  void* function;
  unsigned int grid[3], block, shared;
  std::int64_t scratch;
  std::vector<Slot> slots;
};

struct PlanData {
  launch_kernel_fn entry;
  std::vector<std::int64_t> sizes, strides, temporaries;
  std::vector<Launch> launches;
  int operands;  // how many operands a call passes
};

PyObject* context_hook = nullptr;

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
  return previous;
}

struct KernelPlan {
  PyObject_HEAD
  PlanData* data;
  PyObject* device_index;
  PyObject* stream_fn;
  vectorcallfunc vectorcall;
};

std::uint64_t address(const at::Tensor& t) {
  return t.defined() ? static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.data_ptr())) : 0;
}

// Each launch's slots filled in, then the launch; false with a Python error set.
bool run_launches(const PlanData& d, const at::Tensor* ops, const at::Tensor& result,
                  const std::vector<at::Tensor>& temps, void* stream) {
  std::vector<std::uint64_t> values;
  std::vector<void*> params;
  for (const Launch& l : d.launches) {
    at::Tensor scratch;
    if (l.scratch > 0) scratch = at::empty({l.scratch}, result.options().dtype(at::kByte));
    values.resize(l.slots.size());
    params.resize(l.slots.size());
    for (size_t i = 0; i < l.slots.size(); ++i) {
      const Slot& s = l.slots[i];
      values[i] = s.kind == kConstant ? s.value
                  : s.kind == kOperand ? address(ops[s.value])
                  : s.kind == kResult ? address(result)
                  : s.kind == kTemporary ? address(temps[s.value])
                                         : address(scratch);
      params[i] = &values[i];
    }
    void** p = params.empty() ? nullptr : params.data();
    int err = d.entry(l.function, l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, l.shared, stream, p, nullptr);
    if (err != 0 && context_was_bound())
      err = d.entry(l.function, l.grid[0], l.grid[1], l.grid[2], l.block, 1, 1, l.shared, stream, p, nullptr);
    if (err != 0) {
      PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed: CUresult %d", err);
      return false;
    }
  }
  return true;
}

PyObject* plan_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<KernelPlan*>(op);
  const PlanData& d = *self->data;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if ((kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) || nargs != d.operands || nargs == 0 ||
      !THPVariable_Check(args[0])) {
    PyErr_Format(PyExc_TypeError, "KernelPlan takes %d operands, the first a tensor", d.operands);
    return nullptr;
  }
  std::vector<at::Tensor> ops(nargs);
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (args[i] == Py_None) continue;
    if (!THPVariable_Check(args[i])) {
      PyErr_SetString(PyExc_TypeError, "KernelPlan: operands are tensors or None");
      return nullptr;
    }
    ops[i] = THPVariable_Unpack(args[i]);
  }
  HANDLE_TH_ERRORS
  c10::OptionalDeviceGuard guard;
  const c10::Device device = ops[0].device();  // switched only when another device is current
  if (device.is_cuda() && c10::impl::getDeviceGuardImpl(device.type())->getDevice() != device) guard.reset_device(device);
  at::Tensor result = at::empty_strided(d.sizes, d.strides, ops[0].options());
  std::vector<at::Tensor> temps;
  for (std::int64_t bytes : d.temporaries) temps.push_back(at::empty({bytes}, ops[0].options().dtype(at::kByte)));
  PyObject* stream = PyObject_Vectorcall(self->stream_fn, &self->device_index, 1, nullptr);
  if (stream == nullptr) return nullptr;
  void* stream_handle = PyLong_AsVoidPtr(stream);
  Py_DECREF(stream);
  if (stream_handle == nullptr && PyErr_Occurred()) return nullptr;
  if (!run_launches(d, ops.data(), result, temps, stream_handle)) return nullptr;
  return THPVariable_Wrap(std::move(result));
  END_HANDLE_TH_ERRORS
}

// A tuple of ints as int64s; false with a Python error set.
bool int_list(PyObject* o, const char* what, std::vector<std::int64_t>* out) {
  if (!PyTuple_Check(o) && !PyList_Check(o)) {
    PyErr_Format(PyExc_TypeError, "KernelPlan: %s must be a tuple of ints", what);
    return false;
  }
  PyObject* seq = PySequence_Fast(o, what);
  if (seq == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(seq);
  return true;
}

// One launch tuple (the module comment); false with a Python error set.
bool parse_launch(PyObject* o, const PlanData& d, int operands, Launch* l) {
  PyObject *function, *slots;
  long long scratch;
  if (!PyTuple_Check(o) || !PyArg_ParseTuple(o, "OIIIIILO!", &function, &l->grid[0], &l->grid[1], &l->grid[2], &l->block,
                                             &l->shared, &scratch, &PyTuple_Type, &slots)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "KernelPlan: a launch is a tuple");
    return false;
  }
  l->function = PyLong_AsVoidPtr(function);
  if (PyErr_Occurred()) return false;
  l->scratch = scratch;
  const bool dims_ok = l->grid[0] && l->grid[1] && l->grid[2] && l->block;
  if (l->function == nullptr || !dims_ok || scratch < 0) {
    PyErr_SetString(PyExc_ValueError, "KernelPlan: a null function, an empty grid or block, or negative scratch");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(slots); ++i) {
    int kind;
    PyObject* value;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(slots, i), "iO", &kind, &value)) return false;
    Slot s{kind, static_cast<std::uint64_t>(PyLong_AsUnsignedLongLongMask(value))};
    if (PyErr_Occurred()) return false;
    const std::uint64_t bound = kind == kOperand ? operands : kind == kTemporary ? d.temporaries.size() : 1;
    if (kind < 0 || kind >= kSlotKinds || ((kind == kOperand || kind == kTemporary) && s.value >= bound)) {
      PyErr_Format(PyExc_ValueError, "KernelPlan: slot %zd names no operand, temporary or kind", i);
      return false;
    }
    l->slots.push_back(s);
  }
  return true;
}

PyObject* plan_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *entry, *device_index, *stream_fn, *sizes, *strides, *temporaries, *launches;
  int operands;
  static const char* names[] = {"entry", "operands", "device_index", "stream_fn", "result_sizes", "result_strides",
                                "temporaries", "launches", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiO!OOOOO!:KernelPlan", const_cast<char**>(names), &entry, &operands,
                                   &PyLong_Type, &device_index, &stream_fn, &sizes, &strides, &temporaries,
                                   &PyTuple_Type, &launches))
    return nullptr;
  void* entry_address = PyLong_AsVoidPtr(entry);
  if (PyErr_Occurred()) return nullptr;
  if (entry_address == nullptr || operands < 1 || !PyCallable_Check(stream_fn)) {
    PyErr_SetString(PyExc_ValueError, "KernelPlan: a null entry, no operands, or stream_fn not callable");
    return nullptr;
  }
  auto* d = new (std::nothrow) PlanData();
  if (d == nullptr) return PyErr_NoMemory();
  d->entry = reinterpret_cast<launch_kernel_fn>(entry_address);
  d->operands = operands;
  bool ok = int_list(sizes, "result_sizes", &d->sizes) && int_list(strides, "result_strides", &d->strides) &&
            int_list(temporaries, "temporaries", &d->temporaries);
  if (ok && d->sizes.size() != d->strides.size()) {
    PyErr_SetString(PyExc_ValueError, "KernelPlan: result_sizes and result_strides differ in length");
    ok = false;
  }
  for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(launches); ++i) {
    d->launches.emplace_back();
    ok = parse_launch(PyTuple_GET_ITEM(launches, i), *d, operands, &d->launches.back());
  }
  auto* self = ok ? reinterpret_cast<KernelPlan*>(type->tp_alloc(type, 0)) : nullptr;
  if (self == nullptr) {
    delete d;
    return nullptr;
  }
  self->data = d;
  self->device_index = Py_NewRef(device_index);
  self->stream_fn = Py_NewRef(stream_fn);
  self->vectorcall = plan_call;
  return reinterpret_cast<PyObject*>(self);
}

int plan_traverse(KernelPlan* self, visitproc visit, void* arg) {
  Py_VISIT(self->device_index);
  Py_VISIT(self->stream_fn);
  return 0;
}

int plan_clear(KernelPlan* self) {
  Py_CLEAR(self->device_index);
  Py_CLEAR(self->stream_fn);
  return 0;
}

void plan_dealloc(KernelPlan* self) {
  PyObject_GC_UnTrack(self);
  plan_clear(self);
  delete self->data;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyTypeObject KernelPlanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef module_methods[] = {
    {"set_context_hook", set_context_hook, METH_O,
     "set_context_hook(hook): called after a refused launch, True to retry it once (see the file's comment)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tunekit_fast_plan", nullptr, -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit_tunekit_fast_plan(void) {
  KernelPlanType.tp_name = "tunekit_fast_plan.KernelPlan";
  KernelPlanType.tp_basicsize = sizeof(KernelPlan);
  KernelPlanType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  KernelPlanType.tp_doc = "KernelPlan(entry, operands, device_index, stream_fn, result_sizes, result_strides, "
                          "temporaries, launches): see fast_plan.cpp";
  KernelPlanType.tp_new = plan_new;
  KernelPlanType.tp_call = PyVectorcall_Call;
  KernelPlanType.tp_vectorcall_offset = offsetof(KernelPlan, vectorcall);
  KernelPlanType.tp_traverse = reinterpret_cast<traverseproc>(plan_traverse);
  KernelPlanType.tp_clear = reinterpret_cast<inquiry>(plan_clear);
  KernelPlanType.tp_dealloc = reinterpret_cast<destructor>(plan_dealloc);
  if (PyType_Ready(&KernelPlanType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&KernelPlanType);
  if (PyModule_AddObject(m, "KernelPlan", reinterpret_cast<PyObject*>(&KernelPlanType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
