"""Backends that turn kernel sources into candidates: ``nvrtc`` (CUDA C)."""
