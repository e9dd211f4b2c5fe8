"""The `TorchLoader` facade: a torch DataLoader over a Dataset's slots (`torch_loader`), one pass of it
(`iterator`), the resumable merge of its workers (`stream`), its resume states (`resume`: identity, checks,
the workers' start states, on the envelope and version of `shardcache.resume`), the plain-iterable path
(`plain`), the stall watchdog (`watchdog`), thread workers (`threads`, and their `fork_gate`) and the
worker processes' shared-memory ring (`ring`).
"""

from __future__ import annotations

from shardcache.loader.iterator import LoaderIterator
from shardcache.loader.torch_loader import TorchLoader

__all__ = ["LoaderIterator", "TorchLoader"]
