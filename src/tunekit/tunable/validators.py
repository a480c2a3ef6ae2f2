"""Validators: the facts a tuning result depends on. A stored entry is used only where they all match.

Environment facts (per device): device name and compute capability, CUDA runtime and driver
versions, torch / triton / tunekit versions. Per op: a hash of each candidate's source, so adding,
removing or editing a candidate re-tunes that op's signatures (and nothing else).
"""

from __future__ import annotations

import ctypes
import functools
import platform

import torch

from .._version import __version__
from .installed import installed_version

__all__ = ["environment", "device_name", "candidate_hashes", "op_candidate_hashes", "use_op_hashes", "validators_for",
           "mismatches"]


def _version(package: str) -> str:
    return installed_version(package) or "none"


@functools.lru_cache(maxsize=None)
def _cuda_driver_version() -> str:
    """The driver's CUDA version (e.g. "13.0"), read from libcuda without needing cuda-bindings."""
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        value = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(value)) == 0:
            return f"{value.value // 1000}.{value.value % 1000 // 10}"
    return "none"


@functools.lru_cache(maxsize=None)
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine() or "unknown")


@functools.lru_cache(maxsize=None)
def _device_facts(device_type: str, index: int | None) -> tuple[tuple[str, str], ...]:
    facts = {
        "torch": torch.__version__,
        "triton": _version("triton"),
        "tunekit": __version__,
    }
    if device_type == "cuda":
        props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
        facts.update(
            device=props.name,
            compute_capability=f"{props.major}.{props.minor}",
            cuda_runtime=str(torch.version.cuda or torch.version.hip or "none"),
            cuda_driver=_cuda_driver_version(),
        )
    else:
        facts.update(device=_cpu_name() if device_type == "cpu" else device_type)
    return tuple(sorted(facts.items()))


def environment(device: torch.device) -> dict[str, str]:
    """Environment facts for ``device`` (cached: they don't change within a process)."""
    return dict(_device_facts(device.type, device.index))


def device_name(device: torch.device) -> str:
    return dict(_device_facts(device.type, device.index))["device"]


def candidate_hashes(candidates) -> dict[str, str]:
    return {f"candidate:{c.name}": c.source_hash() for c in candidates}


#: ``hashes(op_name, candidates)`` in place of :func:`candidate_hashes` where an op decides its first signature;
#: tunekit's ops set one that keeps them between processes (``backends/stored_hashes.py``)
_op_hashes = None


def use_op_hashes(hashes) -> None:
    """Make ``hashes(op_name, candidates)`` give an op's candidate hashes (None: computed each process)."""
    global _op_hashes
    _op_hashes = hashes


def op_candidate_hashes(op_name: str, candidates) -> dict[str, str]:
    """:func:`candidate_hashes` of the op ``op_name``, through the function :func:`use_op_hashes` set."""
    return candidate_hashes(candidates) if _op_hashes is None else _op_hashes(op_name, candidates)


def validators_for(device: torch.device, candidates) -> dict[str, str]:
    """Everything an entry tuned now on ``device`` with these candidates depends on."""
    return {**environment(device), **candidate_hashes(candidates)}


def mismatches(stored: dict[str, str], current: dict[str, str]) -> list[str]:
    """Readable differences (empty when the stored entry is valid here)."""
    out = []
    for key in sorted(set(stored) | set(current)):
        was, now = stored.get(key), current.get(key)
        if was != now:
            if key.startswith("candidate:"):
                name = key.removeprefix("candidate:")
                what = "added" if was is None else "removed" if now is None else "changed"
                out.append(f"candidate {name} {what}")
            else:
                out.append(f"{key} {was} -> {now}")
    return out
