"""A Lightning logger that keeps what it is given, for tests that read what was logged."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.loggers import Logger

__all__ = ["MemoryLogger"]


class MemoryLogger(Logger):
    """Keeps every ``log_metrics`` call: (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def values(self, key: str) -> list[float]:
        return [m[key] for _, m in self.rows if key in m]
