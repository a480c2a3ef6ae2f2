"""Kernel sources, one folder per backend (``cuda/*.cu``)."""
