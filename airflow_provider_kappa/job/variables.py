"""``${VAR}`` and ``${VAR:-default}`` in kappa.yaml: every string of the file, expanded when it is loaded.

Pure Python, like :mod:`airflow_provider_kappa.job.config`, which calls it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from airflow_provider_kappa.exceptions import KappaConfigError

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(raw: Any, where: str, path: Path) -> Any:
    """Substitute ``${VAR}`` and ``${VAR:-default}`` in every string of the YAML;
    ``${CONFIG_DIR}`` is the folder holding the file.

    :raises KappaConfigError: a variable that is unset and has no default.
    """
    if isinstance(raw, dict):
        return {k: expand_env(v, f"{where}.{k}" if where else str(k), path) for k, v in raw.items()}
    if isinstance(raw, list):
        return [expand_env(v, f"{where}[{i}]", path) for i, v in enumerate(raw)]
    if not isinstance(raw, str):
        return raw

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name == "CONFIG_DIR":
            return str(path.parent)
        value = os.environ.get(name)
        if value:
            return value
        if default is None:
            raise KappaConfigError(f"{where}: {raw!r} uses ${{{name}}}, which is not set and has no default")
        return default

    return _VAR.sub(sub, raw)
