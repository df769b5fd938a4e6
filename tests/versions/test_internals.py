"""The Lightning internals that moved between supported releases, detected and said.

The last test fits a real Trainer: on every Lightning `make test-versions` runs, what
``core.lightning.INTERNALS`` claims about it is what that Lightning does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lightning_speedpack.core import lightning as core
from lightning_speedpack.core.profiler_tap import tap, untap
from tests.helpers.namespaces import Namespace, each_namespace


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.4.0", (2, 4, 0)), ("2.5", (2, 5, 0)), ("2.13.0+cpu", (2, 13, 0)), ("2.6.0rc1", (2, 6, 0))],
)
def test_release_of_a_version_string(version: str, release: tuple[int, int, int]) -> None:
    assert core._release(version) == release


def test_an_internal_is_there_from_its_release_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "lightning_version", lambda obj=None: (2, 4, 9))
    assert not core.has_internal(object(), "save_checkpoint")
    monkeypatch.setattr(core, "lightning_version", lambda obj=None: (2, 5, 0))
    assert core.has_internal(object(), "save_checkpoint")
    with pytest.raises(KeyError):
        core.has_internal(object(), "no_such_internal")


def test_what_is_not_measured_is_said_once_per_tool_and_release(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(core, "lightning_version", lambda obj=None: (2, 4, 0))
    monkeypatch.setattr(core, "_NOTED", set())
    with caplog.at_level(logging.INFO):
        assert not core.note_missing_internal(object(), "save_checkpoint", "WallTimeLedger")
        assert not core.note_missing_internal(object(), "save_checkpoint", "WallTimeLedger")
        assert not core.note_missing_internal(object(), "save_checkpoint", "Other")
    lines = [r.getMessage() for r in caplog.records if "save_checkpoint" in r.getMessage()]
    assert lines[0] == (
        "WallTimeLedger: Lightning 2.4.0 does not time `Trainer.save_checkpoint` as the profiler "
        "action 'save_checkpoint' (Lightning 2.5.0 and newer do): checkpoint saves are not "
        "counted, and a save that no checkpoint callback makes (`trainer.save_checkpoint` in a "
        "hook) is charged to its caller."
    )
    assert [line.split(":", 1)[0] for line in lines] == ["WallTimeLedger", "Other"]


def test_a_lightning_installed_but_not_importable_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "classes", lambda dotted: ())
    monkeypatch.setattr(core, "installed_namespaces", lambda: ("no_such_lightning_xyz",))
    with pytest.raises(ImportError, match="cannot import no_such_lightning_xyz: No module named"):
        core._callback_base()
    # pytorch-lightning < 2.4 beside setuptools >= 81 (what torch >= 2.13 pulls in)
    missing = ModuleNotFoundError("No module named 'pkg_resources'", name="pkg_resources")
    error = core._import_error("pytorch_lightning", missing)
    assert str(error) == (
        "lightning-speedpack cannot import pytorch_lightning: No module named 'pkg_resources' "
        "(Lightning before 2.4 imports `pkg_resources`, which setuptools 81 and newer no longer "
        "ship: `pip install 'pytorch-lightning>=2.4'`)"
    )


class _Actions:
    def __init__(self) -> None:
        self.started: list[str] = []

    def on_action(self, name: str, started: bool, now: float) -> None:
        if started:
            self.started.append(name)


@each_namespace
def test_the_internals_claimed_are_what_this_lightning_does(ns: Namespace, tmp_path: Path) -> None:
    actions = _Actions()

    class Listen(ns.Callback):  # type: ignore[misc, name-defined]
        def setup(self, trainer: object, pl_module: object, stage: str) -> None:
            tap(trainer, actions)

        def teardown(self, trainer: object, pl_module: object, stage: str) -> None:
            untap(trainer, actions)

    checkpoint = ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1)
    trainer = ns.Trainer(
        default_root_dir=tmp_path,
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Listen(), checkpoint],
    )
    trainer.fit(ns.BoringModel())
    saves = actions.started.count("save_checkpoint")
    assert saves == (2 if core.has_internal(trainer, "save_checkpoint") else 0)
    # What every supported release has: the training fetch and the batch, by these names.
    fetches = [a for a in actions.started if a.endswith("].train_dataloader_next")]
    assert len(fetches) >= 2
    assert actions.started.count("run_training_batch") == 2
