"""A stand-in for torchvision, only so that ``import streaming`` works in the tests' jobs.

MosaicML ``streaming`` imports torchvision at module level (``streaming/vision/base.py`` needs
``torchvision.datasets.VisionDataset`` and ``torchvision.transforms.functional.to_tensor``), but
torchvision cannot be installed next to this machine's CPU torch. ``tests/test_invisible.py``
puts the directory holding this package on ``PYTHONPATH`` of the MosaicML jobs only; nothing
here is ever called: the jobs use ``streaming.StreamingDataset``, not its vision datasets.

Only ``streaming`` may import it. Anything else -- torchmetrics, imported with Lightning, asks
``lightning_utilities.module_available("torchvision")`` and then imports ``torchvision.models``
and ``torchvision.ops`` -- gets an ``ImportError``, so to them torchvision stays not installed.
"""

import sys

if "streaming.vision.base" not in sys.modules:  # inserted before its imports run
    raise ImportError(
        "torchvision is not installed; this stub (tests/helpers/torchvision_stub) only serves "
        "`import streaming`"
    )

__version__ = "0.0.0+speedpack.tests.stub"
