"""The Grafana dashboard and Prometheus alert rules in ``examples/observability``, checked against a real exporter.

Every expression is parsed as PromQL (``promql-parser``, the Rust parser Prometheus-compatible
databases use), and every metric it names, with every label it matches or groups by, must be in
what a real worker's exporter serves on a real broker. Renaming a metric or a label in
``telemetry/metrics.py`` fails here, before a user's dashboard goes blank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import promql_parser
import pytest
import yaml

from celery_delayq import DelayedRetryTask
from helpers import Collector, management_url, running_worker
from telemetry.test_metrics import _free_port, ladder_cleanup, v, wait_for

OBS = Path(__file__).resolve().parents[2] / "examples" / "observability"
#: Labels Prometheus adds to every scraped series, and its own ``up`` series.
TARGET_LABELS = {"job", "instance"}
BUILTIN = {"up": TARGET_LABELS}
#: Grafana's variables, as a query sends them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": "delayq"}


def dashboard_queries() -> list[tuple[str, str]]:
    """``(where, PromQL)`` of every panel target of the dashboard, variables filled in."""
    dash = json.loads((OBS / "grafana-dashboard.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((f"panel {panel['title']!r} {target['refId']}", expr))
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((OBS / "prometheus-alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _children(node: Any) -> Iterator[Any]:
    for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield child
    yield from getattr(node, "args", None) or []


def _selectors(node: Any) -> Iterator[Any]:
    if type(node).__name__ == "VectorSelector":
        yield node
    for child in _children(node):
        yield from _selectors(child)


def problems(expr: str, served: dict[str, set[str]]) -> list[str]:
    """What in ``expr`` the exporter does not serve: unknown metrics, labels no metric beneath carries."""
    found: list[str] = []

    def check(node: Any) -> None:
        names = {s.name for s in _selectors(node)}
        if type(node).__name__ == "VectorSelector":
            if node.name not in served:
                found.append(f"metric {node.name} is not served")
                return
            for m in node.matchers.matchers:
                if m.name not in served[node.name] | TARGET_LABELS:
                    found.append(f"{node.name} has no label {m.name!r}")
        modifier = getattr(node, "modifier", None)
        grouped = list(getattr(modifier, "labels", None) or [])  # sum by (...)
        matching = getattr(modifier, "matching", None)  # a binary operator's on (...)
        grouped += list(getattr(matching, "labels", None) or [])
        carried = set().union(*(served.get(n, set()) for n in names)) | TARGET_LABELS
        found.extend(f"no metric in {sorted(names)} has label {label!r}" for label in grouped if label not in carried)
        for child in _children(node):
            check(child)

    check(promql_parser.parse(expr))
    return found




def _as_served(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {name: set(labels) for name, labels in BUILTIN.items()}
    for name, labels in samples:
        out.setdefault(name, set()).update(label for label, _ in labels)
    return out


def test_every_dashboard_and_alert_query_resolves_on_a_real_exporter(
        make_app: Callable[..., Any], vhost: str, uid: str, collector: Collector) -> None:
    port = _free_port()
    app = make_app(delayq_enabled=True, delayq_prefix=f"ob{uid}", delayq_levels=3, delayq_unit_ms=100,
                   delayq_metrics_port=port, delayq_management_url=management_url())

    @app.task(base=DelayedRetryTask)
    def ping() -> None:
        collector.add(task="ping")

    with ladder_cleanup(app, vhost), running_worker(app):
        ping.apply_async(countdown=0.3)
        collector.wait_for(1, timeout=30)
        samples = wait_for(port, lambda s: v(s, "delayq_messages_delivered_total") == 1
                           and v(s, "delayq_held_messages") is not None)
    served = _as_served(samples)
    queries = dashboard_queries() + [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    assert len(queries) >= 20
    wrong = {where: found for where, expr in queries if (found := problems(expr, served))}
    assert not wrong, wrong
    # every metric the exporter serves is on the dashboard
    used = {s.name for _, expr in dashboard_queries() for s in _selectors(promql_parser.parse(expr))}
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in served if n.startswith("delayq_")}
    unused = {f for f in families if not any(u == f or u.startswith(f + "_") for u in used)}
    assert not unused, f"served but on no panel: {sorted(unused)}"


def test_the_checker_finds_a_renamed_metric_and_a_missing_label() -> None:
    served = {"delayq_waiting_messages": {"level"}, "delayq_broker_up": set()}
    assert problems('max by (level) (delayq_waiting_messages{job="x"})', served) == []
    assert problems("max(delayq_waiting_message)", served) == ["metric delayq_waiting_message is not served"]
    assert problems('delayq_broker_up{level="1"}', served) == ["delayq_broker_up has no label 'level'"]
    assert problems("max by (queue) (delayq_waiting_messages)", served) == [
        "no metric in ['delayq_waiting_messages'] has label 'queue'"]
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(delayq_broker_up[5m])")


def test_alert_rules_are_complete_prometheus_rules() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {"DelayqExporterDown", "DelayqBrokerUnreachable", "DelayqLadderBacklogGrowing",
                                           "DelayqHeldMessages", "DelayqUnroutableMessages", "DelayqParkedGrowing",
                                           "DelayqLatenessP99High"}
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
        promql_parser.parse(rule["expr"])


def test_the_dashboard_is_importable_grafana_json() -> None:
    dash = json.loads((OBS / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    metric = re.fullmatch(r"label_values\((\w+), job\)", variables["job"]["definition"])
    assert metric and metric.group(1) == "delayq_broker_up"
