"""Shared helpers of the deployment tests: where the artefacts are, and which metric names exist.

The metric names come from docs/metrics.md (the reference users read), so a dashboard or rule that uses an
undocumented name fails, and test_prometheus_live.py checks the document against a real daemon's scrape.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCS = REPO / "docs"
PROMETHEUS = DEPLOY / "prometheus"
RULES_FILE = PROMETHEUS / "rules" / "shardcache.rules.yml"

# The metrics DESIGN.md promises (the public contract); docs/metrics.md must document each of them.
DESIGN_METRICS = {
    "shardcache_requests_total": "counter",
    "shardcache_open_wait_seconds": "histogram",
    "shardcache_fetched_bytes_total": "counter",
    "shardcache_served_bytes_total": "counter",
    "shardcache_fetch_seconds": "histogram",
    "shardcache_fetch_errors_total": "counter",
    "shardcache_evictions_total": "counter",
    "shardcache_prefetched_shards_total": "counter",
    "shardcache_resident_bytes": "gauge",
    "shardcache_capacity_bytes": "gauge",
    "shardcache_resident_shards": "gauge",
    "shardcache_inflight_fetches": "gauge",
    "shardcache_plans": "gauge",
    "shardcache_pinned_bytes": "gauge",
    "shardcache_leases": "gauge",
}

_DOC_ROW = re.compile(
    r"^\|\s*`(?P<name>shardcache_[a-z0-9_]+)`\s*\|\s*(?P<type>counter|gauge|histogram)\s*\|"
)


def documented_metrics() -> dict[str, str]:
    """Metric name -> type, from the reference table in docs/metrics.md."""
    found: dict[str, str] = {}
    for line in (DOCS / "metrics.md").read_text().splitlines():
        match = _DOC_ROW.match(line)
        if match:
            found[match["name"]] = match["type"]
    return found


_LABELS_CELL = re.compile(r"`(?P<label>[a-z_]+)`\s*=\s*(?P<values>(?:`[a-z0-9_]+`(?:,\s*)?)+)")


def documented_label_values() -> dict[str, dict[str, set[str]]]:
    """Metric name -> label -> the values docs/metrics.md lists for it (labels written `name` = `a`, `b`)."""
    found: dict[str, dict[str, set[str]]] = {}
    for line in (DOCS / "metrics.md").read_text().splitlines():
        match = _DOC_ROW.match(line)
        if match:
            labels_cell = line.split("|")[3]
            for cell in _LABELS_CELL.finditer(labels_cell):
                values = set(re.findall(r"`([a-z0-9_]+)`", cell["values"]))
                found.setdefault(match["name"], {})[cell["label"]] = values
    return found


def series_names(metrics: dict[str, str]) -> set[str]:
    """The sample names a scrape carries for these metric families (histograms expand to three)."""
    names = set()
    for name, kind in metrics.items():
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def load_rules() -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of the repo's rule file."""
    data = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in load_rules() if "record" in rule}


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:]|\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}
_KEYWORDS |= {"group_left", "group_right"}  # also written bare, without a label list


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers outside strings, label matchers, ranges and
    grouping clauses that are not function calls or keywords. Enough for the expressions in this repo."""
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    return {name for name in _IDENT.findall(text) if name.lower() not in _KEYWORDS}


def unit_directives(path: Path) -> dict[str, list[str]]:
    """`Section.Key` -> every value a systemd unit gives it (keys may repeat), continuation lines joined."""
    found: dict[str, list[str]] = {}
    section = ""
    logical = re.sub(r"\\\n\s*", " ", path.read_text())
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key}", []).append(value)
    return found


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    logical = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    result = []
    for line in logical.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            result.append((instruction.upper(), args.strip()))
    return result
