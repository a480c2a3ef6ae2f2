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
