"""Fixtures of the cluster tests: the dataset in the session's S3 endpoint, and per-node daemons."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster import ClusterData, Node, NodeSet, upload_cluster_data
from harness.shards import make_tar_shard


@pytest.fixture(scope="session")
def cluster_data(s3_client: Any, tmp_path_factory: pytest.TempPathFactory) -> ClusterData:
    """48 tar shards of unequal sizes in a bucket of the session's moto server (read only by the tests)."""
    local = tmp_path_factory.mktemp("cluster-shards")
    return upload_cluster_data(s3_client, f"cluster-{os.getpid()}", local, make_tar_shard)


@pytest.fixture
def start_nodes(tmp_path: Path) -> Iterator[Callable[[list[int], list[str]], list[Node]]]:
    """Factory: one daemon per capacity; every daemon started is stopped after the test."""
    nodes = NodeSet(tmp_path)
    yield nodes.start
    nodes.stop()
