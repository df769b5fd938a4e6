"""The pure search behind BatchSizeTuner: sizes tried, margin, throughput pick, OOM recognition."""

from __future__ import annotations

import pytest
import torch

from lightning_speedpack.batch_size.search import (
    SizeSearch,
    Trial,
    format_trials,
    free_memory,
    is_oom_error,
    nearest_candidates,
    nearest_multiples,
    next_throughput_size,
    pick_fastest,
    pick_nearest,
    round_down,
    round_up,
)


def _run(search: SizeSearch, limit: int) -> SizeSearch:
    while (size := search.next_size()) is not None:
        search.record(size, size <= limit)
    return search


@pytest.mark.parametrize("limit", [8, 9, 50, 64, 100, 333, 700, 1000, 4096, 8191])
@pytest.mark.parametrize("margin", [0.0, 0.05, 0.2])
def test_largest_fit_is_the_largest_multiple_and_margin_rounds_down(
    limit: int, margin: float
) -> None:
    search = _run(SizeSearch(init_val=8, max_val=8192, multiple_of=8, margin=margin), limit)
    largest = round_down(limit, 8)
    assert search.largest_fit == largest
    assert search.result == max(8, round_down(largest * (1 - margin), 8))
    sizes = [t.batch_size for t in search.trials]
    assert all(s % 8 == 0 and 8 <= s <= 8192 for s in sizes)
    assert len(sizes) == len(set(sizes))  # never the same size twice
    # the chosen size was verified by a real trial at that exact size
    assert any(t.batch_size == search.result and t.fits for t in search.trials)
    assert len(sizes) <= 2 * 11 + 1  # log2 growth + log2 bisection + verification


def test_exponential_growth_then_bisection_between_last_fit_and_first_fail() -> None:
    search = _run(SizeSearch(init_val=8, max_val=8192, multiple_of=8, margin=0.05), 700)
    sizes = [t.batch_size for t in search.trials]
    assert sizes[:8] == [8, 16, 32, 64, 128, 256, 512, 1024]
    # each bisection step lies strictly between the last fit and the first failure so far
    low, high = 512, 1024
    for t in search.trials[8:-1]:
        assert low < t.batch_size < high
        low, high = (t.batch_size, high) if t.fits else (low, t.batch_size)
    assert high - low == 8
    assert (search.largest_fit, search.result) == (696, 656)


def test_multiple_of_other_than_eight_and_unaligned_init_val() -> None:
    search = _run(SizeSearch(init_val=5, max_val=1000, multiple_of=6, margin=0.0), 100)
    assert [t.batch_size for t in search.trials][:4] == [6, 12, 24, 48]
    assert all(t.batch_size % 6 == 0 for t in search.trials)
    assert search.result == 96


def test_cap_limits_the_search_and_rounds_down() -> None:
    search = _run(SizeSearch(init_val=8, max_val=8192, multiple_of=8, margin=0.0, cap=100), 10**9)
    assert [t.batch_size for t in search.trials] == [8, 16, 32, 64, 96]
    assert search.result == 96


def test_max_val_fits_stops_there() -> None:
    # No size ran out of memory, so the margin (a memory safety fraction) is not taken off.
    search = _run(SizeSearch(init_val=8, max_val=64, multiple_of=8, margin=0.05), 10**9)
    assert [t.batch_size for t in search.trials] == [8, 16, 32, 64]
    assert search.result == 64


def test_nothing_fits_gives_no_result() -> None:
    search = _run(SizeSearch(init_val=64, max_val=8192, multiple_of=8, margin=0.05), 7)
    assert search.result is None
    assert search.largest_fit is None
    assert [t.batch_size for t in search.trials] == [64, 32, 16, 8]


def test_init_val_too_large_bisects_down() -> None:
    search = _run(SizeSearch(init_val=256, max_val=8192, multiple_of=8, margin=0.0), 40)
    assert search.result == 40
    assert search.trials[0] == Trial(256, False, None)


def test_verification_failure_searches_below() -> None:
    search = SizeSearch(init_val=8, max_val=128, multiple_of=8, margin=0.2)
    outcomes = {
        8: True,
        16: True,
        32: True,
        64: True,
        128: False,
        96: False,
        80: False,
        72: False,
        48: False,
        24: True,
        40: True,
    }
    while (size := search.next_size()) is not None:
        search.record(size, outcomes[size])
    # 64 fit, 72 did not; 48 (=64*0.8) then failed too: bisect below 48, then apply the margin
    # to 40 -> 32 (known fit)
    assert search.result == 32


def test_record_must_answer_the_proposed_size() -> None:
    search = SizeSearch(init_val=8, max_val=64, multiple_of=8, margin=0.0)
    assert search.next_size() == 8
    with pytest.raises(ValueError, match="expected a result for batch size 8, got one for 16"):
        search.record(16, True)


def test_no_multiple_below_the_bounds_is_an_error() -> None:
    with pytest.raises(ValueError, match="no multiple of 8 is <= 7"):
        SizeSearch(init_val=8, max_val=8192, multiple_of=8, margin=0.0, cap=7)


def test_pick_fastest_prefers_larger_on_ties_and_respects_the_limit() -> None:
    trials = [
        Trial(8, True, 100.0),
        Trial(16, True, 200.0),
        Trial(32, True, 199.0),
        Trial(64, True, 150.0),
        Trial(128, False),
        Trial(56, True, 500.0),
    ]
    assert pick_fastest(trials, limit=48) == 32  # 199 is within 2% of 200: the larger wins
    assert pick_fastest(trials, limit=48, tie_tolerance=0.0) == 16
    assert pick_fastest(trials, limit=56) == 56
    assert pick_fastest([Trial(8, False)], limit=64) is None
    assert pick_fastest([Trial(8, True, None)], limit=64) is None


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("anything"),
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
            "allocate memory: you tried to allocate 1099511627776 bytes."
        ),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you "
            "passed in a non-contiguous input."
        ),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    ],
    ids=["type", "cuda-type", "cuda-msg", "cpu", "cudnn-alloc", "cudnn-snafu", "cublas"],
)
def test_oom_errors_are_recognised(error: BaseException) -> None:
    assert is_oom_error(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("CUDA out of memory"),
        RuntimeError("shape mismatch"),
        KeyError("x"),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"),
    ],
)
def test_other_errors_are_not_oom(error: BaseException) -> None:
    assert not is_oom_error(error)


def test_a_real_cpu_allocation_failure_is_recognised() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**62, dtype=torch.uint8)
    assert is_oom_error(info.value)


def test_free_memory_collects_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr("gc.collect", lambda: calls.append("gc") or 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    free_memory()
    assert calls == ["gc", "empty_cache"]


def test_format_trials_marks_the_chosen_size() -> None:
    text = format_trials([Trial(8, True, 1000.0), Trial(16, False), Trial(8, True, 900.0)], 8)
    lines = text.splitlines()
    assert lines[0].split() == ["batch", "size", "fits", "samples/s"]
    assert lines[2].split() == ["16", "no", "-"]
    assert lines[1].endswith("<- chosen")


def test_next_throughput_size_bisects_towards_the_peak_on_both_sides() -> None:
    def speed(b: int) -> float:  # per-step cost 2 + b**2/1000: samples/s peaks near b = 45
        return b / (2.0 + b * b / 1000.0)

    trials = [Trial(s, True, speed(s)) for s in (8, 16, 32, 64, 128)] + [Trial(256, False)]
    proposed = []
    while (size := next_throughput_size(trials, limit=128, multiple_of=8)) is not None:
        proposed.append(size)
        trials.append(Trial(size, True, speed(size)))
    assert proposed == [48, 40, 56]
    assert pick_fastest(trials, limit=128, tie_tolerance=0.0) == 48
    assert all(s % 8 == 0 for s in proposed)


def test_next_throughput_size_with_nothing_measured() -> None:
    assert next_throughput_size([Trial(8, False)], limit=8, multiple_of=8) is None


def test_margin_only_applies_below_an_out_of_memory_size() -> None:
    # Stopped by the cap (dataset length / max_val), nothing ran out of memory: keep the cap.
    search = SizeSearch(init_val=8, max_val=8192, multiple_of=8, margin=0.05, cap=100)
    while (size := search.next_size()) is not None:
        search.record(size, True)
    assert search.result == 96
    assert [t.batch_size for t in search.trials] == [8, 16, 32, 64, 96]


# --- mode="nearest" ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "multiple_of", "cap", "expected"),
    [
        (50, 8, None, [48, 56]),
        (64, 8, None, [64]),  # already a multiple: itself only
        (1, 8, None, [8]),  # zero is not a batch size
        (7, 8, 7, []),  # and 8 is above the cap
        (50, 8, 56, [48, 56]),  # the cap is inclusive
        (50, 8, 55, [48]),
        (50, 8, 40, [40]),  # the cap below the size: the largest multiple under it
        (64, 8, 40, [40]),
        (100, 6, None, [96, 102]),
        (2048, 8, 4096, [2048]),
    ],
)
def test_nearest_multiples(
    size: int, multiple_of: int, cap: int | None, expected: list[int]
) -> None:
    assert nearest_multiples(size, multiple_of, cap) == expected


def test_nearest_multiples_are_multiples_next_to_the_size() -> None:
    for size in range(1, 200):
        found = nearest_multiples(size, 8)
        assert all(m % 8 == 0 for m in found)
        assert found == sorted(found)
        assert (found == [size]) == (size % 8 == 0)
        assert max(found) - min(found) <= 8  # neighbours: no multiple between them and the size


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"size": 0, "multiple_of": 8}, ValueError, "`size` must be a positive int, got 0"),
        ({"size": 50, "multiple_of": 0}, ValueError, "`multiple_of` must be a positive int"),
        ({"size": 50, "multiple_of": 8, "cap": 0}, ValueError, "`cap` must be a positive int"),
        ({"size": 50.0, "multiple_of": 8}, TypeError, "`size` must be an int, got float 50.0"),
        ({"size": True, "multiple_of": 8}, TypeError, "`size` must be an int, got bool"),
    ],
)
def test_nearest_multiples_rejects_bad_arguments(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        nearest_multiples(**kwargs)  # type: ignore[arg-type]


def test_nearest_candidates_always_hold_todays_size() -> None:
    assert nearest_candidates(50, 8) == [48, 50, 56]
    assert nearest_candidates(64, 8) == [64]  # nothing to measure
    assert nearest_candidates(50, 8, cap=52) == [48, 50]
    assert nearest_candidates(50, 8, cap=48) == [48, 50]  # max_val below today's size
    assert nearest_candidates(5, 8, cap=4) == [5]  # no multiple under the cap: nothing to do


def test_round_up() -> None:
    assert [round_up(v, 8) for v in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, 24]


def test_pick_nearest_breaks_ties_towards_todays_size() -> None:
    trials = [Trial(48, True, 1000.0), Trial(50, True, 995.0), Trial(56, True, 1015.0)]
    assert pick_nearest(trials, 50) == 50  # all within 2% of 1015
    assert pick_nearest(trials, 50, tie_tolerance=0.0) == 56
    assert pick_nearest(trials, 50, tie_tolerance=0.01) == 56  # 1000 and 995 are > 1% behind
    faster = [Trial(48, True, 1000.0), Trial(50, True, 900.0), Trial(56, True, 990.0)]
    assert pick_nearest(faster, 50) == 48  # 48 and 56 tie; 48 is closer to 50
    # equally close (52 is 4 from both): the faster, then the larger
    assert pick_nearest([Trial(48, True, 999.0), Trial(56, True, 1000.0)], 52) == 56
    assert pick_nearest([Trial(48, True, 1000.0), Trial(56, True, 999.0)], 52) == 48
    assert pick_nearest([Trial(48, True, 1000.0), Trial(56, True, 1000.0)], 52) == 56


def test_pick_nearest_skips_sizes_that_did_not_fit() -> None:
    trials = [Trial(48, True, 100.0), Trial(50, False), Trial(56, False)]
    assert pick_nearest(trials, 50) == 48
    assert pick_nearest([Trial(48, False), Trial(50, False)], 50) is None
    assert pick_nearest([Trial(48, True, None)], 50) is None  # fit, but not measured
