"""Triton kernels, one module per op family, imported only when a Triton candidate first runs."""
