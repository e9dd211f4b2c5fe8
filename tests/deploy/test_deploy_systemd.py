"""The systemd unit passes `systemd-analyze verify` and keeps its hardening and socket-sharing promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tools import require_tool
from tests.deploy.deploy_files import DEPLOY, unit_directives

UNIT = DEPLOY / "systemd" / "shardcached.service"
ENV_FILE = DEPLOY / "systemd" / "shardcached.env"


def _one(directives: dict[str, list[str]], key: str) -> str:
    values = directives[f"Service.{key}"]
    assert len(values) == 1, f"{key} given {len(values)} times"
    return values[0]


@pytest.fixture
def installable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's shardcached (`verify` needs it to exist)."""
    binary = Path(sys.executable).parent / "shardcached"
    target = str(binary) if binary.exists() else "/bin/true"
    text = UNIT.read_text().replace("/opt/shardcache/bin/shardcached", target)
    path = tmp_path / "shardcached.service"
    path.write_text(text)
    return path


def test_unit_passes_systemd_analyze_verify(installable_unit: Path) -> None:
    tool = require_tool("systemd-analyze")
    result = subprocess.run(
        [tool, "verify", str(installable_unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # verify reports problems on stderr but can still exit 0 (e.g. unknown directives): both must be clean.
    problems = [line for line in result.stderr.splitlines() if "shardcached.service" in line]
    assert result.returncode == 0 and not problems, result.stderr


def test_unit_exposure_score_is_low(installable_unit: Path) -> None:
    tool = require_tool("systemd-analyze")
    help_text = subprocess.run([tool, "--help"], capture_output=True, text=True, check=False).stdout
    if "--offline" not in help_text:
        pytest.skip("this systemd-analyze (older than 250) cannot score unit files offline")
    result = subprocess.run(
        [tool, "security", "--offline=yes", "--no-pager", str(installable_unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match[1]) <= 2.0, result.stdout


def test_unit_runs_as_dedicated_user_and_group() -> None:
    unit = unit_directives(UNIT)
    assert _one(unit, "User") == "shardcache"
    assert _one(unit, "Group") == "shardcache"


def test_socket_directory_lets_group_members_in_and_nobody_else() -> None:
    unit = unit_directives(UNIT)
    assert _one(unit, "RuntimeDirectory") == "shardcache"
    assert _one(unit, "RuntimeDirectoryMode") == "0750"
    assert "SHARDCACHE_SOCKET=/run/shardcache/shardcache.sock" in unit["Service.Environment"]


def test_cache_directory_is_writable_under_strict_protection() -> None:
    unit = unit_directives(UNIT)
    assert _one(unit, "ProtectSystem") == "strict"
    assert _one(unit, "CacheDirectory") == "shardcache"
    assert "SHARDCACHE_CACHE_DIR=/var/cache/shardcache" in unit["Service.Environment"]


def test_unit_is_hardened() -> None:
    unit = unit_directives(UNIT)
    for key, value in {
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "NoNewPrivileges": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "CapabilityBoundingSet": "",
        "Restart": "on-failure",
    }.items():
        assert _one(unit, key) == value, key
    assert "@system-service" in unit["Service.SystemCallFilter"]
    assert int(_one(unit, "LimitNOFILE")) >= 65536


def test_readiness_does_not_claim_sd_notify() -> None:
    unit = unit_directives(UNIT)
    # The daemon sends no sd_notify: Type=notify would time out. Readiness is the API answering.
    assert _one(unit, "Type") == "exec"
    assert "shardcache stats" in _one(unit, "ExecStartPost")
    assert "SHARDCACHE_SOCKET=/run/shardcache/shardcache.sock" in unit["Service.Environment"]


def test_environment_file_sets_capacity_and_an_allow_list() -> None:
    values = dict(
        line.split("=", 1)
        for line in ENV_FILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert values["SHARDCACHE_CAPACITY"]
    assert "--allow " in values["SHARDCACHED_ARGS"]
    assert values["SHARDCACHE_METRICS_ADDR"].startswith("127.0.0.1:")


def test_environment_file_requires_the_cache_disk_the_unit_requires() -> None:
    values = dict(
        line.split("=", 1)
        for line in ENV_FILE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    (mount,) = unit_directives(UNIT)["Unit.RequiresMountsFor"]
    assert values["SHARDCACHE_REQUIRE_MOUNT"] == mount
