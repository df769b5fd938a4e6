"""Out-of-memory errors: recognising one (any device, any library) and giving the memory back."""

from __future__ import annotations

import gc

import torch

__all__ = ["OOM_MESSAGES", "free_memory", "is_oom_error"]

#: Messages of out-of-memory errors raised as a plain ``RuntimeError`` (older PyTorch, cuDNN,
#: cuBLAS and the CPU allocator); ``torch.OutOfMemoryError`` is recognised by its type.
OOM_MESSAGES: tuple[str, ...] = (
    "CUDA out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input",
    "CUBLAS_STATUS_ALLOC_FAILED",
)


def is_oom_error(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory error: by type first, then by the known messages.

    Example:
        >>> is_oom_error(torch.OutOfMemoryError("CUDA out of memory"))
        True
        >>> is_oom_error(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
        True
        >>> is_oom_error(ValueError("CUDA out of memory"))
        False
    """
    if isinstance(error, torch.OutOfMemoryError):  # torch.cuda.OutOfMemoryError is the same class
        return True
    if not isinstance(error, RuntimeError):
        return False
    message = str(error)
    return any(known in message for known in OOM_MESSAGES)


def free_memory() -> None:
    """Collect garbage and return cached device memory to the driver (after an OOM only)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()
