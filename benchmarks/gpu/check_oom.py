"""GPU check ``oom``: BatchSizeTuner against a model that really runs out of GPU memory.

:class:`Hungry`'s ``training_step`` allocates 64 MiB of scratch per sample on the GPU
(``torch.empty``, one plain allocation proportional to the batch), so a batch above a size set by
the device's free memory raises a real ``torch.cuda.OutOfMemoryError`` from the caching
allocator. Before the tuner runs (a callback placed before it, in ``on_fit_start``) the check
finds that size by hand: the largest number ``M`` of 64 MiB samples one ``torch.empty`` can
hold, by bisection, nothing of Lightning or the pack involved. The model's optimizer (SGD with
momentum) took one step on the GPU before the fit, so it has state to put back, and cuBLAS has
its workspaces. ``BatchSizeTuner(mode="max", steps_per_trial=2)`` then searches, and a callback
placed after it looks at what it left.

- ``oom/largest-fit``: the largest size the tuner found to fit is a multiple of 8, at most ``M``
  and at least ``floor8(M) - 8`` (the step's own small allocations may cost one multiple); every
  larger size it tried failed.
- ``oom/chosen``: the size chosen (the largest fit less the 5% margin, a multiple of 8) is the
  size the fit then trained with, and it trained.
- ``oom/state``: parameters and the optimizer's state (momentum buffers) bit-identical after the
  search to before it.
- ``oom/memory``: ``torch.cuda.memory_allocated()`` after the search equals its value before,
  both taken with torch's cuBLAS workspaces freed (a per-handle cache torch allocates the first
  time a kind of matmul runs: the first GPU run saw exactly 64 MiB more after the search, with
  no tensor of the pack's alive on a CPU reproduction). The allocator's history runs during the
  search: any block still allocated after it is listed in the data with its Python stack.

Dry (CPU, what ran before the first GPU): the pack's injected path, as ``tests/batch_size``
inject it: the step raises ``torch.OutOfMemoryError`` above 100 samples (``M = 100``), no
scratch; the same assertions, ``oom/memory`` SKIP (no CUDA).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.gpu.context import Context, result
from benchmarks.gpu.helpers import fmt, trainer

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "oom"
TIMEOUT_S = {"gpu": 45.0, "dry": 60.0}

PER_SAMPLE = 64 * 2**20  # bytes of scratch per sample on the GPU
DRY_LIMIT = 100  # dry: the injected OOM above this many samples
MAX_VAL = 8192


class Hungry(pl.LightningModule):
    """A small linear model whose step needs ``per_sample`` bytes of device memory per sample."""

    def __init__(self, per_sample: int, limit: int | None, length: int) -> None:
        super().__init__()
        self.batch_size = 8
        self.per_sample = per_sample
        self.limit = limit
        self.layer = nn.Linear(32, 1)
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(length, 32, generator=g))
        self.started = False
        self.fit_sizes: list[int] = []
        self.optimizer: torch.optim.Optimizer | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        size = int(x.shape[0])
        if self.started:
            self.fit_sizes.append(size)
        if self.limit is not None and size > self.limit:
            raise torch.OutOfMemoryError(f"CPU out of memory (injected above {self.limit})")
        scratch = None
        if self.per_sample:
            scratch = torch.empty(size * self.per_sample, dtype=torch.uint8, device=x.device)
        loss = self.layer(x).square().mean()
        del scratch
        return loss

    def on_train_start(self) -> None:
        self.started = True

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.batch_size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            self.optimizer = torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        return self.optimizer


def largest_allocation(per_sample: int, high: int = MAX_VAL) -> int:
    """The largest ``b`` for which ``torch.empty(b * per_sample)`` succeeds on the GPU now."""

    def fits(b: int) -> bool:
        try:
            block = torch.empty(b * per_sample, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            return False
        del block
        return True

    low = 0  # fits (trivially)
    if fits(high):
        return high
    while high - low > 1:  # low fits, high does not
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    torch.cuda.empty_cache()
    return low


def _host_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(v) for v in value)
    return value


def _differences(before: Any, after: Any, path: str = "") -> list[str]:
    if isinstance(before, torch.Tensor) or isinstance(after, torch.Tensor):
        same = (
            isinstance(before, torch.Tensor)
            and isinstance(after, torch.Tensor)
            and before.dtype == after.dtype
            and before.shape == after.shape
            and torch.equal(before, after)
        )
        return [] if same else [path or "tensor"]
    if isinstance(before, dict) and isinstance(after, dict):
        if before.keys() != after.keys():
            return [f"{path} keys {sorted(map(str, before))} -> {sorted(map(str, after))}"]
        return [d for k in before for d in _differences(before[k], after[k], f"{path}/{k}")]
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        if len(before) != len(after):
            return [f"{path} length {len(before)} -> {len(after)}"]
        return [
            d
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for d in _differences(b, a, f"{path}/{i}")
        ]
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"]


class Snapshot(pl.Callback):
    """In ``on_fit_start``: the parameters, the optimizer's state and the allocated memory.

    ``find_limit``: also find the largest allocation by hand first (the one placed before the
    tuner).
    """

    def __init__(self, cuda: bool, find_limit: bool) -> None:
        self.cuda = cuda
        self.find_limit = find_limit
        self.limit: int | None = None
        self.state: dict[str, Any] = {}
        self.allocated: int | None = None
        self.raw_allocated: int | None = None
        self.survivors: list[dict[str, Any]] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.cuda:
            if self.find_limit:
                self.limit = largest_allocation(PER_SAMPLE)
            else:
                self.survivors = _survivors()  # the blocks the search allocated, still alive
            torch.cuda.synchronize()
            self.raw_allocated = torch.cuda.memory_allocated()
            _clear_cublas_workspaces()
            self.allocated = torch.cuda.memory_allocated()
            if self.find_limit:
                _record_history(True)
        self.state = {
            "parameters": {n: _host_copy(p) for n, p in pl_module.named_parameters()},
            "optimizer": _host_copy(trainer.optimizers[0].state_dict()),
        }


def _clear_cublas_workspaces() -> None:
    """Free torch's cuBLAS/cuBLASLt workspaces (a per-handle cache, tens of MiB on Hopper).

    They are allocated through the caching allocator the first time a handle and stream meet a
    kind of matmul, so a search whose steps hit one the priming step did not would count as a
    leak: both measurements are taken without them.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _record_history(on: bool) -> None:
    """The caching allocator's history (Python stacks of each allocation), if torch has it."""
    try:
        if on:
            torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:  # an older torch, or no history support: the line just has no stacks
        pass


def _survivors(most: int = 8) -> list[dict[str, Any]]:
    """Blocks allocated since the history started and still allocated: size and stack."""
    try:
        snapshot = torch.cuda.memory._snapshot()
    except Exception as err:
        return [{"error": f"{type(err).__name__}: {err}"}]
    finally:
        _record_history(False)
    found: list[dict[str, Any]] = []
    for segment in snapshot.get("segments", []):
        for block in segment.get("blocks", []):
            frames = block.get("frames") or []
            if block.get("state") != "active_allocated" or not frames:
                continue
            found.append(
                {
                    "bytes": block.get("requested_size") or block.get("size"),
                    "stack": [
                        f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}"
                        for f in frames[:12]
                    ],
                }
            )
    return sorted(found, key=lambda b: -int(b.get("bytes") or 0))[:most]


def _prime(model: Hungry, device: str) -> None:
    """One optimizer step by hand: momentum buffers to restore, cuBLAS workspaces allocated."""
    model.to(device)
    optimizer = model.configure_optimizers()
    x = model.data.tensors[0][:8].to(device)
    model.layer(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def run(ctx: Context) -> list[dict[str, Any]]:
    from lightning_speedpack import BatchSizeTuner, BatchSizeWarning

    cuda = not ctx.dry
    model = Hungry(
        per_sample=PER_SAMPLE if cuda else 0,
        limit=None if cuda else DRY_LIMIT,
        length=32768 if cuda else 1024,
    )
    _prime(model, ctx.device)
    before = Snapshot(cuda, find_limit=cuda)
    after = Snapshot(cuda, find_limit=False)
    tuner = BatchSizeTuner(mode="max", steps_per_trial=2, max_val=MAX_VAL, verbose=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BatchSizeWarning)  # "few steps", "lr unscaled": advice
        trainer(ctx, max_steps=1, callbacks=[before, tuner, after]).fit(model)
    limit = before.limit if cuda else DRY_LIMIT
    trials = [(t.batch_size, t.fits) for t in tuner.trials]
    fitting = [size for size, fits in trials if fits]
    largest = max(fitting, default=0)
    lines: list[dict[str, Any]] = []
    unit = "64 MiB samples by hand" if cuda else "samples (the injected limit)"

    # -- the largest size that fit, against the hand-found limit
    problems = []
    if limit is None:
        problems.append("no limit found by hand")
    else:
        if largest % 8 or not (limit // 8 * 8 - 8 <= largest <= limit):
            problems.append(f"largest fit {largest} outside [{limit // 8 * 8 - 8}, {limit}]")
        wrong = [size for size, fits in trials if fits and size > limit]
        wrong += [size for size, fits in trials if not fits and size <= largest]
        if wrong:
            problems.append(f"trials {wrong} disagree with the limit")
    failed = sorted(size for size, fits in trials if not fits)
    lines.append(
        result(
            "oom/largest-fit",
            "FAIL" if problems else "PASS",
            f"largest fit {largest} vs {limit} {unit}; smallest failing trial "
            f"{failed[0] if failed else '-'}; {len(trials)} trials"
            + ("; " + "; ".join(problems) if problems else ""),
            "multiple of 8 in [floor8(M) - 8, M]",
            trials=trials,
            hand_limit=limit,
            per_sample_bytes=PER_SAMPLE if cuda else 0,
        )
    )

    # -- the chosen size trained
    chosen = tuner.batch_size
    ok = (
        chosen is not None
        and chosen % 8 == 0
        and chosen <= largest
        and model.fit_sizes == [chosen]
        and model.batch_size == chosen
    )
    lines.append(
        result(
            "oom/chosen",
            "PASS" if ok else "FAIL",
            f"chose {chosen} (largest fit {largest} less the 5% margin); the fit trained on "
            f"batches of {model.fit_sizes}",
            "a multiple of 8 <= the largest fit, trained without OOM",
            chosen=chosen,
            fit_sizes=model.fit_sizes,
        )
    )

    # -- state and memory put back
    diffs = _differences(before.state, after.state)
    tensors = len(before.state["parameters"]) + len(before.state["optimizer"].get("state", {}))
    lines.append(
        result(
            "oom/state",
            "FAIL" if diffs else "PASS",
            f"{len(before.state['parameters'])} parameters and the optimizer's state "
            f"({len(before.state['optimizer'].get('state', {}))} momentum entries) "
            + ("bit-identical after the search" if not diffs else f"changed: {diffs[:6]}"),
            "bit-identical",
            tensors=tensors,
            differences=diffs,
        )
    )
    if cuda:
        lines.append(
            result(
                "oom/memory",
                "PASS" if before.allocated == after.allocated else "FAIL",
                f"memory_allocated {fmt(before.allocated)} B before the search, "
                f"{fmt(after.allocated)} B after (cuBLAS workspaces freed before each; "
                f"{fmt(before.raw_allocated)} and {fmt(after.raw_allocated)} B with them)"
                + (
                    f"; {len(after.survivors)} block(s) the search left, largest "
                    f"{fmt(after.survivors[0].get('bytes'))} B"
                    if after.survivors
                    else ""
                ),
                "equal, less torch's cuBLAS workspaces",
                before=before.allocated,
                after=after.allocated,
                raw_before=before.raw_allocated,
                raw_after=after.raw_allocated,
                survivors=after.survivors,
            )
        )
    else:
        lines.append(result("oom/memory", "SKIP", "no CUDA: no device memory to count", "equal"))
    return lines
