"""The candidate interface: functions, closures and classes adapt to it."""

import pytest

from tunekit.tunable.candidate import Candidate, FunctionCandidate, as_candidate, candidate


def test_function_and_closure_adapt():
    def plain(p):
        return p + 1

    c = as_candidate(plain)
    assert c.name == "plain" and c.run(1) == 2 and c.supports(1) is None
    k = 10
    closure = as_candidate(lambda p: p + k, name="add_k", supports=lambda p: None if p > 0 else "needs p > 0")
    assert closure.run(1) == 11 and closure.supports(-1) == "needs p > 0" and closure.supports(1) is None


def test_decorator_forms():
    @candidate
    def bare(p):
        return p

    @candidate(name="named", supports=lambda p: "never")
    def other(p):
        return p

    assert isinstance(bare, FunctionCandidate) and bare.name == "bare"
    assert other.name == "named" and other.supports(0) == "never"


def test_classes_pass_through():
    class Doubler(Candidate):
        name = "doubler"

        def run(self, p):
            return 2 * p

    d = Doubler()
    assert as_candidate(d) is d and d.run(3) == 6 and d.supports(3) is None
    assert len(d.source_hash()) == 16
    with pytest.raises(ValueError):
        as_candidate(d, name="renamed")


def test_source_hash_follows_the_code():
    a = as_candidate(lambda p: p + 1, name="a")
    b = as_candidate(lambda p: p + 2, name="a")
    assert a.source_hash() != b.source_hash()
    assert a.source_hash() == a.source_hash()


def test_non_callable_is_refused():
    with pytest.raises(TypeError):
        as_candidate(42)


def _candidate_classes():
    import tunekit  # noqa: F401 - registers every op
    from tunekit.tunable.registry import all_ops

    return sorted({type(c) for op in all_ops() for c in op.candidates}, key=lambda t: (t.__module__, t.__qualname__))


@pytest.mark.parametrize("cls", _candidate_classes(), ids=lambda t: t.__qualname__)
def test_class_source_is_inspects_for_every_candidate_class(cls):
    """The fast class source gives inspect.getsource's text: a candidate's hash must not change."""
    import inspect

    from tunekit.tunable.candidate import class_source

    assert class_source(cls) == inspect.getsource(cls)


def test_class_source_falls_back_where_its_line_search_could_differ(tmp_path, monkeypatch):
    import importlib
    import inspect
    import sys

    from tunekit.tunable.candidate import class_source

    (tmp_path / "cs_probe.py").write_text(
        "import dataclasses\n\n\nclass Outer:\n    class Inner:\n        x = 1\n\n\n"
        "@dataclasses.dataclass(\n    frozen=True,\n)\nclass Frozen:\n    y: int = 2\n\n\n"
        "# a comment\n@dataclasses.dataclass\nclass Plain:\n    z: int = 3\n\n\n"
        "@dataclasses.dataclass\n\nclass Parted:\n    a: int = 4\n\n\n"
        "@dataclasses.dataclass\n# why\nclass Commented:\n    b: int = 5\n\n\n"
        "@dataclasses.dataclass\n# note\n@dataclasses.dataclass\nclass Stacked:\n    c: int = 6\n\n\n"
        "class Wrapped:\n    d = 7\n\n\nWrapped.__wrapped__ = Plain\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("cs_probe")
    try:
        for cls in (module.Outer, module.Outer.Inner, module.Frozen, module.Plain, module.Parted, module.Commented,
                    module.Stacked, module.Wrapped):
            assert class_source(cls) == inspect.getsource(cls)
        assert class_source(module.Plain).startswith("@dataclasses.dataclass\nclass Plain")
    finally:
        sys.modules.pop("cs_probe", None)
