"""Reading the batch_size a LightningModule gives self.log, and leaving nothing behind."""

from __future__ import annotations

import pickle

from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_speedpack.core.logged_batch_size import unwatch, watch


def test_records_the_logged_batch_size_and_calls_through() -> None:
    module = BoringModel()
    calls: list[tuple[str, int | None]] = []
    logged = watch(module)
    try:
        # Off a Trainer, Lightning's own `log` raises: the wrapper calls a stand-in instead.
        wrapper = vars(module)["log"]
        wrapper._method = lambda *a, **kw: calls.append((a[0], kw.get("batch_size")))
        module.log("loss", 1.0, batch_size=64)
        assert logged() == 64
        assert calls == [("loss", 64)]
        module.log("acc", 1.0, batch_size=True)  # not an int size
        assert logged() == 64
    finally:
        unwatch(module)
    assert "log" not in vars(module)
    assert "log_dict" not in vars(module)


def test_two_watchers_share_one_wrapper_until_the_last_lets_go() -> None:
    module = BoringModel()
    first, second = watch(module), watch(module)
    assert first is second
    unwatch(module)
    assert "log" in vars(module)
    unwatch(module)
    assert "log" not in vars(module)
    unwatch(module)  # idempotent


def test_a_watched_module_pickles() -> None:
    module = BoringModel()
    watch(module)
    try:
        copy = pickle.loads(pickle.dumps(module))
    finally:
        unwatch(module)
    assert not hasattr(vars(copy).get("log"), "__speedpack_logged__")
