"""Names of dtypes, one table for the whole package: the short forms signatures use (``f16``), the
long forms the CLI and benchmarks take (``float16``), and the floating-point types tunekit's own
kernels compute."""

from __future__ import annotations

import torch

__all__ = ["SHORT_NAMES", "BY_NAME", "KERNEL_DTYPES", "short_name", "long_name"]

#: dtype -> the short name used in signatures and kernel names (``f32``, ``bf16``, ...)
SHORT_NAMES = {
    torch.float64: "f64", torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "bool", torch.complex64: "c64", torch.complex128: "c128",
}

#: the floating-point dtypes by their long name (command-line arguments, benchmark tables)
BY_NAME = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}

#: the storage types tunekit's CUDA C and Triton kernels compute (in float32 math)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def short_name(dtype: torch.dtype) -> str:
    return SHORT_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def long_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
