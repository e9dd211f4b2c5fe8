"""shardcache: the trainer-side dataset pipeline over shards served by the node daemon."""

from __future__ import annotations

__version__ = "0.1.0"
