"""shardcache: the trainer-side dataset pipeline over shards served by the node daemon.

`import shardcache` needs neither torch nor lance nor s3fs; each is imported where it is used.
"""

from __future__ import annotations

from shardcache.context import RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.telemetry import Telemetry
from shardcache.dataset import Dataset
from shardcache.errors import (
    CacheError,
    ConfigError,
    CorruptShardError,
    DaemonUnavailable,
    LengthUnknown,
    OutOfFileDescriptors,
    ResumeStateError,
    ShardcacheError,
    ShardError,
    StateError,
    UnsupportedResume,
)
from shardcache.loader.torch_loader import TorchLoader
from shardcache.log import (
    get_log_level,
    get_logger,
    reset_log_level,
    reset_logger,
    set_log_level,
    set_logger,
)
from shardcache.mesh import DataLoadMesh
from shardcache.pipeline.consume import Consumer
from shardcache.pipeline.stage_times import StageStats, StageTimes
from shardcache.resume.elastic import merge_states
from shardcache.snapshots.config import CacheConfig
from shardcache.snapshots.entries import CacheEntryInfo, clear_cache, list_cache_entries
from shardcache.snapshots.snapshot import FingerprintProvider
from shardcache.sources.manifests import write_manifest

__version__ = "0.1.0"

__all__ = [
    "CacheConfig",
    "CacheEntryInfo",
    "CacheError",
    "ConfigError",
    "Consumer",
    "CorruptShardError",
    "DaemonClient",
    "DaemonUnavailable",
    "OutOfFileDescriptors",
    "DataLoadMesh",
    "Dataset",
    "FingerprintProvider",
    "LengthUnknown",
    "ResumeStateError",
    "RuntimeContext",
    "ShardError",
    "ShardcacheError",
    "StageStats",
    "StageTimes",
    "StateError",
    "Telemetry",
    "TorchLoader",
    "UnsupportedResume",
    "__version__",
    "clear_cache",
    "get_log_level",
    "get_logger",
    "list_cache_entries",
    "merge_states",
    "reset_log_level",
    "reset_logger",
    "set_log_level",
    "set_logger",
    "write_manifest",
]
