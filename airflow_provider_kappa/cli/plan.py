"""``kappa plan``: being built (see the open issues); exits non-zero until then."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kappa plan``."""
    parser.add_argument("--config", help="path to the job's kappa.yaml")


def run(args: argparse.Namespace) -> int:
    """Not built yet: say so and fail."""
    print("kappa plan: not available in this build yet", file=sys.stderr)
    return 1
