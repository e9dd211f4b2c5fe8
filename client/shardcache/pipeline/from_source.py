"""What `Dataset.from_source`'s arguments become: the checked pipeline over one kind of shards.

The kind's name is made canonical and its options checked (`shardcache.sources`), the shards expanded
(`shardcache.shards.expand_shards`) or, for a kind that reads its own object store (lance), taken as the
datasets named, with each one's version recorded for the snapshot identity; the planning hints are split
from the options (`PlanHints`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from shardcache.context import RuntimeContext
from shardcache.errors import ConfigError
from shardcache.shards import ShardRef, expand_shards
from shardcache.sources import SourceSpec, canonical_kind, check_options
from shardcache.sources.kinds import kind_of
from shardcache.sources.lance.access import discover_versions
from shardcache.sources.lance.source import check_daemon
from shardcache.sources.opener import DaemonSetting, check_daemon_setting
from shardcache.sources.options import PlanHints
from shardcache.spec import PipelineSpec


def source_pipeline(
    source_kind: str,
    shards: Any,
    context: RuntimeContext | None,
    daemon: DaemonSetting,
    options: dict[str, Any],
) -> PipelineSpec:
    """The pipeline of `Dataset.from_source(source_kind, shards, context=..., daemon=..., **options)` for
    a kind of shards (not "mixed"); its arguments are documented there.

    Raises:
        ConfigError: an unknown kind or argument, or a bad value; the message names it.
    """
    kind = canonical_kind(source_kind)
    if context is not None and not isinstance(context, RuntimeContext):
        raise ConfigError(f"context={context!r}: expected a RuntimeContext or None")
    check_daemon_setting(daemon)
    check_options(kind, options)
    traits = kind_of(kind)
    if traits.own_object_store:  # datasets named as given, read without the daemon
        if isinstance(shards, (str, ShardRef)) or not isinstance(shards, Sequence):
            shards = [shards]
        refs = [s if isinstance(s, ShardRef) else ShardRef(str(s)) for s in shards]
        check_daemon(daemon)
        daemon = None
    else:
        refs = expand_shards(shards, data_suffix=traits.data_suffix)
    given, hints = PlanHints.split(options)
    if traits.own_object_store:  # each dataset's version, as the snapshot identity records it
        urls = [ref.url for ref in refs]
        versions = discover_versions(urls, given.get("storage_options"))
        hints = dataclasses.replace(hints, versions=versions or None)
    return PipelineSpec(SourceSpec(kind, tuple(refs), given, context, daemon, hints))
