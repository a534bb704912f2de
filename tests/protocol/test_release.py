"""Releases (issue #46): one version, in pyproject.toml, that everything reports, and a
CHANGELOG section for it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from proxy.config.version import version

ROOT = Path(__file__).resolve().parent.parent.parent
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")


def test_the_version_is_semver_from_pyproject_and_the_changelog_has_its_section():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert SEMVER.match(declared), declared
    assert version() == declared
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (\S+) — (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert sections and sections[0][0] == declared, sections  # the newest first
    assert all(SEMVER.match(v) for v, _ in sections)


def test_fedgate_version_prints_it():
    run = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True,
                         text=True, cwd=ROOT, timeout=30)
    assert run.returncode == 0 and run.stdout.strip() == f"fedgate {version()}"
