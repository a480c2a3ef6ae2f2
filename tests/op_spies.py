"""Proof that a call went through tunekit: count the runs of a tunable op's candidates.

Every tunekit op call ends in ``candidate.run(params)`` (the cached path looks ``run`` up on the
candidate each time), so wrapping every candidate's ``run`` sees every call, whichever candidate
was chosen. With tuning off (``tunekit.tuning(tuning=False)``) one call is exactly one run; with
tuning on, the first call of a signature also runs candidates on trial copies while tuning.
"""

from __future__ import annotations

from tunekit.tunable.registry import get_op


class CandidateRuns:
    """``runs["silu"]``: the params of every run of a candidate of op ``silu`` since creation."""

    def __init__(self, monkeypatch, *op_names: str):
        self.runs: dict[str, list] = {name: [] for name in op_names}
        for name in op_names:
            for candidate in get_op(name).candidates:
                monkeypatch.setattr(candidate, "run", self._spy(self.runs[name], candidate.run))

    @staticmethod
    def _spy(log: list, run):
        def spy(params):
            log.append(params)
            return run(params)
        return spy

    def count(self, name: str) -> int:
        return len(self.runs[name])

    def total(self) -> int:
        return sum(len(r) for r in self.runs.values())

    def counts(self) -> dict[str, int]:
        return {name: len(r) for name, r in self.runs.items()}
