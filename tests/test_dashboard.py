"""The Grafana dashboard (deploy/grafana/kvforensics.json) and the alert rules against a live Prometheus:
Debian's prometheus scraping the fake two-engine node twice, through Debian's node_exporter reading
`record`'s textfile and through `kvforensics serve`. Every panel's query returns series, every template
variable finds values, node_exporter takes the textfile without error, and the rules evaluate on the real
series (the low-water alert fires for the engine short of its margin, the unused alert is pending for the
other, never both for one engine)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from typing import Iterator, List, Tuple

import pytest

from tests import promstack
from tests.conftest import ROOT, run_cli
from tests.fakenode import FAKE_LIB
from tests.fleetnode import TwoEngines

DASHBOARD = ROOT / "deploy" / "grafana" / "kvforensics.json"
RULES = ROOT / "deploy" / "kvforensics.rules.yml"
VARIABLES = {"$instance": ".*", "$engine": ".*"}  # the variables' "All"

pytestmark = pytest.mark.skipif(promstack.missing() is not None, reason=promstack.missing() or "")


def _panel_queries() -> Iterator[Tuple[str, str]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            yield panel["title"], expr


def test_the_dashboard_is_well_formed():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "kvforensics" and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"] for p in doc["panels"])
    for wanted in ("Unused GPU memory by node and engine", "Free vs low-water vs margin, per GPU", "KV cache usage",
                   "queued", "Findings"):
        assert wanted in titles
    for title, expr in _panel_queries():
        assert "$" not in expr, (title, expr)  # every variable is one the test substitutes
        assert expr.count("(") == expr.count(")"), title
    for var in doc["templating"]["list"]:
        assert var["type"] in ("datasource", "query")


def _serve(node: TwoEngines, db) -> Tuple[subprocess.Popen, int]:
    """`kvforensics serve` on a socket bound here (systemd's socket activation, as tests/test_serve.py does)."""
    from tests.test_serve import ACTIVATE

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    proc = subprocess.Popen([sys.executable, "-c", ACTIVATE, str(listener.fileno()), "-m", "kvforensics", "serve",
                             "--db",
                             str(db), "--nvml-lib", str(FAKE_LIB), "--min-interval", "1h"],
                            env=dict(node.sglang.env(), FAKE_NVML_SCENARIO=str(node.scenario), PYTHONPATH=str(ROOT)),
                            cwd=str(ROOT), pass_fds=(listener.fileno(),), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    port = listener.getsockname()[1]
    listener.close()
    return proc, port


def _variable_queries() -> List[Tuple[str, str]]:
    out = []
    for var in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if var["type"] != "query":
            continue
        metric, label = re.match(r"^label_values\((.+), (\w+)\)$", var["definition"]).groups()
        for name, value in VARIABLES.items():
            metric = metric.replace(name, value)
        out.append((label, metric))
    return out


def test_every_panel_and_alert_works_on_a_live_prometheus(tmp_path, monkeypatch):
    with TwoEngines(tmp_path / "node", vllm_free_gib=1.0) as node, promstack.Stack(tmp_path / "stack") as stack:
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
        textfiles = tmp_path / "textfiles"
        textfiles.mkdir()
        code, out, err = run_cli(["record", "--db", str(tmp_path / "record.db"), "--nvml-lib", str(FAKE_LIB),
                                  "--prom-file", str(textfiles / "kvforensics.prom")])
        assert code == 0, err
        exporter = stack.node_exporter(textfiles)
        served, port = _serve(node, tmp_path / "serve.db")
        try:
            stack.prometheus({"node": "127.0.0.1:{}".format(exporter.port), "kvforensics": "127.0.0.1:{}".format(port)},
                             rules=[RULES])
            _check(stack, node)
        finally:
            served.terminate()
            served.wait(timeout=60)


def _check(stack: promstack.Stack, node: TwoEngines) -> None:
    # both ways in: the textfile through node_exporter, and serve
    up = stack.wait_for('count by (job) (kvforensics_engine_up == 1) == 2', count=2)
    assert sorted(r["metric"]["job"] for r in up) == ["kvforensics", "node"], up
    assert stack.wait_for('node_textfile_scrape_error == 0'), "node_exporter refused the textfile"
    assert stack.query('node_textfile_mtime_seconds{file=~"(.*/)?kvforensics[^/]*\\\\.prom"}'), \
        "the stale-file alert's pattern misses node_exporter's file label"
    empty = [(title, expr) for title, expr in _panel_queries() if not stack.wait_for(expr, timeout=60)]
    assert not empty, "panels whose query returns nothing: {}".format(empty)
    for label, selector in _variable_queries():
        values = {r["metric"].get(label) for r in stack.query(selector)}
        assert values - {None}, (label, selector)
    engines = {r["metric"]["engine"] for r in stack.query("kvforensics_engine_up")}
    assert engines == set(node.engines)
    _check_alerts(stack, node)


def _check_alerts(stack: promstack.Stack, node: TwoEngines) -> None:
    # two GPUs of the vLLM engine, through each of the two ways in
    firing = stack.wait_for('ALERTS{alertname="KvforensicsLowWaterBelowMargin", alertstate="firing"}', count=4)
    assert {(a["metric"]["engine"], a["metric"]["gpu"]) for a in firing} == {(node.vllm_label, "2"),
                                                                            (node.vllm_label, "3")}
    pending = stack.wait_for('ALERTS{alertname="KvforensicsUnusedGpuMemory"}', count=2)
    assert {a["metric"]["engine"] for a in pending} == {node.sglang_label}
    assert {a["metric"]["alertstate"] for a in pending} == {"pending"}  # for: 1h
    groups = stack.api("/api/v1/rules")["groups"]
    bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
    assert not bad, bad  # no rule fails on the real label sets (a many-to-many join would)
    both = stack.query('count by (instance, engine) (ALERTS{alertname="KvforensicsUnusedGpuMemory"}) and on(instance, '
                       'engine) count by (instance, engine) (ALERTS{alertname="KvforensicsLowWaterBelowMargin"})')
    assert both == []  # never both for one engine
