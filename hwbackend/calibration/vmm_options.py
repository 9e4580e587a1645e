"""The ``calibrate`` command's options (:mod:`hwbackend.calibration.vmm`), apart from the measurement code so
that building the CLI's parser imports neither the VMM driver wrappers nor the simulator's memory policies
(issue 32: start-up)."""
from __future__ import annotations

import argparse

DEFAULT_MODELS = ("llama-3-8b",)
"""Models whose page-group growth is measured when ``--models`` is not given."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``calibrate`` options (shared by ``kvsim calibrate`` and ``python -m hwbackend.calibration.vmm``)."""
    parser.add_argument("--page-sizes", default="2MiB,4MiB,32MiB", help="comma-separated page sizes")
    parser.add_argument("--samples", type=int, default=1000, help="calls measured per call and page size")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="models for page-group growth")
    parser.add_argument("--out", default="profiles/calibration.json", help="profile file to write")
    parser.add_argument("--force", action="store_true", help="overwrite an existing profile")
    parser.add_argument("--no-load", action="store_true", help="skip the under-load measurements")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
