"""Human-readable names and figures: callables in fingerprints, byte counts on the command line."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: float) -> str:
    """A byte count in binary units.

    Example:
        >>> human_bytes(1536)
        '1.5 KiB'
    """
    for unit in _UNITS:
        if abs(count) < 1024 or unit == _UNITS[-1]:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def callable_name(fn: object) -> str:
    """`module.qualname` of a callable: how fingerprints and resume checks name maps, factories, collates."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
