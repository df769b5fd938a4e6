"""GPU check ``what_if``: WhatIf's GPU knobs, each against the same change timed by hand.

Seed 001's setting: a torchvision ResNet-18 (the ResNet-18-like stand-in of ``_vision.py``
when torchvision fails to import, said in every figure) training on one synthetic 224x224
batch of 128 on CUDA, SGD with momentum. :class:`~lightning_speedpack.WhatIf` runs in a real
``pl.Trainer`` (``accelerator="gpu", devices=1``) and measures ``channels_last``,
``precision`` (``bf16-mixed``; on CUDA it also tries ``16-mixed`` and keeps the better),
``cudnn_benchmark``, ``tf32`` and ``compile`` on the fit's own step, 5 rounds each. Beside it,
this module times the same changes with its own training loop (no Lightning, no WhatIf code):
today's setting and the candidate alternate for 5 rounds, each region timed by CUDA events
with one ``torch.cuda.synchronize()`` at its end, and the gain is the median of the rounds'
ratios. A line passes when WhatIf's gain is within 10% of the hand-timed one. A ``bf16-mixed``
gain under 1.2x is explained in the figure (cuDNN runs the fp32 baseline's convolutions in
TF32 already when ``torch.backends.cudnn.allow_tf32`` is on, PyTorch's default). The
numerics line holds WhatIf's largest relative loss difference against the one this loop
measures over as many steps from the same initial state.

``compile`` runs last, in a child process of its own with what is left of the check's budget
(compiling ResNet-18's forward and backward can take a minute): if it does not finish, its
line says so and the other lines stand.

Exercised on the CPU only (``--dry``: a toy ResNet-like CNN, 32x32 batches of 8, 3 rounds,
one intra-op thread):
WhatIf and the hand loop for ``channels_last`` and ``bf16-mixed`` (their timings reported,
not held to the bound on a shared CPU) and the numerics line; ``cudnn_benchmark`` and
``tf32`` are SKIP with WhatIf's own reason (they need CUDA), ``compile`` is SKIP (tens of
seconds of compiling on a CPU). The compile child ran on the CPU by hand only (the toy CNN,
WhatIf's trial and the hand-timed compile, its JSON, the kill of its process group when it
overruns), never in ``--dry``. Never run before the first GPU: the CUDA events, the
``16-mixed`` path, the cuDNN/TF32 flags, torchvision's ResNet-18 and compiling it with Triton.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.gpu._hand_loop import Arm, HandLoop, cudnn_benchmark_on, tf32_on
from benchmarks.gpu._vision import build_net, deadline, median, run_group
from benchmarks.gpu.context import Context, result

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "what_if"
TIMEOUT_S = {"gpu": 130.0, "dry": 90.0}

REPO = Path(__file__).resolve().parents[2]
#: The check stops starting work past this many seconds, or 15 s before the timeout the runner
#: gave it when it says (``GPU_CHECK_TIMEOUT_S``; it kills the check at TIMEOUT_S otherwise).
DEADLINE_S = {"gpu": 115.0, "dry": 75.0}
#: WhatIf's gain must be within this share of the hand-timed gain.
WITHIN = 0.10
#: WhatIf's default numerics tolerance: the verdict's input the numerics line compares against.
TOLERANCE = 1e-3
CHEAP_KNOBS = ("channels_last", "precision", "cudnn_benchmark", "tf32")
GPU_ONLY_KNOBS = ("cudnn_benchmark", "tf32", "compile")
BF16_EXPECTED = 1.2


@dataclass(frozen=True)
class Plan:
    """Sizes and rounds of one run of the check."""

    device: str
    dry: bool
    size: int
    batch: int
    classes: int
    rounds: int
    budget_s: float  # WhatIf's budget for the four cheap knobs
    lr: float = 0.01

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def cuda(self) -> bool:
        return self.torch_device.type == "cuda"


def plan_for(ctx: Context) -> Plan:
    if ctx.dry:
        return Plan("cpu", True, size=32, batch=8, classes=16, rounds=3, budget_s=30.0)
    return Plan(ctx.device, False, size=224, batch=128, classes=1000, rounds=5, budget_s=70.0)


def synthetic_batch(plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(plan.batch, 3, plan.size, plan.size, generator=g)
    y = torch.randint(0, plan.classes, (plan.batch,), generator=g)
    return x, y


def _quiet() -> None:
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*set_float32_matmul_precision.*")


# ---------------------------------------------------------------- WhatIf's side


def _lit_net(plan: Plan, net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    import pytorch_lightning as pl

    class LitNet(pl.LightningModule):
        """The user's module: ``training_step`` calls ``self(x)``, so compiling forward counts."""

        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.net(inputs)  # type: ignore[no-any-return]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, labels = batch
            return F.cross_entropy(self(inputs), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=plan.lr, momentum=0.9)

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(TensorDataset(x, y), batch_size=plan.batch, pin_memory=plan.cuda)

    return LitNet()


def what_if_measurements(plan: Plan, knobs: Sequence[str], budget_s: float) -> dict[str, Any]:
    """WhatIf's measurement of each knob, from a real one-step fit on ``plan.device``."""
    import pytorch_lightning as pl

    from lightning_speedpack import WhatIf

    _quiet()
    net, _ = build_net(plan.dry, plan.classes)
    x, y = synthetic_batch(plan)
    what_if = WhatIf(knobs=list(knobs), rounds=plan.rounds, budget_s=budget_s, verbose=False)
    trainer = pl.Trainer(
        accelerator="gpu" if plan.cuda else "cpu",
        devices=1,
        max_steps=1,
        benchmark=False,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[what_if],
    )
    trainer.fit(_lit_net(plan, net, x, y))
    found = {m.knob: m for m in what_if.measurements}
    del trainer, net
    if plan.cuda:
        torch.cuda.empty_cache()
    return found


def measurement_dict(m: Any) -> dict[str, Any]:
    """A WhatIf Measurement as plain data (it crosses a process boundary as JSON)."""
    return {
        "candidate": m.candidate,
        "status": m.status,
        "reason": m.reason,
        "before": list(m.before),
        "after": list(m.after),
        "gains": list(m.gains),
        "gain": m.gain,
        "numerics": m.numerics,
        "extra": {k: v for k, v in m.extra.items() if isinstance(v, (int, float, str, type(None)))},
    }


# ---------------------------------------------------------------- the hand-timed loop


def whatif_steps(m: dict[str, Any], batch: int) -> int:
    """How many steps WhatIf's numerics spanned: its warm-up step plus the calibrated steps.

    WhatIf times at least 0.25 s a trial, 10 to 200 steps, from its first baseline's pace
    (``trial_base.calibrated``); the baseline's median rate gives that pace again here.
    """
    rate = median(m["before"]) if m["before"] else 0.0
    if not rate or math.isnan(rate):
        return 11
    per_step = batch / rate
    return 1 + max(10, min(200, math.ceil(0.25 / per_step)))


def hand_timings(
    plan: Plan, knobs: Sequence[str], fp16: bool, steps_for: dict[str, int]
) -> dict[str, Any]:
    """The hand loop's gain and numerics for each knob (bf16 always; fp16 when asked)."""
    net, _ = build_net(plan.dry, plan.classes)
    x, y = synthetic_batch(plan)
    loop = HandLoop(plan.torch_device, plan.lr, net, x, y)
    torch.backends.cudnn.benchmark = False  # today's setting, as in the fit
    base = loop.arm("base")
    loop.calibrate(base)
    arms: dict[str, Arm] = {}
    if "channels_last" in knobs:
        owner = build_net(plan.dry, plan.classes)[0].to(loop.device)
        owner.load_state_dict(loop.initial)
        owner = owner.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        arms["channels_last"] = loop.arm(
            "channels_last", owner=owner, x=loop.x.contiguous(memory_format=torch.channels_last)
        )
    if "precision" in knobs:
        arms["precision"] = loop.arm("bf16-mixed", amp=torch.bfloat16)
        if fp16:
            arms["precision/16-mixed"] = loop.arm("16-mixed", amp=torch.float16)
    if "cudnn_benchmark" in knobs:
        arms["cudnn_benchmark"] = loop.arm("cudnn_benchmark", flags=cudnn_benchmark_on)
    if "tf32" in knobs:
        arms["tf32"] = loop.arm("tf32", flags=tf32_on)
    out: dict[str, Any] = {"steps_per_region": loop.steps}
    for key, arm in arms.items():
        timing = loop.alternate(base, arm, plan.rounds)
        timing["numerics"] = loop.numerics(base, arm, steps_for.get(key.split("/")[0], 11))
        out[key] = timing
    return out


# ---------------------------------------------------------------- compile, in a child process


class _Wrap(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)  # type: ignore[no-any-return]


def compile_child(ctx: Context, out_path: Path, budget_s: float, plan: Plan | None = None) -> None:
    """WhatIf's ``compile`` and the hand-timed compile; writes JSON after each part."""
    start = time.monotonic()
    plan = plan or plan_for(ctx)
    record: dict[str, Any] = {"started": time.time()}

    def save() -> None:  # atomically: the parent may kill this process at any time
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, out_path)

    save()
    whatif_budget = max(10.0, budget_s - 40.0)  # the hand-timed compile needs the rest
    t = time.monotonic()
    found = what_if_measurements(plan, ["compile"], whatif_budget)
    record["what_if"] = measurement_dict(found["compile"])
    record["what_if_s"] = time.monotonic() - t
    save()
    left = budget_s - (time.monotonic() - start)
    if left < 25.0:
        record["hand_error"] = f"not run: {left:.0f} s of the compile budget left"
        save()
        return
    net, _ = build_net(plan.dry, plan.classes)
    x, y = synthetic_batch(plan)
    loop = HandLoop(plan.torch_device, plan.lr, net, x, y)
    torch.backends.cudnn.benchmark = False
    base = loop.arm("eager")
    loop.calibrate(base)
    try:
        # Wrapped as WhatIf's LitNet wraps it (``self.net``), so the traced graph's names match
        # and the inductor caches the trial filled can serve this compile too.
        compiled = torch.compile(_Wrap(loop.net))
        arm = loop.arm("compiled", model=compiled)
        t = time.perf_counter()
        loop.step(arm)
        loop.timer.sync()
        record["hand_first_step_s"] = time.perf_counter() - t
        timing = loop.alternate(base, arm, plan.rounds)
        steps = whatif_steps(record["what_if"], plan.batch)
        timing["numerics"] = loop.numerics(base, arm, steps)
        record["hand"] = timing
        record["steps_per_region"] = loop.steps
    except Exception as err:  # a machine that cannot compile (no C compiler, no Triton)
        record["hand_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
    save()


def run_compile_child(ctx: Context, budget_s: float) -> dict[str, Any]:
    """Run :func:`compile_child` in its own process group; kill the group past ``budget_s``."""
    out_path = ctx.out_dir / "what_if_compile.json"
    out_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.gpu.check_what_if",
        "--compile-child",
        ctx.to_json(),
        str(out_path),
        f"{budget_s - 10.0:.1f}",  # its own clock starts after its imports
    ]
    start = time.monotonic()
    code, output, timed_out = run_group(cmd, budget_s, env, REPO)
    record: dict[str, Any] = {}
    if out_path.exists():
        try:
            record = json.loads(out_path.read_text())
        except json.JSONDecodeError:
            record = {}
    record["seconds"] = time.monotonic() - start
    record["timed_out"] = timed_out
    record["returncode"] = code
    if code != 0 and not timed_out:
        record["output_tail"] = (output or "")[-1500:]
    return record


# ---------------------------------------------------------------- the lines


def _spread(gains: Sequence[float]) -> str:
    return f"{min(gains):.2f}-{max(gains):.2f}" if gains else "-"


def _compare_line(
    knob: str,
    plan: Plan,
    model: str,
    wi: dict[str, Any],
    hand: dict[str, Any] | None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    bound = f"WhatIf's gain within {WITHIN:.0%} of the hand-timed gain"
    gain, hg = wi["gain"], (hand or {}).get("gain")
    timer = "CUDA events" if plan.cuda else "wall clock (CPU)"
    parts = [
        f"{model}: WhatIf {wi['candidate']} {gain:.3f}x ({_spread(wi['gains'])}, "
        f"{len(wi['gains'])} rounds; {median(wi['before']):,.0f} -> {median(wi['after']):,.0f} "
        "samples/s)"
    ]
    ratio = None
    if hg:
        ratio = gain / hg
        parts.append(
            f"hand-timed {hg:.3f}x ({_spread(hand['gains'])}, {len(hand['gains'])} rounds, "
            f"{timer}; {median(hand['before']):,.0f} -> {median(hand['after']):,.0f} samples/s)"
        )
        parts.append(f"ratio {ratio:.3f}")
    parts.extend(notes)
    figure = "; ".join(parts)
    data = {"what_if": wi, "hand": hand, "ratio": ratio}
    if ratio is None:
        return result(f"what_if/{knob}", "FAIL", figure + "; no hand-timed gain", bound, **data)
    if plan.dry:
        why = "dry: timings on a shared CPU are reported, not held to the bound (the GPU run is)"
        return result(f"what_if/{knob}", "SKIP", f"{figure}; {why}", bound, **data)
    status = "PASS" if abs(ratio - 1.0) <= WITHIN else "FAIL"
    return result(f"what_if/{knob}", status, figure, bound, **data)


def _not_measured_line(knob: str, plan: Plan, wi: dict[str, Any] | None) -> dict[str, Any]:
    bound = f"WhatIf's gain within {WITHIN:.0%} of the hand-timed gain"
    said = f"WhatIf: {wi['status']}: {wi['reason']}" if wi else "WhatIf returned no row"
    if plan.dry and knob in GPU_ONLY_KNOBS:
        return result(f"what_if/{knob}", "SKIP", f"dry (CPU): {said}", bound + " (CUDA only)")
    return result(f"what_if/{knob}", "FAIL", f"not measured on {plan.device}: {said}", bound)


def _bf16_note(wi: dict[str, Any], hand: dict[str, Any] | None, allow_tf32: bool) -> str | None:
    bf16 = (hand or {}).get("gain")
    if wi.get("candidate") == "bf16-mixed":
        bf16 = min(x for x in (wi["gain"], bf16) if x is not None)
    if bf16 is None or bf16 >= BF16_EXPECTED:
        return None
    if allow_tf32:
        return (
            f"bf16-mixed under {BF16_EXPECTED}x: the fp32 baseline's convolutions run in TF32 on "
            "tensor cores already (torch.backends.cudnn.allow_tf32=True, PyTorch's default), so "
            "bf16 saves mostly memory traffic"
        )
    return (
        f"bf16-mixed under {BF16_EXPECTED}x although torch.backends.cudnn.allow_tf32=False "
        "(the fp32 baseline does not use TF32): unexplained"
    )


def _numerics_line(rows: list[tuple[str, float | None, float | None]]) -> dict[str, Any]:
    bound = (
        f"per knob: WhatIf's and the hand loop's largest relative loss difference on the same "
        f"side of WhatIf's tolerance {TOLERANCE:g}, or within 10x of each other"
    )
    parts, ok, compared = [], True, 0
    for knob, wi, hand in rows:
        if wi is None or hand is None:
            parts.append(f"{knob}: WhatIf {wi}, hand {hand} (not compared)")
            continue
        compared += 1
        same_side = (wi > TOLERANCE) == (hand > TOLERANCE)
        close = max(wi, hand) <= 10 * max(min(wi, hand), 1e-9)
        ok = ok and (same_side or close)
        parts.append(f"{knob}: WhatIf {wi:.2e} vs hand {hand:.2e}")
    status = "PASS" if ok and compared else "FAIL"
    figure = "; ".join(parts) if parts else "nothing measured"
    return result("what_if/numerics", status, figure, bound, rows=rows)


def run(ctx: Context) -> list[dict[str, Any]]:
    """WhatIf's five GPU knobs against the hand loop (see the module's docstring)."""
    start = time.monotonic()
    plan = plan_for(ctx)
    if plan.dry:
        torch.set_num_threads(1)  # a shared 2-core machine: spinning intra-op threads stall
    end = deadline(start, DEADLINE_S["dry" if ctx.dry else "gpu"], margin_s=15.0)
    allow_tf32 = bool(torch.backends.cudnn.allow_tf32)
    _, model = build_net(plan.dry, plan.classes)
    model = f"{model}, {plan.size}x{plan.size} batches of {plan.batch}"

    found = what_if_measurements(plan, CHEAP_KNOBS, plan.budget_s)
    wi = {k: measurement_dict(m) for k, m in found.items()}
    measured = [k for k in CHEAP_KNOBS if k in wi and wi[k]["status"] is None]
    fp16 = (wi.get("precision") or {}).get("candidate") == "16-mixed"
    steps_for = {k: whatif_steps(wi[k], plan.batch) for k in measured}
    hand = hand_timings(plan, measured, fp16, steps_for) if measured else {}
    if plan.cuda:
        torch.cuda.empty_cache()  # the compile child gets the device's memory
    whatif_s = time.monotonic() - start

    lines = []
    numerics: list[tuple[str, float | None, float | None]] = []
    for knob in CHEAP_KNOBS:
        row = wi.get(knob)
        if knob not in measured or row is None:
            lines.append(_not_measured_line(knob, plan, row))
            continue
        notes: list[str] = []
        mine = hand.get(knob)
        if knob == "precision":
            if fp16:
                notes.append(
                    "WhatIf kept 16-mixed over bf16-mixed; hand-timed bf16-mixed "
                    f"{mine['gain']:.3f}x"
                )
                mine = hand.get("precision/16-mixed")
            note = None if plan.dry else _bf16_note(row, hand.get("precision"), allow_tf32)
            if note:
                notes.append(note)
        if knob == "tf32" and allow_tf32 and not plan.dry:
            notes.append(
                "today's convolutions are TF32 already (cudnn.allow_tf32=True by default): the "
                "knob changes the matmuls (the final Linear)"
            )
        lines.append(_compare_line(knob, plan, model, row, mine, notes))
        numerics.append((knob, row["numerics"], (mine or {}).get("numerics")))

    if ctx.dry:
        lines.append(
            result(
                "what_if/compile",
                "SKIP",
                "dry (CPU): not run; compiling takes tens of seconds on a CPU (WhatIf leaves it "
                "out of 'auto' there too)",
                f"WhatIf's gain within {WITHIN:.0%} of the hand-timed gain (GPU only)",
            )
        )
    else:
        left = end - time.monotonic()
        lines.append(_compile_line(ctx, plan, model, left, numerics))
    lines.append(_numerics_line(numerics))
    for line in lines:
        line["data"]["cheap_knobs_s"] = round(whatif_s, 1)
    return lines


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _compile_line(
    ctx: Context,
    plan: Plan,
    model: str,
    left: float,
    numerics: list[tuple[str, float | None, float | None]],
) -> dict[str, Any]:
    bound = f"WhatIf's gain within {WITHIN:.0%} of the hand-timed gain"
    if left < 40.0:
        return result(
            "what_if/compile", "SKIP", f"not run: {left:.0f} s left of the check's budget", bound
        )
    rec = run_compile_child(ctx, left)
    wi, hand = rec.get("what_if"), rec.get("hand")
    took = f"child process {rec['seconds']:.0f} s"
    if wi is None:
        if rec["timed_out"]:
            what = f"WhatIf's compile trial did not finish within {left:.0f} s ({took})"
        else:
            what = (
                f"the compile child exited with code {rec['returncode']} before WhatIf's "
                f"trial ended ({took}): {_last_line(rec.get('output_tail', ''))}"
            )
        tail = rec.get("output_tail", "")
        return result(
            "what_if/compile",
            "SKIP" if rec["timed_out"] else "FAIL",
            what,
            bound,
            **{k: v for k, v in rec.items() if k != "output_tail"},
            output_tail=tail,
        )
    if wi["status"] is not None:
        said = f"WhatIf: {wi['status']}: {wi['reason']}"
        if rec.get("hand_error"):
            return result(
                "what_if/compile",
                "SKIP",
                f"torch.compile cannot run here: {said}; the hand loop: {rec['hand_error']}",
                bound,
                **rec,
            )
        return result("what_if/compile", "FAIL", f"{said}; the hand loop compiled", bound, **rec)
    if hand is None:  # the budget ran out before (or during) the hand-timed compile
        why = rec.get("hand_error") or f"did not finish within {left:.0f} s"
        return result(
            "what_if/compile",
            "SKIP",
            f"WhatIf {wi['candidate']} {wi['gain']:.3f}x ({len(wi['gains'])} rounds); the "
            f"hand-timed compile: {why} ({took})",
            bound,
            **rec,
        )
    notes = [took]
    extra = wi["extra"]
    if "compile_s" in extra:
        even = extra.get("break_even_steps")
        notes.append(
            f"WhatIf: compile {extra['compile_s']:.1f} s apart, "
            + (f"pays off after {even:,} steps" if even else "never pays off here")
        )
    if "hand_first_step_s" in rec:
        notes.append(f"hand: first compiled step {rec['hand_first_step_s']:.1f} s")
    if rec.get("hand_error"):
        notes.append(f"hand loop: {rec['hand_error']}")
    numerics.append(("compile", wi["numerics"], (hand or {}).get("numerics")))
    line = _compare_line("compile", plan, model, wi, hand, notes)
    line["data"]["child"] = {k: v for k, v in rec.items() if k not in ("what_if", "hand")}
    return line


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--compile-child":
        compile_child(Context.from_json(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]))
    else:
        raise SystemExit(
            "usage: python -m benchmarks.gpu.check_what_if --compile-child CTX_JSON OUT BUDGET_S"
        )
