"""The daemon imports only the wire contract of the client side: never the pipeline, never torch."""

from __future__ import annotations

import json
import subprocess
import sys

import shardcache_protocol
from shardcached import errors

PIPELINE = ["shardcache", "shardcache.dataset", "shardcache.sources", "shardcache.stages", "torch"]


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out))


def test_importing_the_daemon_app_loads_no_pipeline_module_and_no_torch() -> None:
    loaded = _loaded_after("import shardcached.serving.app, shardcached.serving.server")
    assert "shardcache_protocol" in loaded
    assert sorted(loaded & set(PIPELINE)) == []


def test_importing_the_wire_contract_loads_neither_side() -> None:
    loaded = _loaded_after("import shardcache_protocol")
    assert sorted(m for m in loaded if m.split(".")[0] in {"shardcache", "shardcached", "fastapi"}) == []


def test_every_daemon_error_class_answers_a_code_and_status_of_the_contract() -> None:
    classes: list[type[errors.DaemonError]] = [errors.DaemonError, *_subclasses(errors.DaemonError)]
    for cls in classes:
        assert shardcache_protocol.status_of(cls.code) == cls.status, cls


def _subclasses(cls: type[errors.DaemonError]) -> list[type[errors.DaemonError]]:
    found: list[type[errors.DaemonError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_error_code_the_daemon_sends_is_listed_in_the_contract() -> None:
    import re
    from pathlib import Path

    source = Path(errors.__file__).parent
    pattern = re.compile(r'(?:code=|error_body\(|_error\(\d+, )"([a-z_]+)"')
    sent = {code for path in source.rglob("*.py") for code in pattern.findall(path.read_text())}
    assert sent and sorted(sent - set(shardcache_protocol.ERROR_CODES)) == []
