"""Every shipped configuration loads into the daemon's real settings (flags, SHARDCACHE_* env, TOML).

The settings model forbids unknown keys, so a renamed setting breaks these tests rather than a node.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardcached.__main__ import build_parser
from shardcached.config import Settings, load_settings
from tests.deploy.deploy_files import DEPLOY, DOCS, REPO, dockerfile_instructions, unit_directives


def _settings(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as `shardcached` builds them from `argv` with `env` as its only SHARDCACHE_* variables."""
    for name in [key for key in os.environ if key.startswith("SHARDCACHE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args: dict[str, Any] = vars(build_parser().parse_args(argv))
    config_file = args.pop("config", None)
    return load_settings(args, config_file)


def test_kubernetes_configmap_toml_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configmap = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())
    path = tmp_path / "shardcached.toml"
    path.write_text(configmap["data"]["shardcached.toml"])
    daemonset = yaml.safe_load((DEPLOY / "k8s" / "daemonset.yaml").read_text())
    argv = [arg.replace("/etc/shardcache/shardcached.toml", str(path)) for arg in _daemon_args(daemonset)]
    settings = _settings(argv, {}, monkeypatch)
    assert settings.socket == "/run/shardcache/shardcache.sock"
    assert settings.cache_dir == Path("/var/cache/shardcache")
    assert settings.metrics_addr == "0.0.0.0:9464"
    assert settings.allow == ["s3://my-training-bucket/datasets"]


def _daemon_args(daemonset: dict[str, Any]) -> list[str]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


def test_systemd_unit_and_environment_file_load(monkeypatch: pytest.MonkeyPatch) -> None:
    unit = unit_directives(DEPLOY / "systemd" / "shardcached.service")
    env = dict(value.split("=", 1) for value in unit["Service.Environment"])
    for line in (DEPLOY / "systemd" / "shardcached.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    (exec_start,) = unit["Service.ExecStart"]
    # systemd's expansion: ${VAR} is one argument, $VAR is split on whitespace.
    words = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], exec_start))
    argv = [part for word in words for part in (env[word[1:]].split() if word.startswith("$") else [word])]
    settings = _settings(argv[1:], {k: v for k, v in env.items() if k.startswith("SHARDCACHE_")}, monkeypatch)
    assert settings.socket == "/run/shardcache/shardcache.sock"
    assert settings.cache_dir == Path("/var/cache/shardcache")
    assert settings.capacity == "90%"
    assert settings.allow == ["s3://my-training-bucket/datasets"]


def test_docker_image_defaults_and_documented_run_line_load(monkeypatch: pytest.MonkeyPatch) -> None:
    env_args = " ".join(args for name, args in dockerfile_instructions(REPO / "Dockerfile") if name == "ENV")
    env = {k: v for k, v in re.findall(r"(\w+)=(\S+)", env_args) if k.startswith("SHARDCACHE_")}
    guide = re.sub(r"\\\n\s*", " ", (DOCS / "deploy.md").read_text())
    (run,) = [
        line for line in guide.splitlines() if line.startswith("docker run") and "shardcache:0.1.0" in line
    ]
    argv = shlex.split(run.split("shardcache:0.1.0", 1)[1])
    settings = _settings(argv, env, monkeypatch)
    assert settings.socket == "/run/shardcache/shardcache.sock"
    assert settings.metrics_addr == "0.0.0.0:9464"
    assert settings.allow == ["s3://my-training-bucket/datasets"]
    assert settings.capacity == "500GiB"
