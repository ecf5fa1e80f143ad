"""Alias of :mod:`embnic.testbed.training.dlrm_workers` under its earlier, documented name:
``torchrun --nproc-per-node N -m embnic.testbed.training.workers ...`` runs the same DLRM
workers, with the same options, output and exit codes (0; 1 a run failed; 2 usage)."""
from __future__ import annotations

import sys

from .dlrm_workers import main

if __name__ == "__main__":
    sys.exit(main())
