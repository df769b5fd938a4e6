"""``zoo/world_job.py`` and ``world_zoo.commands``: the runs the GPU ``world`` check asks for.

The GPU check (``benchmarks/gpu/check_world.py``) ran once on an H200; these pin, without a GPU,
what it asks Lightning for: one NCCL rank, or two ranks on one GPU over gloo.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def zoo() -> tuple[Any, Any]:
    for path in (BENCH, BENCH / "zoo"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import world_job
    import world_zoo

    return world_job, world_zoo


def test_a_cuda_rank_alone_gets_lightnings_ddp_and_so_nccl(
    zoo: tuple[Any, Any], tmp_path: Path
) -> None:
    world_job, _ = zoo
    kwargs = world_job.trainer_kwargs("clean", tmp_path, "cuda", 1)
    assert (kwargs["accelerator"], kwargs["devices"], kwargs["num_nodes"]) == ("gpu", 1, 1)
    assert kwargs["strategy"] == "ddp"  # Lightning picks NCCL for CUDA


def test_two_nodes_on_one_gpu_use_gloo_and_keep_find_unused(
    zoo: tuple[Any, Any], tmp_path: Path
) -> None:
    from pytorch_lightning.strategies import DDPStrategy

    world_job, _ = zoo
    for case, unused in (("slow-step", False), ("find-unused", True)):
        kwargs = world_job.trainer_kwargs(case, tmp_path, "cuda", 2)
        strategy = kwargs["strategy"]
        assert isinstance(strategy, DDPStrategy)
        assert strategy.process_group_backend == "gloo"
        assert strategy._ddp_kwargs.get("find_unused_parameters", False) is unused
        assert (kwargs["devices"], kwargs["num_nodes"]) == (1, 2)


def test_the_cpu_zoo_keeps_two_ranks_on_one_node(zoo: tuple[Any, Any], tmp_path: Path) -> None:
    world_job, world_zoo = zoo
    kwargs = world_job.trainer_kwargs("clean", tmp_path)
    assert (kwargs["accelerator"], kwargs["devices"], kwargs.get("num_nodes", 1)) == ("cpu", 2, 1)
    cmds, report, _ = world_zoo.commands("clean", tmp_path)
    assert len(cmds) == 1
    assert "--nodes" not in cmds[0]
    assert "--device" not in cmds[0]
    assert report.name == "clean.json"


def test_commands_run_a_case_as_two_torchrun_nodes_on_the_gpu(
    zoo: tuple[Any, Any], tmp_path: Path
) -> None:
    _, world_zoo = zoo
    cmds, report, _ = world_zoo.commands("slow-step", tmp_path, nodes=2, device="cuda")
    assert len(cmds) == 2
    for node, cmd in enumerate(cmds):
        assert cmd[cmd.index("--node-rank") + 1] == str(node)
        assert cmd[cmd.index("--device") + 1] == "cuda"
        assert cmd[cmd.index("--nodes") + 1] == "2"
    assert report.name == "slow-step-cuda-2n.json"
    (one,), _, _ = world_zoo.commands("clean", tmp_path, nodes=1, device="cuda")
    assert "torch.distributed.run" not in one
    assert one[one.index("--nodes") + 1] == "1"
