"""The pack's Lightning callbacks, one public class per module."""

__all__: list[str] = []
