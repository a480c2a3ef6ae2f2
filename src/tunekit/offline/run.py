"""``tunekit tune`` in one call: offline tuning of recorded signatures, on one GPU, on several, or
sharded over the ranks of a torchrun job, as the arguments and the environment say.

Why one entry point: the CLI (and scripts) should not have to know which of
:func:`tunekit.offline.recorded.tune_recorded`, :func:`tunekit.offline.parallel.tune_parallel` and
:func:`tunekit.offline.distributed.tune_recorded_sharded` applies; the rules are here, once.
"""

from __future__ import annotations

from . import distributed, parallel
from .files import import_untuned
from .recorded import as_store, tune_recorded
from .summary import Progress, TuneSummary

__all__ = ["run"]


def run(store=None, *, ops=None, gpus=None, file=None, settings=None, progress: Progress | None = None,
        device=None) -> TuneSummary:
    """Tune the recorded untuned signatures of ``store`` (a ResultsStore or a path; default: the
    settings'), or only those of ``file`` (an :func:`tunekit.offline.files.export_untuned` file, added to
    the store first), of the op names ``ops``.

    - Launched by torchrun (``RANK`` / ``WORLD_SIZE`` set): joins the process group and shards the
      work over the ranks (every rank must call this); only rank 0 reports progress.
    - ``gpus`` ("all", a count "N", indices "0,2", or a list): one worker per GPU, sharing the store
      file (:func:`tunekit.offline.parallel.tune_parallel`).
    - Otherwise: this process, on ``device`` (default: the current GPU, else the CPU).

    ResultsStoreError when the store cannot save entries (a read-only file, or one unusable and
    replaced by memory): the run would only lose its work.
    """
    store = as_store(store)
    store.require_writable("tune")  # before anything: tuned entries would be dropped or lost at exit
    keys = import_untuned(store, file) if file is not None else None
    if distributed.init_from_environment():
        import torch.distributed as dist

        return distributed.tune_recorded_sharded(store, ops=ops, keys=keys, settings=settings, device=device,
                                                 progress=progress if dist.get_rank() == 0 else None)
    if gpus is not None:
        indices = gpus if isinstance(gpus, (list, tuple)) else parallel.parse_gpus(gpus)
        return parallel.tune_parallel(store.path, list(indices), ops=ops, keys=keys, settings=settings,
                                      progress=progress)
    return tune_recorded(store, ops=ops, keys=keys, device=device, settings=settings, progress=progress)
