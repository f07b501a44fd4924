"""The observability files, checked without a running Prometheus: the rules pass promtool and
its unit tests, the PrometheusRule matches the rules file, every alert has a runbook, and the
dashboard has the panels, units and variable operators need."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.app import Controller
from controller.cgroup import memory_limit
from controller.fakes.clusters import Fleet, SimCluster
from controller.kube.sdk import client
from tests.support.apiserver import FakeAPIServer
from tests.support.kube import seed, settings_for
from tests.support.observability import (
    DASHBOARD,
    PROMETHEUS_RULE,
    ROOT,
    RULES,
    RULES_TEST,
    alert_rules,
    dashboard_queries,
)
from tests.support.prometheus import binary


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    check = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [binary("promtool"), "test", "rules", str(RULES_TEST)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert tested == {r["alert"] for r in alert_rules()}


def test_prometheus_rule_carries_the_same_rules() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_every_alert_has_summary_description_and_a_runbook() -> None:
    runbooks = (ROOT / "manifests" / "RUNBOOKS.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
        for h in re.findall(r"^#+ (.+)$", runbooks, re.M)
    }
    for rule in alert_rules():
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"]
        assert annotations["runbook_url"].startswith("https://"), rule["alert"]
        anchor = annotations["runbook_url"].split("#", 1)[1]
        assert annotations["runbook_url"].split("#")[0].endswith("/manifests/RUNBOOKS.md")
        assert anchor in anchors, f"RUNBOOKS.md has no section for {rule['alert']}"


def test_dashboard_has_the_panels_units_and_variable_operators_need() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("cluster", "target"):
        assert variables[name]["includeAll"] and variables[name]["multi"]
    panels = {p["title"]: p for p in dashboard["panels"]}
    headline = panels["Applied traffic share, $target (stacked to 100)"]
    assert headline["repeat"] == "target"  # one stack per target: each sums to 100
    assert "weight_controller_target_share" in headline["targets"][0]["expr"]
    weights = headline["fieldConfig"]["defaults"]
    assert weights["custom"]["stacking"]["mode"] == "normal" and weights["max"] == 100
    kv = panels["KV-cache utilisation"]["fieldConfig"]["defaults"]
    assert kv["unit"] == "percentunit" and kv["max"] == 1
    steps = kv["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": 0.9}
    assert panels["Latency quantiles"]["fieldConfig"]["defaults"]["unit"] == "s"
    for needed in (
        "Desired vs applied weight per target",
        "Queue depth",
        "Health",
        "Why unhealthy",
        "Scrape errors by reason",
        "Reconcile duration",
        "Leader",
        "Weight changes per hour (churn)",
        "Decision mode per target",
        "Degraded clusters",
        "Fail static",
        "Controller CPU (share of one core)",
        "Controller memory (resident)",
    ):
        assert needed in panels
    # process_* is every exporter's: only the controller's own series
    for title in ("Controller CPU (share of one core)", "Controller memory (resident)"):
        target = panels[title]["targets"][0]
        assert "and on (job, instance) weight_controller_build_info" in target["expr"]
    # and the memory beside the limit the kernel kills it at
    (_, limit) = panels["Controller memory (resident)"]["targets"]
    assert "weight_controller_memory_limit_bytes" in limit["expr"]
    # one unit per panel: no 0/1 gauge beside rates, no seconds-ago beside durations
    assert all("time()" not in t["expr"] for t in panels["Reconcile duration"]["targets"])
    assert all("fail_static" not in t["expr"] for t in panels["API errors"]["targets"])
    for target in panels["Latency quantiles"]["targets"]:
        assert target["legendFormat"] == "{{cluster}} q{{quantile}}"
    for title, expr in dashboard_queries():
        if "cluster" in expr and title not in ("Reconcile duration", "Seconds since the last tick"):
            assert "$cluster" in expr, title


def test_dashboard_config_map_is_labelled_for_the_grafana_sidecar() -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "manifests")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    maps = [
        d
        for d in yaml.safe_load_all(done.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "weight-controller-dashboard"
    ]
    assert maps and maps[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(maps[0]["data"]["weight-controller.json"]) == json.loads(
        DASHBOARD.read_text()
    )


def test_grafana_dir_holds_the_same_dashboard_file() -> None:
    assert (
        Path(DASHBOARD).resolve()
        == (ROOT / "manifests/base/dashboards/weight-controller.json").resolve()
    )


async def test_the_metrics_table_is_what_metrics_exports(apiserver: FakeAPIServer) -> None:
    """grafana/README.md's table, against the families a running controller exports (with
    Kubernetes on, one target written, an EPP cluster): one documented that nobody exports
    misleads, one exported and undocumented is invisible."""
    documented = set(
        re.findall(r"`(weight_controller_[a-z_]+)`", (ROOT / "grafana/README.md").read_text())
    )
    seed(apiserver, [("east", 50), ("west", 50)])
    async with (
        Fleet([SimCluster("east", kv=0.95, with_epp=True), SimCluster("west", kv=0.2)]) as sims,
        client.ApiClient(client.Configuration(host=apiserver.url)) as api,
        Controller(settings_for(sims), serve=False, api=api) as controller,
    ):
        for _ in range(3):
            await controller.once()
        page = generate_latest(controller.registry).decode()
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(page)
        if family.name.startswith("weight_controller_")
    }
    if memory_limit() is None:  # absent where the process has no limit (test_cgroup.py)
        exported.add("weight_controller_memory_limit_bytes")
    assert exported - documented == set(), "exported, not in grafana/README.md"
    assert documented - exported == set(), "in grafana/README.md, not exported"


def test_the_mode_row_names_every_mode() -> None:
    """It listed 6 of the 9."""
    from controller.model import Mode

    row = next(
        line
        for line in (ROOT / "grafana/README.md").read_text().splitlines()
        if line.startswith("| `weight_controller_target_mode`")
    )
    assert {m.value for m in Mode} <= set(re.findall(r"`([a-z_]+)`", row))
