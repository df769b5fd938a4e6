"""The DDP-statistics engine on synthetic logging data: no DDP, no process group."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lightning_speedpack.comm.ddp_stats import (
    DDP_DEFAULT_SAMPLE_RATE,
    CommFigures,
    DDPSample,
    find_ddp,
    logging_data,
    next_read,
    read_due,
    read_sample,
    set_sample_rate,
    steady,
    summarize,
)


def _data(iteration: int = 12, **overrides: Any) -> dict[str, Any]:
    """The shape of ``DistributedDataParallel._get_ddp_logging_data()`` (torch 2.13, CPU/gloo)."""
    t0 = 1_795_701_795_980_583_838
    data: dict[str, Any] = {
        "backend_name": "gloo",
        "bucket_sizes": "36136",
        "iteration": iteration,
        "find_unused_parameters": 1,
        "unused_parameter_size": 0,
        "forward_compute_time": 128_319,
        "backward_compute_time": 926_462,
        "backward_comm_time": 1_375_070,
        "backward_compute_comm_overlap_time": 647_145,
        "avg_forward_compute_time": 178_938,
        "avg_backward_compute_time": 2_101_831,
        "avg_backward_comm_time": 2_173_485,
        "avg_backward_compute_comm_overlap_time": 1_613_416,
        "forward_compute_time_start": t0,
        "backward_compute_time_start": t0 + 128_319,
        "backward_comm_time_start": t0 + 407_793,
        "backward_compute_time_end": t0 + 128_319 + 926_462,
        "backward_comm_time_end": t0 + 407_793 + 1_375_070,
    }
    data.update(overrides)
    return data


def test_a_sample_is_the_last_sampled_iterations_durations() -> None:
    sample = read_sample(_data())
    assert sample == DDPSample(
        iteration=12,
        forward_ns=128_319,
        backward_compute_ns=926_462,
        comm_ns=1_375_070,
        overlap_ns=647_145,
        unused_parameter_bytes=0,
    )
    assert sample.wait_ns == 1_375_070 - 647_145  # comm end - backward compute end


def test_the_wait_is_never_negative_and_never_more_than_the_comm() -> None:
    assert DDPSample(2, 1, 1, comm_ns=100, overlap_ns=300).wait_ns == 0
    assert DDPSample(2, 1, 1, comm_ns=100, overlap_ns=-50).wait_ns == 100


def test_unused_bytes_only_when_ddp_looked_for_unused_parameters() -> None:
    sample = read_sample(_data(find_unused_parameters=0, unused_parameter_size=None))
    assert sample is not None
    assert sample.unused_parameter_bytes is None
    sample = read_sample(_data(unused_parameter_size=288))
    assert sample is not None
    assert sample.unused_parameter_bytes == 288


def test_before_the_first_sample_there_is_nothing_to_read() -> None:
    before = {k: v for k, v in _data(iteration=0).items() if "time" not in k}
    assert read_sample(before) is None
    assert read_sample(_data(iteration=0)) is None


def test_a_duration_ddp_could_not_measure_this_iteration_drops_the_sample() -> None:
    # CpuTimer skips an end before its start and the logger keeps the previous duration: the
    # timestamps of the comm then belong to an older iteration than the forward's.
    data = _data()
    stale = dict(data, backward_comm_time_end=data["forward_compute_time_start"] - 5)
    assert read_sample(stale) is None
    # Without timestamps (the CUDA timer), the durations are taken as they are.
    cuda = {k: v for k, v in data.items() if not k.endswith(("_start", "_end"))}
    assert read_sample(cuda) is not None


def test_reads_are_due_where_ddp_can_have_logged_a_new_sample() -> None:
    # DDP logs iteration N at the forward of N + 1 (batch N + 1): iterations 1..10, then every
    # `rate`-th.
    assert [n for n in range(1, 60) if read_due(n, rate=25)] == [*range(2, 12), 26, 51]
    assert [n for n in range(1, 300) if read_due(n, DDP_DEFAULT_SAMPLE_RATE)] == [
        *range(2, 12),
        101,
        201,
    ]
    assert not read_due(1, rate=1)  # nothing is logged before the second forward


def test_summary_leaves_out_the_warm_up_iteration_and_averages_the_rest() -> None:
    warmup = DDPSample(1, 50_000_000, 9_000_000, 9_000_000, 0)
    a = DDPSample(2, 1_000_000, 2_000_000, 4_000_000, 3_000_000)
    b = DDPSample(11, 3_000_000, 4_000_000, 2_000_000, 0)
    assert steady([warmup, a, b]) == [a, b]
    figures = summarize([warmup, a, b])
    assert figures == CommFigures(
        samples=2,
        forward_ms=2.0,
        backward_compute_ms=3.0,
        comm_ms_per_step=3.0,
        comm_wait_ms=1.5,  # (1 ms + 2 ms) / 2
        overlap_fraction=0.5,  # 3 ms of 6 ms hidden
        comm_wait_median_ms=1.5,
        comm_wait_least_ms=1.0,
    )
    assert figures.as_dict(step_ms=10.0) == {
        "comm_samples": 2,
        "forward_ms": 2.0,
        "backward_compute_ms": 3.0,
        "comm_ms_per_step": 3.0,
        "comm_wait_ms": 1.5,
        "overlap_fraction": 0.5,
        "comm_wait_fraction": 0.15,
        "comm_wait_median_ms": 1.5,
        "comm_wait_least_ms": 1.0,
        "comm_wait_median_fraction": 0.15,
        "comm_wait_least_fraction": 0.1,
    }
    assert "comm_wait_fraction" not in figures.as_dict(step_ms=None)
    assert summarize([warmup]) is None
    assert summarize([]) is None


def test_no_communication_counts_as_fully_overlapped() -> None:
    figures = summarize([DDPSample(3, 1, 1, 0, 0)])
    assert figures is not None
    assert figures.overlap_fraction == 1.0


class FakeDDP:
    """What the engine touches on DistributedDataParallel (its prototype logging API)."""

    def __init__(self, data: dict[str, Any] | None = None, fail: bool = False) -> None:
        self.data = data or {}
        self.fail = fail
        self.rates: list[int] = []

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("no logger")
        return self.data

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        if self.fail:
            raise RuntimeError("no reducer")
        self.rates.append(rate)


def test_the_prototype_api_missing_or_failing_means_not_measured() -> None:
    assert logging_data(object()) is None
    assert logging_data(FakeDDP(fail=True)) is None
    assert logging_data(FakeDDP({"iteration": 3})) == {"iteration": 3}
    assert not set_sample_rate(object(), 10)
    assert not set_sample_rate(FakeDDP(fail=True), 10)
    ddp = FakeDDP()
    assert set_sample_rate(ddp, 10)
    assert ddp.rates == [10]


def test_only_a_distributed_data_parallel_wrapper_is_found() -> None:
    assert find_ddp(torch.nn.Linear(2, 2)) is None
    assert find_ddp(None) is None
    assert find_ddp(FakeDDP()) is None


@pytest.mark.parametrize("rate", [1, 7, 100])
def test_every_due_read_after_the_first_ten_is_a_multiple_of_the_rate(rate: int) -> None:
    due = [n - 1 for n in range(12, 1000) if read_due(n, rate)]
    assert due == [i for i in range(11, 999) if i % rate == 0]


def test_the_median_and_least_waits_are_not_moved_by_a_few_slow_iterations() -> None:
    # iterations waiting 1-2 ms for the all-reduce, one where the other rank was late: 31 ms
    waits = [2, 1, 2, 2, 31]
    samples = [DDPSample(i, 0, 0, w * 1_000_000, 0) for i, w in enumerate(waits, start=2)]
    figures = summarize(samples)
    assert figures is not None
    assert (figures.comm_wait_ms, figures.comm_wait_median_ms, figures.comm_wait_least_ms) == (
        7.6,
        2.0,
        1.0,
    )
    shown = figures.as_dict(step_ms=10.0)
    assert shown["comm_wait_fraction"] == 0.76
    assert (shown["comm_wait_median_fraction"], shown["comm_wait_least_fraction"]) == (0.2, 0.1)


@pytest.mark.parametrize("per_iteration", [1, 2, 4])
@pytest.mark.parametrize("rate", [1, 7, 10, 100])
def test_the_next_read_is_the_next_batch_count_the_schedule_reads_at(
    rate: int, per_iteration: int
) -> None:
    due = [n for n in range(1, 1500) if read_due(n, rate, per_iteration)]
    for batches in range(0, due[-1]):
        assert next_read(batches, rate, per_iteration) == next(n for n in due if n > batches)
