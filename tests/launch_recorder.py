"""A stand-in for the driver's cuLaunchKernel with its C signature, for testing launch paths
without a GPU (tests/backends/test_fast_launch.py, test_fast_call.py)."""

from __future__ import annotations

import ctypes

LAUNCH_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                    ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class RecordingDriver:
    """Records each call, reading ``n_args`` 64-bit kernel parameters; returns ``result``.
    ``address`` is the entry point to hand to a launcher."""

    def __init__(self, n_args: int, result: int = 0):
        self.calls = []
        self.result = result

        def entry(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            values = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(n_args)]
            self.calls.append(dict(function=f, grid=(gx, gy, gz), block=(bx, by, bz), shared=shared, stream=stream,
                                   values=values, extra=extra))
            return self.result

        self._entry = LAUNCH_SIGNATURE(entry)  # kept alive as long as the recorder
        self.address = ctypes.cast(self._entry, ctypes.c_void_p).value


class LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: an id in an 8-byte slot, a 64-byte value union (read as its first int)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig."""
    _fields_ = [("dims", ctypes.c_uint * 7), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


LAUNCH_EX_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


class RecordingDriverEx:
    """A stand-in for cuLaunchKernelEx: records the config, its attributes and ``n_args`` 64-bit
    kernel parameters; returns ``result``."""

    def __init__(self, n_args: int, result: int = 0):
        self.calls = []
        self.result = result

        def entry(config, f, params, extra):
            c = config[0]
            values = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0] for i in range(n_args)]
            attrs = [(c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)]
            self.calls.append(dict(function=f, grid=tuple(c.dims[0:3]), block=tuple(c.dims[3:6]), shared=c.dims[6],
                                   stream=c.stream, attrs=attrs, values=values, extra=extra))
            return self.result

        self._entry = LAUNCH_EX_SIGNATURE(entry)
        self.address = ctypes.cast(self._entry, ctypes.c_void_p).value
