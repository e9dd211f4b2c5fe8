"""The package logger, and a way to route it into any logger-like object.

Every module logs through `logging.getLogger(__name__)`, so all records pass the `shardcache` logger.
`set_logger(obj)` attaches one forwarding handler to that logger; the library installs no handler otherwise.
`reset_logger()` and `reset_log_level()` undo `set_logger` and `set_log_level` (mvp-dataset's names).
"""

from __future__ import annotations

import logging
from typing import Protocol

from shardcache.errors import ConfigError

PACKAGE_LOGGER = "shardcache"


class LoggerLike(Protocol):
    """Anything with the four usual logging methods (a `logging.Logger`, loguru's logger, ...)."""

    def debug(self, msg: str, /) -> object: ...
    def info(self, msg: str, /) -> object: ...
    def warning(self, msg: str, /) -> object: ...
    def error(self, msg: str, /) -> object: ...


class _ForwardingHandler(logging.Handler):
    """Forwards formatted records of the package logger to a user-supplied logger-like object."""

    def __init__(self, target: LoggerLike) -> None:
        super().__init__(logging.NOTSET)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            self.target.error(message)
        elif record.levelno >= logging.WARNING:
            self.target.warning(message)
        elif record.levelno >= logging.INFO:
            self.target.info(message)
        else:
            self.target.debug(message)


def _package_logger() -> logging.Logger:
    return logging.getLogger(PACKAGE_LOGGER)


def set_logger(logger: LoggerLike | None) -> None:
    """Route the package's log records to `logger` (any object with debug/info/warning/error).

    Pass a `logging.Logger` or any logger-like object; pass None to restore plain `logging` propagation.

    Example:
        >>> import logging, shardcache
        >>> shardcache.set_logger(logging.getLogger("trainer.data"))
    """
    package = _package_logger()
    for handler in list(package.handlers):
        if isinstance(handler, _ForwardingHandler):
            package.removeHandler(handler)
    if logger is None or logger is package:
        package.propagate = True
        return
    for method in ("debug", "info", "warning", "error"):
        if not callable(getattr(logger, method, None)):
            raise ConfigError(
                f"set_logger(logger): the object has no callable {method}(); pass a logger-like object"
            )
    package.addHandler(_ForwardingHandler(logger))
    # The target decides where records go; propagating too would log each record twice.
    package.propagate = False


def get_logger() -> LoggerLike:
    """The logger the package writes to: the one given to `set_logger`, else the `shardcache` logger."""
    for handler in _package_logger().handlers:
        if isinstance(handler, _ForwardingHandler):
            return handler.target
    return _package_logger()


def set_log_level(level: int | str) -> None:
    """Set the level of the package logger (`"DEBUG"`, `logging.INFO`, `"10"`, ...)."""
    if isinstance(level, str):
        name = level.strip().upper()
        resolved = int(name) if name.lstrip("-").isdigit() else logging.getLevelName(name)
        if not isinstance(resolved, int):
            raise ConfigError(
                f"set_log_level(level): unknown level {level!r}; use DEBUG, INFO, WARNING or ERROR"
            )
        level = resolved
    _package_logger().setLevel(level)


def get_log_level() -> int:
    """The effective level of the package logger."""
    return _package_logger().getEffectiveLevel()


def reset_logger() -> None:
    """Undo `set_logger`: records propagate through `logging` again (the same as `set_logger(None)`)."""
    set_logger(None)


def reset_log_level() -> None:
    """Undo `set_log_level`: the package logger inherits its level from `logging`'s configuration again.

    mvp-dataset resets to INFO on a handler of its own; shardcache installs no handler, so its default is
    no level of its own (NOTSET), and `get_log_level()` is then the root logger's level.
    """
    _package_logger().setLevel(logging.NOTSET)
