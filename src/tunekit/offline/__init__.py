"""Offline tuning: record the signatures a program meets, tune them later, in another process, on one
GPU, several, or the ranks of a torchrun job; ship the results between machines.

- ``recorded.py``: :func:`tune_recorded`, the resumable loop over a store's untuned records
  (claims in ``claims.py`` let several processes share one store); ``tune_one.py``: one signature,
  tuned exactly as online but with every candidate warmed outside the budget; ``rebuild.py``: a
  recorded signature's inputs rebuilt on fresh random values.
- ``parallel.py``: one worker process per GPU (``process_start.py``: what each worker pays once,
  and how it pays less); ``distributed.py``: torch.distributed (rank 0 decides online; sharded
  offline tuning); ``run.py``: ``tunekit tune``'s one entry point choosing among them.
- ``files.py``: untuned records as JSON lines; ``transfer.py``: results exported and imported
  between machines, keeping the entries valid there.
"""

from . import distributed
from .files import export_untuned, import_untuned, read_untuned, tune_file
from .rebuild import rebuild_params
from .recorded import DEFAULT_LEASE_S, tune_recorded
from .summary import TuneSummary, text_progress
from .tune_one import ATTEMPTS, entry_problems, tune_params, warm_candidates

__all__ = ["distributed", "export_untuned", "import_untuned", "read_untuned", "tune_file", "rebuild_params",
           "DEFAULT_LEASE_S", "tune_recorded", "TuneSummary", "text_progress", "ATTEMPTS", "entry_problems",
           "tune_params", "warm_candidates"]
