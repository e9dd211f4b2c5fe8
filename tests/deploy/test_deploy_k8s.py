"""The Kubernetes manifests: rendered by kustomize, validated against the schemas, and fit together.

`kubectl kustomize` renders deploy/k8s offline, without and with the optional monitoring component, exactly
as `kubectl apply -k` would. kubernetes-validate carries the Kubernetes schemas offline; the Prometheus
Operator's ServiceMonitor and PrometheusRule are checked against their CRDs' openAPIV3Schema, vendored in
tests/deploy/schemas/ (the source is named in each file).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as k8s_validate

from harness.tools import require_tool
from tests.deploy.deploy_files import DEPLOY, DOCS, RULES_FILE

K8S = DEPLOY / "k8s"
CONFIG_FILE = K8S / "shardcached.toml"
PROMETHEUS_RULE = K8S / "components" / "monitoring" / "prometheusrule.yaml"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# The oldest Kubernetes minor still commonly run, and the newest the validator knows.
K8S_VERSIONS = ["1.30.0", k8s_validate.latest_version()]
CRD_KINDS = {"ServiceMonitor": "servicemonitor", "PrometheusRule": "prometheusrule"}
MONITORING_LINES = (
    "# components:\n#   - components/monitoring\n",
    "components:\n  - components/monitoring\n",
)

# Measured by bench/bench_recovery.py at the advertised scale, 10^6 resident shards (docs/benchmarks.md,
# "Daemon start-up and memory at scale"): the slowest start until /v1/health answered (a loaded machine),
# and the peak RSS with 64 plans.
MEASURED_START_S_AT_1M = 497.7
MEASURED_PEAK_RSS_BYTES_AT_1M = 2_559_000_000
MARGIN = 1.5


# -- rendering --------------------------------------------------------------------------------------------
def _kustomize(root: Path) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(root)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root)
    return root


def _with_monitoring(root: Path) -> Path:
    """`root`'s kustomization with the two `components:` lines uncommented, as docs/deploy.md says."""
    kustomization = root / "kustomization.yaml"
    text = kustomization.read_text()
    assert MONITORING_LINES[0] in text
    kustomization.write_text(text.replace(*MONITORING_LINES))
    return root


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return _kustomize(K8S)


@pytest.fixture(scope="module")
def rendered_with_monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _kustomize(_with_monitoring(_copy_tree(tmp_path_factory.mktemp("monitoring"))))


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [doc for doc in docs if doc["kind"] == kind]
    return doc


# -- schemas ----------------------------------------------------------------------------------------------
@cache
def _crd_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        (SCHEMAS / f"monitoring.coreos.com_v1_{CRD_KINDS[kind]}.json").read_text()
    )
    strict: dict[str, Any] = _strict(schema)
    return strict


def _strict(node: Any) -> Any:
    """The schema refusing unknown fields, as `kubectl apply`'s strict field validation does for CRDs: every
    object schema that lists properties and leaves neither additional nor unknown fields open."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    strict = {key: _strict(value) for key, value in node.items()}
    open_ended = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in node and not open_ended:
        strict["additionalProperties"] = False
    return strict


def _validate(doc: dict[str, Any], version: str) -> None:
    if doc["kind"] in CRD_KINDS:
        # Draft 7 as the closest to OpenAPI v3's schemas, without checking the schema itself: some of its
        # patterns are Go regular expressions (`^(?i)...`) that Python's `re` refuses, in fields unused here.
        jsonschema.Draft7Validator(_crd_schema(doc["kind"])).validate(doc)
    else:
        # strict: unknown fields (typos such as `readinesProbe`) are errors, as the API server would reject.
        k8s_validate.validate(doc, version, strict=True)


def _manifest_files() -> list[Path]:
    return sorted(path for path in K8S.rglob("*.yaml") if path.name != "kustomization.yaml")


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_file_validates_against_its_schema(path: Path, version: str) -> None:
    for doc in _load(path):
        _validate(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_validates_against_its_schema(
    rendered_with_monitoring: list[dict[str, Any]], version: str
) -> None:
    for doc in rendered_with_monitoring:
        _validate(doc, version)


def test_the_crd_schemas_refuse_a_misspelt_field(rendered_with_monitoring: list[dict[str, Any]]) -> None:
    monitor = json.loads(json.dumps(_one(rendered_with_monitoring, "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        _validate(monitor, K8S_VERSIONS[-1])


# -- what `kubectl apply -k deploy/k8s` creates -----------------------------------------------------------
def test_the_default_build_needs_no_prometheus_operator(rendered: list[dict[str, Any]]) -> None:
    assert {doc["kind"] for doc in rendered} == {
        "Namespace",
        "ResourceQuota",
        "ConfigMap",
        "Service",
        "DaemonSet",
    }
    assert not [doc for doc in rendered if doc["apiVersion"].startswith("monitoring.coreos.com/")]


def test_the_monitoring_component_adds_a_servicemonitor_and_rules_in_the_daemons_namespace(
    rendered: list[dict[str, Any]], rendered_with_monitoring: list[dict[str, Any]]
) -> None:
    added = [doc for doc in rendered_with_monitoring if doc not in rendered]
    assert sorted(doc["kind"] for doc in added) == ["PrometheusRule", "ServiceMonitor"]
    namespace = _one(rendered, "Namespace")["metadata"]["name"]
    assert {doc["metadata"]["namespace"] for doc in added} == {namespace}
    assert _one(added, "ServiceMonitor")["spec"]["namespaceSelector"]["matchNames"] == [namespace]


def test_every_top_level_manifest_is_a_resource_of_the_kustomization() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = {path.name for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    (generator,) = kustomization["configMapGenerator"]
    assert generator["files"] == [CONFIG_FILE.name]


def test_the_prometheusrule_holds_exactly_the_repos_rule_file() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text())
    result = subprocess.run(
        [sys.executable, str(DEPLOY.parent / "scripts" / "gen_prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# -- the ConfigMap ----------------------------------------------------------------------------------------
def _config() -> dict[str, Any]:
    return tomllib.loads(CONFIG_FILE.read_text())


def test_the_configmap_is_the_config_file_under_a_name_hashed_from_it(rendered: list[dict[str, Any]]) -> None:
    configmap = _one(rendered, "ConfigMap")
    assert configmap["data"] == {CONFIG_FILE.name: CONFIG_FILE.read_text()}
    assert configmap["metadata"]["name"].startswith("shardcached-config-")
    (volume,) = [v for v in _pod(rendered)["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]


def test_editing_the_config_file_rolls_the_daemons_pods(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    root = _copy_tree(tmp_path)
    (root / CONFIG_FILE.name).write_text(CONFIG_FILE.read_text().replace('"90%"', '"500GiB"'))
    edited = _kustomize(root)
    before, after = _one(rendered, "ConfigMap"), _one(edited, "ConfigMap")
    assert before["metadata"]["name"] != after["metadata"]["name"]
    # A changed pod template is what makes the DaemonSet replace its pods.
    assert _pod(edited) != _pod(rendered)
    (volume,) = [v for v in _pod(edited)["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == after["metadata"]["name"]


# -- the DaemonSet ----------------------------------------------------------------------------------------
def _daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(docs, "DaemonSet")


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _daemonset(docs)["spec"]["template"]["spec"]
    return spec


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = _pod(docs)["containers"]
    return dict(container)


def _host_mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (hostPath, readOnly) for the container's hostPath volumes."""
    host = {vol["name"]: vol["hostPath"]["path"] for vol in pod["volumes"] if "hostPath" in vol}
    return {
        m["mountPath"]: (host[m["name"]], bool(m.get("readOnly")))
        for m in container["volumeMounts"]
        if m["name"] in host
    }


def test_daemonset_runs_on_gpu_nodes(rendered: list[dict[str, Any]]) -> None:
    pod = _pod(rendered)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


def test_daemon_runs_non_root_with_read_only_root_filesystem(rendered: list[dict[str, Any]]) -> None:
    pod, container = _pod(rendered), _container(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_daemon_is_node_critical_and_its_namespace_admits_that_class(rendered: list[dict[str, Any]]) -> None:
    assert _pod(rendered)["priorityClassName"] == "system-node-critical"
    (scope,) = _one(rendered, "ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"]
    assert scope == {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}


def test_a_rolling_update_never_runs_two_daemons_on_one_cache(rendered: list[dict[str, Any]]) -> None:
    rolling = _daemonset(rendered)["spec"]["updateStrategy"]["rollingUpdate"]
    assert rolling["maxSurge"] == 0 and rolling["maxUnavailable"] == 1
    assert "maxSurge: 0" in (DOCS / "deploy.md").read_text()
    assert ".shardcached.lock" in (K8S / "daemonset.yaml").read_text()


def test_memory_limit_covers_the_measured_peak_at_the_advertised_scale(
    rendered: list[dict[str, Any]],
) -> None:
    resources = _container(rendered)["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    limit = resources["limits"]["memory"]
    assert limit.endswith("Gi")
    assert int(limit.removesuffix("Gi")) * 2**30 >= MEASURED_PEAK_RSS_BYTES_AT_1M * MARGIN


def test_the_startup_probe_waits_out_the_measured_recovery_at_the_advertised_scale(
    rendered: list[dict[str, Any]],
) -> None:
    startup = _container(rendered)["startupProbe"]
    assert startup["httpGet"] == {"path": "/v1/health", "port": "metrics"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= MEASURED_START_S_AT_1M * MARGIN


def test_probes_hit_health_on_the_configured_metrics_port(rendered: list[dict[str, Any]]) -> None:
    container = _container(rendered)
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    host, _, config_port = _config()["metrics_addr"].rpartition(":")
    assert host == "0.0.0.0", "probes come from the kubelet, not from loopback"
    assert int(config_port) == port["containerPort"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/v1/health", "port": "metrics"}


def test_config_paths_are_the_mounted_host_directories(rendered: list[dict[str, Any]]) -> None:
    mounts = _host_mounts(_pod(rendered), _container(rendered))
    config = _config()
    assert str(Path(config["socket"]).parent) in mounts
    assert config["cache_dir"] in mounts
    assert _container(rendered)["args"] == ["--config", "/etc/shardcache/shardcached.toml"]


def test_the_cache_must_already_exist_on_the_host_and_be_on_the_required_mount(
    rendered: list[dict[str, Any]],
) -> None:
    pod = _pod(rendered)
    mounts = _host_mounts(pod, _container(rendered))
    config = _config()
    cache_host, _ = mounts[config["cache_dir"]]
    disk_host, read_only = mounts[config["require_mount"]]
    assert read_only
    # The cache's host directory lies on the disk whose mount point the guard checks.
    assert Path(disk_host) in Path(cache_host).parents
    types = {vol["hostPath"]["path"]: vol["hostPath"]["type"] for vol in pod["volumes"] if "hostPath" in vol}
    assert types[cache_host] == types[disk_host] == "Directory"


def test_the_trainer_namespace_allows_the_hostpath_volumes_of_its_pods() -> None:
    namespace = _example("Namespace")
    trainer = _example("Pod")
    assert trainer["metadata"]["namespace"] == namespace["metadata"]["name"]
    assert any("hostPath" in volume for volume in trainer["spec"]["volumes"])
    # baseline and restricted both forbid hostPath volumes: only privileged admits the trainer pod.
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def _example(kind: str) -> dict[str, Any]:
    (doc,) = [
        doc
        for path in sorted((K8S / "examples").glob("*.yaml"))
        for doc in _load(path)
        if doc["kind"] == kind
    ]
    return doc


def test_trainer_sees_socket_and_cache_at_the_daemons_paths_read_only(rendered: list[dict[str, Any]]) -> None:
    daemon = _host_mounts(_pod(rendered), _container(rendered))
    trainer_pod = _example("Pod")["spec"]
    (trainer,) = trainer_pod["containers"]
    mounts = _host_mounts(trainer_pod, trainer)
    config = _config()
    socket_dir = str(Path(config["socket"]).parent)
    assert mounts[socket_dir][0] == daemon[socket_dir][0]
    # Path handoff: a path the daemon returns must name the same file inside the trainer.
    assert mounts[config["cache_dir"]] == (daemon[config["cache_dir"]][0], True)
    assert {"name": "SHARDCACHE_SOCKET", "value": config["socket"]} in trainer["env"]


def test_trainer_is_in_the_daemons_group_to_use_the_socket(rendered: list[dict[str, Any]]) -> None:
    trainer_pod = _example("Pod")["spec"]
    assert (
        _pod(rendered)["securityContext"]["runAsGroup"]
        in trainer_pod["securityContext"]["supplementalGroups"]
    )


def test_scrape_chain_selects_the_daemon_pods(rendered_with_monitoring: list[dict[str, Any]]) -> None:
    pod_labels = _daemonset(rendered_with_monitoring)["spec"]["template"]["metadata"]["labels"]
    service = _one(rendered_with_monitoring, "Service")
    monitor = _one(rendered_with_monitoring, "ServiceMonitor")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    # The job label comes from this Service label; the ShardcacheDown alert matches job="shardcache".
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "shardcache"
