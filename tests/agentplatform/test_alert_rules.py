"""docs/alerts.yml and docs/grafana-dashboard.json: well formed, and every metric they
query is one the platform exposes; promtool checks and unit-tests the rules if installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import agentplatform.metrics
import jobs.metrics  # noqa: F401
import webhooks.metrics  # noqa: F401 - every metric module registers its metrics
from agentplatform.metrics_endpoint import PlatformStateCollector

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRIC = re.compile(r"\b(agent_[a-z_]+)\b")
REQUIRED = {
    "agent_outbox_lag_seconds",
    "agent_dead_letters_open",
    "agent_oldest_lease_age_seconds",
    "agent_runs_completed_total",
    "agent_queue_depth",
}


@pytest.fixture
def exposed(db) -> set[str]:
    names: set[str] = set()
    families = [*REGISTRY.collect(), *PlatformStateCollector().collect()]
    for family in families:
        if not family.name.startswith("agent_"):
            continue
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
    assert agentplatform.metrics.tasks_submitted._name == "agent_tasks_submitted"
    return names


def _rules() -> list[dict]:
    document = yaml.safe_load((DOCS / "alerts.yml").read_text())
    assert set(document) == {"groups"}
    rules = []
    for group in document["groups"]:
        assert group["name"] and group["rules"]
        rules.extend(group["rules"])
    return rules


def test_alert_rules_are_well_formed_and_query_exposed_metrics(exposed):
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    used: set[str] = set()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["expr"].count("(") == rule["expr"].count(")")
        used.update(METRIC.findall(rule["expr"]))
    assert used - exposed == set()
    assert used >= REQUIRED


@pytest.mark.no_services
def test_every_alert_links_its_runbook_section():
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in (DOCS / "operations.md").read_text().splitlines()
        if line.startswith("#")
    }
    for rule in _rules():
        url = rule["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", f"{rule['alert']} has no runbook_url"
        assert anchor == rule["alert"].lower()
        assert anchor in headings, f"docs/operations.md has no section for {rule['alert']}"


def test_dashboard_panels_query_exposed_metrics(exposed):
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"]
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource"}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    used: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["targets"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")")
            used.update(METRIC.findall(target["expr"]))
    assert used - exposed == set()
    # Every metric the platform exposes has a panel.
    families = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in exposed}
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", name) for name in used}
    assert families - shown == set()


@pytest.mark.no_services
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run(
        ["promtool", "check", "rules", "alerts.yml"],
        cwd=DOCS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        ["promtool", "test", "rules", "alerts.test.yml"],
        cwd=DOCS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
