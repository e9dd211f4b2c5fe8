"""docs/metrics.md documents every metric of the public contract with its type."""

from __future__ import annotations

from .deploy_files import DESIGN_METRICS, DOCS, documented_metrics, recorded_names


def test_every_contract_metric_is_documented_with_its_type() -> None:
    documented = documented_metrics()
    for name, kind in DESIGN_METRICS.items():
        assert documented.get(name) == kind, f"{name} ({kind}) missing or mistyped in docs/metrics.md"


def test_every_recording_rule_is_documented() -> None:
    text = (DOCS / "metrics.md").read_text()
    for name in recorded_names():
        assert f"`{name}`" in text, f"{name} is not in docs/metrics.md"
