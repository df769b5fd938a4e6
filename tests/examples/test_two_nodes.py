"""Two nodes simulated on one host: two ``torchrun`` agents of two ranks each form one world of 4.

Each agent is a node (``--node_rank 0/1``); the pack reads the node from torchrun's ``GROUP_RANK``,
so each simulated node fills a shared-memory arena of its own, as two real nodes would.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ddp import free_port
from tests.helpers.procs import run_together

REPO = Path(__file__).resolve().parents[2]
IMAGES = 32


def _torchrun() -> list[str]:
    beside = Path(sys.executable).with_name("torchrun")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_simulated_nodes_form_one_world_with_a_cache_per_node(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",  # 4 ranks on 2 cores
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
    }
    for variable in ("LIGHTNING_SPEEDPACK_NODE_ID", "NODE_RANK", "SLURM_NODEID", "GROUP_RANK"):
        env.pop(variable, None)  # the node identity comes from torchrun alone
    recipe = [
        str(REPO / "examples" / "ddp_recipe.py"),
        "--images",
        str(IMAGES),
        "--epochs",
        "1",
        "--max-batch",
        "16",
        "--warm-cache",
        "--data-dir",
        str(tmp_path / "jpegs"),
        "--out",
        str(tmp_path / "out"),
    ]
    nodes = [
        [
            *_torchrun(),
            "--nnodes",
            "2",
            "--nproc_per_node",
            "2",
            "--node_rank",
            str(node),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            *recipe,
        ]
        for node in (0, 1)
    ]
    finished = run_together(nodes, timeout=180, envs=[env, env], cwd=tmp_path)
    for node, proc in enumerate(finished):
        start = proc.stderr.find("Traceback")  # the first rank error, not torchrun's summary
        assert proc.returncode == 0, f"node {node}:\n{proc.stderr[max(0, start) :][:6000]}"
    assert not finished[0].leftovers  # no rank, worker or agent outlived its node

    ranks: list[dict[str, Any]] = [
        json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(4)
    ]
    assert [(r["rank"], r["node_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 4),
        (1, 0, 4),
        (2, 1, 4),
        (3, 1, 4),
    ]
    # One arena per node, shared by its two ranks, each filled once: every image decoded once
    # on each node (the misses), none twice.
    paths = [r["cache_path"] for r in ranks]
    assert paths[0] == paths[1] != paths[2] == paths[3]
    assert "-n0-" in paths[0]
    assert "-n1-" in paths[2]
    for rank in ranks:
        assert rank["cache"]["items"] == IMAGES, rank["cache"]
        assert rank["cache"]["misses"] == IMAGES, rank["cache"]
    # The tuner agreed across all four ranks.
    sizes = {r["callbacks"]["BatchSizeTuner"]["figures"]["batch_size"] for r in ranks}
    assert len(sizes) == 1, sizes
    # World samples/s is the sum of the four ranks' own rates, the same figure on every rank.
    world = [r["callbacks"]["ThroughputLogger"]["figures"]["samples_per_sec"] for r in ranks]
    own = [r["rank_samples_per_sec"] for r in ranks]
    assert all(rate > 0 for rate in own)
    assert world == [pytest.approx(sum(own), rel=1e-6)] * 4
    assert not any(Path("/dev/shm").glob(Path(paths[0]).name + "*"))  # reclaimed at exit
    assert not any(Path("/dev/shm").glob(Path(paths[2]).name + "*"))
