"""The DDP recipe runs end to end on 2 CPU ranks with every component, and W&B gets world rates."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import run_in_session
from tests.helpers.wandb_files import OfflineWandb

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = {
    "BatchSizeTuner",
    "ThroughputLogger",
    "SyncPointWarnings",
    "LossRetentionDetector",
    "SpeedAdvisor",
}


@pytest.mark.ddp
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_speedpack"])
def test_recipe_runs_every_component_on_both_ranks(strategy: str, tmp_path: Path) -> None:
    images = 64
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb")}
    proc = run_in_session(
        [
            sys.executable,
            str(REPO / "examples" / "ddp_recipe.py"),
            "--strategy",
            strategy,
            "--images",
            str(images),
            "--epochs",
            "2",
            "--max-batch",
            "16",
            "--wandb",
            "--data-dir",
            str(tmp_path / "jpegs"),
            "--out",
            str(tmp_path / "out"),
        ],
        timeout=280,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not proc.leftovers  # every rank and worker exited with the recipe
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["world_size"] for r in ranks} == {2}
    for rank in ranks:
        assert set(rank["callbacks"]) == COMPONENTS
        assert rank["callbacks"]["ThroughputLogger"]["figures"]["samples_per_sec"] > 0
    # The tuner agreed on one size; the cache holds each image once for the whole node.
    sizes = {r["callbacks"]["BatchSizeTuner"]["figures"]["batch_size"] for r in ranks}
    assert len(sizes) == 1
    assert sizes.pop() % 8 == 0
    assert ranks[0]["cache"]["items"] == images
    assert ranks[1]["cache"]["items"] == images  # node-wide counters, seen alike by both ranks
    # W&B (written by rank 0 only) has world throughput read back from the run's own file.
    run = OfflineWandb(tmp_path / "out").only_run()  # once W&B's writer has finished it
    world = run.values("throughput/samples_per_sec")
    device = run.values("throughput/device/samples_per_sec")
    assert world
    assert device
    assert world[-1] > device[-1]  # the sum over two ranks, not rank 0 alone
