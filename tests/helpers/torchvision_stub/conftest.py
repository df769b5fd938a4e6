"""Keep pytest (``--doctest-modules``) from importing the stub: it is for the MosaicML jobs only."""

collect_ignore = ["torchvision"]
