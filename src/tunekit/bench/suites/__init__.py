"""The benchmark suites, importable from an installed package (``tunekit bench``, ``tunekit report``).

``benchmarks/suites/activations.py`` and ``benchmarks/suites/logsumexp.py`` are thin scripts over
these modules; the measuring, the JSON they write and the Markdown rendered from it live here, so
the command and the scripts measure the same way and write files any reader of the committed
results can read.

- :mod:`~tunekit.bench.suites.common`: formatting helpers and ``head_to_head`` (contenders timed in
  rotated rounds on the same buffers).
- :mod:`~tunekit.bench.suites.activations`: silu / gelu / gelu-tanh, forward and backward.
- :mod:`~tunekit.bench.suites.logsumexp`: logsumexp forward and backward, with their targets.
- :mod:`~tunekit.bench.suites.panels`: a results JSON (either suite, or ``tunekit explore --json``)
  as plain series to plot, no matplotlib needed.
- :mod:`~tunekit.bench.suites.progress`: the progress line of ``tunekit bench``.
"""

SUITES = ("activations", "logsumexp")
