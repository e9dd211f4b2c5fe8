"""The Kubernetes manifests validate against the Kubernetes schemas and fit together.

kubernetes-validate carries the schemas offline. The ServiceMonitor CRD is not among the core schemas, so
it is checked against a small JSON schema of the fields this repo uses (from the Prometheus Operator's
monitoring.coreos.com/v1 API reference).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as k8s_validate

from tests.deploy.deploy_files import DEPLOY

K8S = DEPLOY / "k8s"
# The oldest Kubernetes minor still commonly run, and the newest the validator knows.
K8S_VERSIONS = ["1.30.0", k8s_validate.latest_version()]
NOT_CORE = {"ServiceMonitor", "Kustomization"}

SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                    "additionalProperties": False,
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                        "targetLabel": {"type": "string"},
                                        "action": {"enum": ["replace", "keep", "drop", "labelmap"]},
                                        "regex": {"type": "string"},
                                        "replacement": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _manifest_files() -> list[Path]:
    return sorted(path for path in K8S.rglob("*.yaml") if path.name != "kustomization.yaml")


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _by_kind(kind: str, folder: Path = K8S) -> dict[str, Any]:
    """The one manifest of `kind` in `folder`'s files (examples/ included unless it names examples/)."""
    files = [path for path in _manifest_files() if folder in path.parents]
    (doc,) = [doc for path in files for doc in _load(path) if doc["kind"] == kind]
    return doc


def _top_level(kind: str) -> dict[str, Any]:
    """The one manifest of `kind` among those `kubectl apply -k` applies (not the examples)."""
    (doc,) = [doc for path in sorted(K8S.glob("*.yaml")) for doc in _load(path) if doc["kind"] == kind]
    return doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_kubernetes_schemas(path: Path, version: str) -> None:
    for doc in _load(path):
        if doc["kind"] in NOT_CORE:
            continue
        # strict: unknown fields (typos such as `readinesProbe`) are errors, as the API server would reject.
        k8s_validate.validate(doc, version, strict=True)


def test_service_monitor_matches_its_crd_fields() -> None:
    jsonschema.validate(_by_kind("ServiceMonitor"), SERVICE_MONITOR_SCHEMA)


def test_kustomization_lists_every_top_level_manifest_and_nothing_missing() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    on_disk = {path.name for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml"}
    assert listed == on_disk
    assert kustomization["namespace"] == _top_level("Namespace")["metadata"]["name"]


def test_the_trainer_namespace_allows_the_hostpath_volumes_of_its_pods() -> None:
    namespace = _by_kind("Namespace", K8S / "examples")
    trainer = _by_kind("Pod")
    assert trainer["metadata"]["namespace"] == namespace["metadata"]["name"]
    assert any("hostPath" in volume for volume in trainer["spec"]["volumes"])
    # baseline and restricted both forbid hostPath volumes: only privileged admits the trainer pod.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def _daemon_pod() -> dict[str, Any]:
    spec: dict[str, Any] = _by_kind("DaemonSet")["spec"]["template"]["spec"]
    return spec


def _daemon_container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = _daemon_pod()["containers"]
    (container,) = containers
    return container


def _config() -> dict[str, Any]:
    return tomllib.loads(_by_kind("ConfigMap")["data"]["shardcached.toml"])


def _mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (hostPath, readOnly) for the container's hostPath volumes."""
    host = {vol["name"]: vol["hostPath"]["path"] for vol in pod["volumes"] if "hostPath" in vol}
    return {
        m["mountPath"]: (host[m["name"]], bool(m.get("readOnly")))
        for m in container["volumeMounts"]
        if m["name"] in host
    }


def test_daemonset_runs_on_gpu_nodes() -> None:
    pod = _daemon_pod()
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


def test_daemon_runs_non_root_with_read_only_root_filesystem() -> None:
    pod, container = _daemon_pod(), _daemon_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_daemon_has_requests_and_limits() -> None:
    resources = _daemon_container()["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]


def test_probes_hit_health_on_the_configured_metrics_port() -> None:
    container = _daemon_container()
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    host, _, config_port = _config()["metrics_addr"].rpartition(":")
    assert host == "0.0.0.0", "probes come from the kubelet, not from loopback"
    assert int(config_port) == port["containerPort"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v1/health", "port": "metrics"}


def test_config_paths_are_the_mounted_host_directories() -> None:
    mounts = _mounts(_daemon_pod(), _daemon_container())
    config = _config()
    assert str(Path(config["socket"]).parent) in mounts
    assert config["cache_dir"] in mounts
    assert _daemon_container()["args"] == ["--config", "/etc/shardcache/shardcached.toml"]


def test_trainer_sees_socket_and_cache_at_the_daemons_paths_read_only() -> None:
    daemon = _mounts(_daemon_pod(), _daemon_container())
    trainer_pod = _by_kind("Pod")["spec"]
    (trainer,) = trainer_pod["containers"]
    mounts = _mounts(trainer_pod, trainer)
    config = _config()
    socket_dir = str(Path(config["socket"]).parent)
    assert mounts[socket_dir][0] == daemon[socket_dir][0]
    # Path handoff: a path the daemon returns must name the same file inside the trainer.
    assert mounts[config["cache_dir"]] == (daemon[config["cache_dir"]][0], True)
    assert {"name": "SHARDCACHE_SOCKET", "value": config["socket"]} in trainer["env"]


def test_trainer_is_in_the_daemons_group_to_use_the_socket() -> None:
    trainer_pod = _by_kind("Pod")["spec"]
    assert (
        _daemon_pod()["securityContext"]["runAsGroup"] in trainer_pod["securityContext"]["supplementalGroups"]
    )


def test_scrape_chain_selects_the_daemon_pods() -> None:
    pod_labels = _by_kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = _by_kind("Service")
    monitor = _by_kind("ServiceMonitor")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    # The job label comes from this Service label; the ShardcacheDown alert matches job="shardcache".
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "shardcache"
