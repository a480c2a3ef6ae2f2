"""Triton kernels (``activations.py``), imported only when a Triton candidate first runs."""
