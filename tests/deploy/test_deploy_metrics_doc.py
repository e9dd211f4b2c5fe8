"""docs/metrics.md documents every metric of the public contract with its type."""

from __future__ import annotations

import re

from tests.deploy.deploy_files import DESIGN_METRICS, DOCS, documented_metrics, load_rules, recorded_names


def test_every_contract_metric_is_documented_with_its_type() -> None:
    documented = documented_metrics()
    for name, kind in DESIGN_METRICS.items():
        assert documented.get(name) == kind, f"{name} ({kind}) missing or mistyped in docs/metrics.md"


def test_every_recording_rule_is_documented() -> None:
    text = (DOCS / "metrics.md").read_text()
    for name in recorded_names():
        assert f"`{name}`" in text, f"{name} is not in docs/metrics.md"


def _recording_rules_table() -> list[str]:
    """The `record` column of the table in docs/metrics.md's recording-rules section."""
    section = (DOCS / "metrics.md").read_text().split("## Recording rules", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def test_the_recording_rules_table_lists_exactly_the_rules_of_deploy_prometheus() -> None:
    table = _recording_rules_table()
    assert len(table) == len(set(table)), f"listed twice: {sorted({n for n in table if table.count(n) > 1})}"
    assert set(table) == recorded_names(), (
        f"in the rules, not the table: {sorted(recorded_names() - set(table))}; "
        f"in the table, not the rules: {sorted(set(table) - recorded_names())}"
    )


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = [line.lstrip("#").strip() for line in markdown.splitlines() if line.startswith("#")]
    return {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_alert_links_to_an_existing_troubleshooting_section() -> None:
    anchors = _anchors((DOCS / "troubleshooting.md").read_text())
    for rule in load_rules():
        if "alert" in rule:
            (anchor,) = re.findall(
                r"docs/troubleshooting\.md#([a-z0-9-]+)", rule["annotations"]["description"]
            )
            assert anchor in anchors, f"{rule['alert']} links to missing #{anchor}"
