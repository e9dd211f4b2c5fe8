"""Settings: flags over SHARDCACHE_* env over TOML; capacity parsing; the CLI's help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from shardcached.__main__ import build_parser
from shardcached.config import load_settings, parse_capacity, parse_min_free, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("500GiB", 500 * 1024**3),
        ("2TB", 2 * 1000**4),
        ("64 MiB", 64 * 1024**2),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("10k", 10_000),
    ],
)
def test_sizes_parse_to_bytes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "5 parsecs", "-1GiB", "GiB"])
def test_malformed_sizes_are_rejected_with_the_accepted_forms(text):
    with pytest.raises(ValueError, match="500GiB"):
        parse_size(text)


def test_a_percentage_is_a_share_of_the_cache_filesystem(tmp_path: Path):
    import os

    stat = os.statvfs(tmp_path)
    assert parse_capacity("50%", tmp_path) == int(stat.f_blocks * stat.f_frsize * 0.5)


@pytest.mark.parametrize("text", ["0%", "150%", "0"])
def test_impossible_capacities_are_rejected(text, tmp_path: Path):
    with pytest.raises(ValueError):
        parse_capacity(text, tmp_path)


@pytest.mark.parametrize("text", ["90", "1048575", " 512 "])
def test_a_bare_capacity_below_one_mib_is_refused_suggesting_a_share_or_a_unit(text, tmp_path: Path):
    with pytest.raises(ValueError, match=r"counts bytes.*%.*GiB"):
        parse_capacity(text, tmp_path)
    with pytest.raises(ValidationError, match=f"{text.strip()}%"):
        load_settings({"capacity": text})


@pytest.mark.parametrize("text", ["1048576", "512KiB", "90%"])
def test_a_bare_capacity_of_one_mib_or_any_unit_is_accepted(text, tmp_path: Path):
    assert parse_capacity(text, tmp_path) > 0


def test_the_cli_refuses_capacity_90_in_one_line_naming_the_fix(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "shardcached", "--capacity", "90", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "90%" in run.stderr and "90GiB" in run.stderr


def test_min_free_is_a_share_of_the_filesystem_or_a_size_with_a_default_of_5_percent(tmp_path: Path):
    import os

    stat = os.statvfs(tmp_path)
    assert load_settings({}).min_free == "5%"
    assert parse_min_free("5%", tmp_path) == int(stat.f_blocks * stat.f_frsize * 0.05)
    assert parse_min_free("20GiB", tmp_path) == 20 * 1024**3
    assert parse_min_free("0", tmp_path) == 0
    with pytest.raises(ValidationError, match="min_free"):
        load_settings({"min_free": "100%"})


def test_flags_beat_env_which_beats_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    toml = tmp_path / "shardcached.toml"
    toml.write_text('capacity = "1GiB"\nmax_fetches = 7\nprefetch_depth = 5\nallow = ["/from-toml"]\n')
    monkeypatch.setenv("SHARDCACHE_MAX_FETCHES", "3")
    monkeypatch.setenv("SHARDCACHE_PREFETCH_DEPTH", "4")
    settings = load_settings({"prefetch_depth": 9}, toml)
    assert settings.prefetch_depth == 9  # flag
    assert settings.max_fetches == 3  # env
    assert settings.capacity == "1GiB"  # toml
    assert settings.allow == ["/from-toml"]


def test_allow_from_env_may_be_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SHARDCACHE_ALLOW", "s3://a/x, /data")
    assert load_settings().allow == ["s3://a/x", "/data"]
    monkeypatch.setenv("SHARDCACHE_ALLOW", '["s3://b"]')
    assert load_settings().allow == ["s3://b"]


@pytest.mark.parametrize("prefix", ["datasets/train", "./data", "bucket/prefix"])
def test_an_allow_prefix_without_scheme_or_absolute_path_is_refused_naming_both_forms(prefix: str):
    with pytest.raises(ValidationError, match="allow") as refused:
        load_settings({"allow": [prefix]})
    assert "s3://bucket/prefix" in str(refused.value) and "/abs/path" in str(refused.value)


def test_unset_flags_do_not_override_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SHARDCACHE_POLICY", "lru")
    flags = vars(build_parser().parse_args(["--capacity", "5GiB"]))
    settings = load_settings(flags)
    assert (settings.policy, settings.capacity) == ("lru", "5GiB")


def test_invalid_values_name_the_setting():
    with pytest.raises(ValidationError, match="max_fetches"):
        load_settings({"max_fetches": 0})
    with pytest.raises(ValidationError, match="capacity"):
        load_settings({"capacity": "lots"})


def test_a_missing_config_file_is_an_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nope.toml"):
        load_settings({}, tmp_path / "nope.toml")


def test_help_lists_every_flag():
    out = subprocess.run(
        [sys.executable, "-m", "shardcached", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in [
        "--cache-dir", "--capacity", "--socket", "--metrics-addr", "--allow", "--prefetch-depth",
        "--max-fetches", "--policy", "--config", "--retries", "--lease-ttl-s", "--plan-stale-s",
    ]:  # fmt: skip
        assert flag in out


def test_a_bad_flag_value_exits_2_with_a_message(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, "-m", "shardcached", "--capacity", "lots", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "capacity" in run.stderr
