"""CUDA C sources compiled at first use by :mod:`tunekit.backends.nvrtc`."""
