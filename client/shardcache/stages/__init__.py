"""Pipeline stages: one module per stage, each a frozen spec (`.kind`, `.node(up, ctx)`) and its iterator."""

from __future__ import annotations

from typing import get_args

from shardcache.stages.assemble import AssembleStage
from shardcache.stages.balance import BalanceStage
from shardcache.stages.batch import BatchStage
from shardcache.stages.cache import CacheStage
from shardcache.stages.map import MapStage
from shardcache.stages.resolve_ref import ResolveRefStage
from shardcache.stages.select import SelectStage
from shardcache.stages.shuffle import ShuffleStage
from shardcache.stages.traits import Count, StageTraits
from shardcache.stages.unbatch import UnbatchStage

Stage = (
    MapStage
    | SelectStage
    | ShuffleStage
    | AssembleStage
    | BatchStage
    | UnbatchStage
    | CacheStage
    | BalanceStage
    | ResolveRefStage
)

# Every stage spec class, in the order of the union: what code that lists kinds by a trait walks.
STAGE_SPECS: tuple[type[StageTraits], ...] = get_args(Stage)

__all__ = [
    "AssembleStage",
    "BalanceStage",
    "BatchStage",
    "CacheStage",
    "Count",
    "MapStage",
    "ResolveRefStage",
    "SelectStage",
    "ShuffleStage",
    "STAGE_SPECS",
    "Stage",
    "StageTraits",
    "UnbatchStage",
]
