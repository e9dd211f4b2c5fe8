"""The public names, and `import shardcache` without torch."""

from __future__ import annotations

import subprocess
import sys

import shardcache


def test_public_names_are_exported() -> None:
    expected = {
        "Dataset",
        "RuntimeContext",
        "DataLoadMesh",
        "TorchLoader",
        "DaemonClient",
        "set_logger",
        "get_logger",
        "set_log_level",
        "get_log_level",
        "ResumeStateError",
        "UnsupportedResume",
        "StateError",
        "Telemetry",
        # mvp-dataset 0.2.3's other names (tests/client/test_mvp_exports.py tests their behaviour)
        "Consumer",
        "FingerprintProvider",
        "CacheConfig",
        "CacheEntryInfo",
        "clear_cache",
        "list_cache_entries",
        "reset_logger",
        "reset_log_level",
    }
    assert expected <= set(shardcache.__all__)
    assert len(shardcache.__all__) == len(set(shardcache.__all__))
    for name in shardcache.__all__:
        assert hasattr(shardcache, name), name


def test_resume_state_error_is_state_error() -> None:
    assert shardcache.ResumeStateError is shardcache.StateError
    assert issubclass(shardcache.UnsupportedResume, shardcache.ShardcacheError)


def test_import_does_not_load_torch_lance_or_pyarrow() -> None:
    code = (
        "import sys, shardcache; print(sorted(m for m in ('torch', 'lance', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_torch_loader_without_torch_names_the_extra(tmp_path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from shardcache import Dataset, TorchLoader\n"
        "try:\n"
        "    TorchLoader(None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "shardcache[torch]" in out
