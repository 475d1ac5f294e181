"""Where the tests find what they read: the checkout's own files (README, setup.cfg, dags/, docs/) and
the package under test wherever Python imports it from: the checkout, or the wheel that `make
test-compat` (tests/compat/run.py) installs into a venv of its own, next to a copy of the checkout
without the package."""

from __future__ import annotations

from pathlib import Path

import airflow_provider_kappa

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(airflow_provider_kappa.__file__).resolve().parent
EXAMPLES = PACKAGE / "examples"
