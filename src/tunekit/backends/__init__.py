"""What turns kernel sources into launches: ``nvrtc`` (CUDA C compile and cubin cache), ``cuda``
(module loading and launches), ``triton`` (Triton kernels at run time), and the C / C++ host-side
extensions (``fast_launch``, ``fast_call``) with their shared pieces (``driver``, ``device``,
``cache``, ``extension``)."""
