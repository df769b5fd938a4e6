"""Shared fixtures: offline W&B in a temp folder, the environment put back after each test, and
no process left alive by a test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.wandb_files import OfflineWandb

os.environ.setdefault("WANDB_MODE", "offline")  # never the network, even if a test forgets
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("PL_DISABLE_FORK", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.cuda`` tests need a CUDA device: without one they are skipped, saying so."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (make gpu-check runs these on one)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OfflineWandb]:
    """W&B in offline mode writing only under ``tmp_path``; finishes any run a test left open."""
    pytest.importorskip("wandb")
    directory = tmp_path / "wandb-dir"
    directory.mkdir()
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(directory),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(key, value)
    yield OfflineWandb(directory)
    import wandb

    if wandb.run is not None:
        wandb.finish()


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Undo what a test's Trainer leaves in ``os.environ`` (Lightning's ``ddp_spawn`` sets
    ``MASTER_PORT``, ``seed_everything`` sets ``PL_GLOBAL_SEED``, wandb sets ``WANDB_SERVICE``),
    so a later test's subprocess or DDP run does not inherit a stale port or service."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """Every process a test started (a DataLoader worker, an ``mp.Process``, a rank, a script)
    is gone when the test ends, however it ends (a pytest-timeout included): whatever is still
    alive after a short grace is dumped (every thread's Python stack), killed, and fails the
    test with the stacks, so nothing is orphaned and a hang says where it was."""
    from tests.helpers.procs import own_children, reap_children

    before = set(own_children())
    yield
    report = reap_children(before)
    if report:
        pytest.fail(report, pytrace=False)
