"""Holds the ``torchvision`` stand-in that the MosaicML jobs of ``tests/test_invisible.py`` import.

This directory goes on ``PYTHONPATH`` of those jobs only (see ``torchvision/__init__.py``). It
is a package, and its ``conftest.py`` keeps pytest's doctest collection out of ``torchvision/``,
so the stub never lands in the test process's ``sys.path`` or ``sys.modules``.
"""
