"""The Dockerfile's invariants, read from the file (Docker cannot run on the test machines)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

from tests.deploy.deploy_files import DOCS, REPO, dockerfile_instructions

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE)


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def _args(stage: list[tuple[str, str]], name: str) -> list[str]:
    return [args for instruction, args in stage if instruction == name]


def _image_defaults() -> dict[str, Any]:
    """The settings of the defaults file the entrypoint passes as its first --config, read from the repo."""
    stage = _final_stage()
    (entrypoint,) = _args(stage, "ENTRYPOINT")
    in_image = json.loads(entrypoint)[2]
    copies = {
        dest: source for source, dest in (args.split() for args in _args(stage, "COPY") if "--" not in args)
    }
    return tomllib.loads((REPO / copies[in_image]).read_text())


def test_every_stage_is_python_311_slim() -> None:
    bases = [args.split()[0] for name, args in _instructions() if name == "FROM"]
    assert bases and all(base == "python:3.11-slim" for base in bases)


def test_final_stage_runs_as_a_non_root_user() -> None:
    (user,) = _args(_final_stage(), "USER")
    assert user.split(":")[0] not in {"root", "0"}


def test_installs_only_the_daemon_extras() -> None:
    installs = [args for name, args in _instructions() if name == "RUN" and "pip install" in args]
    assert len(installs) == 1
    assert re.findall(r"\.\[([^\]]*)\]", installs[0]) == ["daemon"]


def test_healthcheck_asks_health_on_the_metrics_port() -> None:
    stage = _final_stage()
    (healthcheck,) = _args(stage, "HEALTHCHECK")
    port = _image_defaults()["metrics_addr"].rpartition(":")[2]
    assert f"127.0.0.1:{port}/v1/health" in healthcheck
    assert _args(stage, "EXPOSE") == [port]


def test_socket_directory_and_cache_are_volumes_matching_the_settings() -> None:
    stage = _final_stage()
    (volume,) = _args(stage, "VOLUME")
    volumes = set(json.loads(volume))
    defaults = _image_defaults()
    assert defaults["socket"].rpartition("/")[0] in volumes
    assert defaults["cache_dir"] in volumes


def test_entrypoint_is_the_daemon_over_the_images_defaults_file() -> None:
    (entrypoint,) = _args(_final_stage(), "ENTRYPOINT")
    assert json.loads(entrypoint)[:2] == ["shardcached", "--config"]
    assert len(json.loads(entrypoint)) == 3


def test_the_defaults_file_is_in_the_build_context_and_outside_the_mounted_config_directory() -> None:
    (entrypoint,) = _args(_final_stage(), "ENTRYPOINT")
    in_image = Path(json.loads(entrypoint)[2])
    # /etc/shardcache is where a ConfigMap or the host's file is mounted, hiding what the image put there.
    assert Path("/etc/shardcache") not in in_image.parents
    patterns = (REPO / ".dockerignore").read_text().splitlines()
    (source,) = [args.split()[0] for args in _args(_final_stage(), "COPY") if args.endswith(str(in_image))]
    assert f"!{source}" in patterns


def test_dockerignore_keeps_the_virtualenv_and_git_out() -> None:
    patterns = (REPO / ".dockerignore").read_text().splitlines()
    assert patterns[patterns.index("*") + 1 :], "deny-all must be followed by the few paths the build needs"
    assert not any(p.startswith("!") and (".venv" in p or ".git" in p) for p in patterns)


def test_deploy_guide_shows_docker_run_for_daemon_and_trainer() -> None:
    guide = (DOCS / "deploy.md").read_text()
    commands = re.sub(r"\\\n\s*", " ", guide).splitlines()
    runs = [line for line in commands if line.startswith("docker run")]
    daemon = [run for run in runs if "shardcache:0.1.0" in run]
    trainer = [run for run in runs if "--name trainer" in run]
    assert daemon and "-v shardcache-run:/run/shardcache" in daemon[0]
    assert trainer and "SHARDCACHE_SOCKET=/run/shardcache/shardcache.sock" in trainer[0]
    assert "-v shardcache-run:/run/shardcache" in trainer[0]
