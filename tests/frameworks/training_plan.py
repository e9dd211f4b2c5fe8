"""The numbers every framework script trains with and every framework test checks against.

No imports: the test modules read these without loading torch or a framework (the scripts do that).
"""

from __future__ import annotations

WORLD = 2  # ranks per launch
BATCH = 8  # samples per batch and rank (per DataLoader worker batch)
WORKERS = 2  # DataLoader workers per rank
EPOCHS = 3
PG_TIMEOUT_S = 60.0  # a rank that waits this long on a collective fails instead of hanging for 30 minutes
KEY_BASE = 1000  # a sample's key travels as kid = shard * KEY_BASE + index: shards hold fewer samples
