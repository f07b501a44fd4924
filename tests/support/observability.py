"""The shipped alert rules and dashboard, as the tests read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "prometheus" / "weight-controller-rules.yaml"
DASHBOARD = ROOT / "grafana" / "weight-controller.json"
PROMETHEUS_RULE = ROOT / "manifests" / "base" / "prometheusrule.yaml"
RULES_TEST = Path(__file__).resolve().parent / "rules_test.yaml"


def alert_rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]
    marks = [(mark["name"], mark["expr"]) for mark in dashboard["annotations"]["list"]]
    return panels + marks
