"""``torchvision.transforms`` stand-in (see the package docstring)."""
