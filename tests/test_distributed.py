"""tunekit.distributed: two real ranks (torch.distributed, gloo, CPU) whose fake timings disagree
agree on every choice online and offline, with a store per rank; plus the hook's local fallback.
The GPU version (NCCL, torchrun) is benchmarks/checks/distributed_check.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import tunekit
from tunekit import distributed
from tunekit.tunable import tunable_op

import distributed_workers

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Run both ranks once (about 5 s); every test below reads what they saw."""
    directory = tmp_path_factory.mktemp("ranks")
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks on a GPU machine too (offline tuning's default device)
    try:
        mp.spawn(distributed_workers.run_rank, args=(2, str(directory)), nprocs=2, join=True)
    finally:
        if hidden is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)]


def test_without_distribution_the_fake_timings_make_ranks_disagree(ranks):
    assert [r["local_choice"] for r in ranks] == ["a", "b"]


def test_online_every_rank_runs_rank_zeros_choice(ranks):
    assert [r["online_choice"] for r in ranks] == ["a", "a"]
    assert ranks[0]["online_why"].startswith("tuned now")
    assert "decided by rank 0 of 2" in ranks[1]["online_why"]
    assert ranks[0]["builtin_choices"] == ranks[1]["builtin_choices"]
    assert set(ranks[0]["builtin_choices"]) == {"silu", "gelu", "logsumexp"}


def test_online_every_rank_stores_the_same_entries(ranks):
    entries = [r["online_entries"] for r in ranks]
    assert entries[0] == entries[1] and len(entries[0]) == 4  # the fake op, silu, gelu, logsumexp
    assert [choice for key, (choice, _) in entries[0].items() if key.startswith("skew_online")] == ["a"]


def test_ranks_that_meet_different_signatures_all_raise(ranks):
    for r in ranks:
        assert "ranks met different new signatures" in r["mismatch"]


def test_a_failure_on_rank_zero_reaches_every_rank(ranks):
    assert "kernel exploded" in ranks[0]["rank0_error"]
    assert "rank 0 failed to decide broken" in ranks[1]["rank0_error"] and "kernel exploded" in ranks[1]["rank0_error"]


def test_offline_sharded_tuning_fills_every_store_alike(ranks):
    shards = [r["sharded"] for r in ranks]
    assert shards[0]["entries"] == shards[1]["entries"]
    assert len(shards[0]["entries"]) == 6  # skew_offline n=10..13 and silu n=30, 31: the union of both ranks'
    assert [s["untuned"] for s in shards] == [0, 0]
    for s in shards:
        summary = s["summary"]
        assert (summary["total"], summary["tuned"], summary["failed"], summary["remaining"]) == (6, 6, [], 0)
    choices = {key: choice for key, (choice, _) in shards[0]["entries"].items() if key.startswith("skew_offline")}
    assert set(choices.values()) == {"a", "b"}  # each signature decided by the one rank that tuned it


def test_enable_and_disable_set_the_decider_and_it_falls_back_without_a_process_group():
    assert not torch.distributed.is_initialized()
    with distributed.enabled():
        assert distributed.is_enabled() and tunable_op.current_decider() is distributed.decide
        y = tunekit.silu(torch.randn(16))  # no process group: decided locally
        assert y.shape == (16,)
        assert tunekit.explain("silu", torch.randn(16)).why.startswith("tuned now")
    assert not distributed.is_enabled() and tunable_op.current_decider() is None
    assert distributed.init_from_environment() is False  # not launched by torchrun


def test_enable_puts_the_cpp_autograd_call_in_place_first():
    """Every rank must take one path for a differentiable call (the Function's backward decides
    backward signatures, torch's node decides none), whenever each rank's build ends."""
    from tunekit.backends import fast_grad
    from tunekit.ops._shared.grad_call import GradCall
    from tunekit.ops.silu import _silu_forward
    fast_grad._load.cache_clear()
    grad_call, x = GradCall(_silu_forward, "silu"), torch.randn(24, requires_grad=True)
    assert grad_call.call(x) is None  # the first call asks for the build on the worker; the Function runs it
    with distributed.enabled():
        assert fast_grad.loaded() is not None
        assert grad_call.call(x).grad_fn.name() == "SiluBackward0"  # in place before any call under distribution


def test_distributed_check_script_under_torchrun_on_the_cpu(tmp_path):
    env = {**os.environ, "TUNEKIT_RESULTS": str(tmp_path / "unused.sqlite"), "CUDA_VISIBLE_DEVICES": ""}  # gloo, CPU
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--standalone", str(ROOT / "benchmarks" / "checks" / "distributed_check.py"),
                           "--smoke", "--dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ALL PASS" in done.stdout and "FAIL" not in done.stdout.replace("ALL PASS", "")


@pytest.mark.gpu
def test_distributed_check_with_nccl_on_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TUNEKIT_RESULTS": str(tmp_path / "unused.sqlite")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "benchmarks" / "checks" / "distributed_check.py"), "--dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "ALL PASS" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
