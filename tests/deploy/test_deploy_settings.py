"""Every shipped configuration loads into the daemon's real settings, with the precedence operators rely on.

Each deployment is loaded the way it starts the daemon: the image's entrypoint, ENV lines and copied
defaults file read from the Dockerfile; the DaemonSet's args, env and ConfigMap mount; the systemd unit's
Environment=, EnvironmentFile= and ExecStart=. What an operator edits (the ConfigMap, the environment file)
must win over what the image or the unit ships. The settings model forbids unknown keys, so a renamed
setting breaks these tests rather than a node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardcached.__main__ import build_parser
from shardcached.config import Layer, Settings, gather_layers, settings_from, source_of
from tests.deploy.deploy_files import DEPLOY, DOCS, REPO, dockerfile_instructions, unit_directives

K8S = DEPLOY / "k8s"
CONFIGMAP_FILE = K8S / "shardcached.toml"
UNIT = DEPLOY / "systemd" / "shardcached.service"
ENV_FILE = DEPLOY / "systemd" / "shardcached.env"


@pytest.fixture(autouse=True)
def no_shardcache_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only what a deployment sets may reach the settings (the test session sets SHARDCACHE_CACHE_DIR)."""
    for name in [key for key in os.environ if key.upper().startswith("SHARDCACHE_")]:
        monkeypatch.delenv(name)
    yield


def _load(
    argv: list[str], env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, list[Layer]]:
    """Settings as `shardcached argv` builds them with `env`'s SHARDCACHE_* variables as its environment."""
    for name, value in env.items():
        if name.startswith("SHARDCACHE_"):
            monkeypatch.setenv(name, value)
    args: dict[str, Any] = vars(build_parser().parse_args(argv))
    layers = gather_layers(args, args.pop("config", []))
    return settings_from(layers), layers


# -- the image -------------------------------------------------------------------------------------------
def _final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions(REPO / "Dockerfile")
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def _image_env() -> dict[str, str]:
    """The final stage's ENV lines (parsed from the Dockerfile, so the test follows it)."""
    env_args = " ".join(args for name, args in _final_stage() if name == "ENV")
    return dict(re.findall(r"(\w+)=(\S+)", env_args))


def _image_files() -> dict[str, Path]:
    """Path in the image -> file in the repository, for the final stage's COPY from the build context."""
    copies = [args.split() for name, args in _final_stage() if name == "COPY" and not args.startswith("--")]
    return {dest: REPO / source for source, dest in copies}


def _entrypoint() -> list[str]:
    (entrypoint,) = [args for name, args in _final_stage() if name == "ENTRYPOINT"]
    words: list[str] = json.loads(entrypoint)
    assert words[0] == "shardcached"
    return words[1:]


def _in_repo(argv: list[str], files: Mapping[str, Path]) -> list[str]:
    """`argv` with the image's (or pod's) file paths replaced by the files they come from."""
    return [str(files[arg]) if arg in files else arg for arg in argv]


def test_the_image_ships_its_defaults_as_a_config_file_not_as_environment_variables() -> None:
    assert not [name for name in _image_env() if name.startswith("SHARDCACHE_")]
    entrypoint = _entrypoint()
    assert entrypoint[0] == "--config" and entrypoint[1] in _image_files()


def test_the_image_alone_starts_with_its_defaults_file(monkeypatch: pytest.MonkeyPatch) -> None:
    settings, layers = _load(_in_repo(_entrypoint(), _image_files()), _image_env(), monkeypatch)
    assert settings.socket == "/run/shardcache/shardcache.sock"
    assert settings.cache_dir == Path("/var/cache/shardcache")
    assert settings.metrics_addr == "0.0.0.0:9464"
    defaults_file = _image_files()[_entrypoint()[1]]
    assert source_of("capacity", layers) == f"file {defaults_file}"


# -- Kubernetes ------------------------------------------------------------------------------------------
def _daemon_container() -> dict[str, Any]:
    daemonset = yaml.safe_load((K8S / "daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _pod_start(configmap: Path) -> tuple[list[str], dict[str, str]]:
    """The DaemonSet's container as the kubelet starts it from the image: argv and environment."""
    container = _daemon_container()
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    files = {**_image_files(), f"{mount['mountPath']}/{CONFIGMAP_FILE.name}": configmap}
    env = {**_image_env(), **{item["name"]: item["value"] for item in container.get("env", [])}}
    return _in_repo([*_entrypoint(), *container["args"]], files), env


def test_an_operators_capacity_in_the_configmap_wins_over_the_image_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edited = tmp_path / CONFIGMAP_FILE.name
    edited.write_text(CONFIGMAP_FILE.read_text().replace('capacity = "90%"', 'capacity = "500GiB"'))
    settings, layers = _load(*_pod_start(edited), monkeypatch)
    assert settings.capacity == "500GiB"
    assert source_of("capacity", layers) == f"file {edited}"


def test_every_value_the_configmap_sets_is_in_effect_in_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    settings, layers = _load(*_pod_start(CONFIGMAP_FILE), monkeypatch)
    configmap = gather_layers({}, [CONFIGMAP_FILE])[-1].values
    for name, value in configmap.items():
        assert source_of(name, layers) == f"file {CONFIGMAP_FILE}", name
        assert Settings.model_validate({name: value}).model_dump()[name] == getattr(settings, name)
    assert settings.allow == ["s3://my-training-bucket/datasets"]
    assert settings.require_mount == Path("/mnt/nvme")


# -- Docker ----------------------------------------------------------------------------------------------
def test_the_documented_docker_run_line_overrides_the_image_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    guide = re.sub(r"\\\n\s*", " ", (DOCS / "deploy.md").read_text())
    (run,) = [
        line for line in guide.splitlines() if line.startswith("docker run") and "shardcache:0.1.0" in line
    ]
    argv = [*_entrypoint(), *shlex.split(run.split("shardcache:0.1.0", 1)[1])]
    settings, layers = _load(_in_repo(argv, _image_files()), _image_env(), monkeypatch)
    assert settings.socket == "/run/shardcache/shardcache.sock"
    assert settings.metrics_addr == "0.0.0.0:9464"
    assert settings.allow == ["s3://my-training-bucket/datasets"]
    assert (settings.capacity, source_of("capacity", layers)) == ("500GiB", "flag --capacity")


# -- systemd ---------------------------------------------------------------------------------------------
def _env_file_values(path: Path) -> dict[str, str]:
    pairs = [
        line.split("=", 1)
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return {name: value for name, value in pairs}


def _unit_start(env_file: Path) -> tuple[list[str], dict[str, str]]:
    """argv and environment as systemd starts ExecStart=: EnvironmentFile= overrides Environment=."""
    unit = unit_directives(UNIT)
    env = dict(value.split("=", 1) for value in unit["Service.Environment"])
    env.update(_env_file_values(env_file))
    (exec_start,) = unit["Service.ExecStart"]
    # systemd's expansion: ${VAR} is one argument, $VAR is split on whitespace.
    words = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], exec_start))
    argv = [
        part for word in words for part in (env.get(word[1:], "").split() if word.startswith("$") else [word])
    ]
    return argv[1:], env


def test_the_systemd_unit_and_its_environment_file_load(monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _ = _load(*_unit_start(ENV_FILE), monkeypatch)
    assert settings.socket == "/run/shardcache/shardcache.sock"
    assert settings.cache_dir == Path("/var/cache/shardcache")
    assert settings.capacity == "90%"
    assert settings.allow == ["s3://my-training-bucket/datasets"]
    assert settings.require_mount == Path("/var/cache/shardcache")


def test_the_unit_passes_no_setting_as_a_flag_so_the_environment_file_decides() -> None:
    (exec_start,) = unit_directives(UNIT)["Service.ExecStart"]
    assert exec_start.split() == ["/opt/shardcache/bin/shardcached", "$SHARDCACHED_ARGS"]


@pytest.mark.parametrize(
    ("variable", "value", "setting"),
    [
        ("SHARDCACHE_CACHE_DIR", "/mnt/nvme/shardcache", "cache_dir"),
        ("SHARDCACHE_SOCKET", "/run/other/shardcache.sock", "socket"),
        ("SHARDCACHE_METRICS_ADDR", "0.0.0.0:9555", "metrics_addr"),
    ],
)
def test_a_value_in_the_environment_file_overrides_the_units_default(
    variable: str, value: str, setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "shardcached.env"
    env_file.write_text(ENV_FILE.read_text() + f"{variable}={value}\n")
    settings, layers = _load(*_unit_start(env_file), monkeypatch)
    assert str(getattr(settings, setting)) == value
    assert source_of(setting, layers) == f"env {variable}"
