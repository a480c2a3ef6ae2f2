"""cuBLASLt's matmul through ctypes: plans (descriptors and the heuristic's ranked algorithms) for a
2-D GEMM layout, and a call of one of those algorithms on torch tensors.

Why: torch's ``mm`` runs the one algorithm cuBLAS's heuristic ranks first; cuBLASLt offers more for
the same problem (other tiles, split-K, stream-K), and an autotuner can time them, as PyTorch's
TunableOp does with hipBLASLt on ROCm. The library is the one torch already loaded
(``libcublasLt.so.<major>``: the CUDA wheels link it), so nothing is installed or built; on a
machine without it (the CPU wheels) :func:`unavailable` says why and nothing here runs.

Layouts: torch's row-major ``out[M, N] = a[M, K] @ b[K, N]`` is cuBLASLt's column-major
``out^T[N, M] = b^T[N, K] @ a^T[K, M]``: cuBLASLt's A is torch's ``b`` and its B torch's ``a``. A
dense row-major operand is, read column-major, its own transpose (op N); a dense column-major one
(a ``weight.t()``) is the matrix itself (op T). ``out`` is a dense row-major [M, N] (ld = N).

Values are those of the enums and structs in cuBLAS 12 / 13's ``cublasLt.h`` and ``library_types.h``
(stable across those releases).
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch

__all__ = ["unavailable", "Plan", "plan_for", "operand_layout", "matmul", "MAX_ALGORITHMS", "WORKSPACE_BYTES"]

#: algorithms asked of the heuristic per problem
MAX_ALGORITHMS = 8
#: workspace per (device, stream): what the heuristic may assume (split-K / stream-K partials)
WORKSPACE_BYTES = 32 * 1024 * 1024

_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_DATA_TYPES = {torch.float32: _CUDA_R_32F, torch.float16: _CUDA_R_16F, torch.bfloat16: _CUDA_R_16BF}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_OP_N, _OP_T = 0, 1
_PREF_MAX_WORKSPACE_BYTES, _PREF_REDUCTION_SCHEME_MASK = 1, 3
#: split-K partials of a 16-bit result reduced in float32 only (INPLACE and OUTPUT_TYPE reduce in the
#: output's type: on the H200 those algorithms missed a float32-accumulation bound by 10x at K = 333)
_REDUCE_IN_COMPUTE_TYPE, _REDUCE_ANY = 2, 7
_PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_p, _vp, _sz = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
_PROTOTYPES = {
    "cublasLtCreate": [ctypes.POINTER(_p)],
    "cublasLtMatmulDescCreate": [ctypes.POINTER(_p), ctypes.c_int, ctypes.c_int],
    "cublasLtMatmulDescSetAttribute": [_p, ctypes.c_int, _vp, _sz],
    "cublasLtMatrixLayoutCreate": [ctypes.POINTER(_p), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
    "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(_p)],
    "cublasLtMatmulPreferenceSetAttribute": [_p, ctypes.c_int, _vp, _sz],
    "cublasLtMatmulPreferenceDestroy": [_p],
    "cublasLtMatmulAlgoGetHeuristic": [_p, _p, _p, _p, _p, _p, _p, ctypes.c_int, ctypes.POINTER(_HeuristicResult),
                                       ctypes.POINTER(ctypes.c_int)],
    "cublasLtMatmul": [_p, _p, _vp, _vp, _p, _vp, _p, _vp, _vp, _p, _vp, _p, ctypes.POINTER(_Algo), _vp, _sz, _p],
}


@functools.lru_cache(maxsize=None)
def _library():
    """(the loaded library with its prototypes set, None) or (None, why not)."""
    if not torch.cuda.is_available():
        return None, "cuBLASLt needs a CUDA device"
    major = (torch.version.cuda or "").split(".")[0]
    for name in (f"libcublasLt.so.{major}", "libcublasLt.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for fn, argtypes in _PROTOTYPES.items():
            getattr(lib, fn).argtypes, getattr(lib, fn).restype = argtypes, ctypes.c_int
        return lib, None
    return None, f"libcublasLt.so.{major} could not be loaded"


def unavailable() -> str | None:
    """Why cuBLASLt cannot run here, or None."""
    return _library()[1]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt: {what} returned status {status}")


_lock = threading.Lock()
_handles: dict[int, ctypes.c_void_p] = {}
_workspaces: dict[tuple[int, int], torch.Tensor] = {}


def _handle(device: int) -> ctypes.c_void_p:
    handle = _handles.get(device)
    if handle is None:
        with _lock, torch.cuda.device(device):
            handle = _handles.get(device)
            if handle is None:
                handle = ctypes.c_void_p()
                _check(_library()[0].cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
                _handles[device] = handle
    return handle


def _workspace(device: int, stream: int) -> torch.Tensor:
    """This stream's workspace; during CUDA graph capture a new one (the graph's pool owns it)."""
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    ws = _workspaces.get((device, stream))
    if ws is None:
        ws = _workspaces[(device, stream)] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return ws


def operand_layout(t: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(op, rows, cols, ld) of a dense 2-D operand read column-major (see the module docstring), or
    None for any other layout."""
    rows, cols = t.shape
    sr, sc = t.stride()
    if sc == 1 and (sr == cols or rows == 1):
        return _OP_N, cols, rows, max(cols, 1)  # row-major: its transpose, column-major
    if sr == 1 and (sc == rows or cols == 1):
        return _OP_T, rows, cols, max(rows, 1)  # column-major: itself, read transposed
    return None


def _alignment(t: torch.Tensor) -> int:
    """The largest of 16, 8, 4, 2 bytes dividing the data pointer (the call key holds it mod 16)."""
    ptr = t.data_ptr()
    return next(a for a in (16, 8, 4, 2, 1) if ptr % a == 0)


class Plan:
    """One problem's descriptors and the heuristic's ranked algorithms (``algorithms``: how many)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, tf32: bool):
        lib = _library()[0]
        self.device = a.device.index if a.device.index is not None else torch.cuda.current_device()
        self.handle = _handle(self.device)
        dtype = _DATA_TYPES[a.dtype]
        compute = _COMPUTE_32F_FAST_TF32 if a.dtype is torch.float32 and tf32 else _COMPUTE_32F
        (op_b, rows_b, cols_b, ld_b), (op_a, rows_a, cols_a, ld_a) = operand_layout(b), operand_layout(a)
        M, N = a.shape[0], b.shape[1]
        self.desc, self.lt_a, self.lt_b, self.lt_d = (ctypes.c_void_p() for _ in range(4))
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), compute, _CUDA_R_32F), "MatmulDescCreate")
        for attr, value in ((_DESC_TRANSA, op_b), (_DESC_TRANSB, op_a)):
            v = ctypes.c_int32(value)
            _check(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4), "MatmulDescSetAttribute")
        for layout, rows, cols, ld in ((self.lt_a, rows_b, cols_b, ld_b), (self.lt_b, rows_a, cols_a, ld_a),
                                       (self.lt_d, N, M, max(N, 1))):
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, ld), "MatrixLayoutCreate")
        self.results = (_HeuristicResult * MAX_ALGORITHMS)()
        # descriptors live as long as the process, as torch's own plan caches do
        reduction = _REDUCE_ANY if a.dtype is torch.float32 else _REDUCE_IN_COMPUTE_TYPE
        self.algorithms = self._heuristic(lib, {"a": _alignment(b), "b": _alignment(a), "c": 16, "d": 16}, reduction)

    def _heuristic(self, lib, alignments: dict, reduction: int) -> int:
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
        try:
            size, mask = ctypes.c_uint64(WORKSPACE_BYTES), ctypes.c_uint32(reduction)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8),
                   "MatmulPreferenceSetAttribute")
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_REDUCTION_SCHEME_MASK, ctypes.byref(mask), 4),
                   "MatmulPreferenceSetAttribute")
            for operand, attr in _PREF_MIN_ALIGNMENT.items():
                v = ctypes.c_uint32(alignments[operand])
                _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4),
                       "MatmulPreferenceSetAttribute")
            found = ctypes.c_int(0)
            status = lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.lt_a, self.lt_b, self.lt_d,
                                                        self.lt_d, pref, MAX_ALGORITHMS, self.results,
                                                        ctypes.byref(found))
            return found.value if status == 0 else 0  # NOT_SUPPORTED: no algorithm for this problem
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)


_plans: dict[tuple, Plan] = {}
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)


def plan_for(a: torch.Tensor, b: torch.Tensor, tf32: bool) -> Plan:
    """The plan of ``a @ b``'s problem (dtype, shapes, layouts, pointer alignments, TF32), made once."""
    key = (a.device, a.dtype, tf32, a.shape, b.shape[1], a.stride(), b.stride(), _alignment(a), _alignment(b))
    plan = _plans.get(key)
    if plan is None:
        with _lock:
            plan = _plans.get(key)
        if plan is None:
            plan = Plan(a, b, tf32)
            with _lock:
                plan = _plans.setdefault(key, plan)
    return plan


def matmul(plan: Plan, rank: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = a @ b`` by the plan's algorithm ``rank`` (``out``: dense row-major [M, N]) on torch's
    current stream."""
    if not 0 <= rank < plan.algorithms:
        raise ValueError(f"cuBLASLt offers {plan.algorithms} algorithms for this problem, not rank {rank}")
    stream = torch._C._cuda_getCurrentRawStream(plan.device)
    ws = _workspace(plan.device, stream)
    result = plan.results[rank]
    lib = _library()[0]
    _check(lib.cublasLtMatmul(plan.handle, plan.desc, ctypes.byref(_ONE), b.data_ptr(), plan.lt_a, a.data_ptr(),
                              plan.lt_b, ctypes.byref(_ZERO), out.data_ptr(), plan.lt_d, out.data_ptr(), plan.lt_d,
                              ctypes.byref(result.algo), ws.data_ptr(), WORKSPACE_BYTES, stream), "cublasLtMatmul")
    return out
