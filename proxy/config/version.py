"""The release of this code: ``[project] version`` of pyproject.toml (semver, CHANGELOG.md).

Read from the checkout's pyproject.toml when the code runs from one (an editable install,
``make run``), else from the installed package's metadata: both are that one line, so
the version is raised in one place, in the commit that makes a release.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent.parent / "pyproject.toml"


@functools.cache
def version() -> str:
    try:
        with open(PYPROJECT, "rb") as file:
            return tomllib.load(file)["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return metadata.version("fedgate")
    except metadata.PackageNotFoundError:
        return "unknown"
