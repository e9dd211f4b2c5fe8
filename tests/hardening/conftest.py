"""Fixtures of the hardening tests: fault-injecting proxies in front of the S3 endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.hardening.faultproxy import FaultProxy


@pytest.fixture
def fault_proxy(s3_server: Any) -> Iterator[Callable[..., FaultProxy]]:
    """Factory: a FaultProxy in front of the session's moto server; closed after the test."""
    proxies: list[FaultProxy] = []

    def make(**options: Any) -> FaultProxy:
        proxy = FaultProxy(s3_server.endpoint, **options)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
