"""tunekit in code you did not write: drop-in modules (:mod:`~tunekit.torch_compat.nn`, exported as
``tunekit.nn``) and :func:`~tunekit.torch_compat.patch.patch`, both built from the op families of
``tunekit/ops`` (each op defines its module classes and patch targets next to its public function)."""
