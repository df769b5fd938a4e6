"""WhatIf's measured remedies (issue 24): planted slow loading, the applied fit, in-memory data.

1. **Planted**: a small conv net whose map-style dataset sleeps 3 ms in a deterministic
   ``__getitem__`` (0 workers, batch 32, shuffled, ``train_dataloader`` from the module), fitted
   under ``WhatIf(knobs="auto", apply=False)``: the ``num_workers`` and ``cache`` gains WhatIf
   measured (goals >= 1.6x on 2 cores, >= 5x) and the trials' seconds (goal: within
   ``budget_s``, 60 s by default), median and range over ``--repeats`` fits.
2. **Apply**: the same fit (more batches) with ``WhatIf(apply=True)`` and without WhatIf,
   alternating: the fit's own samples/s, timed by a small callback from the first
   ``on_train_batch_start`` to the last ``on_train_batch_end`` (the trials, which run before,
   are not counted); goal >= 1.6x (ratio of medians). Both fits start from
   ``seed_everything(0)``: the first batch the model sees and the parameters at
   ``on_train_start`` must be bit-identical. Beside it, WhatIf's own ``num_workers`` and
   ``cache`` gains (the fit's, projected with the model's step; and the loader's alone): the
   ``num_workers`` one should match the hand-timed ratio (issue 38: it read 2.9x for a 2.2x
   fit).
3. **In-memory**: the same net on a 4,096-sample ``TensorDataset`` at 0 workers, batch 64,
   under ``WhatIf(knobs=<loader knobs>)`` and ``SpeedAdvisor``: no loader knob should read
   ``apply``, and the advisor should give no ``dataloader-workers`` warning.

    python benchmarks/what_if.py [--quick] [--repeats N] [--only planted,apply,memory]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback, LightningModule, seed_everything
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_table, quiet_trainer

from lightning_speedpack import SpeedAdvisor, WhatIf
from lightning_speedpack.what_if.knobs import LOADER_KNOBS

SLEEP_S = 0.003
GOAL_WORKERS = 1.6
GOAL_CACHE = 5.0
GOAL_APPLY = 1.6
#: The trial budget of figures 1 and 3, given explicitly: WhatIf's default is this or 5% of the
#: fit's projected length, whichever is less (a few seconds for these short fits).
BUDGET_S = 60.0


class SlowDataset(Dataset[Any]):
    """A map-style dataset whose deterministic ``__getitem__`` sleeps ``SLEEP_S`` (a decode)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        time.sleep(SLEEP_S)
        return self.inner[index]


class ConvNet(LightningModule):
    """Two strided convolutions on 3x32x32 images: a step of ~10-20 ms on one loaded core.

    The planted fit reads through :class:`SlowDataset` (shuffled); ``slow=False`` reads the
    ``TensorDataset`` itself, in order.
    """

    def __init__(self, n: int = 2048, batch_size: int = 32, slow: bool = True) -> None:
        super().__init__()
        self.batch_size, self.slow = batch_size, slow
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        if self.slow:
            return DataLoader(SlowDataset(self.data), batch_size=self.batch_size, shuffle=True)
        return DataLoader(self.data, batch_size=self.batch_size)


class FitProbe(Callback):
    """The fit's own samples/s (batch hooks only), its first batch and its initial parameters."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.samples = 0
        self.batch: list[torch.Tensor] | None = None
        self.params: dict[str, torch.Tensor] | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.params = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        if self.first is None:
            self.first = time.perf_counter()
            self.batch = [t.detach().clone() for t in batch]

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
    ) -> None:
        self.samples += len(batch[0])
        self.last = time.perf_counter()

    def rate(self) -> float:
        if self.first is None or self.last is None:
            raise RuntimeError("the fit ran no training batch")
        return self.samples / (self.last - self.first)


def _fit(model: Any, callbacks: list[Any], **trainer_kwargs: Any) -> None:
    trainer = quiet_trainer(limit_val_batches=0, callbacks=callbacks, **trainer_kwargs)
    trainer.fit(model)


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f} to {max(values):.{digits}f}" if values else "n/a"


def _med(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "n/a"


def _met(values: list[float], goal: float, above: bool = True) -> str:
    if not values:
        return "**not measured**"
    median = statistics.median(values)
    ok = median >= goal if above else median <= goal
    return "met" if ok else "**missed**"


def _knob_table(title: str, runs: list[list[Any]]) -> None:
    """One row per knob over every fit: candidates, gains (median, range), verdicts."""
    knobs: dict[str, dict[str, Any]] = {}
    for measurements in runs:
        for m in measurements:
            row = knobs.setdefault(
                m.knob, {"cand": Counter(), "gains": [], "lows": [], "highs": [], "v": Counter()}
            )
            row["cand"][m.candidate or "-"] += 1
            row["v"][m.verdict(1.05, 1e-3)] += 1
            if m.gain is not None:
                row["gains"].append(m.gain)
                row["lows"].append(m.spread[0])
                row["highs"].append(m.spread[1])
    rows = []
    for knob, row in knobs.items():
        rounds = f"{min(row['lows']):.2f} to {max(row['highs']):.2f}" if row["gains"] else "-"
        rows.append(
            [
                knob,
                ", ".join(f"{c} ({n})" for c, n in row["cand"].most_common()),
                _med(row["gains"]),
                _spread(row["gains"]),
                rounds,
                ", ".join(f"{v} ({n})" for v, n in row["v"].most_common()),
            ]
        )
    print_table(
        title,
        [
            "knob",
            "candidate (fits)",
            "gain, median of fits",
            "range of fits",
            "range of rounds",
            "verdicts (fits)",
        ],
        rows,
    )


# ---------------------------------------------------------------------- 1. planted


def planted(repeats: int, batches: int) -> None:
    runs, workers, cache, seconds, notes = [], [], [], [], []
    for r in range(repeats):
        seed_everything(0, verbose=False)
        what_if = WhatIf(knobs="auto", apply=False, budget_s=BUDGET_S, verbose=False)
        _fit(ConvNet(), [what_if], max_epochs=1, limit_train_batches=batches)
        found = {m.knob: m for m in what_if.measurements}
        runs.append(what_if.measurements)
        for knob, into in (("num_workers", workers), ("cache", cache)):
            gain = found[knob].gain if knob in found else None
            if gain is not None:
                into.append(gain)
        if what_if.trial_seconds is not None:
            seconds.append(what_if.trial_seconds)
        nw = found.get("num_workers")
        notes.append(f"num_workers={nw.candidate if nw else '?'}")
        print(
            f"[planted {r + 1}/{repeats}] num_workers {workers[-1:]} cache {cache[-1:]} "
            f"trials {seconds[-1:]} s",
            file=sys.stderr,
            flush=True,
        )
        if r == 0:
            print(what_if.table(), file=sys.stderr, flush=True)
    print_table(
        f"1. Planted: 3 ms `__getitem__`, 0 workers, batch 32, 2 cores; "
        f'`WhatIf(knobs="auto", budget_s={BUDGET_S:g})`, {repeats} fits',
        ["figure", "median of fits", "range of fits", "goal", "verdict"],
        [
            [
                "num_workers gain (candidate: " + ", ".join(sorted(set(notes))) + ")",
                _med(workers),
                _spread(workers),
                f">= {GOAL_WORKERS}x",
                _met(workers, GOAL_WORKERS),
            ],
            [
                "cache gain",
                _med(cache),
                _spread(cache),
                f">= {GOAL_CACHE}x",
                _met(cache, GOAL_CACHE),
            ],
            [
                "trials' seconds",
                _med(seconds, 1),
                _spread(seconds, 1),
                f"<= budget_s ({BUDGET_S:g} s)",
                _met(seconds, BUDGET_S, False),
            ],
        ],
    )
    _knob_table("1. Every knob of the planted fits", runs)


# ---------------------------------------------------------------------- 2. apply


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def apply(repeats: int, batches: int) -> dict[str, float]:
    """Print figure 2's tables; return the hand-timed ratio and WhatIf's own gains (medians)."""
    rates: dict[str, list[float]] = {"without WhatIf": [], "WhatIf(apply=True)": []}
    probes: dict[str, list[FitProbe]] = {name: [] for name in rates}
    applied, trials, measured = [], [], Counter()
    gains: dict[str, list[float]] = {"num_workers": [], "cache": []}
    alone: dict[str, list[float]] = {"num_workers": [], "cache": []}  # the loader's own ratio
    names = list(rates)
    for r in range(repeats):
        for name in names[r % 2 :] + names[: r % 2]:
            seed_everything(0, verbose=False)
            probe = FitProbe()
            callbacks: list[Any] = [probe]
            what_if = None
            if name != "without WhatIf":
                what_if = WhatIf(apply=True, budget_s=BUDGET_S, verbose=False)
                callbacks.insert(0, what_if)
            _fit(ConvNet(), callbacks, max_epochs=1, limit_train_batches=batches)
            rates[name].append(probe.rate())
            probes[name].append(probe)
            if what_if is not None:
                applied.append(dict(what_if.applied.settings))
                trials.append(what_if.trial_seconds or 0.0)
                for m in what_if.measurements:
                    measured[f"{m.knob}: {m.verdict(1.05, 1e-3)}"] += 1
                    if m.knob in gains and m.gain is not None:
                        gains[m.knob].append(m.gain)
                    if m.knob in alone and m.ceiling_gain is not None:
                        alone[m.knob].append(m.ceiling_gain)
            print(
                f"[apply {r + 1}/{repeats}] {name}: {rates[name][-1]:.0f} samples/s",
                file=sys.stderr,
                flush=True,
            )
    base, with_ = rates["without WhatIf"], rates["WhatIf(apply=True)"]
    ratio = statistics.median(with_) / statistics.median(base)
    paired = [a / b for a, b in zip(with_, base, strict=True)]
    ref = probes["without WhatIf"][0]
    batch_same = all(_same(p.batch, ref.batch) for ps in probes.values() for p in ps)
    params_same = all(_same(p.params, ref.params) for ps in probes.values() for p in ps)
    settings = Counter(
        ", ".join(f"{k}={v}" for k, v in sorted(s.items())) or "(nothing)" for s in applied
    )
    print_table(
        f"2. Apply: the planted fit, {batches} batches, {repeats} alternating rounds; "
        "samples/s of the fit's own batches (trials not counted)",
        ["variant", "samples/s, median", "range"],
        [[name, _med(v, 0), _spread(v, 0)] for name, v in rates.items()],
    )
    print_table(
        "2. Apply: the figures",
        ["figure", "value", "goal", "verdict"],
        [
            [
                "ratio of medians",
                f"{ratio:.2f}",
                f">= {GOAL_APPLY}x",
                "met" if ratio >= GOAL_APPLY else "**missed**",
            ],
            [
                "paired ratios (median, range)",
                f"{statistics.median(paired):.2f} ({_spread(paired)})",
                "-",
                "-",
            ],
            *[
                [
                    f"WhatIf's {knob} gain, the fit's (median, range of fits)",
                    f"{_med(gains[knob])} ({_spread(gains[knob])})",
                    "-",
                    "-",
                ]
                for knob in gains
            ],
            *[
                [
                    f"WhatIf's {knob}: the loader alone (median, range of fits)",
                    f"{_med(alone[knob])} ({_spread(alone[knob])})",
                    "-",
                    "-",
                ]
                for knob in alone
            ],
            [
                "WhatIf's num_workers gain / the ratio of medians",
                f"{statistics.median(gains['num_workers']) / ratio:.3f}"
                if gains["num_workers"]
                else "n/a",
                "1.0",
                "-",
            ],
            ["applied (fits)", "; ".join(f"{s} ({n})" for s, n in settings.items()), "-", "-"],
            [
                "trials' seconds (not in the rate)",
                f"{_med(trials, 1)} ({_spread(trials, 1)})",
                "-",
                "-",
            ],
            [
                "knob: verdict (fits), budget_s=60",
                "; ".join(f"{k} ({n})" for k, n in measured.items()),
                "-",
                "-",
            ],
            [
                "first batch bit-identical (all fits)",
                "yes" if batch_same else "no",
                "yes",
                "met" if batch_same else "**missed**",
            ],
            [
                "parameters at on_train_start bit-identical (all fits)",
                "yes" if params_same else "no",
                "yes",
                "met" if params_same else "**missed**",
            ],
        ],
    )
    print(f"\nbit-identical: {'yes' if batch_same and params_same else 'no'}")
    out = {"hand_timed": ratio, "bit_identical": float(batch_same and params_same)}
    out.update({f"{k}_gain": statistics.median(v) for k, v in gains.items() if v})
    out.update({f"{k}_loader_gain": statistics.median(v) for k, v in alone.items() if v})
    return out


def quick_figures() -> dict[str, float]:
    """``benchmarks/bench_check.py``'s figures: figure 2 in 3 rounds of 40 batches.

    ``measured_over_hand_timed`` is WhatIf's own ``num_workers`` gain (its trials) over the gain
    the applied fit then showed (timed by hand): how far WhatIf's promise is from what it gave,
    as a factor >= 1 whichever way it is off.
    """
    _quiet()
    torch.set_num_threads(1)
    out = apply(3, batches=40)
    if "num_workers_gain" in out:
        factor = out["num_workers_gain"] / out["hand_timed"]
        out["measured_over_hand_timed"] = max(factor, 1 / factor)
    return out


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


# ---------------------------------------------------------------------- 3. in memory


def memory(repeats: int, batches: int) -> None:
    runs, warned, advisor_ids, applied = [], [], Counter(), 0
    for r in range(repeats):
        seed_everything(0, verbose=False)
        what_if = WhatIf(knobs=list(LOADER_KNOBS), budget_s=BUDGET_S, verbose=False)
        advisor = SpeedAdvisor(verbose=False)
        model = ConvNet(n=4096, batch_size=64, slow=False)
        _fit(model, [what_if, advisor], max_epochs=2, limit_train_batches=batches)
        runs.append(what_if.measurements)
        applied += any(m.verdict(1.05, 1e-3) == "apply" for m in what_if.measurements)
        workers = [
            f for f in advisor.findings if f.id == "dataloader-workers" and f.severity == "warning"
        ]
        warned.append(bool(workers))
        for f in advisor.findings:
            advisor_ids[f"{f.severity}: {f.id}"] += 1
        print(
            f"[memory {r + 1}/{repeats}] "
            + ", ".join(f"{m.knob} {m.verdict(1.05, 1e-3)} {m.gain}" for m in what_if.measurements)
            + f"; advisor {[(f.severity, f.id) for f in advisor.findings]}",
            file=sys.stderr,
            flush=True,
        )
    _knob_table(
        f"3. In-memory: TensorDataset 4,096 x 3x32x32, 0 workers, batch 64; "
        f"`WhatIf(knobs=<loader knobs>, budget_s={BUDGET_S:g})`, {repeats} fits",
        runs,
    )
    print_table(
        "3. In-memory: the figures",
        ["figure", "value", "goal", "verdict"],
        [
            [
                "fits with a loader knob read `apply`",
                f"{applied} of {repeats}",
                "0",
                "met" if applied == 0 else "**missed**",
            ],
            [
                "fits with a `dataloader-workers` warning (SpeedAdvisor)",
                f"{sum(warned)} of {repeats}",
                "0",
                "met" if not any(warned) else "**missed**",
            ],
            [
                "SpeedAdvisor's findings (fits)",
                "; ".join(f"{k} ({n})" for k, n in advisor_ids.most_common()) or "none",
                "-",
                "-",
            ],
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="fits per figure (5)")
    parser.add_argument("--quick", action="store_true", help="2 repeats, shorter fits")
    parser.add_argument("--only", default="planted,apply,memory")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1)")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    only = set(args.only.split(","))
    _quiet()
    # Two intra-op threads on two loaded cores spin against each other (a step 10x slower than
    # on one); one thread leaves the other core to the loading workers, as the guides advise.
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s)")
    if "planted" in only:
        planted(repeats, batches=2)
    if "apply" in only:
        apply(repeats, batches=20 if args.quick else 40)
    if "memory" in only:
        memory(repeats, batches=16 if args.quick else 32)
    print(f"\n({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
