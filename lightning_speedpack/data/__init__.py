"""Dataset wrappers."""

__all__: list[str] = []
