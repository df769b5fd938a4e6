"""The behaviour of ``strategy="ddp_speedpack"``, written once for both Lightning namespaces.

:class:`SpeedpackDDPMixin` holds everything the strategy adds to Lightning's ``DDPStrategy``;
each namespace gets a concrete class (``strategies/pytorch_lightning.py`` and
``strategies/lightning.py``) that puts the mixin in front of its own ``DDPStrategy``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_info

from lightning_speedpack.core.cpu_wait import usable_cores

__all__ = ["SpeedpackDDPMixin", "available_cpu_cores", "cpu_threads_per_rank"]


def available_cpu_cores() -> int:
    """Return the CPU cores this process may run on (its affinity set, else ``os.cpu_count``)."""
    return usable_cores()


def cpu_threads_per_rank(cores: int, local_world_size: int) -> int:
    """Return the intra-op threads each of ``local_world_size`` ranks gets from ``cores`` cores.

    Example:
        >>> cpu_threads_per_rank(16, 4), cpu_threads_per_rank(2, 4)
        (4, 1)
    """
    return max(1, cores // max(1, local_world_size))


class SpeedpackDDPMixin:
    """DistributedDataParallel with the fast settings the guides recommend, as one strategy name.

    The behaviour of every namespace's ``DDPSpeedpackStrategy`` (put the mixin first in the bases).

    Bucket-view gradients, no unused-parameter search, bf16 gradient compression on CUDA, and
    no CPU oversubscription when several ranks share a machine.

    Each choice and its trade-off:

    - ``gradient_as_bucket_view=True``: gradients are views into DDP's communication buckets,
      so DDP neither keeps a second copy of every gradient nor copies into the buckets before
      each all-reduce (less memory, less copying). Trade-off: ``param.grad`` cannot be replaced
      by a new tensor (in-place changes such as clipping work) and ``detach_()`` on a gradient
      fails; code that does ``param.grad = ...`` must use ``strategy="ddp"``.
    - ``find_unused_parameters=False``: no traversal of the autograd graph after every forward
      to find parameters that got no gradient. Trade-off: a model with parameters unused in
      some steps fails with DDP's "Expected to have finished reduction" error; pass
      ``find_unused_parameters=True`` for such models.
    - ``compress_gradients=True`` (CUDA only): PyTorch's ``bf16_compress_hook`` halves the
      bytes every gradient all-reduce sends; gradients are cast to bf16 for communication
      and back. Trade-off: the averaged gradients lose mantissa bits (bf16 keeps fp32's range,
      so no overflow), which slightly changes the numerics; needs NCCL >= 2.10. Opt out with
      ``compress_gradients=False``. A ``ddp_comm_hook`` you pass yourself wins. Lightning
      registers communication hooks on CUDA only, so CPU (gloo) runs are numerically
      identical to ``strategy="ddp"``.
    - ``limit_cpu_threads=True`` (CPU ranks only): each rank sets
      ``torch.set_num_threads(max(1, cores // local_world_size))`` when its environment is set
      up (``cores``: the CPUs the process may run on, its affinity set), so ranks on one
      machine do not each start one thread per core and fight over them; the value it found
      is restored at teardown. Trade-off: a rank cannot borrow the cores of an idle
      neighbour. Skipped when ``OMP_NUM_THREADS`` was set when the strategy was built (your
      or your launcher's choice wins; ``torchrun`` sets it to 1 unless you set it). Note that
      Lightning 2.x's own launchers already apply the same split when ``OMP_NUM_THREADS`` is
      unset (and then set it); this strategy makes the policy explicit, independent of the
      launcher path, and undoes its change at teardown.

    Exercised on the CPU only: the CUDA comm-hook path is covered by checking which hook the
    strategy hands to Lightning, not by a GPU run.

    Args:
        *args: passed to Lightning's ``DDPStrategy``.
        compress_gradients: register the bf16 compression hook on CUDA.
        limit_cpu_threads: share the CPU cores between the ranks of a machine.
        **kwargs: passed to ``DDPStrategy`` (and from there to ``DistributedDataParallel``);
            ``gradient_as_bucket_view`` and ``find_unused_parameters`` may be overridden here.
    """

    # Attributes of Lightning's DDPStrategy the mixin reads (typed for mypy).
    _ddp_kwargs: dict[str, Any]
    _ddp_comm_hook: Callable[..., Any] | None
    root_device: torch.device
    num_processes: int

    def __init__(
        self,
        *args: Any,
        compress_gradients: bool = True,
        limit_cpu_threads: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("gradient_as_bucket_view", True)
        kwargs.setdefault("find_unused_parameters", False)
        if compress_gradients and kwargs.get("ddp_comm_hook") is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                bf16_compress_hook,
            )

            kwargs["ddp_comm_hook"] = bf16_compress_hook
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.compress_gradients = compress_gradients
        self.limit_cpu_threads = limit_cpu_threads
        self._threads_before: int | None = None
        # Lightning's launcher sets OMP_NUM_THREADS later, in launch(); only a value that
        # exists now was chosen by the user or an outside launcher.
        self._omp_preset = "OMP_NUM_THREADS" in os.environ

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments this strategy passes to ``DistributedDataParallel``."""
        return dict(self._ddp_kwargs)

    @property
    def ddp_comm_hook(self) -> Callable[..., Any] | None:
        """The communication hook registered on CUDA (None when there is none)."""
        return self._ddp_comm_hook

    def setup_environment(self) -> None:
        """Share the CPU cores between the ranks of a machine, then set up as DDP does."""
        if self.limit_cpu_threads and self.root_device.type == "cpu" and not self._omp_preset:
            threads = cpu_threads_per_rank(available_cpu_cores(), self.num_processes)
            self._threads_before = torch.get_num_threads()
            if threads != self._threads_before:
                torch.set_num_threads(threads)
                rank_zero_info(f"ddp_speedpack: {threads} CPU thread(s) per rank")
        super().setup_environment()  # type: ignore[misc]

    def teardown(self) -> None:
        """Tear down as DDP does, then restore the thread count found at setup."""
        super().teardown()  # type: ignore[misc]
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register ``"ddp_speedpack"`` and ``"ddp_speedpack_spawn"`` (idempotent).

        A name already registered to this class (or to a reloaded copy of it) is left alone
        or refreshed; a name registered by someone else is not overwritten.
        """
        for name, start_method in (("ddp_speedpack", "popen"), ("ddp_speedpack_spawn", "spawn")):
            existing = dict.get(strategy_registry, name)
            if existing is not None:
                other = existing.get("strategy")
                if other is cls:
                    continue
                if getattr(other, "__qualname__", None) != cls.__qualname__:
                    continue  # someone else's strategy: keep it
            strategy_registry.register(
                name,
                cls,
                description=f"DDP with lightning-speedpack's defaults ({start_method!r} start)",
                override=True,
                start_method=start_method,
            )
