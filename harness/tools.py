"""What a test needs from the machine: external tools and capabilities, skipped locally and required in CI.

Under CI=true nothing is silently left out: `unavailable` fails the test instead of skipping it (the root
conftest also turns any other skip into a failure there).
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Where the tools come from, for the message (Debian package names).
_PACKAGES = {"promtool": "prometheus", "prometheus": "prometheus", "systemd-analyze": "systemd"}


def unavailable(message: str) -> NoReturn:
    """Skip the test locally; fail it under CI=true."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str) -> str:
    """Path of an external tool; skip locally when missing, fail under CI=true."""
    path = shutil.which(name)
    if path is None:
        package = _PACKAGES.get(name)
        unavailable(f"{name} is not installed" + (f" (Debian package: {package})" if package else ""))
    return path
