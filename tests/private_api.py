"""Checks of the private APIs the adapters in ``airflow_provider_kappa/compat/`` rely on, against the
installed releases (docs/architecture.md, Private APIs). A failure says which library, which version
and which name changed, and where kappa uses it."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest


def changed(dist: str, name: str, what: str, adapter: str) -> str:
    """The message of a private API an installed release changed."""
    try:
        release = version(dist)
    except PackageNotFoundError:
        release = "(version unknown)"
    return (
        f"{dist} {release} changed a private API kappa relies on: {name} {what}. "
        f"Adapt airflow_provider_kappa/compat/{adapter}.py to this release (or bound {dist} in setup.cfg)."
    )


def require_function(dist: str, module: str, name: str, params: tuple[str, ...], adapter: str) -> Any:
    """``module.name``, a function taking every parameter in ``params`` by name; a loud failure otherwise."""
    try:
        owner = importlib.import_module(module)
    except ImportError as e:
        pytest.fail(changed(dist, module, f"no longer imports ({e})", adapter))
    fn = getattr(owner, name, None)
    if not callable(fn):
        pytest.fail(changed(dist, f"{module}.{name}", "is gone", adapter))
    signature = inspect.signature(fn)
    missing = [p for p in params if p not in signature.parameters]
    if missing:
        pytest.fail(changed(dist, f"{module}.{name}{signature}", f"has no parameter {', '.join(missing)}", adapter))
    return fn


def require_attributes(dist: str, owner: object, where: str, names: tuple[str, ...], adapter: str) -> None:
    """Each of ``names`` is an attribute of ``owner`` (``where`` names it in the message)."""
    gone = [n for n in names if not hasattr(owner, n)]
    if gone:
        pytest.fail(changed(dist, where, f"has no attribute {', '.join(gone)}", adapter))
