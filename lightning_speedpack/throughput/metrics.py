"""The keys ThroughputLogger logs and the whole-run figures it gives the doctor.

Plain functions from :class:`~lightning_speedpack.throughput.rates.WindowRates` to the
``{key: value}`` dictionaries that reach the loggers, so the table of keys in
``ThroughputLogger``'s docstring has one place in the code.
"""

from __future__ import annotations

from typing import Any

from lightning_speedpack.throughput.rates import WindowRates, mfu

__all__ = ["KEYS", "metric_keys", "run_figures", "throughput_metrics"]

#: Logged keys after the prefix, in the order :func:`metric_keys` returns them.
KEYS: tuple[str, ...] = (
    "samples_per_sec",
    "batches_per_sec",
    "device/samples_per_sec",
    "step_time_ms",
    "data_wait_ms",
    "data_wait_fraction",
    "samples",
    "batches",
    "items_per_sec",
    "flops_per_sec",
    "mfu",
)


def metric_keys(prefix: str) -> tuple[str, ...]:
    """The full keys, built once per fit rather than on every log.

    Example:
        >>> metric_keys("throughput/")[:2]
        ('throughput/samples_per_sec', 'throughput/batches_per_sec')
    """
    return tuple(f"{prefix}{key}" for key in KEYS)


def throughput_metrics(
    keys: tuple[str, ...],
    world: WindowRates,
    samples: float,
    batches: float,
    devices: int,
    items: bool = False,
    flops: bool = False,
    peak_flops_per_device: float | None = None,
) -> dict[str, float]:
    """The logged throughput keys of one window (``keys`` from :func:`metric_keys`).

    ``samples`` and ``batches`` are the run's totals; ``items``/``flops``: whether items and
    FLOPs are counted (their keys are logged only then; ``mfu`` only with a known peak).

    Example:
        >>> world = WindowRates(64.0, 2.0, 0.0, 0.0, 500.0, 200.0, 0.4)
        >>> m = throughput_metrics(metric_keys("t/"), world, 128.0, 4.0, devices=2)
        >>> m["t/device/samples_per_sec"], m["t/data_wait_fraction"], "t/mfu" in m
        (32.0, 0.4, False)
    """
    metrics: dict[str, float] = {
        keys[0]: world.samples_per_sec,
        keys[1]: world.batches_per_sec,
        keys[2]: world.samples_per_sec / devices,
        keys[3]: world.step_time_ms,
        keys[4]: world.data_wait_ms,
        keys[5]: world.data_wait_fraction,
        keys[6]: samples,
        keys[7]: batches,
    }
    if items:
        metrics[keys[8]] = world.items_per_sec
    if flops and world.flops_per_sec > 0:
        metrics[keys[9]] = world.flops_per_sec
        utilisation = mfu(world.flops_per_sec, peak_flops_per_device, devices)
        if utilisation is not None:
            metrics[keys[10]] = utilisation
    return metrics


def run_figures(
    world: WindowRates, peak_flops_per_device: float | None, devices: int
) -> dict[str, Any]:
    """The doctor's whole-run figures: samples/s, data-wait fraction, step time (FLOP/s, MFU).

    Example:
        >>> run_figures(WindowRates(64.0, 2.0, 0.0, 0.0, 500.0, 200.0, 0.4), None, 1)
        {'samples_per_sec': 64.0, 'data_wait_fraction': 0.4, 'step_time_ms': 500.0}
    """
    figures: dict[str, Any] = {
        "samples_per_sec": world.samples_per_sec,
        "data_wait_fraction": world.data_wait_fraction,
        "step_time_ms": world.step_time_ms,
    }
    if world.flops_per_sec > 0:
        figures["flops_per_sec"] = world.flops_per_sec
        utilisation = mfu(world.flops_per_sec, peak_flops_per_device, devices)
        if utilisation is not None:
            figures["mfu"] = utilisation
    return figures
