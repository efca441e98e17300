"""The planner's host memory of asynchronous checkpoints: each rank stages its parameter and
optimizer shards in host memory, every rank of a host at once, against the instance's memory."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from launcher.cli.app import main
from launcher.plan.host_staging import HOST_STAGING_SHARE
from tests.support.train_runs import ROOT

SEED = ROOT / "configs" / "seed"
LLAMA_31_8B_PARAMS = 8_030_261_248  # Meta's model card, embeddings and head untied
GIB = 2**30


def _plan(*sets: str) -> dict:
    args = ["plan", str(SEED / "p4d-no-cp.yaml"), "--json"]
    for value in sets:
        args += ["--set", value]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return json.loads(result.output)[0]


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Planning never touches the network."""


def test_staging_is_the_fp32_weights_and_adam_moments_of_each_rank_times_the_ranks_of_a_host():
    row = _plan("hyperparameters.checkpoint_async_mode=async_with_pinned_mem")["host_staging"]
    # 8 ranks of one p4d shard the model 8 ways (hybrid_shard_degree 8): fp32 weights 4 B + AdamW's
    # two fp32 moments 8 B per parameter, over 8; the "roughly 12 GB per rank"
    per_rank = 12 * LLAMA_31_8B_PARAMS / 8 / GIB
    assert row["per_rank_gib"] == pytest.approx(per_rank, abs=1e-3)
    assert row["ranks_per_host"] == 8 and row["per_host_gib"] == pytest.approx(8 * per_rank, abs=1e-2)
    assert row["host_memory_gib"] == 1152 and row["fits"] is True  # p4d.24xlarge: 1152 GiB


def test_a_host_without_the_memory_is_told_so():
    # one g5.2xlarge (32 GiB of memory, one A10G) staging all of the 8B model's state: ~90 GiB
    row = _plan("instance_type=ml.g5.2xlarge", "distribution.smdistributed.modelparallel.parameters."
                "hybrid_shard_degree=1", "hyperparameters.checkpoint_async_mode=async")["host_staging"]
    assert row["per_rank_gib"] == pytest.approx(12 * LLAMA_31_8B_PARAMS / GIB, abs=1e-2)
    assert row["usable_gib"] == pytest.approx(32 * HOST_STAGING_SHARE) and row["fits"] is False


def test_no_staging_without_an_asynchronous_mode():
    assert _plan()["host_staging"] is None
    assert _plan("hyperparameters.checkpoint_async_mode=disabled")["host_staging"] is None


def test_the_plan_says_it_in_words():
    result = CliRunner().invoke(main, ["plan", str(SEED / "p4d-no-cp.yaml"), "--set",
                                       "hyperparameters.checkpoint_async_mode=async"], catch_exceptions=False)
    out = " ".join(result.output.split())
    assert "checkpoint staging (async): 11.22 GiB of host memory per rank" in out
    assert "x 8 ranks = 89.7 GiB per host, of 1152 GiB" in out and out.endswith("fits")
