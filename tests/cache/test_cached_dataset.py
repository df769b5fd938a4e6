"""CachedDataset end to end: exactness, hits across workers and ranks, budget, disk, clean-up."""

from __future__ import annotations

import doctest
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    get_worker_info,
)

from lightning_speedpack.cache import cached_dataset as cd_module
from lightning_speedpack.cache import options as opts
from lightning_speedpack.cache.cached_dataset import CacheBudgetWarning, CachedDataset, CacheInfo
from lightning_speedpack.cache.options import job_id
from tests.cache.procs import kill_group, read_line
from tests.cache.test_codec import assert_same
from tests.helpers.ddp import run_ddp

REPO = Path(__file__).resolve().parents[2]


def shm_entries() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("speedpack-")}


@pytest.fixture(autouse=True)
def _no_leftovers() -> Any:
    before = shm_entries()
    yield
    # Only this process's arenas: other runs on the machine may create theirs meanwhile.
    assert {n for n in shm_entries() - before if n.endswith(f"-pid{os.getpid()}")} == set()


class Decoded(Dataset[Any]):
    """Deterministic samples of varying shapes and nesting; counts decodes in a file if asked."""

    def __init__(self, n: int = 24, log: str | None = None) -> None:
        self.n = n
        self.log = log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{i}\n")
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, 4 + i % 7, 5 + i % 3), dtype=torch.uint8, generator=g)
        return {
            "image": image,
            "label": i % 3,
            "extra": (np.arange(i % 4, dtype=np.float32), f"name-{i}", b"\x00" * (i % 5)),
        }


def jitter(sample: dict[str, Any]) -> dict[str, Any]:
    """A random, in-place augmentation (the kind that must stay after the cache)."""
    sample["image"] += torch.randint(0, 2, sample["image"].shape, dtype=torch.uint8)
    return sample


def collate_identity(batch: Any) -> Any:
    return batch


def test_cached_samples_equal_uncached_exactly() -> None:
    base = Decoded()
    with CachedDataset(base, max_bytes=1 << 20) as cached:
        for _epoch in range(2):
            for i in range(len(base)):
                assert_same(cached[i], base[i])
            assert cached.cache_info().misses == len(base)
        info = cached.cache_info()
    assert info == CacheInfo(len(base), len(base), len(base), info.bytes_used, 1 << 20, False)
    assert info.hit_rate == 0.5
    assert info.bytes_used >= sum(base[i]["image"].numel() for i in range(len(base)))


def test_negative_and_numpy_indices_and_out_of_range() -> None:
    with CachedDataset(Decoded(5), max_bytes=1 << 20) as cached:
        assert_same(cached[-1], Decoded(5)[4])
        assert_same(cached[np.int64(2)], Decoded(5)[2])
        with pytest.raises(IndexError, match="out of range"):
            cached[5]


def test_augmentation_still_differs_across_epochs_and_does_not_touch_the_cache() -> None:
    torch.manual_seed(0)
    base = Decoded(8)
    with CachedDataset(base, transform=jitter, max_bytes=1 << 20) as cached:
        epochs = [[cached[i]["image"] for i in range(8)] for _ in range(3)]
        assert cached.cache_info().misses == 8
    for i in range(8):
        clean = base[i]["image"]
        assert not torch.equal(epochs[1][i], epochs[2][i])  # fresh randomness every access
        for e in range(3):
            assert ((epochs[e][i].int() - clean.int()) % 256 <= 1).all()  # applied to clean data


@pytest.mark.parametrize(
    ("context", "persistent", "workers"),
    [
        ("fork", False, 2),
        ("fork", True, 2),
        # spawn: each worker start re-imports torch and the package, so fewer starts
        pytest.param("spawn", False, 2, marks=pytest.mark.slow),
        pytest.param("spawn", True, 1, marks=pytest.mark.slow),
    ],
    ids=["fork-non-persistent", "fork-persistent", "spawn-non-persistent", "spawn-persistent"],
)
def test_epoch_two_is_all_hits_with_workers(context: str, persistent: bool, workers: int) -> None:
    base = Decoded(24)
    with CachedDataset(base, max_bytes=1 << 20) as cached:
        loader = DataLoader(
            cached,
            batch_size=4,
            num_workers=workers,
            collate_fn=collate_identity,
            multiprocessing_context=context,
            persistent_workers=persistent,
            shuffle=True,
        )
        for _ in loader:
            pass
        first = cached.cache_info()
        seen = [s for batch in loader for s in batch]
        second = cached.cache_info()
        del loader
    assert (first.misses, first.hits, first.items) == (24, 0, 24)
    assert (second.misses, second.hits - first.hits) == (24, 24)  # epoch 2: 100% hits
    assert sorted(s["label"] for s in seen) == sorted(i % 3 for i in range(24))
    by_name = {s["extra"][1]: s for s in seen}
    for i in range(24):
        assert_same(by_name[f"name-{i}"], base[i])


def test_budget_reached_passes_samples_through_with_one_warning() -> None:
    base = Decoded(24)
    with CachedDataset(base, max_bytes=2048) as cached:
        with pytest.warns(CacheBudgetWarning, match="reached its budget") as record:
            samples = [cached[i] for _ in range(2) for i in range(24)]
        for k, got in enumerate(samples):
            assert_same(got, base[k % 24])
        info = cached.cache_info()
    assert len(record) == 1
    assert info.budget_exhausted
    assert 0 < info.items < 24
    assert info.bytes_used <= 2048
    assert info.hits == info.items
    assert info.misses == 48 - info.items


def test_disk_storage_is_reused_and_invalidated(tmp_path: Path) -> None:
    log = tmp_path / "decodes.txt"
    path = tmp_path / "cache" / "train.bin"
    path.parent.mkdir()
    with CachedDataset(Decoded(10, str(log)), storage="disk", path=path, max_bytes=1 << 20) as c:
        assert [c[i]["label"] for i in range(10)] == [i % 3 for i in range(10)]
    assert path.exists()
    kwargs: dict[str, Any] = {"storage": "disk", "max_bytes": 1 << 20}
    with CachedDataset(Decoded(10, str(log)), path=str(path), **kwargs) as c:
        assert c.cache_info().items == 10  # reused: filled by the previous run
        for i in range(10):
            assert_same(c[i], Decoded(10)[i])
        assert (c.cache_info().hits, c.cache_info().misses) == (10, 0)
    assert len(log.read_text().split()) == 10  # decoded once over both runs
    with CachedDataset(Decoded(10), storage="disk", path=path, max_bytes=1 << 20, key="v2") as c:
        assert c.cache_info().items == 0  # another key: rebuilt
    with CachedDataset(Decoded(11), storage="disk", path=path, max_bytes=1 << 20, key="v2") as c:
        assert c.cache_info().items == 0  # another length: rebuilt


def test_datasets_that_differ_only_in_their_data_get_separate_caches() -> None:
    a = TensorDataset(torch.zeros(4, 2))
    b = TensorDataset(torch.ones(4, 2))
    with CachedDataset(a, max_bytes=1 << 16) as ca, CachedDataset(b, max_bytes=1 << 16) as cb:
        assert ca.cache_path != cb.cache_path
        assert ca[0][0].sum() == 0
        assert cb[0][0].sum() == 2


def test_pickled_copy_shares_the_arena() -> None:
    with CachedDataset(Decoded(6), max_bytes=1 << 20) as cached:
        cached[1]
        copy = pickle.loads(pickle.dumps(cached))
        assert copy.cache_path == cached.cache_path
        assert copy.cache_info().items == 1
        copy[2]
        assert cached.cache_info().items == 2
        copy.close()
        assert os.path.exists(str(cached.cache_path))  # a copy never removes the owner's file


def test_unsupported_sample_names_type_and_index() -> None:
    class Bad(Dataset[Any]):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, i: int) -> Any:
            return {"x": torch.ones(1), "when": {1, 2}} if i == 2 else torch.ones(1)

    with CachedDataset(Bad(), max_bytes=1 << 16) as cached:
        cached[0]
        with pytest.raises(TypeError, match=r"at index 2: builtins\.set"):
            cached[2]


def test_a_stream_gets_a_cached_stream() -> None:
    from lightning_speedpack.cache.stream import CachedStream

    class Stream(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    cached = CachedDataset(Stream(), max_bytes=1 << 20)
    try:
        assert isinstance(cached, CachedStream)
        assert [int(x) for x in cached] == [0, 1, 2]
        assert [int(x) for x in cached] == [0, 1, 2]  # from the cache
        assert cached.cache_info().hits == 3
    finally:
        cached.close()
    assert not isinstance(pickle.loads(pickle.dumps(CachedDataset(Decoded(2)))), CachedStream)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_bytes": -1}, ValueError, "`max_bytes` must be a positive int, got -1"),
        ({"max_bytes": 1.5}, TypeError, "`max_bytes` must be an int or None, got float"),
        ({"storage": "ram"}, ValueError, "`storage` must be 'shared' or 'disk', got 'ram'"),
        ({"storage": "disk"}, ValueError, "needs `path=`"),
        ({"path": "x.bin"}, ValueError, "only used with storage='disk'"),
        ({"transform": 3}, TypeError, "`transform` must be callable"),
        ({"key": 1.0}, TypeError, "`key` must be a str, an int or None, got float"),
        ({"max_bytes": 1 << 60}, ValueError, r"exceeds the .* free in /dev/shm"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CachedDataset(Decoded(3), **kwargs)
    with pytest.raises(TypeError, match="map-style"):
        CachedDataset(42)  # type: ignore[arg-type]


def test_small_dev_shm_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = opts.shutil.disk_usage("/dev/shm")
    monkeypatch.setattr(opts.shutil, "disk_usage", lambda p: usage._replace(free=64_000_000))
    with pytest.raises(RuntimeError, match=r"only 61\.0 MiB free in /dev/shm.*--shm-size"):
        CachedDataset(Decoded(3))


def test_default_budget_is_a_fraction_of_free_shm_and_ram() -> None:
    import psutil

    with CachedDataset(Decoded(3)) as cached:
        capacity = cached.cache_info().capacity_bytes
    limit = min(opts.shutil.disk_usage("/dev/shm").free, psutil.virtual_memory().available)
    assert 0 < capacity <= limit * 0.5 * 1.05


def test_job_id_is_shared_by_ranks_and_differs_between_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert job_id() == f"pid{os.getpid()}"  # single process, or rank 0 before the launch
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert job_id() == "port127.0.0.1-29500"
    monkeypatch.setenv("LOCAL_RANK", "1")  # a rank Lightning's launcher started
    assert job_id() == "port127.0.0.1-29500"
    assert job_id(lambda j: j == f"pid{os.getppid()}") == f"pid{os.getppid()}"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert job_id() == "slurm77.0"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert job_id() == "teabc-29500"


@pytest.mark.slow
def test_lightning_launched_rank_finds_the_cache_its_parent_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 builds the dataset before Trainer.fit sets MASTER_PORT; the re-run rank finds it."""
    # A launcher's variables left in this process by an earlier test (Lightning's ddp_spawn
    # sets MASTER_PORT in the parent) would name the parent's cache after them instead.
    for var in ("MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    key = f"launched-{os.getpid()}-{time.monotonic_ns()}"  # first instance of it in both
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.cache.test_cached_dataset import Decoded
        from lightning_speedpack.cache.cached_dataset import CachedDataset
        c = CachedDataset(Decoded(6), max_bytes=1 << 20, key={key!r})
        print(c.cache_path, c.cache_info().items)
        c.close()
    """)
    )
    with CachedDataset(Decoded(6), max_bytes=1 << 20, key=key) as parent:
        parent[0]
        parent[1]
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "LOCAL_RANK": "1"}
        child = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = child.communicate(timeout=120)
        finally:
            kill_group(child.pid)
        assert child.returncode == 0, stderr
        assert stdout.split() == [parent.cache_path, "2"]
        assert os.path.exists(str(parent.cache_path))


def test_docstring_example_runs() -> None:
    results = doctest.testmod(cd_module, optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0
    assert results.failed == 0


# ----------------------------------------------------------------------- clean-up in /dev/shm
SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
import torch
from torch.utils.data import DataLoader, get_worker_info
from tests.cache.test_cached_dataset import Decoded
from lightning_speedpack.cache.cached_dataset import CachedDataset

mode = sys.argv[1]

class Killer(Decoded):
    def __getitem__(self, i):
        if i == 5 and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)

cached = CachedDataset(Killer(12), max_bytes=1 << 20)
print(cached.cache_path, flush=True)
if mode == "worker-killed":
    def epoch():
        try:
            for _ in DataLoader(cached, batch_size=None, num_workers=2, timeout=60):
                pass
        except Exception as err:  # RuntimeError, or the fd transfer from the dead worker failing
            return type(err).__name__
        return "nothing"
    try:
        died = epoch()
    except RuntimeError:  # torch's SIGCHLD handler may raise again while the first is handled
        died = "RuntimeError"
    print("worker died:", died, flush=True)
    for i in range(12):  # the half-written index is unfilled, not corrupt
        s = cached[i]
        assert torch.equal(s["image"], Decoded(12)[i]["image"]), i
    print("items", cached.cache_info().items, flush=True)
elif mode == "exception":
    cached[0]
    raise ValueError("boom")
elif mode == "interrupt":
    # Ctrl-C as a terminal delivers it, whatever this test's parent had done with SIGINT (a
    # shell's background job inherits it ignored, and Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    cached[0]
    print("ready", flush=True)
    time.sleep(60)
else:
    cached[0]
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["success", "exception", "interrupt", "worker-killed"])
def test_no_leftovers_in_dev_shm(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(repo=str(REPO)))
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        path = read_line(proc)
        assert path.startswith("/dev/shm/speedpack-")
        if mode == "interrupt":
            assert read_line(proc) == "ready"
            assert os.path.exists(path)
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc.pid)
    expected = {"success": 0, "worker-killed": 0, "exception": 1, "interrupt": -signal.SIGINT}
    assert proc.returncode == expected[mode], err
    if mode == "worker-killed":
        assert "worker died" in out
        assert "worker died: nothing" not in out
        assert "items 12" in out
    if mode == "exception":
        assert "ValueError: boom" in err
    if mode == "interrupt":
        assert "KeyboardInterrupt" in err
    deadline = time.monotonic() + 5
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(path)


# --------------------------------------------------------------------------------- real DDP
def _collate_labels(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {"label": [s["label"] for s in batch]}


def _ddp_rank(tmp: str, log: str) -> tuple[int, str, CacheInfo]:
    from pytorch_lightning import LightningModule, Trainer  # not in spawned DataLoader workers

    class CacheReader(LightningModule):
        """Trains on a CachedDataset; Lightning adds the DistributedSampler."""

        def __init__(self, dataset: Dataset[Any]) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.dataset = dataset

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            labels = torch.as_tensor(batch["label"], dtype=torch.float32).view(-1, 1)
            return self.layer(labels).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(self.dataset, batch_size=4, collate_fn=_collate_labels)

    cached = CachedDataset(Decoded(32, log), max_bytes=1 << 20)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
    )
    trainer.fit(CacheReader(cached))
    trainer.strategy.barrier()
    info = cached.cache_info()
    path = str(cached.cache_path)
    trainer.strategy.barrier()
    cached.close()
    return trainer.global_rank, path, info


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ddp_ranks_fill_each_index_once_for_the_node(tmp_path: Path) -> None:
    log = tmp_path / "decodes.txt"
    results = run_ddp(_ddp_rank, str(tmp_path), str(log), timeout=200)
    (_, path0, info0), (_, path1, info1) = results
    assert path0 == path1  # both ranks used one arena
    decoded = sorted(int(x) for x in log.read_text().split())
    assert decoded == list(range(32))  # every index decoded exactly once on the node
    for info in (info0, info1):
        assert (info.items, info.misses, info.hits) == (32, 32, 64)  # node-wide counts
    assert not os.path.exists(path0)


def test_batched_fetch_matches_single_fetch_and_counts() -> None:
    base = Decoded(10)
    with CachedDataset(base, transform=lambda s: s["label"], max_bytes=1 << 20) as cached:
        assert cached.__getitems__([3, 1, 3]) == [0, 1, 0]  # miss, miss, hit
        assert cached.__getitems__([1, 3, -1, np.int64(2)]) == [1, 0, 0, 2]
        info = cached.cache_info()
        with pytest.raises(IndexError):
            cached.__getitems__([10])
    assert (info.hits, info.misses, info.items) == (3, 4, 4)


def test_stages_are_reported_automatically() -> None:
    from lightning_speedpack.core import stages

    table = stages.CounterTable(rows=1)
    stages.activate(table, row=0)
    try:
        with CachedDataset(Decoded(6), transform=lambda s: s["label"], max_bytes=1 << 20) as c:
            [c[i] for i in range(4)]  # 4 misses, one at a time
            c.__getitems__([4, 5])  # 2 misses in one batch: no cache read recorded
            misses_only = table.read()[0].stages
            c.__getitems__([0, 1, 2, 3])  # 4 hits in one batch
    finally:
        stages.deactivate()
    assert stages.CACHE_HIT_STAGE not in misses_only  # decoding misses is not a cache read
    recorded = table.read()[0].stages
    assert recorded[stages.CACHE_MISS_STAGE][1] == 6
    assert recorded[stages.CACHE_HIT_STAGE][1] == 4
    assert recorded["transform"][1] == 10


def test_a_batched_cache_read_does_not_count_the_decoding_of_its_misses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_speedpack.cache import cached_dataset as module
    from lightning_speedpack.core import stages

    clock = [0.0]
    monkeypatch.setattr(module, "perf_counter", lambda: clock[0])

    class SlowDecode(Decoded):
        def __getitem__(self, i: int) -> Any:
            clock[0] += 100.0  # each decode takes 100 s on the (fake) clock
            return super().__getitem__(i)

    table = stages.CounterTable(rows=1)
    stages.activate(table, row=0)
    try:
        with CachedDataset(SlowDecode(6), max_bytes=1 << 20) as c:
            c[0]  # fills index 0
            c.__getitems__([0, 1])  # one hit, one miss decoded in the same batch
    finally:
        stages.deactivate()
    assert table.read()[0].stages[stages.CACHE_HIT_STAGE] == (0.0, 1)  # the read only


class Alike(Dataset[Any]):
    """Samples whose tensors all lie alike (read together from the cache): image, vector, label."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        return torch.full((3, 4, 4), i, dtype=torch.uint8), torch.tensor([i * 0.5, -i]), i % 3


def _expected_batches(batch_size: int, scale: int = 1) -> list[Any]:
    base = Alike()
    samples = [base[i] for i in range(len(base))]
    batches = [samples[k : k + batch_size] for k in range(0, len(samples), batch_size)]
    return [
        (
            torch.stack([x for x, _, _ in b]) * scale,
            torch.stack([v for _, v, _ in b]) * scale,
            torch.tensor([y for _, _, y in b]),
        )
        for b in batches
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_batches_are_exact_and_modifying_them_leaves_the_cache_intact(
    workers: int,
) -> None:
    expected = _expected_batches(5)
    with CachedDataset(Alike(), max_bytes=1 << 20) as cached:
        loader = DataLoader(
            cached,
            batch_size=5,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
            persistent_workers=workers > 0,
        )
        for _epoch in range(3):  # a miss epoch, then two epochs of hits
            got = list(loader)
            for (x, v, y), (ex, ev, ey) in zip(got, expected, strict=True):
                assert torch.equal(x, ex)
                assert torch.equal(v, ev)
                assert torch.equal(y, ey)
                x.mul_(0)  # a user's in-place work on the batch
                v.add_(1)
        info = cached.cache_info()
        del loader
    assert (info.misses, info.hits) == (16, 32)


def scaling_collate(batch: list[Any]) -> Any:
    """A user's collate that works on the samples in place before stacking them."""
    for x, v, _ in batch:
        x.mul_(2)
        v.mul_(2)
    return torch.utils.data.default_collate(batch)


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "under-the-profiler"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_that_modifies_samples_in_place_leaves_the_cache_intact(
    workers: int, profiled: bool
) -> None:
    from lightning_speedpack.core import stages
    from lightning_speedpack.data_xray.instrument import LoaderProbe

    expected = _expected_batches(4, scale=2)
    with CachedDataset(Alike(), max_bytes=1 << 20) as cached:
        loader = DataLoader(
            cached,
            batch_size=4,
            num_workers=workers,
            collate_fn=scaling_collate,
            multiprocessing_context="fork" if workers else None,
        )
        if profiled:  # as the DataPipelineProfiler instruments a loader
            probe = LoaderProbe(loader)
            stages.activate(probe.table, 0)
        for _epoch in range(3):
            for (x, v, y), (ex, ev, ey) in zip(loader, expected, strict=True):
                assert torch.equal(x, ex)
                assert torch.equal(v, ev)
                assert torch.equal(y, ey)
        assert cached.cache_info().hits == 32
        if profiled:
            stages.deactivate()
            assert sum(row.samples for row in probe.table.read()) == 48  # each fetch timed
            probe.restore()
        del loader


def test_reads_for_torchs_default_collate_copy_nothing_and_others_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path (views into the cache, stacked by default_collate) is taken under torch's
    own DataLoader, also while profiled; anything else gets samples of its own."""
    from lightning_speedpack.cache.arena import Arena
    from lightning_speedpack.core import stages
    from lightning_speedpack.data_xray.instrument import LoaderProbe, TimedCollate

    hows: list[str] = []
    original = Arena.get_many

    def spy(self: Arena, indices: Any, n: int, *, how: Any = "together") -> list[Any]:
        hows.append(how)
        return original(self, indices, n, how=how)

    monkeypatch.setattr(Arena, "get_many", spy)
    default = torch.utils.data.default_collate
    with CachedDataset(Alike(), max_bytes=1 << 20) as cached:
        cached.__getitems__(list(range(16)))  # fill
        runs = {
            "default": DataLoader(cached, batch_size=16),
            "custom": DataLoader(cached, batch_size=16, collate_fn=scaling_collate),
            "timed default": DataLoader(cached, batch_size=16, collate_fn=TimedCollate(default)),
            "timed custom": DataLoader(cached, batch_size=16, collate_fn=TimedCollate(list)),
        }
        seen = {}
        for name, loader in runs.items():
            hows.clear()
            list(loader)
            seen[name] = hows[-1]
        hows.clear()
        profiled = DataLoader(cached, batch_size=16)
        probe = LoaderProbe(profiled)  # as the DataPipelineProfiler instruments a loader
        stages.activate(probe.table, 0)
        try:
            list(profiled)
        finally:
            stages.deactivate()
            probe.restore()
        seen["profiled loader"] = hows[-1]
        train, _ = torch.utils.data.random_split(cached, [12, 4])  # a Subset of a Subset below
        for name, subset in (("subset", train), ("subset of subset", Subset(train, range(8)))):
            hows.clear()
            list(DataLoader(subset, batch_size=4))
            seen[name] = hows[-1]
            hows.clear()
            list(DataLoader(subset, batch_size=4, collate_fn=scaling_collate))
            seen[f"{name}, custom"] = hows[-1]
        hows.clear()
        direct = cached.__getitems__([0, 1])  # a direct call: the caller may keep the samples
        seen["direct"] = hows[-1]
        direct[0][0].fill_(99)
        assert int(cached[0][0][0, 0, 0]) == 0
    assert seen == {
        "default": "views",
        "custom": "together",
        "timed default": "views",
        "timed custom": "together",
        "profiled loader": "views",
        "subset": "views",
        "subset, custom": "together",
        "subset of subset": "views",
        "subset of subset, custom": "together",
        "direct": "together",
    }


class _Sized(Dataset[Any]):
    """Samples of ``nbytes`` bytes (uint8), each filled with its index."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.nbytes,), i, dtype=torch.uint8)


@pytest.mark.parametrize(("nbytes", "worker_reads"), [(768, "each"), (8192, "views")])
def test_workers_copy_small_samples_and_view_large_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nbytes: int, worker_reads: str
) -> None:
    """Under default_collate the main process always reads views; a forked worker reads a
    sample under 4 KiB as a copy (views cost each worker more memory than such a sample's
    copy costs time), a larger one as views. The batches are the same either way."""
    from lightning_speedpack.cache.arena import Arena

    log = tmp_path / "hows"
    original = Arena.get_many

    def spy(self: Arena, indices: Any, n: int, *, how: Any = "together") -> list[Any]:
        with log.open("a") as out:  # written by the worker process too
            out.write(f"{'worker' if get_worker_info() else 'main'} {how}\n")
        return original(self, indices, n, how=how)

    monkeypatch.setattr(Arena, "get_many", spy)
    expected = torch.arange(8, dtype=torch.uint8)[:, None].expand(8, nbytes)
    with CachedDataset(_Sized(nbytes), max_bytes=1 << 20) as cached:
        cached.__getitems__(list(range(8)))  # fill
        log.unlink()
        for workers in (0, 1):
            context = "fork" if workers else None
            loader = DataLoader(
                cached, batch_size=8, num_workers=workers, multiprocessing_context=context
            )
            assert torch.equal(next(iter(loader)), expected)
    assert log.read_text().splitlines() == ["main views", f"worker {worker_reads}"]


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_stacked_from_views_train_like_any_batch(workers: int) -> None:
    """The views are made in inference mode (no autograd view record per sample); the batch
    default_collate stacks from them is an ordinary tensor: saved for backward, changed in
    place, never an inference tensor."""
    expected = _expected_batches(8)
    with CachedDataset(Alike(), max_bytes=1 << 20) as cached:
        cached.__getitems__(list(range(len(cached))))  # fill: the loader below reads views
        loader = DataLoader(cached, batch_size=8, num_workers=workers)
        weight = torch.ones(1, requires_grad=True)
        for (x, _, _), (ex, _, _) in zip(loader, expected, strict=True):
            assert not x.is_inference()
            (x.float() * weight).sum().backward()  # raises for an inference tensor
            x.add_(1)  # raises for an inference tensor outside inference mode
            assert torch.equal(x, ex + 1)
        assert weight.grad is not None
        assert torch.equal(cached[0][0], expected[0][0][0])  # the cache is untouched


def test_an_in_place_transform_under_default_collate_leaves_the_cache_intact() -> None:
    def brighten(sample: Any) -> Any:
        x, v, y = sample
        return x.add_(1), v, y

    expected = _expected_batches(8)
    with CachedDataset(Alike(), transform=brighten, max_bytes=1 << 20) as cached:
        loader = DataLoader(cached, batch_size=8)
        for _epoch in range(3):
            for (x, _, _), (ex, _, _) in zip(loader, expected, strict=True):
                assert torch.equal(x, ex + 1)


_READ_COPIES: list[Any] = []  # weak references to the samples a transform was given


def _count_held_read_copies(sample: Any) -> Any:
    """A transform that reports how many earlier read copies are still alive when it runs."""
    import weakref

    x, v, y = sample
    held = sum(ref() is not None for ref in _READ_COPIES)
    _READ_COPIES.append(weakref.ref(x))
    return x.float() * 2, v, y, held


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_gets_each_read_copy_dropped_before_the_next_is_read(workers: int) -> None:
    """Memory with a transform: the read copies of a batch are not all held until its end
    (each was another decoded sample in every worker's heap)."""
    _READ_COPIES.clear()
    with CachedDataset(Alike(), transform=_count_held_read_copies, max_bytes=1 << 20) as cached:
        loader = DataLoader(cached, batch_size=8, num_workers=workers)
        for _epoch in range(2):  # epoch 1 fills, epoch 2 reads every sample from the cache
            batches = list(loader)
        assert cached.cache_info().hits == 16
    assert [int(h) for *_, held in batches for h in held] == [0] * 16
    for (x, v, y, _), (ex, ev, ey) in zip(batches, _expected_batches(8), strict=True):
        assert torch.equal(x, ex.float() * 2)
        assert torch.equal(v, ev)
        assert torch.equal(y, ey)
