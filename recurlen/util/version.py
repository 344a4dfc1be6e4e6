"""The installed distribution's version: pyproject.toml's `version`, the one place it is written."""

from __future__ import annotations


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("recurlen")
    except PackageNotFoundError:  # a source tree put on the path without installing it
        return "0+unknown"
