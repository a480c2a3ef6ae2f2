"""Kernel sources, one folder per backend (``cuda/*.cu`` and ``*.cuh``, ``triton/*.py``)."""
