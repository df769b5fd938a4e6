"""What :class:`~lightning_speedpack.BatchSizeTuner` warns about after it chose a batch size.

A faster batch size can change the optimisation the script was written for. Two cases are
worth a word, whatever the mode:

- :func:`few_steps_caveat`: the chosen size leaves fewer than :data:`MIN_STEPS_PER_EPOCH`
  optimizer steps per epoch (and fewer than the script's size did): per-epoch schedules,
  validation and checkpoints then come every couple of steps.
- :func:`unscaled_lr_caveat`: the chosen size is more than :data:`MAX_UNSCALED_GROWTH` times the
  script's, with ``scale_lr=False``: the learning rate was tuned for the old size.

Each returns a :class:`Caveat` (finding id, message, fix, figures), or ``None`` when there is
nothing to say. The callback prints :attr:`Caveat.text` with ``rank_zero_warn`` as a
:class:`BatchSizeWarning` and reports each caveat as a finding. Nothing here knows about
Lightning.
"""

from __future__ import annotations

from typing import NamedTuple

from lightning_speedpack.batch_size.search import round_down

__all__ = [
    "MAX_UNSCALED_GROWTH",
    "MIN_STEPS_PER_EPOCH",
    "BatchSizeWarning",
    "Caveat",
    "few_steps_caveat",
    "optimizer_steps_per_epoch",
    "unscaled_lr_caveat",
]

#: Fewer optimizer steps per epoch than this is worth a warning.
MIN_STEPS_PER_EPOCH = 10
#: A batch size more than this many times the script's, with the learning rate unchanged, is
#: worth a warning.
MAX_UNSCALED_GROWTH = 4


class BatchSizeWarning(UserWarning):
    """The tuned batch size changes the optimisation the script was written for."""


def optimizer_steps_per_epoch(
    samples: int, batch_size: int, accumulate: int = 1, drop_last: bool = False
) -> int:
    """Return the optimizer steps of one epoch over ``samples`` at ``batch_size``.

    A last partial batch counts unless ``drop_last``; Lightning steps the optimizer after every
    ``accumulate`` batches and after the epoch's last batch.

    Example:
        >>> optimizer_steps_per_epoch(4096, 2048), optimizer_steps_per_epoch(4096, 50)
        (2, 82)
        >>> optimizer_steps_per_epoch(4096, 50, drop_last=True, accumulate=4)
        21
    """
    batches = samples // batch_size if drop_last else -(-samples // batch_size)
    return -(-batches // max(accumulate, 1))


class Caveat(NamedTuple):
    """One caveat: a finding id, what is wrong, what to do, and the figures behind it."""

    id: str
    message: str
    fix: str | None
    figures: dict[str, int]

    @property
    def text(self) -> str:
        """The message and the fix in one sentence, as the warning prints it."""
        return f"{self.message}: {self.fix}" if self.fix else self.message


def few_steps_caveat(
    *,
    chosen: int,
    original: int,
    samples: int,
    multiple_of: int = 8,
    accumulate: int = 1,
    drop_last: bool = False,
    per_rank: bool = False,
    suggest_nearest: bool = False,
    applied: bool = True,
) -> Caveat | None:
    """``batch-size-few-steps``: ``chosen`` leaves fewer than :data:`MIN_STEPS_PER_EPOCH` steps.

    ``None`` when it leaves at least that many, or no fewer than ``original`` (the script's
    size) did: a short epoch the script set up itself is not the tuner's doing.

    Args:
        chosen: the size the tuner chose.
        original: the size the script set.
        samples: the dataset's length (per rank when ``per_rank``).
        multiple_of: the suggested ``max_val`` is a multiple of this.
        accumulate: the Trainer's ``accumulate_grad_batches``.
        drop_last: the train loader drops its last partial batch.
        per_rank: ``samples`` is one rank's share of the dataset.
        suggest_nearest: also suggest ``mode="nearest"``.
        applied: ``False`` for a dry run (the message says "would leave").

    Example:
        >>> print(few_steps_caveat(chosen=2048, original=50, samples=4096).text)
        batch size 2048 leaves 2 optimizer steps per epoch on 4,096 samples (batch size 50 left
        82), so per-epoch learning-rate schedules, validation and checkpoints come every 2
        steps: pass `max_val=408` (10 steps per epoch) if the run should keep more steps
        >>> few_steps_caveat(chosen=32, original=8, samples=4096) is None
        True
    """
    steps = optimizer_steps_per_epoch(samples, chosen, accumulate, drop_last)
    before = optimizer_steps_per_epoch(samples, original, accumulate, drop_last)
    if steps >= MIN_STEPS_PER_EPOCH or steps >= before:
        return None
    where = f"{samples:,} samples" + (" per rank" if per_rank else "")
    if accumulate > 1:
        where += f" with accumulate_grad_batches={accumulate}"
    verb, come = ("leaves", "come") if applied else ("would leave", "would come")
    count, every = (
        (f"{steps} optimizer steps", f"every {steps} steps")
        if steps > 1
        else (
            "1 optimizer step",
            "every step",
        )
    )
    message = (
        f"batch size {chosen} {verb} {count} per epoch on {where} (batch size {original} left "
        f"{before}), so per-epoch learning-rate schedules, validation and checkpoints {come} "
        f"{every}"
    )
    fixes = []
    suggestion = round_down(samples // (MIN_STEPS_PER_EPOCH * max(accumulate, 1)), multiple_of)
    if suggestion >= multiple_of:
        fixes.append(f"`max_val={suggestion}` ({MIN_STEPS_PER_EPOCH} steps per epoch)")
    if suggest_nearest:
        fixes.append('`mode="nearest"` (the multiple of 8 next to the script\'s size)')
    fix = f"pass {' or '.join(fixes)} if the run should keep more steps" if fixes else None
    figures = {"batch_size": chosen, "original_batch_size": original, "samples": samples}
    figures |= {"steps_per_epoch": steps, "original_steps_per_epoch": before}
    return Caveat("batch-size-few-steps", message, fix, figures)


def unscaled_lr_caveat(
    *, chosen: int, original: int, scale_lr: bool, applied: bool = True
) -> Caveat | None:
    """``batch-size-lr-unscaled``: ``chosen`` is over :data:`MAX_UNSCALED_GROWTH` x ``original``.

    ``None`` with ``scale_lr`` (the learning rates were scaled) or a smaller growth.

    Example:
        >>> print(unscaled_lr_caveat(chosen=2048, original=50, scale_lr=False).text)
        batch size 2048 is 41x the batch size 50 the script set, with the learning rate
        unchanged: pass scale_lr=True or set the learning rate for the new size
        >>> unscaled_lr_caveat(chosen=2048, original=50, scale_lr=True) is None
        True
        >>> unscaled_lr_caveat(chosen=32, original=8, scale_lr=False) is None  # 4x exactly
        True
    """
    if scale_lr or chosen <= MAX_UNSCALED_GROWTH * original:
        return None
    ratio = chosen / original
    times = f"{ratio:.0f}" if ratio >= 10 else f"{ratio:.1f}".removesuffix(".0")
    verb = "is" if applied else "would be"
    message = (
        f"batch size {chosen} {verb} {times}x the batch size {original} the script set, with the "
        "learning rate unchanged"
    )
    fix = "pass scale_lr=True or set the learning rate for the new size"
    figures = {"batch_size": chosen, "original_batch_size": original}
    return Caveat("batch-size-lr-unscaled", message, fix, figures)
