"""An install without an optional extra: each feature that needs it says which `pip install 'shardcache[...]'`
to run, in one line, instead of a ModuleNotFoundError traceback.

Each case runs in a fresh interpreter whose `sitecustomize` blocks the extra's modules
(`sys.modules[name] = None` makes their import fail as if they were not installed).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest


def run_without(
    blocked: list[str], code: str, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)


def reading(kind: str, shards: str) -> str:
    """Code that reads every sample of a source and exits with a ConfigError's message."""
    return f"""
        import sys
        from shardcache import Dataset, RuntimeContext
        from shardcache.errors import ConfigError
        ds = Dataset.from_source({kind!r}, {shards!r}, daemon=None)
        try:
            list(ds.iter_context(RuntimeContext()))
        except ConfigError as exc:
            sys.exit(str(exc))
    """


def one_line_naming(result: subprocess.CompletedProcess[str], extra: str) -> None:
    assert result.returncode != 0
    assert f"pip install 'shardcache[{extra}]'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_shardcached_without_the_daemon_extra_prints_one_line(tmp_path: Path) -> None:
    result = run_without(
        ["fastapi", "uvicorn"], "", tmp_path, "-m", "shardcached", "--cache-dir", str(tmp_path)
    )
    one_line_naming(result, "daemon")
    assert result.stderr.strip().count("\n") == 0


def test_a_shard_on_s3_without_s3fs_names_the_s3_extra(tmp_path: Path) -> None:
    one_line_naming(run_without(["s3fs"], reading("tars", "s3://bucket/shard.tar"), tmp_path), "s3")


def test_a_zst_shard_without_zstandard_names_the_zstd_extra(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.zst").write_bytes(b"(\xb5/\xfd not really")
    code = reading("jsonl", str(tmp_path / "a.jsonl.zst"))
    one_line_naming(run_without(["zstandard"], code, tmp_path), "zstd")


def test_torchloader_without_torch_names_the_torch_extra(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"x": 1}\n'))
    code = f"""
        import sys
        from shardcache import Dataset, TorchLoader
        try:
            TorchLoader(Dataset.from_source("jsonl", {str(tmp_path / "a.jsonl.gz")!r}, daemon=None))
        except ImportError as exc:
            sys.exit(str(exc))
    """
    one_line_naming(run_without(["torch"], code, tmp_path), "torch")


@pytest.mark.parametrize(
    ("kind", "blocked", "extra"), [("parquet", "pyarrow", "parquet"), ("lance", "lance", "lance")]
)
def test_a_tabular_source_without_its_package_names_its_extra(
    tmp_path: Path, kind: str, blocked: str, extra: str
) -> None:
    (tmp_path / f"data.{kind}").write_bytes(b"")
    code = reading(kind, str(tmp_path / f"data.{kind}"))
    one_line_naming(run_without([blocked], code, tmp_path), extra)


def test_manifest_of_parquet_shards_without_pyarrow_names_the_parquet_extra(tmp_path: Path) -> None:
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    shard, output = str(tmp_path / "data.parquet"), str(tmp_path / "m.jsonl")
    result = run_without(["pyarrow"], "", tmp_path, "-m", "shardcache.cli", "manifest", shard, "-o", output)
    one_line_naming(result, "parquet")
    assert result.stderr.strip().count("\n") == 0


def test_cache_without_pyarrow_names_the_lance_extra(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"x": 1}\n'))
    code = f"""
        import sys
        from shardcache import Dataset, RuntimeContext
        from shardcache.errors import ConfigError
        ds = Dataset.from_source("jsonl", {str(tmp_path / "a.jsonl.gz")!r}, daemon=None)
        try:
            list(ds.cache(cache_dir={str(tmp_path / "cache")!r}).iter_context(RuntimeContext()))
        except ConfigError as exc:
            sys.exit(str(exc))
    """
    one_line_naming(run_without(["pyarrow", "lance"], code, tmp_path), "lance")


def test_tqdm_is_a_dependency_of_every_install() -> None:
    # `shardcache warm` draws a progress bar: tqdm may not sit behind an extra.
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert any(r.startswith("tqdm") for r in pyproject["project"]["dependencies"])


def test_a_parquet_file_on_s3_without_s3fs_names_the_s3_extra(tmp_path: Path) -> None:
    one_line_naming(run_without(["s3fs"], reading("parquet", "s3://bucket/data.parquet"), tmp_path), "s3")


def test_the_direct_read_of_an_auto_client_without_a_daemon_names_the_s3_extra(tmp_path: Path) -> None:
    code = f"""
        import sys
        from shardcache.daemon_access.daemon_client import DaemonClient
        from shardcache.errors import ConfigError
        try:
            with DaemonClient({str(tmp_path / "absent.sock")!r}).open("s3://bucket/shard.tar"):
                pass
        except ConfigError as exc:
            sys.exit(str(exc))
    """
    one_line_naming(run_without(["s3fs"], code, tmp_path), "s3")
