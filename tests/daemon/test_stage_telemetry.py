"""Stage times reach the daemon: `shardcache_client_stage_seconds_total{training_job, slot, stage}`, the
`GET /v1/telemetry` summary and `shardcache stats --job`; older reports and older daemons keep working."""

from __future__ import annotations

import http.server
import json
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from harness.devservers import Daemon
from shardcache import DaemonClient, Dataset, TorchLoader
from shardcache.daemon_access.telemetry import Telemetry
from shardcache.daemon_access.transport import Transport
from shardcache_protocol import TelemetryReport
from shardcached.serving import OTHER_STAGES, ClientTelemetry

STAGE_SERIES = "shardcache_client_stage_seconds_total"


def slow(sample: Any) -> Any:
    time.sleep(0.005)
    return sample


def stage_seconds(daemon: Daemon, job: str) -> dict[str, float]:
    """stage -> seconds of `job`'s stage series, all slots together, from a live scrape."""
    text = httpx.get(daemon.metrics_url, timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == STAGE_SERIES and sample.labels["training_job"] == job:
                stage = sample.labels["stage"]
                found[stage] = found.get(stage, 0.0) + sample.value
    return found


def report(**fields: Any) -> dict[str, Any]:
    return {"job": "j", "slot": 0, "samples": 1, "wait_seconds": 0.5, "interval_seconds": 1.0, **fields}


@pytest.fixture
def daemon(daemon_factory: Callable[..., Daemon], local_shards) -> Daemon:  # type: ignore[no-untyped-def]
    return daemon_factory(allow=[str(local_shards.local_dir)])


def test_a_torch_loaders_workers_stage_times_reach_the_daemon(daemon: Daemon, local_shards) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="stages-tl")
    loader = TorchLoader(ds.map(slow).shuffle(4), num_workers=2, batch_size=4, collate_fn=list)
    it = iter(loader)
    assert sum(len(batch) for batch in it) == 4 * 8
    it.close()  # the last figures are sent when the iteration is released
    deadline = time.monotonic() + 20
    while set(stage_seconds(daemon, "stages-tl")) != {"read", "map", "shuffle", "collate"}:
        assert time.monotonic() < deadline, stage_seconds(daemon, "stages-tl")
        time.sleep(0.05)  # the last report leaves from the background thread
    seconds = stage_seconds(daemon, "stages-tl")
    assert seconds == pytest.approx(loader.stats().seconds)  # what the workers sent the trainer
    summary = DaemonClient(socket=str(daemon.socket)).telemetry("stages-tl")
    assert [job.job for job in summary.jobs] == ["stages-tl"]
    assert summary.jobs[0].stage_seconds == pytest.approx(seconds)


def test_a_torch_loaders_loader_side_stage_times_reach_the_daemon_under_their_own_names(  # type: ignore[no-untyped-def]
    daemon: Daemon, local_shards
) -> None:
    pytest.importorskip("torch")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="stages-loader")
    loader = TorchLoader(ds.map(slow), num_workers=2, batch_size=4, collate_fn=list).unbatch().batch(8)
    it = iter(loader)
    assert sum(len(batch) for batch in it) == 4 * 8
    it.close()
    expected = {"read", "map", "collate", "loader.unbatch", "loader.batch"}
    deadline = time.monotonic() + 20
    while set(stage_seconds(daemon, "stages-loader")) != expected:
        assert time.monotonic() < deadline, stage_seconds(daemon, "stages-loader")
        time.sleep(0.05)  # the last report leaves from the background thread
    stats = loader.stats()
    expected_seconds = {**stats.seconds, **stats.loader.as_dict()}
    assert stage_seconds(daemon, "stages-loader") == pytest.approx(expected_seconds)


def test_a_dataset_iterated_in_the_trainer_reports_its_stage_times(daemon: Daemon, local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket), job="stages-ds")
    it = iter(ds.map(slow).batch(4))
    assert sum(len(batch) for batch in it) == 4 * 8
    del it  # released: the last report goes out
    deadline = time.monotonic() + 20
    while set(stage_seconds(daemon, "stages-ds")) != {"read", "map", "batch"}:
        assert time.monotonic() < deadline, stage_seconds(daemon, "stages-ds")
        time.sleep(0.05)


def test_a_report_from_a_client_without_stage_times_is_accepted(daemon: Daemon) -> None:
    answer = Transport(daemon.socket, 5).request("POST", "/v1/telemetry", report(job="old-client"))
    assert answer.status == 204
    job = DaemonClient(socket=str(daemon.socket)).telemetry("old-client").jobs[0]
    assert (job.samples, job.wait_seconds, job.stage_seconds) == (1, 0.5, {})


class OldDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A daemon from before stage times, as far as `POST /v1/telemetry` goes: its request model forbids
    unknown fields (422) and takes the rest (204). It records the bodies it took."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.taken: list[dict[str, Any]] = []
        super().__init__(path, _OldHandler)


class _OldHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        assert isinstance(server, OldDaemon)
        status = 422 if "stage_seconds" in body else 204
        if status == 204:
            server.taken.append(body)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_older_daemon_refusing_the_stage_field_still_gets_the_rest_of_the_report(short_tmp: Path) -> None:
    old = OldDaemon(str(short_tmp / "old.sock"))
    threading.Thread(target=old.serve_forever, daemon=True).start()
    try:
        stages = {"read": 1.0}
        socket = str(short_tmp / "old.sock")
        telemetry = Telemetry(job="old", socket=socket, interval_s=0, count=len, stages=lambda: stages)
        list(telemetry.watch([[0, 0, 0]]))
        assert telemetry.flush() is True
        stages = {"read": 2.0}
        list(telemetry.watch([[0, 0]]))
        assert telemetry.flush() is True  # no stage field offered again
        assert [body["samples"] for body in old.taken] == [3, 2]
        telemetry.close()
    finally:
        old.shutdown()
        old.server_close()


def test_the_daemon_rejects_negative_stage_seconds(daemon: Daemon) -> None:
    body = report(stage_seconds={"read": -1.0})
    assert Transport(daemon.socket, 5).request("POST", "/v1/telemetry", body).status == 422


def test_a_jobs_stage_names_past_the_cap_share_the_label_other() -> None:
    telemetry = ClientTelemetry(CollectorRegistry(), max_stages=2)
    stages = {"read": 1.0, "map[0]": 2.0, "map[1]": 3.0, "batch": 4.0}
    telemetry.record(TelemetryReport.model_validate(report(stage_seconds=stages)))
    assert telemetry.summary("j").jobs[0].stage_seconds == {"read": 1.0, "map[0]": 2.0, OTHER_STAGES: 7.0}


def test_forgetting_a_job_removes_its_stage_series() -> None:
    registry = CollectorRegistry()
    telemetry = ClientTelemetry(registry, max_jobs=1)
    telemetry.record(TelemetryReport.model_validate(report(job="a", stage_seconds={"read": 1.0})))
    telemetry.record(TelemetryReport.model_validate(report(job="b", stage_seconds={"read": 1.0})))
    labels = {"training_job": "a", "slot": "0", "stage": "read"}
    assert registry.get_sample_value(STAGE_SERIES, labels) is None
    assert registry.get_sample_value(STAGE_SERIES, {**labels, "training_job": "b"}) == 1.0


def test_stats_job_prints_the_stage_split(daemon: Daemon) -> None:
    body = report(job="cli-job", stage_seconds={"read": 1.0, "map": 3.0})
    assert Transport(daemon.socket, 5).request("POST", "/v1/telemetry", body).status == 204
    result = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "--socket", str(daemon.socket), "stats", "--job", "cli-job"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("job cli-job: 1 slot(s), 1 samples")
    assert lines[-2].split() == ["read", "1.0", "25%"]
    assert lines[-1].split() == ["map", "3.0", "75%"]


def test_stats_job_of_an_unknown_job_says_so(daemon: Daemon, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardcache.cli", "--socket", str(daemon.socket), "stats", "--job", "nobody"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "no telemetry from job 'nobody'" in result.stderr
