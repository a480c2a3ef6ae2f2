"""Proof that a call went through tunekit: count the runs of a tunable op's candidates.

Every tunekit op call ends in ``candidate.run(params)`` (the cached path looks ``run`` up on the
candidate each time) or in a runner the candidate's ``fast_runner`` made (the public functions'
fast path), so wrapping both sees every call, whichever candidate was chosen. Runners already
cached are dropped (``op.forget()``) when the spies are set, and again by :meth:`close` (call it
when the test ends: the spied runners must not outlive the spies). With tuning off (``tunekit.tuning(tuning=False)``) one call is exactly one run; with
tuning on, the first call of a signature also runs candidates on trial copies while tuning.
"""

from __future__ import annotations

from tunekit.tunable.registry import get_op


class CandidateRuns:
    """``runs["silu"]``: the params of every run of a candidate of op ``silu`` since creation."""

    def __init__(self, monkeypatch, *op_names: str):
        self.runs: dict[str, list] = {name: [] for name in op_names}
        for name in op_names:
            op = get_op(name)
            for candidate in op.candidates:
                monkeypatch.setattr(candidate, "run", self._spy(self.runs[name], candidate.run))
                make = getattr(candidate, "fast_runner", None)
                if make is not None:
                    monkeypatch.setattr(candidate, "fast_runner", self._spy_runner(self.runs[name], make))
            op.forget()  # runners cached before the spies would bypass them
        self.op_names = op_names

    def close(self) -> None:
        for name in self.op_names:
            get_op(name).forget()

    @staticmethod
    def _spy_runner(log: list, make):
        def spy_make(params):
            runner = make(params)
            if runner is None:
                return None

            def spy(*tensors):
                log.append(params.replace(**dict(zip(params.inputs, tensors))))
                return runner(*tensors)
            return spy
        return spy_make

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
