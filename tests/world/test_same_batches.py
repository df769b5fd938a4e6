"""``world/same-batches``: the prints of each rank's first batches, compared at rank 0."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from lightning_speedpack.world.figures import world_figures
from lightning_speedpack.world.findings import world_findings
from lightning_speedpack.world.same_batches import (
    BATCHES,
    EPOCHS,
    LATER,
    BatchPrints,
    data_parallel,
    find_same_batches,
    repeated_batches_finding,
    repeated_in_epoch,
    same_batches_finding,
)
from tests.world.synthetic import payloads


def _prints(batches: list[Any], epochs: int = 2) -> dict[str, str]:
    prints = BatchPrints()
    for epoch in range(epochs):
        for i, batch in enumerate(batches):
            if prints.wants(epoch, i):
                prints.take(epoch, i, batch)
    return prints.digests()


def _stream(seed: int, n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)
    ]


def test_the_first_batches_of_the_first_epochs_are_printed_and_a_few_later_ones() -> None:
    digests = _prints(_stream(0, LATER[1] + 3), epochs=EPOCHS + 2)
    printed = [*range(BATCHES), *LATER[:2]]  # the stream ends before the last of LATER
    assert sorted(digests) == sorted(f"{e}:{b}" for e in range(EPOCHS) for b in printed)


def test_a_print_tells_batches_apart_by_values_shape_and_dtype() -> None:
    x = torch.arange(64.0).reshape(8, 8)
    base = _prints([(x,), (x + 1,)])
    assert _prints([(x.clone(),), (x + 1,)]) == base  # the same values: the same print
    assert _prints([(x.reshape(4, 16),), (x + 1,)])["0:0"] != base["0:0"]  # another shape
    assert _prints([(x.double(),), (x + 1,)])["0:0"] != base["0:0"]  # another dtype
    changed = x.clone()
    changed[0, 0] = -1.0  # one element of the sampled ones
    assert _prints([(changed,), (x + 1,)])["0:0"] != base["0:0"]


def _nested() -> torch.Tensor:
    with warnings.catch_warnings():  # "prototype stage": the strided layout, on purpose
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


def test_every_kind_of_tensor_in_a_batch_is_printed_without_error() -> None:
    wide = torch.randn(8, 6)
    batch = {
        "nested": _nested(),  # its sample fails: left out (first: only 4 tensors are printed)
        "bf16": torch.randn(4, 3).bfloat16(),
        "mask": torch.rand(4, 3) > 0.5,
        "transposed": wide.t(),  # not contiguous
        "scalar": torch.tensor(3.0),
        "empty": torch.empty(0, 5),  # passed over
        "meta": torch.empty(4, device="meta"),  # passed over
        "sparse": torch.eye(3).to_sparse(),  # passed over
        "text": ["not", "a", "tensor"],
    }
    digests = _prints([batch, batch])
    assert len(set(digests.values())) == 1  # the same batch each time, alike


def test_ranks_with_the_same_batches_are_grouped() -> None:
    same, other = _prints(_stream(0)), _prints(_stream(1))
    assert find_same_batches({0: same, 1: same}) == {
        "groups": [[0, 1]],
        "world": 2,
        "batches": 6,
        "distinct": 1,
    }
    assert find_same_batches({0: same, 1: other}) is None
    # Sharded by LOCAL_RANK on two nodes: rank k and rank k + 2 read alike.
    four = find_same_batches({0: same, 1: other, 2: same, 3: other})
    assert four is not None
    assert (four["groups"], four["distinct"]) == ([[0, 2], [1, 3]], 2)


def test_constant_data_and_too_few_batches_tell_nothing() -> None:
    constant = _prints([(torch.ones(8, 4),)] * 3)
    assert find_same_batches({0: constant, 1: constant}) is None  # every batch alike
    one = {"0:0": "a"}
    assert find_same_batches({0: one, 1: one}) is None  # one batch compared: not enough
    assert find_same_batches({0: _prints(_stream(0))}) is None  # one rank


def test_the_finding_names_the_ranks_the_share_and_the_fix() -> None:
    four = same_batches_finding(
        {"groups": [[0, 2], [1, 3]], "world": 4, "batches": 8, "distinct": 2}
    )
    assert (four.component, four.id, four.severity) == ("world", "same-batches", "warning")
    assert four.message.startswith("some ranks trained on the same batches (")
    assert "the same on ranks 0 and 2; ranks 1 and 3)" in four.message
    assert four.message.endswith("4 ranks trained on the samples of 2")
    assert four.figures["wall_fraction"] == 0.5
    assert "not by LOCAL_RANK" in (four.fix or "")


def test_the_world_carries_it_only_when_every_rank_sent_its_prints() -> None:
    same = _prints(_stream(0))
    world = payloads({0: (1.0, 3.0), 1: (1.0, 3.0)})
    for rank in world:
        world[rank]["batch_prints"] = same
    figures = world_figures(world)
    assert figures["same_batches"]["groups"] == [[0, 1]]
    assert [f.id for f in world_findings(figures)] == ["same-batches"]
    del world[1]["batch_prints"]  # a rank that printed nothing (an older pack, no batches)
    assert world_figures(world)["same_batches"] is None


@pytest.mark.parametrize(
    ("name", "expected"), [("ModelParallelStrategy", False), ("DDPStrategy", True)]
)
def test_tensor_parallel_ranks_are_meant_to_share_batches(name: str, expected: bool) -> None:
    strategy = type(name, (), {})()
    assert data_parallel(type("Sub", (type(strategy),), {})()) is expected


def test_a_stream_each_worker_reads_whole_repeats_its_batches_in_runs() -> None:
    own = _stream(0, 4)
    two_workers = [own[0], own[0], own[1], own[1], own[2], own[2]]  # what 2 workers hand over
    repeated = repeated_in_epoch(_prints(two_workers))
    assert repeated == {
        "epoch": 0,
        "groups": [[0, 1], [2, 3], [4, 5]],
        "printed": [0, 1, 2, 3, 4, 5],
        "distinct": 3,
        "head": 6,
        "head_distinct": 3,
    }
    finding = repeated_batches_finding(repeated)
    assert (finding.component, finding.id, finding.severity) == (
        "data",
        "repeated-batches",
        "warning",
    )
    assert "(of its first 6 batches, only 3 differ: batches 0 and 1 are one; 2 and 3 too;" in (
        finding.message
    )
    assert finding.figures["wall_fraction"] == 0.5
    assert "get_worker_info()" in (finding.fix or "")


def test_as_many_workers_as_the_first_batches_printed_are_told_from_constant_data() -> None:
    # 12 workers that each read the whole stream: batches 0-11 are one batch, 12-23 the next
    own = _stream(0, 6)
    twelve_workers = [own[i // 12] for i in range(40)]
    repeated = repeated_in_epoch(_prints(twelve_workers))
    assert repeated is not None
    assert repeated["groups"] == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert repeated["printed"] == [0, 1, 2, 3, 4, 5, 6, 7, 16, 32]
    finding = repeated_batches_finding(repeated)
    assert (
        "(of its first 8 batches and batches 16 and 32, only 3 differ: batches 0 to 7 are one)"
        in finding.message
    )
    assert finding.figures["wall_fraction"] == 0.875  # a floor: 7 of 8 at least
    # data that is the same in every batch, the later ones too, is still constant data
    assert repeated_in_epoch(_prints([(torch.ones(8, 4),)] * 40)) is None


def test_batches_that_differ_or_are_all_alike_do_not_repeat() -> None:
    assert repeated_in_epoch(_prints(_stream(0, 6))) is None  # each batch its own
    assert repeated_in_epoch(_prints([(torch.ones(8, 4),)] * 6)) is None  # constant data
    # the same batches epoch after epoch (a stream not shuffled) are not a repeat in an epoch
    assert repeated_in_epoch(_prints(_stream(0, 3), epochs=3)) is None


def test_the_later_batches_compared_are_named_in_the_finding() -> None:
    shared = _prints(_stream(0, LATER[0] + 1))  # the first 8 and batch 16 of 2 epochs
    same = find_same_batches({0: shared, 1: shared})
    assert same is not None
    assert same["later"] == [LATER[0]]
    message = same_batches_finding(same).message
    assert (
        f"(the first {BATCHES} of each epoch and batch {LATER[0]} compared, 18 in all:" in message
    )
