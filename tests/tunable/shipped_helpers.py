"""Helpers of the shipped-results tests: a shipped file written per test, an entry as offline tuning stores
it, candidates that prepare (compile) before their first run."""


import pytest
import torch

from tunekit.tunable import shipped, tuning, validators
from tunekit.tunable.preparations import NeedsCompiler, compilers_allowed
from tunekit.tunable.entries import write_csv
from tunekit.tunable.results import ResultsStore

from fakes import FakeClock, ScaleParams, make_op

CPU = validators.device_name(torch.device("cpu"))
COSTS = {"ref": 2.0, "fast": 1.0, "medium": 1.5}


@pytest.fixture
def ship(tmp_path, monkeypatch):
    """ship(entries): write them as this machine's shipped file; shipped results on."""
    directory = tmp_path / "pretuned"
    directory.mkdir()
    monkeypatch.setattr(shipped, "SHIPPED_DIR", directory)
    shipped.forget_files()

    def write(entries):
        write_csv(shipped.file_for(CPU, directory), entries)
        shipped.forget_files()
    with tuning(use_shipped=True):
        yield write
    shipped.forget_files()


def tuned_entry(x, tmp_path, costs=COSTS):
    """What offline tuning of ``x``'s signature stores (a fresh op, its own results file)."""
    clock = FakeClock()
    op = make_op(clock, costs)
    op.clock = clock
    path = tmp_path / "offline.sqlite"
    with tuning(results=path, use_shipped=False):
        op(ScaleParams(x))
    return ResultsStore(path).entries("scale")[0]


def first_call(x):
    """A fresh op's first call: (why, the runs it made per candidate)."""
    op = make_op(None, COSTS)
    op(ScaleParams(x))
    return op.resolve(ScaleParams(x)).why, dict(op.runs)


class Preparing:
    """``inner`` (a candidate) with a ``prepare(params)``: a candidate that compiles before its first run."""

    fast_runner = None

    def __init__(self, inner, prepare):
        self.inner, self.name, self.prepare = inner, inner.name, prepare

    def supports(self, p):
        return self.inner.supports(p)

    def run(self, p):
        return self.inner.run(p)

    def source_hash(self):
        return self.inner.source_hash()


def op_whose(name, prepare):
    """A fresh op whose candidate ``name`` has ``prepare``."""
    return with_prepare(make_op(None, COSTS), name, prepare)


def with_prepare(op, name, prepare):
    """``op`` with its candidate ``name`` given ``prepare``."""
    wrapped = Preparing(op.candidate(name), prepare)
    op.candidates[op.candidates.index(wrapped.inner)] = wrapped
    op._by_name[name] = wrapped
    return op


def compiling(prepare):
    """A prepare that must compile: under kept-builds-only it raises NeedsCompiler, as Triton's launch does."""
    def run(p):
        if not compilers_allowed():
            raise NeedsCompiler("no kept build")
        return prepare(p)
    return run
