"""``strategy="ddp_speedpack"`` against plain ``strategy="ddp"`` on 2 CPU ranks (gloo).

Each fit runs in its own fresh pair of rank processes (started the way a cluster launcher
would: ``MASTER_ADDR``/``RANK``/... in the environment), the two strategies alternate round
by round, and the table reports the median wall time of the training steps after a warm-up,
measured inside rank 0 (process start, imports and setup excluded), and the ratio
ddp / ddp_speedpack (> 1: ddp_speedpack is faster). Goal: not slower. On the CPU the bf16
compression hook is not used (Lightning registers comm hooks on CUDA only), so what differs is
``gradient_as_bucket_view`` and the thread policy.

    .venv/bin/python benchmarks/strategies.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _common import SmallCNN, TinyMLP, alternate, print_table

WARMUP = 5  # steps excluded from the timing (first-iteration costs, DDP bucket rebuild)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, strategy: str, model_name: str, steps: int, out: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        LOCAL_WORLD_SIZE="2",
    )
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning").setLevel(logging.ERROR)
    from pytorch_lightning import Callback, Trainer, seed_everything

    import lightning_speedpack  # noqa: F401  (registers "ddp_speedpack")

    class StepClock(Callback):
        """Seconds from the start of batch ``WARMUP`` to the end of training (steady state)."""

        start = 0.0
        seconds = 0.0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
            if trainer.global_step == WARMUP:
                self.start = time.perf_counter()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.seconds = time.perf_counter() - self.start

    seed_everything(0, verbose=False)
    model = SmallCNN(n=4096) if model_name == "SmallCNN" else TinyMLP(n=8192)
    clock = StepClock()
    trainer = Trainer(
        callbacks=[clock],
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    out.put((rank, clock.seconds))


def fit_two_ranks(strategy: str, model_name: str, steps: int) -> float:
    """Run one fit on 2 fresh rank processes; return rank 0's seconds after the warm-up steps."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank, args=(r, port, strategy, model_name, steps, out)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    results: dict[int, float] = {}
    deadline = time.monotonic() + 600
    try:
        while len(results) < 2:
            try:
                rank, seconds = out.get(timeout=1.0)
                results[rank] = seconds
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a rank of {strategy!r} failed") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{strategy!r} did not finish in 600 s") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (< 60 s)")
    args = parser.parse_args()
    repeats = 3 if args.quick else 5
    cases = [("SmallCNN", 30)] if args.quick else [("SmallCNN", 105), ("TinyMLP", 305)]
    rows = []
    for model_name, steps in cases:
        medians = alternate(
            {
                name: (lambda name=name, m=model_name, n=steps: fit_two_ranks(name, m, n))
                for name in ("ddp", "ddp_speedpack")
            },
            repeats=repeats,
        )
        rows.append(
            (
                model_name,
                steps - WARMUP,
                medians["ddp"],
                medians["ddp_speedpack"],
                medians["ddp"] / medians["ddp_speedpack"],
            )
        )
    print_table(
        f"ddp_speedpack vs ddp, 2 CPU ranks (gloo), medians of {repeats} alternating runs",
        ["model", "timed steps", "ddp s", "ddp_speedpack s", "ratio ddp / ddp_speedpack"],
        rows,
    )
    print(f"\n{os.cpu_count()} CPU(s); shared machines make single timings noisy: read the ratio.")


if __name__ == "__main__":
    main()
