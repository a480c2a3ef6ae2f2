"""Offline tuning on several GPUs at once: one worker process per GPU, one shared results store.

Why processes, not threads: tuning times kernels, and every worker needs its own CUDA context and
its own Python interpreter so that one GPU's host work (compiling, launching, synchronising) never
queues behind another's. Workers start by ``fork`` when this process has not initialised CUDA yet
(Linux): a forked worker has torch and tunekit imported already and only creates its own CUDA
context, where a ``spawn``ed interpreter imports torch and tunekit, initialises CUDA and loads its
first kernels again: seconds, longer than tuning a few dozen signatures takes. Otherwise (CUDA
already initialised here: a forked CUDA context is unusable) they start with ``spawn``. The GPU
model check and this process's own CUDA work wait until the workers are started. A process whose
CUDA *driver* was initialised without torch's own initialisation (``torch.cuda.is_available()``
does that) cannot be told apart beforehand: its forked workers find CUDA unusable, say so, and are
replaced by spawned ones (the spawn cost, nothing worse).

How work is shared: there is no plan. Every worker (and, by default, this process on the first
GPU, so no device idles while workers import torch) repeatedly claims the next free record from
the store (``tunekit/offline/claims.py``: one SQLite write transaction per claim), tunes it with
:func:`tunekit.offline.recorded.process` and writes its entry to the same file. Fast workers simply
take more. A worker that dies leaves a claim whose owner process is gone: the others retake it, and
after every worker has exited this process sweeps what is left, so a run ends with every record
that can be tuned tuned. On a machine without GPUs (tests) ``gpus=None`` runs ``workers`` CPU
workers on the CPU.

How workers report: each through its own pipe, not one shared ``multiprocessing.Queue``. A queue's
writers share one lock; a worker that dies while holding it (this process terminates workers that
are still starting when nothing is left for them; a user may SIGKILL one) leaves it held forever,
and every other worker then hangs when it flushes its queue at exit: seen as an intermittent hang
of the tests. A dead worker's own pipe only breaks that pipe.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import traceback
import uuid

import torch

from . import claims, process_start
from .recorded import DEFAULT_LEASE_S, as_store, check_ops, finish, on_device, work
from .summary import Progress, TuneSummary
from .tune_one import ATTEMPTS, offline_settings
from ..tunable import validators
from ..tunable.context import TuningSettings
from ..tunable.results import ResultsStore

__all__ = ["tune_parallel", "parse_gpus"]


def parse_gpus(text: str | int | None) -> list[int]:
    """``--gpus`` as GPU indices: "all" (every visible GPU), "N" (the first N), "0,2" (those)."""
    count = torch.cuda.device_count()
    if text is None:
        return [torch.cuda.current_device()] if count else []
    text = str(text).strip().lower()
    if text == "all":
        gpus = list(range(count))
    elif text.isdigit():
        gpus = list(range(int(text)))
    else:
        try:
            gpus = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"--gpus {text!r}: expected all, a count, or indices like 0,1") from None
    bad = [g for g in gpus if not 0 <= g < count]
    if not gpus or bad:
        raise ValueError(f"--gpus {text!r}: this machine has {count} visible GPU(s)")
    return gpus


def _start_method() -> str:
    """fork where it is safe and exists (Linux, CUDA not initialised in this process), else spawn."""
    if sys.platform.startswith("linux") and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


def _worker(index, store_path, device, visible, settings, ops, keys, run, lease_s, attempts, messages, initializer):
    """One worker process: tune claimed records on ``device`` until none is free; ``messages`` is
    the sending end of this worker's pipe. ``visible``: the ``CUDA_VISIBLE_DEVICES`` value that
    leaves only that GPU visible here (see :mod:`tunekit.offline.process_start`), or None on the CPU."""
    try:
        device = torch.device(device)
        if device.type == "cuda" and torch.cuda._is_in_bad_fork():
            # forked from a process whose CUDA driver was initialised (torch.cuda.is_available() does
            # that): this process can never use CUDA; the parent starts a spawned one instead
            messages.send(("respawn", index))
            return
        if device.type == "cuda" and visible is not None:  # CUDA is not initialised here yet
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
            device = torch.device("cuda", 0)
        if initializer is not None:
            initializer(index)
        if device.type == "cuda":
            process_start.prepare(device)  # first: set_device would initialise CUDA without overlap
            torch.cuda.set_device(device)
        store = ResultsStore(store_path)
        settings = TuningSettings(**settings)

        def event(kind, label):
            messages.send(("event", index, kind, label))

        summary = work(store, device, settings, run=run, ops=ops, keys=keys, lease_s=lease_s,
                               attempts=attempts, event=event)
        messages.send(("summary", index, summary.as_dict()))
    except BaseException:
        messages.send(("error", index, traceback.format_exc()))
        raise
    finally:
        messages.close()


def _fields(settings) -> dict:
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}


def tune_parallel(store_path, gpus: list[int] | None = None, *, workers: int | None = None, ops=None, keys=None,
                  settings=None, progress: Progress | None = None, lease_s: float = DEFAULT_LEASE_S,
                  attempts: int = ATTEMPTS, local_worker: bool = True, initializer=None,
                  start_method: str | None = None) -> TuneSummary:
    """Tune every recorded untuned signature of the GPUs' device name in the store at ``store_path``
    with one worker per GPU in ``gpus`` (indices; see :func:`parse_gpus`), all writing to that file.

    ``gpus=None``: ``workers`` (default 2) workers on the CPU. ``local_worker``: this process is the
    first worker (on ``gpus[0]``) instead of spawning it. ``initializer(index)``: called first in
    every spawned worker (a picklable callable; tests use it to register ops or to kill a worker).
    ``progress(done, total, label)`` runs here, fed by every worker. The other keywords are
    :func:`tunekit.offline.recorded.tune_recorded`'s. The GPUs must all be of one model (their records
    share a device name); the summary's ``workers`` lists each worker's counts and exit code.
    ``start_method``: "fork" or "spawn" (default: see the module docstring).
    """
    start = time.perf_counter()
    if gpus is not None and not gpus:
        raise ValueError("gpus is empty: no device to tune on")
    devices = [f"cuda:{g}" for g in gpus] if gpus is not None else ["cpu"] * (workers or 2)
    visible = [process_start.visible_devices(g) for g in gpus] if gpus is not None else [None] * len(devices)
    store = as_store(store_path)
    if store.in_memory:
        raise ValueError(f"{store_path!r} is not a usable results file ({store.problem or 'in memory'}): "
                         "workers need a file to share")
    ops, settings = check_ops(ops), offline_settings(settings, store)
    job = _Job(store, devices, visible, settings, ops, keys, lease_s, attempts, initializer, progress)
    job.start_workers(multiprocessing.get_context(start_method or _start_method()), first=1 if local_worker else 0)
    name = job.device_name()
    records, _ = claims.pending(store, name, ops=ops, keys=keys)
    job.total = len(records)
    summary = TuneSummary(device=name)
    try:
        job.run(summary, name, local_worker)
    finally:
        job.stop_all()
    summary.workers = job.worker_reports()
    return finish(summary, store, name, ops, keys, records, start, progress)


class _Job:
    """One tune_parallel call: its worker processes, their pipes, and what they reported."""

    def __init__(self, store, devices, visible, settings, ops, keys, lease_s, attempts, initializer, progress):
        self.store, self.devices, self.visible, self.settings = store, devices, visible, settings
        self.ops, self.keys, self.lease_s, self.attempts = ops, keys, lease_s, attempts
        self.initializer, self.progress = initializer, progress
        self.run_id = uuid.uuid4().hex
        self.pipes: dict[int, multiprocessing.connection.Connection] = {}  # worker index -> the receiving end
        self.procs: list = []  # (index, process)
        self.reports: dict[int, dict] = {}
        self.stopped: set[int] = set()  # workers ended by us when nothing was left for them
        self.heard: set[int] = set()  # workers that sent a message (they are working)
        self.done = self.total = 0
        self.closing = False  # set once the workers are done: no replacement is started after that
        self.summary: TuneSummary | None = None

    # -- workers --------------------------------------------------------------------------------
    def start_worker(self, index, context):
        receiving, sending = context.Pipe(duplex=False)
        p = context.Process(target=_worker, name=f"tunekit-tune-{index}",
                            args=(index, self.store.path, self.devices[index], self.visible[index],
                                  _fields(self.settings), self.ops, self.keys, self.run_id, self.lease_s,
                                  self.attempts, sending, self.initializer))
        p.start()
        sending.close()  # the worker holds the only sending end: its death ends the pipe
        self.pipes[index] = receiving
        return p

    def start_workers(self, context, first: int) -> None:
        """Every worker from ``first`` on, before this process touches CUDA (fork needs that)."""
        for index in range(first, len(self.devices)):
            self.procs.append((index, self.start_worker(index, context)))

    def device_name(self) -> str:
        """The GPUs' one model name (ValueError, workers stopped, if they are of several)."""
        try:
            names = {validators.device_name(torch.device(d)) for d in self.devices}
            if len(names) > 1:
                raise ValueError(f"the GPUs are of different models ({', '.join(sorted(names))}): tune each model apart")
        except BaseException:
            self.stop_all()
            raise
        return names.pop()

    def stop_all(self) -> None:
        for _, p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join()

    # -- messages -------------------------------------------------------------------------------
    def on_event(self, index, kind, label) -> None:
        if kind == "start":
            if self.progress is not None:
                self.progress(self.done, self.total, f"[{self.devices[index]}] {label}")
        else:
            self.done += 1

    def receive(self, timeout: float):
        """The next message of any worker, or None after ``timeout`` s; a pipe whose worker ended
        (or died mid-message) is closed and dropped."""
        pipes = self.pipes
        while pipes:
            ready = multiprocessing.connection.wait(list(pipes.values()), timeout)
            if not ready:
                return None
            for conn in ready:
                try:
                    return conn.recv()
                except Exception:  # EOF, or a message cut short by the worker's death
                    conn.close()
                    del pipes[next(i for i, c in pipes.items() if c is conn)]
        time.sleep(timeout)  # no pipe left to wait on: still pace the caller's polling
        return None

    def drain(self, timeout: float = 0.0) -> None:
        while True:
            message = self.receive(timeout)
            if message is None:
                return
            timeout = 0.0
            self.heard.add(message[1])
            self.handle(message)

    def handle(self, message) -> None:
        kind, index = message[0], message[1]
        if kind == "event":
            self.on_event(*message[1:])
        elif kind == "respawn":  # a forked worker that cannot use CUDA: spawn its replacement
            self.heard.discard(index)
            if self.closing:  # the run is over: the sweep does what is left
                return
            self.pipes.pop(index).close()
            replacement = self.start_worker(index, multiprocessing.get_context("spawn"))
            self.procs[:] = [(i, q) for i, q in self.procs if i != index] + [(index, replacement)]
        elif kind == "summary":
            worker_summary = TuneSummary.from_dict(message[2])
            self.summary.add(worker_summary)
            self.reports[index] = _report(index, self.devices[index], worker_summary)
        else:
            self.reports.setdefault(index, {"worker": index, "device": self.devices[index]})["error"] = message[2]

    # -- the run --------------------------------------------------------------------------------
    def local(self, event) -> TuneSummary:
        return _local(self.store, self.devices[0], self.settings, self.run_id, self.ops, self.keys, self.lease_s,
                      self.attempts, event)

    def run(self, summary: TuneSummary, name: str, local_worker: bool) -> None:
        """This process works too (``local_worker``), watches the workers until they are done, then
        sweeps: claims of workers that died are free once their processes are reaped."""
        self.summary = summary
        if local_worker:
            local = self.local(lambda kind, label: (self.drain(), self.on_event(0, kind, label)))
            summary.add(local)
            self.reports[0] = _report(0, self.devices[0], local, "this process")
        while any(p.is_alive() for _, p in self.procs):
            self.drain(timeout=0.1)
            if not claims.unfinished(self.store, name, run=self.run_id, ops=self.ops, keys=self.keys):
                for index, p in self.procs:  # still starting up, or about to find nothing: no claim is held
                    if p.is_alive() and index not in self.heard:  # (one that worked is about to report: let it)
                        p.terminate()
                        self.stopped.add(index)
        self.closing = True
        for _, p in self.procs:
            p.join()
        self.drain()
        sweep = self.local(lambda kind, label: self.on_event(0, kind, label))
        summary.add(sweep)
        if sweep.done:
            self.reports[len(self.devices)] = _report("sweep", self.devices[0], sweep, "this process, after the workers")

    def worker_reports(self) -> list[dict]:
        for index, p in self.procs:
            report = self.reports.setdefault(index, {"worker": index, "device": self.devices[index], "where": "spawned"})
            report["exitcode"] = p.exitcode
            if index in self.stopped and "tuned" not in report:
                report["stopped"] = "nothing was left to tune when it started"
        return [self.reports[k] for k in sorted(self.reports)]


def _local(store, device, settings, run, ops, keys, lease_s, attempts, event) -> TuneSummary:
    device = torch.device(device)
    process_start.prepare(device)
    with on_device(device):
        return work(store, device, settings, run=run, ops=ops, keys=keys, lease_s=lease_s,
                            attempts=attempts, event=event)


def _report(index, device, s: TuneSummary, where: str = "spawned") -> dict:
    return {"worker": index, "device": device, "where": where, "tuned": s.tuned, "incomplete": s.incomplete,
            "already": s.already, "failed": len(s.failed), "exitcode": None}
