"""set_logger / get_logger / set_log_level / get_log_level."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from shardcache import get_log_level, get_logger, set_log_level, set_logger
from shardcache.errors import ConfigError


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def debug(self, msg: str) -> None:
        self.lines.append(("debug", msg))

    def info(self, msg: str) -> None:
        self.lines.append(("info", msg))

    def warning(self, msg: str) -> None:
        self.lines.append(("warning", msg))

    def error(self, msg: str) -> None:
        self.lines.append(("error", msg))


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    level = logging.getLogger("shardcache").level
    yield
    set_logger(None)
    logging.getLogger("shardcache").setLevel(level)


def test_set_logger_routes_package_records_to_any_logger_like_object() -> None:
    recorder = Recorder()
    set_logger(recorder)
    set_log_level("INFO")
    logging.getLogger("shardcache.sources.tars").warning("shard %s skipped", "a.tar")
    logging.getLogger("shardcache.dataset").debug("not shown")
    assert recorder.lines == [("warning", "shard a.tar skipped")]
    assert get_logger() is recorder


def test_log_level_round_trips() -> None:
    set_log_level(logging.DEBUG)
    assert get_log_level() == logging.DEBUG
    set_log_level("warning")
    assert get_log_level() == logging.WARNING


def test_bad_logger_and_level_are_refused() -> None:
    with pytest.raises(ConfigError, match="no callable"):
        set_logger(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown level"):
        set_log_level("LOUD")
