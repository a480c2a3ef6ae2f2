"""tunekit's version: a leaf module (no imports), so the runtime's validators can read it without
importing the package's top."""

__version__ = "0.1.0"
