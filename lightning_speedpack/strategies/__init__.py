"""Training strategies."""

__all__: list[str] = []
