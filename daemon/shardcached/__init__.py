"""shardcached: the node-local shard cache daemon."""

from __future__ import annotations

__version__ = "0.1.0"
