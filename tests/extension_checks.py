"""A built extension for the tests that need one: CI has a compiler and torch's headers, so there the
extension must build (the test fails); elsewhere a machine without them skips the test."""

import os

import pytest


def built(backend, what: str):
    """``backend.load()`` (``fast_call``, ``fast_launch``, ``fast_route``, ...): the extension module."""
    module = backend.load()
    if module is None:
        if os.environ.get("CI"):
            pytest.fail(f"the {what} extension must build in CI: {backend.unavailable()}")
        pytest.skip(f"{what} extension unavailable: {backend.unavailable()}")
    return module
