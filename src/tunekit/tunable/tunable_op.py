"""TunableOp: an op's candidates behind one call, and the choice of which one runs.

A call: ``params.cache_key()`` -> in-memory choice -> run it: one ContextVar, two dict lookups, no lock.

A shorter path for the commonest call (``tunekit.silu(x)``: contiguous ``x``, no ``out``): ``op.fast_call(x)``
runs the choice's *runner*, a function of ``x`` with everything else bound, or returns None
(:mod:`tunekit.tunable.fast_path` says why and how). Runners are cached next to the choice, when a candidate
offers one (``fast_runner(params)``), and dropped with it.

On a miss (:meth:`TunableOp.resolve`, under one process-wide lock so concurrent first calls with
one signature tune once, and tuning runs never overlap each other's timings):

1. a choice already made in this process for the same signature;
2. a valid stored entry for (op, signature, device), else a shipped one (:mod:`tunekit.tunable.shipped`:
   prepared on a worker while a stand-in or the default runs, as a stored choice whose build takes seconds);
3. tuning on, not making a CUDA graph -> a tuning session, spread over calls (its incumbent runs
   meanwhile, from the cache while the session waits for compiles), then the entry is stored;
4. otherwise the default, recorded as untuned with ``record_untuned`` (nothing cached while a graph is made).
"""

from __future__ import annotations

import functools
import math
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from . import context, fast_path, graph_making, isolation, preparations, shipped, validators
from .candidate import as_candidate
from .errors import TunekitWarning
from .session import TuningSession
from .numerics import compare_all, tolerance, warm_compare
from .params import OpParams
from .entries import Entry
from .stores import results_store

__all__ = ["TunableOp", "Resolution", "TUNING_LOCK", "use_decider", "current_decider"]

#: Held while resolving a miss. Re-entrant: a candidate may call another tunable op while tuning.
TUNING_LOCK = threading.RLock()

#: Decides a new signature instead of ``op.decide_here`` (None: decide here); ``tunekit.distributed.enable()`` sets it
_decider = None


def use_decider(decider):
    """Make ``decider(op, params, settings, signature, device, device_name) -> Resolution`` decide every new
    signature (None: each process decides by :meth:`TunableOp.decide_here`); returns the one it replaces."""
    global _decider
    previous, _decider = _decider, decider
    return previous


def current_decider():  # the decider use_decider set, or None
    return _decider


TUNED_DEVICES = ("cpu", "cuda")  # device types whose signatures are tuned and stored; others run the default


class _SessionContext(NamedTuple):  # what storing a session's entry needs, fixed when the session starts
    signature: str
    device_name: str
    store: object
    current: dict
    stale: str


@dataclass
class Resolution:
    """Which candidate runs for a signature, and why (what ``tunekit.explain`` shows)."""
    candidate: object
    why: str
    signature: str
    device: str
    entry: Entry | None = None
    cache: bool = True  # False: decide again next call (graph capture, tuning in progress)


class TunableOp:
    """Candidates registered by name, exactly one of them the default (which must run any input)."""

    def __init__(self, name: str, params_type: type[OpParams], *, make_params: Callable[..., OpParams] | None = None,
                 make_example: Callable[..., OpParams] | None = None,
                 tolerance: Callable[[OpParams], tuple[float, float]] | None = None,
                 numerics: Callable[[OpParams, tuple, tuple], str | None] | None = None,
                 fast_calls: Callable[[dict, Callable, frozenset], None] = fast_path.install_python_fast_call):
        self.name, self.params_type = name, params_type
        #: builds params from the public function's arguments (explain)
        self.make_params = make_params
        #: builds params on fresh random inputs: ``make_example(shape, dtype, device)`` (CLI, benchmarks)
        self.make_example = make_example
        self._tolerance, self._numerics = tolerance, numerics
        #: host clock for tuning budgets and CPU timings (tests inject a fake one)
        self.clock = time.perf_counter
        self.candidates, self.default = [], None
        self._by_name: dict[str, object] = {}
        self._choices: dict[tuple, dict] = {}  # cache_id -> {cache_key: candidate (or preparations.ParkedChoice)}
        self._decided: dict[tuple, dict[str, Resolution]] = {}  # cache_id -> {signature: Resolution}
        self._runners: dict[tuple, dict] = {}  # cache_id -> {cache_key: runner} (fast form only)
        self._sessions: dict[tuple, TuningSession] = {}  # (cache_id, signature) -> a tuning over calls
        self._preparing: dict[tuple, shipped.Preparation] = {}  # (cache_id, signature) -> a shipped choice compiling
        self._hashes: dict[str, str] | None = None  # the candidates' source hashes, until one is added
        #: the most candidates with a compile (``prepare``) an online session tries (None: all; preparations.py)
        self.online_preparations: int | None = None
        #: what a challenger must save beyond the margin (the host time its call path adds): ms, or the op's
        self.challenger_host_ms, self.challenger_floor = 0.0, None  # rule(params, candidate) -> ms: margin_rule.py
        self.warm_numerics, self.off_thread = warm_compare, None  # the check's loads; work made worker-safe: session.py
        self.on_forget: list[Callable[[], None]] = []  # called whenever choices are dropped: derived caches go too
        self.call = self._make_call()  # the call path as a plain function: op.call(params) is op(params), faster
        #: ``fast_call(x[, extra])``: the cached choice's runner on ``x``, or None (tunable/fast_path.py): in Python
        #: until a runner is cached, then what ``fast_calls`` installs; differentiable runners may take x requiring grad
        self.differentiable_runners = frozenset()
        self.fast_call = fast_path.python_fast_call(self._runners)
        self._fast_calls, self._fast_call_made = fast_calls, False

    # -- registration ---------------------------------------------------------------------------
    def add(self, impl, *, name: str | None = None, supports=None, default: bool = False, fast_runner=None):
        """Register a candidate (a Candidate, or ``fn(params)`` with optional ``fast_runner``: see candidate.py)."""
        c = as_candidate(impl, name=name, supports=supports, fast_runner=fast_runner)
        if c.name in self._by_name:
            raise ValueError(f"op {self.name!r} already has a candidate named {c.name!r}")
        if default and self.default is not None:
            raise ValueError(f"op {self.name!r} already has a default candidate ({self.default.name!r})")
        self.candidates.append(c)
        self._by_name[c.name] = c
        if default:
            self.default = c
        self.forget()
        return c

    def candidate(self, name: str):
        if name not in self._by_name:
            raise KeyError(f"op {self.name!r} has no candidate {name!r}; it has {', '.join(self._by_name)}")
        return self._by_name[name]

    def tolerance(self, params: OpParams) -> tuple[float, float]:
        """(rtol, atol) for the numerical check: the op's own rule, else by the first input's dtype."""
        return self._tolerance(params) if self._tolerance else tolerance(getattr(params, params.inputs[0]).dtype)

    def numerics(self, params: OpParams) -> Callable[[tuple, tuple], str | None]:
        """The numerical check for ``params``: ``check(outputs, expected)`` -> None when a candidate's outputs agree
        with the default's, else why not: :func:`numerics.compare` of each output with the op's :meth:`tolerance`,
        or the op's own rule (``numerics=``: a GEMM bound that grows with K)."""
        if self._numerics is None:
            return compare_all(self.tolerance(params))
        return lambda got, expected: self._numerics(params, got, expected)

    def forget(self, sessions_only: bool = False) -> None:
        """Drop in-memory choices and sessions (stored results stay); ``sessions_only``: the sessions under
        way alone, unstored (calls will not return to them: ops/_shared/grad_call.py)."""
        with TUNING_LOCK:
            for session in self._sessions.values():  # its compiles not started are not needed any more
                session.preparations.cancel()
            self._sessions.clear()
            if not sessions_only:
                for memo in (self._choices, self._decided, self._runners, self._preparing):
                    memo.clear()
                self._hashes = None
                self._forgotten()

    def _forgotten(self) -> None:
        for hook in self.on_forget:
            hook()

    # -- calling --------------------------------------------------------------------------------
    def __call__(self, params: OpParams):
        return self.call(params)

    def _make_call(self):
        """The cached call path as a closure (cheaper than ``__call__``): a ContextVar, the key, two dicts."""
        choices_by_settings = self._choices  # only ever cleared, never replaced
        get_settings = context._current.get
        miss = self._miss

        def call(params: OpParams):
            s = get_settings() or context._defaults
            if s.enabled:
                choices = choices_by_settings.get(s.cache_id)
                c = choices.get(params.cache_key()) if choices is not None else None
                return (c if c is not None else miss(params, s)).run(params)
            return self.default.run(params)

        return call

    def _miss(self, params: OpParams, s: context.TuningSettings):
        with TUNING_LOCK:
            choices = self._choices.setdefault(s.cache_id, {})
            key = params.cache_key()
            if choices.get(key) is not None:
                return choices[key]
            r = self.resolve(params, s)
            if r.cache:
                choices[key] = r.candidate
                self._add_runner(s, key, params, r.candidate)
            else:  # a session waiting for compiles: its incumbent runs with no resolve until one is ready
                session = self._sessions.get((s.cache_id, r.signature))
                preparations.park(session, choices, key, functools.partial(self._miss, s=s))
            return r.candidate

    def _add_runner(self, s, key, params: OpParams, c) -> None:
        """Cache ``c``'s runner for ``key`` when the public function's fast path can reach these
        params by their key alone (``params.fast_form()``) and ``c`` offers a runner."""
        make = getattr(c, "fast_runner", None)
        if make is None or not params.fast_form():
            return
        runner = make(params)
        if runner is not None:
            self._runners.setdefault(s.cache_id, {})[key] = runner
            if not self._fast_call_made:  # made here, not at import: the first runner needs it
                self._fast_call_made = True
                self._fast_calls(self._runners, functools.partial(setattr, self, "fast_call"),
                                 frozenset(self.differentiable_runners))

    def resolve(self, params: OpParams, s: context.TuningSettings | None = None, *, finish: bool = False) -> Resolution:
        """Decide which candidate runs ``params`` (tuning if the settings allow it). A new signature's
        tuning is a session spread over its first calls; ``finish`` completes it in this call."""
        s = s or context.current()
        if self.default is None:
            raise RuntimeError(f"op {self.name!r} has no default candidate")
        if not s.enabled:
            return Resolution(self.default, "tunekit is disabled (tuning(enabled=False)): the default runs", "", "")
        device = params.device
        if device.type not in TUNED_DEVICES:  # meta, mps, xla, ...: nothing to time, nothing to store
            return Resolution(self.default, f"{device.type} tensors run the default (only CPU and CUDA are tuned)",
                              "", device.type)
        with TUNING_LOCK, isolation.apart():  # calls another thread's capture would refuse (not two captures)
            signature = params.signature()
            name = validators.device_name(device)
            decided = self._decided.setdefault(s.cache_id, {})
            known = decided.get(signature)
            if known is not None:
                return known
            session = self._sessions.get((s.cache_id, signature))
            if session is not None:
                r = self._advance(session, params, s, finish)
            elif (s.cache_id, signature) in self._preparing:
                r = self._when_prepared(s, signature, math.inf if finish else 0.0)
            elif _decider is not None:
                r = _decider(self, params, s, signature, device, name)
            else:
                r = self.decide_here(params, s, signature, device, name, incremental=not finish)
            if r.cache:
                decided[signature] = r
            return r

    def decision(self, params: OpParams, s: context.TuningSettings | None = None) -> Resolution | None:
        """What this process decided for ``params``' signature (None: not met, or tuning). Never tunes or runs."""
        with TUNING_LOCK:
            return self._decided.get((s or context.current()).cache_id, {}).get(params.signature())

    def decisions(self, s: context.TuningSettings) -> int:  # signatures decided under s: grows until forget
        return len(self._decided.get(s.cache_id, ()))

    def session_calls(self) -> dict:  # {(settings id, signature): calls that met its session}, of those under way
        return {k: session.calls for k, session in list(self._sessions.items())}

    def tuning_in_progress(self, params: OpParams, s: context.TuningSettings | None = None) -> bool:
        return self.in_effect(params, s)[1]  # a tuning session for params' signature under way (over calls)

    def in_effect(self, params: OpParams, s: context.TuningSettings | None = None) -> tuple[object, bool]:
        """(what the next call of ``params``' signature runs if nothing new is learnt, whether its tuning or
        preparation is under way): the decision, a session's incumbent or stand-in, else the default."""
        s = s or context.current()
        signature = params.signature()
        with TUNING_LOCK:
            known = self._decided.get(s.cache_id, {}).get(signature)
            if known is not None:
                return known.candidate, False
            session = self._sessions.get((s.cache_id, signature))
            if session is not None:
                return session.incumbent, True
            preparing = self._preparing.get((s.cache_id, signature))  # a shipped choice: what runs meanwhile
            return (preparing.meanwhile() or self.default, True) if preparing else (self.default, False)

    def decide_here(self, params, s, signature, device, device_name, *, incremental: bool = True) -> Resolution:
        """Decide a signature met for the first time, in this process: a valid stored entry, else a valid shipped
        one (pre-tuned for this GPU model), else tuning (when the settings allow it and no CUDA graph is being made),
        else the default. ``incremental``: tuning may go on over later calls (a session); False tunes in this call."""
        making = graph_making.why(device)  # a capture, or Inductor's warm-up before one: never tuned
        store = results_store(s.results)
        if self._hashes is None:  # hashing every candidate's source took 1.0-3.5 ms per op: kept between processes
            self._hashes = validators.op_candidate_hashes(self.name, self.candidates)
        current = {**validators.environment(device), **self._hashes}
        stale, prior = "", None
        entry = store.get(self.name, signature, device_name) if s.use_stored else None
        if entry is not None:
            problems = validators.mismatches(entry.validators, current)
            if entry.choice not in self._by_name:
                problems.append(f"chosen candidate {entry.choice} no longer exists")
            if not problems and (entry.complete or not s.tuning or making):
                how = "stored result" if entry.complete else "stored result (incomplete tuning)"
                r = Resolution(self._by_name[entry.choice], how, signature, device_name, entry)
                slow = getattr(r.candidate, "slow_build", False) and incremental and not making
                return self._when_prepared(s, signature, s.max_tuning_ms, (r, params)) if slow else r
            stale = "; ".join(problems) if problems else "stored entry is incomplete"
            prior = None if problems else self._by_name[entry.choice]  # what runs while tuning resumes
        shipped_entry = shipped.shipped_entry(self.name, signature, device_name, current) if s.use_shipped else None
        if shipped_entry is not None and shipped_entry.choice in self._by_name:
            why = "shipped result (pre-tuned on this GPU model)" + (f"; stored entry ignored: {stale}" if stale else "")
            r = Resolution(self._by_name[shipped_entry.choice], why, signature, device_name, shipped_entry)
            return r if making or not incremental else self._when_prepared(s, signature, s.max_tuning_ms, (r, params))
        if making or not s.tuning:
            if s.record_untuned:
                try:
                    store.record_untuned(self.name, signature, device_name, params.spec())
                except Exception as exc:  # recording is best effort, never breaks the call
                    warnings.warn(f"tunekit: could not record untuned signature: {exc}", TunekitWarning, stacklevel=4)
            why = f"{making}: no tuning" if making else "no tuned result and tuning is off"
            if stale:
                why += f" (stored entry ignored: {stale})"
            return Resolution(self.default, why + ": the default runs", signature, device_name, cache=not making)
        session = TuningSession(self, params, s, clock=self.clock, background=incremental, incumbent=prior)
        session.context = _SessionContext(signature, device_name, store, current, stale)
        if incremental:
            self._sessions[(s.cache_id, signature)] = session
        return self._advance(session, params, s, finish=not incremental)

    def _when_prepared(self, s, signature: str, wait_ms: float, start: tuple | None = None) -> Resolution:
        """The choice prepared on a worker (``start``: its Resolution and params, to begin) once ready, waiting at
        most ``wait_ms`` (the first call the budget, later calls not at all); meanwhile the entry's next fastest
        ready or the default, decided again next call; if it failed, that stand-in (else the default) for good."""
        if start is not None:
            pick = functools.partial(shipped.stand_in, start[0].entry, self._by_name, self.default, s.margin)
            self._preparing[(s.cache_id, signature)] = shipped.Preparation(*start, pick)
        r = self._preparing[(s.cache_id, signature)].resolution
        problem, meanwhile = self._preparing[(s.cache_id, signature)].wait(wait_ms)
        runs = f"{meanwhile.name} (timed next fastest) runs" if meanwhile else "the default runs"
        if problem in shipped.UNDER_WAY:
            return Resolution(meanwhile or self.default, f"{r.why}: {problem}, {runs} meanwhile", signature,
                              r.device, cache=False)
        del self._preparing[(s.cache_id, signature)]
        if problem is None:
            return r
        why = f"the {r.why.split(' ')[0]} choice {r.candidate.name} could not be prepared ({problem}): {runs}"
        warnings.warn(f"tunekit: {self.name} {signature}: {why}", TunekitWarning, stacklevel=5)
        return Resolution(meanwhile or self.default, why, signature, r.device)

    def _advance(self, session, params, s, finish: bool) -> Resolution:
        """One call's share of ``session`` (all of it with ``finish``); its resolution for this call."""
        ctx = session.context
        if making := graph_making.why(params.device):
            return Resolution(session.incumbent, f"tuning in progress (paused: {making})", ctx.signature,
                              ctx.device_name, cache=False)
        session.calls += 1
        try:
            done = session.advance(math.inf if finish else s.tuning_step_ms)
        except BaseException as exc:
            self._sessions.pop((s.cache_id, ctx.signature), None)  # a session that raised cannot resume
            if not isinstance(exc, torch.cuda.OutOfMemoryError):
                raise
            warnings.warn(f"tunekit: out of memory while tuning {self.name} {ctx.signature}; the default runs "
                          f"({exc})", TunekitWarning, stacklevel=5)
            return Resolution(self.default, "tuning ran out of memory: the default runs", ctx.signature,
                              ctx.device_name)
        if not done:
            return Resolution(session.incumbent, f"tuning in progress ({session.checked} candidates checked so far):"
                              f" {session.incumbent.name} runs meanwhile", ctx.signature, ctx.device_name, cache=False)
        self._sessions.pop((s.cache_id, ctx.signature), None)
        return self._store(session.report, params, s, ctx)

    def _store(self, report, params, s, ctx) -> Resolution:
        """Store a finished session's entry (and record it for offline tuning when incomplete)."""
        signature, device_name, store, current, stale = ctx
        entry = Entry(op=self.name, signature=signature, device=device_name, choice=report.choice,
                      complete=report.complete, validators=current, candidates=report.candidates,
                      tuned_at=time.time(), tuning_ms=report.tuning_ms)
        try:
            store.put(entry)
        except Exception as exc:  # a results file we cannot write must not break the op
            warnings.warn(f"tunekit: could not save tuning result: {exc}", TunekitWarning, stacklevel=5)
        self.forget_untuned(s, signature)
        if not report.complete and s.record_untuned:  # offline tuning (tunekit tune) finishes the job
            try:
                store.record_untuned(self.name, signature, device_name, params.spec())
            except Exception as exc:
                warnings.warn(f"tunekit: could not record untuned signature: {exc}", TunekitWarning, stacklevel=5)
        why = "tuned now" + (f" (stored entry ignored: {stale})" if stale else "")
        if not report.complete:
            why += "; budget exhausted, entry marked incomplete"
        return Resolution(self._by_name[report.choice], why, signature, device_name, entry)

    def forget_untuned(self, s, signature: str) -> None:
        """After ``signature`` was tuned into the store ``s`` names: drop what the tuning-off caches of
        that store decided (they may hold the default)."""
        for other_id, choices in self._choices.items():
            if other_id[0] == s.cache_id[0] and not other_id[1]:  # this store's tuning-off caches: may hold the default
                self._decided.get(other_id, {}).pop(signature, None)
                choices.clear()
                self._runners.pop(other_id, None)
                self._forgotten()

    def __repr__(self) -> str:
        return f"<TunableOp {self.name}: {', '.join(c.name + '*' * (c is self.default) for c in self.candidates)}>"
