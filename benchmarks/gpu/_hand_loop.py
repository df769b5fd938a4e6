"""The hand-timed training loop the what_if check holds WhatIf's gains against.

Plain PyTorch, no Lightning and no WhatIf code: a training step (forward, cross-entropy,
backward, SGD with momentum), run in settings (:class:`Arm`: a module, its input, an autocast
dtype, a context for global flags) that alternate round by round in timed regions
(:class:`~benchmarks.gpu._vision.RegionTimer`: CUDA events on a GPU, one
``torch.cuda.synchronize()`` at the end of each region), and the losses of each setting from
the same initial state (the numerics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.gpu._vision import RegionTimer, median

__all__ = ["WARMUP", "Arm", "HandLoop", "cudnn_benchmark_on", "tf32_on"]

WARMUP = 2  # untimed steps before each timed region
MIN_REGION_S = 0.2  # a timed region lasts at least this long


@contextmanager
def cudnn_benchmark_on() -> Iterator[None]:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


@contextmanager
def tf32_on() -> Iterator[None]:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@dataclass
class Arm:
    """One setting of the hand loop: which module runs, on which input, in which mode."""

    name: str
    owner: nn.Module  # whose parameters train (reset for the numerics)
    model: Callable[[torch.Tensor], torch.Tensor]  # what the step calls (owner, or compiled)
    x: torch.Tensor
    lr: float
    amp: torch.dtype | None = None
    flags: Callable[[], AbstractContextManager[Any]] = nullcontext
    opt: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        self.fresh_optimizer()

    def fresh_optimizer(self) -> None:
        self.opt = torch.optim.SGD(self.owner.parameters(), lr=self.lr, momentum=0.9)


class HandLoop:
    """Training steps written out by hand, timed in alternating regions."""

    def __init__(
        self, device: torch.device, lr: float, net: nn.Module, x: torch.Tensor, y: torch.Tensor
    ) -> None:
        self.device, self.lr, self.batch = device, lr, x.shape[0]
        self.net = net.to(self.device)
        self.initial = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        self.x, self.y = x.to(self.device), y.to(self.device)
        self.timer = RegionTimer(self.device)
        self.steps = 0

    def arm(self, name: str, **kwargs: Any) -> Arm:
        kwargs.setdefault("owner", self.net)
        kwargs.setdefault("model", kwargs["owner"])
        kwargs.setdefault("x", self.x)
        return Arm(name, lr=self.lr, **kwargs)

    def step(self, arm: Arm) -> torch.Tensor:
        autocast = (
            torch.autocast(device_type=self.device.type, dtype=arm.amp)
            if arm.amp is not None
            else nullcontext()
        )
        with autocast:
            loss = F.cross_entropy(arm.model(arm.x), self.y)
        loss.backward()  # type: ignore[no-untyped-call]
        arm.opt.step()
        arm.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def rate(self, arm: Arm) -> float:
        """Samples/s of one timed region of ``arm`` (after untimed warm-up steps)."""
        with arm.flags():
            for _ in range(WARMUP):
                self.step(arm)
            seconds = self.timer.time(lambda: self.step(arm), self.steps)
        return self.batch * self.steps / seconds

    def calibrate(self, base: Arm) -> None:
        """Steps per region: enough for ``MIN_REGION_S`` at today's pace (5 to 200)."""
        with base.flags():
            for _ in range(WARMUP):
                self.step(base)
            per_step = self.timer.time(lambda: self.step(base), 3) / 3
        self.steps = max(5, min(200, math.ceil(MIN_REGION_S / max(per_step, 1e-6))))

    def alternate(self, base: Arm, cand: Arm, rounds: int) -> dict[str, Any]:
        """Both arms, ``rounds`` times, the order swapped every round; the gain of each round."""
        before, after = [], []
        for r in range(rounds):
            rates = {}
            for arm in (base, cand) if r % 2 == 0 else (cand, base):
                rates[arm.name] = self.rate(arm)
            before.append(rates[base.name])
            after.append(rates[cand.name])
        gains = [a / b for a, b in zip(after, before, strict=True)]
        return {"before": before, "after": after, "gains": gains, "gain": median(gains)}

    def losses(self, arm: Arm, steps: int) -> list[float]:
        """``steps`` losses of ``arm`` from the initial state (parameters and optimizer)."""
        arm.owner.load_state_dict(self.initial)
        arm.fresh_optimizer()
        with arm.flags():
            found = [self.step(arm) for _ in range(steps)]
        return [float(v) for v in torch.stack(found).float().cpu()]

    def numerics(self, base: Arm, cand: Arm, steps: int) -> float:
        """The largest relative loss difference of ``cand`` against ``base``, step by step."""
        b, c = self.losses(base, steps), self.losses(cand, steps)
        return max(abs(y - x) / max(abs(x), 1e-12) for x, y in zip(b, c, strict=True))
