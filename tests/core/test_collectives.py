"""The pack's bounded collectives: a rank that is stuck or gone fails the others with a message."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from lightning_speedpack.core import collectives
from lightning_speedpack.core.collectives import (
    DEFAULT_TIMEOUT_S,
    ENV_TIMEOUT,
    CollectiveTimeoutError,
    bounded_all_reduce,
    bounded_gather_bytes,
    collective_timeout,
    validate_timeout,
)
from tests.helpers.ddp import run_ddp


def test_timeout_from_argument_environment_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TIMEOUT, raising=False)
    assert collective_timeout() == DEFAULT_TIMEOUT_S == 300.0
    monkeypatch.setenv(ENV_TIMEOUT, "42")
    assert collective_timeout() == 42.0
    assert collective_timeout(7) == 7.0  # the argument wins
    monkeypatch.setenv(ENV_TIMEOUT, "soon")
    with pytest.raises(ValueError, match=f"{ENV_TIMEOUT} must be a number of seconds, got 'soon'"):
        collective_timeout()
    monkeypatch.setenv(ENV_TIMEOUT, "-1")
    with pytest.raises(ValueError, match="positive, finite"):
        collective_timeout()


def test_timeout_never_exceeds_the_process_group_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TIMEOUT, raising=False)
    monkeypatch.setattr(collectives, "process_group_timeout", lambda group=None: 60.0)
    assert collective_timeout() == 60.0
    assert collective_timeout(10) == 10.0


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("5", TypeError, "`t` must be a number of seconds, got str '5'"),
        (True, TypeError, "got bool True"),
        (0, ValueError, "got 0"),
        (float("inf"), ValueError, "got inf"),
    ],
)
def test_invalid_timeouts(value: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        validate_timeout("t", value)


def test_without_a_process_group_it_says_so() -> None:
    assert not dist.is_initialized()
    assert collectives.process_group_timeout() is None
    with pytest.raises(RuntimeError, match=r"MyCallback: torch\.distributed is not initialized"):
        bounded_all_reduce(torch.ones(2), timeout_s=1, what="MyCallback")


# ------------------------------------------------------------------ real 2-rank gloo


def _init(seconds: float = 30.0) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=seconds))


def _wait_for(path: Path, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _rank_stuck(tmp: str, poll: bool) -> Any:
    """Both ranks sum once; then rank 1 is stuck (until rank 0 is done), rank 0 must fail."""
    rank = int(os.environ["RANK"])
    done = Path(tmp, "rank0-done")
    _init()
    try:
        summed = bounded_all_reduce(
            torch.tensor([1.0, float(rank)]), timeout_s=20, what="T", poll=poll
        )
        if rank == 1:
            _wait_for(done)  # stuck, e.g. in a deadlocked DataLoader fork
            return summed.tolist(), None
        try:
            bounded_all_reduce(
                torch.ones(3), timeout_s=1.5, what="MyCallback: agreement at step 5", poll=poll
            )
        except CollectiveTimeoutError as err:
            return summed.tolist(), str(err)
        finally:
            done.touch()
        return summed.tolist(), "no error"
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
@pytest.mark.timeout(120)
@pytest.mark.parametrize("poll", [False, True], ids=["wait-timeout", "poll"])
def test_a_stuck_rank_makes_the_other_raise(tmp_path: Path, poll: bool) -> None:
    (sum0, error0), (sum1, error1) = run_ddp(_rank_stuck, str(tmp_path), poll, timeout=100)
    assert sum0 == sum1 == [2.0, 1.0]  # a collective that can finish is a plain sum
    assert error1 is None
    assert error0 == (
        "MyCallback: agreement at step 5 did not complete within 1.5 s: another rank died or is "
        f"stuck (set {ENV_TIMEOUT} to wait longer)"
    )


def _rank_gone(tmp: str) -> Any:
    rank = int(os.environ["RANK"])
    _init()
    if rank == 1:  # leaves before the collective: its connections close
        dist.destroy_process_group()
        return None
    try:
        bounded_all_reduce(torch.ones(3), timeout_s=30, what="MyCallback: combine at step 2")
    except CollectiveTimeoutError as err:
        return str(err)
    finally:
        dist.destroy_process_group()
    return "no error"


@pytest.mark.ddp
@pytest.mark.timeout(120)
def test_a_rank_that_left_makes_the_other_raise(tmp_path: Path) -> None:
    error0, _ = run_ddp(_rank_gone, str(tmp_path), timeout=100)
    assert error0.startswith("MyCallback: combine at step 2 ")
    assert "another rank died" in error0


def _pg_cap(tmp: str) -> float:
    _init(seconds=5.0)
    try:
        return collective_timeout(300)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
@pytest.mark.timeout(120)
def test_the_process_group_timeout_caps_the_pack_timeout(tmp_path: Path) -> None:
    assert run_ddp(_pg_cap, str(tmp_path), timeout=100) == [5.0, 5.0]


# ------------------------------------------------------------------ gather to rank 0, bounded


def test_gather_without_a_process_group_is_this_ranks_own() -> None:
    gathered = bounded_gather_bytes(b"abc", timeout_s=1)
    assert gathered is not None
    assert (gathered.payloads, gathered.missing) == ({0: b"abc"}, {})
    with pytest.raises(TypeError, match="`payload` must be bytes, got str"):
        bounded_gather_bytes("abc", timeout_s=1)  # type: ignore[arg-type]


def _rank_gathers(tmp: str) -> Any:
    """Rank 0 gathers; rank 1 sends 100 kB; rank 2 never sends (stuck until rank 0 is done)."""
    rank = int(os.environ["RANK"])
    done = Path(tmp, "rank0-done")
    _init()
    try:
        if rank == 2:
            _wait_for(done)
            return None
        payload = bytes(range(256)) * 400 if rank == 1 else b'{"rank": 0}'
        start = time.monotonic()
        gathered = bounded_gather_bytes(payload, timeout_s=3)
        if rank == 1:
            return gathered
        done.touch()
        assert gathered is not None
        return gathered.payloads, gathered.missing, time.monotonic() - start
    finally:
        if rank != 0:
            dist.destroy_process_group()


@pytest.mark.ddp
@pytest.mark.timeout(120)
def test_gather_names_the_rank_that_did_not_answer_and_keeps_the_others(tmp_path: Path) -> None:
    (payloads, missing, seconds), on_rank_1, _ = run_ddp(
        _rank_gathers, str(tmp_path), world_size=3, timeout=100
    )
    assert on_rank_1 is None  # only rank 0 gathers
    assert payloads == {0: b'{"rank": 0}', 1: bytes(range(256)) * 400}
    assert missing == {2: "rank 2: no answer in 3 s"}
    assert seconds < 30  # bounded: about the timeout, never the process group's 30 min
