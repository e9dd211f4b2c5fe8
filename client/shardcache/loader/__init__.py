"""The `TorchLoader` facade: a torch DataLoader over a Dataset's slots (`torch_loader`), the resumable merge
of its workers (`stream`), the plain-iterable path (`plain`) and the stall watchdog (`watchdog`).

Its resume states (identity, checks, the workers' start states) are `shardcache.resume.loader`.
"""

from __future__ import annotations

from shardcache.loader.torch_loader import LoaderIterator, TorchLoader

__all__ = ["LoaderIterator", "TorchLoader"]
