"""The wire contract, under its former name: everything here comes from `shardcache_protocol`.

The models, error codes and socket rule live in their own package so that the daemon can import them
without loading the pipeline; this module keeps `shardcache.protocol` working for code that used it.
"""

from __future__ import annotations

from shardcache_protocol import *  # noqa: F403
from shardcache_protocol import __all__ as __all__
