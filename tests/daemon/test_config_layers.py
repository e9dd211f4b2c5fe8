"""Settings precedence, one layer at a time, and `shardcached --print-config` naming every value's source.

Highest first: flags, `SHARDCACHE_*` environment variables, `--config` files (the last given first), the
built-in defaults. The image's defaults file is given first, so a mounted file given after it wins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from shardcached.config import Settings, gather_layers, load_settings, settings_from, source_of


@pytest.fixture(autouse=True)
def no_shardcache_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test session sets SHARDCACHE_CACHE_DIR for the client's `.cache()`: no layer may see it here."""
    for name in [key for key in os.environ if key.upper().startswith("SHARDCACHE_")]:
        monkeypatch.delenv(name)
    yield


def _file(path: Path, capacity: str) -> Path:
    path.write_text(f'capacity = "{capacity}"\n')
    return path


# (layers given, expected capacity, expected source); each row adds the next higher layer.
LAYERS = [
    ((), "90%", "default"),
    (("image",), "1GiB", "file {image}"),
    (("image", "mounted"), "2GiB", "file {mounted}"),
    (("image", "mounted", "env"), "3GiB", "env SHARDCACHE_CAPACITY"),
    (("image", "mounted", "env", "flag"), "4GiB", "flag --capacity"),
]


@pytest.mark.parametrize(("given", "capacity", "source"), LAYERS, ids=lambda v: "+".join(v) or "none")
def test_each_layer_overrides_every_layer_below_it(
    given: tuple[str, ...], capacity: str, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = _file(tmp_path / "image-defaults.toml", "1GiB")
    mounted = _file(tmp_path / "mounted.toml", "2GiB")
    files = [path for name, path in (("image", image), ("mounted", mounted)) if name in given]
    if "env" in given:
        monkeypatch.setenv("SHARDCACHE_CAPACITY", "3GiB")
    flags = {"capacity": "4GiB"} if "flag" in given else {}
    layers = gather_layers(flags, files)
    assert settings_from(layers).capacity == capacity
    assert source_of("capacity", layers) == source.format(image=image, mounted=mounted)


def test_a_later_config_file_overrides_an_earlier_one_key_by_key(tmp_path: Path) -> None:
    first = tmp_path / "first.toml"
    first.write_text('capacity = "1GiB"\nmax_fetches = 7\n')
    second = tmp_path / "second.toml"
    second.write_text('capacity = "2GiB"\n')
    settings = load_settings({}, [first, second])
    assert (settings.capacity, settings.max_fetches) == ("2GiB", 7)


def test_a_value_nobody_set_comes_from_the_default(tmp_path: Path) -> None:
    layers = gather_layers({}, [_file(tmp_path / "a.toml", "1GiB")])
    assert source_of("prefetch_depth", layers) == "default"
    assert settings_from(layers).prefetch_depth == Settings.model_fields["prefetch_depth"].default


def test_an_unknown_key_in_a_config_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text('capacityy = "1GiB"\n')
    layers = gather_layers({}, [typo])
    with pytest.raises(ValidationError, match="capacityy"):
        settings_from(layers)
    assert source_of("capacityy", layers) == f"file {typo}"


def test_a_config_file_that_is_not_toml_is_refused_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("capacity = \n")
    with pytest.raises(ValueError, match=f"{broken}.*not valid TOML"):
        gather_layers({}, [broken])


def test_an_empty_require_mount_variable_turns_the_guard_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCACHE_REQUIRE_MOUNT", "")
    assert load_settings().require_mount is None
    monkeypatch.setenv("SHARDCACHE_REQUIRE_MOUNT", "/mnt/nvme")
    assert load_settings().require_mount == Path("/mnt/nvme")


def test_a_relative_require_mount_is_refused() -> None:
    with pytest.raises(ValidationError, match="absolute path of the mount point"):
        load_settings({"require_mount": "mnt/nvme"})


def _clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith("SHARDCACHE_")}
    return {**env, **extra}


def _shardcached(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardcached", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_print_config_names_the_source_of_every_value_and_exits_0(tmp_path: Path) -> None:
    image = _file(tmp_path / "image-defaults.toml", "1GiB")
    mounted = tmp_path / "mounted.toml"
    mounted.write_text('allow = ["s3://bucket/train"]\n')
    run = _shardcached(
        "--config", str(image), "--config", str(mounted), "--max-fetches", "8", "--print-config",
        env=_clean_env(SHARDCACHE_POLICY="lru"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = {line.split(" = ")[0]: line for line in run.stdout.splitlines() if " = " in line}
    assert lines["capacity"].endswith(f"# file {image}")
    assert lines["allow"].endswith(f"# file {mounted}")
    assert lines["policy"].endswith("# env SHARDCACHE_POLICY")
    assert lines["max_fetches"].endswith("# flag --max-fetches")
    assert lines["prefetch_depth"].endswith("# default")
    assert set(lines) | {"require_mount"} == set(Settings.model_fields)


def test_print_config_output_is_a_config_file_giving_the_same_settings(tmp_path: Path) -> None:
    run = _shardcached(
        "--capacity", "5GiB", "--allow", "/data", "--print-config", env=_clean_env(SHARDCACHE_MAX_FETCHES="3")
    )
    assert run.returncode == 0, run.stderr
    printed = tmp_path / "printed.toml"
    printed.write_text(run.stdout)
    reloaded = load_settings({}, printed)
    assert (reloaded.capacity, reloaded.allow, reloaded.max_fetches) == ("5GiB", ["/data"], 3)
    assert tomllib.loads(run.stdout)["retry_backoff_s"] == 0.2


def test_an_invalid_value_is_reported_with_where_it_came_from(tmp_path: Path) -> None:
    run = _shardcached("--print-config", env=_clean_env(SHARDCACHE_MAX_FETCHES="0"))
    assert run.returncode == 2
    assert "max_fetches (from env SHARDCACHE_MAX_FETCHES)" in run.stderr
