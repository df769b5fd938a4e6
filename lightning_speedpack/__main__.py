"""``python -m lightning_speedpack doctor SCRIPT [ARGS...]``."""

import sys

from lightning_speedpack.doctor.cli import main

if __name__ == "__main__":
    sys.exit(main())
