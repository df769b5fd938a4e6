"""GPU check ``doctor``: ``speedpack doctor`` on seed 001's slow GPU job and on the job fixed.

``jobs/doctor_job.py`` trains ResNet-18 (torchvision; the ResNet-18-like stand-in of
``_vision.py`` when torchvision fails to import, said in the figures) on 224x224 JPEG files
written once by this check, in two pipelines: ``slow`` (decode in ``__getitem__``,
``num_workers=0``, fp32) and ``fixed`` (``CachedDataset`` filled before the fit, 4 persistent
workers, ``pin_memory=True``, ``bf16-mixed``, ``channels_last``, cuDNN autotuning). Each runs
as ``python -m lightning_speedpack doctor --json ... --html ... JOB ...`` in a process of its
own, the HTML pages written into this check's output folder. The lines:

- ``doctor/slow-verdict``: the report's findings call the slow run data-bound (``data-bound``
  at warning or error, first among the data findings) with a fix that names ``CachedDataset``
  or ``num_workers``; held against this check's own ceilings, measured aside: JPEG decoding in
  one process against the model's step on a batch in memory (CUDA events).
- ``doctor/fixed-clean``: the fixed run's report has no warning or error finding; beside it,
  the fixed run's samples/s (the job's own clock) against the model's ceiling measured aside.
- ``doctor/speed-up``: fixed over slow samples/s, by the doctor's ``runs[].samples_per_sec``
  and by the jobs' own clocks (``trainer.fit``'s seconds, synchronised); both must be >= 2x.
- ``doctor/overhead``: the fixed job, in one process of its own (``doctor_job.py --pairs``),
  fitted plain and under the doctor's default set in alternating rounds (5 on a GPU, fewer epochs
  than above, each fit with its own Trainer and DataLoader): the ratio of the medians of
  ``trainer.fit``'s seconds as the job timed them, <= 1.05x; the median of the rounds' paired
  ratios beside it. The rounds done when the check's time runs out are what it judges.
- ``doctor/html``: each page holds every finding of its JSON report (``data-finding-id``).

Exercised on the CPU only (``--dry``: a toy ResNet-like CNN on 32x32 images decoded from
320x240 JPEGs, batches of 32, fp32 in both pipelines and 0 workers in the fixed one; one
plain run of the fixed job; one round of the overhead's pairs): every line but the overhead's
bound, which is SKIP there (one pair of toy fits on a shared CPU cannot hold 5%), and the GPU-only
parts of the fixed pipeline
(bf16, channels_last, pinned memory, workers) never ran.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu._vision import (
    JpegFiles,
    RegionTimer,
    build_net,
    deadline,
    median,
    run_group,
    to_float,
    write_jpegs,
)
from benchmarks.gpu.context import Context, emit, result

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "doctor"
TIMEOUT_S = {"gpu": 130.0, "dry": 150.0}

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "jobs" / "doctor_job.py"
#: No new job process starts past this many seconds, or 20 s before the timeout the runner gave
#: the check when it says (``GPU_CHECK_TIMEOUT_S``; it kills the check at TIMEOUT_S otherwise).
DEADLINE_S = {"gpu": 115.0, "dry": 130.0}
OVERHEAD_BOUND = 1.05
SPEEDUP_BOUND = 2.0
WARNINGS = ("warning", "error")
DATA_FINDINGS = ("data-bound", "model-bound", "dataloader-workers", "data-wait")


@dataclass(frozen=True)
class Plan:
    """Sizes of one run of the check."""

    device: str
    dry: bool
    files: int
    width: int
    height: int
    size: int
    batch: int
    classes: int
    slow_epochs: int
    fixed_epochs: int
    fixed_repeat: int
    workers: int
    pairs: int  # plain/doctor rounds of the fixed job in one process, for the overhead
    pair_epochs: int  # the fixed job's epochs in each of those fits

    def job_args(
        self, pipeline: str, data_dir: Path, result_path: Path, pairs: int = 0
    ) -> list[str]:
        fixed = pipeline == "fixed"
        epochs = self.pair_epochs if pairs else self.fixed_epochs if fixed else self.slow_epochs
        return [
            "--pairs",
            str(pairs),
            "--pipeline",
            pipeline,
            "--accelerator",
            "gpu" if self.device.startswith("cuda") else "cpu",
            "--data-dir",
            str(data_dir),
            "--size",
            str(self.size),
            "--batch",
            str(self.batch),
            "--classes",
            str(self.classes),
            "--epochs",
            str(epochs),
            "--repeat",
            str(self.fixed_repeat if fixed else 1),
            "--workers",
            str(self.workers),
            "--result",
            str(result_path),
        ]


def plan_for(ctx: Context) -> Plan:
    if ctx.dry:
        # 8 epochs over the cache: a fit of a few seconds, so the callbacks' fixed per-fit cost
        # is no `callback-time` warning (at 2 epochs, 0.6 s, LossRetentionDetector's once reached
        # 7% of the fit on the loaded CI machine).
        return Plan("cpu", True, 256, 320, 240, 32, 32, 16, 2, 8, 2, 0, 1, 2)
    # The fixed job caches the 1024 files once (uint8, ~150 MB; ~2 s of decoding) and trains 16
    # epochs over the cache: ~15 s a process on an H200, start included. Its overhead rounds
    # train 6 epochs a fit (~2 s at the 3,200 samples/s of 2026-11-27, workers started anew).
    return Plan(ctx.device, False, 1024, 320, 240, 224, 128, 1000, 2, 16, 1, 4, 5, 6)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def run_job(
    plan: Plan,
    pipeline: str,
    data_dir: Path,
    out: Path,
    tag: str,
    doctor: bool,
    html: bool,
    timeout: float,
    pairs: int = 0,
) -> dict[str, Any]:
    """One job process, plain or under the doctor: its own clock, and the doctor's report.

    With ``pairs``, the job (plain) measures the doctor's cost itself: ``own["pairs"]``.
    """
    result_path = out / f"{tag}.result.json"
    json_path, html_path = out / f"{tag}.json", out / f"{tag}.html"
    for p in (result_path, json_path, html_path):
        p.unlink(missing_ok=True)
    job = [str(JOB), *plan.job_args(pipeline, data_dir, result_path, pairs)]
    if doctor:
        cmd = [sys.executable, "-m", "lightning_speedpack", "doctor", "--quiet"]
        cmd += ["--json", str(json_path)] + (["--html", str(html_path)] if html else [])
        cmd += [*job]
    else:
        cmd = [sys.executable, *job]
    start = time.perf_counter()
    code, output, timed_out = run_group(cmd, timeout, _env(), REPO)
    if timed_out:
        output = f"timed out after {timeout:.0f} s (process group killed); {output}"
    found: dict[str, Any] = {
        "tag": tag,
        "doctor": doctor,
        "process_s": time.perf_counter() - start,
        "returncode": code,
    }
    if result_path.exists():
        found["own"] = json.loads(result_path.read_text())
    if doctor and json_path.exists():
        found["report"] = json.loads(json_path.read_text())
        found["json"] = str(json_path)
    if html and html_path.exists():
        found["html"] = str(html_path)
    if code != 0 or "own" not in found:
        found["output_tail"] = output[-2000:]
    return found


# ---------------------------------------------------------------- ceilings measured aside


def ceilings(plan: Plan, files: list[Path]) -> dict[str, Any]:
    """Decoding in one process, and the model's step on a batch in memory, in both settings.

    The independent figures the doctor's verdicts are held against: samples/s of
    ``JpegFiles`` (decode + resize, one process), and of the training step of the slow
    (fp32) and fixed (bf16, channels_last, cuDNN autotuning on a GPU) jobs on one batch
    already on the device, timed by CUDA events on a GPU.
    """
    dataset = JpegFiles(files, plan.size)
    n = min(len(dataset), 2 * plan.batch)
    start = time.perf_counter()
    batch = [dataset[i] for i in range(n)]
    decode_rate = n / (time.perf_counter() - start)
    device = torch.device(plan.device)
    pixels = torch.stack([p for p, _ in batch[: plan.batch]]).to(device)
    labels = torch.tensor([label for _, label in batch[: plan.batch]], device=device)
    timer = RegionTimer(device)
    out = {"decode_samples_per_sec": decode_rate}
    for name, fast in (("slow", False), ("fixed", not plan.dry)):
        net = build_net(plan.dry, plan.classes)[0].to(device)
        if fast:
            net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        torch.backends.cudnn.benchmark = fast

        def step(net: Any = net, opt: Any = opt, fast: bool = fast) -> None:
            x = to_float(pixels)
            if fast:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast):
                loss = torch.nn.functional.cross_entropy(net(x), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(3):
            step()
        steps = 10
        seconds = timer.time(step, steps)
        out[f"{name}_model_samples_per_sec"] = plan.batch * steps / seconds
        del net, opt
    torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- the lines


def _cut(text: str, most: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``most`` characters."""
    text = " ".join(str(text).split())
    if len(text) <= most:
        return text
    return text[:most].rsplit(" ", 1)[0] + " ..."


def _warnings(report: dict[str, Any]) -> list[str]:
    return [f"{f['component']}/{f['id']}" for f in report["findings"] if f["severity"] in WARNINGS]


def _verdict_line(slow: dict[str, Any], aside: dict[str, Any], model: str) -> dict[str, Any]:
    bound = (
        "data-bound (warning or error) first among the data findings, its fix names "
        "CachedDataset or num_workers; the ceilings measured aside agree (decode < model)"
    )
    report = slow.get("report")
    if report is None:
        return result("doctor/slow-verdict", "FAIL", _no_report(slow), bound, run=slow)
    findings = report["findings"]
    data = [f for f in findings if f["id"] in DATA_FINDINGS]
    bound_finding = next((f for f in findings if f["id"] == "data-bound"), None)
    figures = report["runs"][-1]["figures"] if report["runs"] else {}
    decode = aside["decode_samples_per_sec"]
    model_rate = aside["slow_model_samples_per_sec"]
    aside_data_bound = decode < model_rate
    fix = (bound_finding or {}).get("fix") or ""
    ok = (
        bound_finding is not None
        and bound_finding["severity"] in WARNINGS
        and bool(data)
        and data[0]["id"] == "data-bound"
        and ("CachedDataset" in fix or "num_workers" in fix)
        and aside_data_bound
    )
    verdict = str(figures.get("verdict") or (bound_finding or {}).get("message") or "none")
    figure = (
        f"{model}, slow job: doctor: {_cut(verdict, 300)}; fix: {_cut(fix, 240) or '-'}; "
        "measured aside: "
        f"decoding {decode:,.0f} samples/s in one process vs the fp32 step "
        f"{model_rate:,.0f} samples/s ({model_rate / decode:.1f}x)"
    )
    return result(
        "doctor/slow-verdict",
        "PASS" if ok else "FAIL",
        figure,
        bound,
        severity=(bound_finding or {}).get("severity"),
        data_findings=[f["id"] for f in data],
        warnings=_warnings(report),
        aside=aside,
        run={k: v for k, v in slow.items() if k != "report"},
    )


def _clean_line(fixed: dict[str, Any], aside: dict[str, Any]) -> dict[str, Any]:
    bound = "no finding at warning or error"
    report = fixed.get("report")
    if report is None:
        return result("doctor/fixed-clean", "FAIL", _no_report(fixed), bound, run=fixed)
    warned = _warnings(report)
    figures = report["runs"][-1]["figures"] if report["runs"] else {}
    own = fixed.get("own", {})
    model_rate = aside["fixed_model_samples_per_sec"]
    rate = own.get("samples_per_sec")
    figure = (
        f"fixed job: {len(warned)} warnings"
        + (f" ({', '.join(warned)})" if warned else "")
        + f"; doctor's verdict: {_cut(figures.get('verdict') or '-', 240)}"
        + (
            f"; the job's own clock {rate:,.0f} samples/s = {rate / model_rate:.2f}x the step's "
            f"ceiling measured aside ({model_rate:,.0f})"
            if rate
            else ""
        )
        + f"; {own.get('workers')} workers, cache in {own.get('storage')}, {own.get('precision')}"
    )
    return result(
        "doctor/fixed-clean",
        "PASS" if not warned else "FAIL",
        figure,
        bound,
        warnings=warned,
        findings=[(f["component"], f["id"], f["severity"]) for f in report["findings"]],
        aside=aside,
        run={k: v for k, v in fixed.items() if k != "report"},
    )


def _speedup_line(slow: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    bound = f">= {SPEEDUP_BOUND:g}x by the doctor's samples/s and by the jobs' own clocks"
    reports = slow.get("report"), fixed.get("report")
    owns = slow.get("own"), fixed.get("own")
    if None in reports or None in owns:
        return result("doctor/speed-up", "FAIL", "a run gave no report or no result", bound)
    doc = [r["runs"][-1]["samples_per_sec"] for r in reports]  # type: ignore[index]
    own = [o["samples_per_sec"] for o in owns]  # type: ignore[index]
    doctor_x, own_x = doc[1] / doc[0], own[1] / own[0]
    figure = (
        f"fixed over slow: {doctor_x:.1f}x by the doctor ({doc[1]:,.0f} vs {doc[0]:,.0f} "
        f"samples/s), {own_x:.1f}x by the jobs' own clocks ({own[1]:,.0f} vs {own[0]:,.0f})"
    )
    ok = doctor_x >= SPEEDUP_BOUND and own_x >= SPEEDUP_BOUND
    return result(
        "doctor/speed-up",
        "PASS" if ok else "FAIL",
        figure,
        bound,
        doctor=doc,
        own=own,
        ratio=doctor_x,
        own_ratio=own_x,
    )


def _overhead_line(plan: Plan, plain: list[float], doctor: list[float]) -> dict[str, Any]:
    bound = (
        f"<= {OVERHEAD_BOUND:g}x: median trainer.fit seconds under the doctor over plain "
        "(the job's own clock), alternating rounds in one process"
    )
    if not plain or not doctor:
        return result(
            "doctor/overhead", "FAIL", "no complete round", bound, plain=plain, doctor=doctor
        )
    ratio = median(doctor) / median(plain)
    paired = median([d / p for p, d in zip(plain, doctor, strict=True)])
    figure = (
        f"fixed job ({plan.pair_epochs} epochs a fit): {ratio:.3f}x ({median(doctor):.2f} s "
        f"under the doctor vs {median(plain):.2f} s plain, medians of {len(plain)} alternating "
        f"rounds; paired {paired:.3f}x)"
    )
    if len(plain) < plan.pairs:
        figure += f" (only {len(plain)} of {plan.pairs} rounds within the check's time)"
    if plan.dry:
        why = "dry: measured, not judged; one round of toy fits on a shared CPU cannot hold 5%"
        return result(
            "doctor/overhead", "SKIP", f"{why}: {figure}", bound, plain=plain, doctor=doctor
        )
    status = "PASS" if ratio <= OVERHEAD_BOUND else "FAIL"
    return result("doctor/overhead", status, figure, bound, plain=plain, doctor=doctor)


def _html_line(runs: list[dict[str, Any]]) -> dict[str, Any]:
    bound = "each page holds every finding of its JSON report (data-finding-id)"
    parts, ok, pages = [], True, 0
    for r in runs:
        report = r.get("report")
        if "html" not in r or report is None:
            ok = False
            parts.append(f"{r['tag']}: no page")
            continue
        pages += 1
        text = Path(r["html"]).read_text(errors="replace")
        ids = {f"{f['component']}/{f['id']}" for f in report["findings"]}
        missing = sorted(i for i in ids if f'data-finding-id="{i}"' not in text)
        ok = ok and not missing
        parts.append(
            f"{Path(r['html']).name} {len(text) / 1024:.0f} KiB, {len(ids) - len(missing)} of "
            f"{len(ids)} finding ids" + (f" (missing {', '.join(missing)})" if missing else "")
        )
    return result("doctor/html", "PASS" if ok and pages else "FAIL", "; ".join(parts), bound)


def _no_report(run: dict[str, Any]) -> str:
    tail = (run.get("output_tail") or "").strip().splitlines()[-3:]
    return f"{run['tag']}: no doctor report (exit {run.get('returncode')}): " + " | ".join(tail)


def run(ctx: Context) -> list[dict[str, Any]]:
    """The doctor on the slow and the fixed job (see the module's docstring).

    Each line is handed to the runner (``emit``) as soon as it is known, so a timeout keeps
    them; the overhead's rounds get the time left before the deadline, and the rounds done when
    it runs out are what the line judges.
    """
    start = time.monotonic()
    plan = plan_for(ctx)
    if plan.dry:
        torch.set_num_threads(1)  # a shared 2-core machine: spinning intra-op threads stall
    end = deadline(start, DEADLINE_S["dry" if plan.dry else "gpu"], margin_s=20.0)
    out = ctx.out_dir
    tmp = Path(tempfile.mkdtemp(prefix="speedpack-gpu-doctor-"))
    lines: list[dict[str, Any]] = []

    def done(line: dict[str, Any]) -> None:
        line["data"]["check_s"] = round(time.monotonic() - start, 1)
        lines.append(emit(line))

    try:
        files = write_jpegs(tmp / "jpegs", plan.files, plan.width, plan.height, plan.classes)
        aside = ceilings(plan, files)
        _, model = build_net(plan.dry, plan.classes)

        def job(pipeline: str, tag: str, doctor: bool, html: bool) -> dict[str, Any]:
            left = max(10.0, end - time.monotonic() + 15.0)
            return run_job(plan, pipeline, tmp / "jpegs", out, tag, doctor, html, left)

        slow = job("slow", "slow", doctor=True, html=True)
        done(_verdict_line(slow, aside, model))
        fixed = job("fixed", "fixed", doctor=True, html=True)
        done(_clean_line(fixed, aside))
        done(_speedup_line(slow, fixed))
        done(_html_line([slow, fixed]))
        left = max(10.0, end - time.monotonic() + 15.0)
        rounds = run_job(plan, "fixed", tmp / "jpegs", out, "pairs", False, False, left, plan.pairs)
        pairs = (rounds.get("own") or {}).get("pairs") or {}
        plain, doctor = pairs.get("plain", []), pairs.get("doctor", [])
        done(_overhead_line(plan, plain[: len(doctor)], doctor[: len(plain)]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lines
