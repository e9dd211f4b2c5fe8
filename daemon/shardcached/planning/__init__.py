"""Planning: plans as arrays of url ids, where each shard is used next, eviction and prefetch choices.

The package's face: the rest of the daemon imports from here. `Planner` decides (Belady's MIN over the
plans, or LRU); `PlanIndexer` indexes and drops plans in bounded steps of the event loop and `refiled`
awaits a dropped plan's refile; `read_plan`, `read_shardlist` and `read_prefetch` read request bodies off
the loop; `ShardLists` holds the shard lists jobs upload. Inside: urltable (url ids), plans (a plan's
arrays), planindex (which plans hold a url, where), orders and nextuse (the resident shards by next use),
registration (plans entering and leaving, expiry, pace), policies (the ranking rules)."""

from __future__ import annotations

from shardcached.planning.indexing import REFILE_CHUNK, PlanIndexer, refiled
from shardcached.planning.planbody import PlanBody, read_plan, read_prefetch, read_shardlist
from shardcached.planning.planner import Planner
from shardcached.planning.plans import PlanArrays
from shardcached.planning.policies import prefetch_victim
from shardcached.planning.shardlists import ShardListIds, ShardLists
from shardcached.planning.urltable import UrlTable

__all__ = [
    "PlanArrays",
    "PlanBody",
    "PlanIndexer",
    "Planner",
    "REFILE_CHUNK",
    "ShardListIds",
    "ShardLists",
    "UrlTable",
    "prefetch_victim",
    "read_plan",
    "read_prefetch",
    "read_shardlist",
    "refiled",
]
