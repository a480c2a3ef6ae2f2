"""Whether the calling thread is making a CUDA graph: capturing one, or running Inductor's warm-up of one.

Tuning must not run then (``tunable_op``: the stored choice or the default runs, recorded for later tuning).
During a capture, its launches would be recorded into the user's graph. During the warm-up that
``torch.compile(mode="reduce-overhead")`` runs before it captures (Inductor's cudagraph trees), the thread's
allocations go to the graphs' private pool, and the trees then check that the pool holds only the outputs
they know of: a tuning session spread over calls kept the input copies it had made there, and the next
compiled call raised "Detected 6 tensor(s) in the cudagraph pool not tracked as outputs" (H100, tuning on at its
default 20 ms step, ``benchmarks/results/cudagraph_warmup_session_probe-*``). Pool memory the trees believe free is also
theirs to hand to the graph's outputs.

The warm-up is recognised by its stream: the trees run warm-ups and captures on a stream of their own
(``CUDAGraphTreeManager.stream``), current only inside them. Read without importing Inductor (a program that never
compiled with cudagraphs has no trees) and without creating the trees' per-thread state; should a torch version
keep them elsewhere, nothing is recognised (the behaviour before this module) and the GPU test that runs a
reduce-overhead warm-up with a tuning session under way fails.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["why"]

CAPTURING = "a CUDA graph is being captured"
WARMING_UP = "Inductor's CUDA graph warm-up is running"


def why(device: torch.device) -> str | None:
    """Why this thread is making a CUDA graph on ``device`` (:data:`CAPTURING`, :data:`WARMING_UP`), or None."""
    if device.type != "cuda":
        return None
    if torch.cuda.is_current_stream_capturing():
        return CAPTURING
    return WARMING_UP if _in_tree_warm_up(device) else None


def _in_tree_warm_up(device: torch.device) -> bool:
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    containers = getattr(trees.local, "tree_manager_containers", None)
    if containers is None and torch._C._is_key_in_tls("tree_manager_containers"):  # a thread the trees' state passed to
        containers = torch._C._get_obj_in_tls("tree_manager_containers")
    index = device.index if device.index is not None else torch.cuda.current_device()
    container = containers.get(index) if containers else None
    manager = getattr(container, "tree_manager", None)
    stream = getattr(manager, "stream", None)
    return stream is not None and torch.cuda.current_stream(index) == stream
