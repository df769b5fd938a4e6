"""The fixes ``SpeedAdvisor(apply=...)`` may apply at fit start, and how each is undone.

``cudnn_benchmark`` is one global switch (the callback sets and restores it) and
``channels_last`` is not undone; ``zero_grad_set_to_none`` wraps the LightningModule's
``optimizer_zero_grad`` for the fit, here.

Example:
    >>> import torch
    >>> from pytorch_lightning.demos.boring_classes import BoringModel
    >>> model = BoringModel()
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> model.layer.weight.grad = torch.ones_like(model.layer.weight)
    >>> zero_grad_set_to_none(model)
    >>> model.optimizer_zero_grad(0, 0, optimizer)
    >>> model.layer.weight.grad is None, "zero_grad" in optimizer.__dict__
    (True, False)
    >>> undo_zero_grad_set_to_none(model)
    >>> "optimizer_zero_grad" in model.__dict__
    False
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["APPLICABLE_FIXES", "undo_zero_grad_set_to_none", "zero_grad_set_to_none"]

APPLICABLE_FIXES = ("cudnn_benchmark", "channels_last", "zero_grad_set_to_none")
"""The fixes ``SpeedAdvisor(apply=...)`` may apply at fit start."""


def zero_grad_set_to_none(pl_module: pl.LightningModule) -> None:
    """Run ``pl_module``'s ``optimizer_zero_grad`` with ``zero_grad(set_to_none=True)``.

    The module's own hook (an override included) still runs; only the optimizer's
    ``zero_grad`` it calls is forced to release the gradients, and put back after each call.
    """
    hook = pl_module.optimizer_zero_grad

    def optimizer_zero_grad(epoch: int, batch_idx: int, optimizer: Any) -> None:
        saved = optimizer.__dict__.get("zero_grad")
        original = optimizer.zero_grad

        def zero_grad(*args: Any, **kwargs: Any) -> None:
            original(set_to_none=True)

        optimizer.zero_grad = zero_grad
        try:
            hook(epoch, batch_idx, optimizer)
        finally:
            if saved is None:
                del optimizer.zero_grad
            else:
                optimizer.zero_grad = saved

    pl_module.__dict__["optimizer_zero_grad"] = optimizer_zero_grad


def undo_zero_grad_set_to_none(pl_module: pl.LightningModule) -> None:
    """Give ``pl_module`` its own ``optimizer_zero_grad`` back."""
    pl_module.__dict__.pop("optimizer_zero_grad", None)
